"""dev/report.py: fed what the scripts write today (pretrain/evaluate/context/prepare/bench JSON), it
writes tables that carry those numbers; the committed docs tables and the README's Results block are
exactly what it makes of the committed results/."""

from __future__ import annotations

import json
import math
import re
import shutil
import sys
from pathlib import Path

import prepare
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "dev"))
import report  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"
needs_matplotlib = pytest.mark.extra("docs")  # matplotlib draws the figures (tests/conftest.py)
MACHINE = "Made-up CPU, 2 threads, torch x, cpu"


def pretrain_json(kind: str, steps: int, offset: float) -> dict:
    """A run summary in the format pretrain.py writes into results/<run>.json (a last evaluation made
    without a training step in the process, after a resume, has no training loss)."""
    evals = [{"step": s, "val_loss": 3.0 - s / 1000 + offset, "train_loss": 2.9 - s / 1000 + offset}
             for s in range(0, steps, 200)] + [{"step": steps, "val_loss": 2.0 + offset, "train_loss": None}]
    return {"command": f"python scripts/pretrain.py{' --rope' if kind == 'rope' else ''} --minutes 10",
            "machine": MACHINE, "run": "pretrain" + ("-rope" if kind == "rope" else ""), "kind": kind,
            "dtype": "bfloat16", "steps": steps, "tokens": steps * 4096, "seconds": 600.5,
            "tokens_per_s": steps * 4096 / 600.5, "evals": evals, "val_loss": 2.0 + offset, "minutes": 600.5 / 60,
            "params": 900 if kind == "rope" else 1000,
            "args": {"seed": 1337, "lr": 2e-3, "warmup": 100, "min_lr_ratio": 0.1, "compile": kind == "rope"}}


def context_json() -> dict:
    """The format context.py writes (rows carry their window; notes say what a model cannot do)."""
    window, length = 32, 96
    rows = [{"model": m, "method": method, "loss": loss, "ms_per_token": ms, "window": window,
             "position_losses": [loss + 0.01 * ((i % 5) - 2) for i in range(length - window)]}
            for m, method, loss, ms in [("pretrain", "sliding window", 2.5, 8.0), ("pretrain-rope", "sliding window",
                                        2.25, 12.0), ("pretrain-rope", "sliding cache", 2.2625, 2.0),
                                        ("pretrain-rope", "full context", 2.75, 0.5)]]
    return {"machine": MACHINE, "device": "cpu", "length": length, "streams": 2, "window": window, "rows": rows,
            "notes": ["pretrain: learned positions stop at 32"]}


def evaluate_json() -> dict:
    rows = [{"model": m, "params": p, "context": 32, "rope_scaling": "none", "loss": loss,
             "perplexity": math.exp(loss), "accuracy": acc, "tokens": 640}
            for m, p, loss, acc in (("pretrain", 1000, 2.25, 0.4567), ("pretrain-rope", 900, 2.125, 0.5))]
    return {"machine": MACHINE, "rows": rows}


def bench_json(full: bool) -> dict:
    """bench.py's JSON: `full` with every optional part, else only the required keys (plus a bf16 row)."""
    training = {"kind": "rope", "batch": [16, 256], "tokens_per_s": 1800.0, "flops": 150e9, "share_of_peak": 0.9,
                "profile": "mm 58%"}
    b = {"machine": MACHINE, "threads": 2, "date": "2026-12-01T10:00:00+00:00", "config": {"block_size": 256},
         "ceilings": {"matmul_n": 2048, "bandwidth_mbytes": 512, "matmul_fp32_flops": 160e9, "read_bandwidth": 25e9},
         "training": [training, {**training, "dtype": "bfloat16", "tokens_per_s": 3000.0, "share_of_peak": 0.5}],
         "decoding": {"cached_ms_by_threads": {"2": 8.0}, "floor_ms": 2.0, "rerun_ms": 48.0,
                      "rerun_compute_floor_ms": 34.0, "rerun_over_cached": 6.0},
         "generation": [{"batch": 1, "tokens_per_s": 120.0, "floor_tokens_per_s": 420.0, "share_of_floor": 0.286}]}
    if full:
        b["ceilings"] |= {"matmul_bf16_flops": 380e9, "read_bandwidth_1_thread": 24e9}
        b |= {"command": "python scripts/bench.py --compile --json results/bench.json", "malloc_tuned": True,
              "goals": {"cached_over_floor": 1.5, "rerun_over_cached": 20.0, "training_share_of_peak": 0.8},
              "training_malloc_untuned": {**training, "tokens_per_s": 1570.0, "share_of_peak": 0.8077},
              "training_batched_attention_speedup": {"rope": 1.25},
              "training_compiled_over_eager": {"rope": {"float32": 1.04, "bfloat16": 1.25}},
              "training": [*b["training"], {**training, "dtype": "bfloat16", "compiled": True, "attention": "sdpa",
                                            "tokens_per_s": 2400.0, "share_of_peak": 0.6, "profile": "addmm 40%"},
                           {**training, "compiled": True, "compile_s": 41.4, "profile": None}],  # not all profiled
              "c_step": {"ms": 3.6, "build_s": 14.0, "profile": "compiled", "eager_ms": 4.5,
                         "speedup": 1.25, "break_even_tokens": 1200.0}}
        b["decoding"] |= {"dtype": "bfloat16", "cached_ms_by_dtype": {"float32": 6.0, "bfloat16": 8.0},
                          "floor_ms_by_dtype": {"float32": 4.0, "bfloat16": 2.0}, "floors_ratio": 17.0}
    return b


@pytest.fixture
def results(tmp_path) -> Path:
    out = tmp_path / "results"
    out.mkdir()
    for name, data in {"pretrain.json": pretrain_json("learned", 1250, 0.0),
                       "pretrain-rope.json": pretrain_json("rope", 1178, -0.125),
                       "evaluate.json": evaluate_json(), "context.json": context_json(),
                       "bench.json": bench_json(full=True),
                       "ten-minutes/pretrain.json": pretrain_json("learned", 700, 0.5),
                       "ten-minutes/pretrain-rope.json": pretrain_json("rope", 650, 0.25)}.items():
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_text(json.dumps(data))
    shutil.copy(ROOT / "results" / "episode.json", out)
    return out


def rows_of(markdown: str) -> list[list[str]]:
    """The cells of every table row, header rule left out."""
    return [[c.strip() for c in line.strip("|").split("|")] for line in markdown.splitlines()
            if line.startswith("|") and not re.fullmatch(r"\|( *:?-+:? *\|)+", line.strip())]


def test_committed_docs_tables_and_readme_are_what_the_generator_makes_of_committed_results():
    tables, _ = report.build(ROOT / "results")
    for name, text in tables.items():
        path = ROOT / "docs" / "results" / f"{name}.md"
        assert path.read_text(encoding="utf-8") == text, f"{path} is stale: run python dev/report.py"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert report.readme_block(readme, ROOT / "results") == readme, "README's blocks are stale: python dev/report.py"
    generated = {f"{n}.md" for n in tables}
    assert {p.name for p in (ROOT / "docs" / "results").glob("*.md")} == generated  # nothing hand-made left


def test_check_fails_on_an_edited_table_or_readme(tmp_path, capsys):
    docs, readme = tmp_path / "docs", tmp_path / "README.md"
    start = report.README_START.format("results")
    readme.write_text(f"# t\n{start}\nstale text\n{report.README_END}\nafter\n")
    flags = ["--docs-dir", str(docs), "--readme", str(readme), "--no-figures"]
    assert report.main(flags) == 0 and report.main([*flags, "--check"]) == 0
    text = readme.read_text()
    assert text.startswith(f"# t\n{start}\nThe main job's two runs") and text.endswith(f"{report.README_END}\nafter\n")
    assert "stale text" not in text and rows_of((docs / "results" / "context.md").read_text())[0][0] == "model"
    edited = docs / "results" / "sweep.md"
    edited.write_text(edited.read_text() + "| a row typed by hand |\n")
    assert report.main([*flags, "--check"]) == 1
    assert f"differs from what dev/report.py makes of {ROOT / 'results'}: {edited}" in capsys.readouterr().out


