"""report.py on small made-up inputs in tmp_path: the tables carry the logged numbers, the figures
are PNGs, and a missing input is skipped (with a placeholder that never replaces a real file)."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest
import report

PNG = b"\x89PNG\r\n\x1a\n"
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None  # the docs extra; tables work without
needs_matplotlib = pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib (pip install -e '.[docs]')")
TOKENS_PER_STEP = 4 * 32  # batch 4, block 32


def write_log(path: Path, val_every: int, steps: int, offset: float, final_line: bool) -> dict[int, float]:
    """A pretrain log like pretrain.py's; returns {step: val_loss}."""
    path.parent.mkdir(parents=True, exist_ok=True)
    elapsed, held_out, lines = 0.0, {}, []
    for step in range(1, steps + 1):
        dt = 0.5 + 0.01 * (step % 7)
        elapsed += dt
        record = {"step": step, "loss": 8.0 - step / 10 + offset, "lr": 1e-3,
                  "tokens_per_s": TOKENS_PER_STEP / dt, "elapsed": elapsed}
        if step % val_every == 0:
            record["val_loss"] = held_out[step] = 7.0 - step / 13 + offset
            elapsed += 0.3  # the evaluation's time comes in before the next step
        lines.append(json.dumps(record))
    if final_line:  # the run stopped between evaluations: one last held-out loss
        held_out[steps] = 6.0 + offset
        lines.append(json.dumps({"step": steps, "val_loss": held_out[steps], "elapsed": elapsed + 0.3}))
    path.write_text("\n".join(lines) + "\n")
    return held_out


@pytest.fixture
def inputs(tmp_path):
    ckpts, results, data = tmp_path / "checkpoints", tmp_path / "results", tmp_path / "data"
    learned = write_log(ckpts / "pretrain" / "log.jsonl", 5, 23, 0.0, final_line=True)
    rope = write_log(ckpts / "pretrain-rope" / "log.jsonl", 10, 21, -0.125, final_line=False)
    results.mkdir()
    evaluate = [
        {"model": "pretrain", "params": 1000, "context": 32, "loss": 2.25, "perplexity": math.exp(2.25),
         "accuracy": 0.4567, "tokens": 640},
        {"model": "pretrain-rope", "params": 900, "context": 32, "loss": 2.125, "perplexity": math.exp(2.125),
         "accuracy": 0.5, "tokens": 640},
    ]
    (results / "evaluate.json").write_text(json.dumps(evaluate))
    window, length = 32, 96
    rows = [
        {"model": model, "method": method, "loss": loss, "ms_per_token": ms,
         "position_losses": [loss + 0.01 * ((i % 5) - 2) for i in range(length - window)]}
        for model, method, loss, ms in [
            ("pretrain", "sliding window", 2.5, 4.0),
            ("pretrain-rope", "sliding window", 2.25, 6.0),
            ("pretrain-rope", "sliding cache", 2.2625, 1.5),
            ("pretrain-rope", "full context", 2.75, 0.5),
        ]
    ]
    context = {"machine": "Made-up CPU, 2 threads, torch x, cpu", "device": "cpu", "length": length,
               "streams": 2, "window": window, "rows": rows, "notes": ["learned positions stop at 32"]}
    (results / "context.json").write_text(json.dumps(context))
    data.mkdir()
    (data / "meta.json").write_text(json.dumps({
        "vocab_size": 300, "tokenizer_hash": "abc", "split": "a/train.txt for training, a/valid.txt held out",
        "train_stories": 400, "val_stories": 60, "train_chars": 4400, "val_chars": 660,
        "train_tokens": 1000, "val_tokens": 150}))
    return {"root": tmp_path, "learned": learned, "rope": rope, "evaluate": evaluate, "context": context}


def flags(root: Path) -> list[str]:
    return ["--results-dir", str(root / "results"), "--checkpoints-dir", str(root / "checkpoints"),
            "--data-dir", str(root / "data"), "--docs-dir", str(root / "docs"), "--smooth", "8",
            "--readme", str(root / "README.md")]


