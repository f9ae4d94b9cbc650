"""Export a checkpoint as an HF transformers model (GPT-2 or GPT-NeoX) or a GGUF file for llama.cpp.

Writes config.json, generation_config.json, model.safetensors, tokenizer.json,
tokenizer_config.json and a README.md into OUTDIR; `AutoModelForCausalLM.from_pretrained(OUTDIR)`
and `AutoTokenizer.from_pretrained(OUTDIR)` then compute what mvGPT does (see docs/export.md).
A rope model can carry a context extension where transformers has the same method: linear,
dynamic-ntk (as dynamic) and yarn; the others are refused. Needs the export extra
(`pip install -e .[export]`).

With --format gguf, OUT is one .gguf file (mvgpt/export/gguf.py): llama.cpp's `gptneox` (rope) or `gpt2`
(learned positions), fp32 (or --f16), the tokenizer inside. Rope scaling goes in where llama.cpp
computes the same thing: linear, yarn and ntk (as a larger rope base); the others are refused.

Examples:
    python scripts/export.py checkpoints/pretrain exports/pretrain
    python scripts/export.py checkpoints/pretrain-rope exports/rope-yarn --ctx 1024 --rope-scaling yarn
    python scripts/export.py /tmp/tiny /tmp/tiny-hf --data-dir /tmp/tinydata   # a tiny CPU run
    python scripts/export.py checkpoints/pretrain-rope exports/pretrain-rope.gguf --format gguf
    python scripts/export.py checkpoints/pretrain-rope exports/rope-512.gguf --format gguf \\
        --rope-scaling linear --ctx 512
    python scripts/export.py /tmp/tiny /tmp/tiny.gguf --format gguf --data-dir /tmp/tinydata   # tiny, GGUF

OUT must be new or empty; --overwrite replaces an export, or files of the user's, there. It never
means what is read: the checkpoint, its run folder, the data (a run or the data is never written).
"""

from __future__ import annotations

import mvgpt.kit.starting  # noqa: F401  first, before torch loads: Ctrl-C meanwhile is one line

# isort: split
import argparse
from pathlib import Path

from mvgpt.checkpoint import checkpoint_arg, checkpoint_path, load_model
from mvgpt.data import DATA_DIR, data_tokenizer_hash, prepared_data
from mvgpt.export.gguf import export_gguf
from mvgpt.export.hf import export, missing_extra
from mvgpt.extension.rope_scaling import SCALING_METHODS, RopeScaling
from mvgpt.kit.errors import ArgumentParser, UserError, positive_float, positive_int, run_main
from mvgpt.kit.runfolder import claim, claim_file
from mvgpt.tokenizer import Tokenizer


def out_name(text: str) -> str:
    """OUT, never empty: an empty name (an unset variable) would write into the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty name: give the folder to write (--format gguf: the .gguf file)")
    return text


def main(argv: list[str] | None = None) -> Path:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", type=checkpoint_arg, help="run folder or checkpoint file")
    p.add_argument("outdir", type=out_name,
                   help="folder to write the transformers model into (--format gguf: the .gguf file)")
    p.add_argument("--format", choices=("hf", "gguf"), default="hf",
                   help="hf: a transformers folder (default); gguf: one file for llama.cpp")
    p.add_argument("--f16", action="store_true", help="gguf: matrices in float16 (default float32)")
    p.add_argument("--data-dir", type=prepared_data, default=str(DATA_DIR),
                   help="where the tokenizer is")
    p.add_argument("--ctx", type=positive_int,
                   help="context to read at, with --rope-scaling (default: the training one)")
    # all of mvGPT's methods are accepted here, so the ones without an equivalent get a reason, not a usage line
    p.add_argument("--rope-scaling", choices=SCALING_METHODS, help="context extension to carry into the export")
    p.add_argument("--rope-factor", type=positive_float,
                   help="linear: s (default: ctx / training ctx); dynamic-ntk: f (default 1)")
    p.add_argument("--overwrite", action="store_true", help="replace what OUTDIR holds (default: refuse if not empty)")
    args = p.parse_args(argv)
    out = Path(args.outdir)
    reads = {"the checkpoint": checkpoint_path(args.checkpoint), "--data-dir": args.data_dir}
    if args.format == "gguf":  # one file: never the checkpoint itself, nor a file of a run or the data
        if out.is_dir():
            raise SystemExit(f"error: {out} is a folder: give the .gguf file to write")
        claim_file(out, "OUT", overwrite=args.overwrite, reads=reads)
    else:  # a folder: new, empty, an export (or the user's files) with --overwrite; never a run or the data
        claim(out, "export", "OUT", overwrite=args.overwrite, reads=reads)
    if args.rope_scaling is None and (args.ctx is not None or args.rope_factor is not None):
        raise SystemExit("error: --ctx and --rope-factor need --rope-scaling (linear, dynamic-ntk or yarn)")
    if args.f16 and args.format != "gguf":
        raise SystemExit("error: --f16 is for --format gguf (the transformers export is float32)")
    if args.rope_factor is not None and args.rope_scaling not in ("linear", "dynamic-ntk"):
        # mvGPT's other methods ignore the factor; exporting as if it mattered would mislead
        raise SystemExit(f"error: --rope-factor is for linear and dynamic-ntk, not {args.rope_scaling}")

    if lacking := missing_extra(args.format):
        raise UserError(f"an export needs the export extra: {lacking}")
    tokenizer = Tokenizer.load(Path(args.data_dir) / "tokenizer.json")
    model, state = load_model(args.checkpoint, "cpu", data_tokenizer_hash(args.data_dir) or tokenizer.hash)
    if args.rope_scaling is not None:
        ctx = args.ctx or model.config.block_size
        model.rope_scaling = RopeScaling(args.rope_scaling, model.config.block_size, ctx, args.rope_factor)
    if args.format == "gguf":
        outdir = export_gguf(model, tokenizer, args.outdir, checkpoint_path(args.checkpoint), state, args.f16)
        kind = "llama.cpp " + ("gptneox" if model.config.rope else "gpt2")
    else:
        outdir = export(model, tokenizer, args.outdir, checkpoint_path(args.checkpoint), state)
        kind = "GPT-NeoX" if model.config.rope else "GPT-2"
    print(f"exported {checkpoint_path(args.checkpoint)} as {kind} to {outdir}")
    return outdir


if __name__ == "__main__":
    run_main(main)
