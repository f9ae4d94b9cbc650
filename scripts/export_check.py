"""Export the trained checkpoints and check that transformers (or llama.cpp) writes the same story.

For each checkpoint: export it (mvgpt/export/hf.py) into a folder under --out, load it with
`AutoModelForCausalLM` and `AutoTokenizer`, write a greedy story from the same prompt with both
libraries, and compare the tokens. The story stays inside the training window, where both compute
the same thing (past it, mvGPT slides its window and transformers does not). Also compares the
logits over prompt + story, and the two tokenizers on held-out text.

With --gguf, the same for llama.cpp (llama-cpp-python): each checkpoint exported as a GGUF file
(mvgpt/export/gguf.py), its greedy story and tokenization against ours, and llama.cpp's perplexity over
the held-out chunks of context.py's sweep (its own chunking function, the second half of each chunk
scored, as llama.cpp's perplexity tool does) at each --ctx, with llama.cpp's own rope options
for each --rope-scaling method it has (linear, yarn, ntk as a larger rope base), beside our loss on
the same chunks, exact and with llama.cpp's GELU (see docs/export.md).

Examples:
    python scripts/export_check.py
    python scripts/export_check.py --gguf --ctx 256 512 1024 --json results/llama_cpp.json
    python scripts/export_check.py checkpoints/pretrain-rope --max-new-tokens 250 --json results/export_check.json
    python scripts/export_check.py /tmp/tiny --data-dir /tmp/tinydata --out /tmp/exports --max-new-tokens 10  # tiny
    python scripts/export_check.py /tmp/tiny --data-dir /tmp/tinydata --out /tmp/exports --max-new-tokens 10 \\
        --gguf --ctx 32 64 --sweep-tokens 512                                            # tiny, llama.cpp

Each export goes to OUT/<run folder name> (OUT/<name>.gguf): a place that holds something already
(an earlier export, files of the user's) is refused unless --overwrite, as export.py does.
"""

from __future__ import annotations

import mvgpt.kit.starting  # noqa: F401  first, before torch loads: Ctrl-C meanwhile is one line

# isort: split
import argparse
import math
import os
from pathlib import Path

import torch

# The sweep's chunking and scoring, used as is so llama.cpp reads exactly the same chunks. The one
# import of it: if the sweep moves (e.g. to scripts/long_context.py), change this line.
from long_context import chunk_losses

