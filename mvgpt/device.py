"""Which device to run on: the best one present, or the one asked for, with a clear error."""

from __future__ import annotations

import torch


def pick_device(requested: str | None = None) -> torch.device:
    """cuda > mps > cpu when nothing is asked for; an absent device is a one-line error."""
    if requested in (None, "", "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
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
    return device
