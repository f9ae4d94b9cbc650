"""dev/decode_vs_llama.py on a tiny shape: every engine writes its tokens in turn, each figure stands
against its floor, ours against llama.cpp's best at the same bytes per weight (where llama.cpp is
installed), and the C step's logits against the eager one's. It runs in a process of its own: llama.cpp's
library, once loaded, stays."""

import json

import pytest
import torch
from test_fast_decode import run

from mvgpt.device import cpu_bf16_native
from mvgpt.export.gguf import llama_cpp_missing


def test_a_tiny_race_writes_every_row_against_its_floor(tmp_path):
    out = tmp_path / "decode.json"
    run(f"import sys; sys.path.insert(0, 'dev'); import decode_vs_llama; decode_vs_llama.main(['--n-layer', '2', "
        f"'--n-head', '2', '--n-embd', '32', '--block-size', '16', '--vocab-size', '300', '--rounds', '2', "
        f"'--steps', '2', '--quick', '--threads', '1', '--json', {str(out)!r}])")
    d = json.loads(out.read_text())
    dtypes = ["float32", *(["bfloat16"] if cpu_bf16_native() else [])]
    llama = [] if llama_cpp_missing() else ["llama.cpp, {kv}", "llama.cpp, {kv}, flash attention"]
    expected = [name.format(dtype=dtype, kv="f32" if dtype == "float32" else "f16") for dtype in dtypes
                for name in ("mvGPT eager, {dtype}", "mvGPT C step, {dtype}", *llama)]
    expected += [f"mvGPT re-run window, {dtype}" for dtype in dtypes]
    rows = {r["name"]: r for r in d["rows"]}
    assert list(rows) == expected and d["held"] == 15
    for r in d["rows"]:
        assert r["threads"] == 1 and len(r.get("ms_rounds", [0, 0])) == 2 and r["ms"] > 0 and r.get("cpu_ms", 1) > 0
        floor = r.get("floor_ms", r.get("compute_floor_ms"))
        assert r["over_floor"] == pytest.approx(r["ms"] / floor)
    assert rows["mvGPT C step, float32"]["build_s"] > 0 and rows["mvGPT eager, float32"]["build_s"] is None
    # every weight once (blocks: 12 C^2 in products, 9 C of biases, 4 C of norms; the embedding, tied; the last
    # norm), and the keys and values of the 16 tokens attended, in both blocks: float32, 4 bytes each
    C, L, V, T = 32, 2, 300, 16
    assert rows["mvGPT eager, float32"]["floor_bytes"] == 4 * (L * (12 * C * C + 9 * C + 4 * C) + V * C + 2 * C
                                                               + 2 * L * T * C)
    if llama:
        best = min((r for r in d["rows"] if r["engine"] == "llama.cpp" and r["weights"] == "f32"),
                   key=lambda r: r["ms"])
        assert rows["mvGPT C step, float32"]["over_llama_cpp"] == pytest.approx(
            rows["mvGPT C step, float32"]["ms"] / best["ms"])
        assert all(us > 0 for us in d["checks"]["1"]["llama_cpp_python_us"].values())
    assert d["checks"]["1"]["max_abs_logit_diff"]["float32"] < 1e-4
    assert set(d["profiles"]["1"]) == {f"mvGPT {step}, {dtype}" for dtype in dtypes for step in ("eager", "C step")}
    assert "matrix products" in d["profiles"]["1"]["mvGPT eager, float32"]  # the C step's are in none of the parts
    assert "matrix products" not in d["profiles"]["1"]["mvGPT C step, float32"]
    assert torch.__version__ == d["torch"] and d["command"].startswith("python dev/decode_vs_llama.py --n-layer 2")