def test_training_table_from_pretrain_json(results, tmp_path):
    tables, figures = report.build(results)
    training = tables["training"]
    assert training.startswith(
        "From `results/pretrain.json` (made by `python scripts/pretrain.py --minutes 10`), "
        "`results/pretrain-rope.json` (made by `python scripts/pretrain.py --rope --minutes 10`)")
    assert f"Machine: {MACHINE}\n" in training  # one machine for both runs, named once
    assert "\n| :--- | :--- | :--- | ---: | ---: | ---: | ---: | ---: | ---: |\n" in training  # a rule cell per column
    rows = rows_of(training)
    assert rows[0][6:8] == ["tokens/s, median step", "tokens / wall time"]
    assert rows[1] == ["learned positions", "learned", "bfloat16", "1,250", f"{1250 * 4096:,}", "10.0",
                       f"{1250 * 4096 / 600.5:,.0f}", f"{1250 * 4096 / 600.5:,.0f}", "2.0000"]
    assert rows[2][:4] == ["rotary embeddings", "rope", "bfloat16", "1,178"] and rows[2][-1] == "1.8750"
    shared = [r for r in rows[3:] if r[0] != "step"]
    assert [r[0] for r in shared] == ["0", "200", "400", "600", "800", "1,000"]  # steps both evaluated, only those
    assert shared[-1] == ["1,000", "2.0000", "1.8750", "-0.1250"]
    assert callable(figures["training-loss.png"])
    evaluate = rows_of(tables["evaluate"])
    assert evaluate[1:] == [["`pretrain`", "1,000", "32", "2.2500", f"{math.exp(2.25):.2f}", "45.7%"],
                            ["`pretrain-rope`", "900", "32", "2.1250", f"{math.exp(2.125):.2f}", "50.0%"]]
    assert "Over 640 held-out tokens, read in float32." in tables["evaluate"]


def test_evaluate_read_in_bf16_shows_its_difference_from_float32():
    d = evaluate_json()
    for x in d["rows"]:
        x.update(dtype="bfloat16", loss_float32=x["loss"] - 0.0002, loss_difference=0.0002)
    table = report.evaluate({"evaluate.json": d})["evaluate"]
    assert rows_of(table)[0][-1] == "bf16 - float32 loss" and rows_of(table)[1][-1] == "+0.0002"
    assert "read in bfloat16." in table


def test_precision_table_lists_every_evaluation_and_the_verdict():
    rows = [{"step": s, "float32": 3.0 - s / 100, "bfloat16": 3.01 - s / 100, "difference": 0.01} for s in (25, 50)]
    d = {"command": "python dev/precision_parity.py", "machine": MACHINE, "kind": "rope",
         "dtypes": ["float32", "bfloat16"], "steps": 50,
         "rows": rows, "max_abs_difference": 0.01, "tolerance": 0.03, "within_tolerance": True}
    table = report.precision({"precision.json": d})["precision"]
    assert rows_of(table)[1:] == [["25", "2.7500", "2.7600", "+0.0100"], ["50", "2.5000", "2.5100", "+0.0100"]]
    assert "the largest held-out difference is 0.0100, within the tolerance of 0.03." in table


def test_precision_table_sets_a_second_run_beside_the_first():
    def run(bf16: list[float]) -> dict:
        rows = [{"step": s, "float32": 3.0, "bfloat16": b, "difference": b - 3.0}
                for s, b in zip((25, 50), bf16, strict=True)]
        return {"command": "python dev/precision_parity.py", "machine": MACHINE, "kind": "rope",
                "dtypes": ["float32", "bfloat16"], "steps": 50, "rows": rows,
                "max_abs_difference": max(abs(b - 3.0) for b in bf16), "tolerance": 0.03,
                "within_tolerance": max(abs(b - 3.0) for b in bf16) <= 0.03}
    again = {**run([3.0, 2.95]), "note": "once more"}
    table = report.precision({"precision.json": run([3.0, 3.04]), "precision-again.json": again})["precision"]
    assert rows_of(table)[0][-3:] == ["bfloat16, again", "difference, again", "bfloat16 - bfloat16, again"]
    assert rows_of(table)[1:] == [["25", "3.0000", "3.0000", "+0.0000", "3.0000", "+0.0000", "+0.0000"],
                                  ["50", "3.0000", "3.0400", "+0.0400", "2.9500", "-0.0500", "+0.0900"]]
    assert "0.0400, outside the tolerance of 0.03." in table
    assert "Run once more with the same settings (`results/precision-again.json`), the largest difference was " \
           "0.0500, and the two bfloat16 runs were up to 0.0900 apart." in table
    assert "once more)" not in table  # a JSON's note is for whoever reads the file, not for the page


def test_precision_runs_table_gives_each_comparisons_settings_and_worst_step():
    def run(command: str, warmup: int, diffs: list[float]) -> dict:
        rows = [{"step": s, "float32": 4.0, "bfloat16": 4.0 + x, "difference": x}
                for s, x in zip((100, 200, 300), diffs, strict=True)]
        return {"command": command, "machine": MACHINE, "kind": "rope", "dtypes": ["float32", "bfloat16"],
                "steps": 300, "lr": 2e-3, "warmup": warmup, "rows": rows, "tolerance": 0.03,
                "max_abs_difference": max(map(abs, diffs)), "within_tolerance": max(map(abs, diffs)) <= 0.03}
    r = {"precision.json": run("python dev/precision_parity.py", 200, [0.01, -0.02, 0.0]),
         "warmup100/precision-eager.json": run("python dev/precision_parity.py --eager", 100, [-0.05, 0.04, 0.01])}
    out = report.precision_runs(r)["precision-runs"]
    assert rows_of(out)[1:] == [
        ["`precision.json`", "200", "0.002", "compiled", "300", "3", "-0.0200", "200", "none"],
        ["`warmup100/precision-eager.json`", "100", "0.002", "eager", "300", "3", "-0.0500", "100", "100, 200"]]
    assert "the tolerance is 0.03." in out and "`results/warmup100/precision-eager.json`" in out


def test_precision_peak_table_gives_each_runs_move_in_one_step():
    f32 = {25: 5.0, 99: 4.10, 100: 4.15, 101: 4.11, 200: 3.5}
    bf16 = {25: 5.0, 99: 4.11, 100: 4.10, 101: 4.085, 200: 3.5}
    rows = [{"step": s, "float32": f32[s], "bfloat16": bf16[s], "difference": bf16[s] - f32[s]} for s in f32]
    d = {"command": "python dev/precision_parity.py --every-step 99 101", "machine": MACHINE, "kind": "rope",
         "dtypes": ["float32", "bfloat16"], "steps": 200, "rows": rows, "every_step": [99, 101],
         "max_abs_difference": 0.05, "tolerance": 0.03, "within_tolerance": False}
    out = report.precision_peak({"warmup100/precision-peak.json": d})
    assert rows_of(out["precision-peak"])[1:] == [  # only the steps evaluated one by one
        ["99", "4.1000", "4.1100", "+0.0100", "", ""],
        ["100", "4.1500", "4.1000", "-0.0500", "+0.0500", "-0.0100"],
        ["101", "4.1100", "4.0850", "-0.0250", "-0.0400", "-0.0150"]]
    assert ("In one step float32's loss moved by up to 0.0500 (into step 100) and bfloat16's by up to 0.0150 "
            "(into step 101); the two differed by more than 0.03 at 1 of these 3 steps (100).") in out["precision-peak"]
    assert callable(out["precision-peak.png"])


def test_schedule_table_sets_each_full_run_beside_the_main_jobs_kept_run(tmp_path):
    def run(command: str, loss: float, warmup: int) -> dict:
        return {"command": command, "machine": MACHINE, "args": {"lr": 2e-3, "warmup": warmup, "min_lr_ratio": 0.1},
                "evals": [{"step": s, "val_loss": loss - s / 1000} for s in (100, 300, 600, 800, 1000)]}
    r = {"schedule/pretrain-rope.json": run("python scripts/pretrain.py --rope", 4.0, 100),
         "pretrain-rope.json": run("python scripts/pretrain.py --rope", 3.0, 100),  # the main job's now: not here
         "schedule/pretrain-rope-warmup50.json": run("python scripts/pretrain.py --rope --warmup 50", 4.5, 50)}
    for name, d in r.items():  # through build, as the docs are made: which JSONs the table reads
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(json.dumps(d))
    table = report.build(tmp_path)[0]["schedule"]
    assert rows_of(table)[0][1:4] == ["--lr", "--warmup", "--min-lr-ratio"]
    assert rows_of(table)[1:] == [  # in SCHEDULE's order, the runs not measured left out; settings from args
        ["`schedule/pretrain-rope.json`", "0.002", "100", "0.1", "3.9000", "3.7000", "3.4000", "3.2000", "3.0000"],
        ["`schedule/pretrain-rope-warmup50.json`", "0.002", "50", "0.1", "4.4000", "4.2000", "3.9000", "3.7000",
         "3.5000"]]
    assert "`results/schedule/pretrain-rope-warmup50.json` (made by `python scripts/pretrain.py --rope --warmup 50`)" \
        in table


