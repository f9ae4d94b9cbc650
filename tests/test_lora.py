import copy

import pytest
import torch
import torch.nn as nn
from conftest import sharpen, tiny_model

from mvgpt.lora import (
    DEFAULT_RANK,
    LoRALinear,
    adapter_path,
    apply_lora,
    load_adapter,
    lora_layers,
    lora_parameters,
    merge,
    read_adapter,
    save_adapter,
    trainable_share,
    weights_hash,
)
from mvgpt.model import GPT, GPTConfig

KINDS = [False, True]  # learned positions, rope


def tokens(n: int = 12, batch: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 64, (batch, n), generator=torch.Generator().manual_seed(seed))


def trained_adapter(model: GPT, seed: int = 1, scale: float = 0.5) -> GPT:
    """Random B (and A) as if trained, so the update is not zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for lora in lora_layers(model).values():
            lora.A.copy_(torch.randn(lora.A.shape, generator=g) * scale)
            lora.B.copy_(torch.randn(lora.B.shape, generator=g) * scale)
    return model


@pytest.mark.parametrize("rope", KINDS)
def test_zero_init_is_exactly_the_base(rope):
    base = tiny_model(rope=rope)
    wrapped = copy.deepcopy(base)
    names = apply_lora(wrapped, rank=4, alpha=8)
    assert names == [f"blocks.{i}.{n}" for i in range(2) for n in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")]
    assert all(isinstance(wrapped.get_submodule(n), LoRALinear) for n in names)
    x = tokens()
    assert torch.equal(wrapped(x)[0], base(x)[0])
    assert all(torch.count_nonzero(m.B) == 0 and torch.count_nonzero(m.A) > 0 for m in lora_layers(wrapped).values())


def test_gradients_reach_only_a_and_b():
    model = tiny_model(rope=True)
    apply_lora(model, rank=4, alpha=8)
    x = tokens()
    model(x, x)[1].backward()
    trainable = {id(p) for p in lora_parameters(model)}
    for name, p in model.named_parameters():
        assert p.requires_grad == (id(p) in trainable), name
        if id(p) not in trainable:
            assert p.grad is None, name
    for lora in lora_layers(model).values():
        assert torch.count_nonzero(lora.B.grad) > 0
        assert torch.count_nonzero(lora.A.grad) == 0  # B is zero, so A's gradient B^T (...) is zero at step 0
    trained_adapter(model)
    model.zero_grad()
    model(x, x)[1].backward()
    assert all(torch.count_nonzero(m.A.grad) > 0 for m in lora_layers(model).values())


def test_default_rank_trains_about_two_percent_of_the_full_size_model():
    torch.manual_seed(0)
    model = GPT(GPTConfig(rope=True))
    apply_lora(model)  # rank 8 on 4 layers in each of 6 blocks: 8 * (in + out) each
    trainable, total = trainable_share(model)
    per_block = DEFAULT_RANK * ((384 + 1152) + (384 + 384) + (384 + 1536) + (1536 + 384))
    assert trainable == 6 * per_block == 294_912
    assert total == 13_793_280 + trainable
    assert 0.020 < trainable / total < 0.021


def test_a_is_seeded_and_apply_twice_or_rank_zero_is_refused():
    a, b, c = tiny_model(), tiny_model(), tiny_model()
    apply_lora(a, 4, 8, seed=3)
    apply_lora(b, 4, 8, seed=3)
    apply_lora(c, 4, 8, seed=4)
    assert all(torch.equal(x, y) for x, y in zip(lora_parameters(a), lora_parameters(b), strict=True))
    assert not torch.equal(lora_parameters(a)[0], lora_parameters(c)[0])
    with pytest.raises(ValueError, match="LoRA layers already"):
        apply_lora(a, 4, 8)
    with pytest.raises(ValueError, match="rank must be at least 1"):
        apply_lora(tiny_model(), 0, 8)


@pytest.mark.parametrize("rope", KINDS)
def test_merged_logits_equal_the_adapted_ones_and_load_as_a_plain_gpt(rope):
    base = tiny_model(rope=rope)
    model = copy.deepcopy(base)
    apply_lora(model, rank=4, alpha=8)
    trained_adapter(model)
    x = tokens()
    adapted = model(x)[0]
    assert not torch.allclose(adapted, base(x)[0], atol=1e-3)  # the update does change the model
    merge(model)
    assert not lora_layers(model)
    assert all(type(m) is nn.Linear for n, m in model.named_modules() if n.endswith(("qkv", "proj", "fc")))
    torch.testing.assert_close(model(x)[0], adapted, atol=1e-5, rtol=0)
    plain = GPT(base.config).eval()
    plain.load_state_dict(model.state_dict())  # the weight names are the base's again
    assert torch.equal(plain(x)[0], model(x)[0])
    for name, t in base.state_dict().items():  # merging made new tensors: the base is untouched
        assert torch.equal(t, tiny_model(rope=rope).state_dict()[name]), name


def test_base_weights_are_bit_identical_after_training():
    model = tiny_model(rope=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    apply_lora(model, rank=4, alpha=8)
    optimizer = torch.optim.AdamW(lora_parameters(model), lr=1e-2, weight_decay=0.1)
    model.train()
    losses = []
    for step in range(5):
        x = tokens(seed=step)
        loss = model(x, x.roll(-1, 1))[1]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    after = {k.replace(".base.", "."): v for k, v in model.state_dict().items() if not k.endswith((".A", ".B"))}
    assert after.keys() == before.keys()
    for name, t in before.items():
        assert torch.equal(after[name], t), name
    assert any(torch.count_nonzero(m.B) > 0 for m in lora_layers(model).values())


def test_adapter_file_round_trips_and_holds_the_adapter_alone(tmp_path):
    base = tiny_model(rope=True)
    model = copy.deepcopy(base)
    apply_lora(model, rank=4, alpha=8)
    trained_adapter(model)
    path = save_adapter(tmp_path / "run", model, weights_hash(base), "tok1", step=7)
    assert path == adapter_path(tmp_path / "run") == tmp_path / "run" / "adapter.pt"
    state = read_adapter(tmp_path / "run")
    assert (state["rank"], state["alpha"], state["step"], state["tokenizer_hash"]) == (4, 8, 7, "tok1")
    assert sum(t.numel() for t in state["lora"].values()) == trainable_share(model)[0]
    fresh = copy.deepcopy(base)
    load_adapter(fresh, tmp_path / "run", "tok1")
    x = tokens()
    assert torch.equal(fresh(x)[0], model(x)[0])
    assert all(torch.equal(a, b) for a, b in zip(lora_parameters(fresh), lora_parameters(model), strict=True))
    assert weights_hash(fresh) == weights_hash(base)  # the hash ignores the adapter


def one_line_error(excinfo) -> str:
    message = str(excinfo.value)
    assert message.startswith("error: ") and "\n" not in message
    return message


def test_a_mismatched_base_is_a_one_line_error(tmp_path):
    base = tiny_model(rope=True)
    model = copy.deepcopy(base)
    apply_lora(model, rank=4, alpha=8)
    save_adapter(tmp_path, model, weights_hash(base), "tok1")
    cases = [
        (tiny_model(rope=True, n_embd=48), "tok1", "trained on another base (n_embd 32 vs 48)"),
        (tiny_model(rope=False), "tok1", "rope True vs False"),
        (copy.deepcopy(base), "tok2", "tokenizer tok1"),
        (tiny_model(seed=5, rope=True), "tok1", "other weights of this shape"),
    ]
    for other, tok, words in cases:
        with pytest.raises(SystemExit) as e:
            load_adapter(other, tmp_path, tok)
        assert words in one_line_error(e)
        assert not lora_layers(other)  # refused before anything changed
    with pytest.raises(SystemExit) as e:
        load_adapter(copy.deepcopy(base), tmp_path / "missing")
    assert "no adapter at" in one_line_error(e)
    (tmp_path / "bad.pt").write_bytes(b"not a zip")
    with pytest.raises(SystemExit) as e:
        load_adapter(copy.deepcopy(base), tmp_path / "bad.pt")
    assert "truncated or corrupt" in one_line_error(e)


@pytest.mark.parametrize("rope", KINDS)
def test_generation_with_the_cache_past_the_window(rope):
    """The cache path is the model's own: a rope model slides its cache past the window with the
    adapters on, and writes what the merged model writes; learned positions re-run the window."""
    base = sharpen(tiny_model(rope=rope))
    model = copy.deepcopy(base)
    apply_lora(model, rank=4, alpha=8)
    trained_adapter(model, scale=0.3)
    prompt = tokens(n=10, batch=1, seed=9)
    n = 3 * base.config.block_size  # well past the 16-token window
    adapted = torch.cat(list(model.generate(prompt, n, temperature=0)), dim=1)
    merged = torch.cat(list(merge(model).generate(prompt, n, temperature=0)), dim=1)
    plain = torch.cat(list(base.generate(prompt, n, temperature=0)), dim=1)
    assert torch.equal(adapted, merged)
    assert not torch.equal(adapted, plain)
