"""One story from each model, from the same prompt and seed, written past the window: for the docs.

Each model writes `--tokens` new tokens with its own `generate` (temperature 0.8, top-k 50, one seed for
all), so the story runs past the training window: a rope model slides its KV cache there, a model with
learned positions runs its whole window again for each token. The JSON keeps the text, where the window
ends in it, and the milliseconds per token; `python dev/report.py` turns it into docs/results/stories.md.

Examples:
    python dev/stories.py checkpoints/pretrain checkpoints/pretrain-rope --json results/stories.json
    python dev/stories.py /tmp/tiny --data-dir /tmp/tinydata --tokens 40 --json /tmp/stories.json   # tiny
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import torch

from mvgpt.checkpoint import checkpoint_arg, load_model
from mvgpt.data import DATA_DIR, data_tokenizer_hash, prepared_data
from mvgpt.device import machine, pick_device
from mvgpt.kit.errors import ArgumentParser, non_negative_float, non_negative_int, positive_int, run_main
from mvgpt.kit.io import write_json
from mvgpt.kit.runfolder import writable_file
from mvgpt.tokenizer import Tokenizer


def story(model, tokenizer: Tokenizer, prompt: str, tokens: int, temperature: float, top_k: int, seed: int,
          device: torch.device) -> dict:
    """The prompt continued by `tokens` tokens: the text before the window's end, the text past it, ms/token."""
    ids = tokenizer.encode(prompt) or [tokenizer.eot]
    idx = torch.tensor([ids], device=device)
    t0 = time.perf_counter()
    new = [t.item() for t in model.generate(idx, tokens, temperature, top_k, seed)]
    ms = 1000 * (time.perf_counter() - t0) / max(1, len(new))
    inside = max(0, model.config.block_size - len(ids))  # new tokens that still fit in the first window
    return {"before_window": tokenizer.decode(new[:inside]), "past_window": tokenizer.decode(new[inside:]),
            "tokens": len(new), "tokens_past_window": max(0, len(new) - inside), "ms_per_token": ms}


def main(argv: list[str] | None = None) -> dict:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", type=checkpoint_arg, help="run folders or checkpoint files")
    p.add_argument("--prompt", default="Once upon a time")
    p.add_argument("--tokens", type=positive_int, default=400, help="new tokens: more than a window, to pass it")
    p.add_argument("--temperature", type=non_negative_float, default=0.8, help="0 is greedy")
    p.add_argument("--top-k", type=positive_int, default=50)
    p.add_argument("--seed", type=non_negative_int, default=1337)
    p.add_argument("--data-dir", type=prepared_data, default=str(DATA_DIR), help="where the tokenizer is")
    p.add_argument("--device", default="cpu", help="cpu, cuda, mps (default: cpu, as the docs' stories)")
    p.add_argument("--json", type=writable_file, help="write the stories here")
    args = p.parse_args(argv)

    device = pick_device(args.device)
    tokenizer = Tokenizer.load(Path(args.data_dir) / "tokenizer.json")
    tok_hash = data_tokenizer_hash(args.data_dir) or tokenizer.hash
    rows = []
    for path in args.checkpoints:
        model, _ = load_model(path, device, tok_hash)
        row = {"model": Path(path).name, "kind": "rope" if model.config.rope else "learned",
               "window": model.config.block_size,
               **story(model, tokenizer, args.prompt, args.tokens, args.temperature, args.top_k, args.seed, device)}
        rows.append(row)
        print(f"--- {row['model']} ({row['kind']}, {row['ms_per_token']:.1f} ms/token) ---")
        print(args.prompt + row["before_window"] + " [the window ends here] " + row["past_window"])
    command = shlex.join(["python", "dev/stories.py", *(sys.argv[1:] if argv is None else argv)])
    result = {"command": command, "machine": machine(device), "prompt": args.prompt, "tokens": args.tokens,
              "temperature": args.temperature, "top_k": args.top_k, "seed": args.seed, "rows": rows}
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    run_main(main)
