"""Write docs/errors.md: every bad input in tests/test_cli_errors.py's table, run, with what it got, then
every way to lose work in tests/test_nothing_lost.py's table, the same way.

    python dev/errors_page.py        # a few minutes: builds the tests' worlds in a temporary folder
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

sys.path.insert(0, str(ROOT / "scripts"))

from test_cli_errors import page, run_all  # noqa: E402
from test_nothing_lost import harm_page  # noqa: E402
from test_nothing_lost import run_all as run_harms  # noqa: E402

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "cli").mkdir()
        (Path(tmp) / "harm").mkdir()
        text = page(run_all(Path(tmp) / "cli")) + harm_page(run_harms(Path(tmp) / "harm"))
    (ROOT / "docs" / "errors.md").write_text(text, encoding="utf-8")
    print(f"wrote docs/errors.md ({text.count(chr(10))} lines)")
