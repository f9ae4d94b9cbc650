"""See it happen: what `scripts/serve.py`'s page shows, as plain data, from the model's own code.

Three views, each made here and drawn by the page (mvgpt/live/static/):
- write: `write_story` runs `GPT.generate` as it is and watches it through its cache hook,
  `GPT.new_cache`. A `WatchedCache` notes each `slide`; after each token the watcher reads the
  cache's fields (offset, length, position). Past the window, a model with learned positions
  re-runs the window without its cache, so the cache does not move between two tokens: that is
  how the watcher tells. Nothing here copies generate's loop.
- read: `score_piece` scores a held-out piece of three windows per token with the functions that
  context.py uses (passed in by the caller, so this library does not import a script).
- angles: `angles_view` gives the speeds of the 32 rotary pairs and one pair's angle at each
  position, as they are and under linear, NTK and YaRN scaling, from rope_scaling's functions.

A request from the page is checked here (`parse_write`, ...): a bad value is a `LiveError`, one
line naming the problem and the fix, which the server answers with (HTTP 400).

Example:
    python scripts/serve.py checkpoints/pretrain-rope checkpoints/pretrain   # then open the address
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch

from mvgpt.extension.rope_scaling import RopeScaling, scaled_angles
from mvgpt.kit.errors import number
from mvgpt.model import GPT, GPTConfig, KVCache
from mvgpt.tokenizer import Tokenizer

Span = tuple[int, int]  # story places [start, end): place 0 is the prompt's first token


class LiveError(ValueError):
    """A request the server cannot serve: the message names the problem and the fix."""


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (the page's inputs say the same)."""

    prompt_chars: int = 2000
    tokens: int = 1024
    temperature: float = 5.0
    ctx_factor: int = 16  # the angles view: n_ctx up to this many training contexts


# ----------------------------------------------------------------------------------------------
# Write: watch generate through its cache


class WatchedCache(KVCache):
    """The model's KVCache, noting what each `slide` drops as cache positions [start, end)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.drops: list[Span] = []  # emptied by the watcher after each token

    def slide(self, keep: int) -> None:
        first = self.position - self.length  # the oldest position held
        super().slide(keep)
        if self.position - self.length > first:
            self.drops.append((first, self.position - self.length))


@contextmanager
def watching(model: GPT) -> Iterator[list[WatchedCache]]:
    """While inside, the caches generate makes are WatchedCaches, listed as they are made."""
    made: list[WatchedCache] = []
    previous = model.new_cache

    def new_cache(*args, **kwargs) -> WatchedCache:
        made.append(WatchedCache(*args, **kwargs))
        return made[-1]

    model.new_cache = new_cache
    try:
        yield made
    finally:
        model.new_cache = previous


@dataclass
class TokenEvent:
    """One written token and the cache right after generate yielded it."""

    model: str
    index: int  # 0 for the first token written
    token: int
    text: str  # the characters this token completes ("" while a character waits for its next bytes)
    ms: float  # what generate took for this token (the first one: the prompt's pass too)
    offset: int  # the cache's fields, as generate left them
    length: int
    position: int
    capacity: int
    held: Span  # story places the cache holds
    dropped: Span | None  # story places `slide` dropped since the last token
    rerun: Span | None  # story places generate ran again without the cache (learned positions)


def write_story(
    model: GPT,
    name: str,
    prompt: list[int],
    tokens: int,
    temperature: float,
    top_k: int | None,
    seed: int,
    tokenizer: Tokenizer,
) -> Iterator[TokenEvent]:
    """generate's tokens, one TokenEvent each, with what its cache did to write it."""
    cut = max(0, len(prompt) - model.context)  # generate feeds the prompt cut to its last window
    idx = torch.tensor([prompt], device=model.wte.weight.device)
    text = tokenizer.stream()
    with watching(model) as made:
        steps = model.generate(idx, tokens, temperature, top_k, seed)
        try:
            before = None  # the cache's position at the previous token
            for index in range(tokens):
                t0 = time.perf_counter()
                token = next(steps).item()  # .item() waits for the device: the time is the token's
                ms = 1000 * (time.perf_counter() - t0)
                piece = text.add(token) + (text.flush() if index == tokens - 1 else "")
                cache = made[0]
                rerun = index > 0 and cache.position == before and not cache.drops  # the cache did not move
                before = cache.position
                yield TokenEvent(name, index, token, piece, ms, **cache_state(cache, cut, len(prompt) + index,
                                                                              model.context, rerun))
        finally:
            steps.close()