def rows_of(markdown: str) -> list[list[str]]:
    """The cells of every table row (not the header rule)."""
    return [
        [c.strip() for c in line.strip("|").split("|")]
        for line in markdown.splitlines()
        if line.startswith("|") and not re.match(r"^\| *:?-", line)
    ]


def test_tables_carry_the_logged_numbers(inputs):
    root = inputs["root"]
    written = report.main(flags(root))
    docs = root / "docs"
    for name in ("training", "evaluate", "models", "context", "data", "rope-speeds", "weights"):
        text = (docs / "results" / f"{name}.md").read_text()
        assert text.startswith("Made by `python scripts/report.py --results-dir"), name
        assert "Machine: " in text.splitlines()[1], name
    if HAS_MATPLOTLIB:
        for name in ("training-loss", "context-loss", "rope-rotation"):
            assert (docs / "figures" / f"{name}.png").read_bytes().startswith(PNG)
    placeholders = ["sweep", "memory", "sinks", "dynamic", "finetune"]  # their inputs are not made here
    for name in placeholders:
        assert "Not measured yet" in (docs / "results" / f"{name}.md").read_text()
    assert len(written) == 7 + len(placeholders) + 4 * HAS_MATPLOTLIB

    training = (docs / "results" / "training.md").read_text()
    rows = rows_of(training)
    learned = next(r for r in rows if r[0] == "`pretrain`")
    rope = next(r for r in rows if r[0] == "`pretrain-rope`")
    assert learned[1:3] == ["23", f"{23 * TOKENS_PER_STEP:,}"]  # steps, tokens read back from the log
    assert rope[1:3] == ["21", f"{21 * TOKENS_PER_STEP:,}"]
    assert learned[5:] == ["23", f"{inputs['learned'][23]:.4f}"]  # the final line's held-out loss
    assert rope[5:] == ["20", f"{inputs['rope'][20]:.4f}"]
    shared = [r for r in rows if r[0].isdigit()]
    assert [int(r[0]) for r in shared] == [10, 20]  # every step both runs evaluated, and only those
    for r in shared:
        step = int(r[0])
        assert r[1] == f"{inputs['learned'][step]:.4f}" and r[2] == f"{inputs['rope'][step]:.4f}"
        assert r[3] == f"{inputs['rope'][step] - inputs['learned'][step]:+.4f}"
    assert "At step 20, the last both evaluated, `pretrain-rope`'s held-out loss is 0.1250 lower" in training

    evaluate = rows_of((docs / "results" / "evaluate.md").read_text())
    assert evaluate[1] == ["`pretrain`", "1,000", "32", "2.2500", f"{math.exp(2.25):.3f}", "45.67%", "640"]
    models = (docs / "results" / "models.md").read_text()
    assert "`pretrain-rope` has 100 fewer parameters than `pretrain`" in models
    assert rows_of(models)[2][:3] == ["`pretrain-rope`", "900", "21"]

    context = (docs / "results" / "context.md").read_text()
    assert "Machine: Made-up CPU, 2 threads, torch x, cpu" in context
    cache = next(r for r in rows_of(context) if r[1] == "sliding cache")
    assert cache == ["`pretrain-rope`", "sliding cache", "2.2625", f"{math.exp(2.2625):.3f}", "1.50"]
    assert ("sliding cache against the sliding window: loss +0.0125, "
            "1.50 ms per token against 6.00: 4.0× faster") in context
    assert "full context against the sliding window: loss +0.5000.\n" in context  # no speed: not a writing speed
    assert "- learned positions stop at 32" in context

    data = rows_of((docs / "results" / "data.md").read_text())
    assert data[1] == ["training", "400", "4,400", "1,000", "4.40"]


