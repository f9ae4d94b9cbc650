"""Timing helpers: wait for the device, time a function fairly, describe the machine."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable

import torch


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
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    return (
        f"{where}, {torch.get_num_threads()} threads of {os.cpu_count()} cores, "
        f"torch {torch.__version__}, {device.type}"
    )
