"""Atomic writes: a file is either its old self or complete, never half-written.

The bytes go to a temporary file beside the target, `.NAME.tmpPID`, renamed over it when complete.
A process killed mid-write (kill -9, a power cut) leaves its temporary file behind: the next write
of the same file removes it, once its process is gone.
"""

from __future__ import annotations

import glob
import json
import os
from contextlib import contextmanager
from pathlib import Path


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
    """Yield a temporary path beside `path`; on success it replaces `path` in one step."""
    path = Path(path)
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
