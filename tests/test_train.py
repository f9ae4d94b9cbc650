"""mvgpt/train.py's one step: what it computes is the hand-written step's, for every trainer."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from mvgpt.lora import apply_lora, lora_parameters
from mvgpt.train import Step, configure_optimizer, flat_then_down, lr_at


def batch(seed: int = 0, vocab: int = 64, B: int = 3, T: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, vocab, (B, T), generator=g) for _ in range(2))


@pytest.mark.parametrize("clip", [1.0, 0.0])
def test_the_step_is_forward_backward_clip_update_as_written_out(clip):
    ours, theirs = tiny_model(seed=3).train(), tiny_model(seed=3).train()
    step = Step(ours, configure_optimizer(ours, 1e-2, 0.1, "cpu"), "cpu", torch.float32, grad_clip=clip)
    optimizer = configure_optimizer(theirs, 1e-2, 0.1, "cpu")
    for i in range(3):
        x, y = batch(i)
        loss, norm = step(x, y, lr=1e-2 * (i + 1))
        for group in optimizer.param_groups:  # the same step, written out
            group["lr"] = 1e-2 * (i + 1)
        _, want = theirs(x, y)
        optimizer.zero_grad(set_to_none=True)
        want.backward()
        want_norm = torch.nn.utils.clip_grad_norm_(theirs.parameters(), clip or float("inf"))
        optimizer.step()
        assert loss.item() == want.item() and norm.item() == want_norm.item() and not loss.requires_grad
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values(),
                                                 strict=True))


def test_a_step_with_its_own_loss_trains_only_what_requires_grad():
    model = tiny_model(seed=1).train()
    frozen = {k: v.clone() for k, v in model.state_dict().items()}
    apply_lora(model, rank=2, alpha=4.0, seed=0)
    params = lora_parameters(model)
    step = Step(model, torch.optim.AdamW(params, lr=1e-2), "cpu", torch.float32,
                loss=lambda x, y: model(x, y)[1] * 2.0)
    x, y = batch()
    want = 2.0 * model(x, y)[1].item()
    before = [p.clone() for p in params]
    loss, _ = step(x, y)
    assert loss.item() == want and step.params == params  # its loss, and the adapters alone train
    assert all(not torch.equal(b, p) for b, p in zip(before[1::2], params[1::2], strict=True))  # every B moved
    base = {k.replace(".base.", "."): v for k, v in model.state_dict().items() if not k.endswith((".A", ".B"))}
    assert base.keys() == frozen.keys() and all(torch.equal(base[k], v) for k, v in frozen.items())


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest():
    model = tiny_model(seed=0)
    optimizer = configure_optimizer(model, 1e-2, 0.5, "cpu", muon=True)
    muon = {id(p) for g in optimizer.muon.param_groups for p in g["params"]}
    adam = {id(p) for g in optimizer.adamw.param_groups for p in g["params"]}
    names = {id(p): n for n, p in model.named_parameters()}
    assert len(muon) == 4 * model.config.n_layer and not muon & adam  # qkv, proj, the MLP's two, each block
    assert muon | adam == set(names) and all(names[i].startswith("blocks.") for i in muon)
    assert {names[i] for i in adam} >= {"wte.weight", "wpe.weight"}
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.5, 0.0, 0.5]  # not on biases and norms


def test_muon_resumes_from_its_saved_state_exactly(tmp_path):
    """Three steps, saved, loaded into a new model and optimizer, three more: the six steps of one run."""
    def run(model, optimizer, steps):
        step = Step(model, optimizer, "cpu", torch.float32)
        for i in steps:  # an lr that changes every step, as a schedule's does
            step(*batch(i), lr=1e-2 / (i + 1))

    whole = tiny_model(seed=4).train()
    run(whole, configure_optimizer(whole, 1e-2, 0.5, "cpu", muon=True), range(6))
    first = tiny_model(seed=4).train()
    optimizer = configure_optimizer(first, 1e-2, 0.5, "cpu", muon=True)
    run(first, optimizer, range(3))
    torch.save({"model": first.state_dict(), "optimizer": optimizer.state_dict()}, tmp_path / "s.pt")
    saved = torch.load(tmp_path / "s.pt", weights_only=True)
    second = tiny_model(seed=99).train()
    second.load_state_dict(saved["model"])
    resumed = configure_optimizer(second, 1e-2, 0.5, "cpu", muon=True)
    resumed.load_state_dict(saved["optimizer"])
    run(second, resumed, range(3, 6))
    assert all(torch.equal(a, b) for a, b in zip(whole.state_dict().values(), second.state_dict().values(),
                                                 strict=True))
    with pytest.raises(ValueError, match="another optimizer"):  # AdamW's moments are not Muon's
        resumed.load_state_dict(configure_optimizer(second, 1e-2, 0.5, "cpu").state_dict())


def test_the_wsd_schedule_warms_up_holds_then_falls_straight_to_its_floor():
    lr = lambda step, **kw: lr_at(step, 1.0, 10, 0.1, schedule="wsd", cooldown=0.5, **kw)  # noqa: E731
    assert [lr(s, max_steps=100) for s in (0, 9, 10, 49, 50)] == [0.1, 1.0, 1.0, 1.0, 1.0]
    assert lr(75, max_steps=100) == pytest.approx(0.55) and lr(100, max_steps=100) == lr(900, max_steps=100) == 0.1
    # on the clock: flat to half the budget, half way down at three quarters, the floor when the time is up
    assert lr(20, budget=60.0, elapsed=30.0) == 1.0 and lr(21, budget=60.0, elapsed=45.0) == pytest.approx(0.55)
    assert lr(22, budget=60.0, elapsed=60.0) == lr(23, budget=60.0, elapsed=90.0) == 0.1
    assert flat_then_down(0.3, 0.0, 0.0) == 1.0 and flat_then_down(1.0, 0.0, 0.0) == 1.0  # no cooldown: flat
