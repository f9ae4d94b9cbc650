"""Past the context window: how well, and how fast, each model predicts tokens beyond its window.

Streams of held-out text, `--length` tokens each (three windows by default), are scored from the
end of the first window on, three ways:
- window_losses: each token is predicted by running the window that ends just before it, in full
  (what generate does past the window with learned positions);
- cache_losses: one token at a time through the KV cache, which slides once it holds a whole
  window (rope only: a learned position's keys and values change as the window moves);
- full_losses: all tokens at once, each attending to everything before it (rope only: learned
  positions stop at the window), further back than the model ever saw in training.
All three run model.py's own steps, as the episode measured them: PyTorch against PyTorch. Beside them,
for a rope model, one more row, "sliding cache, C step": the same sliding cache with the one-token step
in C (mvgpt/perf/one_token.c), the same losses to float rounding, where it builds and covers the model
(--decode-step auto or c; --decode-step model leaves it out).
Reading further than the training context (scaled angles, sinks, dynamic NTK): long_context.py.
Pointed at `checkpoints/*`, it reads every model there (a LoRA folder as its base with the adapter
applied) and says in one line what it skipped and why (mvgpt/checkpoint.py).

Examples:
    python scripts/context.py checkpoints/* --device cpu
    python scripts/context.py checkpoints/pretrain-rope --streams 2 --json results/context.json
    python scripts/context.py /tmp/tiny --data-dir /tmp/tinydata --length 96 --streams 1   # tiny, seconds
    python scripts/context.py checkpoints/pretrain-rope --decode-step model   # the three methods alone
"""

from __future__ import annotations

import mvgpt.kit.starting  # noqa: F401  first, before torch loads: Ctrl-C meanwhile is one line

# isort: split
import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from tqdm import tqdm

from mvgpt.checkpoint import existing_path, read_models
from mvgpt.data import DATA_DIR, data_tokenizer_hash, load_tokens, prepared_data, windows
from mvgpt.device import machine, pick_device, sync
from mvgpt.kit.errors import ArgumentParser, at_least, run_main
from mvgpt.kit.io import write_json
from mvgpt.kit.runfolder import writable_file
from mvgpt.model import GPT, KVCache
from mvgpt.perf.fast_decode import FastDecode, add_decode_step_arg, c_step


@torch.no_grad()
def window_losses(model: GPT, stream: torch.Tensor) -> torch.Tensor:
    """Loss of each token past the first window, predicted by re-running the window before it."""
    W = model.config.block_size
    losses = []
    for t in range(W, stream.shape[1]):
        logits, _ = model(stream[:, t - W : t], last_only=True)
        losses.append(F.cross_entropy(logits[:, -1].float(), stream[:, t]))
    return torch.stack(losses)


@torch.no_grad()
def cache_losses(model: GPT, stream: torch.Tensor, slide: bool = True, cache: KVCache | None = None,
                 step: Callable[[torch.Tensor, KVCache], torch.Tensor] | None = None) -> torch.Tensor:
    """The same tokens through the KV cache, one at a time; once the cache holds a whole window,
    slide drops the oldest token, so each prediction sees the same 256 tokens as the window.

    slide=False: the cache keeps everything and the model reads the whole stream (set a context
    that long first: long_context.set_context). cache: one to fill instead of a new one (a
    long_context.SinkCache, say). step: the one-token step (default model.decode; a FastDecode: the
    C step).
    """
    step = step or model.decode
    W = model.config.block_size
    if cache is None:
        cache = model.new_cache(model.config, stream.shape[0], None if slide else stream.shape[1], stream.device)
    losses = []
    for t in range(stream.shape[1] - 1):
        if slide and cache.length == W:
            cache.slide(W - 1)
        logits = step(stream[:, t : t + 1], cache)
        if t + 1 >= W:
            losses.append(F.cross_entropy(logits[:, -1].float(), stream[:, t + 1]))
    return torch.stack(losses)


@torch.no_grad()
def full_losses(model: GPT, stream: torch.Tensor) -> torch.Tensor:
    """All tokens at once, each attending to all before it; losses of the tokens past the first window."""
    W = model.config.block_size
    logits, _ = model(stream[:, :-1])
    per_token = F.cross_entropy(logits[0].float(), stream[0, 1:], reduction="none")
    return per_token[W - 1 :]


LOSS_METHODS: dict[str, Callable[[GPT, torch.Tensor], torch.Tensor]] = {
    "sliding window": window_losses,
    "sliding cache": cache_losses,
    "full context": full_losses,
}
C_STEP = "sliding cache, C step"  # the row after "sliding cache": the same method, the one-token step in C


