"""Export the trained checkpoints and check that transformers writes the same story, token for token.

For each checkpoint: export it (mvgpt/export.py) into a folder under --out, load it with
`AutoModelForCausalLM` and `AutoTokenizer`, write a greedy story from the same prompt with both
libraries, and compare the tokens. The story stays inside the training window, where both compute
the same thing (past it, mvGPT slides its window and transformers does not). Also compares the
logits over prompt + story, and the two tokenizers on held-out text.

Examples:
    python scripts/export_check.py
    python scripts/export_check.py checkpoints/pretrain-rope --max-new-tokens 250 --json results/export_check.json
    python scripts/export_check.py /tmp/tiny --data-dir /tmp/tinydata --out /tmp/exports --max-new-tokens 10  # tiny
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mvgpt.checkpoint import checkpoint_path, load_model  # noqa: E402
from mvgpt.data import DATA_DIR, data_tokenizer_hash, load_tokens  # noqa: E402
from mvgpt.export import export  # noqa: E402
from mvgpt.io import write_json  # noqa: E402
from mvgpt.tokenizer import Tokenizer  # noqa: E402


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where a and b differ (or where one ends), None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.no_grad()
def check(
    ckpt: str, tokenizer: Tokenizer, tok_hash: str, out: Path, prompt: str, max_new_tokens: int, held_out: str
) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # quiet its warning that the held-out text is longer than the window (it is only tokenized);
    # weights that did not load are checked below instead of being left to a warning
    hf_logging.set_verbosity_error()

    model, state = load_model(ckpt, "cpu", tok_hash)
    window = model.config.block_size
    ids = tokenizer.encode(prompt) or [tokenizer.eot]
    if len(ids) + max_new_tokens > window:
        raise SystemExit(
            f"error: {len(ids)} prompt tokens + {max_new_tokens} new ones pass {ckpt}'s window of {window}, "
            "where mvGPT slides and transformers does not: ask for fewer tokens"
        )
    folder = export(model, tokenizer, out / Path(checkpoint_path(ckpt)).parent.name, checkpoint_path(ckpt), state)
    hf, info = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
    hf.eval()
    not_loaded = sorted(info["missing_keys"]) + sorted(info["unexpected_keys"])
    hf_tok = AutoTokenizer.from_pretrained(folder)

    idx = torch.tensor([ids])
    ours = torch.cat(list(model.generate(idx, max_new_tokens, temperature=0)), dim=1)[0].tolist()
    # eos_token_id=None: mvGPT does not stop at <|endoftext|>, so transformers must not either
    theirs = hf.generate(idx, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None)[0, len(ids):].tolist()
    story = torch.tensor([ids + ours])
    logits_diff = (model(story)[0] - hf(story).logits).abs().max().item()
    held_ours = tokenizer.encode(held_out)
    return {
        "checkpoint": str(checkpoint_path(ckpt)),
        "export": str(folder),
        "architecture": type(hf).__name__,
        "step": state.get("step"),
        "context": window,
        "prompt": prompt,
        "new_tokens": max_new_tokens,
        "weights_not_loaded": not_loaded,
        "match": ours == theirs,
        "first_difference": first_difference(ours, theirs),
        "max_abs_logit_difference": logits_diff,
        "prompt_tokens_match": hf_tok.encode(prompt, add_special_tokens=False) == ids,
        "held_out_tokens": len(held_ours),
        "held_out_tokens_match": hf_tok.encode(held_out, add_special_tokens=False) == held_ours,
        "story_mvgpt": tokenizer.decode(ours),
        "story_transformers": hf_tok.decode(theirs),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="*", default=["checkpoints/pretrain", "checkpoints/pretrain-rope"],
                   help="run folders or checkpoint files (default: both pretrained models)")
    p.add_argument("--data-dir", default=str(DATA_DIR), help="where the tokenizer and held-out tokens are")
    p.add_argument("--out", default="exports", help="exports go to OUT/<run folder name>")
    p.add_argument("--prompt", default="Once upon a time")
    p.add_argument("--max-new-tokens", type=int, default=200, help="must stay inside the training window")
    p.add_argument("--held-out-tokens", type=int, default=50000,
                   help="held-out tokens decoded to text and re-encoded by both tokenizers")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    if args.max_new_tokens < 1:
        raise SystemExit("error: --max-new-tokens must be at least 1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never reach for the Hub

    tokenizer = Tokenizer.load(Path(args.data_dir) / "tokenizer.json")
    tok_hash = data_tokenizer_hash(args.data_dir) or tokenizer.hash
    held_out = tokenizer.decode(load_tokens(args.data_dir, "val")[: args.held_out_tokens].tolist())
    rows = []
    for ckpt in args.checkpoints:
        row = check(ckpt, tokenizer, tok_hash, Path(args.out), args.prompt, args.max_new_tokens, held_out)
        rows.append(row)
        where = "" if row["match"] else f" (first difference at new token {row['first_difference']})"
        print(f"{row['checkpoint']} -> {row['export']} ({row['architecture']}, step {row['step']})")
        if row["weights_not_loaded"]:
            print(f"  weights transformers did not load as they are: {', '.join(row['weights_not_loaded'])}")
        print(f"  greedy story, {row['new_tokens']} tokens: {'MATCH' if row['match'] else 'DIFFERENT'}{where}")
        print(f"  max |logit difference| over prompt + story: {row['max_abs_logit_difference']:.2e}")
        print(f"  tokenizer: prompt {'same' if row['prompt_tokens_match'] else 'DIFFERENT'}, "
              f"{row['held_out_tokens']:,} held-out tokens {'same' if row['held_out_tokens_match'] else 'DIFFERENT'}")
        print("  story:", repr(args.prompt + row["story_mvgpt"]))
    if args.json:
        write_json(args.json, rows)
    if not all(r["match"] and r["prompt_tokens_match"] and r["held_out_tokens_match"] and not r["weights_not_loaded"]
               for r in rows):
        raise SystemExit("error: transformers and mvGPT disagree (see above)")
    return rows


if __name__ == "__main__":
    main()
