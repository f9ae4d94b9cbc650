"""The live page's three views as pictures for docs/live.md, taken in headless Chromium with Playwright.

Starts scripts/serve.py's server in this process on the checkpoints given (a rope one first, then the one
with learned positions), then drives the page as a reader would: writes a story past the window with both
models, reads a held-out piece, turns a pair's arrow. Saves live-write.png, live-read.png and
live-angles.png into --out. Needs Debian's chromium and the dev extra (`pip install -e '.[dev]'`).

Examples:
    python dev/live_screenshots.py checkpoints/pretrain-rope checkpoints/pretrain
    python dev/live_screenshots.py /tmp/tiny-rope /tmp/tiny --data-dir /tmp/tinydata --out /tmp/shots --tokens 40
"""

from __future__ import annotations

import argparse
import shutil
import threading
from pathlib import Path

from workshop import ROOT, script

from mvgpt.checkpoint import checkpoint_arg
from mvgpt.data import DATA_DIR, prepared_data
from mvgpt.kit.errors import ArgumentParser, UserError, at_least, run_main, writable_folder

serve = script("serve")  # scripts/serve.py (dev/workshop.py)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
WAIT_MS = 20 * 60 * 1000  # the sliding window re-runs a window per token: minutes for a real model on a CPU


def shoot_write(page, out: Path, tokens: int) -> None:
    """Both models write the same story past the window; the picture is taken when they are done."""
    page.fill("#tokens", str(tokens))
    page.click("#write-go")
    page.wait_for_selector("#write[data-state=done]", timeout=WAIT_MS)
    page.screenshot(path=out / "live-write.png", full_page=True)


def shoot_read(page, out: Path, model: str, mode: str, hover: int) -> None:
    """A held-out piece coloured by the difference the episode is about, with one token's three losses."""
    page.click("button[data-view=read]")
    page.select_option("#read-model", model)
    page.click("#read-go")
    page.wait_for_selector("#read[data-state=done]", state="attached", timeout=WAIT_MS)
    page.check(f"#read-methods label:has-text('{mode}') input")
    page.hover(f"#read-text span[data-i='{hover}']")
    page.screenshot(path=out / "live-read.png", full_page=True)


def shoot_angles(page, out: Path, pair: int, ctx: int, position: int) -> None:
    """A pair's arrow at a position past the training context, and every pair's tokens per turn."""
    page.click("button[data-view=angles]")
    page.wait_for_selector("#angles[data-state=drawn]", state="attached", timeout=60_000)
    page.fill("#angles-ctx", str(ctx))
    page.dispatch_event("#angles-ctx", "change")
    page.locator("#angles-pair").fill(str(pair))  # a range input: fill sets it and fires input
    page.wait_for_selector(f"#arrow-caption:has-text('pair {pair} at position 0, asked for n_ctx {ctx}')")
    page.locator("#angles-position").fill(str(position))
    page.screenshot(path=out / "live-angles.png", full_page=True)


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs=2, type=checkpoint_arg, help="a rope run folder, then a learned one")
    p.add_argument("--data-dir", type=prepared_data, default=str(DATA_DIR))
    p.add_argument("--device", help="cpu or cuda (default: the GPU when there is one)")
    p.add_argument("--out", type=writable_folder, default=str(ROOT / "docs" / "figures"))
    p.add_argument("--tokens", type=at_least(2), default=400, help="tokens each model writes")
    p.add_argument("--pair", type=at_least(0), default=8, help="the pair whose arrow is drawn")
    args = p.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise UserError("no chromium on PATH: apt-get install -y chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise UserError("no Playwright driver: pip install -e '.[dev]' (it uses Debian's chromium)") from None

    args.max_tokens = args.tokens
    app = serve.load_app(args)
    rope = next((name for name, m in app.models.items() if m.config.rope), None)
    if rope is None:
        raise UserError("neither checkpoint is a rope model: give a rope run folder first")
    window = app.models[rope].config.block_size
    server = serve.make_server(app, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
            page.wait_for_selector("body[data-ready=yes]", state="attached")  # the models' list is in
            shoot_write(page, out, args.tokens)
            shoot_read(page, out, rope, "full − window", hover=window + window // 2)
            shoot_angles(page, out, min(args.pair, app.models[rope].config.head_size // 2 - 1), 4 * window,
                         position=window + window // 4)
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    for name in ("live-write.png", "live-read.png", "live-angles.png"):
        print(out / name)


if __name__ == "__main__":
    run_main(main)
