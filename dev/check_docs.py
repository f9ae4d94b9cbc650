"""The docs in a real browser: build the site, load every page in headless Chromium with no network, and check
that the formulas were typeset, every figure loaded, and no table or equation is wider than the content
column at 1280 px.

Each page gets a small script that measures it once everything has loaded and writes what it found into
the page; `chromium --dump-dom` prints the page, and we read it back. Needs Debian's chromium
(`apt-get install -y chromium`) and the docs extra (`pip install -e '.[docs]'`).

Examples:
    python dev/check_docs.py                # build into a temporary folder, check every page of the nav
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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


def pages(site: Path) -> list[Path]:
    """The built pages of the nav, in its order."""
    import yaml

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    files = [next(iter(item.values())) for item in nav]
    return [site / ("index.html" if f == "index.md" else f"{f[:-3]}/index.html") for f in files]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--site", help="a site already built (default: build one into a temporary folder)")
    args = p.parse_args(argv)
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
        failed = 0
        for page in pages(site):
            found = check_page(chromium, page)
            name = page.relative_to(site)
            for problem in found["problems"]:
                print(f"{name}: {problem}")
            failed += bool(found["problems"])
            if not found["problems"]:
                print(f"{name}: {found['formulas']} formulas, {found['images']} figures, {found['tables']} tables "
                      f"fit the {found['room']:.0f} px column")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
