"""The C one-token step against its call alone, and its parts against their floors, without a profiler.

mvgpt/perf/fast_decode.py's FastDecode runs Python around its C call at every token: the angles of the
position, room in the cache (`reserve`), the arguments' addresses, the logits' tensor, `advance`.
Here the whole step (`fast(token, cache)`, the cache sliding to keep 255 held, as generate does past
the window) and the C call alone (the same call's arguments, run again and again) take turns,
`--rounds` times each, and the medians are compared. The difference is what runs around the call.
Each step is timed alone, after a read of other data larger than the caches: it reads its weights
from memory, as a token does after the last one's weights pushed the first ones out of the cache.

Inside the call, the parts that read memory, each against the time to read its bytes at the memory's
read bandwidth (its floor), found by taking parts away: the same call with 2 held instead of 255
(the difference: attention over the other 253 keys and values), and the output layer's product run
alone (the rest of the 2-held call: the blocks, their products and all else). Beside them, every
product of the step alone, each in a parallel region of its own: what the products take when
nothing runs between them.

Examples:
    python dev/decode_parts.py --json results/amd-epyc/decode-parts.json      # about twenty seconds
    python dev/decode_parts.py --n-layer 2 --n-head 2 --n-embd 64 --block-size 32 --vocab-size 300 --rounds 3 \
        --bandwidth-mbytes 8
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from collections.abc import Callable

import torch

from mvgpt.device import cpu_bf16_native, dtype_name, machine
from mvgpt.kit.errors import ArgumentParser, at_least, run_main
from mvgpt.kit.io import write_json
from mvgpt.kit.runfolder import writable_file
from mvgpt.model import GPT, GPTConfig, KVCache
from mvgpt.perf.fast_decode import DTYPES, FastDecode, address, step_weights
from mvgpt.perf.measure import memory_bandwidth


def ms_per_call(fn: Callable[[], object], calls: int, other: torch.Tensor) -> float:
    """ms per call of fn, each call timed alone after reading `other`: whatever fn reads comes from memory,
    not from a cache its last call filled (the output layer alone fits a 32 MB last-level cache)."""
    total = 0.0
    for _ in range(calls):
        other.sum()
        t0 = time.perf_counter()
        fn()
        total += time.perf_counter() - t0
    return total / calls * 1e3


def filled_cache(model: GPT, held: int) -> KVCache:
    """A cache holding `held` tokens of a random prompt, as generate leaves it."""
    cache = KVCache(model.config, 1, 2 * model.config.block_size, torch.device("cpu"), model.wte.weight.dtype)
    model(torch.randint(0, model.config.vocab_size, (1, held)), cache=cache)
    return cache


@torch.no_grad()
def measure(config: GPTConfig, dtype: torch.dtype, rounds: int, calls: int, bandwidth: float,
            other_mbytes: int) -> dict:
    """The whole C step and its call alone, in turns, for a rope model: the median ms of each, and the
    difference; with the call at 2 held and the output layer alone in the same turns, the call's parts."""
    torch.manual_seed(0)
    model = GPT(config).eval().to(dtype)
    fast = FastDecode(model)  # the episode's own modules: one it covers
    held = config.block_size - 1
    cache = filled_cache(model, held)
    token = torch.tensor([[1]])

    def whole() -> None:  # as generate past the window: one token written, the oldest dropped
        fast(token, cache)
        cache.slide(held)

    call = fast.prepare(token, filled_cache(model, held))  # the same call, run again and again: it writes the
    call_2_held = fast.prepare(token, filled_cache(model, 2))  # row after those held, and does not advance
    threads = torch.get_num_threads()
    pairs = [pair for w in step_weights(model)[1] for pair in (w.qkv, w.proj, w.fc, w.mlp_proj)]
    pairs.append((model.lm_head.weight, None))
    products = [product_alone(fast, weight, bias, threads) for weight, bias in pairs]

    fns = {"whole": whole, "call": call.run, "call_2_held": call_2_held.run, "output_layer": products[-1],
           "products_alone": lambda: [product() for product in products]}
    times = {name: [] for name in fns}
    other = torch.ones(other_mbytes * 2**20 // 4)
    for fn in fns.values():  # once unmeasured
        ms_per_call(fn, calls, other)
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(ms_per_call(fn, calls, other))
    ms = {name: statistics.median(t) for name, t in times.items()}
    return {"dtype": dtype_name(dtype), "whole_ms": ms["whole"], "call_ms": ms["call"],
            "around_ms": ms["whole"] - ms["call"], "around_share": (ms["whole"] - ms["call"]) / ms["whole"],
            "build_s": fast.build_s, "call_2_held_ms": ms["call_2_held"], "output_layer_ms": ms["output_layer"],
            "parts": call_parts(model, held, ms, bandwidth),
            "products_alone": against_floor("every product alone, each in a parallel region of its own",
                                            ms["products_alone"], sum(t.numel() * t.element_size() for pair in pairs
                                                                      for t in pair if t is not None), bandwidth)}


def product_alone(fast: FastDecode, weight: torch.Tensor, bias: torch.Tensor | None, threads: int) -> Callable:
    """One of the step's products as one_token.c computes it, in a call of its own (its `matvec`), on an
    input of its own: x (1, in) float32 -> (1, out) in the weights' dtype."""
    out_features, in_features = weight.shape
    x, y = torch.randn(1, in_features), torch.empty(1, out_features, dtype=weight.dtype)
    scratch = torch.empty(threads * in_features)
    args = (x.data_ptr(), 1, weight.data_ptr(), address(bias), out_features, in_features, DTYPES[weight.dtype],
            y.data_ptr(), scratch.data_ptr(), threads)

    def run() -> None:
        fast.lib.matvec(*args)

    run.keep = (x, y, scratch)  # the tensors args points into, alive as long as run is
    return run


def against_floor(part: str, ms: float, nbytes: int, bandwidth: float) -> dict:
    """A part's ms beside the time to read its bytes at `bandwidth` (its floor)."""
    floor = nbytes / bandwidth * 1e3
    return {"part": part, "ms": ms, "bytes": nbytes, "floor_ms": floor, "over_floor": ms / floor}


def call_parts(model: GPT, held: int, ms: dict[str, float], bandwidth: float) -> list[dict]:
    """The call's parts that read memory, by difference: ms, the bytes they read, and the time to read
    those at `bandwidth` (the floor)."""
    config, element = model.config, model.wte.weight.element_size()
    head_bytes = model.lm_head.weight.numel() * element
    block_bytes = sum(p.numel() for p in model.blocks.parameters()) * element
    kv_bytes = 2 * config.n_layer * (held - 2) * config.n_embd * element  # the held keys and values past 2
    parts = [("the blocks (their products, norms, GELU; 2 held)", ms["call_2_held"] - ms["output_layer"],
              block_bytes),
             (f"attention over {held - 2} more held", ms["call"] - ms["call_2_held"], kv_bytes),
             ("the output layer's product", ms["output_layer"], head_bytes)]
    return [against_floor(name, t, n, bandwidth) for name, t, n in parts]


def main(argv: list[str] | None = None) -> dict:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=at_least(1), default=40, help="turns of each (default 40)")
    p.add_argument("--calls", type=at_least(1), default=16, help="steps per turn (default 16)")
    p.add_argument("--n-layer", type=at_least(1), default=6)
    p.add_argument("--n-head", type=at_least(1), default=6)
    p.add_argument("--n-embd", type=at_least(2), default=384)
    p.add_argument("--block-size", type=at_least(4), default=256)
    p.add_argument("--vocab-size", type=at_least(2), default=8192)
    p.add_argument("--bandwidth-mbytes", type=at_least(1), default=512,
                   help="the buffer the read bandwidth is measured on (default 512: larger than any cache)")
    p.add_argument("--json", type=writable_file, help="also write the figures here")
    args = p.parse_args(argv)

    config = GPTConfig(vocab_size=args.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                       n_head=args.n_head, n_embd=args.n_embd, rope=True)
    dtypes = [torch.float32] + ([torch.bfloat16] if cpu_bf16_native() else [])
    bandwidth = memory_bandwidth("cpu", args.bandwidth_mbytes)["read"]
    rows = [measure(config, dtype, args.rounds, args.calls, bandwidth, args.bandwidth_mbytes // 8)
            for dtype in dtypes]
    print(f"{'weights':<10} {'whole step':>11} {'call alone':>12} {'around it':>10}")
    for r in rows:
        print(f"{r['dtype']:<10} {r['whole_ms']:>8.3f} ms {r['call_ms']:>9.3f} ms {r['around_ms']:>7.3f} ms "
              f"({r['around_share']:.0%})")
    print(f"\nthe call's parts, against reading their bytes at {bandwidth / 1e9:.1f} GB/s:")
    for r in rows:
        for part in [*r["parts"], r["products_alone"]]:
            print(f"{r['dtype']:<10} {part['part']:<50} {part['ms']:>7.3f} ms  floor {part['floor_ms']:.3f} ms  "
                  f"{part['over_floor']:.2f}x")
    result = {"command": shlex.join(["python", "dev/decode_parts.py", *(sys.argv[1:] if argv is None else argv)]),
              "machine": machine(torch.device("cpu")), "threads": torch.get_num_threads(),
              "held": args.block_size - 1, "rounds": args.rounds, "calls": args.calls, "read_bandwidth": bandwidth,
              "rows": rows}
    print(f"measured on {result['machine']}, from memory, {args.rounds} turns of {args.calls} steps each, the medians")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    run_main(main)
