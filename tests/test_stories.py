"""dev/stories.py: each model's story from the same prompt and seed, split where the window ends, equal to
what the model's own generate writes."""

from __future__ import annotations

import json

import stories
import torch
from conftest import tiny_model

from mvgpt.checkpoint import save_checkpoint
from mvgpt.data import data_tokenizer_hash
from mvgpt.tokenizer import Tokenizer


def test_stories_pass_the_window_and_match_generate(data_dir, tmp_path):
    h = data_tokenizer_hash(data_dir)
    for name, rope in (("pretrain", False), ("pretrain-rope", True)):
        save_checkpoint(tmp_path / name, tiny_model(vocab_size=300, rope=rope), tokenizer_hash=h)
    out = stories.main([str(tmp_path / "pretrain"), str(tmp_path / "pretrain-rope"), "--tokens", "24",
                        "--data-dir", str(data_dir), "--json", str(tmp_path / "s.json")])
    assert json.loads((tmp_path / "s.json").read_text()) == json.loads(json.dumps(out))
    assert out["command"].startswith("python dev/stories.py ") and out["prompt"] == "Once upon a time"
    tok = Tokenizer.load(data_dir / "tokenizer.json")
    prompt = tok.encode("Once upon a time")
    for row, rope in zip(out["rows"], (False, True), strict=True):
        assert row["kind"] == ("rope" if rope else "learned") and row["window"] == 16
        assert row["tokens"] == 24 and row["tokens_past_window"] == 24 - (16 - len(prompt))
        model = tiny_model(vocab_size=300, rope=rope)
        new = [t.item() for t in model.generate(torch.tensor([prompt]), 24, 0.8, 50, 1337)]
        assert row["before_window"] == tok.decode(new[: 16 - len(prompt)])
        assert row["past_window"] == tok.decode(new[16 - len(prompt):])
