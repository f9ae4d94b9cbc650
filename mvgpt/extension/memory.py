"""How much memory reading a context takes: the KV cache's bytes, computed, and a forward's peak,
measured (CUDA's allocator statistics, or Linux's procfs for the CPU). Tooling for
scripts/long_context.py, kept out of the teaching modules."""

from __future__ import annotations

import ctypes
import gc
from pathlib import Path

import torch

from mvgpt.model import GPT, KVCache


def kv_bytes_per_token(model: GPT) -> int:
    """Keys and values of one token in every block: 2 x n_layer x n_embd numbers."""
    cfg = model.config
    return 2 * cfg.n_layer * cfg.n_embd * model.wte.weight.element_size()


def peak_forward_bytes(model: GPT, ctx: int) -> int:
    """Measured peak memory of one forward over ctx tokens with a KV cache (logits included), above
    what was in use before: CUDA's allocator statistics, or on the CPU the process's peak resident
    set, reset just before (Linux's clear_refs), after glibc has handed freed memory back.
    Raises OSError where the peak cannot be read (not Linux)."""
    device = model.wte.weight.device
    idx = torch.zeros(1, ctx, dtype=torch.long, device=device)
    with torch.no_grad():
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            model(idx, cache=KVCache(model.config, 1, ctx, device))
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated(device) - before
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed memory leaves the process: new pages count
        Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) restarts from here
        before = proc_status_kb("VmRSS")
        model(idx, cache=KVCache(model.config, 1, ctx, device))
        return 1024 * (proc_status_kb("VmHWM") - before)


def proc_status_kb(field: str) -> int:
    """A field of /proc/self/status, in kB (VmRSS: resident now, VmHWM: its peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise OSError(f"no {field} in /proc/self/status")
