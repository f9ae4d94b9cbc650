import json
import math

import context
import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model

from mvgpt.checkpoint import save_checkpoint
from mvgpt.data import data_tokenizer_hash


def stream(length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 64, (1, length), generator=torch.Generator().manual_seed(seed))


def test_sliding_cache_equals_sliding_window_with_one_block():
    model = tiny_model(rope=True, n_layer=1)
    s = stream(3 * 16)
    window, cached = context.window_losses(model, s), context.cache_losses(model, s)
    assert window.shape == cached.shape == (2 * 16,)
    torch.testing.assert_close(cached, window, atol=1e-4, rtol=0)


def test_full_losses_equal_a_single_forward():
    model = tiny_model(rope=True)
    s = stream(48, seed=1)
    logits, _ = model(s[:, :-1])
    expected = torch.stack([F.cross_entropy(logits[0, t], s[0, t + 1]) for t in range(15, 47)])
    torch.testing.assert_close(context.full_losses(model, s), expected, atol=1e-6, rtol=0)


def test_window_losses_of_learned_positions_read_exactly_the_window():
    model = tiny_model()
    s = stream(40, seed=2)
    losses = context.window_losses(model, s)
    logits, _ = model(s[:, 24 - 16 : 24])
    assert losses.shape == (24,)
    torch.testing.assert_close(losses[24 - 16], F.cross_entropy(logits[:, -1], s[:, 24]))


def test_timed_returns_losses_and_ms_per_token():
    model = tiny_model(rope=True)
    losses, ms = context.timed(context.cache_losses, model, stream(40))
    assert losses.shape == (24,) and ms > 0


def test_context_script_table_and_json(data_dir, tmp_path, capsys):
    h = data_tokenizer_hash(data_dir)
    save_checkpoint(tmp_path / "pretrain", tiny_model(vocab_size=300), tokenizer_hash=h)
    save_checkpoint(tmp_path / "pretrain-rope", tiny_model(vocab_size=300, rope=True), tokenizer_hash=h)
    out = context.main([str(tmp_path / "pretrain"), str(tmp_path / "pretrain-rope"), "--device", "cpu",
                        "--length", "48", "--streams", "2", "--data-dir", str(data_dir),
                        "--json", str(tmp_path / "c.json")])
    assert [(r["model"], r["method"]) for r in out["rows"]] == [
        ("pretrain", "sliding window"), ("pretrain-rope", "sliding window"),
        ("pretrain-rope", "sliding cache"), ("pretrain-rope", "full context")]
    assert all(len(r["position_losses"]) == 32 for r in out["rows"])
    assert json.loads((tmp_path / "c.json").read_text()) == json.loads(json.dumps(out))
    printed = capsys.readouterr().out
    assert "learned positions stop at 16" in printed
    with pytest.raises(SystemExit, match="does not reach past any model's window"):
        context.main([str(tmp_path / "pretrain-rope"), "--length", "16", "--data-dir", str(data_dir)])


def test_sweep_sinks_and_dynamic_modes(data_dir, tmp_path):
    h = data_tokenizer_hash(data_dir)
    save_checkpoint(tmp_path / "pretrain", tiny_model(vocab_size=300), tokenizer_hash=h)
    save_checkpoint(tmp_path / "pretrain-rope", tiny_model(vocab_size=300, rope=True), tokenizer_hash=h)
    paths = [str(tmp_path / "pretrain"), str(tmp_path / "pretrain-rope")]
    common = ["--device", "cpu", "--data-dir", str(data_dir)]
    out = context.main([*paths, *common, "--ctx", "8", "16", "32", "--rope-scaling", "none", "linear", "yarn",
                        "--sweep-tokens", "64", "--no-memory"])
    cells = {(r["model"], r["ctx"], r["method"]): r for r in out["rows"]}
    assert ("pretrain", 32, "none") not in cells and ("pretrain", 16, "linear") not in cells
    assert cells[("pretrain-rope", 16, "yarn")]["loss"] == cells[("pretrain-rope", 16, "none")]["loss"]
    assert cells[("pretrain-rope", 16, "linear")]["loss"] != cells[("pretrain-rope", 16, "none")]["loss"]
    assert cells[("pretrain-rope", 32, "none")]["tokens"] == 2 * 15  # two chunks, second halves scored
    for r in out["rows"]:
        assert math.isclose(r["perplexity"], math.exp(r["loss"]))
    sinks = context.main([paths[1], *common, "--sinks", "2", "--streams", "1"])
    assert [r["method"] for r in sinks["rows"]] == ["sliding cache", "2 sinks, unshifted", "2 sinks, shifted",
                                                   "sliding window"]
    assert all(len(r["position_losses"]) == 3 * 16 for r in sinks["rows"])  # four windows by default
    dynamic = context.main([paths[1], *common, "--dynamic", "--length", "32", "--streams", "1"])
    assert [r["method"] for r in dynamic["rows"]] == ["dynamic-ntk, cached", "dynamic-ntk, recomputed", "none, cached"]
    with pytest.raises(SystemExit, match="below 1"):
        context.main([paths[1], *common, "--ctx", "0"])


def test_memory_is_computed_and_measured():
    model = tiny_model(vocab_size=300, rope=True)
    assert context.kv_bytes_per_token(model) == 2 * 2 * 32 * 4  # keys and values, 2 blocks, 32 channels, fp32
    small, large = context.measure_memory(model, [16, 16384])
    assert large["kv_bytes"] == 16384 * 2 * 2 * 32 * 4
    logits = 16384 * 300 * 4
    assert large["peak_bytes"] >= large["kv_bytes"] + logits > small["peak_bytes"]  # cache and logits are in it
