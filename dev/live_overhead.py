"""What the live page costs the stream: its ms per token against context.py's for the same model and tokens.

The page's server runs as a learner runs it, `python scripts/serve.py CHECKPOINTS`, in a process of its
own; this process is its client (as a browser would be) and times context.py. For each checkpoint, past
the window: the page writes 2 windows of tokens after a prompt of held-out text a little over a window
long (so every token it writes is past the window), and context.py scores the same held-out piece of
three windows (2 windows of tokens past the first) with the way generate works for that model: the
sliding cache (rope) or the re-run window (learned positions), on a thread of its own as the server runs
each story. They alternate, `--repeats` times each after a round to warm up, with a pause between (so
that one's idle threads do not slow the other), and the medians are compared:
- shown: the ms per token the page shows (generate's time per token, measured around each token);
- stream: the ms between two token events as the client receives them (everything the page's server
  does per token included: the watching, the JSON, the socket);
- context.py's figure is per token it scores; its sliding cache also reads the first window one token at
  a time, 3W - 1 steps for 2W tokens, so it is compared per step (one forward pass, as a page's token);
- overhead = stream / context.py's ms per step - 1 (goal: 10% or less); the page's own share of it,
  stream / shown - 1; and the first token's latency, request sent to first token event received (the
  prompt's pass included).

Examples:
    python dev/live_overhead.py checkpoints/pretrain-rope checkpoints/pretrain --json results/live-overhead.json
    python dev/live_overhead.py /tmp/tiny --data-dir /tmp/tinydata --repeats 1    # tiny, seconds
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlencode

import torch
from workshop import ROOT, script

from mvgpt.checkpoint import checkpoint_arg, load_model
from mvgpt.data import DATA_DIR, data_tokenizer_hash, load_tokens, prepared_data, windows
from mvgpt.device import machine, pick_device
from mvgpt.kit.errors import ArgumentParser, UserError, at_least, run_main
from mvgpt.kit.io import write_json
from mvgpt.kit.runfolder import writable_file
from mvgpt.live.views import Limits
from mvgpt.perf.fast_decode import use_decode_step
from mvgpt.tokenizer import Tokenizer

context, serve = script("context"), script("serve")  # scripts/context.py, scripts/serve.py (dev/workshop.py)
PAUSE = 0.5  # seconds between runs: a process's OpenMP threads spin for a while after their work


def in_thread(fn: Callable[[], float]) -> float:
    """fn() on a thread of its own, where the server runs each page's story. Where they run matters: on a
    busy two-core machine, decoding on a process's main thread measured 10x slower than on another one."""
    out: list[float] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


@contextmanager
def page_server(args: argparse.Namespace) -> Iterator[tuple[str, int]]:
    """scripts/serve.py on the checkpoints, on a free port, as typed; Ctrl-C at the end, as typed."""
    command = [sys.executable, str(ROOT / "scripts" / "serve.py"), *args.checkpoints, "--port", "0",
               "--data-dir", args.data_dir, "--max-tokens", "100000"]
    if args.device:
        command += ["--device", args.device]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    try:
        server.stdout.readline()  # which one-token step writes each model's tokens (serve.py's first line)
        line = server.stdout.readline()  # "serving http://127.0.0.1:PORT/ (Ctrl-C stops it)"
        if not line.startswith("serving http://"):
            raise UserError(f"scripts/serve.py did not start (exit {server.wait()}): see its message above")
        host, port = line.split("//")[1].split("/")[0].rsplit(":", 1)
        yield host, int(port)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:  # a server that did not stop: it must not outlive us
            server.kill()
            server.wait()


def page_run(address: tuple[str, int], name: str, prompt: str, tokens: int) -> dict:
    """One story through the page's server: the client's clock at each token event, the ms the page shows."""
    conn = http.client.HTTPConnection(*address, timeout=3600)
    query = urlencode({"models": name, "prompt": prompt, "tokens": tokens})
    t0 = time.perf_counter()
    conn.request("GET", f"/api/write?{query}")
    response = conn.getresponse()
    if response.status != 200:
        raise UserError(f"the page refused the story: {json.loads(response.read())['error']}")
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


