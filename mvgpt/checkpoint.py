"""Checkpoints: weights + config (+ tokenizer hash, step, optimizer, ...), saved atomically.

A checkpoint is a dict of tensors and plain values, written to a temporary file and renamed into
place, so a crash never leaves a half-written one. It is read with weights_only=True: no pickled
code is ever run. Its config rebuilds its own model; a config saved before `rope` existed loads
as a learned-position model, and the patch is logged.
"""

from __future__ import annotations

import logging
import os
import pickle
import zipfile
from dataclasses import asdict, fields
from pathlib import Path

import torch

from mvgpt.io import atomic_path
from mvgpt.model import GPT, GPTConfig

log = logging.getLogger(__name__)
CHECKPOINT_NAME = "ckpt.pt"


class CheckpointError(SystemExit):
    def __init__(self, message: str) -> None:
        super().__init__(f"error: {message}")


def checkpoint_path(path: str | os.PathLike) -> Path:
    """A run folder means its ckpt.pt; a file means itself."""
    path = Path(path)
    return path / CHECKPOINT_NAME if path.is_dir() else path


def save_checkpoint(path: str | os.PathLike, model: GPT, **extra) -> Path:
    """Write {model, config, **extra} atomically to path (a file, or a run folder's ckpt.pt)."""
    path = Path(path)
    if path.suffix != ".pt":
        path = path / CHECKPOINT_NAME
    model = getattr(model, "module", model)  # unwrap DistributedDataParallel
    model = getattr(model, "_orig_mod", model)  # unwrap torch.compile
    state = {"model": model.state_dict(), "config": asdict(model.config), **extra}
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
    return path


def read_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """The checkpoint's dict, or a one-line error for a missing, truncated or corrupt file."""
    file = checkpoint_path(path)
    if not file.exists():
        raise CheckpointError(
            f"no checkpoint at {file}: train one with `python scripts/pretrain.py`, or check the path"
        )
    try:
        state = torch.load(file, map_location=map_location, weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"checkpoint {file} is truncated or corrupt ({first[:120]}): "
            "use an earlier checkpoint or train again"
        ) from None
    if not isinstance(state, dict) or "model" not in state or "config" not in state:
        raise CheckpointError(f"{file} is not an mvGPT checkpoint (no model or config in it)")
    return state


def config_from_dict(saved: dict) -> GPTConfig:
    """A GPTConfig from a saved dict; fields it lacks take their defaults (old behaviour), logged."""
    known = {f.name for f in fields(GPTConfig)}
    missing = sorted(known - saved.keys())
    if missing:
        log.warning("checkpoint config has no %s: using defaults (%s)", ", ".join(missing),
                    ", ".join(f"{m}={getattr(GPTConfig, m)!r}" for m in missing))
    return GPTConfig(**{k: v for k, v in saved.items() if k in known})


def load_model(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    tokenizer_hash: str | None = None,
) -> tuple[GPT, dict]:
    """Rebuild a checkpoint's model on device (eval mode); returns (model, the checkpoint dict).

    With tokenizer_hash (the one in data/), a checkpoint trained with another tokenizer is refused.
    """
    state = read_checkpoint(path, map_location=device)
    saved = state.get("tokenizer_hash")
    if tokenizer_hash is not None and saved is not None and saved != tokenizer_hash:
        raise CheckpointError(
            f"checkpoint {checkpoint_path(path)} was trained with tokenizer {saved}, but data/ has "
            f"{tokenizer_hash}: prepare the data it was trained on, or pass --data-dir"
        )
    model = GPT(config_from_dict(state["config"]))
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        raise CheckpointError(
            f"checkpoint {checkpoint_path(path)} does not match its config ({str(e).splitlines()[0]})"
        ) from None
    return model.to(device).eval(), state
