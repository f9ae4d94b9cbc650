"""Attention's forward + backward at the training shape, in each kernel a bf16 step could use.

One layer of the real model's attention (batch 16, 6 heads of 64, T = 256, causal), forward and
backward, timed side by side: one call of each kernel in turn, `--rounds` rounds, the median of
each, so a busy machine slows them alike. docs/performance.md quotes the table.

    python dev/attention_kernels.py --json results/attention.json      # about a minute on 2 cores
    python dev/attention_kernels.py --batch 2 --seq 32 --rounds 3      # tiny, seconds
"""

from __future__ import annotations

import argparse
import math
import shlex
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from mvgpt.device import machine
from mvgpt.kit.io import write_json
from mvgpt.perf.cpu_attention import batched_causal_attention


def sdpa(q, k, v):  # PyTorch picks: the flash kernel on a CPU
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def sdpa_math(q, k, v):  # the reference kernel: scores materialised, softmax, product
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def sdpa_float32(q, k, v):  # the flash kernel on float32 copies, back to the input's dtype
    return sdpa(q.float(), k.float(), v.float()).to(q.dtype)


def plain(q, k, v, softmax_dtype=torch.float32):  # matmul, softmax, matmul, by hand
    T = q.size(-2)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B, H, T, T)
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return torch.softmax(scores.to(softmax_dtype), dim=-1).to(q.dtype) @ v


KERNELS = {
    "sdpa (flash), bf16": (sdpa, torch.bfloat16),
    "sdpa (math), bf16": (sdpa_math, torch.bfloat16),
    "sdpa (flash) on float32 copies": (sdpa_float32, torch.bfloat16),
    "matmul-softmax-matmul, bf16, softmax float32": (plain, torch.bfloat16),
    "matmul-softmax-matmul, bf16, softmax bf16": (lambda q, k, v: plain(q, k, v, torch.bfloat16), torch.bfloat16),
    "sdpa (flash), float32": (sdpa, torch.float32),
    "batched products (mvgpt/perf/cpu_attention.py), bf16": (batched_causal_attention, torch.bfloat16),
    "batched products (mvgpt/perf/cpu_attention.py), float32": (batched_causal_attention, torch.float32),
}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", help="write the table here")
    args = p.parse_args(argv)

    shape = (args.batch, args.heads, args.seq, args.head_dim)
    g = torch.Generator().manual_seed(0)
    steps, times = {}, {name: [] for name in KERNELS}
    for name, (fn, dtype) in KERNELS.items():
        q, k, v = (torch.randn(shape, generator=g).to(dtype).requires_grad_() for _ in range(3))
        grad = torch.randn(shape, generator=g).to(dtype)
        steps[name] = lambda fn=fn, q=q, k=k, v=v, grad=grad: fn(q, k, v).backward(grad)
        steps[name]()  # warm-up
    for _ in range(args.rounds):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t0)
    baseline = statistics.median(times["sdpa (flash), bf16"])
    rows = [{"kernel": name, "ms": 1000 * statistics.median(t), "relative": statistics.median(t) / baseline}
            for name, t in times.items()]
    result = {"machine": machine(torch.device("cpu")), "shape": list(shape), "rounds": args.rounds,
              "command": shlex.join(["python", "dev/attention_kernels.py", *(sys.argv[1:] if argv is None else argv)]),
              "rows": rows}
    print(f"attention forward + backward, one layer, {tuple(shape)}, causal; {result['machine']}")
    for r in rows:
        print(f"  {r['kernel']:48s} {r['ms']:8.1f} ms  {r['relative']:5.2f}x the flash bf16 time")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
