"""The compiled one-token step against its graph alone: what runs around the graph costs, without a profiler.

mvgpt/fast_decode.py's FastDecode runs Python around its compiled graph at every token: the angles of
the position, the cache's bookkeeping (`reserve`, views of the keys and values held, `advance`), the
new token's keys and values written after the graph, and Dynamo checking its guards before it. Here
the whole step (`fast(token, cache)`, the cache sliding to keep 255 held, as generate does past the
window) and the graph alone (`fast.step(...)` on the same inputs again and again) take turns,
`--rounds` times each, and the medians are compared. The difference is what runs around the graph.
Each step is timed alone, after a read of other data larger than the caches: it reads its weights
from memory, as a token does after the last one's weights pushed the first ones out of the cache.

The profiler (dev/decode_vs_llama.py's time by part) adds its own cost to every operation it
records, and so overstates the small operations around the graph; this takes none.

Inside the graph, the parts that read memory, each against the time to read its bytes at the
memory's read bandwidth (its floor), found by taking parts away: the same graph with 2 held instead
of 255 (the difference: attention over the other 253 keys and values), and the output layer's
product compiled alone (the rest of the 2-held graph: the blocks, their products and all else).
Beside them, every product of the step compiled alone, each on an input of its own: what the
products take when none waits for another and nothing runs between them.

Examples:
    python dev/decode_graph.py --json results/amd-epyc/decode-graph.json      # about twenty seconds
    python dev/decode_graph.py --n-layer 2 --n-head 2 --n-embd 64 --block-size 32 --vocab-size 300 --rounds 3 \
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

from mvgpt.bench import machine
from mvgpt.errors import ArgumentParser, at_least, run_main, writable_file
from mvgpt.fast_decode import INDUCTOR_OPTIONS, FastDecode, matvec
from mvgpt.io import write_json
from mvgpt.model import GPT, GPTConfig, KVCache
from mvgpt.perf import memory_bandwidth
from mvgpt.precision import cpu_bf16_native, dtype_name


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


@torch.no_grad()
def measure(config: GPTConfig, dtype: torch.dtype, rounds: int, calls: int, bandwidth: float,
            other_mbytes: int) -> dict:
    """The whole compiled step and its graph alone, in turns, for a rope model (the graph gets its angles):
    the median ms of each, and the difference; with the graph at 2 held and the output layer alone in
    the same turns, the graph's parts (graph_parts)."""
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

    def graph_2_held() -> None:  # the same graph again (the number held is a symbol of it), attending to 2
        fast.step(fast.weights, token.reshape(-1), angles, None, K[..., :2, :], V[..., :2, :])

    output_layer = torch.compile(matvec, options=INDUCTOR_OPTIONS)  # as one_token's last product
    x = torch.randn(1, config.n_embd)

    def output_layer_alone() -> None:
        output_layer(x, model.lm_head.weight)

    pairs = [pair for w in fast.weights[1] for pair in (w.qkv, w.proj, w.fc, w.mlp_proj)]
    pairs.append((model.lm_head.weight, None))
    inputs = [torch.randn(1, weight.shape[1]) for weight, _ in pairs]
    products = torch.compile(every_product, options=INDUCTOR_OPTIONS)

    def products_alone() -> None:
        products(inputs, pairs)

    fns = {"whole": whole, "graph": graph, "graph_2_held": graph_2_held, "output_layer": output_layer_alone,
           "products_alone": products_alone}
    times = {name: [] for name in fns}
    other = torch.ones(other_mbytes * 2**20 // 4)
    for fn in fns.values():  # once unmeasured: the graph for any number held is built by FastDecode already
        ms_per_call(fn, calls, other)
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(ms_per_call(fn, calls, other))
    ms = {name: statistics.median(t) for name, t in times.items()}
    return {"dtype": dtype_name(dtype), "whole_ms": ms["whole"], "graph_ms": ms["graph"],
            "around_ms": ms["whole"] - ms["graph"], "around_share": (ms["whole"] - ms["graph"]) / ms["whole"],
            "compile_s": fast.warmup_s, "graph_2_held_ms": ms["graph_2_held"], "output_layer_ms": ms["output_layer"],
            "parts": graph_parts(model, held, ms, bandwidth),
            "products_alone": against_floor("every product alone, none waiting for another", ms["products_alone"],
                                            sum(t.numel() * t.element_size() for pair in pairs for t in pair
                                                if t is not None), bandwidth)}


def every_product(inputs: list[torch.Tensor], pairs: list[tuple]) -> list[torch.Tensor]:
    """The step's matrix-vector products, each on an input of its own: none waits for another's output,
    and nothing runs between them (no norm, attention or GELU)."""
    return [matvec(x, weight, bias) for x, (weight, bias) in zip(inputs, pairs, strict=True)]


def against_floor(part: str, ms: float, nbytes: int, bandwidth: float) -> dict:
    """A part's ms beside the time to read its bytes at `bandwidth` (its floor)."""
    floor = nbytes / bandwidth * 1e3
    return {"part": part, "ms": ms, "bytes": nbytes, "floor_ms": floor, "over_floor": ms / floor}


def graph_parts(model: GPT, held: int, ms: dict[str, float], bandwidth: float) -> list[dict]:
    """The graph's parts that read memory, by difference: ms, the bytes they read, and the time to read
    those at `bandwidth` (the floor)."""
    config, element = model.config, model.wte.weight.element_size()
    head_bytes = model.lm_head.weight.numel() * element
    block_bytes = sum(p.numel() for p in model.blocks.parameters()) * element
    kv_bytes = 2 * config.n_layer * (held - 2) * config.n_embd * element  # the held keys and values past 2
    parts = [("the blocks (their products, norms, GELU; 2 held)", ms["graph_2_held"] - ms["output_layer"],
              block_bytes),
             (f"attention over {held - 2} more held", ms["graph"] - ms["graph_2_held"], kv_bytes),
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
    print(f"{'weights':<10} {'whole step':>11} {'graph alone':>12} {'around it':>10}")
    for r in rows:
        print(f"{r['dtype']:<10} {r['whole_ms']:>8.3f} ms {r['graph_ms']:>9.3f} ms {r['around_ms']:>7.3f} ms "
              f"({r['around_share']:.0%})")
    print(f"\nthe graph's parts, against reading their bytes at {bandwidth / 1e9:.1f} GB/s:")
    for r in rows:
        for part in [*r["parts"], r["products_alone"]]:
            print(f"{r['dtype']:<10} {part['part']:<50} {part['ms']:>7.3f} ms  floor {part['floor_ms']:.3f} ms  "
                  f"{part['over_floor']:.2f}x")
    result = {"command": shlex.join(["python", "dev/decode_graph.py", *(sys.argv[1:] if argv is None else argv)]),
              "machine": machine(torch.device("cpu")), "threads": torch.get_num_threads(),
              "held": args.block_size - 1, "rounds": args.rounds, "calls": args.calls, "read_bandwidth": bandwidth,
              "rows": rows}
    print(f"measured on {result['machine']}, from memory, {args.rounds} turns of {args.calls} steps each, the medians")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    run_main(main)
