import math

import long_context
import pytest
from conftest import tiny_model

from mvgpt.checkpoint import save_checkpoint
from mvgpt.data import data_tokenizer_hash
from mvgpt.extension.memory import kv_bytes_per_token


def test_sweep_sinks_and_dynamic_modes(data_dir, tmp_path):
    h = data_tokenizer_hash(data_dir)
    save_checkpoint(tmp_path / "pretrain", tiny_model(vocab_size=300), tokenizer_hash=h)
    save_checkpoint(tmp_path / "pretrain-rope", tiny_model(vocab_size=300, rope=True), tokenizer_hash=h)
    paths = [str(tmp_path / "pretrain"), str(tmp_path / "pretrain-rope")]
    common = ["--device", "cpu", "--data-dir", str(data_dir)]
    out = long_context.main([*paths, *common, "--ctx", "8", "16", "32", "--rope-scaling", "none", "linear", "yarn",
                        "--sweep-tokens", "64", "--no-memory"])
    cells = {(r["model"], r["ctx"], r["method"]): r for r in out["rows"]}
    assert ("pretrain", 32, "none") not in cells and ("pretrain", 16, "linear") not in cells
    assert cells[("pretrain-rope", 16, "yarn")]["loss"] == cells[("pretrain-rope", 16, "none")]["loss"]
    assert cells[("pretrain-rope", 16, "linear")]["loss"] != cells[("pretrain-rope", 16, "none")]["loss"]
    assert cells[("pretrain-rope", 32, "none")]["tokens"] == 2 * 15  # two chunks, second halves scored
    for r in out["rows"]:
        assert math.isclose(r["perplexity"], math.exp(r["loss"]))
    sinks = long_context.main([paths[1], *common, "--sinks", "2", "--streams", "1"])
    assert [r["method"] for r in sinks["rows"]] == ["sliding cache", "2 sinks, unshifted", "2 sinks, shifted",
                                                   "sliding window"]
    assert all(len(r["position_losses"]) == 3 * 16 for r in sinks["rows"])  # four windows by default
    dynamic = long_context.main([paths[1], *common, "--dynamic", "--length", "32", "--streams", "1"])
    assert [r["method"] for r in dynamic["rows"]] == ["dynamic-ntk, cached", "dynamic-ntk, recomputed", "none, cached"]


@pytest.mark.parametrize("flags, message", [
    (["--ctx", "0"], "--ctx: 0 is out of range"),
    (["--sinks", "-1"], "--sinks: -1 is out of range"),
    (["--streams", "0", "--dynamic"], "--streams: 0 is out of range"),
    (["--ctx", "64", "--rope-factor", "0"], "--rope-factor: 0 is out of range"),
    (["--ctx", "64", "--sinks", "2"], "not allowed with argument"),
    ([], "one of the arguments --ctx --sinks --dynamic is required"),
])
def test_bad_flags_are_one_line_errors(data_dir, tmp_path, capsys, flags, message):
    ckpt = save_checkpoint(tmp_path / "run", tiny_model(rope=True, vocab_size=300))
    with pytest.raises(SystemExit) as exit_:
        long_context.main([str(ckpt), "--data-dir", str(data_dir), *flags])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and err.count("\n") == 1


def test_memory_is_computed_and_measured():
    model = tiny_model(vocab_size=300, rope=True)
    assert kv_bytes_per_token(model) == 2 * 2 * 32 * 4  # keys and values, 2 blocks, 32 channels, fp32
    small, large = long_context.measure_memory(model, [16, 16384])
    assert large["kv_bytes"] == 16384 * 2 * 2 * 32 * 4
    logits = 16384 * 300 * 4
    assert large["peak_bytes"] >= large["kv_bytes"] + logits > small["peak_bytes"]  # cache and logits are in it


@pytest.mark.parametrize("choice", [None, "model", "auto", "c"])
def test_the_caches_reads_take_the_models_step_unless_told(data_dir, tmp_path, capsys, choice, monkeypatch):
    """--decode-step: model.py's step by default (and with model: nothing said); c, or auto where its build
    pays (made to here), put the C step in place and say so; the losses are the model's step's either way."""
    import mvgpt.perf.fast_decode as fd

    monkeypatch.setitem(fd.MEASURED, "float32", (10.0, 1.0, 0.0))  # pays at once
    save_checkpoint(tmp_path / "pretrain-rope", tiny_model(vocab_size=300, rope=True),
                    tokenizer_hash=data_tokenizer_hash(data_dir))
    argv = [str(tmp_path / "pretrain-rope"), "--device", "cpu", "--data-dir", str(data_dir), "--sinks", "2",
            "--streams", "1"]
    eager = long_context.main(argv)
    capsys.readouterr()
    got = long_context.main(argv + (["--decode-step", choice] if choice else []))
    said = [line for line in capsys.readouterr().out.splitlines() if "decoding with" in line]
    if choice in (None, "model"):
        assert said == [] and got["rows"][0]["position_losses"] == eager["rows"][0]["position_losses"]
    else:
        assert len(said) == 1 and said[0].startswith("pretrain-rope: decoding with the C step (mvgpt/perf/one_token.c")
    for row, eager_row in zip(got["rows"], eager["rows"], strict=True):
        assert row["method"] == eager_row["method"]
        assert row["position_losses"] == pytest.approx(eager_row["position_losses"], abs=1e-5)
