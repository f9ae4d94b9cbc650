"""dev/linear_products.py on a tiny shape: every layer's products are timed, and the step's total is
the sum of each layer's three products times how many of that layer the model has."""


import linear_products
import pytest


def test_every_layer_has_its_products_and_the_step_adds_them_up(tmp_path):
    out = linear_products.main(["--rows", "64", "--width", "16", "--vocab", "48", "--n-layer", "3", "--square", "32",
                                "--rounds", "2", "--json", str(tmp_path / "lp.json")])
    layers = linear_products.layers(16, 48, 3)
    assert [n for n, *_ in layers] == ["attention qkv", "attention out", "MLP up", "MLP down", "output layer"]
    assert [(n_in, n_out, count) for _, n_in, n_out, count in layers] == [
        (16, 48, 3), (16, 16, 3), (16, 64, 3), (64, 16, 3), (16, 48, 1)]
    rows = {(r["layer"], r["product"]): r for r in out["rows"]}
    assert rows[("square", "32 x 32 product")]["over_square"] == 1.0
    assert len(rows) == 1 + 5 * len(layers)
    three = ("forward, x W^T", "input's gradient, dY W", "weight's gradient, dY^T x")
    assert out["step_ms"] == pytest.approx(sum(count * rows[(name, p)]["ms"] for name, _, _, count in layers
                                               for p in three))
    flops = sum(count * 2 * 64 * n_in * n_out * 3 for _, n_in, n_out, count in layers)
    assert out["step_ms_at_square_rate"] == pytest.approx(1000 * flops / out["square_flops"])
    up = rows[("MLP up", "weight's gradient, dY^T x")]
    assert up["tflops"] == pytest.approx(2 * 64 * 16 * 64 / (up["ms"] / 1000) / 1e12)
    assert rows[("MLP up", "the copy making dY^T contiguous")]["tflops"] is None
    assert (tmp_path / "lp.json").exists()
