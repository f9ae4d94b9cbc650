"""The tokens context.py scores past the window, read within windows instead, as evaluate.py reads.

context.py scores the tokens of each held-out stream after its first window: each one predicted with a
whole window (256 tokens) before it. Its losses come out lower than evaluate.py's over the whole
held-out set. Two things differ: the tokens (the first few thousand held-out tokens, not all of them)
and the context before each token (a whole window, against 0 to 255 in evaluate.py's windows side by
side). This reads the very tokens context.py scores in windows side by side, from the end of the first
window on, so each has 0 to 255 tokens before it. Set beside context.py's "sliding window" row, the
difference is the whole window alone; set beside evaluate.py's whole set, it is the sample alone.
docs/rope.md (On the CPU) quotes it.

    python dev/same_tokens.py checkpoints/pretrain checkpoints/pretrain-rope --device cpu \\
        --json results/amd-epyc/episode/same-tokens.json                       # seconds
    python dev/same_tokens.py /tmp/tiny --data-dir /tmp/tinydata --length 96 --streams 1   # tiny
"""

from __future__ import annotations

import mvgpt.kit.starting as starting

if __name__ == "__main__":
    starting.guard()  # before torch loads: Ctrl-C meanwhile is one line (run_main takes over in main)

import shlex  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch
import torch.nn.functional as F
from workshop import script

from mvgpt.kit.errors import UserError
from mvgpt.model import GPT

context = script("context")  # scripts/context.py (dev/workshop.py): its flags, models and streams


def within_windows(model: GPT, stream: torch.Tensor) -> torch.Tensor:
    """(1, L) -> the losses of tokens W..L-1, read in windows side by side from token W - 1 on: the first
    token of each window has none before it in the window, the last W - 1 (as evaluate.py reads)."""
    W = model.config.block_size
    losses = []
    for start in range(W - 1, stream.shape[1] - 1, W):
        x = stream[:, start : start + W]  # (1, <= W)
        y = stream[:, start + 1 : start + 1 + x.shape[1]]
        logits, _ = model(x[:, : y.shape[1]])
        losses.append(F.cross_entropy(logits[0].float(), y[0], reduction="none"))
    return torch.cat(losses)


def main(argv: list[str] | None = None) -> dict:
    args = context.parser(__doc__).parse_args(argv)
    device, models, val = context.load(args)
    args.length = args.length or 3 * min(model.config.block_size for _, model in models)
    streams = context.held_out_streams(args, val, device)
    # as context.py: a model whose window reaches the streams' end has no token past it to score
    notes = [context.too_short(name, model.config.block_size, args.length)
             for name, model in models if model.config.block_size >= args.length]
    models = [(name, model) for name, model in models if model.config.block_size < args.length]
    if not models:
        raise UserError("; ".join(notes))
    t0, rows, width = time.perf_counter(), [], max(len(name) for name, _ in models)
    with torch.no_grad():
        for name, model in models:
            model.eval()
            losses = torch.cat([within_windows(model, s) for s in streams])
            rows.append({"model": name, "method": "within windows", "loss": losses.mean().item(),
                         "tokens": losses.numel()})
            print(f"{name:<{width}}  within windows  {rows[-1]['loss']:.4f}  ({losses.numel():,} tokens)")
    for note in notes:
        print(f"note: {note}")
    command = shlex.join(["python", "dev/same_tokens.py", *(argv if argv is not None else sys.argv[1:])])
    return context.finish(args, device, {"command": command, "length": args.length, "streams": args.streams,
                                         "rows": rows, "notes": notes, "seconds": time.perf_counter() - t0})


if __name__ == "__main__":
    context.run_main(main)
