"""A run folder: what may write into it, one writer at a time, and only what is whole and sane.

Every script that writes a folder or a file (pretrain, finetune and its --merge, export,
export_check, prepare, main) asks first:
- `claim(folder, ...)`: a folder may be written when it is empty or new, or when it holds what
  this command makes and the flag that means it is given (--resume continues it, --overwrite
  replaces it). A folder holding another kind of thing (a LoRA run under pretrain's --out-dir,
  prepared data under an export) is refused in one line, whatever the flags, and so is a folder
  or file the command reads: --overwrite never means the input.
- `claim_file(path, ...)`: the same for one output file (a GGUF export, a --json summary).

A training writer holds its folder's `RunLock` while it runs: a second one is refused. The lock
names its process and that process's start time, so a lock left by a process that is gone, or
whose number the system has since given to another process, is recognised and taken over.

What a run leaves behind must be whole and sane:
- `read_log`: log.jsonl up to the checkpoint's step; a line cut short (a full disk, a power cut:
  often a tail of NUL bytes) is dropped with a one-line note, and the log rewritten atomically.
- `LossWatch`: a checkpoint is saved only from finite weights whose loss has not run away. The
  rule: the run has diverged when the median of its last 3 training losses, or the loss of the
  weights about to be saved, is more than twice the median of the 50 losses before (a single bad
  batch is not enough; a blow-up is caught within two steps, before any save).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
from collections.abc import Iterable
from pathlib import Path

import torch

from mvgpt.kit.errors import UserError
from mvgpt.kit.io import pid_alive, write_text_atomic

# ----------------------------------------------------------------------------------------------
# What a folder holds, told by its files

LOCK_NAME = "lock"
# the files that say what a folder is, and how a message names it
KINDS = {
    "lora": "a LoRA run (adapter.pt)",
    "checkpoint": "a run (ckpt.pt)",
    "data": "prepared data (meta.json)",
    "export": "an export (config.json)",
    "job": "a main job (data/, checkpoints/)",
    "log": "a run's log, with no checkpoint yet",
}
RUN_FILES = {"ckpt.pt", "adapter.pt", "log.jsonl", LOCK_NAME}
DATA_FILES = {"meta.json", "tokenizer.json", "train.bin", "val.bin", "instruct.json", "instruct-train.bin",
              "instruct-train-mask.bin", "instruct-val.bin", "instruct-val-mask.bin"}
EXPORT_FILES = {"config.json", "model.safetensors", "generation_config.json", "tokenizer_config.json",
                "tokenizer.json", "README.md"}


def _names(folder: Path) -> set[str]:
    """The folder's entries, less what writers leave for a moment (.NAME.tmpPID, staging) and its lock."""
    try:
        return {p.name for p in folder.iterdir() if not p.name.startswith(".") and p.name != LOCK_NAME}
    except (FileNotFoundError, NotADirectoryError):
        return set()


def holds(folder: str | os.PathLike) -> tuple[str, str] | None:
    """(kind, how to name it) of what `folder` holds, or None when it is missing or empty.

    kind: lora, checkpoint, data, export, job, log, or files (anything else: the user's own)."""
    folder = Path(folder)
    names = _names(folder)
    if not names:
        return None
    if "adapter.pt" in names:
        return "lora", KINDS["lora"]
    if "ckpt.pt" in names:
        return "checkpoint", KINDS["checkpoint"]
    if names & {"meta.json", "train.bin", "val.bin"} or names == {"raw"}:
        return "data", KINDS["data"]
    if names & {"config.json", "model.safetensors"}:
        return "export", KINDS["export"]
    if {"data", "checkpoints"} <= names:
        return "job", KINDS["job"]
    if names == {"log.jsonl"}:
        return "log", KINDS["log"]
    shown = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
    return "files", f"files of its own ({shown})"


