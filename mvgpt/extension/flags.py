"""Command-line glue shared by the scripts: flags and their checks, with one-line errors.

A check here runs at parse time (the checks themselves are mvgpt/kit/errors.py's), so bad input stops
with `error: ...` (exit 2) before anything is loaded; the library underneath may then assume its
arguments are sane.
"""

from __future__ import annotations

import argparse

from mvgpt.device import memory_bytes
from mvgpt.extension.long_context import set_context
from mvgpt.extension.rope_scaling import SCALING_METHODS
from mvgpt.kit.errors import at_least, positive_float


def add_context_args(parser: argparse.ArgumentParser) -> None:
    """--ctx and --rope-scaling (+ --rope-factor), for every script that reads a model."""
    parser.add_argument("--ctx", type=at_least(1),
                        help="the context to read, in tokens (default: the training context)")
    parser.add_argument("--rope-scaling", default="none", choices=SCALING_METHODS,
                        help="how rotary positions are scaled to fit --ctx (default: none)")
    parser.add_argument("--rope-factor", type=positive_float,
                        help="linear: the factor s (default ctx / training context); dynamic-ntk: f (default 1)")


FACTOR_METHODS = ("linear", "dynamic-ntk")  # the methods --rope-factor means something to


def check_context_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """After parsing: a flag the chosen method would ignore is refused, not dropped without a word."""
    if args.rope_factor is not None and args.rope_scaling not in FACTOR_METHODS:
        parser.error(f"--rope-factor is for --rope-scaling {' or '.join(FACTOR_METHODS)}, not "
                     f"{args.rope_scaling}: drop it, or pick one of those")


def check_fits_reading(config, ctx: int) -> None:
    """A one-line error, before anything is allocated, where reading `ctx` tokens would not fit in memory:
    the cache's keys and values for every block, and one full window's attention scores (float32)."""
    need = 4 * (2 * config.n_layer * ctx * config.n_embd + config.n_head * ctx * ctx)
    have = memory_bytes()
    if have is not None and need > have:
        raise SystemExit(f"error: --ctx {ctx:,} asks for about {need / 2**30:,.0f} GiB to read a window, more than "
                         f"this machine's {have / 2**30:,.0f} GiB: give a smaller --ctx")


def apply_context_args(model, args: argparse.Namespace) -> None:
    """long_context.set_context from the flags, with a one-line error for a context it cannot read."""
    if args.ctx is not None:
        check_fits_reading(model.config, args.ctx)
    try:
        set_context(model, args.ctx, args.rope_scaling, args.rope_factor)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
