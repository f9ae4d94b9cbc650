"""An mkdocs hook: the formulas typeset at build time, as MathML, so the site needs no script and no network.

pymdownx.arithmatex (generic mode) leaves each formula as its LaTeX, `\\( ... \\)` in a
<span class="arithmatex"> or `\\[ ... \\]` in a <div class="arithmatex">. This hook turns each into a
<math> element with latex2mathml (the docs extra), which browsers draw natively (MathML Core). A
command latex2mathml does not know would reach the page as raw LaTeX: the build stops instead.
"""

from __future__ import annotations

import html
import re

from latex2mathml.converter import convert
from mkdocs.exceptions import PluginError

FORMULA = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)
UNTYPESET = re.compile(r">\s*\\[A-Za-z]+")  # a LaTeX command left as text inside the MathML
# pmatrix: latex2mathml writes ( <mtable> ), and a browser stretches the parentheses only with a math font
# (OpenType MATH table), which few systems have; a class instead, whose CSS draws the brackets as borders.
AFTER_TERM = re.compile(r"(?<=</m[in]>)(<mi>(?:sin|cos|tan|exp|ln|log)</mi>)")
MATRIX = re.compile(r"<mo>&#x00028;</mo><mtable>((?:(?!<mtable>).)*?)</mtable><mo>&#x00029;</mo>", re.S)
FUNCTION = re.compile(r"<mi>(sin|cos|tan|exp|ln|log)</mi>")  # \cos a: latex2mathml puts no space after cos


def typeset(tex: str, display: bool) -> str:
    """LaTeX -> MathML; raises ValueError for LaTeX that latex2mathml would leave as text."""
    mathml = convert(tex, display="block" if display else "inline")
    mathml = FUNCTION.sub(r'<mi>\1</mi><mspace width="0.167em" />', mathml)
    mathml = AFTER_TERM.sub(r'<mspace width="0.167em" />\1', mathml)  # a cos b: a space before cos too
    mathml = MATRIX.sub(r'<mtable class="matrix">\1</mtable>', mathml)
    if UNTYPESET.search(mathml):
        raise ValueError(f"latex2mathml cannot typeset {UNTYPESET.search(mathml).group().strip('> ')} in {tex!r}")
    return mathml


def on_page_content(text: str, page, **kwargs) -> str:
    def replace(m: re.Match) -> str:
        tag, tex = m.group(1), html.unescape(m.group(2)).strip()
        try:
            return f'<{tag} class="arithmatex">{typeset(tex[2:-2], display=tag == "div")}</{tag}>'
        except ValueError as e:
            raise PluginError(f"{page.file.src_path}: {e}") from None

    return FORMULA.sub(replace, text)
