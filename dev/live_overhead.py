"""What the live page costs the stream: its ms per token against context.py's for the same model and tokens.

For each checkpoint, past the window: the page writes 2 windows of tokens after a prompt of held-out text
at least a window long (so every token it writes is past the window), and context.py scores the same held-out piece of
three windows (2 windows of tokens past the first) with the way generate works for that model: the
sliding cache (rope) or the re-run window (learned positions). Both run side by side in this process,
alternating, `--repeats` times each, and the medians are compared:
- shown: the ms per token the page shows (generate's time per token, measured around each token);
- stream: the ms between two token events as a client receives them over HTTP (everything the page's
  server does per token included: the watching, the JSON, the socket);
- context.py's figure is per token it scores; its sliding cache also reads the first window one token at
  a time, 3W - 1 steps for 2W tokens, so it is compared per step (one forward pass, as the page's tokens);
- overhead = stream / context.py's ms per step - 1 (goal: 10% or less), and the first token's latency,
  request sent to first token event received (the prompt's pass included).

Examples:
    python dev/live_overhead.py checkpoints/pretrain-rope checkpoints/pretrain --json results/live-overhead.json
    python dev/live_overhead.py /tmp/tiny --data-dir /tmp/tinydata --repeats 1    # tiny, seconds
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlencode

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import context  # noqa: E402
import serve  # noqa: E402

from mvgpt.bench import machine  # noqa: E402
from mvgpt.checkpoint import checkpoint_arg  # noqa: E402
from mvgpt.data import DATA_DIR, prepared_data, windows  # noqa: E402
from mvgpt.errors import ArgumentParser, at_least, run_main, writable_file  # noqa: E402
from mvgpt.io import write_json  # noqa: E402
from mvgpt.live import Limits  # noqa: E402


def page_run(address: tuple[str, int], name: str, prompt: str, tokens: int) -> dict:
    """One story through the page's server: the client's clock at each token event, the ms the page shows."""
    conn = http.client.HTTPConnection(*address, timeout=600)
    query = urlencode({"models": name, "prompt": prompt, "tokens": tokens})
    t0 = time.perf_counter()
    conn.request("GET", f"/api/write?{query}")
    response = conn.getresponse()
    arrivals, shown, event = [], [], None
    for raw in response:  # the stream, line by line, as it comes
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: ") and event == "token":
            arrivals.append(time.perf_counter())
            shown.append(json.loads(line[6:])["ms"])
    conn.close()
    assert len(arrivals) == tokens, f"the page wrote {len(arrivals)} of {tokens} tokens"
    return {"first_token_ms": 1000 * (arrivals[0] - t0), "first_token_shown_ms": shown[0],
            "stream_ms": 1000 * (arrivals[-1] - arrivals[0]) / (tokens - 1), "shown_ms": statistics.mean(shown[1:])}


# Each of the server's requests runs on a thread of its own, and so does each of context.py's runs here: a
# thread's OpenMP workers keep spinning for a while after its work, so whichever ran second on another thread
# would pay for the first one's; a pause between runs lets them go to sleep.
PAUSE = 0.5


def in_thread(fn: Callable[[], float]) -> float:
    """fn() on a new thread, as the server runs each request."""
    out: list[float] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


def measure(address: tuple[str, int], app: serve.Live, name: str, repeats: int) -> dict:
    """The page against context.py for one model, alternating, medians of `repeats` runs each."""
    model = app.models[name]
    W = model.config.block_size
    piece = next(windows(app.val, 3 * W))  # context.py's first held-out piece
    method = "sliding cache" if model.config.rope else "sliding window"  # what generate does past the window
    prompt = app.tokenizer.decode(piece[: 2 * W].tolist())  # at least a window again as tokens: the page cuts it
    stream = piece[None].to(model.wte.weight.device)
    page, ctx = [], []
    for _ in range(repeats + 1):  # the first round warms up both, and is not counted
        page.append(page_run(address, name, prompt, 2 * W))
        time.sleep(PAUSE)
        ctx.append(in_thread(lambda: context.timed(context.LOSS_METHODS[method], model, stream)[1]))
        time.sleep(PAUSE)
    page, ctx = page[1:], ctx[1:]
    median = {k: statistics.median(run[k] for run in page) for k in page[0]}
    context_ms = statistics.median(ctx)  # as context.py prints it: per token scored
    # the sliding cache also reads the first window one token at a time: 3W - 1 steps for its 2W scored tokens
    steps = 3 * W - 1 if model.config.rope else 2 * W
    step_ms = context_ms * 2 * W / steps
    return {"model": name, "rope": model.config.rope, "context_method": method, "tokens": 2 * W,
            "context_ms_per_token": context_ms, "context_ms_per_step": step_ms,
            "shown_ms_per_token": median["shown_ms"], "stream_ms_per_token": median["stream_ms"],
            "overhead": median["stream_ms"] / step_ms - 1, "shown_overhead": median["shown_ms"] / step_ms - 1,
            "first_token_ms": median["first_token_ms"],
            "first_token_shown_ms": median["first_token_shown_ms"], "repeats": repeats}


def main(argv: list[str] | None = None) -> dict:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", type=checkpoint_arg, help="run folders or checkpoint files")
    p.add_argument("--data-dir", type=prepared_data, default=str(DATA_DIR))
    p.add_argument("--device", help="cpu or cuda (default: the GPU when there is one)")
    p.add_argument("--repeats", type=at_least(1), default=5, help="runs of each, after one to warm up")
    p.add_argument("--json", type=writable_file, help="also write the table here")
    args = p.parse_args(argv)
    args.max_tokens = 10_000
    app = serve.load_app(args)
    app.limits = Limits(prompt_chars=100_000, tokens=10_000)  # a whole window of held-out text as the prompt
    server = serve.make_server(app, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rows = [measure(server.server_address[:2], app, name, args.repeats) for name in app.models]
    finally:
        server.shutdown()
        server.server_close()
    device = next(iter(app.models.values())).wte.weight.device
    print(f"{'model':<20} {'context.py':>15} {'ms/token':>9} {'ms/step':>8} {'page shows':>11} {'stream':>7} "
          f"{'overhead':>9} {'first token':>12}")
    for r in rows:
        print(f"{r['model']:<20} {r['context_method']:>15} {r['context_ms_per_token']:>9.2f} "
              f"{r['context_ms_per_step']:>8.2f} {r['shown_ms_per_token']:>11.2f} {r['stream_ms_per_token']:>7.2f} "
              f"{r['overhead']:>+9.1%} {r['first_token_ms']:>9.1f} ms")
    result = {"machine": machine(device), "device": str(device), "threads": torch.get_num_threads(), "rows": rows}
    print(f"measured on {result['machine']}; overhead = stream / context.py's ms per step - 1 (goal <= +10%)")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    run_main(main)
