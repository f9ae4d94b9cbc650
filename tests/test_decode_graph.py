"""dev/decode_graph.py on a tiny shape: the whole compiled step and its graph alone, each dtype the CPU
multiplies natively, what runs around the graph as their difference, and the graph's parts. It
compiles, so it runs in a process of its own (tests/test_fast_decode.py says why)."""

import json

import pytest
from test_fast_decode import run

from mvgpt.precision import cpu_bf16_native


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("decode_graph") / "graph.json"
    run(f"import sys; sys.path.insert(0, 'dev'); import decode_graph; decode_graph.main(['--n-layer', '2', "
        f"'--n-head', '2', '--n-embd', '32', '--block-size', '16', '--vocab-size', '300', '--rounds', '2', "
        f"'--calls', '2', '--bandwidth-mbytes', '8', '--json', {str(out)!r}])")
    return json.loads(out.read_text())


def test_the_step_and_its_graph_alone_give_what_runs_around_it(measured):
    d = measured
    assert [r["dtype"] for r in d["rows"]] == ["float32", *(["bfloat16"] if cpu_bf16_native() else [])]
    assert d["held"] == 15 and d["rounds"] == 2 and d["command"].startswith("python dev/decode_graph.py --n-layer 2")
    for r in d["rows"]:
        assert r["whole_ms"] > 0 and r["graph_ms"] > 0 and r["compile_s"] > 0
        assert r["around_ms"] == pytest.approx(r["whole_ms"] - r["graph_ms"])
        assert r["around_share"] == pytest.approx(r["around_ms"] / r["whole_ms"])



def test_the_graphs_parts_add_up_to_it_and_count_their_bytes(measured):
    """The parts by difference sum to the graph; each part's bytes are its own tensors' (tiny shape: 2 blocks
    of 32 channels, 300 tokens, 15 held), its floor those bytes at the measured bandwidth."""
    d = measured
    C, L = 32, 2
    block = L * (2 * 2 * C + C * 3 * C + 3 * C + C * C + C + C * 4 * C + 4 * C + 4 * C * C + C)  # norms, products
    for r in d["rows"]:
        element = 4 if r["dtype"] == "float32" else 2
        parts = {p["part"]: p for p in r["parts"]}
        assert list(parts) == ["the blocks (their products, norms, GELU; 2 held)", "attention over 13 more held",
                               "the output layer's product"]
        assert sum(p["ms"] for p in r["parts"]) == pytest.approx(r["graph_ms"])
        assert parts["the output layer's product"]["ms"] == r["output_layer_ms"]
        assert parts["attention over 13 more held"]["ms"] == pytest.approx(r["graph_ms"] - r["graph_2_held_ms"])
        assert [p["bytes"] for p in r["parts"]] == [block * element, 2 * L * 13 * C * element, 300 * C * element]
        products = L * (C * 3 * C + 3 * C + C * C + C + C * 4 * C + 4 * C + 4 * C * C + C) + 300 * C  # and biases
        assert r["products_alone"]["part"] == "every product alone, none waiting for another"
        assert r["products_alone"]["bytes"] == products * element and r["products_alone"]["ms"] > 0
        for p in [*r["parts"], r["products_alone"]]:
            assert p["floor_ms"] == pytest.approx(p["bytes"] / d["read_bandwidth"] * 1e3)
            assert p["over_floor"] == pytest.approx(p["ms"] / p["floor_ms"])
