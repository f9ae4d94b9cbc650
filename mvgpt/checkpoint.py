"""Checkpoints: weights + config (+ tokenizer hash, step, optimizer, ...), saved atomically.

A checkpoint is a dict of tensors and plain values, written to a temporary file and renamed into
place, so a crash never leaves a half-written one. It is read with weights_only=True: no pickled
code is ever run. Its config rebuilds its own model; a config saved before `rope` existed loads
as a learned-position model, and the patch is logged. A config is checked before any memory is
given to it: sane values, and a size this machine can hold (a crafted file must not make us
allocate half a terabyte). A full disk or a folder we may not write is one
line, and the previous checkpoint stays as it was.

A checkpoint is a zip archive with a checksum (CRC-32) per record: they are checked before it is
read, so a flipped bit on disk is reported as damage, not loaded as weights. It is always read into
CPU memory first and moved afterwards, so a device this machine lacks is never blamed on the file.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import pickle
import zipfile
from dataclasses import asdict, fields
from pathlib import Path

import torch

from mvgpt.errors import DISK_FULL, UserError
from mvgpt.io import atomic_path
from mvgpt.model import GPT, GPTConfig

log = logging.getLogger(__name__)
CHECKPOINT_NAME = "ckpt.pt"


class CheckpointError(UserError):
    """`error: ...` in one line: what is wrong with a checkpoint, and what to do."""


def checkpoint_path(path: str | os.PathLike) -> Path:
    """A run folder means its ckpt.pt; a file means itself."""
    path = Path(path)
    return path / CHECKPOINT_NAME if path.is_dir() else path


def no_checkpoint(path: str | os.PathLike) -> str:
    """Why there is no checkpoint at path, and the fix: a LoRA run folder holds an adapter only."""
    if (Path(path) / "adapter.pt").is_file():  # mvgpt/lora.py's ADAPTER_NAME
        return (f"{path} is a LoRA run (an adapter, no checkpoint of its own): give its base, or merge the two "
                f"first, `python scripts/finetune.py --init-from BASE --out-dir {path} --merge OUT`, and give OUT")
    return f"no checkpoint at {checkpoint_path(path)}: train one with `python scripts/pretrain.py`, or check the path"


def checkpoint_arg(text: str) -> str:
    """An argparse type: a run folder with a checkpoint, or a checkpoint file, checked to be there."""
    if not checkpoint_path(text).is_file():
        raise argparse.ArgumentTypeError(no_checkpoint(text))
    return text


def save_checkpoint(path: str | os.PathLike, model: GPT, **extra) -> Path:
    """Write {model, config, **extra} atomically to path (a file, or a run folder's ckpt.pt)."""
    path = Path(path)
    if path.suffix != ".pt":
        path = path / CHECKPOINT_NAME
    model = getattr(model, "module", model)  # unwrap DistributedDataParallel
    model = getattr(model, "_orig_mod", model)  # unwrap torch.compile
    return write_state(path, {"model": model.state_dict(), "config": asdict(model.config), **extra}, "checkpoint")


def write_state(path: Path, state: dict, what: str) -> Path:
    """torch.save(state) to path atomically; a full disk or a folder we may not write is one line,
    and the previous file, if any, is kept. Adapters (mvgpt/lora.py) are written the same way."""
    try:  # through our own file object, so a full disk is an OSError (ENOSPC), not torch's RuntimeError
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            torch.save(state, f)
    except OSError as e:
        if e.errno in DISK_FULL:
            raise CheckpointError(f"the disk is full: {path} not saved (the previous one, if any, is kept): "
                                  "free some space and run again") from None
        raise CheckpointError(f"cannot write {path} ({e.strerror}; the previous {what}, if any, is kept): "
                              "pick a folder you can write, or fix its permissions") from None
    return path


def read_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """The checkpoint's dict, or a one-line error for a missing, truncated or corrupt file."""
    file = checkpoint_path(path)
    if not file.exists():
        raise CheckpointError(no_checkpoint(path))
    state = load_state(file, map_location, "checkpoint", "use an earlier checkpoint or train again")
    if not isinstance(state, dict) or "model" not in state or "config" not in state:
        raise CheckpointError(f"{file} is not an mvGPT checkpoint (no model or config in it)")
    return state


def archive_damage(file: Path) -> str | None:
    """What is wrong with a checkpoint's zip archive (a record whose checksum fails), or None when
    every record is sound or the file is no zip at all (torch.load then says what it is)."""
    try:
        with zipfile.ZipFile(file) as archive:
            bad = archive.testzip()  # reads every record, checks its CRC-32
    except zipfile.BadZipFile as e:
        return None if "not a zip file" in str(e).lower() else str(e)
    except (OSError, EOFError, ValueError, RuntimeError) as e:  # zlib's or the reader's complaint
        return str(e) or type(e).__name__
    return None if bad is None else f"the checksum of its record {bad} fails"


def load_state(file: Path, map_location: str | torch.device, what: str, fix: str) -> object:
    """torch.load with weights_only=True (tensors and plain values: no pickled code runs), into CPU
    memory, then moved to map_location; a damaged file is one line naming `what` it is and the `fix`."""
    damage = archive_damage(file)
    if damage is not None:
        raise CheckpointError(f"{what} {file} is damaged on disk ({damage[:120]}): {fix}")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if first.startswith("Weights only load failed"):  # torch's advice to unpickle anyway: not for us
            first = "not tensors and plain values only"
        raise CheckpointError(f"{what} {file} is truncated or corrupt ({first[:120]}): {fix}") from None
    if torch.device(map_location).type != "cpu":
        state = _to_device(state, torch.device(map_location))
    return state


def _to_device(value: object, device: torch.device) -> object:
    """The tensors of a loaded state moved to device (dicts and lists walked), the rest as it is."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(v, device) for v in value)
    return value


def config_from_dict(saved: dict) -> GPTConfig:
    """A GPTConfig from a saved dict; fields it lacks take their defaults (old behaviour), logged.

    Every value must be of its field's kind and sane: whole numbers >= 1, finite numbers > 0,
    True or False; anything else is a one-line error (a corrupt or crafted file).
    """
    if not isinstance(saved, dict):
        raise CheckpointError("the checkpoint's config is not a dict: the file is corrupt or not mvGPT's")
    known = {f.name: f.default for f in fields(GPTConfig)}
    missing = sorted(known.keys() - saved.keys())
    if missing:
        log.warning("checkpoint config has no %s: using defaults (%s)", ", ".join(missing),
                    ", ".join(f"{m}={known[m]!r}" for m in missing))
    values = {k: v for k, v in saved.items() if k in known}
    for name, value in values.items():
        kind, number = type(known[name]), isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind is bool:
            sane = isinstance(value, bool)
        elif kind is int:
            sane = number and isinstance(value, int) and value >= 1
        elif kind is float:
            sane = number and math.isfinite(value) and value > 0
        else:
            sane = True  # a field of another kind checks itself in GPTConfig
        if not sane:
            raise CheckpointError(f"the checkpoint's config has {name}={value!r}, which no model can have: "
                                  "the file is corrupt or crafted; use another checkpoint")
    try:
        return GPTConfig(**values)
    except (TypeError, ValueError, ZeroDivisionError) as e:
        raise CheckpointError(f"the checkpoint's config is inconsistent ({e}): use another checkpoint") from None


def memory_bytes() -> int | None:
    """This machine's memory, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_fits(config: GPTConfig, weights: dict, file: Path) -> None:
    """Before allocating: a model this size (weights, a KV cache of two windows) fits in memory,
    and the weights hold at least a tensor per block (a block count no file backs is crafted)."""
    kv = 2 * config.n_layer * 2 * config.block_size * config.n_embd * 4  # keys and values, float32
    need = 4 * (config.vocab_size + config.block_size + 12 * config.n_layer * config.n_embd) * config.n_embd + kv
    have = memory_bytes()
    if config.n_layer > len(weights):
        raise CheckpointError(f"checkpoint {file} does not match its config ({config.n_layer} blocks from "
                              f"{len(weights)} tensors): the file is crafted or corrupt; use another checkpoint")
    if have is not None and need > have:
        raise CheckpointError(f"checkpoint {file} asks for {need / 2**30:,.1f} GiB (n_layer={config.n_layer}, "
                              f"n_embd={config.n_embd}, block_size={config.block_size}), more than this "
                              f"machine's {have / 2**30:,.0f} GiB: the file is crafted or corrupt")


def load_model(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    tokenizer_hash: str | None = None,
) -> tuple[GPT, dict]:
    """Rebuild a checkpoint's model on device (eval mode); returns (model, the checkpoint dict).

    With tokenizer_hash (the one in data/), a checkpoint trained with another tokenizer is refused.
    """
    state = read_checkpoint(path)  # into CPU memory; the model goes to device once built
    saved = state.get("tokenizer_hash")
    if tokenizer_hash is not None and saved is not None and saved != tokenizer_hash:
        raise CheckpointError(
            f"checkpoint {checkpoint_path(path)} was trained with tokenizer {saved}, but data/ has "
            f"{tokenizer_hash}: prepare the data it was trained on, or pass --data-dir"
        )
    config = config_from_dict(state["config"])
    if not isinstance(state["model"], dict):
        raise CheckpointError(f"{checkpoint_path(path)} is not an mvGPT checkpoint (its model is not a dict)")
    check_fits(config, state["model"], checkpoint_path(path))
    model = GPT(config)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        raise CheckpointError(
            f"checkpoint {checkpoint_path(path)} does not match its config ({str(e).splitlines()[0]})"
        ) from None
    return model.to(device).eval(), state
