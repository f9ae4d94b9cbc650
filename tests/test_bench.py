import json
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
from conftest import ROOT, tiny_config, tiny_model

from mvgpt.perf.flops import (
    decode_bytes_per_token,
    decode_flops_per_token,
    forward_flops,
    matmul_weights,
    training_flops_per_token,
)

TINY = ["--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--block-size", "16", "--vocab-size", "64",
        "--batch-size", "2", "--batches", "1,2", "--device", "cpu", "--no-tune-malloc", "--dtype", "bfloat16"]


def positive_numbers(value, path="result"):
    """Every number in the JSON, with where it is, so a test can say which one is wrong."""
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from positive_numbers(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from positive_numbers(v, f"{path}[{i}]")


def run(*args: str) -> subprocess.CompletedProcess:
    """A script or a check in a process of its own: the bench allocates large buffers and compiling
    loads inductor (hundreds of MB, and global options), which would stay in the test process, and
    a process's peak memory carries over into the processes it starts (tests/test_context.py)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT / "scripts"), str(ROOT)]))
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.extra("docs")  # dev/report.py draws the figures with matplotlib
def test_bench_runs_end_to_end_and_writes_its_figures(tmp_path):
    out = tmp_path / "bench.json"
    printed = run(str(ROOT / "scripts" / "bench.py"), *TINY, "--quick", "--json", str(out)).stdout
    saved = json.loads(out.read_text())
    assert {"machine", "threads", "config", "ceilings", "training", "decoding", "generation", "goals"} <= set(saved)
    assert {"matmul_fp32_flops", "matmul_bf16_flops", "read_bandwidth", "copy_bandwidth"} <= set(saved["ceilings"])
    assert [(t["kind"], t["dtype"]) for t in saved["training"]] == [
        ("learned", "float32"), ("learned", "bfloat16"), ("rope", "float32"), ("rope", "bfloat16")]
    best = max(saved["ceilings"]["matmul_fp32_flops"], saved["ceilings"]["matmul_bf16_flops"])
    assert saved["ceilings"][saved["ceilings"]["training_peak"]] == best
    assert [t["attention"] for t in saved["training"]] == ["sdpa", "batched"] * 2  # bf16 on a CPU: batched
    assert saved["training_batched_attention_speedup"] == {}  # no compiled rows to compare without --compile
    assert saved["training_compiled_over_eager"] == {}
    for t in saved["training"]:
        assert {"tokens_per_s", "flops", "share_of_peak", "profile", "compiled"} <= set(t)
        assert t["flops"] == t["tokens_per_s"] * training_flops_per_token(tiny_config())
        assert t["share_of_peak"] == t["flops"] / best
        own = saved["ceilings"]["matmul_fp32_flops" if t["dtype"] == "float32" else "matmul_bf16_flops"]
        assert t["share_of_dtype_peak"] == t["flops"] / own  # against its own precision's products
    assert saved["training_float32_share_of_fp32_peak"] == {
        t["kind"]: t["share_of_dtype_peak"] for t in saved["training"] if t["dtype"] == "float32"}
    assert saved["skipped"] == [] and saved["estimated_seconds"] > 0  # nothing takes minutes in a tiny model
    speed = {(t["kind"], t["dtype"]): t["tokens_per_s"] for t in saved["training"]}
    assert saved["training_bf16_over_fp32"] == {
        k: speed[k, "bfloat16"] / speed[k, "float32"] for k in ("learned", "rope")}
    assert saved["dtype"] == "bfloat16"  # the flag's choice: this test's tiny run asks for it
    d = saved["decoding"]
    assert {"cached_ms", "rerun_ms", "floor_ms", "floor_bytes", "cached_over_floor", "rerun_over_cached"} <= set(d)
    assert set(d["cached_ms_by_dtype"]) == set(d["floor_ms_by_dtype"]) == {"float32", "bfloat16"}
    assert d["floor_bytes"] == decode_bytes_per_token(tiny_model(rope=True).to(torch.bfloat16), held=16)
    # each floor exactly as defined: its bytes at the best read bandwidth, or its flops at the float32 peak
    bandwidth = max(v for k, v in saved["ceilings"].items() if k.startswith("read_bandwidth"))
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        model = tiny_model(rope=True).to(dtype)
        reading = decode_bytes_per_token(model, 16, 1) / bandwidth
        computing = decode_flops_per_token(model.config, 16) / saved["ceilings"]["matmul_fp32_flops"]
        assert d["floor_ms_by_dtype"][name] == 1e3 * max(reading, computing)
    assert decode_bytes_per_token(tiny_model(rope=True), held=16) > d["floor_bytes"]  # bf16: half the bytes to read
    assert d["cached_over_floor"] == d["cached_ms"] / d["floor_ms"]
    assert d["rerun_over_cached"] == d["rerun_ms"] / d["cached_ms"]
    assert [g["batch"] for g in saved["generation"]] == [1, 2]
    assert "aten::" in d["profile"] and "aten::" in saved["training"][1]["profile"]
    assert saved["training"][0]["profile"] == ""  # profiled in the headline precision only
    for path, number in positive_numbers(saved):
        assert number > 0, path
    assert "decoding, sliding cache (rope, batch 1), bfloat16 weights" in printed and saved["machine"] in printed
    assert "training, rope, bf16 over float32" in printed
    assert "training, rope, float32 (eager) against float32's products" in printed and "plan: about" in printed

    docs = tmp_path / "docs"  # the docs' table, profiles and figure, from this JSON (dev/report.py)
    run(str(ROOT / "dev" / "report.py"), "--results-dir", str(tmp_path), "--docs-dir", str(docs), "--readme", "")
    table = (docs / "results" / "bench.md").read_text()
    typed = saved["command"].replace(str(tmp_path / "bench.json"), "results/bench.json")  # as a learner types it
    assert saved["machine"] in table and f"(made by `{typed}`)" in table
    assert all(f"| training ({t['kind']}, " in table for t in saved["training"])
    assert "```text" in (docs / "results" / "bench-profiles.md").read_text()
    parts = (docs / "results" / "bench-parts.md").read_text()  # the profiled steps (bf16, eager), by part
    assert "| part of the step | learned, bfloat16 | rope, bfloat16 |" in parts
    cells = [f"{p['matrix products'] * 1e3:,.1f} ms ({p['matrix products'] / sum(p.values()):.0%})"
             for p in (saved["training"][1]["profile_parts"], saved["training"][3]["profile_parts"])]
    assert f"| matrix products | {cells[0]} | {cells[1]} |" in parts
    assert (docs / "figures" / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_training_bench_times_the_compiled_bf16_step_with_each_attention_side_by_side(monkeypatch):
    import bench

    from mvgpt.model import causal_attention
    from mvgpt.perf.cpu_attention import batched_causal_attention

    models = []
    monkeypatch.setattr(bench.torch, "compile", lambda model: models.append(model) or model)  # no inductor here
    rows = bench.bench_training(tiny_config(rope=True), torch.device("cpu"), 2, 1, 1e12, torch.bfloat16,
                                compile=True)
    assert [(r["dtype"], r["compiled"], r["attention"]) for r in rows] == [
        ("float32", False, "sdpa"), ("bfloat16", False, "batched"),
        ("bfloat16", True, "sdpa"), ("bfloat16", True, "batched"),  # the step pretrain.py --compile takes
        ("float32", True, "sdpa")]  # and compiled in float32, for what compiling buys there
    # the three steps timed, then the compiled bf16 step once more for its profile, with its kernels named
    assert [m.blocks[0].attn.attend for m in models] == [causal_attention, batched_causal_attention,
                                                         causal_attention, batched_causal_attention]
    assert all(r["tokens_per_s"] == 2 * 16 / r["step_s"] for r in rows)
    # profiled: the headline precision's steps as pretrain.py takes them, not the one kept for the ratio
    assert [bool(r["profile"]) for r in rows] == [False, True, False, True, False]
    assert all(r["profile_parts"]["matrix products"] > 0 for r in rows if r["profile"])
    # where the batched products do not pay (a device without them) no extra row, and the compiled step profiled
    monkeypatch.setattr(bench, "batched_attention_pays", lambda device, dtype: False)
    rows = bench.bench_training(tiny_config(), torch.device("cpu"), 2, 1, 1e12, torch.bfloat16, compile=True)
    assert [(r["dtype"], r["compiled"], r["attention"]) for r in rows] == [
        ("float32", False, "sdpa"), ("bfloat16", False, "sdpa"), ("bfloat16", True, "sdpa"), ("float32", True, "sdpa")]
    assert [bool(r["profile"]) for r in rows] == [False, True, True, False]


def test_a_profiled_steps_parts_add_up_to_its_table_and_are_each_the_median_of_the_profiles(monkeypatch):
    import bench

    x, y = (torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(s)) for s in (1, 2))
    table, parts = bench.profiled_step(tiny_config(), x, y, torch.device("cpu"), torch.bfloat16, False, True,
                                       repeats=1)
    total = sum(parts.values())  # seconds; the profiler writes them as it does (s, ms or us: a busy machine is slow)
    shown = f"{total:.3f}s" if total >= 1 else f"{total * 1e3:.3f}ms" if total >= 1e-3 else f"{total * 1e6:.3f}us"
    assert f"Self CPU time total: {shown}" in table  # one profile: they add up
    assert parts["matrix products"] > 0 and list(parts.values()) == sorted(parts.values(), reverse=True)
    seen = iter([{"matrix products": 3.0, "GELU": 1.0}, {"matrix products": 9.0, "GELU": 2.0},
                 {"matrix products": 4.0, "GELU": 8.0, "norms": 5.0}])  # stalls: step 2's products, step 3's GELU
    monkeypatch.setattr(bench, "time_by_part", lambda events, device: next(seen))
    _, parts = bench.profiled_step(tiny_config(), x, y, torch.device("cpu"), torch.bfloat16, False, True)
    assert parts == {"matrix products": 4.0, "GELU": 2.0, "norms": 0.0}  # a part one profile lacks: 0 there


def test_compiled_over_eager_compares_each_precisions_step_as_pretrain_takes_it():
    import bench

    def row(kind, dtype, compiled, attention, tokens_per_s):
        return {"kind": kind, "dtype": dtype, "compiled": compiled, "attention": attention,
                "tokens_per_s": tokens_per_s}

    training = [row(kind, *r) for kind in ("learned", "rope") for r in [
        ("float32", False, "sdpa", 100.0), ("bfloat16", False, "batched", 200.0),
        ("bfloat16", True, "sdpa", 230.0), ("bfloat16", True, "batched", 250.0), ("float32", True, "sdpa", 104.0)]]
    ratios = bench.compiled_over_eager(training, torch.device("cpu"))  # bf16 on a CPU: batched products
    assert ratios == {kind: {"float32": 1.04, "bfloat16": 1.25} for kind in ("learned", "rope")}


def test_matmul_weights_are_the_linear_layers_weights():
    for rope in (False, True):
        model = tiny_model(rope=rope)
        linear = {id(m.weight): m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear)}
        assert matmul_weights(model.config) == sum(linear.values())  # lm_head's (tied) weight counted once


def test_training_flops_by_hand():
    cfg = tiny_config()  # V 64, T 16, L 2, C 32
    weights = 2 * (32 * 96 + 32 * 32 + 32 * 128 + 128 * 32) + 64 * 32
    attention = 2 * 6 * 32 * (16 + 1)  # 12 C flops per (query, key) pair seen, forward and backward; 8.5 keys a query
    assert training_flops_per_token(cfg) == 6 * weights + attention
    # one cached step over 16 held tokens: 2 flops per weight, 4 C per key and block for attention
    assert decode_flops_per_token(cfg, 16) == 2 * weights + 4 * 2 * 32 * 16
    # a forward pass over a full window with the last place's logits only
    assert forward_flops(cfg, 16) == 2 * 2 * 12 * 32**2 * 16 + 4 * 2 * 32 * 16 * 17 / 2 + 2 * 64 * 32


def test_decoding_floor_is_a_hand_count_of_bytes():
    C, V, L = 32, 64, 2
    block = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C)
    weights = V * C + L * block + 2 * C  # token embedding (= output layer), blocks, final norm
    for batch, held in ((1, 16), (3, 7)):
        kv = 2 * L * batch * held * C  # a key and a value per token, block and sequence
        rope = tiny_model(rope=True)
        assert decode_bytes_per_token(rope, held, batch) == 4 * (weights + kv)
        learned = tiny_model()  # one row of its table of positions, not the whole table
        assert decode_bytes_per_token(learned, held, batch) == 4 * (weights + C + kv)
    half = tiny_model(rope=True).to(torch.bfloat16)
    assert decode_bytes_per_token(half, 16) == 2 * (weights + 2 * L * 16 * C)


def test_the_c_step_gives_the_eager_logits():
    assert run("-c", "import test_bench; test_bench.c_step_gives_the_eager_logits()").returncode == 0


def c_step_gives_the_eager_logits() -> None:
    """bench's C step row: one_token.c's step on a copy of the model, timed beside the eager one, its logits
    within float rounding of the eager step's after sliding (run by the test above, in a process of its
    own), and the model it was given left as it was; a model it does not cover: why, not a row."""
    import bench

    model = tiny_model(rope=True, n_embd=64, n_head=4)
    got = bench.bench_c_step(model, torch.device("cpu"), tokens=4, repeats=1)
    assert got["build_s"] > 0 and got["ms"] > 0 and got["eager_ms"] > 0
    assert got["speedup"] == got["eager_ms"] / got["ms"]
    assert got["max_abs_logit_diff"] <= 1e-5 and "Self CPU time total" in got["profile"]
    assert "decode" not in vars(model)  # the eager model keeps its own step
    why = bench.bench_c_step(model.half(), torch.device("cpu"), tokens=4, repeats=1)
    assert why == "its weights are float16, not float32 or bfloat16"


def test_a_part_that_would_take_too_long_here_is_skipped_in_one_line_and_the_rest_runs(monkeypatch, capsys, tmp_path):
    """bf16 emulated (a CPU without bf16 instructions: ~300 times slower than float32): the probe reports
    it slow, and the bf16 parts are skipped, each in one line with its estimate; float32's all run."""
    import bench

    slow = {"matmul_fp32_flops": 1e12, "matmul_bf16_flops": 1e3, "read_bandwidth": 1e12}
    monkeypatch.setattr(bench, "probe", lambda device: dict(slow))
    result = bench.main([*TINY[:-1], "float32", "--quick", "--json", str(tmp_path / "bench.json")])
    printed = capsys.readouterr().out.splitlines()
    skipped = [line for line in printed if line.startswith("skipped: ")]
    parts = ["bf16 matmul peak", "training in bfloat16", "decoding with bfloat16 weights"]
    assert [line.split(",")[0] for line in skipped] == [f"skipped: {part}" for part in parts]
    assert re.fullmatch(r"skipped: training in bfloat16, about \d+ hours at this machine's bf16 products \(0\.0 "
                        r"GFLOP/s in the probe\), over the 5 min limit \(--limit-minutes\)", skipped[1]), skipped[1]
    assert [s["part"] for s in result["skipped"]] == parts
    estimates = bench.estimate_parts(slow, tiny_config(), tiny_config(rope=True), torch.device("cpu"), 2,
                                     torch.float32, True, False, torch.get_num_threads(), [1, 2], False)
    assert [s["estimated_seconds"] for s in result["skipped"]] == [estimates[part] for part in parts]
    assert all(estimates[part] > 300 for part in parts) and result["estimated_seconds"] == sum(
        s for part, s in estimates.items() if part not in parts)
    assert printed[1].startswith(f"plan: about {bench.minutes(result['estimated_seconds'])} on this machine")
    # the rest ran: float32's training, decoding with float32 weights, the headline's decoding, generation
    assert [(t["kind"], t["dtype"]) for t in result["training"]] == [("learned", "float32"), ("rope", "float32")]
    assert result["ceilings"]["matmul_bf16_flops"] == 1e3 and result["ceilings"]["matmul_bf16_n"] == bench.PROBE_N
    assert result["ceilings"]["training_peak"] == "matmul_fp32_flops"
    assert list(result["decoding"]["cached_ms_by_dtype"]) == ["float32"] and result["decoding"]["rerun_ms"] > 0
    assert [g["batch"] for g in result["generation"]] == [1, 2] and result["training_bf16_over_fp32"] == {}
    assert ("training in bfloat16", "skipped", f"about {bench.minutes(estimates['training in bfloat16'])} here", "",
            "") in bench.summary_rows(result)  # and the summary table says so
    # float32's step against float32's products, whichever peak is the best
    for t in result["training"]:
        assert t["share_of_dtype_peak"] == t["flops"] / result["ceilings"]["matmul_fp32_flops"]
    assert result["training_float32_share_of_fp32_peak"] == {
        t["kind"]: t["share_of_dtype_peak"] for t in result["training"]}
    assert json.loads((tmp_path / "bench.json").read_text())["skipped"] == result["skipped"]


