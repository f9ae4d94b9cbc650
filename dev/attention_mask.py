"""Attention's causal mask made once per shape (mvgpt/cpu_attention.causal_mask, as training runs
now) against the mask built inside the step from indices (as until commit d75c448): the bf16
training step of each kind with each, compiled and eager, timed side by side (one step of each in
turn, `--rounds` rounds, the median of each). Compiled, the mask built in the step kept inductor
from fusing attention's softmax into one pass. Also the bench's matrix-product peak measured ten
times in a row both ways: the median of three products (bench.py until commit 55dcc25) and the
fastest of ten (now). docs/performance.md and docs/pretraining.md quote it.

    python dev/attention_mask.py --json results/attention_mask.json   # a few minutes on 2 cores
    python dev/attention_mask.py --n-layer 1 --n-head 2 --n-embd 32 --block-size 16 --vocab-size 64 \\
        --batch-size 2 --rounds 2 --peak-n 64 --no-compile                     # tiny, seconds
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time

import torch
from workshop import script

from mvgpt.device import machine
from mvgpt.kit.io import write_json
from mvgpt.model import CausalSelfAttention, GPTConfig
from mvgpt.perf.cpu_attention import _BatchedCausalAttention
from mvgpt.perf.measure import matmul_flops, time_it, tune_malloc

bench = script("bench")  # scripts/bench.py (dev/workshop.py)


class _MaskBuiltInTheStep(_BatchedCausalAttention):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: None) -> torch.Tensor:
        T = q.shape[2]  # the mask from indices, here, in every step
        future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
        built = torch.zeros(T, T, dtype=q.dtype, device=q.device).masked_fill(future, float("-inf"))
        return _BatchedCausalAttention.forward(ctx, q, k, v, built)


def attention_mask_in_the_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """batched_causal_attention in bf16 (the autocast dtype), with the mask built inside the step."""
    with torch.autocast(q.device.type, enabled=False):
        return _MaskBuiltInTheStep.apply(q.bfloat16(), k.bfloat16(), v.bfloat16(), None)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, default in (("--n-layer", 6), ("--n-head", 6), ("--n-embd", 384), ("--block-size", 256),
                          ("--vocab-size", 8192), ("--batch-size", 16), ("--rounds", 10), ("--peak-n", 2048)):
        p.add_argument(flag, type=int, default=default)
    p.add_argument("--no-compile", action="store_true", help="the eager steps only")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    cpu = torch.device("cpu")
    tune_malloc()  # as pretrain.py trains

    # the training steps: for each kind (and compiled or not), the mask made once beside it built in the step
    variants, fns = [], []
    for rope in (False, True):
        config = GPTConfig(vocab_size=args.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                           n_head=args.n_head, n_embd=args.n_embd, rope=rope)
        x, y = (bench.random_tokens((args.batch_size, args.block_size), args.vocab_size, cpu, seed=s) for s in (1, 2))
        for compiled in (False,) if args.no_compile else (True, False):
            for mask in ("made once", "built in the step"):
                model = bench.make_model(config, cpu, train=True)
                if mask == "built in the step":
                    for module in model.modules():
                        if isinstance(module, CausalSelfAttention):
                            module.attend = attention_mask_in_the_step
                fn = bench.train_step(model, x, y, cpu, torch.bfloat16, compiled, batched_attention=mask == "made once")
                variants.append({"kind": "rope" if rope else "learned", "compiled": compiled, "mask": mask,
                                 "losses": [fn() for _ in range(3)]})  # the first steps (and the compiling)
                fns.append(fn)
    times = [[] for _ in fns]
    for _ in range(args.rounds):
        for fn, t in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            fn()
            t.append(time.perf_counter() - t0)
    for v, t in zip(variants, times, strict=True):
        v["step_ms"] = 1000 * statistics.median(t)
    pairs = [{"kind": once["kind"], "compiled": once["compiled"], "made_once_over_built": built["step_ms"]
              / once["step_ms"], "same_losses": once["losses"] == built["losses"]}
             for once, built in zip(variants[::2], variants[1::2], strict=True)]

    # the peak, ten calls in a row each way
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(args.peak_n, args.peak_n, generator=g).bfloat16() for _ in range(2))
    flops = 2 * args.peak_n**3
    median_of_three = [flops / time_it(lambda: a @ b, cpu, 3, warmup=2) for _ in range(10)]
    best_of_ten = [matmul_flops(cpu, args.peak_n, torch.bfloat16) for _ in range(10)]

    result = {"machine": machine(cpu), "rounds": args.rounds,
              "command": shlex.join(["python", "dev/attention_mask.py", *(sys.argv[1:] if argv is None else argv)]),
              "steps": variants, "pairs": pairs, "peak_n": args.peak_n,
              "peak_median_of_three": median_of_three, "peak_best_of_ten": best_of_ten}
    for v in variants:
        print(f"{v['kind']:8s} {'compiled' if v['compiled'] else 'eager':9s} mask {v['mask']:18s} "
              f"{v['step_ms']:8.1f} ms")
    for q in pairs:
        print(f"{q['kind']:8s} {'compiled' if q['compiled'] else 'eager':9s} made once: "
              f"{q['made_once_over_built']:.3f}x as fast, the same first losses: {q['same_losses']}")
    for name, values in (("median of three", median_of_three), ("fastest of ten", best_of_ten)):
        print(f"bf16 peak, {name}, ten calls: {min(values) / 1e9:,.0f} to {max(values) / 1e9:,.0f} GFLOP/s")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
