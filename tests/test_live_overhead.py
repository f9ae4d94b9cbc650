"""dev/live_overhead.py on tiny checkpoints: the page writes two windows past the window, context.py's
matching path is timed on the same piece, and the overhead is the stream's time per step over context.py's."""

import json

import live_overhead
import pytest
from conftest import tiny_model

from mvgpt.checkpoint import save_checkpoint
from mvgpt.data import data_tokenizer_hash

W = 16


def test_the_page_and_context_py_are_timed_on_the_same_tokens(data_dir, tmp_path, capsys):
    h = data_tokenizer_hash(data_dir)
    save_checkpoint(tmp_path / "tiny-rope", tiny_model(vocab_size=300, rope=True), tokenizer_hash=h)
    save_checkpoint(tmp_path / "tiny", tiny_model(vocab_size=300), tokenizer_hash=h)
    out = live_overhead.main([str(tmp_path / "tiny-rope"), str(tmp_path / "tiny"), "--data-dir", str(data_dir),
                              "--device", "cpu", "--repeats", "1", "--json", str(tmp_path / "o.json")])
    rows = {r["model"]: r for r in out["rows"]}
    assert [(r["context_method"], r["tokens"]) for r in rows.values()] == [("sliding cache", 2 * W),
                                                                           ("sliding window", 2 * W)]
    for r in rows.values():  # the sliding cache runs 3W - 1 steps for its 2W tokens, the window 2W
        steps = 3 * W - 1 if r["rope"] else 2 * W
        assert r["context_ms_per_step"] == pytest.approx(r["context_ms_per_token"] * 2 * W / steps)
        assert r["overhead"] == pytest.approx(r["stream_ms_per_token"] / r["context_ms_per_step"] - 1)
        assert r["first_token_ms"] > r["first_token_shown_ms"] > 0  # the client waits for what generate took
    assert json.loads((tmp_path / "o.json").read_text()) == json.loads(json.dumps(out))
    assert "overhead = stream / context.py's ms per step - 1" in capsys.readouterr().out