def test_finetune_table_from_its_pretrain_json(results):
    (results / report.FINETUNE).write_text(json.dumps(pretrain_json("rope", 80, 0.5)))
    rows = rows_of(report.build(results)[0]["finetune"])
    assert rows[1] == ["`pretrain-rope-ctx1024-linear`", "80", f"{80 * 4096:,}", "10.0", "3.5000 (step 0)", "2.5000"]


def test_data_table_from_prepare_json(corpus_dir, tmp_path):
    out = tmp_path / "results"
    meta = prepare.main(["--source", str(corpus_dir), "--data-dir", str(tmp_path / "data"), "--vocab-size", "280",
                         "--json", str(out / "data.json")])
    written = json.loads((out / "data.json").read_text())
    assert written["command"].startswith("python scripts/prepare.py --source ")
    assert written["train"] == {"stories": 400, "tokens": meta["train_tokens"], "characters": meta["train_chars"],
                                "chars_per_token": meta["train_chars"] / meta["train_tokens"]}
    data = report.build(out)[0]["data"]
    assert rows_of(data)[2] == ["held out", "60", f"{meta['val_tokens']:,}",
                                f"{meta['val_chars'] / meta['val_tokens']:.2f}"]
    assert "Machine: none needed (counts, not timings)" in data and f"`{meta['tokenizer_hash']}`" in data


def test_context_table_and_its_speed_ratios(results):
    context = report.build(results)[0]["context"]
    assert rows_of(context)[3] == ["`pretrain-rope`", "sliding cache", "2.2625", "2.00"]
    assert ("`pretrain-rope`'s sliding cache writes a token 6.0× faster than its sliding window, 4.0× faster than "
            "`pretrain`'s, at a loss +0.0125 from the window's.") in context
    assert "2 streams of 96 held-out tokens; loss over the tokens past the first 32, on `cpu`." in context
    assert "C step" not in context  # the committed JSON: context.py's three methods alone


def test_context_table_shows_the_c_steps_row_where_there_is_one(results):
    d = context_json()
    d["rows"].insert(3, {**d["rows"][2], "method": "sliding cache, C step", "loss": 2.26251, "ms_per_token": 0.5})
    (results / "context.json").write_text(json.dumps(d))
    context = report.build(results)[0]["context"]
    assert rows_of(context)[3:5] == [["`pretrain-rope`", "sliding cache", "2.2625", "2.00"],
                                     ["`pretrain-rope`", "sliding cache, C step", "2.2625", "0.50"]]
    assert ("With its one-token step in C (`mvgpt/perf/one_token.c`), the same sliding cache writes a token in 0.25 "
            "of the time model.py's step takes, at model.py's step's loss, to four places.") in context


def test_a_loss_difference_that_rounds_to_zero_is_said_so_not_signed():
    assert report.at_loss(0.0011, "the window's") == "at a loss +0.0011 from the window's"
    assert report.at_loss(-0.00004, "the step's") == "at the step's loss, to four places"  # not "-0.0000"
    assert report.at_loss(-0.00006, "the step's") == "at a loss -0.0001 from the step's"


def test_sweep_is_loss_only_with_the_best_of_each_row_in_bold(tmp_path):
    rows = [{"model": "pretrain-rope", "train_ctx": 32, "ctx": ctx, "method": method, "loss": loss,
             "perplexity": math.exp(loss), "tokens": 100}
            for ctx, method, loss in ((32, "none", 2.0), (32, "linear", 2.5), (64, "none", 3.0), (64, "linear", 2.75))]
    memory = [{"ctx": 32, "kv_bytes_per_token": 512, "kv_bytes": 512 * 32, "peak_bytes": 3 * 2**20}]
    (tmp_path / "sweep.json").write_text(json.dumps({"machine": "M1", "device": "cpu", "rows": rows, "memory": memory,
                                                     "linear_factor": None, "sweep_tokens": 256, "notes": []}))
    tables, _ = report.build(tmp_path)
    assert "| 32 | **2.000** | 2.500 |\n| 64 | 3.000 | **2.750** |\n" in tables["sweep"]
    assert "compare the methods within a row" in tables["sweep"]
    assert rows_of(tables["memory"])[1] == ["32", "512", "0.0", "3.0"]


def test_bench_table_tolerates_absent_optional_keys(results):
    full = rows_of(report.build(results)[0]["bench"])
    assert ["training (rope, malloc untuned, 16×256)", "1,570 tokens/s = 150.0 GFLOP/s", "fp32 peak",
            "0.81 of peak", "≥ 0.8"] in full
    assert full[-2][:4] == ["decoding, re-run window (learned, 256)", "48.0 ms/token",
                            "compute floor 34.0 ms (17.0× the cache's floor)", "6.0× the cache"]
    # decoding in each precision against its own floor; the threads in the headline one; compiled (float32)
    # against the float32 floor, with its speed beside the eager step's
    assert ["decoding, sliding cache, float32 weights", "6.00 ms/token", "floor 4.00 ms", "1.50× floor",
            "≤ 1.5×"] in full
    # the eager float32 step (the first row: a bench from before rows named their dtype) against float32's peak
    assert ["training (rope, float32): against float32's products", "0.94 of the fp32 peak", "fp32 peak 160.0 GFLOP/s",
            "", ""] in full
    assert ["decoding, sliding cache, bfloat16, 2 threads", "8.00 ms/token", "floor 2.00 ms", "4.00× floor",
            "≤ 1.5×"] in full
    assert ["decoding, sliding cache, float32, fast step (fast_decode.py)", "3.60 ms/token (making it: 14 s, 1.25× "
            "the eager step's 4.50 side by side: pays after 1,200 tokens)", "floor 4.00 ms", "0.90× floor",
            "≤ 1.5×"] in full
    assert "training (rope, bfloat16, compiled, PyTorch's attention kernel, 16×256)" in [r[0] for r in full]
    assert "training (rope, compiled (41 s), 16×256)" in [r[0] for r in full]  # its compile time, where recorded
    assert ["training (rope, compiled bf16): attention's batched products over PyTorch's kernel", "1.25× the tokens/s",
            "side by side", "", ""] in full
    assert ["training (rope): compiled over eager, side by side", "float32 1.04×, bfloat16 1.25×", "the same step",
            "", ""] in full
    profiles = report.build(results)[0]["bench-profiles"]  # the training step profiled last, named as run
    assert "**One training step (rope, bfloat16, compiled)**\n\n```text\naddmm 40%\n```" in profiles
    assert "mm 58%" not in profiles
    (results / "bench.json").write_text(json.dumps(bench_json(full=False)))
    tables, _ = report.build(results)
    rows = rows_of(tables["bench"])
    assert [r[0] for r in rows] == ["figure", "fp32 matmul peak", "memory read", "training (rope, 16×256)",
                                    "training (rope, bfloat16, 16×256)",
                                    "training (rope, float32): against float32's products",
                                    "decoding, sliding cache, 2 threads",
                                    "decoding, re-run window (learned, 256)", "generation, batch 1"]
    assert rows[3][-1] == "" and rows[6][3:] == ["4.00× floor", ""]  # no goals in the JSON: no goal column
    # a bench on a CPU whose bf16 is emulated: its probe's bf16 peak, and the parts its plan skipped
    emulated = bench_json(full=False)
    emulated["ceilings"] |= {"matmul_bf16_flops": 0.3e9, "matmul_bf16_n": 256}
    emulated |= {"skipped": [{"part": "training in bfloat16", "estimated_seconds": 3 * 3600.0}],
                 "training_float32_share_of_fp32_peak": {"rope": 0.76}}
    (results / "bench.json").write_text(json.dumps(emulated))
    rows = rows_of(report.build(results)[0]["bench"])
    assert ["bf16 matmul peak", "0.3 GFLOP/s", "256² product (bench's probe)", "", ""] in rows
    assert ["training (rope, float32): against float32's products", "0.76 of the fp32 peak", "fp32 peak 160.0 GFLOP/s",
            "", ""] in rows  # the figure bench.py wrote, where it did
    assert rows[-1] == ["training in bfloat16", "skipped", "about 180 min on this machine", "", ""]
    assert "**One training step (rope, bfloat16)**\n\n```text\nmm 58%\n```" in tables["bench-profiles"]


AMD = "AMD EPYC (AVX512), 2 threads of 2 cores, torch x, cpu"


