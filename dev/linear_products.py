"""The training step's matrix products, one by one, beside the product bench.py takes its peak from.

Every linear layer's three products at the training shape (16 x 256 = 4096 rows), in bf16 as a
bf16 step runs them: the forward product (x W^T), the input's gradient (dY W) and the weight's
gradient (dY^T x, whose rows run over all 4096 tokens). Beside them, the 2048 x 2048 product that
bench.py calls the peak, and the weight's gradient once more from a contiguous copy of dY^T (the
copy timed on its own), for what the transposed operand costs. All timed side by side: one call of
each in turn, `--rounds` rounds, the median of each. docs/performance.md quotes the table.

    python dev/linear_products.py --json results/linear_products.json   # about a minute on 2 cores
    python dev/linear_products.py --rows 64 --width 32 --vocab 64 --rounds 3   # tiny, seconds
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from collections.abc import Callable

import torch

from mvgpt.device import machine
from mvgpt.kit.io import write_json
from mvgpt.perf.measure import tune_malloc


def layers(width: int, vocab: int, n_layer: int) -> list[tuple[str, int, int, int]]:
    """(name, inputs, outputs, how many in the model) of each linear layer."""
    return [("attention qkv", width, 3 * width, n_layer), ("attention out", width, width, n_layer),
            ("MLP up", width, 4 * width, n_layer), ("MLP down", 4 * width, width, n_layer),
            ("output layer", width, vocab, 1)]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=16 * 256, help="tokens in a step (batch x window)")
    p.add_argument("--width", type=int, default=384)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--square", type=int, default=2048, help="the size of the square product (bench.py's peak)")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--json", help="write the table here")
    args = p.parse_args(argv)

    tune_malloc()  # as pretrain.py runs: freed buffers stay in the process
    g = torch.Generator().manual_seed(0)
    bf16 = torch.bfloat16

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g).to(bf16)

    a, b = randn(args.square, args.square), randn(args.square, args.square)
    calls: dict[tuple[str, str], tuple[Callable[[], object], float]] = {
        ("square", f"{args.square} x {args.square} product"): (lambda: a @ b, 2.0 * args.square ** 3)}
    model_layers = layers(args.width, args.vocab, args.n_layer)
    for name, n_in, n_out, _ in model_layers:
        x, w, dy = randn(args.rows, n_in), randn(n_out, n_in), randn(args.rows, n_out)
        dy_t = dy.t().contiguous()
        flops = 2.0 * args.rows * n_in * n_out
        calls |= {(name, "forward, x W^T"): (lambda x=x, w=w: x @ w.t(), flops),
                  (name, "input's gradient, dY W"): (lambda dy=dy, w=w: dy @ w, flops),
                  (name, "weight's gradient, dY^T x"): (lambda dy=dy, x=x: dy.t() @ x, flops),
                  (name, "weight's gradient from a contiguous dY^T"): (lambda dy_t=dy_t, x=x: dy_t @ x, flops),
                  (name, "the copy making dY^T contiguous"): (lambda dy=dy: dy.t().contiguous(), 0.0)}
    times: dict[tuple[str, str], list[float]] = {key: [] for key in calls}
    for fn, _ in calls.values():
        fn()  # warm-up: the library picks and builds its kernel on the first call
    for _ in range(args.rounds):
        for key, (fn, _) in calls.items():
            t0 = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t0)

    seconds = {key: statistics.median(t) for key, t in times.items()}
    square_key = next(iter(calls))
    square = calls[square_key][1] / seconds[square_key]  # FLOP/s of the square product, timed among the rest
    rows = [{"layer": layer, "product": product, "ms": 1000 * seconds[(layer, product)],
             "tflops": flops / seconds[(layer, product)] / 1e12 if flops else None,
             "over_square": flops / seconds[(layer, product)] / square if flops else None}
            for (layer, product), (_, flops) in calls.items()]
    count = {name: n for name, _, _, n in model_layers}
    step_products = ("forward, x W^T", "input's gradient, dY W", "weight's gradient, dY^T x")
    step = [(count[r["layer"]] * r["ms"], count[r["layer"]] * calls[(r["layer"], r["product"])][1])
            for r in rows if r["product"] in step_products]
    step_ms, step_flops = sum(ms for ms, _ in step), sum(f for _, f in step)
    result = {"machine": machine(torch.device("cpu")), "rows_per_step": args.rows, "rounds": args.rounds,
              "command": shlex.join(["python", "dev/linear_products.py", *(sys.argv[1:] if argv is None else argv)]),
              "square_flops": square, "rows": rows, "step_ms": step_ms,
              "step_ms_at_square_rate": 1000 * step_flops / square}
    print(f"the linear layers' products at {args.rows} rows, bf16, median of {args.rounds}; {result['machine']}")
    for r in rows:
        rate = "" if r["tflops"] is None else f"{r['tflops']:6.2f} TFLOP/s  {r['over_square']:5.2f}x the square's"
        print(f"  {r['layer']:14s} {r['product']:42s} {r['ms']:8.2f} ms  {rate}")
    print(f"one step's products at these speeds: {step_ms:.0f} ms; at the square's rate: "
          f"{result['step_ms_at_square_rate']:.0f} ms")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
