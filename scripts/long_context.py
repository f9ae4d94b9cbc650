"""Reading past the training context: scaled rotary angles, attention sinks, dynamic NTK.

The lab beside context.py (whose streams, scoring and table this reuses), in three modes:
- --ctx N...: a sweep like llama.cpp's perplexity tool: the held-out text is cut into chunks of
  N tokens, each scored on its second half only (every scored token has at least N/2 tokens of
  context), for each --rope-scaling method; plus the KV cache's memory at each N;
- --sinks K: long streams (four windows by default) through a sliding cache that keeps the
  story's first K tokens (attention sinks), at their positions or shifted so no distance
  exceeds the window;
- --dynamic: dynamic NTK through a cache against recomputing everything at each length.
The cache's reads take model.py's own one-token step unless --decode-step says otherwise (c: the C
step, mvgpt/perf/one_token.c, wherever it builds; auto: where its build pays for the streams).

Examples:
    python scripts/long_context.py checkpoints/pretrain-rope --ctx 256 384 512 768 1024 1536 2048 \
        --rope-scaling none linear linear-when-needed pr-nonlinear ntk dynamic-ntk yarn --json results/sweep.json
    python scripts/long_context.py checkpoints/pretrain-rope --sinks 4 --length 1024 --json results/sinks.json
    python scripts/long_context.py checkpoints/pretrain-rope --dynamic --length 512 --streams 2 \
        --json results/dynamic.json
    python scripts/long_context.py /tmp/tiny --data-dir /tmp/tinydata --sinks 2 --streams 1   # tiny, seconds
    python scripts/long_context.py checkpoints/pretrain-rope --sinks 4 --decode-step c   # the cache's steps in C
"""

from __future__ import annotations

import mvgpt.kit.starting  # noqa: F401  first, before torch loads: Ctrl-C meanwhile is one line

# isort: split
import argparse
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from context import cache_losses, finish, held_out_streams, load, parser, print_rows, score, window_losses
from tqdm import tqdm

from mvgpt.extension.long_context import SinkCache, set_context
from mvgpt.extension.memory import kv_bytes_per_token, peak_forward_bytes
from mvgpt.extension.rope_scaling import SCALING_METHODS
from mvgpt.kit.errors import UserError, at_least, positive_float, run_main
from mvgpt.model import GPT
from mvgpt.perf.fast_decode import add_decode_step_arg, use_decode_step


@torch.no_grad()
def prefix_losses(model: GPT, stream: torch.Tensor) -> torch.Tensor:
    """Each token past the first window predicted by a full forward over everything before it:
    under dynamic NTK, every key and value then comes from the base of that one length."""
    W = model.config.block_size
    losses = []
    for t in range(W, stream.shape[1]):
        logits, _ = model(stream[:, :t], last_only=True)
        losses.append(F.cross_entropy(logits[:, -1].float(), stream[:, t]))
    return torch.stack(losses)


