"""Write docs/errors.md: every bad input in tests/test_cli_errors.py's table, run, with what it got, then
every way to lose work in tests/test_nothing_lost.py's table, the same way.

    python dev/errors_page.py        # a few minutes: builds the tests' worlds in a temporary folder
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from workshop import ROOT, script, test_module

script("pretrain")  # the tests' tables import the scripts as modules, as pytest does (dev/workshop.py)
cli_errors, nothing_lost = test_module("test_cli_errors"), test_module("test_nothing_lost")
page, run_all, harm_page, run_harms = cli_errors.page, cli_errors.run_all, nothing_lost.harm_page, nothing_lost.run_all

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "cli").mkdir()
        (Path(tmp) / "harm").mkdir()
        text = page(run_all(Path(tmp) / "cli")) + harm_page(run_harms(Path(tmp) / "harm"))
    (ROOT / "docs" / "errors.md").write_text(text, encoding="utf-8")
    print(f"wrote docs/errors.md ({text.count(chr(10))} lines)")
