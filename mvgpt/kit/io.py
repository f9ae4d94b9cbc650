"""Atomic writes: a file is either its old self or complete, never half-written.

The bytes go to a temporary file beside the target, `.NAME.tmpPID`, renamed over it when complete.
A process killed mid-write (kill -9, a power cut) leaves its temporary file behind: the next write
of the same file removes it, once its process is gone.

A torch state file (a checkpoint, a LoRA adapter) is written the same way, and read with
weights_only=True (tensors and plain values: no pickled code runs), its zip records' checksums
checked first, so a flipped bit on disk is told as damage, never loaded as weights.
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import zipfile
from contextlib import contextmanager
from pathlib import Path

import torch

from mvgpt.kit.errors import DISK_FULL, UserError, no_room


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_stale_temps(path: str | os.PathLike) -> list[Path]:
    """Remove the temporary files of `path` left by processes that died; returns them."""
    path = Path(path)
    stale = []
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.tmp*"):
        pid = tmp.name.rpartition(".tmp")[2]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            tmp.unlink(missing_ok=True)
            stale.append(tmp)
    return stale


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside `path`; on success it replaces `path` in one step. A symbolic link is
    written through: its target is replaced, and the link stays a link."""
    path = Path(os.path.realpath(path)) if Path(path).is_symlink() else Path(path)
    if path.exists() and not path.is_file():  # a device, a pipe: nothing to replace in one step
        raise UserError(f"{path} is not a file (a device or a pipe): give a file to write")
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike, data) -> None:
    """A script's --json output, atomically (its folder made if needed)."""
    write_text_atomic(path, json.dumps(data, indent=1, ensure_ascii=False) + "\n")


# ----------------------------------------------------------------------------------------------
# Torch state files: checkpoints and adapters


class CheckpointError(UserError):
    """`error: ...` in one line: what is wrong with a checkpoint, and what to do."""


def write_state(path: Path, state: dict, what: str) -> Path:
    """torch.save(state) to path atomically; a full disk or a folder we may not write is one line,
    and the previous file, if any, is kept. Adapters (mvgpt/lora.py) are written the same way."""
    try:  # through our own file object, so a full disk is mostly an OSError (ENOSPC)
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            torch.save(state, f)
    except OSError as e:
        if e.errno in DISK_FULL:
            cause, fix = no_room(e)
            raise CheckpointError(f"{cause}: {path} not saved (the previous {what}, if any, is kept): {fix}") from None
        raise CheckpointError(f"cannot write {path} ({e.strerror}; the previous {what}, if any, is kept): "
                              "pick a folder you can write, or fix its permissions") from None
    except RuntimeError as e:  # torch's zip writer, when a write fails inside it ("unexpected pos", ...)
        if "inline_container" not in str(e) and "PytorchStreamWriter" not in str(e):
            raise
        if free_bytes(path.parent) < MIN_FREE:
            raise CheckpointError(f"the disk is full: {path} not saved (the previous {what}, if any, is kept): free "
                                  "some space and run again") from None
        raise CheckpointError(f"cannot write {path} (torch's writer stopped: {clip(str(e).splitlines()[0], 100)}; the "
                              f"previous {what}, if any, is kept): check the disk, and run again") from None
    return path


MIN_FREE = 64 << 20  # bytes: with less free than this, a failed write of a checkpoint is told as a full disk


def free_bytes(folder: Path) -> int:
    """The bytes free to us on the disk that holds folder (a large number where the OS does not say)."""
    try:
        stat = os.statvfs(folder)
    except (OSError, AttributeError):
        return 1 << 62
    return stat.f_bavail * stat.f_frsize


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


def clip(text: str, limit: int = 120) -> str:
    """text, or its first words up to `limit` characters and "...": a quoted message cut at a word."""
    if len(text) <= limit:
        return text
    cut = text[:limit + 1].rsplit(" ", 1)[0] if " " in text[:limit + 1] else text[:limit]
    return cut.rstrip(" ,;:") + " ..."


def load_state(file: Path, map_location: str | torch.device, what: str, fix: str) -> object:
    """torch.load with weights_only=True (tensors and plain values: no pickled code runs), into CPU
    memory, then moved to map_location; a damaged file is one line naming `what` it is and the `fix`."""
    damage = archive_damage(file)
    if damage is not None:
        raise CheckpointError(f"{what} {file} is damaged on disk ({clip(damage)}): {fix}")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError, IndexError,
            KeyError, TypeError, AttributeError) as e:  # text or a torn pickle: the unpickler fails in many ways
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if first.startswith("Weights only load failed"):  # torch's advice to unpickle anyway: not for us
            first = "not tensors and plain values only"
        raise CheckpointError(f"{what} {file} is truncated or corrupt ({clip(first)}): {fix}") from None
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


def first_non_finite(tensors: dict[str, torch.Tensor]) -> str | None:
    """The name of the first tensor holding a NaN or an infinity (None when all are finite): weights
    like that read, write and export as nonsense, so a loader refuses them in one line."""
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not t.is_meta and \
                not bool(torch.isfinite(t).all()):  # a meta tensor holds no values to check
            return name
    return None
