"""Performance machinery: timing a function fairly, the machine's ceilings, the profiler (and the names of
inductor's kernels in it), glibc's malloc, and where compiling a training run pays. Benchmarks
(scripts/bench.py) and the training loop use it; the model does not. The decoding step in C is
fast_decode.py's.
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import sysconfig
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from mvgpt.device import sync


def time_it(
    fn: Callable[[], object], device: torch.device | str, repeats: int = 5, warmup: int = 1,
    summary: Callable[[list[float]], float] = statistics.median,
) -> float:
    """Median seconds of fn() over repeats (or another summary: min for a ceiling), after warm-up,
    synced before each clock read."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return summary(times)


# ----------------------------------------------------------------------------------------------
# The machine's ceilings: what a figure is measured against


def matmul_flops(
    device: torch.device | str, n: int = 2048, dtype: torch.dtype = torch.float32, repeats: int = 10
) -> float:
    """FLOP/s of one large square matrix product (2 n^3 flops): the compute ceiling for training.

    A product this size keeps every core's vector units busy, so it is the most the math library
    gets out of the machine; a training step is mostly matrix products, of smaller shapes. A
    ceiling is the best the machine gave, so the fastest of the repeats: on a shared host the
    median of a few moves a lot from one call to the next (dev/attention_mask.py measures both).
    """
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    return 2 * n**3 / time_it(lambda: a @ b, device, repeats, warmup=2, summary=min)


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


# A training run of at least this many seconds earns back compiling its step, where compiling pays. The
# rule: a run of S seconds whose compiled step runs r times the eager one's speed saves S (1 - 1/r)
# seconds, and pays if that is more than compiling costs (about 30 s with inductor's cache empty, seconds
# with it warm). In bf16 on a CPU r was 1.07 to 1.30 (results/bench.json and results/amd-epyc/bench.json,
# "compiled over eager"): at r = 1.13 thirty seconds are earned back in about 300, and a ten-minute run
# that compiled with inductor's cache empty got through more steps than the eager one on both CPUs
# (docs/pretraining.md, "Ten minutes, as typed").
COMPILE_PAYS_AFTER_S = 300.0


def compile_pays(device: torch.device | str, dtype: torch.dtype, seconds: float) -> bool:
    """Whether `torch.compile` earns its compile time back over `seconds` of training, where a run
    asks neither for it nor against it (pretrain.py's default for a run bounded by time).

    Yes in bf16 on a CPU, for five minutes or more, where inductor can build its C++ loops (Linux or
    macOS, a C++ compiler, Python's headers): what it fuses (the norms, GELU, softmaxes, casts) is
    much of a bf16 step there.

    Not in float32 on a CPU, measured side by side on both CPUs (and on the AMD again, busy): the
    learned step gains nothing (0.98 to 1.05 times the eager speed), the rope step 1.08 times on a
    quiet host (1.50 on the busy one, whose eager step waits on each of rotate's small operations).
    So compiling pays only for a rope run longer than about 13 times its compile time (ten minutes
    and more with the cache empty), as the main job's 1,000-step runs; not knowing the kind, this
    says no, and --compile asks.

    Not on Apple's GPU (MPS): inductor's Metal backend is young, and nothing here was measured
    there; nor on a CUDA GPU until dev/gpu_check.sh has measured it there (its choices.json: the
    compiled rope run's step speed over the eager one's, in the same minutes); ask with --compile.
    """
    return dtype == torch.bfloat16 and seconds >= COMPILE_PAYS_AFTER_S and inductor_builds_here(device)


def inductor_builds_here(device: torch.device | str) -> bool:
    """Whether torch.compile's inductor can build its C++ loops for this device: a CPU, on Linux or
    macOS (elsewhere it wants another toolchain), with a C++ compiler and Python's headers."""
    return (torch.device(device).type == "cpu" and platform.system() in ("Linux", "Darwin")
            and any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++"))
            and (Path(sysconfig.get_paths()["include"]) / "Python.h").exists())