def test_the_plan_says_its_durations_in_seconds_minutes_or_hours():
    import bench

    assert [bench.minutes(s) for s in (42.4, 119.0, 150.0, 7199.0, 5 * 3600.0)] == [
        "42 s", "119 s", "2 min", "120 min", "5 hours"]


def test_only_runs_the_parts_asked_for_and_the_ceilings(capsys):
    """bench.py --only decoding (dev/gpu_check.sh's: a GPU's decoding without its training's compiles)."""
    import bench

    result = bench.main([*TINY, "--quick", "--only", "decoding"])
    assert result["training"] == [] and result["generation"] == [] and result["training_malloc_untuned"] is None
    assert set(result["decoding"]["cached_ms_by_dtype"]) == {"float32", "bfloat16"}
    assert {"matmul_fp32_flops", "matmul_bf16_flops", "read_bandwidth"} <= set(result["ceilings"])
    assert "matmul_bf16_n" not in result["ceilings"]  # measured, not the probe's
    assert result["not_asked"] == ["compiled training in bfloat16", "compiled training in float32", "generation",
                                   "training in bfloat16", "training in float32"]
    assert "not asked (--only): compiled training in bfloat16, compiled training in float32, generation" in (
        capsys.readouterr().out)
    assert not any(row[0].startswith("training") for row in bench.summary_rows(result))
