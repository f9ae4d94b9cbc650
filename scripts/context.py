"""Past the context window: how well, and how fast, each model predicts tokens beyond its window.

Streams of held-out text, `--length` tokens each (three windows by default), are scored from the
end of the first window on, three ways:
- window_losses: each token is predicted by running the window that ends just before it, in full
  (what generate does past the window with learned positions);
- cache_losses: one token at a time through the KV cache, which slides once it holds a whole
  window (rope only: a learned position's keys and values change as the window moves);
- full_losses: all tokens at once, each attending to everything before it (rope only: learned
  positions stop at the window), further back than the model ever saw in training.

Reading past the training context (--ctx, --sinks):
- with --ctx N..., a sweep like llama.cpp's perplexity tool: the held-out text is cut into chunks
  of N tokens, each scored on its second half only (every scored token has at least N/2 tokens
  of context), for each --rope-scaling method; plus the KV cache's memory at each N;
- with --sinks K, long streams through a sliding cache that keeps the story's first K tokens
  (attention sinks), at their original positions or shifted so no distance exceeds the window;
- with --dynamic, dynamic NTK through a cache against recomputing everything at each length.

Examples:
    python scripts/context.py checkpoints/* --device cpu
    python scripts/context.py checkpoints/pretrain-rope --ctx 256 384 512 768 1024 1536 2048 \
        --rope-scaling none linear linear-when-needed pr-nonlinear ntk dynamic-ntk yarn --json results/sweep.json
    python scripts/context.py checkpoints/pretrain-rope --sinks 4 --length 1024 --json results/sinks.json
    python scripts/context.py checkpoints/pretrain-rope --dynamic --length 512 --streams 2
    python scripts/context.py checkpoints/pretrain-rope --streams 2 --json results/context.json
    python scripts/context.py /tmp/tiny --data-dir /tmp/tinydata --length 96 --streams 1   # tiny, seconds
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mvgpt.bench import machine, sync  # noqa: E402
from mvgpt.checkpoint import load_model  # noqa: E402
from mvgpt.data import DATA_DIR, data_tokenizer_hash, load_tokens, windows  # noqa: E402
from mvgpt.device import pick_device  # noqa: E402
from mvgpt.io import write_json  # noqa: E402
from mvgpt.model import GPT, KVCache  # noqa: E402
from mvgpt.rope_scaling import METHODS as SCALINGS  # noqa: E402


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
def cache_losses(model: GPT, stream: torch.Tensor, sinks: int = 0, shift: bool = False) -> torch.Tensor:
    """The same tokens through the KV cache, one at a time; once the cache holds a whole window,
    slide drops the oldest token, so each prediction sees the same 256 tokens as the window.

    sinks: the story's first `sinks` tokens stay in the cache as it slides (attention sinks).
    Unshifted, they keep their positions, so distances grow past anything seen in training;
    shifted, the newer keys are turned back as tokens drop, so the cache holds one window of
    contiguous positions (llama.cpp's context shift).
    """
    W = model.config.block_size
    cache = KVCache(model.config, stream.shape[0], device=stream.device)
    angles = model.angles if shift else None
    losses = []
    for t in range(stream.shape[1] - 1):
        if cache.length == W:
            cache.slide(W - 1, sinks, angles)
        logits, _ = model(stream[:, t : t + 1], cache=cache)
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


METHODS: dict[str, Callable[[GPT, torch.Tensor], torch.Tensor]] = {
    "sliding window": window_losses,
    "sliding cache": cache_losses,
    "full context": full_losses,
}


@torch.no_grad()
def growing_cache_losses(model: GPT, stream: torch.Tensor) -> torch.Tensor:
    """One token at a time into a cache that never slides (the model reads the whole stream, so
    set_context to its length first); the losses of the tokens past the first window."""
    W = model.config.block_size
    cache = KVCache(model.config, stream.shape[0], stream.shape[1], stream.device)
    losses = []
    for t in range(stream.shape[1] - 1):
        logits, _ = model(stream[:, t : t + 1], cache=cache)
        if t + 1 >= W:
            losses.append(F.cross_entropy(logits[:, -1].float(), stream[:, t + 1]))
    return torch.stack(losses)


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


def kv_bytes_per_token(model: GPT) -> int:
    """Keys and values of one token in every block: 2 x n_layer x n_embd numbers."""
    cfg = model.config
    return 2 * cfg.n_layer * cfg.n_embd * model.wte.weight.element_size()


def peak_forward_bytes(model: GPT, ctx: int) -> int:
    """Measured peak memory of one forward over ctx tokens with a KV cache (logits included), above
    what was in use before: CUDA's allocator statistics, or on the CPU the process's peak resident
    set, reset just before (Linux's clear_refs), after glibc has handed freed memory back."""
    device = model.wte.weight.device
    idx = torch.zeros(1, ctx, dtype=torch.long, device=device)
    with torch.no_grad():
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            model(idx, cache=KVCache(model.config, 1, ctx, device))
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated(device) - before
        import ctypes
        import gc

        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed memory leaves the process: new pages count
        Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) restarts from here
        before = _proc_status_kb("VmRSS")
        model(idx, cache=KVCache(model.config, 1, ctx, device))
        return 1024 * (_proc_status_kb("VmHWM") - before)


def _proc_status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise OSError(f"no {field} in /proc/self/status")


def measure_memory(model: GPT, contexts: list[int]) -> list[dict]:
    """KV-cache bytes at each context, computed, and the peak of a forward there, measured."""
    rows = []
    for ctx in tqdm(contexts, desc="memory", leave=False, disable=None):
        model.set_context(ctx, "none" if ctx <= model.config.block_size else "linear-when-needed")
        per_token = kv_bytes_per_token(model)
        try:
            peak = peak_forward_bytes(model, ctx)
        except OSError as e:  # not Linux: no way to read the peak here
            print(f"note: peak memory not measured on this system ({e})")
            peak = None
        rows.append({"ctx": ctx, "kv_bytes_per_token": per_token, "kv_bytes": per_token * ctx, "peak_bytes": peak})
    model.set_context()
    return rows


def timed(method: Callable, model: GPT, stream: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Run one method between two syncs: (its losses, milliseconds per scored token)."""
    sync(stream.device)
    t0 = time.perf_counter()
    losses = method(model, stream)
    sync(stream.device)
    return losses, 1000 * (time.perf_counter() - t0) / len(losses)


def past_window(args: argparse.Namespace, models: list[tuple[str, GPT]], streams: list[torch.Tensor]) -> dict:
    """The episode's table: each model and method, its loss past the first window and ms/token."""
    rows, notes = [], []
    windows_seen = set()
    for name, model in models:
        W = model.config.block_size
        if args.length <= W:
            notes.append(f"{name}: its window of {W} reaches the end of the {args.length}-token streams: "
                         f"skipped (use --length > {W})")
            continue
        windows_seen.add(W)
        methods = list(METHODS)
        if not model.config.rope:  # learned positions stop at the window: no sliding cache, no longer view
            methods = ["sliding window"]
            notes.append(f"{name}: learned positions stop at {W}, so its cache cannot slide and it "
                         "cannot see further: the sliding window alone")
        for method in methods:
            rows.append({**score(name, method, METHODS[method], model, streams), "window": W})
    if not rows:
        raise SystemExit(f"error: --length {args.length} does not reach past any model's window: make it longer")
    print_rows(f"past the window: {len(streams)} streams of {args.length} tokens, each scored from the end "
               "of its model's first window", rows, notes)
    return {"length": args.length, "streams": len(streams), "window": min(windows_seen), "rows": rows,
            "notes": notes}


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


def print_rows(title: str, rows: list[dict], notes: list[str]) -> None:
    print(title)
    print(f"{'model':<28} {'method':<22} {'loss':>8} {'ms/token':>9}")
    for row in rows:
        print(f"{row['model']:<28} {row['method']:<22} {row['loss']:>8.4f} {row['ms_per_token']:>9.2f}")
    for note in notes:
        print(f"note: {note}")


def sinks_table(args: argparse.Namespace, models: list[tuple[str, GPT]], streams: list[torch.Tensor]) -> dict:
    """Long streams: the plain sliding cache, K sinks unshifted, K sinks shifted, the re-run window."""
    k, rows = args.sinks, []
    for name, model in models:
        if not model.config.rope:
            print(f"note: {name} has learned positions: no cache to slide, skipped")
            continue
        variants = {
            "sliding cache": cache_losses,
            f"{k} sinks, unshifted": lambda m, s: cache_losses(m, s, k, shift=False),
            f"{k} sinks, shifted": lambda m, s: cache_losses(m, s, k, shift=True),
            "sliding window": window_losses,
        }
        for method, fn in variants.items():
            rows.append(score(name, method, fn, model, streams))
    print_rows(f"attention sinks: {len(streams)} streams of {args.length} tokens", rows, [])
    return {"length": args.length, "streams": len(streams), "sinks": k, "rows": rows}


def dynamic_table(args: argparse.Namespace, models: list[tuple[str, GPT]], streams: list[torch.Tensor]) -> dict:
    """Dynamic NTK through a cache (keys stored unrotated and turned by today's base; values of
    older tokens computed under older bases) against recomputing everything at each length."""
    rows = []
    for name, model in models:
        if not model.config.rope:
            continue
        model.set_context(args.length, "dynamic-ntk")
        rows.append(score(name, "dynamic-ntk, cached", growing_cache_losses, model, streams))
        rows.append(score(name, "dynamic-ntk, recomputed", prefix_losses, model, streams))
        model.set_context()
        rows.append(score(name, "none, cached", growing_cache_losses, model, streams))
    print_rows(f"dynamic NTK with a cache: {len(streams)} streams of {args.length} tokens", rows, [])
    return {"length": args.length, "streams": len(streams), "rows": rows}


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
                model.set_context(ctx, method, factor if method == "linear" else None)
                losses = chunk_losses(model, val, ctx, args.sweep_tokens)
                loss = losses.mean().item()
                rows.append({"model": name, "train_ctx": train_ctx, "ctx": ctx, "method": method, "loss": loss,
                             "perplexity": math.exp(loss), "tokens": len(losses)})
        if not model.config.rope:
            notes.append(f"{name}: learned positions, read at {train_ctx} or less, unscaled")
        model.set_context()
    memory = []
    rope_models = [model for _, model in models if model.config.rope]
    if args.memory and rope_models:
        memory = measure_memory(rope_models[0], args.ctx)
    print_sweep(rows, memory, args)
    for note in notes:
        print(f"note: {note}")
    return {"contexts": args.ctx, "methods": args.rope_scaling, "linear_factor": args.rope_factor,
            "sweep_tokens": args.sweep_tokens, "rows": rows, "memory": memory, "notes": notes}


def print_sweep(rows: list[dict], memory: list[dict], args: argparse.Namespace) -> None:
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


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", help="run folders or checkpoint files")
    p.add_argument("--device", help="cpu or cuda (default: the GPU when there is one)")
    p.add_argument("--length", type=int, help="tokens per stream (default: three windows; four with --sinks)")
    p.add_argument("--streams", type=int, default=8, help="consecutive pieces of held-out text")
    p.add_argument("--data-dir", default=str(DATA_DIR))
    p.add_argument("--json", help="also write the table here")
    p.add_argument("--ctx", type=int, nargs="+", help="sweep these contexts (llama.cpp's perplexity scoring)")
    p.add_argument("--rope-scaling", nargs="+", default=["none"], choices=SCALINGS, help="methods for the sweep")
    p.add_argument("--rope-factor", type=float, help="linear's fixed factor (default: largest --ctx / training ctx)")
    p.add_argument("--sweep-tokens", type=int, default=16384, help="held-out tokens read per sweep cell")
    p.add_argument("--no-memory", dest="memory", action="store_false", help="skip the sweep's memory table")
    p.add_argument("--sinks", type=int, help="measure a sliding cache that keeps the first SINKS tokens")
    p.add_argument("--dynamic", action="store_true", help="measure dynamic NTK's cache against recomputing")
    args = p.parse_args(argv)
    for n in args.ctx or []:
        if n < 1:
            raise SystemExit(f"error: --ctx {n} is below 1: a context holds at least one token")

    device = pick_device(args.device)
    val = load_tokens(args.data_dir, "val")
    tok_hash = data_tokenizer_hash(args.data_dir)
    models = []
    for path in args.checkpoints:
        model, _ = load_model(path, device, tok_hash)
        models.append((Path(path).name, model))
    torch.manual_seed(0)

    if args.ctx:
        result = sweep(args, models, val)
    else:
        window = min(model.config.block_size for _, model in models)
        args.length = args.length or (4 if args.sinks else 3) * window
        streams = [s[None].to(device) for s in windows(val, args.length, args.streams)]
        if len(streams) < args.streams:
            raise SystemExit(f"error: the held-out set has {len(val)} tokens, too few for "
                             f"{args.streams} x {args.length}: use fewer --streams or a smaller --length")
        if args.sinks:
            result = sinks_table(args, models, streams)
        elif args.dynamic:
            result = dynamic_table(args, models, streams)
        else:
            result = past_window(args, models, streams)
    result = {"machine": machine(device), "device": str(device), **result}
    print(f"measured on {result['machine']}")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
