"""A run folder: what may write into it, and one writer at a time.

Every script that writes a folder or a file (pretrain, finetune and its --merge, export,
export_check, prepare, main) asks first:
- `claim(folder, ...)`: a folder may be written when it is empty or new, or when it holds what
  this command makes and the flag that means it is given (--resume continues it, --overwrite
  replaces it). A folder holding another kind of thing (a LoRA run under pretrain's --out-dir,
  prepared data under an export) is refused in one line, whatever the flags, and so is a folder
  or file the command reads: --overwrite never means the input.
- `claim_file(path, ...)`: the same for one output file (a GGUF export, a --json summary), checked
  against what the command reads and against what it is making (a --json inside the new run).

A training writer holds its folder's `RunLock` while it runs: a second one is refused. The lock
names its process and that process's start time, so a lock left by a process that is gone, or
whose number the system has since given to another process, is recognised and taken over.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from mvgpt.kit.errors import UserError, probe, writable_folder
from mvgpt.kit.io import pid_alive

# ----------------------------------------------------------------------------------------------
# What a folder holds, told by its files

LOCK_NAME = "lock"
PID_MAX = 2**22  # Linux's largest process number (/proc/sys/kernel/pid_max can be at most this)
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
    if names == {"log.jsonl"} and _run_log(folder / "log.jsonl"):
        return "log", KINDS["log"]
    shown = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
    return "files", f"files of its own ({shown})"


def run_folders(folder: str | os.PathLike) -> list[str]:
    """The names of the folders in `folder` that hold a run (a checkpoint or an adapter): a checkpoints/ folder."""
    try:
        return sorted(d.name for d in Path(folder).iterdir() if (holds(d) or ("",))[0] in ("checkpoint", "lora"))
    except (FileNotFoundError, NotADirectoryError):
        return []


def named(names: list[str], most: int = 3) -> str:
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "")


def _run_log(path: Path) -> bool:
    """Is this log.jsonl a run's (its first line a record with a step), not someone's file of that name?"""
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline()
        record = json.loads(first) if first.strip() else {}
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(record, dict) and (not first.strip() or "step" in record)


def own_files(kind: str) -> set[str]:
    """The names of the files a folder of this kind writes itself (run, adapter, data, export)."""
    return {"lora": RUN_FILES, "checkpoint": RUN_FILES, "log": RUN_FILES, "data": DATA_FILES,
            "export": EXPORT_FILES}.get(kind, set())


def part_of(path: str | os.PathLike) -> str | None:
    """How to name what `path` belongs to, when it is one of a run's, an export's or the data's own
    files (e.g. checkpoints/pretrain/ckpt.pt, data/meta.json); None for any other file."""
    path = Path(path)
    found = holds(path.parent)
    if found is None:
        return None
    kind, desc = found
    return f"{desc} in {path.parent}" if path.name in own_files(kind) else None


def not_json(path: Path) -> bool:
    """A file there already whose first characters are not JSON's: someone's text, a checkpoint, a script."""
    try:
        with open(path, "rb") as f:
            head = f.read(256).lstrip()
    except OSError:
        return False
    return bool(head) and head[:1] not in (b"{", b"[")


def writable_file(text: str) -> str:
    """An output file we will be able to write, checked now rather than after the work; never one of
    a run's, an export's or the data's own files (a --json over data/meta.json would damage it), and
    never a file that is not JSON already: --json replaces an earlier summary, not a user's file."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty name: give a file name")
    if Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder: give a file name")
    target = Path(os.path.realpath(text))  # a link is written through, to the file it names
    if target.exists() and not target.is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a file (a device or a pipe): give a file name")
    owner = part_of(target)
    if owner is not None:
        raise argparse.ArgumentTypeError(f"{text} is part of {owner}: pick another file")
    if target.is_file() and not_json(target):
        raise argparse.ArgumentTypeError(f"{text} is there already and is not JSON: it is replaced only when it "
                                         "is an earlier summary: pick another file")
    probe(text, target.parent)
    return text


def tensorboard_folder(text: str) -> str:
    """--runs-dir: a folder we can write, of TensorBoard's own: never a run's, the data's or an export's."""
    writable_folder(text)
    found = holds(text)
    if found is not None and found[0] not in ("files", "job"):
        raise argparse.ArgumentTypeError(f"{text} holds {found[1]}: give TensorBoard a folder of its own (runs, "
                                         "the default)")
    return text


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
    if found is None:
        return
    what, desc = found
    if what == "log" and kind in ("checkpoint", "lora"):  # a run stopped before its first save: its log is kept
        if overwrite:  # unless asked: the run starts again, and its log with it
            return
        raise UserError(f"{folder} holds {desc} (a run stopped before its first save): start it again with "
                        f"{overwrite_flag}, which replaces its log, or pick another folder")
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
        clash = sorted(_names(folder) & own_files(kind))  # what --overwrite would replace of the user's
        replaces = f" (it replaces their {', '.join(clash)})" if clash else ""
        raise UserError(f"{folder} is not empty, it holds {desc}: pick a new or empty folder, or pass "
                        f"{overwrite_flag} to write there anyway{replaces}")
    raise UserError(f"{folder} holds {desc}, not {KINDS.get(kind, kind)}: pick another folder "
                    f"({overwrite_flag} only replaces the same kind)")


def claim_file(
    path: str | os.PathLike,
    flag: str,
    *,
    overwrite: bool = True,
    overwrite_flag: str = "--overwrite",
    reads: dict[str, str | os.PathLike | None] | None = None,
    making: list[tuple[str, str | os.PathLike, str | None]] = (),
) -> None:
    """Refuse, in one line, to write the file `path` when it is an input (`reads`), one of a run's,
    an export's or the data's own files, a folder, or (overwrite False) a file already there; and
    when it lands on what the same command is making (`making`: (what, path, kind) each: a folder of
    that kind, or a file where kind is None): that file or folder, or a file of the folder's own (a
    --json summary over the checkpoint the run is about to write)."""
    path = Path(path)
    named = f"{flag} {path}" if flag.startswith("-") else str(path)
    real = Path(os.path.realpath(path))  # a link is written through: what counts is the file it names
    for source, other in (reads or {}).items():
        if other is not None and _same(path, other):
            raise UserError(f"{named} is read as {source}: writing there would replace it "
                            f"({overwrite_flag} never means an input): pick another file")
    for what, made, kind in making:
        mine = kind is not None and _same(real.parent, made) and (real.name in own_files(kind)
                                                                   or real.name.startswith("."))
        if _same(path, made) or mine:
            where = f"{what} {made}" if _same(path, made) else f"a file of {what} {made}"
            raise UserError(f"{named} is {where}, which this command writes: pick another file")
    if path.is_dir():
        raise UserError(f"{named} is a folder: give a file name")
    owner = part_of(real)
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
        """(pid, its start) the lock names; (None, None) for a lock that names no process: unreadable, or a
        number no process can have (0 and -1 would name a group of processes, and always answer)."""
        try:
            parts = self.path.read_text().split()
            pid = int(parts[0])
        except (OSError, ValueError, IndexError):
            return None, None
        if not 0 < pid <= PID_MAX:
            return None, None
        return pid, (parts[1] if len(parts) > 1 and parts[1] != "-" else None)

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
