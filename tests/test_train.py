"""mvgpt/train.py's one step: what it computes is the hand-written step's, for every trainer."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from mvgpt.lora import apply_lora, lora_parameters
from mvgpt.train import Step, configure_optimizer


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