def one_run_set(results: Path) -> dict:
    """The episode page's run set on one machine: the main job's two runs, and the episode's commands typed after
    it (`pretrain.py --rope` into pretrain-rope-2, evaluate.py and context.py on checkpoints/*)."""
    typed = {**pretrain_json("rope", 600, 0.5), "machine": AMD}
    typed["args"]["out_dir"] = "checkpoints/pretrain-rope-2"
    files = {"amd-epyc/main-job-default/pretrain.json": {**pretrain_json("learned", 825, 0.375), "machine": AMD},
             "amd-epyc/main-job-default/pretrain-rope.json": {**pretrain_json("rope", 825, 0.25), "machine": AMD},
             "amd-epyc/episode/pretrain-rope.json": typed,
             "amd-epyc/episode/evaluate.json": {**evaluate_json(), "machine": AMD, "seconds": 150.0},
             "amd-epyc/episode/context.json": {**context_json(), "machine": AMD, "seconds": 600.0}}
    files["amd-epyc/episode/evaluate.json"]["rows"].append({**evaluate_json()["rows"][1], "model": "pretrain-rope-2",
                                                            "loss": 2.0, "perplexity": math.exp(2.0)})
    for name, d in files.items():
        (results / name).parent.mkdir(parents=True, exist_ok=True)
        (results / name).write_text(json.dumps(d))
    return files


def test_episode_table_sets_each_episode_figure_beside_ours_from_one_run_set(results):
    one_run_set(results)
    episode = json.loads((ROOT / "results" / "episode.json").read_text())
    r = report.load_all(results)
    for f in episode["figures"]:  # every figure finds its place in the run set, but the learned run typed again
        spec = report.on_machine(f["ours"], report.ONE_RUN_SET)  # and the GPU, which the set does not have
        assert (report.ours(r, spec) is None) == (f["ours"].startswith(("context-gpu.json", "ten-minutes/pretrain."))
                                                  or "@1000" in f["ours"]), f["what"]
    text = report.build(results)[0]["episode"]
    assert text.startswith("From `results/episode.json` (the video's figures, from its transcript), "
                           "`results/amd-epyc/main-job-default/pretrain.json` (made by "
                           "`python scripts/pretrain.py --minutes 10`)")
    # a file one of the episode's commands wrote, without a command of its own, gets that command, as typed
    assert ("`results/amd-epyc/episode/context.json` (made by `python scripts/context.py checkpoints/* --device cpu "
            "--json results/amd-epyc/episode/context.json`)") in text
    assert f"Machine: {AMD}\n" in text and MACHINE not in text  # one machine, named once
    assert "`results/pretrain.json`" not in text and "`results/ten-minutes/" not in text
    rows = {row[0]: row[1:] for row in rows_of(text)}
    assert rows["figure"] == ["episode (at)", "ours", "our run"]  # each row says which of our runs it reads
    assert rows["CPU ms/token: rope, sliding cache"] == ["about 2.2 (0:19, 13:37)", "2.0", "the main job's"]
    assert rows["CPU: rope's window ÷ its sliding cache"] == [
        "about 5.3× as said; 12 ÷ 2.2 ≈ 5.5 (13:37)", "6.0×", "the main job's"]
    assert rows["steps in ten minutes, rope (`pretrain.py --rope` as typed)"] == [
        "1,178 (9:40)", "600", "as typed, `pretrain-rope-2`"]
    assert rows["held-out loss after ten minutes, learned (as typed)"] == ["about 2.25 (16:20)", "–", ""]
    assert rows["held-out loss at the end, learned"] == ["about 2.25 (16:20)", "2.38", "the main job's"]
    assert rows["held-out loss at step 1,000, learned"] == ["about 2.31 (10:16)", "–", ""]  # 825 steps: none at 1,000
    assert rows["top-1 accuracy, rope"] == ["about 51% (10:41)", "50%", "the main job's"]
    assert rows["parameters fewer than with learned positions"][1] == "100"
    assert rows["GPU ms/token: rope, sliding cache"] == ["about 3.0 (13:37)", "–", ""]


def test_episode_intro_sets_the_videos_headline_beside_ours_ratio_against_ratio(results):
    one_run_set(results)
    intro = report.build(results)[0]["episode-intro"]
    assert intro.startswith("From `results/amd-epyc/episode/context.json` (made by `python scripts/context.py "
                            "checkpoints/* --device cpu --json results/amd-epyc/episode/context.json`), by "
                            f"`python dev/report.py`.  \nMachine: {AMD}\n\n")  # the glob as a learner types it
    assert rows_of(intro) == [["past the window, on a CPU", "the video (0:19)", "ours"],
                              ["learned positions: the window run again, ms a token", "about 8.6", "8.0"],
                              ["rotary embeddings: the sliding cache, ms a token", "about 2.2", "2.0"],
                              ["the learned window's time ÷ the rope cache's", "8.6 ÷ 2.2 ≈ 3.9× (derived)", "4.0×"]]


def test_episode_training_evaluate_and_context_tables_come_from_the_one_run_set(results):
    one_run_set(results)
    tables, figures = report.build(results)
    training = tables["episode-training"]
    assert training.startswith("From `results/amd-epyc/main-job-default/pretrain.json` (made by `python "
                               "scripts/pretrain.py --minutes 10`), `results/amd-epyc/main-job-default/pretrain-rope"
                               ".json` (made by `python scripts/pretrain.py --rope --minutes 10`)")
    assert ("Machine: " + AMD + "\n\n825 steps each, as the main job picked them from this machine's speed, 100 of "
            "them to warm up. The held-out loss is `pretrain.py`'s own estimate") in training
    assert rows_of(training)[1:] == [["learned positions", "825", f"{825 * 4096 / 600.5:,.0f}", "2.3750"],
                                     ["rotary embeddings", "825", f"{825 * 4096 / 600.5:,.0f}", "2.2500"]]
    assert callable(figures["episode-loss.png"]) and callable(figures["episode-context-loss.png"])
    evaluated = tables["episode-evaluate"]
    assert evaluated.startswith("From `results/amd-epyc/episode/evaluate.json` (made by `python scripts/evaluate.py "
                                "checkpoints/* --dtype auto --json results/amd-epyc/episode/evaluate.json`)")
    assert [r[0] for r in rows_of(evaluated)[1:]] == ["`pretrain`", "`pretrain-rope`", "`pretrain-rope-2`"]
    assert evaluated.endswith("\nIt took 2.5 minutes for all 3 models.\n")
    context = tables["episode-context"]
    assert context.startswith("From `results/amd-epyc/episode/context.json` (made by `python scripts/context.py "
                              "checkpoints/* --device cpu --json results/amd-epyc/episode/context.json`)")
    assert rows_of(context)[3] == ["`pretrain-rope`", "sliding cache", "2.2625", "2.00"]
    assert ("`pretrain-rope`'s sliding cache writes a token 6.0× faster than its sliding window, 4.0× faster than "
            "`pretrain`'s, at a loss +0.0125 from the window's.\n\nIts notes:\n\n"
            "- pretrain: learned positions stop at 32\n\nIt took 10.0 minutes in all.\n") in context
    (results / "amd-epyc" / "episode" / "context.json").unlink()  # without it: placeholders, the rest still made
    tables, figures = report.build(results)
    assert "Not measured yet" in tables["episode-intro"] and "Not measured yet" in tables["episode-context"]
    assert figures["episode-context-loss.png"] is None and callable(figures["episode-loss.png"])


def test_ten_minutes_table_from_the_commands_as_typed(results):
    tables, _ = report.build(results)
    text = tables["ten-minutes"]
    assert text.startswith("From `results/ten-minutes/pretrain.json` (made by `python scripts/pretrain.py "
                           "--minutes 10`), `results/ten-minutes/pretrain-rope.json` (made by")
    rows = rows_of(text)
    assert rows[1] == ["learned positions", "Made-up CPU", "eager", "100 steps", "700", "10.0",
                       f"{700 * 4096 / 600.5:,.0f}", f"{700 * 4096 / 600.5:,.0f}", "2.5000"]
    assert rows[2][:5] == ["rotary embeddings", "Made-up CPU", "compiled", "100 steps", "650"] and len(rows) == 3
    assert "All in bfloat16. " in text  # one dtype: said once, not a column
    (results / "ten-minutes" / "pretrain-rope-eager.json").write_text(json.dumps(pretrain_json("learned", 500, 0.75)))
    other = {**pretrain_json("rope", 400, 1.0), "machine": "Other CPU (AVX2), 2 threads, torch x, cpu"}
    (results / "amd-epyc" / "ten-minutes").mkdir(parents=True)
    (results / "amd-epyc" / "ten-minutes" / "pretrain-rope.json").write_text(json.dumps(other))
    text = report.build(results)[0]["ten-minutes"]
    rows = rows_of(text)  # the eager run after the two, then the other CPU's runs, each naming its CPU
    assert [r[:5] for r in rows[3:]] == [["rotary embeddings", "Made-up CPU", "eager", "100 steps", "500"],
                                         ["rotary embeddings", "Other CPU (AVX2)", "compiled", "100 steps", "400"]]
    assert "Machine: Made-up CPU, 2 threads, torch x, cpu; Other CPU (AVX2), 2 threads, torch x, cpu" in text
    mixed = report.ten_minutes({"ten-minutes/pretrain.json": pretrain_json("learned", 700, 0.5),
                                "ten-minutes/pretrain-rope.json": {**pretrain_json("rope", 300, 0.5),
                                                                   "dtype": "float32"}})["ten-minutes"]
    assert rows_of(mixed)[0][3] == "dtype" and rows_of(mixed)[2][3] == "float32" and "All in" not in mixed