def profile(fn: Callable[[], object], device: torch.device | str) -> list:
    """The profiler's events of one call of fn, by operation (key_averages), after one call unprofiled, so
    they show a warm step, not the first call's set-up."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    device = torch.device(device)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    fn()
    sync(device)
    with profiler(activities=activities) as prof:
        fn()
        sync(device)
    return prof.key_averages()


def self_time(event, device: torch.device | str) -> float:
    """Microseconds an operation spent in itself (not in the operations it called), on the device that ran it."""
    return event.self_device_time_total if torch.device(device).type == "cuda" else event.self_cpu_time_total


def profile_table(events: list, device: torch.device | str, row_limit: int = 15) -> str:
    """The top operations of a profile (`profile`), by the time spent in each (self time), as a table."""
    sort_by = "self_device_time_total" if torch.device(device).type == "cuda" else "self_cpu_time_total"
    return events.table(sort_by=sort_by, row_limit=row_limit)


# The parts of a training step, each by the names of its operations. A kernel torch.compile generated
# is named after the operations it fuses (cpp_fused_..._gelu_gelu_backward_... on a CPU, triton_..._fused_...
# on a GPU), so it counts under the first part here whose name it contains (in lower case): a kernel
# fusing the GELU with a norm counts as GELU. The loss comes before attention's softmax, as
# "_log_softmax" contains "_softmax"; the optimizer's part takes zero_grad and step (AdamW in their names).
STEP_PARTS = (
    ("matrix products", ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "gemm")),
    ("GELU", ("gelu",)),
    ("the loss", ("log_softmax", "nll_loss", "cross_entropy")),
    ("attention's softmax", ("_softmax", "softmax_backward")),
    ("norms", ("layer_norm",)),
    ("optimizer and clipping", ("adamw", "vector_norm", "_foreach", "aten::mul_")),
)


def step_part(name: str) -> str:
    """The part of a training step an operation or a fused kernel belongs to (STEP_PARTS), else "everything else"."""
    name = name.lower()
    for part, keys in STEP_PARTS:
        if any(key in name for key in keys):
            return part
    return "everything else"


def time_by_part(events: list, device: torch.device | str) -> dict[str, float]:
    """Seconds of a profiled step (`profile`) in each part of it (STEP_PARTS), largest first; they add up to
    the step's profiled time. A step through torch.compile names its fused kernels only where inductor was
    asked to record them (`kernel_names`); otherwise they stay inside its graphs' rows, "everything else"."""
    parts: dict[str, float] = {}
    for event in events:
        part = step_part(event.key)
        parts[part] = parts.get(part, 0.0) + self_time(event, device) / 1e6
    return dict(sorted(parts.items(), key=lambda kv: -kv[1]))


@contextmanager
def kernel_names() -> Iterator[None]:
    """While open, what torch.compile compiles records each of its generated CPU kernels by name for the
    profiler (inductor's cpp.enable_kernel_profile; GPU kernels are recorded anyway): compile and profile
    inside it, for a profile only, as the compiled code differs from the one timed. Dynamo's compiled
    code is dropped on the way in (a model compiled before, with the same guards, would be reused
    unnamed) and on the way out (nothing compiled after reuses the named code, nor can the code
    compiled inside be called after without compiling again, unnamed)."""
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    try:
        with inductor_config.patch({"cpp.enable_kernel_profile": True}):
            yield
    finally:
        torch._dynamo.reset()


# ----------------------------------------------------------------------------------------------
# Is anything else running? Other programs' share of the cores, while something is measured


def cpu_ticks() -> tuple[int, int] | None:
    """(ticks the machine's cores were busy, ticks this process and its finished children used), from /proc;
    None where the OS does not say. A child counts once waited for: the main job's stages, each a script it
    runs and waits for, are its own work, not other programs'. Steal time (a hypervisor serving other
    guests) counts as busy: it is taken. Programs at a lower priority than ours (a higher nice) count as
    idle: they give their core up to ours at once."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        mine = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
    except (OSError, ValueError, IndexError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    ours_niced = os.nice(0) > 0  # then our own ticks are in the nice column, and it must count
    return user + system + irq + softirq + steal + (nice if ours_niced else 0), sum(int(t) for t in mine[11:15])


def cores_taken(before: tuple[int, int] | None, after: tuple[int, int] | None, seconds: float) -> float | None:
    """The cores other programs kept busy between two cpu_ticks() readings `seconds` apart (None: unknown)."""
    if before is None or after is None or seconds <= 0:
        return None
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    return max(0.0, ((after[0] - before[0]) - (after[1] - before[1])) / hz / seconds)


class OtherLoad:
    """How many cores other programs kept busy between two readings: `with OtherLoad() as load: ...`,
    then `load.cores` (None where /proc is not there). A figure measured while other work takes a
    core is not this machine's speed, and the plan says so."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter,
                 ticks: Callable[[], tuple[int, int] | None] = cpu_ticks) -> None:
        self.clock, self.ticks, self.cores = clock, ticks, None

    def __enter__(self) -> OtherLoad:
        self.start = (self.clock(), self.ticks())
        return self

    def __exit__(self, *exc) -> None:
        (t0, before), now = self.start, self.clock()
        self.cores = cores_taken(before, self.ticks(), now - t0)