from mvgpt.checkpoint import CHECKPOINT_NAME, checkpoint_arg, checkpoint_path, load_model
from mvgpt.data import DATA_DIR, data_tokenizer_hash, load_tokens, prepared_data
from mvgpt.device import machine
from mvgpt.export.gguf import (
    export_gguf,
    ggml_activation,
    gguf_rope,
    llama_cpp_greedy,
    llama_cpp_logits,
    llama_cpp_missing,
    llama_cpp_model,
)
from mvgpt.export.hf import export, missing_extra
from mvgpt.extension.long_context import set_context
from mvgpt.extension.rope_scaling import RopeScaling
from mvgpt.kit.errors import (
    ArgumentParser,
    UserError,
    at_least,
    positive_float,
    positive_int,
    run_main,
    writable_folder,
)
from mvgpt.kit.io import write_json
from mvgpt.kit.runfolder import claim, claim_file, writable_file
from mvgpt.tokenizer import Tokenizer


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where a and b differ (or where one ends), None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.no_grad()
def check(
    ckpt: str, tokenizer: Tokenizer, tok_hash: str, target: Path, prompt: str, max_new_tokens: int, held_out: str
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
    folder = export(model, tokenizer, target, checkpoint_path(ckpt), state)
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


# ----------------------------------------------------------------------------------------------
# llama.cpp (--gguf)

LLAMA_CPP_METHODS = ("none", "linear", "yarn", "ntk")  # what llama.cpp's own rope options compute as we do


class LlamaCppAsModel:
    """llama.cpp behind the one call chunk_losses makes, `model(idx (1, T))` -> (logits (1, T, V), None),
    so the sweep's function scores its logits exactly as it scores ours."""

    def __init__(self, llm) -> None:
        self.llm = llm
        self.wte = torch.nn.Embedding(1, 1)  # chunk_losses reads model.wte.weight.device: the CPU

    def __call__(self, idx: torch.Tensor):
        return llama_cpp_logits(self.llm, idx[0].tolist())[None], None


def llama_cpp_rope(model, method: str, ctx: int, factor: float) -> dict | None:
    """llama.cpp's run-time rope options for our method at ctx (None: llama.cpp has no such method).

    yarn and ntk leave the angles alone up to the training context, in mvGPT: plain RoPE there."""
    c = model.config
    if method not in LLAMA_CPP_METHODS or (not c.rope and (method != "none" or ctx > c.block_size)):
        return None
    if not c.rope:
        return {}
    if method in ("yarn", "ntk") and ctx <= c.block_size:
        method = "none"
    if method == "none":
        return gguf_rope(c, None)
    return gguf_rope(c, RopeScaling(method, c.block_size, ctx, factor if method == "linear" else None))


@torch.no_grad()
def check_gguf(ckpt: str, tokenizer: Tokenizer, tok_hash: str, target: Path, args: argparse.Namespace, val,
               held_out: str) -> dict:
    """Export one checkpoint as GGUF (to target); its greedy story, tokenizer and sweep under llama.cpp beside ours."""
    model, state = load_model(ckpt, "cpu", tok_hash)
    path = export_gguf(model, tokenizer, target, checkpoint_path(ckpt), state)
    threads = torch.get_num_threads()
    window = model.config.block_size

    # the greedy story and the tokenizer, inside the training window
    ids = tokenizer.encode(args.prompt) or [tokenizer.eot]
    n_new = min(args.max_new_tokens, window - len(ids))
    llm = llama_cpp_model(path, window, {}, threads)
    ours = torch.cat(list(model.generate(torch.tensor([ids]), n_new, temperature=0)), dim=1)[0].tolist()
    theirs = llama_cpp_greedy(llm, ids, n_new)
    held_ours = tokenizer.encode(held_out)
    held_theirs = llm.tokenize(held_out.encode("utf-8"), add_bos=False, special=True)
    del llm

    rows, skipped = [], []
    factor = args.rope_factor or max(args.ctx) / window  # linear: one factor for all contexts, as the sweep
    for ctx in args.ctx:
        for method in args.rope_scaling:
            rope = llama_cpp_rope(model, method, ctx, factor)
            if rope is None:
                skipped.append(f"{method} at {ctx}")
                continue
            set_context(model, ctx, method, factor if method == "linear" else None)
            ours_losses = chunk_losses(model, val, ctx, args.sweep_tokens)
            with ggml_activation(model):
                ggml_losses = chunk_losses(model, val, ctx, args.sweep_tokens)
            llm = llama_cpp_model(path, ctx, rope, threads)
            theirs_losses = chunk_losses(LlamaCppAsModel(llm), val, ctx, args.sweep_tokens)
            del llm
            row = {"ctx": ctx, "method": method, "llama_cpp_options": rope, "tokens": len(ours_losses),
                   "loss_mvgpt": ours_losses.mean().item(), "loss_mvgpt_ggml_gelu": ggml_losses.mean().item(),
                   "loss_llama_cpp": theirs_losses.mean().item(),
                   "max_token_loss_difference": (theirs_losses - ours_losses).abs().max().item(),
                   "max_token_loss_difference_ggml_gelu": (theirs_losses - ggml_losses).abs().max().item()}
            row["perplexity_mvgpt"] = math.exp(row["loss_mvgpt"])
            row["perplexity_llama_cpp"] = math.exp(row["loss_llama_cpp"])
            rows.append(row)
            print(f"  n_ctx {ctx:>5} {method:<8} loss mvGPT {row['loss_mvgpt']:.5f} (ggml GELU "
                  f"{row['loss_mvgpt_ggml_gelu']:.5f})  llama.cpp {row['loss_llama_cpp']:.5f}  "
                  f"ppl {row['perplexity_mvgpt']:.3f} / {row['perplexity_llama_cpp']:.3f}  "
                  f"max |token loss diff| {row['max_token_loss_difference']:.1e}")
    set_context(model)
    return {
        "checkpoint": str(checkpoint_path(ckpt)),
        "export": str(path),
        "architecture": "gptneox" if model.config.rope else "gpt2",
        "step": state.get("step"),
        "train_ctx": window,
        "prompt": args.prompt,
        "new_tokens": n_new,
        "match": ours == theirs,
        "first_difference": first_difference(ours, theirs),
        "held_out_tokens": len(held_ours),
        "held_out_tokens_match": held_theirs == held_ours,
        "story_mvgpt": tokenizer.decode(ours),
        "sweep": rows,
        "not_in_llama_cpp": skipped,
    }


def main_gguf(args: argparse.Namespace, tokenizer: Tokenizer, tok_hash: str, held_out: str) -> dict:
    missing = llama_cpp_missing()
    if missing:
        raise SystemExit(f"error: {missing}")
    import llama_cpp

    if any(n < 2 for n in args.ctx):
        raise SystemExit("error: --ctx must be at least 2 tokens (half of each chunk is scored)")
    val = load_tokens(args.data_dir, "val")
    models = []
    for ckpt in args.checkpoints:
        print(f"{ckpt}: llama.cpp {llama_cpp.__version__}")
        models.append(check_gguf(ckpt, tokenizer, tok_hash, args.targets[ckpt], args, val, held_out))
        row = models[-1]
        print(f"  greedy story, {row['new_tokens']} tokens: {'MATCH' if row['match'] else 'DIFFERENT'}; "
              f"{row['held_out_tokens']:,} held-out tokens {'same' if row['held_out_tokens_match'] else 'DIFFERENT'}")
        if row["not_in_llama_cpp"]:
            print(f"  not in llama.cpp: {', '.join(row['not_in_llama_cpp'])}")
    result = {"machine": machine("cpu"), "llama_cpp": f"llama-cpp-python {llama_cpp.__version__} "
              "(llama.cpp built from source by pip install llama-cpp-python)", "contexts": args.ctx,
              "methods": args.rope_scaling, "linear_factor": args.rope_factor, "sweep_tokens": args.sweep_tokens,
              "models": models}
    print(f"measured on {result['machine']}")
    if args.json:
        write_json(args.json, result)
    if not all(m["match"] and m["held_out_tokens_match"] for m in models):
        raise SystemExit("error: llama.cpp and mvGPT disagree (see above)")
    return result


def export_targets(out: Path, ckpts: list[str], gguf: bool) -> dict[str, Path]:
    """Where each checkpoint's export goes: OUT/<its run folder's name> (or OUT/<name>.gguf); a name
    that two run folders share gets -2, -3, ... so that no export replaces another."""
    targets, taken = {}, set()
    for ckpt in ckpts:
        file = Path(checkpoint_path(ckpt)).resolve()  # a run folder's name, or a loose file's (my.pt: my)
        name = base = file.parent.name if file.name == CHECKPOINT_NAME else file.stem
        n = 1
        while name in taken:
            n += 1
            name = f"{base}-{n}"
        taken.add(name)
        targets[ckpt] = out / f"{name}.gguf" if gguf else out / name
    return targets


def claim_outputs(args: argparse.Namespace) -> None:
    """Before any work: each checkpoint given once, every export's place free (or --overwrite), none an input."""
    seen: dict[Path, str] = {}
    for ckpt in args.checkpoints:
        same = seen.setdefault(checkpoint_path(ckpt).resolve(), ckpt)
        if same != ckpt or args.checkpoints.count(ckpt) > 1:
            raise UserError(f"{ckpt} is given twice (as {same}): give each checkpoint once")
    reads = {f"checkpoint {c}": checkpoint_path(c) for c in args.checkpoints} | {"--data-dir": args.data_dir}
    args.targets = export_targets(Path(args.out), args.checkpoints, args.gguf)
    for target in args.targets.values():
        if args.gguf:
            claim_file(target, "export", overwrite=args.overwrite, reads=reads)
        else:
            claim(target, "export", "export", overwrite=args.overwrite, reads=reads)
    if args.json:  # nor over an export this check writes, whole (a .gguf) or a file of it
        making = [("the export", target, None if args.gguf else "export") for target in args.targets.values()]
        claim_file(args.json, "--json", reads=reads, making=making)


def main(argv: list[str] | None = None) -> list[dict] | dict:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="*", type=checkpoint_arg,
                   default=["checkpoints/pretrain", "checkpoints/pretrain-rope"],
                   help="run folders or checkpoint files (default: both pretrained models)")
    p.add_argument("--data-dir", type=prepared_data, default=str(DATA_DIR),
                   help="where the tokenizer and held-out tokens are")
    p.add_argument("--out", type=writable_folder, default="exports", help="exports go to OUT/<run folder name>")
    p.add_argument("--prompt", default="Once upon a time")
    p.add_argument("--max-new-tokens", type=positive_int, default=200, help="must stay inside the training window")
    p.add_argument("--held-out-tokens", type=positive_int, default=50000,
                   help="held-out tokens decoded to text and re-encoded by both tokenizers")
    p.add_argument("--json", type=writable_file, help="also write the results here")
    p.add_argument("--gguf", action="store_true", help="check llama.cpp on GGUF exports instead of transformers")
    p.add_argument("--overwrite", action="store_true", help="replace exports (or files) already at OUT/<name>")
    p.add_argument("--ctx", type=at_least(2), nargs="+", default=[256, 512], help="--gguf: the sweep's contexts")
    p.add_argument("--rope-scaling", nargs="+", default=list(LLAMA_CPP_METHODS), choices=LLAMA_CPP_METHODS,
                   help="--gguf: the sweep's methods (those llama.cpp has)")
    p.add_argument("--rope-factor", type=positive_float,
                   help="--gguf: linear's fixed factor (default: largest --ctx / training context)")
    p.add_argument("--sweep-tokens", type=positive_int, default=16384,
                   help="--gguf: held-out tokens read per sweep cell")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never reach for the Hub
    claim_outputs(args)
    if lacking := missing_extra("gguf" if args.gguf else "check"):
        raise UserError(f"the check needs the export extra: {lacking}")

    tokenizer = Tokenizer.load(Path(args.data_dir) / "tokenizer.json")
    tok_hash = data_tokenizer_hash(args.data_dir) or tokenizer.hash
    held_out = tokenizer.decode(load_tokens(args.data_dir, "val")[: args.held_out_tokens].tolist())
    if args.gguf:
        return main_gguf(args, tokenizer, tok_hash, held_out)
    rows = []
    for ckpt in args.checkpoints:
        row = check(ckpt, tokenizer, tok_hash, args.targets[ckpt], args.prompt, args.max_new_tokens, held_out)
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
    run_main(main)
