"""dev/decode_parts.py on a tiny shape: the whole C step and its call alone, each dtype the CPU multiplies
natively, what runs around the call as their difference, and the call's parts against their floors."""

import json

import decode_parts
import pytest
import torch
from conftest import tiny_model

from mvgpt.device import cpu_bf16_native
from mvgpt.perf.fast_decode import FastDecode


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("decode_parts") / "parts.json"
    decode_parts.main(["--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--block-size", "16", "--vocab-size",
                       "300", "--rounds", "2", "--calls", "2", "--bandwidth-mbytes", "8", "--json", str(out)])
    return json.loads(out.read_text())


def test_the_step_and_its_call_alone_give_what_runs_around_it(measured):
    d = measured
    assert [r["dtype"] for r in d["rows"]] == ["float32", *(["bfloat16"] if cpu_bf16_native() else [])]
    assert d["held"] == 15 and d["rounds"] == 2 and d["command"].startswith("python dev/decode_parts.py --n-layer 2")
    for r in d["rows"]:
        assert r["whole_ms"] > 0 and r["call_ms"] > 0 and r["build_s"] >= 0
        assert r["around_ms"] == pytest.approx(r["whole_ms"] - r["call_ms"])
        assert r["around_share"] == pytest.approx(r["around_ms"] / r["whole_ms"])


def test_the_calls_parts_add_up_to_it_and_count_their_bytes(measured):
    """The parts by difference sum to the call; each part's bytes are its own tensors' (tiny shape: 2 blocks
    of 32 channels, 300 tokens, 15 held), its floor those bytes at the measured bandwidth."""
    d = measured
    C, L = 32, 2
    block = L * (2 * 2 * C + C * 3 * C + 3 * C + C * C + C + C * 4 * C + 4 * C + 4 * C * C + C)  # norms, products
    for r in d["rows"]:
        element = 4 if r["dtype"] == "float32" else 2
        parts = {p["part"]: p for p in r["parts"]}
        assert list(parts) == ["the blocks (their products, norms, GELU; 2 held)", "attention over 13 more held",
                               "the output layer's product"]
        assert sum(p["ms"] for p in r["parts"]) == pytest.approx(r["call_ms"])
        assert parts["the output layer's product"]["ms"] == r["output_layer_ms"]
        assert parts["attention over 13 more held"]["ms"] == pytest.approx(r["call_ms"] - r["call_2_held_ms"])
        assert [p["bytes"] for p in r["parts"]] == [block * element, 2 * L * 13 * C * element, 300 * C * element]
        products = L * (C * 3 * C + 3 * C + C * C + C + C * 4 * C + 4 * C + 4 * C * C + C) + 300 * C  # and biases
        assert r["products_alone"]["part"] == "every product alone, each in a parallel region of its own"
        assert r["products_alone"]["bytes"] == products * element and r["products_alone"]["ms"] > 0
        for p in [*r["parts"], r["products_alone"]]:
            assert p["floor_ms"] == pytest.approx(p["bytes"] / d["read_bandwidth"] * 1e3)
            assert p["over_floor"] == pytest.approx(p["ms"] / p["floor_ms"])


def test_a_product_alone_computes_what_the_step_does():
    """decode_parts times one_token.c's `matvec`: its output is F.linear's (float32)."""
    model = tiny_model(rope=True)
    fast = FastDecode(model)
    fc = model.blocks[0].mlp.fc
    run = decode_parts.product_alone(fast, fc.weight, fc.bias, threads=2)
    x, y, _ = run.keep
    run()
    torch.testing.assert_close(y, torch.nn.functional.linear(x, fc.weight, fc.bias), atol=1e-5, rtol=0)
