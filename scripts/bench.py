"""Measure mvGPT's speed against the machine's own limits, all in one run.

Each figure stands next to a ceiling measured in the same run, minutes apart on the same machine,
so what is compared is a ratio, not two numbers from different days:
- the ceilings: float32 and bfloat16 matrix-product FLOP/s, memory bandwidth;
- training tokens/s, learned positions and rope, at the default batch (16 x 256) with fused
  AdamW (float32 on a CPU, bf16 autocast on CUDA, as pretrain.py trains), the FLOP/s that makes
  (mvgpt.bench.training_flops_per_token says what is counted) and its share of the
  matrix-product peak; once with glibc's malloc as it is, then tuned (mvgpt.bench.tune_malloc);
- decoding at batch 1, ms/token: the sliding cache (rope, a full window held: slide, then one
  token), the window re-run for each token (learned positions: 256 tokens, last-place logits),
  and the floor: the bytes a cached step must read (weights, keys and values) at the measured
  bandwidth, or its flops at the matrix-product peak if that takes longer;
- generation with the cache at batch 1, 8, 32, tokens/s, against the same floor;
- with --compile, the cached step through torch.compile (mvgpt.bench.compile_for_decoding): its
  compile time, its speed, and after how many tokens it pays for itself;
- torch.profiler tables of one cached decoding step and one training step: what bounds each.

Examples:
    python scripts/bench.py --json results/bench.json     # the full benchmark: a few minutes on a CPU
    python scripts/bench.py --compile --json results/bench.json    # and the compiled decoding step
    python scripts/bench.py --quick                        # fewer steps, smaller ceilings: a minute
    python scripts/bench.py --quick --n-layer 2 --n-embd 64 --n-head 2 --block-size 32 \\
        --vocab-size 256 --batch-size 4 --batches 1,2 --json /tmp/bench.json   # a tiny CPU run, seconds
    python scripts/plot_bench.py results/bench.json        # its table and plot for docs/performance.md
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mvgpt.bench import (  # noqa: E402
    compile_for_decoding,
    decode_bytes_per_token,
    decode_flops_per_token,
    forward_flops,
    machine,
    matmul_flops,
    memory_bandwidth,
    profile_table,
    summary_rows,
    sync,
    time_it,
    training_flops_per_token,
    tune_malloc,
)
from mvgpt.device import pick_device  # noqa: E402
from mvgpt.io import write_json  # noqa: E402
from mvgpt.model import GPT, GPTConfig, KVCache  # noqa: E402

T = TypeVar("T")
GOALS = {"cached_over_floor": 1.5, "rerun_over_cached": 20.0, "training_share_of_peak": 0.8}


def make_model(config: GPTConfig, device: torch.device, train: bool = False) -> GPT:
    torch.manual_seed(0)  # the same weights every run: speed does not depend on them, but be sure
    return GPT(config).to(device).train(train)


def random_tokens(shape: tuple[int, ...], vocab_size: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab_size, shape, generator=torch.Generator().manual_seed(seed)).to(device)


def train_step(model: GPT, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> Callable[[], float]:
    """One step as pretrain.py takes it: forward, backward, clip, fused AdamW, loss to the host."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-4,  # small: the weights stay sane however many steps are timed
        betas=(0.9, 0.95),
        fused=device.type in ("cpu", "cuda"),
    )
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()

    def step() -> float:
        with autocast:
            _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss.item()

    return step


def bench_training(
    config: GPTConfig, device: torch.device, batch_size: int, steps: int, peak: float, profile: bool = True
) -> dict:
    model = make_model(config, device, train=True)
    x = random_tokens((batch_size, config.block_size), config.vocab_size, device, seed=1)
    y = random_tokens((batch_size, config.block_size), config.vocab_size, device, seed=2)
    step = train_step(model, x, y, device)
    seconds = time_it(step, device, repeats=steps, warmup=2)  # warm-up: the allocator, AdamW's state
    tokens_per_s = batch_size * config.block_size / seconds
    flops = training_flops_per_token(config) * tokens_per_s
    return {
        "kind": "rope" if config.rope else "learned",
        "batch": [batch_size, config.block_size],
        "step_s": seconds,
        "tokens_per_s": tokens_per_s,
        "flops_per_token": training_flops_per_token(config),
        "flops": flops,
        "share_of_peak": flops / peak,
        "profile": profile_table(step, device) if profile else "",
    }


