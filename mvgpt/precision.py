"""Mixed precision: which dtype the matrix products run in, and the autocast context for it.

Training in bfloat16 *mixed* precision keeps every weight, gradient and optimizer state in float32;
only inside `torch.autocast` are the matrix products (linear layers, attention) run in bfloat16,
which has float32's range (8 exponent bits) but 8 bits of mantissa instead of 24. Norms, softmax
and the loss stay float32 (autocast's own lists). (The output layer's logits were once kept in
float32 by hand; with the 100-step warm-up bf16 logits track float32 as closely, and the float32
product cost a tenth of the step: docs/performance.md has the runs.)

bf16 pays only where the hardware multiplies bf16 natively: CUDA GPUs since Ampere, CPUs with
AVX512-BF16 or AMX (Intel Sapphire Rapids and later, AMD Zen 4 and later). Elsewhere the CPU
converts to float32 and back around every product, and bf16 is slower than float32. `auto` asks
PyTorch what the hardware has and, where it only says "emulated", times one product both ways.

Apple's GPU (MPS): `auto` is float32. MPS multiplies bf16 (macOS 14 and later), but whether that is
faster there was never measured, so `auto` takes the safe choice; `--dtype bfloat16` asks for bf16
products under torch.autocast("mps"). MPS has no float64 at all: the angle tables are made in float64
on the CPU and moved in float32 (model.rotary). Nothing is compiled there unless asked
(mvgpt.perf.compile_pays). tests/test_precision.py holds these choices on a machine without MPS.

Examples:
    dtype = resolve_dtype("auto", device)          # torch.bfloat16 on this CPU (AMX), or float32
    with autocast(device, dtype):
        logits, loss = model(x, y)
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext

import torch

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
