"""Held-out loss, perplexity, top-1 accuracy and bits per byte of one or more checkpoints.

The validation tokens are cut into consecutive windows of the model's own context; every token of
a window is predicted from the ones before it in that window. Loss is mean cross-entropy in nats
per token, perplexity exp(loss), accuracy how often the likeliest token is the right one, and bits
per byte the same loss in bits over the bytes of text the tokens stand for (it does not depend on
the tokenizer, so it compares models whose tokenizers differ). A LoRA run folder is read as its
base with the adapter applied; a folder that holds no model is skipped, in one line.

Examples:
    python scripts/evaluate.py checkpoints/pretrain checkpoints/pretrain-rope
    python scripts/evaluate.py checkpoints/* --tokens 50000 --json results/evaluate.json
    python scripts/evaluate.py checkpoints/pretrain-rope --dtype auto     # and bf16 vs float32
    python scripts/evaluate.py /tmp/tiny --data-dir /tmp/tinydata --device cpu   # a tiny CPU run

With --dtype bfloat16 (or auto, on hardware with native bf16) the matrix products run in bf16
under autocast, and each model is read in float32 too: the table gives the difference, which a
mixed-precision reading should keep within 0.01 nats.
"""

from __future__ import annotations

import mvgpt.kit.starting  # noqa: F401  first, before torch loads: Ctrl-C meanwhile is one line

# isort: split
import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from mvgpt.checkpoint import existing_path, read_models
from mvgpt.data import DATA_DIR, data_tokenizer_hash, load_tokens, prepared_data
from mvgpt.device import CHOICES as DTYPE_CHOICES
from mvgpt.device import autocast, dtype_name, machine, pick_device, resolve_dtype
from mvgpt.extension.flags import add_context_args, apply_context_args, check_context_args
from mvgpt.kit.errors import ArgumentParser, positive_int, run_main
from mvgpt.kit.io import write_json
from mvgpt.kit.runfolder import writable_file
from mvgpt.model import GPT
from mvgpt.tokenizer import Tokenizer