def test_rope_speeds_and_weights_come_from_the_code(tmp_path):
    report.main(["--results-dir", str(tmp_path / "none"), "--checkpoints-dir", str(tmp_path / "none"),
                 "--data-dir", str(tmp_path / "none"), "--docs-dir", str(tmp_path / "docs")])
    speeds = rows_of((tmp_path / "docs" / "results" / "rope-speeds.md").read_text())
    first, last = speeds[1], speeds[-1]
    assert first[:3] == ["0", "0, 32", "1"] and first[3] == f"{2 * math.pi:,.1f}"
    assert last[0] == "31" and last[3] == f"{2 * math.pi / 10000 ** (-62 / 64):,.1f}"
    weights = (tmp_path / "docs" / "results" / "weights.md").read_text()
    assert "| `wpe.weight` | 256 × 384 | learned |" in weights
    assert "| `blocks.N.attn.qkv.weight` | 1152 × 384 | both |" in weights
    assert "98,304 fewer" in weights


def test_missing_inputs_are_skipped_with_placeholders(tmp_path, capsys):
    docs = tmp_path / "docs"
    (docs / "results").mkdir(parents=True)
    real = "Made by `python scripts/report.py` from real numbers.\n"
    (docs / "results" / "evaluate.md").write_text(real)
    written = report.main(["--results-dir", str(tmp_path / "r"), "--checkpoints-dir", str(tmp_path / "c"),
                           "--data-dir", str(tmp_path / "d"), "--docs-dir", str(docs)])
    out = capsys.readouterr().out
    assert "skipped the training table and figure" in out and "skipped the evaluation tables" in out
    assert "skipped the table and figure past the window" in out and "skipped the data table" in out
    assert (docs / "results" / "evaluate.md").read_text() == real  # never replaced by a placeholder
    for name in ("training", "models", "context", "data"):
        assert "Run `python scripts/report.py` after the main job" in (docs / "results" / f"{name}.md").read_text()
    if HAS_MATPLOTLIB:
        for name in ("training-loss", "context-loss"):
            assert (docs / "figures" / f"{name}.png").read_bytes().startswith(PNG)
    assert docs / "results" / "evaluate.md" not in written


def test_no_placeholders_writes_only_what_has_inputs(inputs):
    root = inputs["root"]
    (root / "results" / "context.json").unlink()
    (root / "checkpoints" / "pretrain-rope" / "log.jsonl").unlink()
    report.main([*flags(root), "--no-placeholders"])
    docs = root / "docs"
    assert not (docs / "results" / "context.md").exists()
    assert not (docs / "figures" / "context-loss.png").exists()
    training = (docs / "results" / "training.md").read_text()  # one run: its row, no shared steps
    assert "`pretrain`" in training and "`pretrain-rope`" not in training and "both evaluated" not in training
    assert (docs / "figures" / "training-loss.png").exists() == HAS_MATPLOTLIB


def test_a_broken_json_is_a_note_not_a_crash(inputs, capsys):
    root = inputs["root"]
    (root / "results" / "evaluate.json").write_text("{not json")
    report.main([*flags(root), "--no-placeholders"])
    assert "is not valid JSON" in capsys.readouterr().out
    assert not (root / "docs" / "results" / "evaluate.md").exists()
    assert (root / "docs" / "results" / "context.md").exists()


def test_without_matplotlib_the_tables_are_still_written(inputs, monkeypatch, capsys):
    monkeypatch.setattr(report, "pyplot", lambda: None)
    root = inputs["root"]
    written = report.main(flags(root))
    assert all(path.suffix == ".md" for path in written) and len(written) == 7 + 5
    assert not (root / "docs" / "figures").exists()
    assert "matplotlib is not installed" in capsys.readouterr().out


