"""Timing helpers: wait for the device, time a function fairly, describe the machine."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # for the type hints only
    from mvgpt.model import GPT, GPTConfig


def sync(device: torch.device | str) -> None:
    """Wait until the device has finished its queued work (GPU calls return before they finish)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def time_it(fn: Callable[[], object], device: torch.device | str, repeats: int = 5, warmup: int = 1) -> float:
    """Median seconds of fn() over repeats, after warm-up, synced before each clock read."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: torch.device | str = "cpu") -> str:
    """One line saying where a figure was measured."""
    device = torch.device(device)
    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
    else:  # the vector instructions torch's CPU kernels use (AVX2, AVX512, ...) matter as much
        where = f"{cpu_name()} ({torch.backends.cpu.get_cpu_capability()})"
    return (
        f"{where}, {torch.get_num_threads()} threads of {os.cpu_count()} cores, "
        f"torch {torch.__version__}, {device.type}"
    )


# ----------------------------------------------------------------------------------------------
# The machine's ceilings: what a figure is measured against


def matmul_flops(
    device: torch.device | str, n: int = 2048, dtype: torch.dtype = torch.float32, repeats: int = 5
) -> float:
    """FLOP/s of one large square matrix product (2 n^3 flops): the compute ceiling for training.

    A product this size keeps every core's vector units busy, so it is the most the math library
    gets out of the machine; a training step is mostly matrix products, of smaller shapes.
    """
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    return 2 * n**3 / time_it(lambda: a @ b, device, repeats, warmup=2)


def memory_bandwidth(device: torch.device | str, mbytes: int = 512, repeats: int = 5) -> dict[str, float]:
    """Bytes/s streaming a buffer far larger than the caches: {"read": a sum, "copy": read + write}.

    A decoding step reads every weight once and writes almost nothing, so "read" is its ceiling.
    The buffer must not fit in the last-level cache (32 MB on many CPUs, 50+ MB on big GPUs), or
    the figure is the cache's speed, not the memory's.
    """
    n = mbytes * 2**20 // 4
    x = torch.ones(n, device=device)
    y = torch.empty_like(x)
    nbytes = x.numel() * x.element_size()
    return {
        "read": nbytes / time_it(lambda: x.sum(), device, repeats, warmup=2),
        "copy": 2 * nbytes / time_it(lambda: y.copy_(x), device, repeats, warmup=2),
    }


# ----------------------------------------------------------------------------------------------
# What the model must do: flops per trained token, bytes per decoded token


def matmul_weights(config: GPTConfig) -> int:
    """Weights that take part in a matrix product for every token: each block's four linear layers
    (queries/keys/values 3C x C, projection C x C, MLP 4C x C and C x 4C: 12 C^2) and the output
    layer (vocab x C, tied to the token embedding). Biases, norms and the table of positions only
    add or look up, so they are not counted."""
    return config.n_layer * 12 * config.n_embd**2 + config.vocab_size * config.n_embd


def training_flops_per_token(config: GPTConfig) -> float:
    """Flops of one trained token: 6 per matrix weight (2 forward, 4 backward), plus attention.

    Attention's two products, scores Q K^T and the weighted sum A V, cost 2 C flops per key each,
    forward; a query at place t sees t + 1 keys under the causal mask, (T + 1) / 2 on average, and
    the backward pass costs twice the forward: 6 L C (T + 1) per token. (nanoGPT and PaLM count the
    full T x T square, 12 L C T, about twice this; the CPU's flash attention skips the masked half,
    so counting it would flatter the figure.) Softmax, norms, GELU and the loss are not counted.
    """
    L, C, T = config.n_layer, config.n_embd, config.block_size
    return 6 * matmul_weights(config) + 6 * L * C * (T + 1)


def forward_flops(config: GPTConfig, tokens: int, logits_for: int = 1) -> float:
    """Flops of a forward pass over `tokens` tokens with output logits for `logits_for` of them:
    the work of re-running a window for one new token (a compute floor, against the matmul peak)."""
    L, C, V = config.n_layer, config.n_embd, config.vocab_size
    blocks = 2 * L * 12 * C**2 * tokens
    attention = 4 * L * C * tokens * (tokens + 1) / 2  # causal: query t sees t + 1 keys
    return blocks + attention + 2 * V * C * logits_for


def decode_flops_per_token(config: GPTConfig, held: int) -> float:
    """Flops of one cached decoding step, per sequence: 2 per matrix weight, and attention's two
    products over the `held` keys and values (2 C flops per key each, in every block)."""
    return 2 * matmul_weights(config) + 4 * config.n_layer * config.n_embd * held


def decode_bytes_per_token(model: GPT, held: int, batch_size: int = 1) -> int:
    """Bytes one cached decoding step must read, at least: each weight once (the batch shares
    them) and, for every sequence and block, the keys and values of the `held` tokens it attends to.

    The token embedding is read whole, by the output layer that shares it; a learned table of
    positions gives one row. Activations are a few kilobytes and are left out: this is a floor.
    """
    config = model.config
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if not config.rope:  # one row of the table of positions, not the table
        wpe = model.wpe.weight
        weights -= (wpe.shape[0] - 1) * wpe.shape[1] * wpe.element_size()
    element = next(model.parameters()).element_size()
    cache = 2 * config.n_layer * batch_size * held * config.n_embd * element  # keys and values
    return weights + cache


# ----------------------------------------------------------------------------------------------
# Settings and the profiler


def tune_malloc() -> bool:
    """Keep freed memory in the process instead of handing it back to the kernel (glibc only).

    A training step frees and reallocates the same large tensors (the logits of 16 x 256 tokens
    are 134 MB); by default glibc returns each one to the kernel (munmap) and maps fresh, zeroed
    pages on the next step, and the kernel's page faulting then takes a tenth or more of the CPU.
    This is glibc's documented knob (mallopt), the same as the environment variables
    MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=<large>, set from inside. False where it is absent.
    """
    import ctypes
    import ctypes.util

    if platform.system() != "Linux":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
        return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
    except (OSError, AttributeError):
        return False


def profile_table(fn: Callable[[], object], device: torch.device | str, row_limit: int = 15) -> str:
    """The top operations of one call of fn, by the time spent in each (self time), as a table.

    fn runs once before, so the table shows a warm step, not the first call's set-up.
    """
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(device)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    fn()
    sync(device)
    with profile(activities=activities) as prof:
        fn()
        sync(device)
    sort_by = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=sort_by, row_limit=row_limit)


# ----------------------------------------------------------------------------------------------
# A compiled decoding step


class _Traced(torch.nn.Module):
    """A module of our own around another: torch.compile traces our modules' code but runs torch.nn's
    own modules, compiled on their own, as they are (a compiled nn.Linear alone stays eager)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def compile_for_decoding(model: GPT) -> GPT:
    """A copy of the model whose one-token steps with a cache run through torch.compile, compiled now.

    What it buys on a CPU is inductor's own kernels for the matrix-vector products: with one token,
    each linear layer multiplies a vector by a matrix, which the math library (MKL) runs at a
    fraction of the memory's bandwidth on some AMD CPUs. Inductor's decompose_mm_pass turns a
    product with one row into a multiply-and-sum, which it compiles into a vectorised C++ loop,
    fused with the norms, GELU and additions around it. The logits are the same up to float
    rounding (the sums are added in another order). A product with several rows (a prompt, a
    batch) is left to the library, which is fast at those.

    GPT.forward itself stays eager: its loop over the blocks holds the cache's writes, which stay
    out of the graphs (KVCache.update), so each block compiles in pieces around them, and the
    output layer on its own. Compiling takes seconds with inductor's on-disk cache warm, tens of
    seconds cold; it happens here, one-token steps first, so that they get graphs of fixed shape
    (a prompt read later gets its own). The original model stays as it was.
    """
    import copy

    import torch._inductor.config as inductor_config

    from mvgpt.model import KVCache

    # the output layer (vocab x C) is larger than the pass's default limit (2048); the limit is
    # read when inductor is first loaded, so this must come before the process's first compile
    options = dict(inductor_config.post_grad_fusion_options)
    options["decompose_mm_pass"] = {"cpu_max_other_dimension_decomposition": max(2048, model.config.vocab_size)}
    inductor_config.post_grad_fusion_options = options
    fast = copy.deepcopy(model)
    fast.compile()  # nn.Module.compile, in place: fast(...) and fast.generate(...) both use it
    fast.lm_head = _Traced(fast.lm_head)  # still the token embedding's weight, now compiled too
    fast.lm_head.compile()
    weight = fast.wte.weight
    cache = KVCache(fast.config, 1, device=weight.device, dtype=weight.dtype)
    token = torch.zeros(1, 1, dtype=torch.long, device=weight.device)
    with torch.no_grad():
        for _ in range(3):  # an empty cache, then held tokens, then a count that changes
            fast(token, cache=cache, last_only=True)
    return fast