@torch.no_grad()
def chunk_losses(model: GPT, tokens, ctx: int, max_tokens: int) -> torch.Tensor:
    """llama.cpp's perplexity: chunks of ctx tokens, each scored on its second half only, so every
    scored token has at least ctx/2 tokens before it. Reads at most max_tokens (one chunk at least)."""
    n_chunks = min(len(tokens) // ctx, max(1, max_tokens // ctx))
    if n_chunks < 1:
        raise SystemExit(f"error: the held-out set has {len(tokens)} tokens, fewer than one chunk of {ctx}")
    device = model.wte.weight.device
    first = ctx // 2
    losses = []
    for i in range(n_chunks):
        chunk = torch.from_numpy(tokens[i * ctx : (i + 1) * ctx].astype("int64")).to(device)
        logits, _ = model(chunk[None])
        losses.append(F.cross_entropy(logits[0, first:-1].float(), chunk[first + 1 :], reduction="none"))
    return torch.cat(losses)


def measure_memory(model: GPT, contexts: list[int]) -> list[dict]:
    """KV-cache bytes at each context, computed, and the peak of a forward there, measured."""
    rows = []
    for ctx in tqdm(contexts, desc="memory", leave=False, disable=None):
        set_context(model, ctx, "none" if ctx <= model.config.block_size else "linear-when-needed")
        per_token = kv_bytes_per_token(model)
        try:
            peak = peak_forward_bytes(model, ctx)
        except OSError as e:  # not Linux: no way to read the peak here
            print(f"note: peak memory not measured on this system ({e})")
            peak = None
        rows.append({"ctx": ctx, "kv_bytes_per_token": per_token, "kv_bytes": per_token * ctx, "peak_bytes": peak})
    set_context(model)
    return rows


def sweep(args: argparse.Namespace, models: list[tuple[str, GPT]], val) -> dict:
    """Loss and perplexity for each context and scaling method (rows n_ctx, columns methods)."""
    rows, notes = [], []
    for name, model in models:
        train_ctx = model.config.block_size
        factor = args.rope_factor or max(args.ctx) / train_ctx  # linear: one factor for all contexts
        for ctx in args.ctx:
            for method in args.rope_scaling:
                if not model.config.rope and (method != "none" or ctx > train_ctx):
                    continue
                set_context(model, ctx, method, factor if method == "linear" else None)
                losses = chunk_losses(model, val, ctx, args.sweep_tokens)
                loss = losses.mean().item()
                rows.append({"model": name, "train_ctx": train_ctx, "ctx": ctx, "method": method, "loss": loss,
                             "perplexity": math.exp(loss), "tokens": len(losses)})
        if not model.config.rope:
            notes.append(f"{name}: learned positions, read at {train_ctx} or less, unscaled")
        set_context(model)
    if not rows:  # every model has learned positions, and every context is past its table
        raise UserError(f"learned positions stop at the training context, and every --ctx is past it: give --ctx "
                        f"{min(m.config.block_size for _, m in models)} or less, or a rope model")
    memory = []
    rope_models = [model for _, model in models if model.config.rope]
    if args.memory and rope_models:
        memory = measure_memory(rope_models[0], args.ctx)
    print_sweep(rows, memory)
    for note in notes:
        print(f"note: {note}")
    return {"contexts": args.ctx, "methods": args.rope_scaling, "linear_factor": args.rope_factor,
            "sweep_tokens": args.sweep_tokens, "rows": rows, "memory": memory, "notes": notes}


def print_sweep(rows: list[dict], memory: list[dict]) -> None:
    for name in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == name]
        methods = list(dict.fromkeys(r["method"] for r in mine))
        print(f"\n{name} (trained at {mine[0]['train_ctx']}): held-out loss / perplexity, second half of "
              "each chunk scored")
        print(f"{'n_ctx':>6} " + " ".join(f"{m:>20}" for m in methods))
        for ctx in dict.fromkeys(r["ctx"] for r in mine):
            cells = {r["method"]: f"{r['loss']:.3f} / {r['perplexity']:.2f}" for r in mine if r["ctx"] == ctx}
            print(f"{ctx:>6} " + " ".join(f"{cells.get(m, '-'):>20}" for m in methods))
    if memory:
        print(f"\n{'n_ctx':>6} {'KV bytes/token':>15} {'KV cache MiB':>13} {'forward peak MiB':>17}")
        for row in memory:
            peak = "-" if row["peak_bytes"] is None else f"{row['peak_bytes'] / 2**20:.1f}"
            print(f"{row['ctx']:>6} {row['kv_bytes_per_token']:>15,} {row['kv_bytes'] / 2**20:>13.1f} {peak:>17}")


def sinks_table(args: argparse.Namespace, models: list[tuple[str, GPT]], streams: list[torch.Tensor]) -> dict:
    """Long streams: the plain sliding cache, K sinks unshifted, K sinks shifted, the re-run window."""
    k, rows = args.sinks, []
    for name, model in models:
        if not model.config.rope:
            print(f"note: {name} has learned positions: no cache to slide, skipped")
            continue

        def sinks(shifted: bool) -> Callable:  # cache_losses through a SinkCache
            return lambda m, s: cache_losses(m, s, cache=SinkCache(m.config, s.shape[0], device=s.device, sinks=k,
                                                                    angles=m.angles if shifted else None))

        variants = {"sliding cache": cache_losses, f"{k} sinks, unshifted": sinks(False),
                    f"{k} sinks, shifted": sinks(True), "sliding window": window_losses}
        for method, fn in variants.items():
            rows.append(score(name, method, fn, model, streams))
    print_rows(f"attention sinks: {len(streams)} streams of {args.length} tokens", rows, [])
    return {"length": args.length, "streams": len(streams), "sinks": k, "rows": rows}


