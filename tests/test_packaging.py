"""The wheel carries the whole library: every module of every subpackage, the live page's files and the C
step's source, not only what an editable install happens to see in the checkout."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile

import pytest
from conftest import ROOT


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="building a wheel needs setuptools")
def test_a_wheel_holds_every_module_and_every_file_the_library_reads(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("mvgpt-*.whl")
    held = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("mvgpt/")}
    library = ROOT / "mvgpt"
    want = {p.relative_to(ROOT).as_posix() for p in library.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}
    assert held == want
    assert {"mvgpt/live/static/index.html", "mvgpt/perf/one_token.c", "mvgpt/export/gguf.py"} <= held