def test_warm_up_bound_says_whether_the_clock_shortened_it():
    run = {"warmup": 200, "warmup_share": 0.2, "max_steps": None}
    assert report.warmup_bound(run) == "200 steps, ≤ 20% of the time"
    assert report.warmup_bound({**run, "warmup_share": 0.0}) == "200 steps"  # --warmup-share 0
    assert report.warmup_bound({**run, "max_steps": 1000}) == "200 steps"  # bounded by steps: the share does nothing
    assert report.warmup_bound({"warmup": 200}) == "200 steps"  # a run from before the share


def test_bench_machines_sets_each_cpus_peaks_and_fastest_step_side_by_side(results):
    rows = rows_of(report.build(results)[0]["bench-machines"])
    assert rows == [["figure", "Made-up CPU"], ["fp32 matmul peak", "160.0 GFLOP/s"],
                    ["bf16 matmul peak", "380.0 GFLOP/s (2.4× fp32)"], ["memory read", "25.0 GB/s"],
                    ["training, learned: the fastest step", "–"],
                    ["training, rope: the fastest step", "3,000 tokens/s = 0.50 of peak (bfloat16)"],
                    ["training, float32 (eager): the fp32 peak's share", "rope 0.94"],
                    ["the matrix products' share of the last profiled rope step", "–"],
                    ["decoding, sliding cache, float32 weights", "6.00 ms/token = 1.50× its floor"],
                    ["decoding, sliding cache, bfloat16 weights", "8.00 ms/token = 4.00× its floor"],
                    ["decoding, float32, fast step (fast_decode.py)", "1.25× the eager step's speed"],
                    ["measured", "2026-12-01"]]
    other = bench_json(full=False) | {"machine": "Other CPU (AVX2), 2 threads", "date": "2026-12-02T11:00:00+00:00"}
    other["training"] = [{**t, "profile_parts": {"matrix products": 0.3, "GELU": 0.1}} for t in other["training"]]
    (results / "amd-epyc").mkdir()
    (results / "amd-epyc" / "bench.json").write_text(json.dumps(other))
    text = report.build(results)[0]["bench-machines"]
    rows = rows_of(text)
    assert rows[0] == ["figure", "Made-up CPU", "Other CPU (AVX2)"]
    assert rows[2] == ["bf16 matmul peak", "380.0 GFLOP/s (2.4× fp32)", "–"]
    assert rows[7] == ["the matrix products' share of the last profiled rope step", "–", "75% of 400 ms"]
    assert rows[8:] == [["decoding, sliding cache, float32 weights", "6.00 ms/token = 1.50× its floor", "–"],
                        ["decoding, sliding cache, bfloat16 weights", "8.00 ms/token = 4.00× its floor", "–"],
                        ["decoding, float32, fast step (fast_decode.py)", "1.25× the eager step's speed", "–"],
                        ["measured", "2026-12-01", "2026-12-02"]]
    assert "`results/amd-epyc/bench.json`" in text
    assert report.cpu("Intel(R) Xeon(R) Processor (AVX512), 2 threads, torch x, cpu") == "Intel Xeon (AVX512)"


def test_missing_inputs_give_placeholders_and_the_code_tables_are_still_made(tmp_path):
    tables, figures = report.build(tmp_path)
    assert "`pretrain.json, pretrain-rope.json` is not in `results/`" in tables["training"]
    assert all("Not measured yet" in tables[n] for n in tables if n not in ("rope-speeds", "weights"))
    assert figures["training-loss.png"] is None and callable(figures["rope-rotation.png"])
    speeds = rows_of(tables["rope-speeds"])
    assert speeds[1][:4] == ["0", "0, 32", "1", f"{2 * math.pi:,.1f}"]
    assert speeds[-1][0] == "31" and speeds[-1][3] == f"{2 * math.pi / 10000 ** (-62 / 64):,.1f}"
    weights = tables["weights"]
    assert "| `wpe.weight` | 256 × 384 | learned |" in weights and "98,304 fewer" in weights


