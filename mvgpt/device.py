"""Which device to run on: the best one present, or the one asked for, with a clear error."""

from __future__ import annotations

import warnings

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
