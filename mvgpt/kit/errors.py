"""The edges of every script: flags checked as they are parsed, and a user's trouble told in one line.

A mistake of the user's or of the machine's (a bad flag, a missing file, no permission, a full
disk, Ctrl-C) ends with one line on stderr naming the problem and the fix, and a non-zero exit.
A bug in our code keeps its traceback: that is what a bug report needs. A script does
`p = ArgumentParser(...)`, `p.add_argument("--batch-size", type=positive_int)`, and ends with
`run_main(main)`.
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from mvgpt.kit import starting


class UserError(SystemExit):
    """Something the user can fix: `error: message` on stderr and exit 1, also inside main()."""

    def __init__(self, message: str) -> None:
        super().__init__(f"error: {message}")


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with a bad flag told in one line (not the usage block), exit 2."""

    def error(self, message: str) -> None:
        sys.stderr.write(f"error: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)


# ----------------------------------------------------------------------------------------------
# argparse `type=` checks: each returns the value, or says what is wrong and what would do


def number(kind: type, ok: Callable[[float], bool], wanted: str) -> Callable[[str], int | float]:
    """A finite int or float for which ok(value) holds; otherwise `... : give {wanted}`."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number: give {wanted}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text} is not a finite number: give {wanted}")
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{text} is out of range: give {wanted}")
        return value

    parse.__name__ = wanted  # argparse names the type in its own messages
    return parse


def at_least(low: int) -> Callable[[str], int]:
    return number(int, lambda v: v >= low, f"a whole number >= {low}")


positive_int = at_least(1)
non_negative_int = at_least(0)
positive_float = number(float, lambda v: v > 0, "a number above 0")
non_negative_float = number(float, lambda v: v >= 0, "a number >= 0")
share = number(float, lambda v: 0 <= v <= 1, "a number from 0 to 1")
seed = number(int, lambda v: 0 <= v < 2**63, "a whole number from 0 to 2**63 - 1")  # what torch's generators take


def positive_ints(text: str) -> list[int]:
    """A comma-separated list of whole numbers >= 1, e.g. 1,8,32."""
    return [positive_int(part) for part in text.split(",")]


def probe(text: str, folder: Path) -> None:
    """Can a file be made in folder, or in its nearest existing parent (where we would make it)?
    A test file says, and is removed at once: nothing is left behind, whatever the answer."""
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: {folder} is a file, not a folder")
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot write {text} ({e.strerror}): pick a writable path") from None


def folder_name(text: str) -> str:
    """A folder's name, not an empty one (which would quietly mean the current folder or a default)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty name: give a folder")
    return text


def writable_folder(text: str) -> str:
    """An output folder (there or to be made) we will be able to write in."""
    folder_name(text)
    if Path(text).exists() and not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file: give a folder")
    probe(text, Path(text).absolute())
    return text


# ----------------------------------------------------------------------------------------------
# The guard around main()

DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG}  # no room for what is written


def no_room(e: OSError) -> tuple[str, str]:
    """Why a write of ours found no room (e.errno in DISK_FULL, or None where a writer gave none), and the fix:
    a full disk, or a file grown past the size this system allows (`ulimit -f`, or the file system's largest)."""
    if e.errno == errno.EFBIG:
        return ("a file grew past the size this system allows (File too large: `ulimit -f`, or the file system's "
                "limit)", "raise the limit, or write elsewhere, and run again")
    return "the disk is full", "free some space and run again"


def os_error_line(e: OSError) -> str | None:
    """One line for an OSError caused by the user's files or the machine; None for anything else."""
    where = f" ({e.filename})" if e.filename else ""
    if e.errno in DISK_FULL:
        cause, fix = no_room(e)
        return f"{cause}{where}: {fix}"
    if isinstance(e, PermissionError) or e.errno == errno.EROFS:
        return f"{e.strerror}{where}: pick a path you can write, or fix its permissions"
    if isinstance(e, (FileNotFoundError, NotADirectoryError, IsADirectoryError)) and e.filename:
        return f"{e.strerror}: {e.filename}: check the path"
    return None


JOB_AGAIN = starting.JOB_AGAIN  # the main job's advice to its steps, in their environment (kit/starting.py)


def again(advice: str) -> str:
    """How to go on after a stop: this script's `advice`, or the main job's when it runs this script."""
    return os.environ.get(JOB_AGAIN) or advice


def run_main(main: Callable[[], object], interrupted: str = "run the command again to start over") -> None:
    """Run a script's main(); the user's and the machine's errors become one line on stderr."""
    interrupted = again(interrupted)
    if signal.getsignal(signal.SIGINT) is starting.interrupted:  # the imports are done: Ctrl-C is caught below
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        main()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the message short
        sys.stderr.write(f"interrupted (Ctrl-C): {interrupted}\n")
        raise SystemExit(130) from None
    except BrokenPipeError:  # `... | head`: the reader left, there is no one to tell
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None
    except OSError as e:
        line = os_error_line(e)
        if line is None:
            raise
        sys.stderr.write(f"error: {line}\n")
        raise SystemExit(1) from None