def dynamic_table(args: argparse.Namespace, models: list[tuple[str, GPT]], streams: list[torch.Tensor]) -> dict:
    """Dynamic NTK through a cache (held keys turned on to today's base at every step; values of
    older tokens computed under older bases) against recomputing everything at each length."""
    rows = []
    growing = lambda m, s: cache_losses(m, s, slide=False)  # noqa: E731
    for name, model in models:
        if not model.config.rope:
            continue
        set_context(model, args.length, "dynamic-ntk")
        rows.append(score(name, "dynamic-ntk, cached", growing, model, streams))
        rows.append(score(name, "dynamic-ntk, recomputed", prefix_losses, model, streams))
        set_context(model)
        rows.append(score(name, "none, cached", growing, model, streams))
    print_rows(f"dynamic NTK with a cache: {len(streams)} streams of {args.length} tokens", rows, [])
    return {"length": args.length, "streams": len(streams), "rows": rows}


def check_streams(args: argparse.Namespace, models: list[tuple[str, GPT]]) -> None:
    """--sinks and --dynamic read streams through a cache that slides or grows: a rope model's, past its
    window, keeping fewer sinks than the window holds; one line otherwise, before any work."""
    mode = "--sinks" if args.sinks is not None else "--dynamic"
    windows = [m.config.block_size for _, m in models if m.config.rope]
    if not windows:
        names = ", ".join(name for name, _ in models)
        raise UserError(f"{mode} reads through a cache that slides past the window, and {names} "
                        f"{'has' if len(models) == 1 else 'have'} learned positions: give a rope model")
    if args.sinks is not None and args.sinks >= min(windows):
        raise UserError(f"--sinks {args.sinks} would keep the whole window of {min(windows)} tokens: give at most "
                        f"{min(windows) - 1}")
    if args.length is not None and args.length <= max(windows):
        raise UserError(f"--length {args.length} does not reach past the window of {max(windows)} tokens: make it "
                        f"longer (default: {4 if args.sinks is not None else 3} windows)")


def main(argv: list[str] | None = None) -> dict:
    p = parser(__doc__)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--ctx", type=at_least(2), nargs="+",
                      help="sweep these contexts (llama.cpp's perplexity; a chunk's second half is scored: 2 at least)")
    mode.add_argument("--sinks", type=at_least(0), help="measure a sliding cache that keeps the first SINKS tokens")
    mode.add_argument("--dynamic", action="store_true", help="measure dynamic NTK's cache against recomputing")
    p.add_argument("--rope-scaling", nargs="+", default=["none"], choices=SCALING_METHODS, help="methods for the sweep")
    p.add_argument("--rope-factor", type=positive_float,
                   help="linear's fixed factor (default: largest --ctx / training ctx)")
    p.add_argument("--sweep-tokens", type=at_least(1), default=16384, help="held-out tokens read per sweep cell")
    p.add_argument("--no-memory", dest="memory", action="store_false", help="skip the sweep's memory table")
    add_decode_step_arg(p, default="model", help="the one-token step of the cache's reads (--sinks, --dynamic): "
                        "model (model.py's own; default), c (the C step, mvgpt/perf/one_token.c, wherever it "
                        "builds), auto (the C step where its build pays for the streams)")
    args = p.parse_args(argv)

    if args.rope_factor is not None and "linear" not in args.rope_scaling:
        p.error("--rope-factor is linear's factor for the sweep: add linear to --rope-scaling, or drop it")
    device, models, val = load(args)
    if args.ctx:
        return finish(args, device, sweep(args, models, val))
    check_streams(args, models)
    args.length = args.length or (4 if args.sinks is not None else 3) * min(m.config.block_size for _, m in models)
    streams = held_out_streams(args, val, device)
    for name, model in models:
        if model.config.rope and args.decode_step != "model":  # rope alone reads through the cache here
            print(f"{name}: {use_decode_step(model, args.decode_step, len(streams) * args.length)}")
    table = sinks_table if args.sinks is not None else dynamic_table
    return finish(args, device, table(args, models, streams))


if __name__ == "__main__":
    run_main(main)