def generate_seconds_per_token(
    model: GPT, prompt: torch.Tensor, use_cache: bool, tokens: int, repeats: int
) -> float:
    """Median time of a new token once generation is under way (after the prompt is read).

    The prompt fills the window, so with rope every step slides the cache (slide, then one token)
    and without the cache every step re-runs the whole window.
    """
    total = 1 + tokens * (repeats + 1)
    steps = model.generate(prompt, total, temperature=0, use_cache=use_cache)
    next(steps)  # the prompt read, and the first token
    seconds = time_it(lambda: [next(steps) for _ in range(tokens)], prompt.device, repeats, warmup=1)
    steps.close()
    return seconds / tokens


def decode_floor_ms(model: GPT, held: int, batch_size: int, bandwidth: float, peak: float) -> float:
    """The least time a cached step of batch_size sequences can take: reading its bytes at the
    memory's bandwidth, or doing its flops at the matrix-product peak, whichever takes longer
    (at batch 1 the bytes, by far; with many sequences the flops and their keys and values catch up)."""
    reading = decode_bytes_per_token(model, held, batch_size) / bandwidth
    computing = batch_size * decode_flops_per_token(model.config, held) / peak
    return 1e3 * max(reading, computing)


def with_threads(n: int, fn: Callable[[], T]) -> T:
    """Run fn with n threads for torch's CPU ops, then put the setting back."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


def bench_compiled_decoding(model: GPT, device: torch.device, tokens: int, repeats: int) -> dict:
    """Generation at batch 1 with the cached step through torch.compile (compile_for_decoding):
    its compile time, its speed against the eager model's measured side by side, after how many
    tokens it pays for itself, and how far its logits are from the eager model's on the same
    tokens (float rounding; tests/test_bench.py checks it)."""
    window = model.config.block_size
    prompt = random_tokens((1, window), model.config.vocab_size, device, seed=5)
    t0 = time.perf_counter()
    fast = compile_for_decoding(model)
    for _ in fast.generate(prompt, 3, temperature=0):  # and a prompt's graph, as generate reads one
        pass
    sync(device)
    compile_s = time.perf_counter() - t0
    eager, compiled = [], []
    for _ in range(2):  # side by side, twice: the better of each, as the machine's load comes and goes
        eager.append(1e3 * generate_seconds_per_token(model, prompt, True, tokens, repeats))
        compiled.append(1e3 * generate_seconds_per_token(fast, prompt, True, tokens, repeats))
    eager_ms, ms = min(eager), min(compiled)
    saved = eager_ms - ms
    with torch.no_grad():  # the same tokens through both, each with its own cache
        stream = random_tokens((1, 8), model.config.vocab_size, device, seed=4)
        caches = [KVCache(model.config, 1, device=device) for _ in range(2)]
        diff = 0.0
        for m, cache in zip((model, fast), caches, strict=True):
            m(prompt, cache=cache)
        for i in range(stream.shape[1]):
            logits = []
            for m, cache in zip((model, fast), caches, strict=True):
                cache.slide(window - 1)
                logits.append(m(stream[:, i : i + 1], cache=cache, last_only=True)[0])
            diff = max(diff, (logits[0] - logits[1]).abs().max().item())

        def compiled_step() -> None:
            caches[1].slide(window - 1)
            fast(stream[:, :1], cache=caches[1], last_only=True)

        profile = profile_table(compiled_step, device)
    return {
        "compile_s": compile_s,
        "ms": ms,
        "eager_ms": eager_ms,
        "speedup": eager_ms / ms,
        "break_even_tokens": compile_s / (saved / 1e3) if saved > 0 else None,
        "max_abs_logit_diff": diff,
        "profile": profile,
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", help="cpu, cuda, mps (default: the best present)")
    p.add_argument("--json", help="also write every figure (and the profiler tables) here")
    p.add_argument("--quick", action="store_true", help="fewer steps and repeats, smaller ceilings")
    p.add_argument("--compile", action="store_true", help="also time the cached step through torch.compile")
    p.add_argument("--threads", type=int, help="torch's CPU threads (default: torch's, one per core)")
    p.add_argument("--no-tune-malloc", action="store_true", help="leave glibc's malloc as it is")
    p.add_argument("--batches", default="1,8,32", help="batch sizes for generation with the cache")
    p.add_argument("--note", default="", help="a line on the conditions, kept with the figures (e.g. a busy machine)")
    p.add_argument("--batch-size", type=int, default=16, help="training batch (sequences of the window)")
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--n-head", type=int, default=6)
    p.add_argument("--n-embd", type=int, default=384)
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--vocab-size", type=int, default=8192)
    args = p.parse_args(argv)

    device = pick_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    quick = args.quick
    shape = dict(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, block_size=args.block_size,
                 vocab_size=args.vocab_size)
    learned, rope = GPTConfig(**shape), GPTConfig(**shape, rope=True)
    window = args.block_size
    batches = [int(b) for b in args.batches.split(",")]
    print(machine(device))
    started = time.perf_counter()

    # the ceilings first
    n = (2048 if quick else 4096) if device.type == "cuda" else (1024 if quick else 2048)
    ceilings = {"matmul_n": n, "bandwidth_mbytes": 128 if quick else 512}
    ceilings["matmul_fp32_flops"] = matmul_flops(device, ceilings["matmul_n"], repeats=3 if quick else 5)
    # bf16 too: training's dtype on CUDA; on a CPU it says whether bf16 would pay (without native
    # bf16 instructions it is many times slower than float32, with them faster)
    ceilings["matmul_bf16_flops"] = matmul_flops(device, n, torch.bfloat16, repeats=3)
    bandwidth = memory_bandwidth(device, ceilings["bandwidth_mbytes"], repeats=3 if quick else 5)
    ceilings["read_bandwidth"], ceilings["copy_bandwidth"] = bandwidth["read"], bandwidth["copy"]
    if device.type == "cpu" and threads > 1:  # one core alone: what a single-threaded kernel could get
        single = with_threads(1, lambda: memory_bandwidth(device, ceilings["bandwidth_mbytes"], 3))
        ceilings["read_bandwidth_1_thread"] = single["read"]
    best_bandwidth = max(v for k, v in ceilings.items() if k.startswith("read_bandwidth"))
    # training runs in bf16 autocast on CUDA (as pretrain.py does), in float32 elsewhere
    ceilings["training_peak"] = "matmul_bf16_flops" if device.type == "cuda" else "matmul_fp32_flops"
    peak = ceilings[ceilings["training_peak"]]
    print(f"ceilings: matmul {ceilings['matmul_fp32_flops'] / 1e9:,.1f} GFLOP/s, "
          f"memory read {ceilings['read_bandwidth'] / 1e9:.1f} GB/s", flush=True)

    # training, both kinds
    steps = 2 if quick else 5
    untuned, malloc_tuned = None, False
    if not args.no_tune_malloc:  # first as glibc's malloc is by default, then tuned (from here on)
        untuned = bench_training(rope, device, args.batch_size, steps, peak, profile=False)
        malloc_tuned = tune_malloc()
    training = [bench_training(config, device, args.batch_size, steps, peak) for config in (learned, rope)]
    for row in training:
        print(f"training {row['kind']}: {row['tokens_per_s']:,.0f} tokens/s, {row['share_of_peak']:.2f} of peak",
              flush=True)

    # decoding at batch 1: the sliding cache (rope), the re-run window (learned), the floor
    tokens, repeats = (4, 3) if quick else (16, 7)
    rope_model, learned_model = make_model(rope, device), make_model(learned, device)
    prompt = random_tokens((1, window), args.vocab_size, device, seed=5)
    cached_by_threads = {}
    for n in sorted({1, threads}) if device.type == "cpu" else [threads]:
        cached_by_threads[n] = 1e3 * with_threads(
            n, lambda: generate_seconds_per_token(rope_model, prompt, True, tokens, repeats))
    best_threads = min(cached_by_threads, key=cached_by_threads.get)
    cached_ms = cached_by_threads[threads]  # the default setting is the headline figure
    rerun_ms = 1e3 * generate_seconds_per_token(learned_model, prompt, False, 1 if quick else 2, 2 if quick else 3)
    floor_bytes = decode_bytes_per_token(rope_model, held=window)
    floor_ms = decode_floor_ms(rope_model, window, 1, best_bandwidth, ceilings["matmul_fp32_flops"])
    rerun_floor_ms = 1e3 * forward_flops(learned, window) / ceilings["matmul_fp32_flops"]
    decoding = {
        "cached_ms": cached_ms,
        "cached_ms_by_threads": {str(n): ms for n, ms in cached_by_threads.items()},
        "best_threads": best_threads,
        "rerun_ms": rerun_ms,
        "floor_ms": floor_ms,
        "floor_bytes": floor_bytes,
        "rerun_compute_floor_ms": rerun_floor_ms,
        "floors_ratio": rerun_floor_ms / floor_ms,  # the most the sliding cache can save, here
        "cached_over_floor": cached_ms / floor_ms,
        "best_cached_over_floor": cached_by_threads[best_threads] / floor_ms,
        "rerun_over_cached": rerun_ms / cached_ms,
    }
    with torch.no_grad():  # one cached step, as generate takes it
        cache = KVCache(rope, 1, device=device)
        rope_model(prompt, cache=cache)
        token = prompt[:, -1:]

        def decode_step() -> None:
            cache.slide(window - 1)
            rope_model(token, cache=cache, last_only=True)

        decoding["profile"] = profile_table(decode_step, device)
    print(f"decoding: cached {cached_ms:.2f} ms/token ({decoding['cached_over_floor']:.2f}x the floor of "
          f"{floor_ms:.2f} ms), re-run window {rerun_ms:.1f} ms/token", flush=True)

    # generation with the cache, several sequences at once
    generation = []
    for B in batches:
        prompts = random_tokens((B, window), args.vocab_size, device, seed=6)
        ms = 1e3 * generate_seconds_per_token(rope_model, prompts, True, max(2, tokens // 2), repeats)
        floor = decode_floor_ms(rope_model, window, B, best_bandwidth, ceilings["matmul_fp32_flops"])
        generation.append({"batch": B, "ms_per_step": ms, "tokens_per_s": 1e3 * B / ms,
                           "floor_tokens_per_s": 1e3 * B / floor, "share_of_floor": floor / ms})
        print(f"generation B={B}: {1e3 * B / ms:,.0f} tokens/s", flush=True)

    result = {
        "machine": machine(device),
        "device": device.type,
        "threads": threads,
        "malloc_tuned": malloc_tuned,
        "torch": torch.__version__,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": quick,
        "note": args.note,
        "command": shlex.join(["python", "scripts/bench.py", *(sys.argv[1:] if argv is None else argv)]),
        "config": shape,
        "ceilings": ceilings,
        "training": training,
        "training_malloc_untuned": untuned if malloc_tuned else None,
        "decoding": decoding,
        "generation": generation,
        "goals": GOALS,
    }
    if args.compile:
        result["compiled_decoding"] = bench_compiled_decoding(rope_model, device, tokens, repeats)
        print(f"compiled decoding: {result['compiled_decoding']['ms']:.2f} ms/token after "
              f"{result['compiled_decoding']['compile_s']:.0f} s of compiling", flush=True)
    result["seconds"] = time.perf_counter() - started

    print()
    rows = summary_rows(result)
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(cell).ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    print(f"\n{result['machine']}; {result['seconds']:.0f} s")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