@needs_matplotlib
def test_the_context_figure_smooths_each_method(inputs, monkeypatch):
    drawn = []
    real = report.Writer.figure

    def spy(self, name, draw):
        def wrapped(plt):
            fig = draw(plt)
            drawn.append((name, [line.get_xydata() for line in fig.axes[0].get_lines()]))
            return fig

        real(self, name, wrapped)

    monkeypatch.setattr(report.Writer, "figure", spy)
    report.main(flags(inputs["root"]))
    lines = dict(drawn)["context-loss"]
    curves = [xy for xy in lines if len(xy) > 2]  # not the grey lines at the window's edges
    assert len(curves) == 4  # one per model and method
    window, length, smooth = 32, 96, 8
    for xy in curves:
        assert len(xy) == length - window - smooth + 1  # a moving average of `smooth` positions
        assert xy[0][0] == window + (smooth - 1) / 2  # each mean drawn at the middle of its positions
    first = inputs["context"]["rows"][0]["position_losses"]  # pretrain, sliding window
    assert math.isclose(curves[0][0][1], sum(first[:smooth]) / smooth, rel_tol=1e-12)


def test_context_extension_outputs(tmp_path):
    """The sweep (one table per model, best in bold), memory, sinks, dynamic and the fine-tune."""
    results, ckpts, docs = tmp_path / "results", tmp_path / "checkpoints", tmp_path / "docs"
    results.mkdir()
    rows = [{"model": model, "train_ctx": train, "ctx": ctx, "method": method, "loss": loss,
             "perplexity": math.exp(loss), "tokens": 100}
            for model, train in (("pretrain-rope", 32), ("long", 64))
            for ctx, method, loss in ((32, "none", 2.0), (32, "linear", 2.5), (64, "none", 3.0), (64, "linear", 2.75))]
    memory = [{"ctx": 32, "kv_bytes_per_token": 512, "kv_bytes": 512 * 32, "peak_bytes": 3 * 2**20}]
    (results / "sweep.json").write_text(json.dumps({"machine": "M1", "device": "cpu", "sweep_tokens": 256,
                                                    "linear_factor": None, "rows": rows, "memory": memory}))
    stream_rows = [{"model": "pretrain-rope", "method": m, "loss": loss, "ms_per_token": 1.5, "position_losses": [loss]}
                   for m, loss in (("sliding cache", 2.0), ("4 sinks, shifted", 1.75))]
    for name in ("sinks", "dynamic"):
        (results / f"{name}.json").write_text(json.dumps({"machine": "M2", "length": 128, "streams": 2, "sinks": 4,
                                                          "rows": stream_rows}))
    write_log(ckpts / "long" / "log.jsonl", 5, 10, 0.0, final_line=False)
    report.main(["--results-dir", str(results), "--checkpoints-dir", str(ckpts), "--docs-dir", str(docs),
                 "--finetune", "long", "--no-placeholders", "--readme", ""])
    sweep = (docs / "results" / "sweep.md").read_text()
    assert "| 32 | **2.000** / 7.39 | 2.500 / 12.18 |" in sweep
    assert "| 64 | 3.000 / 20.09 | **2.750** / 15.64 |" in sweep
    assert "Machine: M1" in sweep
    assert "| 32 | 512 | 0.0 | 3.0 |" in (docs / "results" / "memory.md").read_text()
    sinks = (docs / "results" / "sinks.md").read_text()
    assert "4 sinks, shifted | 1.7500 | 5.755 | 1.50 |" in sinks and "keeping 4 attention sinks" in sinks
    finetune = (docs / "results" / "finetune.md").read_text()
    assert "| `long` | 10 | 1,280 |" in finetune
    assert "| 32 | 2.000 | – | 2.000 |" in finetune and "| 64 | 3.000 | – | 3.000 |" in finetune
    if HAS_MATPLOTLIB:
        assert (docs / "figures" / "sweep.png").read_bytes().startswith(PNG)


def test_readme_gets_the_tables_between_its_markers(inputs):
    root = inputs["root"]
    readme = root / "README.md"
    readme.write_text("# title\n\nbefore\n<!-- report.py: start -->\nold\n<!-- report.py: end -->\nafter\n")
    report.main(flags(root))
    text = readme.read_text()
    assert text.startswith("# title\n\nbefore\n<!-- report.py: start -->\n")
    assert text.endswith("<!-- report.py: end -->\nafter\n")
    assert "old" not in text
    assert (root / "docs" / "results" / "models.md").read_text().strip() in text
    assert (root / "docs" / "results" / "context.md").read_text().strip() in text
