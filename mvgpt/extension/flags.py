"""Command-line glue shared by the scripts: flags and their checks, with one-line errors.

A check here runs at parse time (the checks themselves are mvgpt/kit/errors.py's), so bad input stops
with `error: ...` (exit 2) before anything is loaded; the library underneath may then assume its
arguments are sane.
"""

from __future__ import annotations

import argparse

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


def apply_context_args(model, args: argparse.Namespace) -> None:
    """long_context.set_context from the flags, with a one-line error for a context it cannot read."""
    try:
        set_context(model, args.ctx, args.rope_scaling, args.rope_factor)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
