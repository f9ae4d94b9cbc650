"""The compiled one-token step against its graph alone: what runs around the graph costs, without a profiler.

mvgpt/fast_decode.py's FastDecode runs Python around its compiled graph at every token: the angles of
the position, the cache's bookkeeping (`reserve`, views of the keys and values held, `advance`), the
new token's keys and values written after the graph, and Dynamo checking its guards before it. Here
the whole step (`fast(token, cache)`, the cache sliding to keep 255 held, as generate does past the
window) and the graph alone (`fast.step(...)` on the same inputs again and again) take turns, warm,
`--rounds` times each, and the medians are compared. The difference is what runs around the graph.

The profiler (dev/decode_vs_llama.py's time by part) adds its own cost to every operation it
records, and so overstates the small operations around the graph; this takes none.

Examples:
    python dev/decode_graph.py --json results/amd-epyc/decode-graph.json      # about ten seconds
    python dev/decode_graph.py --n-layer 2 --n-head 2 --n-embd 64 --block-size 32 --vocab-size 300 --rounds 3
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from collections.abc import Callable

import torch

from mvgpt.bench import machine
from mvgpt.errors import ArgumentParser, at_least, run_main, writable_file
from mvgpt.fast_decode import FastDecode
from mvgpt.io import write_json
from mvgpt.model import GPT, GPTConfig, KVCache
from mvgpt.precision import cpu_bf16_native, dtype_name


def ms_per_call(fn: Callable[[], object], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e3


@torch.no_grad()
def measure(config: GPTConfig, dtype: torch.dtype, rounds: int, calls: int) -> dict:
    """The whole compiled step and its graph alone, in turns, for a rope model (the graph gets its angles):
    the median ms of each, and the difference."""
    torch.manual_seed(0)
    model = GPT(config).eval().to(dtype)
    fast = FastDecode(model)  # the episode's own modules: one it covers
    held = config.block_size - 1
    cache = KVCache(config, 1, 2 * config.block_size, torch.device("cpu"), dtype)
    model(torch.randint(0, config.vocab_size, (1, held)), cache=cache)
    token = torch.tensor([[1]])

    def whole() -> None:  # as generate past the window: one token written, the oldest dropped
        fast(token, cache)
        cache.slide(held)

    angles = torch.stack(model.angles(cache.position, 1))
    K = cache.k[:, :, :, cache.offset : cache.offset + held]
    V = cache.v[:, :, :, cache.offset : cache.offset + held]
    torch._dynamo.mark_dynamic(K, 3)
    torch._dynamo.mark_dynamic(V, 3)

    def graph() -> None:  # the same graph on the same inputs: nothing around it but the call
        fast.step(fast.weights, token.reshape(-1), angles, None, K, V)

    times = {"whole": [], "graph": []}
    for fn in (whole, graph):  # warm: the graph for any number held is built by FastDecode already
        ms_per_call(fn, calls)
    for _ in range(rounds):
        times["whole"].append(ms_per_call(whole, calls))
        times["graph"].append(ms_per_call(graph, calls))
    whole_ms, graph_ms = statistics.median(times["whole"]), statistics.median(times["graph"])
    return {"dtype": dtype_name(dtype), "whole_ms": whole_ms, "graph_ms": graph_ms,
            "around_ms": whole_ms - graph_ms, "around_share": (whole_ms - graph_ms) / whole_ms,
            "compile_s": fast.warmup_s}


def main(argv: list[str] | None = None) -> dict:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=at_least(1), default=40, help="turns of each (default 40)")
    p.add_argument("--calls", type=at_least(1), default=16, help="steps per turn (default 16)")
    p.add_argument("--n-layer", type=at_least(1), default=6)
    p.add_argument("--n-head", type=at_least(1), default=6)
    p.add_argument("--n-embd", type=at_least(2), default=384)
    p.add_argument("--block-size", type=at_least(4), default=256)
    p.add_argument("--vocab-size", type=at_least(2), default=8192)
    p.add_argument("--json", type=writable_file, help="also write the figures here")
    args = p.parse_args(argv)

    config = GPTConfig(vocab_size=args.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                       n_head=args.n_head, n_embd=args.n_embd, rope=True)
    dtypes = [torch.float32] + ([torch.bfloat16] if cpu_bf16_native() else [])
    rows = [measure(config, dtype, args.rounds, args.calls) for dtype in dtypes]
    print(f"{'weights':<10} {'whole step':>11} {'graph alone':>12} {'around it':>10}")
    for r in rows:
        print(f"{r['dtype']:<10} {r['whole_ms']:>8.3f} ms {r['graph_ms']:>9.3f} ms {r['around_ms']:>7.3f} ms "
              f"({r['around_share']:.0%})")
    result = {"command": shlex.join(["python", "dev/decode_graph.py", *(sys.argv[1:] if argv is None else argv)]),
              "machine": machine(torch.device("cpu")), "threads": torch.get_num_threads(),
              "held": args.block_size - 1, "rounds": args.rounds, "calls": args.calls, "rows": rows}
    print(f"measured on {result['machine']}, warm, {args.rounds} turns of {args.calls} steps each, the medians")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    run_main(main)
