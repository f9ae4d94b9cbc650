"""A LoRA fine-tune's step in float32 and in bf16, side by side: what training the adapters in bf16 buys.

finetune.py takes the step pretrain.py takes (mvgpt.train.Step), in the run's precision: bf16 products
where the CPU has bf16 units. This times that step on the default model (6 x 384) with rank-8 adapters
on its 24 linear layers, a batch of finetune.py's size (8 examples of 256 tokens, the loss on the
story's tokens only), once in float32 and once in bf16 in turn, round after round, and prints each
one's tokens/s and the ratio. Both start from the same weights and see the same batches.

How long: about a minute on a 2-core CPU.

Examples:
    python dev/lora_speed.py --json results/amd-epyc/lora-speed.json
    python dev/lora_speed.py --rounds 3 --n-layer 2 --n-embd 64 --n-head 2     # tiny, seconds
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from mvgpt.device import dtype_name, machine, resolve_dtype
from mvgpt.instruct import IGNORE, story_loss
from mvgpt.kit.errors import ArgumentParser, positive_int, run_main
from mvgpt.kit.io import write_json
from mvgpt.kit.runfolder import writable_file
from mvgpt.lora import DEFAULT_ALPHA, DEFAULT_RANK, apply_lora, lora_parameters
from mvgpt.model import GPT, GPTConfig
from mvgpt.perf.cpu_attention import batch_attention_where_it_pays
from mvgpt.perf.measure import tune_malloc
from mvgpt.train import Step


def lora_step(config: GPTConfig, dtype: torch.dtype, x: torch.Tensor, y: torch.Tensor) -> Step:
    """finetune.py's step on a fresh copy of the same base, in `dtype`."""
    torch.manual_seed(0)
    model = GPT(config).train()
    apply_lora(model, DEFAULT_RANK, DEFAULT_ALPHA, seed=0)
    batch_attention_where_it_pays(model, "cpu", dtype)
    optimizer = torch.optim.AdamW(lora_parameters(model), lr=2e-3, betas=(0.9, 0.99), weight_decay=0.0)
    return Step(model, optimizer, "cpu", dtype, loss=lambda a, b: story_loss(model, a, b))


def main(argv: list[str] | None = None) -> dict:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=positive_int, default=8, help="rounds of one step in each precision")
    p.add_argument("--batch-size", type=positive_int, default=8, help="finetune.py's default")
    p.add_argument("--n-layer", type=positive_int, default=6)
    p.add_argument("--n-head", type=positive_int, default=6)
    p.add_argument("--n-embd", type=positive_int, default=384)
    p.add_argument("--json", type=writable_file)
    args = p.parse_args(argv)
    tune_malloc()  # as the scripts run
    config = GPTConfig(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, rope=True)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, config.vocab_size, (args.batch_size, config.block_size), generator=g)
    y = torch.randint(0, config.vocab_size, (args.batch_size, config.block_size), generator=g)
    y[:, : config.block_size // 8] = IGNORE  # the prompt: no loss there, as an example's
    native = resolve_dtype("auto", "cpu")
    if native != torch.bfloat16:
        print(f"note: this CPU has no bf16 units ({machine('cpu')}): finetune.py trains in float32 here, and bf16 "
              "is shown only for the record")
    steps = {dtype: lora_step(config, dtype, x, y) for dtype in (torch.float32, torch.bfloat16)}
    for step in steps.values():  # the first step: the allocator, AdamW's state
        step(x, y)[0].item()
    times = {dtype: [] for dtype in steps}
    for _ in range(args.rounds):
        for dtype, step in steps.items():
            t0 = time.perf_counter()
            step(x, y)[0].item()
            times[dtype].append(time.perf_counter() - t0)
    tokens = x.numel()
    rows = [{"dtype": dtype_name(d), "step_s": statistics.median(t), "tokens_per_s": tokens / statistics.median(t)}
            for d, t in times.items()]
    for r in rows:
        print(f"LoRA step in {r['dtype']:<9} {r['step_s'] * 1e3:7.0f} ms  {r['tokens_per_s']:>8,.0f} tokens/s")
    ratio = rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"]
    print(f"bf16 over float32: {ratio:.2f}x, side by side on {machine('cpu')}")
    result = {"command": "python dev/lora_speed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": machine("cpu"), "native": dtype_name(native), "config": vars(args), "rows": rows,
              "bf16_over_float32": ratio}
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    run_main(main)