def part_of(path: str | os.PathLike) -> str | None:
    """How to name what `path` belongs to, when it is one of a run's, an export's or the data's own
    files (e.g. checkpoints/pretrain/ckpt.pt, data/meta.json); None for any other file."""
    path = Path(path)
    found = holds(path.parent)
    if found is None:
        return None
    kind, desc = found
    own = {"lora": RUN_FILES, "checkpoint": RUN_FILES, "log": RUN_FILES, "data": DATA_FILES,
           "export": EXPORT_FILES}.get(kind, set())
    return f"{desc} in {path.parent}" if path.name in own else None


def _same(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def _read_from(folder: Path, reads: dict[str, str | os.PathLike]) -> str | None:
    """The flag whose input lives in `folder` (the folder itself, or a file in it), if any."""
    for flag, path in reads.items():
        if path is None:
            continue
        path = Path(path)
        if _same(folder, path) or (not path.is_dir() and _same(folder, path.parent)):
            return flag
    return None


def claim(
    folder: str | os.PathLike,
    kind: str,
    flag: str,
    *,
    resume: bool | None = None,
    overwrite: bool = False,
    overwrite_flag: str = "--overwrite",
    reads: dict[str, str | os.PathLike | None] | None = None,
) -> None:
    """Refuse, in one line, to write `kind` into `folder` (named by `flag` in messages) unless it
    is new or empty, or holds the same kind and --resume (where the writer has one, resume not
    None) or --overwrite is given. Folders of another kind, and folders an input is read from
    (`reads`: {flag: path}), are refused whatever the flags."""
    folder = Path(folder)
    named = f"{flag} {folder}" if flag.startswith("-") else str(folder)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{named} is a file: give a folder")
    source = _read_from(folder, reads or {})
    if source is not None:
        raise UserError(f"{named} is where {source} is read from: writing there would replace it "
                        f"({overwrite_flag} never means an input): pick another folder")
    found = holds(folder)
    if found is None or (found[0] == "log" and kind in ("checkpoint", "lora")):
        return
    what, desc = found
    if what == kind:
        if resume or overwrite:
            return
        fixes = (["continue it with --resume"] if resume is not None else []) + \
                [f"{'start it again' if resume is not None else 'replace it'} with {overwrite_flag}",
                 "or pick another folder"]
        raise UserError(f"{folder} holds {desc} already: {', '.join(fixes)}")
    if what == "files":
        if overwrite:
            return
        raise UserError(f"{folder} is not empty, it holds {desc}: pick a new or empty folder, or pass "
                        f"{overwrite_flag} to write there anyway")
    raise UserError(f"{folder} holds {desc}, not {KINDS.get(kind, kind)}: pick another folder "
                    f"({overwrite_flag} only replaces the same kind)")


def claim_file(
    path: str | os.PathLike,
    flag: str,
    *,
    overwrite: bool = True,
    overwrite_flag: str = "--overwrite",
    reads: dict[str, str | os.PathLike | None] | None = None,
) -> None:
    """Refuse, in one line, to write the file `path` when it is an input (`reads`), one of a run's,
    an export's or the data's own files, a folder, or (overwrite False) a file already there."""
    path = Path(path)
    named = f"{flag} {path}" if flag.startswith("-") else str(path)
    for source, other in (reads or {}).items():
        if other is not None and _same(path, other):
            raise UserError(f"{named} is read as {source}: writing there would replace it "
                            f"({overwrite_flag} never means an input): pick another file")
    if path.is_dir():
        raise UserError(f"{named} is a folder: give a file name")
    owner = part_of(path)
    if owner is not None:
        raise UserError(f"{named} is part of {owner}: writing there would damage it; pick another file")
    if path.exists() and not overwrite:
        raise UserError(f"{path} is there already: pick a new file, or pass {overwrite_flag} to replace it")


# ----------------------------------------------------------------------------------------------
# The lock: one writer per run folder


def process_start(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, from /proc), or None where unknown.
    With its pid, it names a process: a pid the system gives out again comes with a new start."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]  # field 22, counted after the command's name


class RunLock:
    """The folder's lock file, `PID START`: a second writer is refused while the first runs. A lock
    whose process is gone (kill -9), or whose pid now names another process, is taken over, and
    said so. Taken atomically (a complete file is linked into place), released on exit."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.made_folder = False

    def __enter__(self) -> RunLock:
        if not self.folder.exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            self.made_folder = True
        me = f"{os.getpid()} {process_start(os.getpid()) or '-'}\n"
        tmp = self.folder / f".{LOCK_NAME}.tmp{os.getpid()}"
        try:
            try:
                tmp.write_text(me)
            except OSError as e:  # a full disk, a folder we may not write: before any work, in one line
                raise UserError(f"cannot take the lock {self.path} ({e.strerror}): free some space, or pick a "
                                "folder you can write") from None
            for _ in range(3):
                try:
                    os.link(tmp, self.path)
                    return self
                except FileExistsError:
                    self._take_over_if_stale()
        except BaseException:
            self._tidy()
            raise
        finally:
            tmp.unlink(missing_ok=True)
        self._tidy()
        raise UserError(f"could not take the lock {self.path}: other processes race for it; try again")

    def _take_over_if_stale(self) -> None:
        pid, start = self._holder()
        if pid is not None and pid_alive(pid):
            now = process_start(pid)
            if start is None or now is None or now == start:
                self._tidy()
                raise UserError(f"{self.folder} is in use by process {pid}: wait for it to end, or pick "
                                "another folder") from None
            why = "which is gone (its number now belongs to another process)"
        elif pid is None:
            why = "which names no process (the file is damaged)"
        else:
            why = "which is gone"
        print(f"taking over the lock {self.path} left by process {pid}, {why}" if pid is not None
              else f"taking over the lock {self.path}, {why}")
        self.path.unlink(missing_ok=True)

    def _holder(self) -> tuple[int | None, str | None]:
        try:
            parts = self.path.read_text().split()
            return int(parts[0]), (parts[1] if len(parts) > 1 and parts[1] != "-" else None)
        except (OSError, ValueError, IndexError):
            return None, None

    def _tidy(self) -> None:
        """Leave no folder made for a run that was refused."""
        if self.made_folder:
            try:
                self.folder.rmdir()
            except OSError:
                pass

    def __exit__(self, *exc) -> None:
        pid, start = self._holder()
        if pid == os.getpid() and start == process_start(pid):
            self.path.unlink(missing_ok=True)
        self._tidy()


# ----------------------------------------------------------------------------------------------
# The log: whole lines only


def read_log(path: str | os.PathLike, step: int) -> list[dict]:
    """The records of log.jsonl up to `step` (a resumed run's checkpoint), rewritten to those alone,
    so a resumed curve continues without a seam. A line cut short or padded with NUL bytes (a crash
    or a full disk while it was written) is dropped, with a one-line note."""
    path = Path(path)
    if not path.exists():
        return []
    kept, damaged = [], 0
    for line in path.read_bytes().split(b"\n"):
        line = line.strip(b"\x00 \r\t")
        if not line:
            continue
        try:
            record = json.loads(line)
            int(record["step"])
        except (ValueError, TypeError, KeyError):
            damaged += 1
            continue
        if record["step"] <= step:
            kept.append(record)
    if damaged:
        print(f"note: {path}: dropped {damaged} damaged line{'s' if damaged > 1 else ''} (cut short by a crash or "
              "a full disk); the records up to the checkpoint are kept")
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
    return kept


def append_line(path: Path, record: dict, step: int) -> None:
    """One record to log.jsonl; a full disk is one line (the checkpoint already saved is kept)."""
    try:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
    except OSError as e:
        raise UserError(f"cannot write {path} at step {step} ({e.strerror}): free some space or fix the folder, "
                        "then continue with --resume (the last checkpoint is kept)") from None


# ----------------------------------------------------------------------------------------------
# Sane weights only


def all_finite(params: Iterable[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in params)


class LossWatch:
    """Has the run diverged? The losses of recent steps against the median of those before.

    `step(loss)` after each step's forward: non-finite, or the median of the last SMOOTH losses
    more than FACTOR times the median of the WINDOW losses before them, is divergence.
    `check(loss)` before a save, with the loss of the weights about to be saved: the same bound.
    Either way the caller stops with the message, and the last checkpoint stays as it was.
    """

    WINDOW, SMOOTH, FACTOR = 50, 3, 2.0

    def __init__(self, losses: Iterable[float] = ()) -> None:
        losses = losses if isinstance(losses, (list, tuple)) else []  # a checkpoint's, maybe crafted
        self.losses = [x for x in losses if isinstance(x, (int, float)) and math.isfinite(x)][-self.WINDOW:]

    def reference(self, recent: int = 0) -> float | None:
        """The median of the WINDOW losses before the last `recent` ones (None with too few)."""
        before = self.losses[: len(self.losses) - recent] if recent else self.losses
        return statistics.median(before[-self.WINDOW:]) if len(before) >= self.SMOOTH else None

    def step(self, loss: float, at: int) -> str | None:
        """Record a step's loss; a one-line reason when the run has diverged, else None."""
        if not math.isfinite(loss):
            return f"the loss became {loss} at step {at}"
        self.losses.append(loss)
        ref = self.reference(self.SMOOTH)
        now = statistics.median(self.losses[-self.SMOOTH:])
        self.losses = self.losses[-(self.WINDOW + self.SMOOTH):]
        if ref is not None and now > self.FACTOR * ref:
            return (f"the loss ran away at step {at} (the last {self.SMOOTH} steps' median {now:.4g}, more than "
                    f"{self.FACTOR:g}x the {ref:.4g} of the steps before)")
        return None

    def check(self, loss: float, at: int) -> str | None:
        """Before a save: the loss of the weights about to be saved, against the recent median."""
        if not math.isfinite(loss):
            return f"the weights of step {at} give a loss of {loss}"
        ref = self.reference()
        if ref is not None and loss > self.FACTOR * ref:
            return (f"the weights of step {at} give a loss of {loss:.4g}, more than {self.FACTOR:g}x the recent "
                    f"median {ref:.4g}")
        return None


def diverged(reason: str, folder: Path, saved: int | None, what: str = "checkpoint") -> UserError:
    """The one line a diverging run stops with: what happened, what is kept, what to do."""
    if saved:
        return UserError(f"{reason}: the run has diverged and stops; the {what} of step {saved} in {folder} is "
                         "kept as it was: resume with a lower --lr")
    return UserError(f"{reason}: the run has diverged and stops, before any {what} was saved: run again with a "
                     "lower --lr")


def note(text: str) -> None:
    sys.stdout.write(f"note: {text}\n")
    sys.stdout.flush()


# ----------------------------------------------------------------------------------------------
# TensorBoard: a view of the run, never a reason to lose it


def _quiet_tensorboard_thread(args) -> None:
    """TensorBoard writes from a thread of its own; its OSError (a full disk) is told in one line by
    `Scalars` in the main thread, not as a second traceback from the thread."""
    if isinstance(args.exc_value, OSError) and type(args.thread).__name__ == "_AsyncWriterThread":
        return
    _previous_hook(args)


_previous_hook = None


class Scalars:
    """TensorBoard scalars under runs/<run>, or, once the disk says no (full, read-only), none: a
    one-line note, and the run goes on (log.jsonl holds every step as well)."""

    def __init__(self, folder: str | os.PathLike, purge_step: int | None) -> None:
        global _previous_hook
        import threading

        if _previous_hook is None:
            _previous_hook = threading.excepthook
            threading.excepthook = _quiet_tensorboard_thread
        self.folder, self.writer = folder, None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(folder), purge_step=purge_step)
        except OSError as e:
            self._off(e)

    def add(self, tag: str, value: float, step: int) -> None:
        if self.writer is not None:
            try:
                self.writer.add_scalar(tag, value, step)
            except OSError as e:
                self._off(e)

    def close(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except OSError as e:
                self._off(e)

    def _off(self, e: OSError) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except OSError:
                pass
        self.writer = None
        note(f"TensorBoard's log in {self.folder} is not written from here on ({e.strerror or e}): the run goes "
             "on, and log.jsonl has every step")
