"""Measure mvGPT's speed against the machine's own limits, all in one run.

Each figure stands next to a ceiling measured in the same run, minutes apart on the same machine,
so what is compared is a ratio, not two numbers from different days:
- the ceilings: float32 and bfloat16 matrix-product FLOP/s, memory bandwidth;
- training tokens/s, learned positions and rope, at the default batch (16 x 256) with fused AdamW,
  in float32 and in bf16 mixed precision (autocast, as pretrain.py --dtype trains), timed side by
  side, step after step in turn; the FLOP/s that makes (mvgpt.perf.flops.training_flops_per_token says
  what is counted) and its share of the best matrix-product peak the device offers; with
  --compile, the step through torch.compile too, in both precisions, with its compile time and its
  speed-up over the eager step (what mvgpt.perf.compile_pays weighs); and the rope step once with
  glibc's malloc as it is (mvgpt.perf.tune_malloc);
- decoding at batch 1, ms/token, with float32 and with bf16 weights (half the bytes to read): the
  sliding cache (rope, a full window held: slide, then one token), the window re-run for each
  token (learned positions: 256 tokens, last-place logits), and the floor: the bytes a cached
  step must read (weights, keys and values) at the measured bandwidth, or its flops at the
  matrix-product peak if that takes longer;
- generation with the cache at batch 1, 8, 32, tokens/s, against the same floor;
- with --c-step, the one-token step in C (mvgpt/perf/one_token.c, as sample.py and serve.py use it):
  its build time, its speed, and after how many tokens it pays for itself;
- torch.profiler tables of one cached decoding step and one training step: what bounds each; and
  each profiled training step's time by part (matrix products, GELU, the norms, the loss, ...:
  mvgpt.perf.time_by_part), a compiled step compiled again with inductor's loops named for it.

--dtype picks the headline precision (auto: bf16 where the hardware has it): the goal rows, the
profiles and generation use it; training and decoding are measured in both.

How long: a few minutes on a 2-core CPU (with --compile, inductor's cache warm: 124 s on the Intel
Xeon, 207 s on the AMD EPYC, the "seconds" of results/bench.json and results/amd-epyc/bench.json).
It starts with a probe of a second or two (small matrix products in float32 and bf16, memory),
estimates each part's time from it, prints the plan, and skips any part that would take longer than
--limit-minutes (5) on this machine, in one line naming it and its estimate: on a CPU without bf16
instructions, bf16 products are emulated, about 300 times slower than float32, and bf16 training
would take hours there (its square-product peak is then the probe's, n = 256).

Examples:
    python scripts/bench.py --json results/bench.json     # the full benchmark: 2 to 4 minutes on a CPU
    python scripts/bench.py --compile --c-step --json results/bench.json    # and the compiled steps, the C step
    python scripts/bench.py --compile --dtype float32 --json results/bench-float32.json  # float32's rows first
    python scripts/bench.py --device cuda --only decoding    # a GPU's decoding (dev/gpu_check.sh)
    python scripts/bench.py --quick                        # fewer steps, smaller ceilings: a minute
    python scripts/bench.py --quick --n-layer 2 --n-embd 64 --n-head 2 --block-size 32 \\
        --vocab-size 256 --batch-size 4 --batches 1,2 --json /tmp/bench.json   # a tiny CPU run, seconds
"""

from __future__ import annotations

import mvgpt.kit.starting  # noqa: F401  first, before torch loads: Ctrl-C meanwhile is one line

# isort: split
import argparse
import copy
import math
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from datetime import UTC, datetime
from typing import TypeVar

import torch

from mvgpt.device import CHOICES as DTYPE_CHOICES
from mvgpt.device import dtype_name, machine, pick_device, resolve_dtype, sync
from mvgpt.kit.errors import ArgumentParser, positive_float, positive_int, positive_ints, run_main
from mvgpt.kit.io import write_json
from mvgpt.kit.runfolder import writable_file
from mvgpt.model import GPT, GPTConfig, KVCache
from mvgpt.perf.cpu_attention import batched_attention_pays, use_batched_attention
from mvgpt.perf.fast_decode import FastDecode, break_even_tokens
from mvgpt.perf.flops import (
    decode_bytes_per_token,
    decode_flops_per_token,
    forward_flops,
    matmul_weights,
    training_flops_per_token,
)
from mvgpt.perf.measure import (
    kernel_names,
    matmul_flops,
    memory_bandwidth,
    profile,
    profile_table,
    time_by_part,
    time_it,
    tune_malloc,
)
from mvgpt.perf.threads import threads_arg
from mvgpt.train import Step, check_fits_training, configure_optimizer

T = TypeVar("T")
# goals: decoding near its memory floor; the re-run window far behind the cache; training at 0.4 of
# the best matrix-product peak (issue 11: about 11k tokens/s on a 2-core AMX CPU)
GOALS = {"cached_over_floor": 1.5, "rerun_over_cached": 20.0, "training_share_of_peak": 0.4}
PRECISIONS = (torch.float32, torch.bfloat16)


def make_model(config: GPTConfig, device: torch.device, train: bool = False) -> GPT:
    torch.manual_seed(0)  # the same weights every run: speed does not depend on them, but be sure
    return GPT(config).to(device).train(train)


def random_tokens(shape: tuple[int, ...], vocab_size: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab_size, shape, generator=torch.Generator().manual_seed(seed)).to(device)


