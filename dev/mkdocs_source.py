"""An mkdocs hook: the code on the pages comes from the source files themselves, so it cannot go stale.

- A line `--8<-- "mvgpt/model.py:rotary"` (a file of the repository, a colon, then a function, class, method
  or module-level name: `KVCache.slide`, `LOSS_METHODS`) becomes that definition, with its decorators and the
  comment lines right above it, as a code block numbered with the file's own lines, under a link to them. Found
  with Python's ast, by name: the learner's code carries no markers. A name the file no longer defines stops
  the build (and `python dev/check_docs.py --excerpts` says which, without building).
- Each Python file of mvgpt/, scripts/ and dev/ gets a page of its own, `code/<path>.md`, its lines numbered
  and anchored. A link to a source file, written relative to the page as in the repository's own view
  (`[model.py](../mvgpt/model.py)` from docs/), leads there in the built site, served or opened from disk.
"""

from __future__ import annotations

import ast
import posixpath
import re
import textwrap
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("mvgpt", "scripts", "dev")  # the folders whose files get a page
CODE = "code"  # where those pages go in the site
EXCERPT = re.compile(r'^(?P<indent>[ \t]*)--8<-- "(?P<path>[\w./-]+\.py):(?P<name>[\w.]+)"[ \t]*$', re.M)
LINK = re.compile(r"\]\((?P<target>[\w./-]+\.(?:py|c))(?:#[^)\s]*)?\)")
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def defines(node: ast.AST, name: str) -> bool:
    if isinstance(node, DEFINITIONS):
        return node.name == name
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return any(isinstance(t, ast.Name) and t.id == name for t in targets)


def definition(path: Path, name: str) -> tuple[int, int, str]:
    """(first line, last line, dedented text) of `name` (dotted: a method) in the file; KeyError if absent."""
    source = path.read_text(encoding="utf-8")
    node: ast.AST = ast.parse(source)
    for part in name.split("."):
        node = next((n for n in ast.iter_child_nodes(node) if defines(n, part)), None)
        if node is None:
            raise KeyError(f"{path.relative_to(ROOT).as_posix()} defines no {name}")
    lines = source.splitlines()
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    while first > 1 and lines[first - 2].strip().startswith("#"):  # the comment that says why, right above
        first -= 1
    return first, node.end_lineno, textwrap.dedent("\n".join(lines[first - 1 : node.end_lineno]))


def excerpts(text: str) -> list[tuple[str, str]]:
    """The (path, name) of every excerpt line in a page's markdown."""
    return [(m["path"], m["name"]) for m in EXCERPT.finditer(text)]


def fence(code: str) -> str:
    """A backtick fence longer than any run of backticks in the code."""
    return "`" * max([3, *(len(run) + 1 for run in re.findall(r"`+", code))])


def code_page(path: str) -> str:
    return f"{CODE}/{path}.md"


def relative(target: str, page_uri: str) -> str:
    return posixpath.relpath(target, posixpath.dirname(page_uri) or ".")


def on_files(files, config, **kwargs):
    """A page of numbered lines for each source file, Python or C, in every subfolder (kept out of the
    search index)."""
    for folder in SOURCES:
        for path in sorted(p for suffix in ("*.py", "*.c") for p in (ROOT / folder).rglob(suffix)):
            name = path.relative_to(ROOT).as_posix()
            code = path.read_text(encoding="utf-8")
            f = fence(code)
            language = "c" if path.suffix == ".c" else "python"
            content = (f"---\nsearch:\n  exclude: true\n---\n\n# {name}\n\n"
                       f'{f}{language} linenums="1"\n{code.rstrip()}\n{f}\n')
            files.append(File.generated(config, code_page(name), content=content))
    return files


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    uri = page.file.src_uri

    def excerpt(m: re.Match) -> str:
        path, name, indent = m["path"], m["name"], m["indent"]
        try:
            first, last, code = definition(ROOT / path, name)
        except (KeyError, OSError, SyntaxError) as e:
            raise PluginError(f"{uri}: the excerpt {path}:{name}: {e}") from None
        link = relative(code_page(path), uri) + f"#__codelineno-0-{first}"
        f = fence(code)
        block = (f"[`{path}`, lines {first}–{last}]({link})\n\n"
                 f'{f}python linenums="{first}"\n{code}\n{f}')
        return textwrap.indent(block, indent)

    def link(m: re.Match) -> str:
        path = posixpath.normpath(posixpath.join("docs", posixpath.dirname(uri), m["target"]))
        if path.split("/")[0] not in SOURCES or not (ROOT / path).is_file():
            return m.group(0)  # not a source file of ours: mkdocs checks it as any other link
        return f"]({relative(code_page(path), uri)})"

    return LINK.sub(link, EXCERPT.sub(excerpt, markdown))
