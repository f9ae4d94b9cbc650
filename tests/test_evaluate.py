import json
import math

import evaluate
import sample
import torch
import torch.nn.functional as F
from conftest import tiny_model

from mvgpt.checkpoint import save_checkpoint
from mvgpt.data import data_tokenizer_hash, load_tokens
from mvgpt.tokenizer import Tokenizer


def test_perplexity_is_exp_loss_and_accuracy_matches_a_hand_count(data_dir):
    val = load_tokens(data_dir, "val")
    model = tiny_model(vocab_size=300, rope=True)
    got = evaluate.evaluate(model, val, torch.device("cpu"), max_tokens=16 * 5, batch_size=2)
    assert got["tokens"] == 16 * 5
    assert math.isclose(got["perplexity"], math.exp(got["loss"]), rel_tol=1e-12)
    losses, hits = [], 0
    for j in range(5):  # by hand: one window at a time, one token at a time
        window = torch.from_numpy(val[j * 16 : j * 16 + 17].astype("int64"))
        logits, _ = model(window[None, :-1])
        for t in range(16):
            losses.append(F.cross_entropy(logits[0, t], window[t + 1]).item())
            hits += int(logits[0, t].argmax().item() == window[t + 1].item())
    assert math.isclose(got["loss"], sum(losses) / len(losses), rel_tol=1e-5)
    assert got["accuracy"] == hits / 80


def test_bits_per_byte_is_the_text_tokens_loss_in_bits_over_their_bytes(data_dir):
    tokenizer = Tokenizer.load(data_dir / "tokenizer.json")
    lengths = tokenizer.token_bytes()
    assert lengths[tokenizer.eot] == 0 and all(n >= 1 for i, n in enumerate(lengths) if i != tokenizer.eot)
    assert all(lengths[i] == len(tokenizer.decode_bytes([i])) for i in range(tokenizer.eot))
    val = load_tokens(data_dir, "val")
    model = tiny_model(vocab_size=300, rope=True)
    got = evaluate.evaluate(model, val, torch.device("cpu"), max_tokens=16 * 6, batch_size=4,
                            token_bytes=torch.tensor(lengths))
    nats, nbytes, seen_eot = 0.0, 0, False
    for j in range(6):  # by hand: the targets that stand for text, their loss and their bytes
        window = torch.from_numpy(val[j * 16 : j * 16 + 17].astype("int64"))
        logits, _ = model(window[None, :-1])
        for t in range(16):
            target = window[t + 1].item()
            seen_eot |= target == tokenizer.eot
            if target != tokenizer.eot:
                nats += F.cross_entropy(logits[0, t], window[t + 1]).item()
                nbytes += len(tokenizer.decode_bytes([target]))
    assert seen_eot  # the left-out token is there to be left out
    assert got["bytes"] == nbytes
    assert math.isclose(got["bits_per_byte"], nats / math.log(2) / nbytes, rel_tol=1e-5)


def test_evaluate_script_table_and_json(data_dir, tmp_path, capsys):
    save_checkpoint(tmp_path / "a", tiny_model(vocab_size=300), tokenizer_hash=data_tokenizer_hash(data_dir))
    save_checkpoint(tmp_path / "b", tiny_model(vocab_size=300, rope=True), tokenizer_hash=data_tokenizer_hash(data_dir))
    rows = evaluate.main([str(tmp_path / "a"), str(tmp_path / "b"), "--data-dir", str(data_dir), "--device", "cpu",
                          "--tokens", "160", "--json", str(tmp_path / "out.json")])
    assert [r["model"] for r in rows] == ["a", "b"]
    saved = json.loads((tmp_path / "out.json").read_text())
    assert saved["rows"] == rows and "cpu" in saved["machine"]
    assert "perplexity" in capsys.readouterr().out
    assert all(0 < r["bits_per_byte"] < r["loss"] for r in rows)  # ~2 bytes a token here: fewer bits per byte


def test_sample_streams_a_story_past_the_window(data_dir, tmp_path, capsys):
    save_checkpoint(tmp_path / "r", tiny_model(vocab_size=300, rope=True), tokenizer_hash=data_tokenizer_hash(data_dir))
    text = sample.main([str(tmp_path / "r"), "--prompt", "Lily saw", "--max-new-tokens", "40", "--temperature", "0",
                        "--data-dir", str(data_dir), "--device", "cpu"])
    printed = capsys.readouterr().out
    assert printed.startswith("Lily saw") and printed.strip().endswith(text.strip())


def test_evaluate_in_bf16_reports_its_difference_from_float32(data_dir, tmp_path, capsys):
    save_checkpoint(tmp_path / "r", tiny_model(vocab_size=300, rope=True), tokenizer_hash=data_tokenizer_hash(data_dir))
    rows = evaluate.main([str(tmp_path / "r"), "--data-dir", str(data_dir), "--device", "cpu", "--tokens", "160",
                          "--dtype", "bfloat16"])
    row = rows[0]
    fp32 = evaluate.main([str(tmp_path / "r"), "--data-dir", str(data_dir), "--device", "cpu", "--tokens", "160"])[0]
    assert row["dtype"] == "bfloat16" and fp32["dtype"] == "float32" and "loss_difference" not in fp32
    assert row["loss_float32"] == fp32["loss"] and row["loss_difference"] == row["loss"] - fp32["loss"]
    assert row["loss"] != fp32["loss"] and abs(row["loss_difference"]) < 0.01  # bf16 products, within 0.01 nats
    assert "vs float32" in capsys.readouterr().out


def test_sample_with_bf16_weights_streams_a_story(data_dir, tmp_path, capsys):
    save_checkpoint(tmp_path / "r", tiny_model(vocab_size=300, rope=True), tokenizer_hash=data_tokenizer_hash(data_dir))
    text = sample.main([str(tmp_path / "r"), "--prompt", "Lily saw", "--max-new-tokens", "40", "--temperature", "0",
                        "--data-dir", str(data_dir), "--device", "cpu", "--dtype", "bfloat16"])
    printed = capsys.readouterr().out
    assert printed.startswith("Lily saw") and printed.strip().endswith(text.strip()) and len(text) > 0