def train_step(model: GPT, x: torch.Tensor, y: torch.Tensor, device: torch.device, dtype: torch.dtype,
               compile: bool = False, batched_attention: bool | None = None) -> Callable[[], float]:
    """The step pretrain.py takes (mvgpt.train.Step: forward under autocast, backward, clip, fused AdamW),
    with the loss read to the host. Attention's batched products where they pay, as pretrain.py chooses,
    unless `batched_attention` says."""
    optimizer = configure_optimizer(model, lr=1e-4, weight_decay=0.1, device=device)  # small lr: sane weights
    if batched_attention if batched_attention is not None else batched_attention_pays(device, dtype):
        use_batched_attention(model)
    step = Step(model, optimizer, device, dtype, forward=torch.compile(model) if compile else model)
    return lambda: step(x, y)[0].item()


def bench_training(config: GPTConfig, device: torch.device, batch_size: int, steps: int, peak: float,
                   headline: torch.dtype, compile: bool = False, profiled: bool = True,
                   eager: tuple[torch.dtype, ...] = PRECISIONS, compiled: tuple[torch.dtype, ...] = PRECISIONS,
                   peaks: dict[torch.dtype, float] | None = None) -> list[dict]:
    """Training steps of one kind in each precision (`eager`; with `compile`, those in `compiled`
    through torch.compile too), timed side by side: one step of each in turn, `steps` rounds, the
    median of each (the machine's load changes alike). Each row's FLOP/s is set against the best
    peak (`peak`) and, with `peaks`, against its own precision's matmul peak."""
    x = random_tokens((batch_size, config.block_size), config.vocab_size, device, seed=1)
    y = random_tokens((batch_size, config.block_size), config.vocab_size, device, seed=2)
    variants = [(dtype, False, batched_attention_pays(device, dtype)) for dtype in PRECISIONS if dtype in eager]
    if compile and torch.bfloat16 in compiled:
        pays = batched_attention_pays(device, torch.bfloat16)
        if pays:  # the same step with PyTorch's kernel, for the ratio
            variants.append((torch.bfloat16, True, False))
        variants.append((torch.bfloat16, True, pays))
    if compile and torch.float32 in compiled:  # does it pay there?
        variants.append((torch.float32, True, batched_attention_pays(device, torch.float32)))
    steps_fns, first = [], []
    for dtype, compiled, batched in variants:
        fn = train_step(make_model(config, device, train=True), x, y, device, dtype, compiled, batched)
        t0 = time.perf_counter()
        fn()  # the first step: compiling, the allocator, AdamW's state
        sync(device)
        first.append(time.perf_counter() - t0)
        fn()
        steps_fns.append(fn)
    times = [[] for _ in variants]
    for _ in range(steps):
        for fn, t in zip(steps_fns, times, strict=True):
            t.append(time_it(fn, device, repeats=1, warmup=0))
    rows = []
    per_token = training_flops_per_token(config)
    for (dtype, compiled, batched), t, t_first in zip(variants, times, first, strict=True):
        seconds = statistics.median(t)
        tokens_per_s = batch_size * config.block_size / seconds
        row = {"kind": "rope" if config.rope else "learned", "dtype": dtype_name(dtype), "compiled": compiled,
               "attention": "batched" if batched else "sdpa",
               "batch": [batch_size, config.block_size], "step_s": seconds, "tokens_per_s": tokens_per_s,
               "flops_per_token": per_token, "flops": per_token * tokens_per_s,
               "share_of_peak": per_token * tokens_per_s / peak,
               "profile": ""}
        if peaks:  # float32's step against float32's products: how close it runs to what this machine can do
            row["share_of_dtype_peak"] = per_token * tokens_per_s / peaks[dtype]
        if profiled and dtype == headline and batched == batched_attention_pays(device, dtype):
            # profiled as pretrain.py trains: not the step kept for the attention ratio
            row["profile"], row["profile_parts"] = profiled_step(config, x, y, device, dtype, compiled, batched)
        if compiled:
            row["compile_s"] = max(t_first - seconds, 0.0)
        rows.append(row)
    return rows


def profiled_step(config: GPTConfig, x: torch.Tensor, y: torch.Tensor, device: torch.device, dtype: torch.dtype,
                  compiled: bool, batched: bool, repeats: int = 3) -> tuple[str, dict[str, float]]:
    """The profile of a training step as pretrain.py takes it: the table of its top operations, and its
    seconds by part (mvgpt.perf.time_by_part), each part's median over `repeats` profiled steps (one
    step's profile can catch a stall of the machine); the table is the step whose total is the median.
    A compiled step is compiled once more for it, with its kernels named (mvgpt.perf.kernel_names), so
    the table shows what each fused loop costs."""
    with kernel_names() if compiled else nullcontext():
        fn = train_step(make_model(config, device, train=True), x, y, device, dtype, compiled, batched)
        profiles = [profile(fn, device) for _ in range(repeats)]  # the first call, not profiled, compiles it
    by_part = [time_by_part(events, device) for events in profiles]
    parts = {part: statistics.median(p.get(part, 0.0) for p in by_part)
             for part in dict.fromkeys(part for p in by_part for part in p)}
    totals = [sum(p.values()) for p in by_part]
    middle = profiles[totals.index(statistics.median_low(totals))]
    return (profile_table(middle, device, row_limit=25 if compiled else 15),
            dict(sorted(parts.items(), key=lambda kv: -kv[1])))


def attention(device: torch.device, dtype: torch.dtype) -> str:
    """The attention a training step in `dtype` takes on `device`, as pretrain.py chooses it."""
    return "batched" if batched_attention_pays(device, dtype) else "sdpa"


