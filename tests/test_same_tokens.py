"""dev/same_tokens.py: context.py's scored tokens read within windows, as evaluate.py reads them."""

import json

import context
import evaluate
import pytest
import same_tokens
import torch
import torch.nn.functional as F
from conftest import tiny_model

from mvgpt.checkpoint import save_checkpoint
from mvgpt.data import data_tokenizer_hash
from mvgpt.kit.errors import UserError


def test_within_windows_reads_the_tokens_context_scores_in_windows_side_by_side():
    model = tiny_model(rope=True)  # a window of 16
    s = torch.randint(0, 64, (1, 3 * 16), generator=torch.Generator().manual_seed(3))
    losses = same_tokens.within_windows(model, s)
    assert losses.shape == context.window_losses(model, s).shape == (2 * 16,)  # the same tokens, 16..47
    first, _ = model(s[:, 15:31])  # targets 16..31: token 16 with nothing before it in its window
    second, _ = model(s[:, 31:47])  # targets 32..47
    expected = torch.cat([F.cross_entropy(first[0], s[0, 16:32], reduction="none"),
                          F.cross_entropy(second[0], s[0, 32:48], reduction="none")])
    assert torch.equal(losses, expected)
    # evaluate.py's own reading of the same tokens, from token 15 on in windows side by side: the same losses
    read = evaluate.evaluate(model, s[0, 15:].numpy(), "cpu")
    assert read["tokens"] == 32 and read["loss"] == pytest.approx(expected.sum().item() / 32, abs=1e-6)
    ragged = same_tokens.within_windows(model, s[:, :40])  # a last window cut short by the stream's end
    assert ragged.shape == (24,) and torch.equal(ragged[:16], expected[:16])


def test_the_script_writes_a_row_per_model_over_every_scored_token(data_dir, tmp_path):
    h = data_tokenizer_hash(data_dir)
    save_checkpoint(tmp_path / "pretrain", tiny_model(vocab_size=300), tokenizer_hash=h)
    save_checkpoint(tmp_path / "pretrain-rope", tiny_model(vocab_size=300, rope=True), tokenizer_hash=h)
    out = tmp_path / "same.json"
    result = same_tokens.main([str(tmp_path / "pretrain"), str(tmp_path / "pretrain-rope"), "--length", "48",
                               "--streams", "2", "--data-dir", str(data_dir), "--device", "cpu", "--json", str(out)])
    assert [(r["model"], r["tokens"]) for r in result["rows"]] == [("pretrain", 64), ("pretrain-rope", 64)]
    assert json.loads(out.read_text())["rows"] == result["rows"]
    assert result["command"].startswith("python dev/same_tokens.py ")


def test_a_model_whose_window_reaches_the_streams_end_is_skipped_with_a_note(data_dir, tmp_path, capsys):
    h = data_tokenizer_hash(data_dir)
    save_checkpoint(tmp_path / "short", tiny_model(vocab_size=300, rope=True), tokenizer_hash=h)  # window 16
    save_checkpoint(tmp_path / "long", tiny_model(vocab_size=300, rope=True, block_size=64), tokenizer_hash=h)
    flags = ["--streams", "1", "--data-dir", str(data_dir), "--device", "cpu"]
    result = same_tokens.main([str(tmp_path / "short"), str(tmp_path / "long"), *flags])  # default: 3 x 16
    assert [r["model"] for r in result["rows"]] == ["short"]
    assert result["notes"] == ["long: its window of 64 reaches the end of the 48-token streams: skipped "
                               "(use --length > 64)"]
    with pytest.raises(UserError, match="its window of 64 reaches the end"):
        same_tokens.main([str(tmp_path / "long"), "--length", "64", *flags])
