"""The docs site: formulas typeset at build time (dev/mkdocs_math.py), and every page checked in headless
Chromium, offline (dev/check_docs.py): formulas typeset, figures loaded, nothing wider than the column."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "dev"))
import check_docs  # noqa: E402

needs_latex2mathml = pytest.mark.skipif(importlib.util.find_spec("latex2mathml") is None,
                                        reason="latex2mathml is in the docs extra (pip install -e '.[docs]')")
needs_chromium = pytest.mark.skipif(check_docs.find_chromium() is None,
                                    reason="no chromium on PATH (apt-get install -y chromium; .ci/run installs it)")
needs_mkdocs = pytest.mark.skipif(importlib.util.find_spec("material") is None,
                                  reason="mkdocs-material is in the docs extra (pip install -e '.[docs]')")


class Page:
    class file:  # noqa: N801 (mkdocs' Page.file.src_path, as the hook reads it)
        src_path = "page.md"


@needs_latex2mathml
def test_the_hook_turns_each_formula_into_mathml_and_stops_on_latex_it_cannot_typeset():
    import mkdocs_math
    from mkdocs.exceptions import PluginError

    text = ('<p>a <span class="arithmatex">\\(\\theta_i &lt; 1\\)</span> b</p>'
            '<div class="arithmatex">\\[\nR(\\alpha) = '
            '\\begin{pmatrix} a &amp; b \\\\ c &amp; d \\end{pmatrix}\n\\]</div>')
    out = mkdocs_math.on_page_content(text, Page)
    assert "\\(" not in out and "\\[" not in out
    inline, block = out.split("<math")[1:]
    assert 'display="inline"' in inline and "<mo>&#x0003C;</mo>" in inline  # θ_i < 1, unescaped once
    assert 'display="block"' in block and block.count("<mtr>") == 2 and '<mtable class="matrix">' in block
    with pytest.raises(PluginError, match=r"page.md: latex2mathml cannot typeset \\langle in "):
        mkdocs_math.on_page_content('<span class="arithmatex">\\(\\big\\langle q \\big\\rangle\\)</span>', Page)


@needs_chromium
def test_the_browser_check_finds_a_wide_table_a_missing_figure_and_raw_latex(tmp_path):
    page = tmp_path / "index.html"
    page.write_text('<!doctype html><html><body style="width: 600px"><article class="md-content__inner">'
                    '<span class="arithmatex">\\(x^2\\)</span><table style="width: 900px"><tr><td>wide</td></tr>'
                    '</table><img src="figures/missing.png"><img src="ok.png"></article></body></html>')
    shutil.copy(ROOT / "docs" / "figures" / "rope-rotation.png", tmp_path / "ok.png")
    found = check_docs.check_page(check_docs.find_chromium(), page)
    problems = found["problems"]
    assert any(p.startswith("formula not typeset") for p in problems)
    assert "raw LaTeX delimiters in the text" in problems
    assert "table 900 px wide in a 600 px column: wide" in problems
    assert [p for p in problems if p.startswith("figure")] == ["figure did not load: figures/missing.png"]
    assert found["images"] == 2 and not list(tmp_path.glob(".probe-*"))  # the probed copy is cleaned up


@needs_chromium
@needs_mkdocs
@needs_latex2mathml
def test_every_page_of_the_site_passes_in_headless_chromium(capsys):
    assert check_docs.main([]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    rope = next(line for line in out.splitlines() if line.startswith("rope/index.html"))
    assert " 0 formulas" not in rope and " 0 figures" not in rope  # the checks ran on real content