def measure(address: tuple[str, int], name: str, model, tokenizer: Tokenizer, val, repeats: int) -> dict:
    """The page against context.py for one model, alternating, medians of `repeats` runs each."""
    W = model.config.block_size
    piece = next(windows(val, 3 * W))  # context.py's first held-out piece
    stream = piece[None].to(model.wte.weight.device)
    method = "sliding cache" if model.config.rope else "sliding window"  # what generate does past the window
    prompt = tokenizer.decode(piece[: W + W // 16].tolist())  # a little over a window: the page cuts it to one
    if len(prompt) > Limits.prompt_chars:
        raise UserError(f"a window of held-out text is {len(prompt):,} characters, over the page's limit")
    page, ctx = [], []
    for _ in range(repeats + 1):  # the first round warms up both, and is not counted
        page.append(page_run(address, name, prompt, 2 * W))
        time.sleep(PAUSE)
        ctx.append(in_thread(lambda: context.timed(context.LOSS_METHODS[method], model, stream)[1]))
        time.sleep(PAUSE)
    page, ctx = page[1:], ctx[1:]
    median = {k: statistics.median(run[k] for run in page) for k in page[0]}
    context_ms = statistics.median(ctx)  # as context.py prints it: per token scored
    steps = 3 * W - 1 if model.config.rope else 2 * W  # forward passes context.py's path runs for 2W tokens
    step_ms = context_ms * 2 * W / steps
    return {"model": name, "rope": model.config.rope, "context_method": method, "tokens": 2 * W,
            "context_ms_per_token": context_ms, "context_ms_per_step": step_ms,
            "shown_ms_per_token": median["shown_ms"], "stream_ms_per_token": median["stream_ms"],
            "overhead": median["stream_ms"] / step_ms - 1, "shown_overhead": median["shown_ms"] / step_ms - 1,
            "stream_over_shown": median["stream_ms"] / median["shown_ms"] - 1,
            "first_token_ms": median["first_token_ms"], "first_token_shown_ms": median["first_token_shown_ms"],
            "repeats": repeats}


def print_rows(rows: list[dict]) -> None:
    print(f"{'model':<20} {'context.py':>15} {'ms/token':>9} {'ms/step':>8} {'page shows':>11} {'stream':>7} "
          f"{'overhead':>9} {'stream/shown':>13} {'first token':>12}")
    for r in rows:
        print(f"{r['model']:<20} {r['context_method']:>15} {r['context_ms_per_token']:>9.2f} "
              f"{r['context_ms_per_step']:>8.2f} {r['shown_ms_per_token']:>11.2f} {r['stream_ms_per_token']:>7.2f} "
              f"{r['overhead']:>+9.1%} {r['stream_over_shown']:>+13.1%} {r['first_token_ms']:>9.1f} ms")


def main(argv: list[str] | None = None) -> dict:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", type=checkpoint_arg, help="run folders or checkpoint files")
    p.add_argument("--data-dir", type=prepared_data, default=str(DATA_DIR))
    p.add_argument("--device", help="cpu or cuda (default: the GPU when there is one)")
    p.add_argument("--repeats", type=at_least(1), default=5, help="runs of each, after one to warm up")
    p.add_argument("--json", type=writable_file, help="also write the table here")
    args = p.parse_args(argv)

    device = pick_device(args.device)
    tokenizer = Tokenizer.load(Path(args.data_dir) / "tokenizer.json")
    tok_hash = data_tokenizer_hash(args.data_dir)
    val = load_tokens(args.data_dir, "val")
    rows = []
    with page_server(args) as address:
        for path in args.checkpoints:
            model = load_model(path, device, tok_hash)[0]
            use_decode_step(model, "auto", 2 * model.config.block_size)  # the C step, as serve.py chooses it
            rows.append(measure(address, serve.run_name(path), model, tokenizer, val, args.repeats))
    print_rows(rows)
    command = shlex.join(["python", "dev/live_overhead.py", *(sys.argv[1:] if argv is None else argv)])
    result = {"command": command, "machine": machine(device), "device": str(device),
              "threads": torch.get_num_threads(), "rows": rows}
    print(f"measured on {result['machine']}; the page's server in a process of its own; "
          "overhead = stream / context.py's ms per step - 1 (goal <= +10%)")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    run_main(main)
