"""The docs, checked as a reader meets them: the site built strictly and every page of its navigation loaded in
headless Chromium with no network (formulas typeset in the shipped math font, figures loaded, nothing wider than
the content column at 1280 px, every link and anchor leading to a file of the site, so it works opened from
disk); and, without building, every page's text: no commit hash, no machine-local path, every code excerpt still
naming a definition of its file, and the README within its goals (dev/readme_stats.py).

Each page gets a small script that measures it once everything has loaded and writes what it found into
the page; `chromium --dump-dom` prints the page, and we read it back. Needs Debian's chromium
(`apt-get install -y chromium`) and the docs extra (`pip install -e '.[docs]'`).

Examples:
    python dev/check_docs.py                # all of it: the text, then a strict build and every page in Chromium
    python dev/check_docs.py --text         # the text only: hashes, paths, excerpts, the README (seconds)
    python dev/check_docs.py --site site    # check a site already built with `mkdocs build`
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import readme_stats

ROOT = Path(__file__).resolve().parents[1]

MATH_FONT = "Noto Sans Math"  # docs/assets/fonts, declared in docs/stylesheets/extra.css
LOCAL_PATH = re.compile(r"(?<![\w.~-])(?:/tmp|/work|/root|/home|/Users|/mnt|/var/tmp)/|(?:\.\./)*shared/data/|"
                        r"[A-Z]:\\\\")
HEX = re.compile(r"(?<![\w./-])[0-9a-f]{7,40}(?![\w-])")
COMMIT_WORD = re.compile(r"\bcommits?\s+`?[0-9a-f]{7,40}\b")
EXCERPT = re.compile(r'^[ \t]*--8<-- "(?P<path>[\w./-]+\.py):(?P<name>[\w.]+)"[ \t]*$', re.M)
WIDTH = 1280
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",  # no network, whatever a page asks
         f"--window-size={WIDTH},900", "--virtual-time-budget=10000", "--dump-dom"]

# Runs once the page and its images have loaded; writes its findings into <pre id="docs-check">.
PROBE = """<script>
window.addEventListener("load", () => {
  const problems = [];
  const column = document.querySelector("article.md-content__inner") || document.body;
  const room = column.clientWidth - parseFloat(getComputedStyle(column).paddingLeft)
             - parseFloat(getComputedStyle(column).paddingRight);
  const wide = (what, w, el) => problems.push(`${what} ${Math.round(w)} px wide in a ${Math.round(room)} px column: `
                                             + name(el));
  const name = (el) => (el.textContent || "").trim().replace(/\\s+/g, " ").slice(0, 60);
  const formulas = column.querySelectorAll(".arithmatex");
  formulas.forEach((f) => {
    const m = f.querySelector("math");
    if (!m || m.getBoundingClientRect().width === 0) problems.push("formula not typeset: " + name(f));
    else if (m.getBoundingClientRect().width > room + 1) wide("equation", m.getBoundingClientRect().width, f);
  });
  if (/\\\\[(\\[]/.test(column.innerText)) problems.push("raw LaTeX delimiters in the text");
  column.querySelectorAll("img").forEach((img) => {
    if (!img.complete || img.naturalWidth === 0) problems.push("figure did not load: " + img.getAttribute("src"));
  });
  column.querySelectorAll("table").forEach((t) => {
    const w = Math.max(t.getBoundingClientRect().width, t.scrollWidth);
    if (w > room + 1) wide("table", w, t.rows[0]);
  });
  if (formulas.length) {
    const faces = [...document.fonts].filter((f) => f.family.replace(/"/g, "") === "%s");
    if (!faces.some((f) => f.status === "loaded")) problems.push("the math font %s did not load");
  }
  performance.getEntriesByType("resource").forEach((r) => {
    if (!r.name.startsWith("file:")) problems.push("asked the network for " + r.name);
  });
  const pre = document.createElement("pre");
  pre.id = "docs-check";
  pre.textContent = JSON.stringify({formulas: formulas.length, images: column.querySelectorAll("img").length,
                                    tables: column.querySelectorAll("table").length, room, problems});
  document.body.appendChild(pre);
});
</script>"""
PROBE = PROBE.replace("%s", MATH_FONT)
RESULT = re.compile(r'<pre id="docs-check">(.*?)</pre>', re.S)


def find_chromium() -> str | None:
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


def check_page(chromium: str, page: Path) -> dict:
    """Load one built page (a copy with the probe in it) and return what the probe found."""
    probed = page.with_name(f".probe-{page.name}")
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    try:
        with tempfile.TemporaryDirectory() as profile:
            out = subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", probed.as_uri()],
                                 capture_output=True, text=True, timeout=120)
    finally:
        probed.unlink()
    found = RESULT.search(out.stdout)
    if not found:
        return {"problems": [f"the page did not report (chromium exit {out.returncode}: {out.stderr.strip()[-200:]})"]}
    return json.loads(html.unescape(found.group(1)))


def nav_files(nav: list) -> list[str]:
    """The markdown files of a nav, sections opened, in its order."""
    files = []
    for item in nav:
        value = item if isinstance(item, str) else next(iter(item.values()))
        files += nav_files(value) if isinstance(value, list) else [value]
    return files


def pages(site: Path) -> list[Path]:
    """The built pages of the nav, in its order (use_directory_urls: false, so x.md is x.html)."""
    import yaml

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    return [site / f"{f[:-3]}.html" for f in nav_files(nav)]


class Links(HTMLParser):
    """The href and src of a page, and the ids and names it defines."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs) -> None:
        a = dict(attrs)
        self.links += [a[k] for k in ("href", "src") if a.get(k)]
        self.ids |= {a[k] for k in ("id", "name") if a.get(k)}


def parsed(page: Path, cache: dict) -> Links:
    if page not in cache:
        cache[page] = Links()
        cache[page].feed(page.read_text(encoding="utf-8"))
    return cache[page]


def broken_links(site: Path, page: Path, cache: dict) -> list[str]:
    """Links of a built page that lead nowhere opened from disk: a missing file, a folder, a missing anchor."""
    problems = []
    for link in parsed(page, cache).links:
        url = urlsplit(link)
        if url.scheme or url.netloc or link.startswith(("mailto:", "data:", "javascript:")):
            continue  # another site's, or not a file
        target = (page.parent / unquote(url.path)).resolve() if url.path else page
        if not target.is_file():
            problems.append(f"link to {link}: no such file in the site")
        elif url.fragment and target.suffix == ".html" and unquote(url.fragment) not in parsed(target, cache).ids:
            problems.append(f"link to {link}: no such anchor")
    return problems


def page_problems(name: str, text: str, known: set[str]) -> list[str]:
    """One page's markdown: machine-local paths, commit hashes (a word 'commit' before hex, or hex that names a
    commit of `known`), and code excerpts whose file no longer defines their name."""
    import mkdocs_source

    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        for m in LOCAL_PATH.finditer(line):
            problems.append(f"{name}:{number}: a machine-local path ({line[m.start():m.start() + 30]!r})")
        hashes = [h for h in HEX.findall(line) if any(k.startswith(h) for k in known)]
        hashes += [m.group().split()[-1].strip("`") for m in COMMIT_WORD.finditer(line)]
        problems += [f"{name}:{number}: a commit hash ({h})" for h in dict.fromkeys(hashes)]
    for m in EXCERPT.finditer(text):
        try:
            mkdocs_source.definition(ROOT / m["path"], m["name"])
        except (KeyError, OSError, SyntaxError) as e:
            problems.append(f"{name}: the excerpt {m['path']}:{m['name']}: {e}")
    return problems


def text_problems() -> list[str]:
    """Every page's markdown (docs/, its generated tables, the README), and the README against its goals."""
    known = commits()
    problems = [p for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
                for p in page_problems(path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8"), known)]
    if readme_stats.main([]) != 0:
        problems.append("README.md misses a goal of dev/readme_stats.py (above)")
    return problems


def commits() -> set[str]:
    """Every commit of the repository (none outside a git checkout)."""
    out = subprocess.run(["git", "rev-list", "--all"], cwd=ROOT, capture_output=True, text=True)
    return set(out.stdout.split()) if out.returncode == 0 else set()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--site", help="a site already built (default: build one into a temporary folder)")
    p.add_argument("--text", action="store_true", help="only the pages' text: no build, no browser")
    args = p.parse_args(argv)
    failed = 0
    for problem in text_problems():
        print(problem)
        failed += 1
    if args.text:
        return 1 if failed else 0
    chromium = find_chromium()
    if chromium is None:
        print("error: no chromium on PATH: apt-get install -y chromium", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(args.site) if args.site else Path(tmp) / "site"
        if not args.site:
            build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir",
                                    str(site)], cwd=ROOT, capture_output=True, text=True)
            if build.returncode:
                print(f"error: mkdocs build --strict failed:\n{build.stderr.strip()}", file=sys.stderr)
                return 1
        cache: dict = {}
        for page in pages(site):
            found = check_page(chromium, page)
            found["problems"] += broken_links(site, page, cache)
            name = page.relative_to(site)
            for problem in found["problems"]:
                print(f"{name}: {problem}")
            failed += bool(found["problems"])
            if not found["problems"]:
                print(f"{name}: {found['formulas']} formulas, {found['images']} figures, {found['tables']} tables "
                      f"fit the {found['room']:.0f} px column; its links lead to files of the site")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
