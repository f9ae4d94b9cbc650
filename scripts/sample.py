"""Write a story from a prompt with a trained checkpoint, streaming tokens as they come.

With the KV cache, each new token runs through the model alone. Past the window, a rope model
slides its cache; a model with learned positions re-runs the last window for each token. The first
line on stderr says which one-token step writes (--decode-step: model.py's own, or the C step,
mvgpt/perf/one_token.c, where its build pays); stdout is the story alone.

Examples:
    python scripts/sample.py checkpoints/pretrain-rope --prompt "Once upon a time" --max-new-tokens 600
    python scripts/sample.py checkpoints/pretrain --prompt "Lily saw a cat." --temperature 0
    python scripts/sample.py checkpoints/pretrain-rope --dtype bfloat16    # bf16 weights: half the bytes a step reads
    python scripts/sample.py /tmp/tiny --data-dir /tmp/tinydata --device cpu --max-new-tokens 20
    python scripts/sample.py checkpoints/lora-rope \\
        --prompt $'Words: kite, windy, string\\nFeatures: Dialogue\\nStory:\\n'   # LoRA on its base, unmerged
    python scripts/sample.py checkpoints/pretrain-rope --adapter checkpoints/lora-rope   # the same, base named
    python scripts/sample.py checkpoints/pretrain-rope --decode-step model   # model.py's step, as the video wrote it
"""

from __future__ import annotations

import mvgpt.kit.starting  # noqa: F401  first, before torch loads: Ctrl-C meanwhile is one line

# isort: split
import argparse
import sys
from pathlib import Path

import torch

from mvgpt.checkpoint import find_model, load_source, model_arg
from mvgpt.data import DATA_DIR, data_tokenizer_hash, prepared_data
from mvgpt.device import CHOICES as DTYPE_CHOICES
from mvgpt.device import pick_device, resolve_dtype
from mvgpt.extension.flags import add_context_args, apply_context_args, check_context_args
from mvgpt.kit.errors import (
    ArgumentParser,
    UserError,
    non_negative_float,
    non_negative_int,
    positive_int,
    run_main,
    seed,
)
from mvgpt.lora import load_adapter
from mvgpt.model import GPT
from mvgpt.perf.fast_decode import add_decode_step_arg, use_decode_step
from mvgpt.perf.threads import cpu_threads, threads_arg
from mvgpt.tokenizer import Tokenizer


def load(path: str, adapter: str | None, device: torch.device, tok_hash: str | None) -> tuple[GPT, list[str]]:
    """The checkpoint at path, or a LoRA run folder read as its base with the adapter (as context.py
    reads it); --adapter puts one on a checkpoint. Returns the model and what to say of it."""
    source = find_model(path, tok_hash)
    said = []
    if source.adapter is not None:
        if adapter:
            raise UserError(f"{path} is a LoRA run already, on {source.checkpoint.parent.name}: drop --adapter")
        said.append(f"sampling with {source.name}")
    model = load_source(source, device, tok_hash)
    if adapter:
        load_adapter(model, adapter, tok_hash)
    return model, said


def main(argv: list[str] | None = None) -> str:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", type=model_arg,
                   help="run folder or checkpoint file (a LoRA run folder: its base, with the adapter)")
    p.add_argument("--prompt", default="Once upon a time")
    p.add_argument("--max-new-tokens", type=non_negative_int, default=300, help="may exceed the window")
    p.add_argument("--temperature", type=non_negative_float, default=0.8, help="0 is greedy")
    p.add_argument("--top-k", type=positive_int, default=50)
    p.add_argument("--seed", type=seed, default=1337)
    p.add_argument("--no-cache", action="store_true", help="re-read the last window for every token")
    p.add_argument("--data-dir", type=prepared_data, default=str(DATA_DIR), help="where the tokenizer is")
    p.add_argument("--device", help="cpu, cuda, mps (default: the best present)")
    p.add_argument("--threads", type=threads_arg,
                   help="CPU threads, fixed (default: the cores other programs leave free, looked at as it writes)")
    p.add_argument("--adapter", help="a LoRA run folder or adapter file for this checkpoint, applied unmerged")
    p.add_argument("--dtype", default="float32", choices=DTYPE_CHOICES,
                   help="the weights' dtype while sampling (bfloat16: half the bytes a decoding step reads)")
    add_context_args(p)
    add_decode_step_arg(p)
    args = p.parse_args(argv)
    check_context_args(p, args)

    device = pick_device(args.device)
    tokenizer = Tokenizer.load(Path(args.data_dir) / "tokenizer.json")
    tok_hash = data_tokenizer_hash(args.data_dir) or tokenizer.hash
    model, said = load(args.checkpoint, args.adapter, device, tok_hash)
    model.to(resolve_dtype(args.dtype, device))
    apply_context_args(model, args)  # --ctx: the window generate reads and slides
    ids = tokenizer.encode(args.prompt) or [tokenizer.eot]
    idx = torch.tensor([ids], device=device)
    if args.no_cache:  # no cache, no one-token step: every token is a forward over the window
        step = "decoding with model.py's forward over the last window for each token (--no-cache)"
    else:
        step = use_decode_step(model, args.decode_step, args.max_new_tokens)
        threads = cpu_threads(args.threads, device)  # on the cores other programs leave free, looked at as it writes
        if threads:
            threads.every_s = 2.0
            started = threads.start()
            step += f", on {started}" if threads.threads < threads.cores else ""  # said where a core is taken
            model.decode = threads.around(model.decode, lambda line: print(f"\nnote: {line}", file=sys.stderr))
    for line in (step, *said):  # stderr: stdout is the story alone
        print(line, file=sys.stderr, flush=True)
    print(args.prompt, end="", flush=True)
    stream, out = tokenizer.stream(), []  # whole characters only: a token can end inside one
    for token in model.generate(idx, args.max_new_tokens, args.temperature, args.top_k, args.seed, not args.no_cache):
        out.append(token.item())
        print(stream.add(out[-1]), end="", flush=True)
    print(stream.flush())
    return tokenizer.decode(out)


if __name__ == "__main__":
    run_main(main)
