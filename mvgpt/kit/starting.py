"""Imported first by every script, before torch: a Ctrl-C while torch loads (a second or two) ends the
script with one line, as run_main does once main() runs, not with a traceback from inside torch's import.

Only a script run from scripts/ is touched: a test or a notebook importing mvgpt keeps its own Ctrl-C."""

from __future__ import annotations

import signal
import sys
from pathlib import Path


def interrupted(signum: int, frame: object) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the line short
    sys.stderr.write("interrupted (Ctrl-C) while starting: nothing was changed\n")
    raise SystemExit(130)


def is_script() -> bool:
    return Path(getattr(sys.modules["__main__"], "__file__", None) or "").parent.name == "scripts"


if is_script() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, interrupted)