@torch.no_grad()
def evaluate(model: GPT, tokens, device: torch.device, max_tokens: int | None = None, batch_size: int = 8,
             dtype: torch.dtype = torch.float32, token_bytes: torch.Tensor | None = None) -> dict:
    """{loss, perplexity, accuracy, tokens} over windows of the model's context (+ 1) tokens.

    With token_bytes (the bytes of text each id stands for: Tokenizer.token_bytes), also bits per
    byte: the loss of the tokens that stand for text, in bits, over their bytes. A loss per token
    depends on the tokenizer (bigger tokens, higher loss per token); bits per byte does not, so it
    compares models with other tokenizers. `<|endoftext|>` stands for no text and is left out.
    """
    T = model.context
    n_windows = (len(tokens) - 1) // T
    if max_tokens is not None:
        n_windows = min(n_windows, max(1, max_tokens // T))
    check_windows(len(tokens), T)
    total_loss, correct, count, text_loss, text_bytes = 0.0, 0, 0, 0.0, 0
    for i in tqdm(range(0, n_windows, batch_size), desc="evaluate", leave=False, disable=None):
        rows = [tokens[j * T : j * T + T + 1] for j in range(i, min(i + batch_size, n_windows))]
        batch = torch.from_numpy(np.stack(rows).astype(np.int64)).to(device)
        x, y = batch[:, :-1], batch[:, 1:]
        with autocast(device, dtype):
            logits, _ = model(x)
        logits = logits.float()
        losses = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")  # (B * T,) nats
        total_loss += losses.sum().item()
        correct += (logits.argmax(-1) == y).sum().item()
        count += y.numel()
        if token_bytes is not None:
            nbytes = token_bytes.to(device)[y.flatten()]  # (B * T,) bytes of text each target stands for
            text_loss += losses[nbytes > 0].sum().item()
            text_bytes += nbytes.sum().item()
    loss = total_loss / count
    result = {"loss": loss, "perplexity": math.exp(loss), "accuracy": correct / count, "tokens": count}
    if token_bytes is not None:
        result.update(bits_per_byte=text_loss / math.log(2) / text_bytes, bytes=text_bytes)
    return result


# ----------------------------------------------------------------------------------------------
# The table, as printed (dev/report.py shows it in the README from the --json file)


def name_width(names) -> int:
    return max(28, *(len(name) for name in names))


def header(width: int, mixed: bool) -> str:
    return (f"{'model':<{width}} {'params':>12} {'loss':>8} {'perplexity':>11} {'accuracy':>9} {'bits/byte':>9}"
            + (f" {'vs float32':>11}" if mixed else ""))


def row_line(row: dict, width: int, mixed: bool) -> str:
    bpb = f"{row['bits_per_byte']:>9.4f}" if "bits_per_byte" in row else f"{'-':>9}"  # not in older JSON
    return (f"{row['model']:<{width}} {row['params']:>12,} {row['loss']:>8.4f} {row['perplexity']:>11.3f} "
            f"{row['accuracy']:>9.2%} {bpb}" + (f" {row['loss_difference']:>+11.4f}" if mixed else ""))


def check_windows(tokens: int, T: int) -> None:
    """A one-line error where the held-out tokens do not fill one window of T (and its next token)."""
    if (tokens - 1) // T < 1:
        raise SystemExit(f"error: {tokens:,} held-out tokens are too few for one window of {T:,}: give a --ctx "
                         f"of at most {tokens - 1:,}, or prepare data with more held-out text")


def footer(rows: list[dict]) -> str:
    text = f", {rows[0]['bytes']:,} bytes of text" if "bytes" in rows[0] else ""
    return (f"({rows[0]['tokens']:,} held-out tokens per model{text}; loss in nats per token, bits/byte the "
            "same loss in bits per byte of text)")


def table(rows: list[dict]) -> str:
    """The whole table, as main() prints it row by row."""
    width, mixed = name_width(row["model"] for row in rows), "loss_difference" in rows[0]
    return "\n".join([header(width, mixed), *(row_line(row, width, mixed) for row in rows), footer(rows)])


def main(argv: list[str] | None = None) -> list[dict]:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", type=existing_path,
                   help="run folders or checkpoint files (a LoRA folder: its base with the adapter)")
    p.add_argument("--data-dir", type=prepared_data, default=str(DATA_DIR))
    p.add_argument("--tokens", type=positive_int, help="at most this many tokens, at least a window (default: all)")
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--device", help="cpu, cuda, mps (default: the best present)")
    p.add_argument("--json", type=writable_file, help="also write the table here")
    p.add_argument("--dtype", default="float32", choices=DTYPE_CHOICES,
                   help="matrix products in bf16 (then float32 too, for the difference) or float32")
    add_context_args(p)
    args = p.parse_args(argv)
    check_context_args(p, args)

    device = pick_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    val = load_tokens(args.data_dir, "val")
    tok_hash = data_tokenizer_hash(args.data_dir)
    token_bytes = torch.tensor(Tokenizer.load(Path(args.data_dir) / "tokenizer.json").token_bytes())
    models = read_models(args.checkpoints, device, tok_hash)
    rows = []
    mixed = dtype != torch.float32
    width = name_width(name for name, _ in models)
    for _, model in models:  # a --ctx no model can read, or longer than the text, is refused before the table
        apply_context_args(model, args)
        check_windows(len(val), model.context)
    print(header(width, mixed))
    t0 = time.perf_counter()
    for name, model in models:
        row = {"model": name, "params": model.num_params(), "context": model.context,
               "rope_scaling": args.rope_scaling, "dtype": dtype_name(dtype)}
        row.update(evaluate(model, val, device, args.tokens, args.batch_size, dtype, token_bytes))
        if mixed:  # the same windows in float32: what bf16 products cost in loss
            row["loss_float32"] = evaluate(model, val, device, args.tokens, args.batch_size)["loss"]
            row["loss_difference"] = row["loss"] - row["loss_float32"]
        rows.append(row)
        print(row_line(row, width, mixed))
    print(footer(rows))
    if args.json:
        write_json(args.json, {"machine": machine(device), "seconds": time.perf_counter() - t0, "rows": rows})
    return rows


if __name__ == "__main__":
    run_main(main)