def cache_state(cache: WatchedCache, cut: int, story: int, window: int, rerun: bool) -> dict:
    """The cache's fields for a token's event, and what they mean in the story: the places it holds,
    those `slide` dropped since the last token, and the window generate ran again (rerun).

    Cache positions count from the first token generate fed, the prompt's last window, so a story
    place is a cache position + cut; `story` is how many tokens generate had when it predicted this one.
    """
    drops, cache.drops = cache.drops, []
    return {"offset": cache.offset, "length": cache.length, "position": cache.position, "capacity": cache.capacity,
            "held": (cache.position - cache.length + cut, cache.position + cut),
            "dropped": (drops[0][0] + cut, drops[-1][1] + cut) if drops else None,
            "rerun": (story - window, story) if rerun else None}


def interleave(streams: list[Iterator[TokenEvent]]) -> Iterator[TokenEvent]:
    """A token from each stream in turn, so that side by side the stories grow together."""
    live = list(streams)
    try:
        while live:
            for stream in list(live):
                event = next(stream, None)
                if event is None:
                    live.remove(stream)
                else:
                    yield event
    finally:  # a client that left: every generate stops here, and its model gets its cache hook back
        for stream in streams:
            stream.close()


def summary(ms: list[float]) -> dict:
    """The first token's time (it includes the prompt's pass) and the median of the others."""
    return {"tokens": len(ms), "first_ms": ms[0] if ms else None,
            "median_ms": statistics.median(ms[1:]) if len(ms) > 1 else None}


