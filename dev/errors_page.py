"""Write docs/errors.md: every bad input in tests/test_cli_errors.py's table, run, with what it got.

    python dev/errors_page.py        # about a minute: builds the test's world in a temporary folder
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_cli_errors import page, run_all  # noqa: E402

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        text = page(run_all(Path(tmp)))
    (ROOT / "docs" / "errors.md").write_text(text, encoding="utf-8")
    print(f"wrote docs/errors.md ({text.count(chr(10))} lines)")