def speed(training: list[dict], kind: str, **match) -> float:
    """The tokens/s of the one training row of `kind` whose fields equal `match`."""
    return next(r["tokens_per_s"] for r in training if r["kind"] == kind and all(r[k] == v for k, v in match.items()))


def has(training: list[dict], kind: str, **match) -> bool:
    """Whether a training row of `kind` has fields equal to `match` (a part the plan skipped has none)."""
    return any(r["kind"] == kind and all(r[k] == v for k, v in match.items()) for r in training)


def compiled_over_eager(training: list[dict], device: torch.device) -> dict[str, dict[str, float]]:
    """{kind: {dtype: compiled tokens/s over eager}}, each precision's step as pretrain.py takes it:
    what mvgpt.perf.compile_pays weighs (the precisions with both rows)."""
    ratios = {}
    for kind in ("learned", "rope"):
        for dtype in PRECISIONS:
            compiled = dict(kind=kind, dtype=dtype_name(dtype), compiled=True, attention=attention(device, dtype))
            if has(training, **compiled) and has(training, kind, dtype=dtype_name(dtype), compiled=False):
                ratios.setdefault(kind, {})[dtype_name(dtype)] = (
                    speed(training, **compiled) / speed(training, kind, dtype=dtype_name(dtype), compiled=False))
    return ratios


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


def bench_c_step(model: GPT, device: torch.device, tokens: int, repeats: int) -> dict | str:
    """Generation at batch 1 with the one-token step in C (mvgpt/perf/one_token.c, on a copy of the model):
    its build time, its speed against the eager step's measured side by side, after how many tokens it
    pays for itself, and how far its logits are from the eager step's on the same tokens (float rounding;
    tests/test_fast_decode.py holds it to a tolerance). Where it does not build or cover the model (a GPU):
    why not, in one line."""
    window = model.config.block_size
    prompt = random_tokens((1, window), model.config.vocab_size, device, seed=5)
    fast = copy.deepcopy(model)
    fast.decode = FastDecode(fast)
    if fast.decode.why_not is not None:
        return fast.decode.why_not
    build_s = fast.decode.build_s
    eager, c_step = [], []
    for _ in range(2):  # side by side, twice: the better of each, as the machine's load comes and goes
        eager.append(1e3 * generate_seconds_per_token(model, prompt, True, tokens, repeats))
        c_step.append(1e3 * generate_seconds_per_token(fast, prompt, True, tokens, repeats))
    eager_ms, ms = min(eager), min(c_step)
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
                logits.append(m.decode(stream[:, i : i + 1], cache))
            diff = max(diff, (logits[0] - logits[1]).abs().max().item())

        def one_c_step() -> None:
            caches[1].slide(window - 1)
            fast.decode(stream[:, :1], caches[1])

        profile_text = profile_table(profile(one_c_step, device), device)
    return {
        "build_s": build_s,
        "ms": ms,
        "eager_ms": eager_ms,
        "speedup": eager_ms / ms,
        "break_even_tokens": break_even_tokens(eager_ms, ms, build_s),
        "max_abs_logit_diff": diff,
        "profile": profile_text,
    }


# ----------------------------------------------------------------------------------------------
# The plan: a quick probe of the machine, each part's time estimated from it, what is skipped

PROBE_N = 256  # the probe's products: a tenth of a second each even where bf16 is emulated (~0.3 GFLOP/s)
LIMIT_MINUTES = 5.0  # a part estimated to take longer than this on this machine is skipped
# A training step's FLOP/s over its precision's probe rate: the step's products are larger than the probe's,
# and a step also norms, softmaxes and updates; a half is within a factor two either way on the CPUs measured
STEP_EFFICIENCY = 0.5
COMPILE_S = 5.0  # compiling a step or a model with inductor's cache warm (a cold cache: a minute or more)
STEP_OVERHEAD_S = 1e-3  # a decoding step's Python and kernel launches, whatever its size


def probe(device: torch.device, seconds: float = 0.5) -> dict[str, float]:
    """Quick rates, a second or two: float32 and bf16 matrix products of PROBE_N (the best of as many as
    fit in `seconds`, 20 at most: on a busy machine a product this short is often caught mid-stall), and
    reading 64 MB."""

    def rate(dtype: torch.dtype) -> float:
        a = torch.randn(PROBE_N, PROBE_N, device=device).to(dtype)
        a @ a  # the library picks its kernel on the first call
        best, until = math.inf, time.perf_counter() + seconds
        for i in range(20):
            best = min(best, time_it(lambda: a @ a, device, repeats=1, warmup=0))
            if i >= 2 and time.perf_counter() > until:
                break
        return 2 * PROBE_N**3 / best

    return {"matmul_fp32_flops": rate(torch.float32), "matmul_bf16_flops": rate(torch.bfloat16),
            "read_bandwidth": memory_bandwidth(device, 64, repeats=2)["read"]}


def ceiling_sizes(device: torch.device, quick: bool) -> tuple[int, int, int]:
    """(n of the square products, repeats, MB of the bandwidth buffer) of measure_ceilings."""
    n = (2048 if quick else 4096) if device.type == "cuda" else (1024 if quick else 2048)
    return n, 3 if quick else 10, 128 if quick else 512