# ----------------------------------------------------------------------------------------------
# The benchmark's summary: the same rows printed by scripts/bench.py and put in the docs


def summary_rows(result: dict) -> list[tuple[str, str, str, str, str]]:
    """scripts/bench.py's JSON -> rows (figure, measured, bound, ratio, goal), a header first."""
    c, d, goals = result["ceilings"], result["decoding"], result["goals"]
    rows = [("figure", "measured", "against", "ratio", "goal")]
    rows.append(("fp32 matmul peak", f"{c['matmul_fp32_flops'] / 1e9:,.1f} GFLOP/s",
                 f"{c['matmul_n']} x {c['matmul_n']} product", "", ""))
    if "matmul_bf16_flops" in c:
        rows.append(("bf16 matmul peak", f"{c['matmul_bf16_flops'] / 1e9:,.1f} GFLOP/s",
                     f"{c['matmul_n']} x {c['matmul_n']} product",
                     f"{c['matmul_bf16_flops'] / c['matmul_fp32_flops']:.2f}x fp32", ""))
    rows.append(("memory bandwidth, read", f"{c['read_bandwidth'] / 1e9:.1f} GB/s",
                 f"sum of {c['bandwidth_mbytes']} MB", "", ""))
    if "read_bandwidth_1_thread" in c:
        rows.append(("memory bandwidth, read, 1 thread", f"{c['read_bandwidth_1_thread'] / 1e9:.1f} GB/s",
                     f"sum of {c['bandwidth_mbytes']} MB", "", ""))
    peak_name = "bf16 matmul peak" if c["training_peak"] == "matmul_bf16_flops" else "fp32 matmul peak"
    for t in result["training"]:
        B, T = t["batch"]
        rows.append((f"training, {t['kind']} ({B} x {T})",
                     f"{t['tokens_per_s']:,.0f} tokens/s = {t['flops'] / 1e9:,.1f} GFLOP/s", peak_name,
                     f"{t['share_of_peak']:.2f} of peak", f">= {goals['training_share_of_peak']}"))
    untuned = result.get("training_malloc_untuned")
    if untuned:
        rows.append((f"training, {untuned['kind']}, glibc malloc as it is",
                     f"{untuned['tokens_per_s']:,.0f} tokens/s = {untuned['flops'] / 1e9:,.1f} GFLOP/s", peak_name,
                     f"{untuned['share_of_peak']:.2f} of peak", ""))
    floor = f"floor {d['floor_ms']:.2f} ms ({d['floor_bytes'] / 1e6:.1f} MB read)"
    rows.append(("decoding, sliding cache (rope, batch 1)", f"{d['cached_ms']:.2f} ms/token", floor,
                 f"{d['cached_over_floor']:.2f}x floor", f"<= {goals['cached_over_floor']}x"))
    for n, ms in d["cached_ms_by_threads"].items():
        if int(n) != result["threads"]:
            rows.append((f"decoding, sliding cache, {n} thread{'s' if int(n) > 1 else ''}", f"{ms:.2f} ms/token",
                         floor, f"{ms / d['floor_ms']:.2f}x floor", ""))
    if "compiled_decoding" in result:
        k = result["compiled_decoding"]
        pays = f"pays after {k['break_even_tokens']:,.0f} tokens" if k["break_even_tokens"] else "never pays"
        rows.append(("decoding, sliding cache, torch.compile",
                     f"{k['ms']:.2f} ms/token, {k['speedup']:.2f}x eager's {k['eager_ms']:.2f} side by side "
                     f"(compiling {k['compile_s']:.0f} s: {pays})", floor,
                     f"{k['ms'] / d['floor_ms']:.2f}x floor", f"<= {goals['cached_over_floor']}x"))
    rows.append((f"decoding, re-run window (learned, {result['config']['block_size']})",
                 f"{d['rerun_ms']:.1f} ms/token",
                 f"compute floor {d['rerun_compute_floor_ms']:.1f} ms ({d['floors_ratio']:.0f}x the cache's floor)",
                 f"{d['rerun_over_cached']:.1f}x the cache" + (
                     f" ({d['rerun_ms'] / result['compiled_decoding']['ms']:.1f}x compiled)"
                     if "compiled_decoding" in result else ""),
                 f">= {goals['rerun_over_cached']:g}x"))
    for g in result["generation"]:
        rows.append((f"generation, cache, batch {g['batch']}", f"{g['tokens_per_s']:,.0f} tokens/s",
                     f"floor {g['floor_tokens_per_s']:,.0f} tokens/s", f"{g['share_of_floor']:.2f} of floor", ""))
    return rows
