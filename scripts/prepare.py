"""Prepare TinyStories: train the BPE tokenizer and write the tokens to data/.

Examples:
    python scripts/prepare.py --source ../shared/data/tinystories   # a folder: train.txt, valid.txt
    python scripts/prepare.py --source stories.txt                  # one file: its last 5% held out
    MVGPT_TINYSTORIES=~/tinystories python scripts/prepare.py      # the same, from the environment
    python scripts/prepare.py                                       # download from the HF Hub
    python scripts/prepare.py --source my.txt --vocab-size 512 --data-dir /tmp/tiny   # tiny, seconds
    python scripts/prepare.py --source ../shared/data/tinystories --json results/data.json   # counts for the docs

A folder of prepared data is prepared again only for the same inputs (--force: redo it). Data made
from another source or vocabulary is refused, not replaced, unless --force: every checkpoint trained
on it needs its tokenizer. A folder holding anything else (a run, an export) is never written.
"""

from __future__ import annotations

import mvgpt.kit.starting  # noqa: F401  first, before torch loads: Ctrl-C meanwhile is one line

# isort: split
import argparse
import sys
import time
from pathlib import Path

from mvgpt.data import (
    DATA_DIR,
    DEFAULT_MAX_TRAIN_MB,
    MAX_VOCAB,
    MIN_VOCAB,
    PREPARED,
    SOURCE_ENV,
    prepare,
    resolve_source,
    source_arg,
    source_files,
)
from mvgpt.kit.errors import ArgumentParser, UserError, non_negative_float, number, run_main, writable_folder
from mvgpt.kit.io import write_json
from mvgpt.kit.runfolder import claim, claim_file, holds, named, run_folders, writable_file


def data_counts(meta: dict, command: list[str]) -> dict:
    """What the docs' data table shows: stories, tokens and characters per token of each split."""
    splits = {}
    for split, name in (("train", "train"), ("val", "held_out")):
        tokens, chars = meta[f"{split}_tokens"], meta[f"{split}_chars"]
        splits[name] = {"stories": meta[f"{split}_stories"], "tokens": tokens, "characters": chars,
                        "chars_per_token": chars / tokens}
    return {"command": " ".join(command), "split": meta["split"], "vocab_size": meta["vocab_size"],
            "tokenizer_hash": meta["tokenizer_hash"], **splits}


def main(argv: list[str] | None = None) -> dict:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", type=source_arg,
                   help=f"TinyStories text file or folder (default: ${SOURCE_ENV}, else download)")
    p.add_argument("--data-dir", type=writable_folder, default=str(DATA_DIR), help="where the tokenizer and bins go")
    p.add_argument("--vocab-size", type=number(int, lambda v: MIN_VOCAB <= v <= MAX_VOCAB,
                                               f"a whole number from {MIN_VOCAB} to {MAX_VOCAB}"),
                   default=8192, help="tokens, <|endoftext|> included")
    p.add_argument("--max-train-mb", type=non_negative_float, default=DEFAULT_MAX_TRAIN_MB,
                   help="download at most this much of the 1.9 GB train file (0: all)")
    p.add_argument("--force", action="store_true",
                   help="prepare again even if done for these inputs; replace data prepared from others")
    p.add_argument("--json", type=writable_file, help="also write the counts of each split here (for the docs)")
    args = p.parse_args(argv)

    t0 = time.perf_counter()
    data_dir = Path(args.data_dir)
    found = holds(data_dir)
    if found is not None and found[0] != "data":  # a run, an export, or files of the user's: not data's place
        clashes = found[0] == "files" and any((data_dir / name).exists() for name in PREPARED)
        if found[0] != "files" or clashes:
            claim(data_dir, "data", "--data-dir", overwrite=args.force, overwrite_flag="--force")
    runs = run_folders(data_dir)
    if found is not None and found[0] == "files" and runs:  # a checkpoints/ folder: data among its runs
        raise UserError(f"--data-dir {data_dir} holds runs ({named(runs)}): give the data a folder of its own")
    source = resolve_source(args.source, data_dir, args.max_train_mb)
    if args.json:
        claim_file(args.json, "--json", reads={f"--source ({f.name})": f for f in source_files(source)},
                   making=[("--data-dir", data_dir, "data")])
    meta = prepare(source, args.data_dir, args.vocab_size, args.force, replace=args.force)
    if args.json:
        write_json(args.json, data_counts(meta, ["python scripts/prepare.py", *(argv or sys.argv[1:])]))
    if meta.get("skipped"):
        print(f"{args.data_dir} is already prepared from {meta['source']} (use --force to redo)")
        return meta
    print(f"source: {meta['split']}")
    print(f"tokenizer: {meta['vocab_size']} tokens, hash {meta['tokenizer_hash']}")
    for split, stories in (("train", "train_stories"), ("val", "val_stories")):
        tokens, chars = meta[f"{split}_tokens"], meta[f"{split}_chars"]
        print(f"{split}: {meta[stories]:,} stories, {tokens:,} tokens, {chars / tokens:.2f} characters per token")
    print(f"wrote {args.data_dir}/ in {time.perf_counter() - t0:.1f} s")
    return meta


if __name__ == "__main__":
    run_main(main, interrupted="nothing was changed: the data already prepared, if any, is as it was")
