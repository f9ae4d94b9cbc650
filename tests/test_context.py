import json
import re

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


@pytest.mark.parametrize("flags", [[], ["--decode-step", "auto"], ["--decode-step", "c"], ["--decode-step", "model"]])
def test_context_script_table_and_json(data_dir, tmp_path, capsys, flags):
    """The three methods, model.py's own steps always; with auto (the default) or c, the sliding cache once
    more with the C step for the rope model, its losses the eager sliding cache's; with model, not."""
    h = data_tokenizer_hash(data_dir)
    save_checkpoint(tmp_path / "pretrain", tiny_model(vocab_size=300), tokenizer_hash=h)
    save_checkpoint(tmp_path / "pretrain-rope", tiny_model(vocab_size=300, rope=True), tokenizer_hash=h)
    out = context.main([str(tmp_path / "pretrain"), str(tmp_path / "pretrain-rope"), "--device", "cpu",
                        "--length", "48", "--streams", "2", "--data-dir", str(data_dir),
                        "--json", str(tmp_path / "c.json"), *flags])
    c_row = flags != ["--decode-step", "model"]
    assert [(r["model"], r["method"]) for r in out["rows"]] == [
        ("pretrain", "sliding window"), ("pretrain-rope", "sliding window"),
        ("pretrain-rope", "sliding cache"), *([("pretrain-rope", "sliding cache, C step")] if c_row else []),
        ("pretrain-rope", "full context")]
    assert all(len(r["position_losses"]) == 32 and r["window"] == 16 for r in out["rows"])
    assert json.loads((tmp_path / "c.json").read_text()) == json.loads(json.dumps(out))
    printed = capsys.readouterr().out
    assert "learned positions stop at 16" in printed
    rows = {r["method"]: r for r in out["rows"] if r["model"] == "pretrain-rope"}
    if c_row:  # the same streams, the same losses to float rounding, and the row in the printed table
        eager, c_step = rows["sliding cache"], rows["sliding cache, C step"]
        torch.testing.assert_close(c_step["position_losses"], eager["position_losses"], atol=1e-5, rtol=0)
        assert c_step["loss"] == pytest.approx(eager["loss"], abs=1e-5) and c_step["ms_per_token"] > 0
        assert re.search(r"\npretrain-rope: a row for the C step \(mvgpt/perf/one_token\.c(, built in [\d.]+ s)?\) "
                         r"too\n", "\n" + printed)
        assert re.search(r"\npretrain-rope +sliding cache, C step +\d+\.\d{4} +\d+\.\d\d\n", printed)
    else:
        assert "C step" not in printed
    with pytest.raises(SystemExit, match="does not reach past any model's window"):
        context.main([str(tmp_path / "pretrain-rope"), "--length", "16", "--data-dir", str(data_dir)])


def test_cache_losses_without_sliding_equal_the_full_forward_with_one_block():
    """cache_losses(slide=False) keeps every token: one token at a time, it reads what a single
    forward over the stream reads (exactly, with one block)."""
    model = tiny_model(rope=True, n_layer=1)
    s = stream(40, seed=4)
    torch.testing.assert_close(context.cache_losses(model, s, slide=False), context.full_losses(model, s),
                               atol=1e-5, rtol=0)
    assert not torch.allclose(context.cache_losses(model, s), context.full_losses(model, s), atol=1e-4)


@pytest.mark.parametrize("flags, message", [
    (["--streams", "0"], "--streams: 0 is out of range"),
    (["--length", "1"], "--length: 1 is out of range"),
    (["--length", "many"], "--length: 'many' is not a number"),
])
def test_bad_flags_are_one_line_errors(data_dir, tmp_path, capsys, flags, message):
    ckpt = save_checkpoint(tmp_path / "run", tiny_model(vocab_size=300))
    with pytest.raises(SystemExit) as exit_:
        context.main([str(ckpt), "--data-dir", str(data_dir), *flags])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and err.count("\n") == 1


def test_a_c_step_that_does_not_build_leaves_the_three_methods(data_dir, tmp_path, capsys, monkeypatch):
    """A compiler that fails: one line says why there is no C step row, and the table is the episode's."""
    import mvgpt.perf.fast_decode as fd

    fake = tmp_path / "cc"
    fake.write_text("#!/bin/sh\necho 'cc: error: out of memory' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    fd.library.cache_clear(), fd.build_error.cache_clear()
    try:
        save_checkpoint(tmp_path / "pretrain-rope", tiny_model(vocab_size=300, rope=True),
                        tokenizer_hash=data_tokenizer_hash(data_dir))
        out = context.main([str(tmp_path / "pretrain-rope"), "--device", "cpu", "--length", "48", "--streams", "1",
                            "--data-dir", str(data_dir), "--decode-step", "c"])
    finally:
        fd.library.cache_clear(), fd.build_error.cache_clear()
    assert [r["method"] for r in out["rows"]] == ["sliding window", "sliding cache", "full context"]
    assert capsys.readouterr().out.splitlines()[0] == (
        "pretrain-rope: no row for the C step: cc could not build one_token.c: cc: error: out of memory")
