"""What the workshop's scripts share: the repository's root, and the pipeline's scripts as modules.

A workshop script runs as `python dev/NAME.py` from a checkout, with mvgpt installed (`pip install -e .`).
Some drive a step of the pipeline in the same process: the benchmark's training step, the live server,
a script's own table printer. `script("serve")` imports scripts/serve.py as `python scripts/serve.py`
sees itself: with scripts/ on the path, so that its own imports of its siblings (`from context import
...`) work. This is the one place in dev/ that puts a folder on the path; `test_module` does the same
for tests/ (the errors page is made from the tests' own tables).

Example:
    from workshop import script
    serve = script("serve")
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _module(folder: Path, name: str) -> ModuleType:
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return importlib.import_module(name)


def script(name: str) -> ModuleType:
    """scripts/<name>.py as a module (its main() not run)."""
    return _module(ROOT / "scripts", name)


def test_module(name: str) -> ModuleType:
    """tests/<name>.py as a module, with conftest beside it."""
    return _module(ROOT / "tests", name)
