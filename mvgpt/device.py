"""Where the work runs: which device, in what precision, waiting for it, and what machine it is.

pick_device: the best device present, or the one asked for, with a one-line error when it is not
here. sync: wait for it to finish (a GPU's calls return before their work is done). machine: one
line naming it, beside every measured figure.

The precision of the matrix products. Training in bfloat16 *mixed* precision keeps every weight,
gradient and optimizer state in float32; only inside `torch.autocast` are the matrix products
(linear layers, attention) run in bfloat16, which has float32's range (8 exponent bits) but 8 bits
of mantissa instead of 24. Norms, softmax and the loss stay float32 (autocast's own lists).

bf16 pays only where the hardware multiplies bf16 natively: CUDA GPUs since Ampere, CPUs with
AVX512-BF16 or AMX (Intel Sapphire Rapids and later, AMD Zen 4 and later). Elsewhere the CPU
converts to float32 and back around every product, and bf16 is slower than float32. `auto` asks
PyTorch what the hardware has and, where it only says "emulated", times one product both ways.

Apple's GPU (MPS): `auto` is float32. MPS multiplies bf16 (macOS 14 and later), but whether that is
faster there was never measured, so `auto` takes the safe choice; `--dtype bfloat16` asks for bf16
products under torch.autocast("mps"). MPS has no float64 at all: the angle tables are made in float64
on the CPU and moved in float32 (model.rotary). Nothing is compiled there unless asked
(mvgpt.perf.measure.compile_pays). tests/test_precision.py holds these choices on a machine without MPS.

Examples:
    device = pick_device()                         # cuda > mps > cpu
    dtype = resolve_dtype("auto", device)          # torch.bfloat16 on a CPU with AMX or AVX512-BF16, or float32
    with autocast(device, dtype):
        logits, loss = model(x, y)
"""

from __future__ import annotations

import os
import platform
import time
import warnings
from contextlib import AbstractContextManager, nullcontext

import torch

# ----------------------------------------------------------------------------------------------
# Which device


def pick_device(requested: str | None = None) -> torch.device:
    """cuda > mps > cpu when nothing is asked for; an absent device is a one-line error."""
    if requested in (None, "", "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        with warnings.catch_warnings():  # an old name's deprecation: not the user's business here
            warnings.simplefilter("ignore")
            device = torch.device(requested)
    except RuntimeError:
        raise SystemExit(f"error: unknown device {requested!r}: use cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(f"error: device {requested!r} asked for, but no CUDA GPU is visible: use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise SystemExit(
                f"error: device {requested!r} asked for, but only {torch.cuda.device_count()} "
                "CUDA GPU(s) are visible"
            )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise SystemExit(f"error: device {requested!r} asked for, but MPS is not available: use --device cpu")
    if device.type == "meta":  # shapes without storage: nothing would be computed
        raise SystemExit(f"error: device {requested!r} holds no data: use cpu, cuda, cuda:N or mps")
    if device.type not in ("cpu", "cuda", "mps"):  # a name torch knows (xpu, hpu, ...): is one here?
        try:
            torch.empty(1, device=device)
        except Exception:  # torch's many ways to say no: RuntimeError, ModuleNotFoundError, ...
            raise SystemExit(f"error: device {requested!r} asked for, but this machine has none: "
                             "use --device cpu (or cuda, mps where there is one)") from None
    return device


def sync(device: torch.device | str) -> None:
    """Wait until the device has finished its queued work (GPU calls return before they finish)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


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



def memory_bytes() -> int | None:
    """This machine's memory, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None

# ----------------------------------------------------------------------------------------------
# The precision of its matrix products

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
CHOICES = ("auto", *DTYPES)


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16" (the name the flags and the JSON use)."""
    return str(dtype).removeprefix("torch.")


def cpu_bf16_native() -> bool:
    """Whether this CPU has bf16 instructions for products (AVX512-BF16 or AMX), as PyTorch reports."""
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def bf16_matmul_speedup(device: torch.device, n: int = 512, repeats: int = 3) -> float:
    """bf16 over float32 speed of one n x n matrix product, best of `repeats` each (a quick check)."""

    def best(dtype: torch.dtype) -> float:
        a = torch.randn(n, n, device=device).to(dtype)
        a @ a  # warm-up: the library picks its kernel on the first call
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ a
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        return min(times)

    return best(torch.float32) / best(torch.bfloat16)


def bf16_pays(device: torch.device) -> bool:
    """Does bf16 autocast make this device's matrix products faster than float32?"""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type != "cpu":  # MPS and others: float32, the safe choice
        return False
    if cpu_bf16_native():
        return True
    if not torch.backends.mkldnn.is_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    return bf16_matmul_speedup(device) > 1.2  # supported, perhaps emulated: measure


def resolve_dtype(name: str, device: torch.device | str) -> torch.dtype:
    """"auto" -> bfloat16 where the device runs bf16 products natively and faster, else float32;
    "float32" and "bfloat16" are taken as asked."""
    if name == "auto":
        return torch.bfloat16 if bf16_pays(torch.device(device)) else torch.float32
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}: use one of {', '.join(CHOICES)}")
    return DTYPES[name]


def autocast(device: torch.device | str, dtype: torch.dtype) -> AbstractContextManager:
    """The context a forward pass runs in: bf16 autocast, or nothing for float32."""
    if dtype == torch.float32:
        return nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)