def estimate_parts(rates: dict[str, float], learned: GPTConfig, rope: GPTConfig, device: torch.device,
                   batch_size: int, headline: torch.dtype, quick: bool, compile: bool, threads: int,
                   batches: list[int], malloc: bool, c_step: bool = False) -> dict[str, float]:
    """Seconds each part of the bench will take, from the probe's `rates`: each part's flops at its
    precision's rate (times STEP_EFFICIENCY), a decoding step's bytes at the bandwidth where that is
    longer, COMPILE_S for each compile. An estimate within a factor two or so: enough to say how long,
    and to tell a part of minutes from one of hours (emulated bf16)."""
    window, L, C = rope.block_size, rope.n_layer, rope.n_embd
    steps, (tokens, repeats) = (3 if quick else 7), ((4, 3) if quick else (16, 7))
    n, ceiling_repeats, mbytes = ceiling_sizes(device, quick)
    rate = {torch.float32: rates["matmul_fp32_flops"] * STEP_EFFICIENCY,
            torch.bfloat16: rates["matmul_bf16_flops"] * STEP_EFFICIENCY}
    element = {torch.float32: 4, torch.bfloat16: 2}

    def train_s(config: GPTConfig, dtype: torch.dtype) -> float:
        return batch_size * window * training_flops_per_token(config) / rate[dtype]

    def forward_s(config: GPTConfig, dtype: torch.dtype, rows: int = 1) -> float:
        return rows * forward_flops(config, window) / rate[dtype]

    def decode_s(dtype: torch.dtype, B: int = 1) -> float:
        reading = element[dtype] * (matmul_weights(rope) + 2 * L * B * window * C) / rates["read_bandwidth"]
        return max(reading, B * decode_flops_per_token(rope, window) / rate[dtype]) + STEP_OVERHEAD_S

    def generate_s(dtype: torch.dtype, B: int = 1, n_tokens: int = tokens) -> float:  # generate_seconds_per_token
        return forward_s(rope, dtype, B) + (1 + n_tokens * (repeats + 1)) * decode_s(dtype, B)

    kinds = (learned, rope)
    parts = {f"{name} matmul peak": (ceiling_repeats + 2) * 2 * n**3 / rates[f"matmul_{name}_flops"]
             for name in ("fp32", "bf16")}
    parts["memory bandwidth"] = ((3 if quick else 5) + 2) * 3 * mbytes * 2**20 / rates["read_bandwidth"] * (
        2 if device.type == "cpu" and threads > 1 else 1)
    for dtype in PRECISIONS:
        name = dtype_name(dtype)
        seconds = sum((2 + steps) * train_s(c, dtype) for c in kinds)
        if dtype == headline:  # the profiles (three, each after a step unprofiled), glibc's malloc untuned
            seconds += sum(6 * train_s(c, dtype) for c in kinds) + (3 * train_s(rope, dtype) if malloc else 0.0)
        parts[f"training in {name}"] = seconds
        if compile:
            variants = 2 if dtype == torch.bfloat16 and batched_attention_pays(device, dtype) else 1
            seconds = variants * sum((2 + steps) * train_s(c, dtype) + COMPILE_S for c in kinds)
            if dtype == headline:  # compiled again for its profile, its kernels named
                seconds += sum(COMPILE_S + 6 * train_s(c, dtype) for c in kinds)
            parts[f"compiled training in {name}"] = seconds
        parts[f"decoding with {name} weights"] = generate_s(dtype)
    rerun = 1 + (1 if quick else 2) * ((2 if quick else 3) + 1)  # forwards of the window
    parts["decoding in the headline precision"] = (
        generate_s(headline) * (3 if device.type == "cpu" and threads > 1 else 1)  # one thread: about twice as long
        + rerun * forward_s(learned, headline) + forward_s(rope, headline) + 2 * decode_s(headline))
    parts["generation"] = sum(generate_s(headline, B, max(2, tokens // 2)) for B in batches)
    if c_step:  # its build: a second at most
        parts["decoding with the C step"] = 1.0 + 4 * generate_s(torch.float32) + 8 * decode_s(torch.float32)
    return parts


class Plan:
    """The parts' estimates; those over the limit are skipped, and those `only` leaves out."""

    def __init__(self, estimates: dict[str, float], limit_s: float, rates: dict[str, float],
                 only: tuple[str, ...] = ()) -> None:
        self.estimates, self.limit_s, self.rates = estimates, limit_s, rates
        self.unasked = {name for name in SKIPPABLE  # the ceilings always: every figure is measured against them
                        if only and name != "bf16 matmul peak" and not any(word in name for word in only)}
        self.skipped = {name: s for name, s in estimates.items()
                        if s > limit_s and name in SKIPPABLE and name not in self.unasked}

    def runs(self, part: str) -> bool:
        return part not in self.skipped and part not in self.unasked

    @property
    def seconds(self) -> float:
        return sum(s for name, s in self.estimates.items() if self.runs(name))

    def lines(self) -> list[str]:
        """What the run will take, then one line for each part skipped: its estimate and why."""
        r = self.rates
        said = [f"plan: about {minutes(self.seconds)} on this machine, by a probe of {PROBE_N} x {PROBE_N} products "
                f"(fp32 {r['matmul_fp32_flops'] / 1e9:,.1f} GFLOP/s, bf16 {r['matmul_bf16_flops'] / 1e9:,.1f} "
                f"GFLOP/s) and memory ({r['read_bandwidth'] / 1e9:.1f} GB/s)"]
        if self.unasked:
            said.append(f"not asked (--only): {', '.join(sorted(self.unasked))}")
        for part, seconds in self.skipped.items():
            dtype = "bf16" if "bf16" in part or "bfloat16" in part else "fp32"
            instead = ": the probe's figure stands in" if part == "bf16 matmul peak" else ""
            said.append(f"skipped: {part}, about {minutes(seconds)} at this machine's {dtype} products "
                        f"({r[f'matmul_{dtype}_flops'] / 1e9:,.1f} GFLOP/s in the probe), over the "
                        f"{minutes(self.limit_s)} limit (--limit-minutes){instead}")
        return said


# the parts a plan may skip: the base figures (the fp32 peak, the bandwidth) are always measured
SKIPPABLE = ("bf16 matmul peak", "training in float32", "training in bfloat16", "compiled training in float32",
             "compiled training in bfloat16", "decoding with float32 weights", "decoding with bfloat16 weights",
             "decoding in the headline precision", "generation", "decoding with the C step")


def minutes(seconds: float) -> str:
    """A duration as the plan says it: seconds below two minutes, minutes below two hours, hours after."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.0f} hours"


def measure_ceilings(device: torch.device, quick: bool, threads: int, probed: dict[str, float] | None = None) -> dict:
    """Matrix-product FLOP/s in float32 and bf16, memory bandwidth (and one thread's, on a CPU).
    With `probed` (the probe's rates, where the plan skips the large bf16 product), the probe's bf16
    figure stands in, its size recorded as matmul_bf16_n."""
    n, repeats, mbytes = ceiling_sizes(device, quick)
    c = {"matmul_n": n, "bandwidth_mbytes": mbytes}
    c["matmul_fp32_flops"] = matmul_flops(device, n, repeats=repeats)
    # without native bf16 instructions a CPU's bf16 product is many times slower than float32, with them faster
    if probed is None:
        c["matmul_bf16_flops"] = matmul_flops(device, n, torch.bfloat16, repeats=repeats)
    else:
        c["matmul_bf16_flops"], c["matmul_bf16_n"] = probed["matmul_bf16_flops"], PROBE_N
    bandwidth = memory_bandwidth(device, c["bandwidth_mbytes"], repeats=3 if quick else 5)
    c["read_bandwidth"], c["copy_bandwidth"] = bandwidth["read"], bandwidth["copy"]
    if device.type == "cpu" and threads > 1:  # one core alone: what a single-threaded kernel could get
        single = with_threads(1, lambda: memory_bandwidth(device, c["bandwidth_mbytes"], 3))
        c["read_bandwidth_1_thread"] = single["read"]
    # training is measured against the best peak the device offers, whichever precision gives it
    c["training_peak"] = max(("matmul_fp32_flops", "matmul_bf16_flops"), key=c.get)
    return c


def measure_decoding(rope: GPTConfig, learned: GPTConfig, device: torch.device, ceilings: dict, threads: int,
                     dtype: torch.dtype, tokens: int, repeats: int, quick: bool,
                     precisions: tuple[torch.dtype, ...] = PRECISIONS) -> dict:
    """Batch-1 decoding: the sliding cache (rope) with float32 and bf16 weights (those in `precisions`),
    by thread count; the re-run window (learned); the floors; a profile of one cached step in the
    headline dtype."""
    window = rope.block_size
    best_bandwidth = max(v for k, v in ceilings.items() if k.startswith("read_bandwidth"))
    prompt = random_tokens((1, window), rope.vocab_size, device, seed=5)
    by_dtype = {}
    for d in precisions:  # bf16 weights: half the bytes each step reads
        model = make_model(rope, device).to(d)
        by_dtype[dtype_name(d)] = {
            "cached_ms": 1e3 * generate_seconds_per_token(model, prompt, True, tokens, repeats),
            "floor_ms": decode_floor_ms(model, window, 1, best_bandwidth, ceilings["matmul_fp32_flops"]),
            "floor_bytes": decode_bytes_per_token(model, held=window)}
    rope_model = make_model(rope, device).to(dtype)
    cached_by_threads = {}
    for n in sorted({1, threads}) if device.type == "cpu" else [threads]:
        cached_by_threads[n] = 1e3 * with_threads(
            n, lambda: generate_seconds_per_token(rope_model, prompt, True, tokens, repeats))
    best_threads = min(cached_by_threads, key=cached_by_threads.get)
    cached_ms = cached_by_threads[threads]  # the default setting is the headline figure
    learned_model = make_model(learned, device).to(dtype)
    rerun_ms = 1e3 * generate_seconds_per_token(learned_model, prompt, False, 1 if quick else 2, 2 if quick else 3)
    floor_bytes = decode_bytes_per_token(rope_model, held=window)
    floor_ms = decode_floor_ms(rope_model, window, 1, best_bandwidth, ceilings["matmul_fp32_flops"])
    rerun_floor_ms = 1e3 * forward_flops(learned, window) / ceilings[ceilings["training_peak"]]
    with torch.no_grad():  # one cached step, as generate takes it
        cache = KVCache(rope, 1, device=device, dtype=dtype)
        rope_model(prompt, cache=cache)
        token = prompt[:, -1:]

        def decode_step() -> None:
            cache.slide(window - 1)
            rope_model(token, cache=cache, last_only=True)

        profile_text = profile_table(profile(decode_step, device), device)
    return {
        "dtype": dtype_name(dtype),
        "cached_ms": cached_ms,
        "cached_ms_by_threads": {str(n): ms for n, ms in cached_by_threads.items()},
        "cached_ms_by_dtype": {k: v["cached_ms"] for k, v in by_dtype.items()},
        "floor_ms_by_dtype": {k: v["floor_ms"] for k, v in by_dtype.items()},
        "best_threads": best_threads,
        "rerun_ms": rerun_ms,
        "floor_ms": floor_ms,
        "floor_bytes": floor_bytes,
        "rerun_compute_floor_ms": rerun_floor_ms,
        "floors_ratio": rerun_floor_ms / floor_ms,  # the most the sliding cache can save, here
        "cached_over_floor": cached_ms / floor_ms,
        "best_cached_over_floor": cached_by_threads[best_threads] / floor_ms,
        "rerun_over_cached": rerun_ms / cached_ms,
        "profile": profile_text,
    }


def only_words(text: str) -> tuple[str, ...]:
    """--only's words; an empty one (a trailing comma, an unset variable) would match every part."""
    words = tuple(word.strip() for word in text.split(","))
    if not all(words):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty word: give words separated by commas, e.g. "
                                         "decoding,generation")
    return words


def main(argv: list[str] | None = None) -> dict:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", help="cpu, cuda, mps (default: the best present)")
    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                   help="the headline precision (auto: bf16 where native); training and decoding are timed in both")
    p.add_argument("--json", type=writable_file, help="also write every figure (and the profiler tables) here")
    p.add_argument("--quick", action="store_true", help="fewer steps and repeats, smaller ceilings")
    p.add_argument("--compile", action="store_true", help="also time the training steps through torch.compile")
    p.add_argument("--c-step", action="store_true", help="also time the one-token step in C "
                   "(mvgpt/perf/one_token.c) beside the eager one, and its build")
    p.add_argument("--threads", type=threads_arg, help="torch's CPU threads (default: torch's, one per core)")
    p.add_argument("--no-tune-malloc", action="store_true", help="leave glibc's malloc as it is")
    p.add_argument("--batches", type=positive_ints, default="1,8,32", help="batch sizes for generation with the cache")
    p.add_argument("--note", default="", help="a line on the conditions, kept with the figures (e.g. a busy machine)")
    p.add_argument("--only", type=only_words, default=(),
                   help="only the parts named by these words, e.g. decoding,generation (the ceilings always; "
                        "words: training, float32, bfloat16, decoding, generation, compiled, C step)")
    p.add_argument("--limit-minutes", type=positive_float, default=LIMIT_MINUTES,
                   help="skip any part estimated to take longer than this here (default %(default)g: bf16 where "
                        "it is emulated)")
    p.add_argument("--batch-size", type=positive_int, default=16, help="training batch (sequences of the window)")
    p.add_argument("--n-layer", type=positive_int, default=6)
    p.add_argument("--n-head", type=positive_int, default=6)
    p.add_argument("--n-embd", type=positive_int, default=384)
    p.add_argument("--block-size", type=positive_int, default=256)
    p.add_argument("--vocab-size", type=positive_int, default=8192)
    args = p.parse_args(argv)
    unknown = [word for word in args.only if not any(word in part for part in SKIPPABLE)]
    if unknown:  # a word no part's name holds would measure nothing, and say nothing of it
        p.error(f"--only {unknown[0]!r} names no part: use words of " + ", ".join(SKIPPABLE))
    if args.n_embd % args.n_head or (args.n_embd // args.n_head) % 2:
        p.error(f"--n-embd {args.n_embd} must be --n-head {args.n_head} times an even head size (rope pairs channels)")

    device = pick_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    threads, quick = torch.get_num_threads(), args.quick
    dtype = resolve_dtype(args.dtype, device)
    shape = dict(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, block_size=args.block_size,
                 vocab_size=args.vocab_size)
    learned, rope = GPTConfig(**shape), GPTConfig(**shape, rope=True)
    check_fits_training(learned, args.batch_size)  # its training steps must fit: said now, before any part
    window = args.block_size
    print(machine(device), f"headline precision {dtype_name(dtype)}")
    started = time.perf_counter()

    # the plan: a probe of the machine, each part's time from it, and what would take too long here
    rates = probe(device)
    plan = Plan(estimate_parts(rates, learned, rope, device, args.batch_size, dtype, quick, args.compile, threads,
                               args.batches, not args.no_tune_malloc, args.c_step), 60 * args.limit_minutes, rates,
                args.only)
    for line in plan.lines():
        print(line, flush=True)
    runs = plan.runs

    # the ceilings first
    ceilings = measure_ceilings(device, quick, threads, None if runs("bf16 matmul peak") else rates)
    peak = ceilings[ceilings["training_peak"]]
    peaks = {torch.float32: ceilings["matmul_fp32_flops"], torch.bfloat16: ceilings["matmul_bf16_flops"]}
    print(f"ceilings: matmul fp32 {ceilings['matmul_fp32_flops'] / 1e9:,.1f} GFLOP/s, bf16 "
          f"{ceilings['matmul_bf16_flops'] / 1e9:,.1f} GFLOP/s, "
          f"memory read {ceilings['read_bandwidth'] / 1e9:.1f} GB/s", flush=True)

    # training, both kinds, both precisions side by side (those the plan keeps)
    steps = 3 if quick else 7
    eager = tuple(d for d in PRECISIONS if runs(f"training in {dtype_name(d)}"))
    compiled = tuple(d for d in PRECISIONS if runs(f"compiled training in {dtype_name(d)}"))
    untuned, malloc_tuned = None, False
    if not args.no_tune_malloc:  # first as glibc's malloc is by default, then tuned (from here on)
        if dtype in eager:
            fn = train_step(make_model(rope, device, train=True), *(random_tokens((args.batch_size, window),
                            args.vocab_size, device, seed=s) for s in (1, 2)), device, dtype)
            seconds = time_it(fn, device, repeats=2, warmup=1)
            untuned = {"kind": "rope", "dtype": dtype_name(dtype), "tokens_per_s": args.batch_size * window / seconds}
            untuned["flops"] = untuned["tokens_per_s"] * training_flops_per_token(rope)
            untuned["share_of_peak"] = untuned["flops"] / peak
        malloc_tuned = tune_malloc()
    training = []
    for config in (learned, rope):
        training += bench_training(config, device, args.batch_size, steps, peak, dtype, args.compile, eager=eager,
                                   compiled=compiled, peaks=peaks)
    for row in training:
        print(f"training {row['kind']} {row['dtype']}{' compiled' if row['compiled'] else ''}, "
              f"{row['attention']} attention: {row['tokens_per_s']:,.0f} tokens/s, {row['share_of_peak']:.2f} of peak, "
              f"{row['share_of_dtype_peak']:.2f} of the {row['dtype']} peak", flush=True)

    # decoding at batch 1: the sliding cache (rope), the re-run window (learned), the floor
    tokens, repeats = (4, 3) if quick else (16, 7)
    decoding = None
    if runs("decoding in the headline precision"):
        weights = tuple(d for d in PRECISIONS if runs(f"decoding with {dtype_name(d)} weights"))
        decoding = measure_decoding(rope, learned, device, ceilings, threads, dtype, tokens, repeats, quick, weights)
        print(f"decoding: cached {decoding['cached_ms']:.2f} ms/token ({decoding['cached_over_floor']:.2f}x the "
              f"floor of {decoding['floor_ms']:.2f} ms), re-run window {decoding['rerun_ms']:.1f} ms/token", flush=True)

    # generation with the cache, several sequences at once
    generation = []
    rope_model = make_model(rope, device).to(dtype)
    best_bandwidth = max(v for k, v in ceilings.items() if k.startswith("read_bandwidth"))
    for B in args.batches if runs("generation") else []:
        prompts = random_tokens((B, window), args.vocab_size, device, seed=6)
        ms = 1e3 * generate_seconds_per_token(rope_model, prompts, True, max(2, tokens // 2), repeats)
        floor = decode_floor_ms(rope_model, window, B, best_bandwidth, peak)
        generation.append({"batch": B, "ms_per_step": ms, "tokens_per_s": 1e3 * B / ms,
                           "floor_tokens_per_s": 1e3 * B / floor, "share_of_floor": floor / ms})
        print(f"generation B={B}: {1e3 * B / ms:,.0f} tokens/s", flush=True)

    result = {
        "machine": machine(device),
        "device": device.type,
        "dtype": dtype_name(dtype),
        "threads": threads,
        "malloc_tuned": malloc_tuned,
        "torch": torch.__version__,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": quick,
        "note": args.note,
        "command": shlex.join(["python", "scripts/bench.py", *(sys.argv[1:] if argv is None else argv)]),
        "config": shape,
        "probe": rates,
        "estimated_seconds": plan.seconds,
        "skipped": [{"part": part, "estimated_seconds": seconds} for part, seconds in plan.skipped.items()],
        "not_asked": sorted(plan.unasked),
        "ceilings": ceilings,
        "training": training,
        "training_bf16_over_fp32": {
            kind: speed(training, kind, dtype="bfloat16", compiled=False)
            / speed(training, kind, dtype="float32", compiled=False)
            for kind in ("learned", "rope") if len(eager) == 2},
        "training_float32_share_of_fp32_peak": {  # the eager float32 step against float32's products
            kind: next(r["share_of_dtype_peak"] for r in training if r["kind"] == kind and r["dtype"] == "float32"
                       and not r["compiled"]) for kind in ("learned", "rope") if torch.float32 in eager},
        "training_compiled_over_eager": compiled_over_eager(training, device) if args.compile else {},
        "training_batched_attention_speedup": {  # compiled bf16 step, batched products over PyTorch's kernel
            kind: speed(training, kind, dtype="bfloat16", compiled=True, attention="batched")
            / speed(training, kind, dtype="bfloat16", compiled=True, attention="sdpa")
            for kind in ("learned", "rope")
            if all(has(training, kind, dtype="bfloat16", compiled=True, attention=a) for a in ("batched", "sdpa"))},
        "training_malloc_untuned": untuned if malloc_tuned else None,
        "decoding": decoding,
        "generation": generation,
        "goals": GOALS,
    }
    if args.c_step and runs("decoding with the C step"):
        c_step = bench_c_step(make_model(rope, device), device, tokens, repeats)
        if isinstance(c_step, str):
            print(f"decoding with the C step: not timed: {c_step}", flush=True)
        else:
            result["c_step"] = c_step
            print(f"decoding with the C step: {c_step['ms']:.2f} ms/token after {c_step['build_s']:.1f} s of "
                  "building it", flush=True)
    result["seconds"] = time.perf_counter() - started

    print()
    rows = summary_rows(result)
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(cell).ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    print(f"\n{result['machine']}; {result['seconds']:.0f} s (planned {plan.seconds:.0f} s)")
    if args.json:
        write_json(args.json, result)
    return result


# ----------------------------------------------------------------------------------------------
# The summary table printed at the end


def summary_rows(result: dict) -> list[tuple[str, str, str, str, str]]:
    """bench.json -> rows (figure, measured, bound, ratio, goal), a header first."""
    c, d, goals = result["ceilings"], result["decoding"], result["goals"]
    rows = [("figure", "measured", "against", "ratio", "goal")]
    product = f"{c['matmul_n']} x {c['matmul_n']} product"
    rows.append(("fp32 matmul peak", f"{c['matmul_fp32_flops'] / 1e9:,.1f} GFLOP/s", product, "", ""))
    bf16_n = c.get("matmul_bf16_n", c["matmul_n"])
    rows.append(("bf16 matmul peak", f"{c['matmul_bf16_flops'] / 1e9:,.1f} GFLOP/s",
                 f"{bf16_n} x {bf16_n} product" + (" (the probe's)" if "matmul_bf16_n" in c else ""),
                 f"{c['matmul_bf16_flops'] / c['matmul_fp32_flops']:.2f}x fp32", ""))
    rows.append(("memory bandwidth, read", f"{c['read_bandwidth'] / 1e9:.1f} GB/s",
                 f"sum of {c['bandwidth_mbytes']} MB", "", ""))
    if "read_bandwidth_1_thread" in c:
        rows.append(("memory bandwidth, read, 1 thread", f"{c['read_bandwidth_1_thread'] / 1e9:.1f} GB/s",
                     f"sum of {c['bandwidth_mbytes']} MB", "", ""))
    peak_name = "bf16 matmul peak" if c["training_peak"] == "matmul_bf16_flops" else "fp32 matmul peak"
    for t in result["training"]:
        B, T = t["batch"]
        how = t["dtype"] + (f", compiled ({t['compile_s']:.0f} s)" if t["compiled"] else "")
        how += f", {t['attention']} attention"
        rows.append((f"training, {t['kind']}, {how} ({B} x {T})",
                     f"{t['tokens_per_s']:,.0f} tokens/s = {t['flops'] / 1e9:,.1f} GFLOP/s", peak_name,
                     f"{t['share_of_peak']:.2f} of peak", f">= {goals['training_share_of_peak']}"))
    for kind, share in result.get("training_float32_share_of_fp32_peak", {}).items():
        rows.append((f"training, {kind}, float32 (eager) against float32's products", f"{share:.2f} of fp32 peak",
                     f"fp32 matmul peak {c['matmul_fp32_flops'] / 1e9:,.1f} GFLOP/s", "", ""))
    for kind, ratio in result["training_bf16_over_fp32"].items():
        rows.append((f"training, {kind}, bf16 over float32", f"{ratio:.2f}x", "side by side", "", ""))
    for kind, ratios in result.get("training_compiled_over_eager", {}).items():
        rows.append((f"training, {kind}, compiled over eager",
                     ", ".join(f"{name} {ratio:.2f}x" for name, ratio in ratios.items()), "side by side", "", ""))
    for kind, ratio in result.get("training_batched_attention_speedup", {}).items():
        rows.append((f"training, {kind}, compiled bf16, batched attention over sdpa", f"{ratio:.2f}x", "side by side",
                     "", ""))
    untuned = result.get("training_malloc_untuned")
    if untuned:
        rows.append((f"training, {untuned['kind']}, {untuned['dtype']}, glibc malloc as it is",
                     f"{untuned['tokens_per_s']:,.0f} tokens/s = {untuned['flops'] / 1e9:,.1f} GFLOP/s", peak_name,
                     f"{untuned['share_of_peak']:.2f} of peak", ""))
    if d is None:  # skipped by the plan
        d = {"cached_ms_by_dtype": {}, "cached_ms_by_threads": {}}
    for name, ms in d["cached_ms_by_dtype"].items():
        floor_ms = d["floor_ms_by_dtype"][name]
        rows.append((f"decoding, sliding cache (rope, batch 1), {name} weights", f"{ms:.2f} ms/token",
                     f"floor {floor_ms:.2f} ms", f"{ms / floor_ms:.2f}x floor", f"<= {goals['cached_over_floor']}x"))
    for n, ms in d["cached_ms_by_threads"].items():
        if int(n) != result["threads"]:
            rows.append((f"decoding, sliding cache, {d['dtype']}, {n} thread{'s' if int(n) > 1 else ''}",
                         f"{ms:.2f} ms/token", f"floor {d['floor_ms']:.2f} ms ({d['floor_bytes'] / 1e6:.1f} MB read)",
                         f"{ms / d['floor_ms']:.2f}x floor", ""))
    if "c_step" in result:
        k = result["c_step"]
        pays = f"pays after {k['break_even_tokens']:,.0f} tokens" if k["break_even_tokens"] else "never pays"
        rows.append(("decoding, sliding cache, float32, the C step (fast_decode.py)",
                     f"{k['ms']:.2f} ms/token, {k['speedup']:.2f}x eager's {k['eager_ms']:.2f} side by side "
                     f"(building it {k['build_s']:.1f} s: {pays})", "", "", ""))
    if "rerun_ms" in d:
        rows.append((f"decoding, re-run window (learned, {result['config']['block_size']}), {d['dtype']}",
                     f"{d['rerun_ms']:.1f} ms/token",
                     f"compute floor {d['rerun_compute_floor_ms']:.1f} ms ({d['floors_ratio']:.0f}x the cache's floor)",
                     f"{d['rerun_over_cached']:.1f}x the cache", f">= {goals['rerun_over_cached']:g}x"))
    for g in result["generation"]:
        rows.append((f"generation, cache, batch {g['batch']}, {result['dtype']}", f"{g['tokens_per_s']:,.0f} tokens/s",
                     f"floor {g['floor_tokens_per_s']:,.0f} tokens/s", f"{g['share_of_floor']:.2f} of floor", ""))
    for skipped in result.get("skipped", []):
        rows.append((skipped["part"], "skipped", f"about {minutes(skipped['estimated_seconds'])} here", "", ""))
    return rows


if __name__ == "__main__":
    run_main(main)