def timed(method: Callable, model: GPT, stream: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Run one method between two syncs: (its losses, milliseconds per scored token)."""
    sync(stream.device)
    t0 = time.perf_counter()
    losses = method(model, stream)
    sync(stream.device)
    return losses, 1000 * (time.perf_counter() - t0) / len(losses)


def score(name: str, method: str, fn: Callable, model: GPT, streams: list[torch.Tensor]) -> dict:
    """Mean loss and ms/token of one method over the streams, and its mean loss at each position."""
    losses, ms = [], []
    for stream in tqdm(streams, desc=f"{name}: {method}", leave=False, disable=None):
        got, t = timed(fn, model, stream)
        losses.append(got.cpu())
        ms.append(t)
    per_position = torch.stack(losses).mean(0)
    return {"model": name, "method": method, "loss": per_position.mean().item(),
            "ms_per_token": sum(ms) / len(ms), "position_losses": per_position.tolist()}


def table(title: str, rows: list[dict], notes: list[str]) -> str:
    """The table as printed: a title, a row per model and method, the notes."""
    width = max([28, *(len(row["model"]) for row in rows)])
    lines = [title, f"{'model':<{width}} {'method':<22} {'loss':>8} {'ms/token':>9}"]
    lines += [f"{row['model']:<{width}} {row['method']:<22} {row['loss']:>8.4f} {row['ms_per_token']:>9.2f}"
              for row in rows]
    return "\n".join(lines + [f"note: {note}" for note in notes])


def print_rows(title: str, rows: list[dict], notes: list[str]) -> None:
    print(table(title, rows, notes))


def title(streams: int, length: int) -> str:
    return (f"past the window: {streams} streams of {length} tokens, each scored from the end of its model's "
            "first window")


def c_steps(args: argparse.Namespace, models: list[tuple[str, GPT]]) -> dict[str, FastDecode]:
    """The C step of each rope model it builds for and covers, unless --decode-step model; one line for each
    rope model saying whether it gets the C step's row, and why not."""
    steps = {}
    for name, model in models:
        if model.config.rope and args.decode_step != "model":
            fast, said = c_step(model)  # built here, once: its build is not in the row's time
            print(f"{name}: a row for {said} too" if fast else f"{name}: no row for the C step: {said}")
            if fast:
                steps[name] = fast
    return steps


def too_short(name: str, window: int, length: int) -> str:
    """The note for a model whose window reaches the end of the streams: no token past it to score."""
    return (f"{name}: its window of {window} reaches the end of the {length}-token streams: skipped "
            f"(use --length > {window})")


def past_window(args: argparse.Namespace, models: list[tuple[str, GPT]], streams: list[torch.Tensor],
                fast: dict[str, FastDecode] | None = None) -> dict:
    """The episode's table: each model and method, its loss past the first window and ms/token; and for a
    model in `fast`, the sliding cache again with its C step."""
    rows, notes, fast = [], [], fast or {}
    windows_seen = set()
    for name, model in models:
        W = model.config.block_size
        if args.length <= W:
            notes.append(too_short(name, W, args.length))
            continue
        windows_seen.add(W)
        methods = list(LOSS_METHODS)
        if not model.config.rope:  # learned positions stop at the window: no sliding cache, no longer view
            methods = ["sliding window"]
            notes.append(f"{name}: learned positions stop at {W}, so its cache cannot slide and it "
                         "cannot see further: the sliding window alone")
        for method in methods:
            rows.append({**score(name, method, LOSS_METHODS[method], model, streams), "window": W})
            if method == "sliding cache" and name in fast:
                c_losses = lambda m, s, step=fast[name]: cache_losses(m, s, step=step)  # noqa: E731
                rows.append({**score(name, C_STEP, c_losses, model, streams), "window": W})
    if not rows:
        raise SystemExit(f"error: --length {args.length} does not reach past any model's window: make it longer")
    print_rows(title(len(streams), args.length), rows, notes)
    return {"length": args.length, "streams": len(streams), "window": min(windows_seen), "rows": rows,
            "notes": notes}


def load(args: argparse.Namespace) -> tuple[torch.device, list[tuple[str, GPT]], object]:
    """The device, (name, model) for each model the paths hold (a LoRA folder: its base with the
    adapter), and the held-out tokens. What is not a model is skipped, in one line. Each model keeps
    model.py's own one-token step."""
    device = pick_device(args.device)
    val = load_tokens(args.data_dir, "val")
    tok_hash = data_tokenizer_hash(args.data_dir)
    models = read_models(args.checkpoints, device, tok_hash)
    torch.manual_seed(0)
    return device, models, val


def held_out_streams(args: argparse.Namespace, val, device: torch.device) -> list[torch.Tensor]:
    """args.streams consecutive pieces of args.length held-out tokens, each (1, length)."""
    streams = [s[None].to(device) for s in windows(val, args.length, args.streams)]
    if len(streams) < args.streams:
        raise SystemExit(f"error: the held-out set has {len(val)} tokens, too few for "
                         f"{args.streams} x {args.length}: use fewer --streams or a smaller --length")
    return streams


def finish(args: argparse.Namespace, device: torch.device, result: dict) -> dict:
    """Stamp the machine on the result, print it, write --json."""
    result = {"machine": machine(device), "device": str(device), **result}
    print(f"measured on {result['machine']}")
    if args.json:
        write_json(args.json, result)
    return result


def parser(doc: str = __doc__) -> argparse.ArgumentParser:
    """The flags context.py and long_context.py share."""
    p = ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", type=existing_path,
                   help="run folders or checkpoint files (a LoRA folder: its base with the adapter)")
    p.add_argument("--device", help="cpu or cuda (default: the GPU when there is one)")
    p.add_argument("--length", type=at_least(2), help="tokens per stream (default: three windows)")
    p.add_argument("--streams", type=at_least(1), default=8, help="consecutive pieces of held-out text")
    p.add_argument("--data-dir", type=prepared_data, default=str(DATA_DIR))
    p.add_argument("--json", type=writable_file, help="also write the table here")
    return p


def main(argv: list[str] | None = None) -> dict:
    p = parser()
    add_decode_step_arg(p, help="the sliding cache's one-token step: model.py's always; auto and c add a row with "
                                "the C step (mvgpt/perf/one_token.c) for each rope model it builds for and covers; "
                                "model leaves that row out (default %(default)s)")
    args = p.parse_args(argv)
    device, models, val = load(args)
    args.length = args.length or 3 * min(model.config.block_size for _, model in models)
    fast = c_steps(args, models)
    t0 = time.perf_counter()
    result = past_window(args, models, held_out_streams(args, val, device), fast)
    return finish(args, device, {**result, "seconds": time.perf_counter() - t0})


if __name__ == "__main__":
    run_main(main)
