"""The docs site: formulas typeset at build time (dev/mkdocs_math.py), code excerpts read from the source by name
and a page per source file (dev/mkdocs_source.py), every page's text free of commit hashes and machine paths, the
README within its goals (dev/readme_stats.py), and every page checked in headless Chromium, offline
(dev/check_docs.py): formulas typeset in the shipped font, figures loaded, nothing wider than the column, every
link leading to a file of the site."""

from __future__ import annotations

import shutil
from pathlib import Path

import check_docs
import pytest
import readme_stats

ROOT = Path(__file__).resolve().parents[1]

needs_docs = pytest.mark.extra("docs")  # mkdocs, its theme, latex2mathml (tests/conftest.py)
needs_chromium = pytest.mark.browser  # skipped without Debian's chromium (tests/conftest.py)


class Page:
    class file:  # noqa: N801 (mkdocs' Page.file.src_path, as the hook reads it)
        src_path = "page.md"


@needs_docs
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
@needs_docs
def test_every_page_of_the_site_passes_in_headless_chromium(capsys):
    assert check_docs.main([]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    rope = next(line for line in out.splitlines() if line.startswith("rope.html"))
    assert " 0 formulas" not in rope and " 0 figures" not in rope  # the checks ran on real content
    assert out.count("its links lead to files of the site") == len(check_docs.pages(Path("site")))


@needs_docs
def test_an_excerpt_is_the_named_definition_with_its_comment_and_the_files_own_line_numbers(tmp_path):
    import mkdocs_source
    from mkdocs.exceptions import PluginError

    source = ROOT / "mvgpt" / "model.py"
    lines = source.read_text().splitlines()
    decorated = tmp_path / "decorated.py"  # a method with the comment that says why and a decorator above it
    decorated.write_text("class Cache:\n    # why: a comment\n    @staticmethod\n    def update(k):\n"
                         "        return k\n")
    first, last, code = mkdocs_source.definition(decorated, "Cache.update")
    assert (first, last, code) == (2, 5, "# why: a comment\n@staticmethod\ndef update(k):\n    return k")
    first, last, code = mkdocs_source.definition(source, "GPT.generate")  # the model's own: a decorator
    assert lines[first - 1] == "    @torch.no_grad()" and code.startswith("@torch.no_grad()\ndef generate(")
    assert code.splitlines()[-1] == lines[last - 1][4:]  # dedented, to its end
    first, _, code = mkdocs_source.definition(source, "rotary")
    assert lines[first - 1] == "def rotary(" and code.startswith("def rotary(")
    _, _, code = mkdocs_source.definition(ROOT / "scripts" / "context.py", "LOSS_METHODS")  # a module-level name
    assert code.startswith("LOSS_METHODS") and code.rstrip().endswith("}")
    with pytest.raises(KeyError, match="mvgpt/model.py defines no KVCache.gone"):
        mkdocs_source.definition(source, "KVCache.gone")

    class Page:
        class file:  # noqa: N801
            src_uri = "lab/page.md"

    text = ('See [the model](../../mvgpt/model.py) and [a page](../rope.md).\n\n'
            '- a list item:\n\n    --8<-- "mvgpt/model.py:rotate"\n')
    out = mkdocs_source.on_page_markdown(text, Page, None, None)
    first, last, _ = mkdocs_source.definition(source, "rotate")
    assert out.startswith("See [the model](../code/mvgpt/model.py.md) and [a page](../rope.md).")
    assert f"    [`mvgpt/model.py`, lines {first}–{last}](../code/mvgpt/model.py.md#__codelineno-0-{first})" in out
    assert f'    ```python linenums="{first}"\n    def rotate(' in out  # indented as the line it replaced
    with pytest.raises(PluginError, match=r"lab/page.md: the excerpt mvgpt/model.py:nothing: "):
        mkdocs_source.on_page_markdown('--8<-- "mvgpt/model.py:nothing"\n', Page, None, None)
    assert mkdocs_source.fence("a ``` b") == "````"  # a code page's fence outlasts the file's own backticks


@needs_docs  # dev/mkdocs_source.py reads mkdocs' own errors
def test_the_text_check_finds_commit_hashes_local_paths_and_stale_excerpts():
    known = {"0123abc4567def0123abc4567def0123abc4567d"}
    page = ("at commit 45bf864 the run\n"                       # 'commit' and hex: a hash, known or not
            "it is 0123abc in the history\n"                    # a short hash of a known commit
            "tokenizer hash cc5457060945996b, step 1234567\n"   # hex that is no commit: fine
            "python x.py --out /tmp/run --data ../shared/data/tinystories\n"
            '--8<-- "mvgpt/model.py:slide_away"\n')
    problems = check_docs.page_problems("p.md", page, known)
    assert problems == ["p.md:1: a commit hash (45bf864)", "p.md:2: a commit hash (0123abc)",
                        "p.md:4: a machine-local path ('/tmp/run --data ../shared/data')",
                        "p.md:4: a machine-local path ('../shared/data/tinystories')",
                        "p.md: the excerpt mvgpt/model.py:slide_away: 'mvgpt/model.py defines no slide_away'"]
    assert check_docs.text_problems() == []  # the committed pages and README pass


def test_readme_stats_count_words_sentences_and_the_first_episode_command(tmp_path, capsys):
    text = ("# Title\n\nOne two three. Four five six seven!\n\n- An item [with a link](http://x) here\n"
            "| a | table | row |\n\n```bash\npython scripts/pretrain.py --rope   # not prose\n```\n")
    s = readme_stats.stats(text)
    assert s["sentences"] == 3 and s["mean_sentence"] == (3 + 4 + 6) / 3 and s["longest_sentence"] == 6
    assert s["first_episode_command_line"] == 9 and s["words"] == len(text.split())
    readme = tmp_path / "README.md"
    readme.write_text(text)
    assert readme_stats.main(["--readme", str(readme)]) == 0
    assert readme_stats.main(["--readme", str(readme), "--max-command-line", "8"]) == 1
    assert readme_stats.main(["--readme", str(readme), "--max-mean-sentence", "4.3"]) == 1
    out = capsys.readouterr().out
    assert "MISS first episode command at line 9 (goal <= 8)" in out
    assert "MISS mean sentence: 4.3 words over 3 sentences, the longest 6" in out
    assert readme_stats.main([]) == 0  # the README itself meets its goals
