"""Imported first by every script, before torch: a Ctrl-C while torch loads (a second or two) ends the
script with one line, as run_main does once main() runs, not with a traceback from inside torch's import.

Only a script run from scripts/ is touched (a dev/ script asks, with guard()): a test or a notebook importing
mvgpt keeps its own Ctrl-C."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

# A step of the main job, stopped by Ctrl-C, tells the user how to go on with the job (main.py puts its own
# advice here), not with the step's command line, which the user never typed. Read by kit/errors.py's again().
JOB_AGAIN = "MVGPT_JOB_AGAIN"


def interrupted(signum: int, frame: object) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the line short
    again = os.environ.get(JOB_AGAIN)
    sys.stderr.write("interrupted (Ctrl-C) while starting: nothing was changed" + (f": {again}" if again else "")
                     + "\n")
    sys.stderr.flush()
    # Not SystemExit: raised inside an import that torch's C code runs (numpy's), it can be swallowed there,
    # and the script would go on, half-imported, with Ctrl-C ignored. Nothing is written yet: end here.
    os._exit(130)


def is_script() -> bool:
    return Path(getattr(sys.modules["__main__"], "__file__", None) or "").parent.name == "scripts"


def guard() -> None:
    """Catch Ctrl-C as above until run_main takes over: for a script outside scripts/ (dev/) that asks."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, interrupted)


if is_script():
    guard()
