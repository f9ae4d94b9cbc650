"""Screenshots of the built docs in headless Chromium, offline, to look at what a reader sees.

Builds the site (or takes one already built), then saves one PNG per page: the page opened from disk at
1280 px wide, as tall as --height. Needs Debian's chromium (`apt-get install -y chromium`).

Examples:
    python dev/screenshots.py --out shots                          # home, episode 10 and performance
    python dev/screenshots.py --out shots --pages lab/schedule.html --height 2400
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from check_docs import FLAGS, find_chromium

ROOT = Path(__file__).resolve().parents[1]

PAGES = ["index.html", "rope.html", "performance.html"]


def shoot(chromium: str, page: Path, png: Path, width: int, height: int) -> None:
    flags = [f for f in FLAGS if f != "--dump-dom" and not f.startswith("--window-size")]
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, *flags, f"--window-size={width},{height}", "--hide-scrollbars",
                        f"--user-data-dir={profile}", f"--screenshot={png}", page.as_uri()],
                       capture_output=True, text=True, timeout=120, check=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for the PNGs")
    p.add_argument("--site", help="a site already built (default: build one into a temporary folder)")
    p.add_argument("--pages", nargs="+", default=PAGES, help="built pages, relative to the site")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=3200)
    args = p.parse_args(argv)
    chromium = find_chromium()
    if chromium is None:
        print("error: no chromium on PATH: apt-get install -y chromium", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(args.site) if args.site else Path(tmp) / "site"
        if not args.site:
            subprocess.run([sys.executable, "-m", "mkdocs", "build", "--quiet", "--site-dir", str(site)], cwd=ROOT,
                           check=True, capture_output=True)
        for name in args.pages:
            png = out / (name.replace("/", "-").removesuffix(".html") + ".png")
            shoot(chromium, site / name, png, args.width, args.height)
            print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
