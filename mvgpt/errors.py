"""The edges of every script: flags checked as they are parsed, and a user's trouble as one line.

A mistake of the user's or of the machine's (a bad flag, a missing file, no permission, a full
disk, Ctrl-C) ends with one line on stderr naming the problem and the fix, and a non-zero exit.
A bug in our code keeps its traceback: that is what a bug report needs.

    p = ArgumentParser(description=__doc__)
    p.add_argument("--batch-size", type=positive_int, default=16)
    p.add_argument("--json", type=writable_file)
    ...
    if __name__ == "__main__":
        run_main(main)
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


def _number(text: str, kind: type) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a {'whole ' if kind is int else ''}number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = _number(text, int)
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is too small: give {low} or more")
        return value

    parse.__name__ = f"integer >= {low}"  # argparse names the type in its messages
    return parse


positive_int = at_least(1)
non_negative_int = at_least(0)


def positive_float(text: str) -> float:
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not above 0: give a positive number")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative: give 0 or more")
    return value


def share(text: str) -> float:
    """A fraction in [0, 1]."""
    value = _number(text, float)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 1")
    return value


def writable_file(text: str) -> str:
    """An output file we will be able to write, checked now (not after the work): its nearest
    existing folder takes a test file (removed at once); nothing is created."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder: give a file name")
    folder = path.absolute().parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: {folder} is a file, not a folder")
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot write {text} ({e.strerror}): pick a writable path") from None
    return text


# ----------------------------------------------------------------------------------------------
# The guard around main()

DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def os_error_line(e: OSError) -> str | None:
    """One line for an OSError caused by the user's files or the machine; None for anything else."""
    where = f" ({e.filename})" if e.filename else ""
    if e.errno in DISK_FULL:
        return f"the disk is full{where}: free some space (or write elsewhere) and run again"
    if isinstance(e, PermissionError) or e.errno == errno.EROFS:
        return f"{e.strerror}{where}: pick a path you can write, or fix its permissions"
    if isinstance(e, (FileNotFoundError, NotADirectoryError, IsADirectoryError)) and e.filename:
        return f"{e.strerror}: {e.filename}: check the path"
    return None


def run_main(main: Callable[[], object], interrupted: str = "run the command again to start over") -> None:
    """Run a script's main(); the user's and the machine's errors become one line on stderr."""
    try:
        main()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the message
        sys.stderr.write(f"interrupted (Ctrl-C): {interrupted}\n")
        raise SystemExit(130) from None
    except BrokenPipeError:  # `... | head`: the reader left; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None
    except OSError as e:
        line = os_error_line(e)
        if line is None:
            raise
        sys.stderr.write(f"error: {line}\n")
        raise SystemExit(1) from None