def test_a_readme_without_blocks_or_with_an_unknown_one_is_one_line_on_stderr(tmp_path, capsys):
    readme = tmp_path / "README.md"
    for text, said in (("# no markers\n", "has no report.py block"),
                       ("<!-- report.py: results -->\n<!-- report.py: end -->\n<!-- report.py: typo -->\n"
                        "<!-- report.py: end -->\n", "names no block report.py makes (typo)")):
        readme.write_text(text)
        assert report.main(["--docs-dir", str(tmp_path / "docs"), "--readme", str(readme), "--no-figures"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err and "with NAME one of main, pretrain," in err
        assert readme.read_text() == text and not (tmp_path / "docs").exists()  # nothing written


@needs_matplotlib
def test_figures_are_pngs_and_a_missing_input_a_placeholder(results, tmp_path):
    shutil.copy(ROOT / "results" / "sweep.json", results)  # a real sweep: two models, seven methods
    (results / "pretrain.json").unlink()
    docs = tmp_path / "docs"
    assert report.main(["--results-dir", str(results), "--docs-dir", str(docs), "--readme", ""]) == 0
    one_run_set(results)
    for name in ("training-loss", "context-loss", "sweep", "bench", "rope-rotation", "episode-loss",
                 "episode-context-loss"):
        assert (docs / "figures" / f"{name}.png").read_bytes().startswith(PNG), name
    assert "`pretrain.json` is not in `results/`" in (docs / "results" / "training.md").read_text()


def lora_json(measured: bool = True) -> dict:
    """The format finetune.py --json writes into results/lora.json."""
    d = {"run": "lora-rope", "base": "checkpoints/pretrain-rope", "rank": 8, "alpha": 16.0, "layers": 24,
         "steps": 150, "batch_size": 8, "lr": 0.002, "minutes": 3.25, "val_loss": 1.875, "train_loss_first": 2.5,
         "train_loss_last": 1.9375, "train_examples": 20000, "val_examples": 500, "trainable": 294912,
         "params": 14088192, "trainable_share": 294912 / 14088192, "adapter_bytes": 3_600_000,
         "adapter_weight_bytes": 1_179_648, "checkpoint_bytes": 165_000_000,
         "adapter_share_of_checkpoint": 3_600_000 / 165_000_000, "machine": MACHINE}
    if measured:
        rows = [{"model": "base", "story_loss": 2.25, "words_used": 0.375, "dialogue_quoted": 0.5,
                 "quotes_unasked": 0.25, "story_tokens": 150.5},
                {"model": "lora-rope", "story_loss": 1.875, "words_used": 0.875, "dialogue_quoted": 1.0,
                 "quotes_unasked": None, "story_tokens": 120.25}]
        d["measure"] = {"prompts": 24, "dialogue_prompts": 10, "loss_examples": 64, "gen_tokens": 160,
                        "temperature": 0.8, "top_k": 50, "seed": 1337, "seconds": 95.5, "rows": rows,
                        "sample": {"prompt": "Words: kite, windy, string\nFeatures: Dialogue\nStory:\n",
                                   "base": "Tom had a *red* kite.<|endoftext|>Once upon",
                                   "lora-rope": "It was windy. \"Look!\" said Mia.\n\nThe string broke."}}
    return d


def test_lora_table_from_finetune_json(tmp_path):
    (tmp_path / "lora.json").write_text(json.dumps(lora_json()))
    lora = report.build(tmp_path)[0]["lora"]
    assert lora.startswith("From `results/lora.json` (made by `python scripts/finetune.py --init-from "
                           "checkpoints/pretrain-rope --json results/lora.json`)")
    assert f"Machine: {MACHINE}\n" in lora
    run, measured = (rows_of(part) for part in lora.split("The base and", 1))
    assert run[0] == ["run", "`lora-rope`"]
    run = dict(run[1:])
    assert run["trainable weights"] == "294,912 of 14,088,192 (2.09%)"
    assert run["rank r, alpha"] == "8, 16 (on 24 linear layers)"
    assert run["adapter file"].startswith("3.60 MB (1.18 MB of A and B")
    assert run["base checkpoint"] == "165.0 MB: the adapter is 2.2% of it"
    assert run["training"] == "150 steps of 8 examples, lr 0.002, 3.2 min"
    assert run["training batch loss"] == "2.5000 at the first step, 1.9375 at the last"
    assert measured == [["model", "story loss", "requested words used", "Dialogue prompts quoted",
                         "quotes when not asked", "tokens per story"],
                        ["`base`", "2.2500", "38%", "50%", "25%", "150"],
                        ["`lora-rope`", "1.8750", "88%", "100%", "–", "120"]]
    assert "24 held-out prompts (10 ask for Dialogue)" in lora and "over 64 held-out examples" in lora
    # the samples: the prompt as written, each story cut at <|endoftext|>, markdown escaped, quoted
    assert "```text\nWords: kite, windy, string\nFeatures: Dialogue\nStory:\n```" in lora
    assert "`base`:\n\n> Tom had a \\*red\\* kite.\n" in lora and "Once upon" not in lora
    assert "`lora-rope`:\n\n> It was windy. \"Look!\" said Mia.\n>\n> The string broke.\n" in lora


def test_lora_table_without_measurement_and_a_long_sample_is_cut():
    assert "No measurement in the JSON" in report.lora({"lora.json": lora_json(measured=False)})["lora"]
    assert report.quoted("word " * 200).endswith(" …\n") and len(report.quoted("word " * 200)) < 410


def llama_cpp_json() -> dict:
    """The format export_check.py --gguf writes into results/llama_cpp.json: a learned model (no rope options)
    and a rope model, with one method llama.cpp does not have at one context."""
    def cell(ctx, method, options, loss, gelu_shift, diff, diff_ggml):
        return {"ctx": ctx, "method": method, "llama_cpp_options": options, "tokens": 1024, "loss_mvgpt": loss,
                "loss_mvgpt_ggml_gelu": loss + gelu_shift, "loss_llama_cpp": loss + gelu_shift + 1e-6,
                "max_token_loss_difference": diff, "max_token_loss_difference_ggml_gelu": diff_ggml,
                "perplexity_mvgpt": math.exp(loss), "perplexity_llama_cpp": math.exp(loss + gelu_shift + 1e-6)}

    plain = {"freq_base": 10000.0, "type": "none", "factor": None, "original_context": None}
    learned = {"checkpoint": "checkpoints/pretrain/ckpt.pt", "export": "exports/pretrain.gguf",
               "architecture": "gpt2", "step": 1000, "train_ctx": 256, "prompt": "Once upon a time",
               "new_tokens": 200, "match": True, "first_difference": None, "held_out_tokens": 50000,
               "held_out_tokens_match": True, "story_mvgpt": "Once upon a time",
               "sweep": [cell(256, "none", {}, 2.25, 1e-5, 3e-3, 2e-6)],
               "not_in_llama_cpp": ["linear at 256", "linear at 512"]}
    rope = {**learned, "checkpoint": "checkpoints/pretrain-rope/ckpt.pt", "export": "exports/pretrain-rope.gguf",
            "architecture": "gptneox", "match": False, "first_difference": 7, "held_out_tokens_match": False,
            "sweep": [cell(256, "none", plain, 2.125, -2e-5, 4e-3, 3e-6), cell(256, "yarn", plain, 2.125, 0, 0, 0),
                      cell(512, "linear", {**plain, "type": "linear", "factor": 2.0}, 2.5, 3e-5, 5e-3, 1e-6)],
            "not_in_llama_cpp": []}
    return {"machine": MACHINE, "llama_cpp": "llama-cpp-python 0.3.16 (llama.cpp built from source by pip install "
            "llama-cpp-python)", "contexts": [256, 512], "methods": ["none", "linear"], "linear_factor": None,
            "sweep_tokens": 16384, "models": [learned, rope]}


def test_llama_cpp_tables_from_export_check_json(tmp_path):
    (tmp_path / "llama_cpp.json").write_text(json.dumps(llama_cpp_json()))
    tables = report.build(tmp_path)[0]
    page = tables["llama-cpp"]
    assert page.startswith("From `results/llama_cpp.json` (made by `python scripts/export_check.py --gguf --ctx "
                           "256 512 --json results/llama_cpp.json`)") and f"Machine: {MACHINE}\n" in page
    assert "llama.cpp: llama-cpp-python 0.3.16 (llama.cpp built from source" in page
    rows = rows_of(page)
    assert rows[1:3] == [["`pretrain`", "`gpt2`", "200 tokens, the same", "50,000 tokens, the same"],
                         ["`pretrain-rope`", "`gptneox`", "200 tokens, differs at token 7", "50,000 tokens, different"]]
    assert ["256", "none", "2.25000", "2.25001", "2.25001", "3.0e-03", "2.0e-06"] in rows
    assert ["512", "linear", "2.50000", "2.50003", "2.50003", "5.0e-03", "1.0e-06"] in rows
    assert "Not in llama.cpp: linear at 256, linear at 512.\n" in page
    assert "rope options, where they differ from plain RoPE's: linear at 512: `type` linear, `factor` 2.\n" in page
    assert page.count("rope options") == 1  # none, yarn as plain RoPE and the learned model's {} are not listed
    assert ("Over these 4 cells, llama.cpp's GELU moves our mean loss by at most 3.0e-05; the largest difference "
            "on one token from llama.cpp is 5.0e-03 with our exact GELU and 3.0e-06 with llama.cpp's.") in page
    perplexity = tables["llama-cpp-perplexity"]
    assert "16,384 tokens a cell" in perplexity
    assert rows_of(perplexity)[1:] == [
        ["`pretrain`", "256", "none", f"{math.exp(2.25):.3f}", f"{math.exp(2.25 + 1e-5 + 1e-6):.3f}"],
        ["`pretrain-rope`", "256", "none", f"{math.exp(2.125):.3f}", f"{math.exp(2.125 - 2e-5 + 1e-6):.3f}"],
        ["`pretrain-rope`", "256", "yarn", f"{math.exp(2.125):.3f}", f"{math.exp(2.125 + 1e-6):.3f}"],
        ["`pretrain-rope`", "512", "linear", f"{math.exp(2.5):.3f}", f"{math.exp(2.5 + 3e-5 + 1e-6):.3f}"]]


def test_warmup_table_gives_held_out_losses_and_the_early_climb():
    runs = [{"command": f"python scripts/pretrain.py --warmup {w}", "warmup": w, "lr": 0.002, "stopped_at": 50,
             "evals": [{"step": 25, "val_loss": 5.5 + w / 100}, {"step": 50, "val_loss": 4.5}],
             "train_loss": [9.0, 7.0, 6.0, 6.5 if w == 20 else 5.9, 7.25 if w == 20 else 5.8, 5.0]}
            for w in (20, 100)]
    d = {"note": "made up", "machine": MACHINE, "runs": runs}
    table = report.warmup({"warmup.json": d})["warmup"]
    assert rows_of(table)[1:3] == [["20", "0.002", "5.700", "4.500", "", "", "", "1.25"],
                                   ["100", "0.002", "6.500", "4.500", "", "", "", "0.00"]]
    assert "- `python scripts/pretrain.py --warmup 100` (stopped at step 50)" in table and MACHINE in table


def test_attention_table_lists_each_kernel_against_flash():
    d = {"command": "python dev/attention_kernels.py", "machine": MACHINE, "shape": [16, 6, 256, 64], "rounds": 7,
         "rows": [{"kernel": "sdpa (flash), bf16", "ms": 30.0, "relative": 1.0},
                  {"kernel": "sdpa (math), bf16", "ms": 60.25, "relative": 2.0083}]}
    table = report.attention({"attention.json": d})["attention"]
    assert rows_of(table)[1:] == [["sdpa (flash), bf16", "30.0", "1.00"], ["sdpa (math), bf16", "60.2", "2.01"]]
    assert "16 x 6 x 256 x 64" in table and "`python dev/attention_kernels.py`" in table


def test_linear_products_table_gives_each_product_beside_the_square():
    rows = [{"layer": "square", "product": "2048 x 2048 product", "ms": 14.0, "tflops": 1.25, "over_square": 1.0},
            {"layer": "MLP up", "product": "weight's gradient, dY^T x", "ms": 5.75, "tflops": 0.84,
             "over_square": 0.672},
            {"layer": "MLP up", "product": "the copy making dY^T contiguous", "ms": 16.5, "tflops": None,
             "over_square": None}]
    d = {"command": "python dev/linear_products.py", "machine": MACHINE, "rows_per_step": 4096, "rounds": 15,
         "rows": rows, "step_ms": 314.2, "step_ms_at_square_rate": 286.6}
    table = report.linear_products("linear_products.json", "linear-products")({"linear_products.json": d})[
        "linear-products"]
    assert rows_of(table)[1:] == [["square", "2048 x 2048 product", "14.00", "1.25", "1.00"],
                                  ["MLP up", "weight's gradient, dY^T x", "5.75", "0.84", "0.67"],
                                  ["MLP up", "the copy making dY^T contiguous", "16.50", "", ""]]
    assert "at these speeds: 314 ms; all at the square product's rate: 287 ms" in table
    assert "4,096 rows" in table and "median of 15 rounds" in table
    other = report.linear_products("amd-epyc/linear_products.json", "linear-products-amd-epyc")
    table = other({"amd-epyc/linear_products.json": d})["linear-products-amd-epyc"]  # another machine's, by name
    assert table.startswith("From `results/amd-epyc/linear_products.json` (made by `python dev/linear_products.py`)")


def test_provenance_commands_are_ones_a_learner_can_type():
    typed = report.typed
    assert typed("python dev/precision_parity.py --json /tmp/final/precision.json --out-dir /tmp/parity-c "
                 "--data-dir /work/run/data", "warmup100/precision.json") == \
        "python dev/precision_parity.py --json results/warmup100/precision.json --out-dir checkpoints/precision"
    assert typed("python scripts/pretrain.py --rope --data-dir data --runs-dir runs --out-dir checkpoints/x "
                 "--json results/pretrain-rope.json", "schedule/pretrain-rope.json") == \
        "python scripts/pretrain.py --rope --out-dir checkpoints/x --json results/schedule/pretrain-rope.json"
    assert typed("python scripts/prepare.py --json results/data.json --source ../shared/data/tinystories",
                 "data.json") == "python scripts/prepare.py --json results/data.json --source DIR"
    assert typed("python scripts/finetune.py --prompt 'a b' -- --warmup 200", "x.json") == \
        "python scripts/finetune.py --prompt 'a b' -- --warmup 200"  # quoting and the rest kept as they were
    tables, _ = report.build(ROOT / "results")  # and no committed table shows a scratch path
    assert not [n for n, t in tables.items() if re.search(r"/tmp/|/work/|/root/|shared/data", t)]


def test_readme_blocks_show_the_lines_the_scripts_print(data_dir, tmp_path, capsys):
    """Each README block's lines are made from a JSON; here the scripts write that JSON from a tiny run, and
    what the block makes of it must be what they printed."""
    import context
    import evaluate
    import pretrain

    tiny = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16", "--batch-size", "2",
            "--eval-batches", "1", "--eval-every", "2", "--warmup", "1", "--minutes", "0", "--max-steps", "2",
            "--device", "cpu", "--data-dir", str(data_dir), "--runs-dir", str(tmp_path / "runs")]
    for name, kind in (("pretrain", []), ("pretrain-rope", ["--rope"])):
        pretrain.main([*tiny, *kind, "--out-dir", str(tmp_path / name), "--json", str(tmp_path / f"{name}.json")])
        printed = capsys.readouterr().out.splitlines()
        assert report.pretrain_printed(json.loads((tmp_path / f"{name}.json").read_text())) in printed
    both = [str(tmp_path / "pretrain"), str(tmp_path / "pretrain-rope")]
    for dtype in ("float32", "auto"):
        evaluate.main([*both, "--device", "cpu", "--data-dir", str(data_dir), "--dtype", dtype,
                       "--json", str(tmp_path / "e.json")])
        printed = capsys.readouterr().out
        assert report.evaluate_printed(json.loads((tmp_path / "e.json").read_text())) + "\n" in printed
    context.main([*both, "--device", "cpu", "--length", "40", "--streams", "1", "--data-dir", str(data_dir),
                  "--json", str(tmp_path / "c.json")])
    printed = capsys.readouterr().out
    assert report.context_printed(json.loads((tmp_path / "c.json").read_text())) + "\n" in printed


def test_readme_blocks_name_their_files_machines_and_the_data(results):
    (results / "data.json").write_text(json.dumps(
        {"vocab_size": 512, "train": {"stories": 10, "tokens": 2_048_000}, "held_out": {"stories": 2, "tokens": 9}}))
    amd = "AMD EPYC (AVX512), 2 threads of 2 cores, torch x, cpu"
    typed = {**pretrain_json("rope", 600, 0.5), "machine": amd}  # the episode's commands typed after a main job
    typed["args"]["out_dir"] = "checkpoints/pretrain-rope-2"
    episode = {"amd-epyc/episode/pretrain-rope.json": typed,
               "amd-epyc/episode/evaluate.json": {**evaluate_json(), "machine": amd, "seconds": 150.0},
               "amd-epyc/episode/context.json": {**context_json(), "machine": amd, "seconds": 600.0},
               "amd-epyc/main-job-default/main-job.json": {"machine": amd, "steps": 825, "planned_s": 2586.0,
                                                           "took_s": 2256.0, "stages": []},
               "amd-epyc/main-job-default/pretrain-rope.json": {**pretrain_json("rope", 825, 0.4), "machine": amd}}
    episode["amd-epyc/episode/evaluate.json"]["rows"].append({**evaluate_json()["rows"][1], "model": "lora-rope"})
    episode["amd-epyc/episode/context.json"]["rows"].append({**context_json()["rows"][2], "model": "lora-rope"})
    for name, d in episode.items():
        (results / name).parent.mkdir(parents=True, exist_ok=True)
        (results / name).write_text(json.dumps(d))
    r = report.load_all(results)
    assert set(r) >= {"ten-minutes/pretrain-rope.json", "episode.json", "data.json"}
    expect = report.readme_expect(r)
    assert "Our runs read 2.0M training tokens (10 stories), a small part of TinyStories.\n" in expect
    typed = [r[name] for name in report.TYPED_RUNS if name in r]  # the spread of the runs as typed, in one line
    losses, speeds = sorted(d["val_loss"] for d in typed), sorted(d["tokens_per_s"] for d in typed)
    assert len(typed) == 2 and (f"Over the 2 such runs we committed, the loss ran from {losses[0]:.2f} to "
                                f"{losses[1]:.2f}, as the host's speed that day ran from {speeds[0]:,.0f} to "
                                f"{speeds[1]:,.0f} tokens/s") in expect
    assert "ours saw 2.7M (Intel Xeon) and 2.5M (AMD EPYC)." in expect  # 650 and 600 steps of 4,096 tokens
    assert "The first row is `pretrain.py --rope` as typed; the rest, the main job's rope model (`--max-steps 1178` " \
        "on the Intel; 825 steps, as the job chose, on the AMD)." in expect
    rows = {row[0]: row[1:] for row in rows_of(expect)}
    assert rows["figure"] == ["the video (at)", *report.EXPECT_MACHINES]
    assert rows["held-out loss after ten minutes, rope (as typed)"] == ["about 2.18 (9:40)", "2.25", "2.50"]
    assert all(not f.get("readme") or f["what"] in rows for f in r["episode.json"]["figures"])
    block = report.readme_pretrain(r)
    assert block.startswith("```bash\npython scripts/pretrain.py --rope\n```") and \
        "-> checkpoints/pretrain-rope-2\n" in block and "on a 2-core AMD EPYC (AVX512)" in block
    assert f"over the whole run, with evaluations and compiling, it is {600 * 4096 / 600.5:,.0f}." in block
    evaluated, measured = report.readme_evaluate(r), report.readme_context(r)
    assert "It took 2.5 minutes for all 3 models." in evaluated and "It took 10.0 minutes in all." in measured
    assert "main job's two (825 steps each)" in evaluated and "\nlora-rope " not in evaluated  # the README's rows only
    assert "\nlora-rope " not in measured and "\n(rows of 1 more model cut here)\n" in measured
    assert "\n(rows of 1 more model cut here)\n```" in evaluated
    assert report.context_seconds(r["context.json"]) == pytest.approx(sum(ms * 64 * 2 for ms in (8.0, 12.0, 2.0, 0.5))
                                                                     / 1000)  # no seconds recorded: from ms/token
    said = report.readme_main(r)
    assert said.startswith("As typed (offline, with `--source DIR`), on a 2-core AMD EPYC (AVX512), it chose 825 steps "
                           "a model, planned 43 minutes and took 38 (`results/amd-epyc/main-job-default/")
    assert said.endswith("a model trained for 10 minutes on the Made-up CPU.")  # 600.5 s both: one figure
    results_rows = rows_of(report.readme_results(r))
    assert results_rows[0][4:7] == ["tokens/s, median step", "tokens / wall time", "held-out loss (evaluate.py)"]
    assert results_rows[1] == ["learned positions", "1,250", f"{1250 * 4096:,}", "10.0", f"{1250 * 4096 / 600.5:,.0f}",
                               f"{1250 * 4096 / 600.5:,.0f}", "2.2500", f"{math.exp(2.25):.1f}"]
    assert report.where({"machine": "Intel(R) Xeon(R) Processor (AVX512), 2 threads of 2 cores, torch x, cpu"}) == \
        "a 2-core Intel Xeon (AVX512)"
    readme = "a\n<!-- report.py: expect -->\nold\n<!-- report.py: end -->\nb\n"
    (results / "data.json").unlink()
    assert report.readme_block(readme, results) == (
        "a\n<!-- report.py: expect -->\nNot measured yet (`results/data.json`): run the main job, then "
        "`python dev/report.py`.\n<!-- report.py: end -->\nb\n")


def test_stories_table_marks_where_each_story_passes_the_window():
    d = {"command": "python dev/stories.py checkpoints/pretrain --json results/stories.json", "machine": MACHINE,
         "prompt": "Once upon a time", "tokens": 400, "temperature": 0.8, "top_k": 50, "seed": 1337,
         "rows": [{"model": "pretrain", "kind": "learned", "window": 256, "before_window": ", Tom *ran*.",
                   "past_window": " The end.<|endoftext|>Lily\nsaw a cat.", "tokens": 400, "tokens_past_window": 148,
                   "ms_per_token": 30.25}]}
    text = report.stories({"stories.json": d})["stories"]
    assert text.startswith("From `results/stories.json` (made by `python dev/stories.py checkpoints/pretrain "
                           "--json results/stories.json`)")
    assert "`pretrain` (learned positions, 30.2 ms a token on the machine above):\n\n" \
           "> Once upon a time, Tom \\*ran\\*. **[token 256: the window ends here]** The end. *(end of story)* " \
           "Lily\n> saw a cat.\n" in text


def test_decode_table_sets_each_step_beside_llama_cpp_and_its_floor():
    rows = [{"name": "mvGPT C step, float32", "threads": 1, "engine": "mvGPT", "step": "C step",
             "weights": "float32", "kv": "float32", "ms": 2.25, "cpu_ms": 2.0, "floor_ms": 1.5, "over_floor": 1.5,
             "build_s": 6.4, "over_llama_cpp": 1.125},
            {"name": "llama.cpp, f32", "threads": 1, "engine": "llama.cpp", "step": "llama_decode", "weights": "f32",
             "kv": "f32", "ms": 2.0, "cpu_ms": 1.9, "floor_ms": 1.5, "over_floor": 4 / 3},
            {"name": "mvGPT re-run window, float32", "threads": 1, "engine": "mvGPT", "step": "re-run window",
             "weights": "float32", "ms": 30.0, "compute_floor_ms": 20.0, "over_floor": 1.5}]
    d = {"command": "python dev/decode_vs_llama.py", "machine": MACHINE, "weights": "random (seed 0)", "held": 255,
         "rounds": 16, "steps": 8, "llama_cpp": "0.3.36", "ceilings": {"read_bandwidth": 40e9}, "rows": rows,
         "note": "a busy host", "profiles": {"1": {"mvGPT eager, float32": {"matrix products": 1.9, "attention": 0.1}}}}
    table = report.decode({"amd-epyc/decode.json": d})["decode"]
    assert rows_of(table)[:4] == [
        ["threads", "engine", "step", "weights", "ms/token", "CPU ms/token", "floor ms", "× floor", "× llama.cpp"],
        ["1", "mvGPT", "C step (6.4 s to build)", "float32, KV float32", "2.25", "2.00", "1.50", "1.50×", "1.12×"],
        ["1", "llama.cpp", "llama_decode", "f32, KV f32", "2.00", "1.90", "1.50", "1.33×", "–"],
        ["1", "mvGPT", "re-run window", "float32", "30.00", "–", "20.00", "1.50×", "–"]]
    assert rows_of(table)[-2:] == [["matrix products", "1.900"], ["attention", "0.100"]]
    assert table.startswith("From `results/amd-epyc/decode.json` (made by `python dev/decode_vs_llama.py`)")
    assert "at 40.0 GB/s" in table and "Note: a busy host" in table and "llama-cpp-python 0.3.36" in table
    assert "× llama.cpp: against the faster of llama.cpp's two rows at the same bytes per weight" in table
    assert "Not measured yet" in report.decode({})["decode"]


def test_decode_parts_table_sets_the_calls_parts_beside_their_floors():
    parts = [{"part": "the blocks (their products, norms, GELU; 2 held)", "ms": 0.9, "bytes": 42_000_000,
              "floor_ms": 0.84, "over_floor": 0.9 / 0.84},
             {"part": "attention over 253 more held", "ms": 0.15, "bytes": 4_700_000, "floor_ms": 0.094,
              "over_floor": 0.15 / 0.094}]
    d = {"command": "python dev/decode_parts.py", "machine": MACHINE, "threads": 2, "held": 255, "rounds": 40,
         "calls": 16, "read_bandwidth": 50e9,
         "rows": [{"dtype": "float32", "whole_ms": 1.3, "call_ms": 1.05, "around_ms": 0.25, "parts": parts,
                   "products_alone": {"part": "every product alone, each in a parallel region of its own", "ms": 0.8,
                                      "bytes": 42_000_000, "floor_ms": 0.84, "over_floor": 0.8 / 0.84}}]}
    table = report.decode_parts({"amd-epyc/decode-parts.json": d})["decode-parts"]
    assert rows_of(table) == [
        ["weights", "what", "ms/token", "floor ms", "× floor"],
        ["float32", "the whole step", "1.300", "0.934", "1.39×"],
        ["float32", "around the call (Python: the angles, room in the cache, the arguments)", "0.250", "", ""],
        ["float32", "the C call", "1.050", "0.934", "1.12×"],
        ["float32", "– the blocks (their products, norms, GELU; 2 held)", "0.900", "0.840", "1.07×"],
        ["float32", "– attention over 253 more held", "0.150", "0.094", "1.60×"],
        ["float32", "for comparison: every product alone, each in a parallel region of its own", "0.800", "0.840",
         "0.95×"]]
    assert table.startswith("From `results/amd-epyc/decode-parts.json` (made by `python dev/decode_parts.py`)")
    assert "2 threads, 255 held; 40 turns of 16 steps each, each step timed after a read" in table
    assert "at 50.0 GB/s" in table
    assert "Not measured yet" in report.decode_parts({})["decode-parts"]


def test_the_plan_check_sets_each_left_line_beside_what_the_rest_took(results):
    job = {"command": "python scripts/main.py --source DIR", "machine": "Made-up CPU", "steps": 300,
           "planned_s": 1500.0, "took_s": 1560.0, "stages": [
               {"stage": "pretrain (learned)", "planned_s": 600.0, "took_s": 660.0, "other_cores": 0.0,
                "left_s": 990.0},
               {"stage": "evaluate", "planned_s": 600.0, "took_s": 870.0, "other_cores": 0.0, "left_s": 40.0},
               {"stage": "report", "planned_s": 30.0, "took_s": 30.0, "other_cores": 0.0, "left_s": 0.0}]}
    (results / "amd-epyc" / "plan-check").mkdir(parents=True)
    (results / "amd-epyc" / "plan-check" / "main-job.json").write_text(json.dumps(job))
    text = report.build(results)[0]["plan-check"]
    assert "300 steps a model; planned 25.0 min, took 26.0." in text
    assert rows_of(text)[1:] == [  # 990 s said after the first stage, against the 900 the rest took: +10%
        ["pretrain (learned)", "10.0", "11.0", "1.10", "16.5", "15.0", "+10%"],
        ["evaluate", "10.0", "14.5", "1.45", "0.7", "0.5", "–"],  # under a minute left: not a share
        ["report", "0.5", "0.5", "1.00", "0.0", "0.0", "–"]]
    (results / "amd-epyc" / "plan-check" / "main-job.json").unlink()
    assert report.build(results)[0]["plan-check"].startswith('!!! note "Not measured yet"')
