"""dev/decode_graph.py on a tiny shape: the whole compiled step and its graph alone, each dtype the CPU
multiplies natively, and what runs around the graph as their difference. It compiles, so it runs in a
process of its own (tests/test_fast_decode.py says why)."""

import json

import pytest
from test_fast_decode import run

from mvgpt.precision import cpu_bf16_native


def test_the_step_and_its_graph_alone_give_what_runs_around_it(tmp_path):
    out = tmp_path / "graph.json"
    run(f"import sys; sys.path.insert(0, 'dev'); import decode_graph; decode_graph.main(['--n-layer', '2', "
        f"'--n-head', '2', '--n-embd', '32', '--block-size', '16', '--vocab-size', '300', '--rounds', '2', "
        f"'--calls', '2', '--json', {str(out)!r}])")
    d = json.loads(out.read_text())
    assert [r["dtype"] for r in d["rows"]] == ["float32", *(["bfloat16"] if cpu_bf16_native() else [])]
    assert d["held"] == 15 and d["rounds"] == 2 and d["command"].startswith("python dev/decode_graph.py --n-layer 2")
    for r in d["rows"]:
        assert r["whole_ms"] > 0 and r["graph_ms"] > 0 and r["compile_s"] > 0
        assert r["around_ms"] == pytest.approx(r["whole_ms"] - r["graph_ms"])
        assert r["around_share"] == pytest.approx(r["around_ms"] / r["whole_ms"])