def token_texts(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    """The text of each token: the characters it completes, so the pieces join to decode(ids)."""
    stream = tokenizer.stream()
    texts = [stream.add(i) for i in ids]
    if texts:
        texts[-1] += stream.flush()
    return texts


# ----------------------------------------------------------------------------------------------
# Read past the window: the per-token losses of context.py's three ways


LossFn = Callable[[GPT, torch.Tensor], torch.Tensor]


def methods_for(model: GPT, methods: Mapping[str, LossFn]) -> tuple[list[str], list[str]]:
    """The methods a model can be read with, and why any is left out (context.py's rule)."""
    if model.config.rope:
        return list(methods), []
    W = model.config.block_size
    return ["sliding window"], [f"learned positions stop at {W}, so the cache cannot slide and the model "
                                "cannot see further: the sliding window alone"]


def score_piece(model: GPT, piece: torch.Tensor, methods: Mapping[str, LossFn]) -> Iterator[dict]:
    """For each method the model can read with: the loss of each token past the first window of
    piece (1, L) (tokens W..L-1), their mean, and the milliseconds per token it took."""
    for method in methods_for(model, methods)[0]:
        t0 = time.perf_counter()
        losses = methods[method](model, piece).float().cpu()
        ms = 1000 * (time.perf_counter() - t0) / len(losses)
        yield {"method": method, "losses": losses.tolist(), "mean": losses.mean().item(), "ms_per_token": ms}


# ----------------------------------------------------------------------------------------------
# Rotary angles: the pairs' speeds and a pair's angle, under each way of scaling


ANGLE_METHODS = ("none", "linear", "ntk", "yarn")


def angles_view(config: GPTConfig, ctx: int, pair: int) -> dict:
    """Speeds (radians per token) of every pair, and pair `pair`'s angle at positions 0..ctx-1,
    under each of ANGLE_METHODS asked for a context of ctx, as rope_scaling.scaled_angles makes
    them (the angles of scaled_rotary, so of the model's table)."""
    d = config.head_size
    speeds = config.rope_theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # as model.rotary
    positions = torch.arange(ctx, dtype=torch.float64) / config.rope_linear_factor
    views = {}
    for method in ANGLE_METHODS:
        scaling = None if method == "none" else RopeScaling(method, config.block_size, ctx)
        per_token, magnitude = scaled_angles(torch.ones(1, dtype=torch.float64), speeds, scaling, config.rope_theta)
        angles, _ = scaled_angles(positions, speeds, scaling, config.rope_theta)
        views[method] = {"speeds": per_token[0].tolist(), "magnitude": magnitude, "angles": angles[:, pair].tolist()}
    return {"ctx": ctx, "pair": pair, "pairs": d // 2, "train_ctx": config.block_size, "theta": config.rope_theta,
            "methods": views}


# ----------------------------------------------------------------------------------------------
# Requests: every value checked, one line for a bad one


@dataclass(frozen=True)
class WriteRequest:
    prompt: str
    models: tuple[str, ...]
    temperature: float
    top_k: int
    tokens: int
    seed: int


def field(query: Mapping[str, list[str]], name: str, kind: type, low: float, high: float, default: float):
    """query[name] as a number from low to high (default when absent), else a LiveError."""
    if name not in query:
        return default
    show = (lambda v: f"{v:,}") if kind is int else (lambda v: f"{v:g}")
    wanted = f"{'a whole number' if kind is int else 'a number'} from {show(low)} to {show(high)}"
    try:
        return number(kind, lambda v: low <= v <= high, wanted)(query[name][-1].strip())
    except argparse.ArgumentTypeError as e:
        raise LiveError(f"{name}: {e}") from None


def parse_models(query: Mapping[str, list[str]], known: list[str]) -> tuple[str, ...]:
    """The models asked for (comma-separated names), each one this server has."""
    names = tuple(n for n in ",".join(query.get("models", query.get("model", []))).split(",") if n)
    if not names:
        raise LiveError(f"no model asked for: choose from {', '.join(known)}")
    for n in names:
        if n not in known:
            raise LiveError(f"unknown model {n!r}: this server has {', '.join(known)}")
    return tuple(dict.fromkeys(names))  # each once, in the order asked


def parse_write(query: Mapping[str, list[str]], known: list[str], vocab_size: int, limits: Limits) -> WriteRequest:
    """A write request from the page's query, every value checked (see Limits)."""
    prompt = query.get("prompt", ["Once upon a time"])[-1]
    if len(prompt) > limits.prompt_chars:
        raise LiveError(f"prompt: {len(prompt):,} characters is over the limit of {limits.prompt_chars:,}: "
                        "shorten it (the model reads its last window anyway)")
    return WriteRequest(
        prompt=prompt,
        models=parse_models(query, known),
        temperature=field(query, "temperature", float, 0, limits.temperature, 0.8),
        top_k=field(query, "top_k", int, 1, vocab_size, 50),
        tokens=field(query, "tokens", int, 1, limits.tokens, min(300, limits.tokens)),
        seed=field(query, "seed", int, 0, 2**32 - 1, 1337),
    )


# ----------------------------------------------------------------------------------------------
# Server-sent events


def sse(event: str, data: object) -> bytes:
    """One server-sent event: its name and its data as one line of JSON."""
    if isinstance(data, TokenEvent):
        data = asdict(data)
    try:  # json.dumps would write NaN, which is not JSON: the page could not read the event
        text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise LiveError(f"a {event} event holds a value that is not a number (NaN or infinity): "
                        "the checkpoint's weights may hold one") from None
    return f"event: {event}\ndata: {text}\n\n".encode()
