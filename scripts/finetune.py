"""Instruction fine-tuning with LoRA: the pretrained weights stay frozen, each linear layer of the
blocks learns a low-rank update (about 2% of the weights), saved as a file of its own.

The instructions are made from our own TinyStories (mvgpt/instruct.py): `Words:` three words a
story uses, `Features: Dialogue` when it has quoted speech, then `Story:` and the story; the loss
is on the story's tokens only. The run folder (checkpoints/lora-rope for a rope base, lora for
learned positions) holds the adapter (adapter.pt: A and B, the optimizer, the step, and the base's
config, tokenizer hash and weights hash) and the log. After training, the base and the fine-tuned
model are measured on held-out prompts: the share of requested words their stories use, the share
of Dialogue prompts answered with quoted speech, and the held-out loss on story tokens.

Examples:
    python scripts/finetune.py --init-from checkpoints/pretrain-rope --minutes 3 --json results/lora.json
    python scripts/finetune.py --init-from checkpoints/pretrain-rope --resume        # continue a stopped run
    python scripts/finetune.py --init-from checkpoints/pretrain-rope --measure       # measure the saved adapter
    python scripts/finetune.py --init-from checkpoints/pretrain-rope --merge checkpoints/lora-rope-merged
    python scripts/sample.py checkpoints/pretrain-rope --adapter checkpoints/lora-rope \\
        --prompt $'Words: kite, windy, string\\nFeatures: Dialogue\\nStory:\\n'
    python scripts/finetune.py --init-from /tmp/tiny --data-dir /tmp/tinydata --out-dir /tmp/tiny-lora \\
        --max-steps 10 --batch-size 4 --prompts 4 --gen-tokens 20 --device cpu     # a tiny CPU run, seconds

The run folder holds one fine-tune: a folder with an adapter in it needs --resume (continue it) or
--overwrite (start again); one holding anything else (the base's run, data, an export) is refused,
and so is --merge OUT where OUT is the base's folder. A resume keeps the adapter's rank and alpha
and its base; the schedule, time, evaluation and measuring flags may change. An adapter is saved
only from sane weights (mvgpt/kit/runfolder.py's LossWatch): a fine-tune whose loss runs away stops,
and the adapter saved before stays as it was.
"""

from __future__ import annotations

import mvgpt.kit.starting  # noqa: F401  first, before torch loads: Ctrl-C meanwhile is one line

# isort: split
import argparse
import copy
import signal
import time
from pathlib import Path

import torch

from mvgpt.checkpoint import checkpoint_in, checkpoint_path, load_model, save_checkpoint
from mvgpt.data import DATA_DIR, data_tokenizer_hash, no_data
from mvgpt.device import CHOICES as DTYPE_CHOICES
from mvgpt.device import dtype_name, machine, pick_device, resolve_dtype
from mvgpt.instruct import (
    IGNORE,
    example_rows,
    has_dialogue,
    held_out_examples,
    instruct_batch,
    load_instruct,
    prepare_instruct,
    story_loss,
    words_used,
)
from mvgpt.kit.errors import (
    ArgumentParser,
    UserError,
    again,
    folder_name,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    run_main,
    seed,
    writable_folder,
)
from mvgpt.kit.io import clip, write_json
from mvgpt.kit.runfolder import RunLock, claim, claim_file, tensorboard_folder, writable_file
from mvgpt.kit.runlog import RunLog, read_log
from mvgpt.lora import (
    DEFAULT_ALPHA,
    DEFAULT_RANK,
    adapter_path,
    apply_lora,
    load_adapter,
    lora_parameters,
    max_rank,
    merge,
    read_adapter,
    save_adapter,
    trainable_share,
    weights_hash,
)
from mvgpt.model import GPT
from mvgpt.perf.cpu_attention import batch_attention_where_it_pays
from mvgpt.perf.threads import cpu_threads, describe, threads_arg
from mvgpt.tokenizer import Tokenizer
from mvgpt.train import LossWatch, Step, StopSignals, all_finite, check_fits_training, diverged, lr_at

TAGS = {"loss": "loss/train_story", "lr": "lr", "val_loss": "loss/held_out_story"}  # log.jsonl's keys in TensorBoard


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--init-from", default="checkpoints/pretrain-rope",
                   help="the base: a run folder or checkpoint")
    p.add_argument("--data-dir", default=str(DATA_DIR))
    p.add_argument("--out-dir", type=folder_name,
                   help="run folder (default: checkpoints/lora-rope, or lora for learned positions)")
    p.add_argument("--runs-dir", type=tensorboard_folder, default="runs", help="TensorBoard logs, one folder per run")
    p.add_argument("--rank", type=positive_int,
                   help=f"rank r of each update (default {DEFAULT_RANK}: about 2%% of 6 x 384)")
    p.add_argument("--alpha", type=positive_float,
                   help=f"the update is scaled by alpha / r (default {DEFAULT_ALPHA:g})")
    p.add_argument("--lr", type=positive_float, default=2e-3)
    p.add_argument("--warmup", type=non_negative_int, default=10, help="warm-up steps")
    p.add_argument("--grad-clip", type=non_negative_float, default=1.0, help="gradient norm clip (0: none)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="examples (prompt + story) per step")
    p.add_argument("--max-steps", type=positive_int, default=150, help="the schedule's length, and a stop")
    p.add_argument("--minutes", type=non_negative_float, default=0.0, help="time budget for training (0: none)")
    p.add_argument("--eval-every", type=positive_int, default=25)
    p.add_argument("--eval-examples", type=positive_int, default=64, help="held-out examples for the story loss")
    p.add_argument("--ckpt-every", type=positive_int, default=25)
    p.add_argument("--seed", type=seed, default=1337, help="A's draw, the batches and the measured stories")
    p.add_argument("--device", help="cpu, cuda, mps (default: the best present)")
    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                   help="the adapters' products in bfloat16 (weights stay float32) or float32; auto: bf16 where native")
    p.add_argument("--threads", type=threads_arg,
                   help="CPU threads, fixed (default: the cores other programs leave free, looked at as it trains)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run folder's adapter (its rank, alpha and base; other flags may change)")
    p.add_argument("--overwrite", action="store_true",
                   help="start again in a run folder that holds an adapter; with --merge, replace OUT's checkpoint")
    p.add_argument("--prompts", type=non_negative_int, default=24,
                   help="held-out prompts measured after training (0: none)")
    p.add_argument("--gen-tokens", type=positive_int, default=160, help="at most this many tokens per measured story")
    p.add_argument("--temperature", type=non_negative_float, default=0.8, help="of the measured stories (0: greedy)")
    p.add_argument("--top-k", type=positive_int, default=50)
    p.add_argument("--measure", action="store_true", help="only measure the run folder's adapter, no training")
    p.add_argument("--merge", metavar="OUT", type=writable_folder,
                   help="only write base + the run folder's adapter, merged, to OUT")
    p.add_argument("--json", type=writable_file, help="write the summary (losses, share, sizes, measurements) here")
    args = p.parse_args(argv)
    for clash, message in [
        (args.measure and args.merge, "--measure and --merge are separate steps: run one, then the other"),
        (args.resume and (args.measure or args.merge), "--resume trains: drop it with --measure or --merge"),
        (args.resume and args.overwrite, "--resume and --overwrite contradict each other: pick one"),
        (args.measure and args.overwrite, "--measure writes no adapter: drop --overwrite"),
        (args.measure and args.prompts == 0, "--measure needs --prompts of at least 1"),
    ]:
        if clash:
            p.error(message)
    return args


def default_out_dir(model: GPT) -> Path:
    """checkpoints/lora-rope for a rope base, checkpoints/lora for learned positions."""
    return Path("checkpoints") / ("lora-rope" if model.config.rope else "lora")


@torch.no_grad()
def held_out_story_loss(model: GPT, rows: tuple[torch.Tensor, torch.Tensor], device, batch_size: int = 16) -> float:
    """Mean loss over the story tokens of the held-out rows (each an example from its prompt)."""
    was_training = model.training
    model.eval()
    x, y = rows
    total, count = 0.0, 0
    for i in range(0, len(x), batch_size):
        xb, yb = x[i : i + batch_size].to(device), y[i : i + batch_size].to(device)
        n = int((yb != IGNORE).sum())
        total += story_loss(model, xb, yb).item() * n
        count += n
    model.train(was_training)
    return total / count


@torch.no_grad()
def write_story(model: GPT, tokenizer: Tokenizer, prompt: str, args: argparse.Namespace, seed: int,
                device) -> list[int]:
    """The model's story for a prompt (after <eot>, as an example starts), its tokens up to <eot>."""
    idx = torch.tensor([[tokenizer.eot, *tokenizer.encode(prompt)]], device=device)
    out = []
    for token in model.generate(idx, args.gen_tokens, args.temperature, args.top_k, seed):
        if token.item() == tokenizer.eot:
            break
        out.append(token.item())
    return out


def measure(models: dict[str, GPT], args: argparse.Namespace, device, rows) -> dict:
    """Does it follow instructions? The same held-out prompts and seeds for each model."""
    tokenizer = Tokenizer.load(Path(args.data_dir) / "tokenizer.json")
    examples = held_out_examples(args.data_dir, args.prompts)
    asked = [e for e in examples if e.dialogue]
    t0 = time.perf_counter()
    results, sample = [], {"prompt": examples[0].prompt}
    from tqdm import tqdm

    for name, model in models.items():
        model.eval()
        used, quotes, unasked, lengths = [], [], [], []
        for i, e in enumerate(tqdm(examples, desc=f"measure {name}", leave=False, disable=None)):
            ids = write_story(model, tokenizer, e.prompt, args, args.seed + i, device)
            story = tokenizer.decode(ids)
            used += words_used(story, e.words)
            (quotes if e.dialogue else unasked).append(has_dialogue(story))
            lengths.append(len(ids))
            if i == 0:
                sample[name] = story
        results.append({
            "model": name,
            "story_loss": held_out_story_loss(model, rows, device),
            "words_used": sum(used) / len(used),
            "dialogue_quoted": sum(quotes) / len(quotes) if quotes else None,
            "quotes_unasked": sum(unasked) / len(unasked) if unasked else None,
            "story_tokens": sum(lengths) / len(lengths),
        })
    seconds = time.perf_counter() - t0
    print(f"{'model':<12} {'story loss':>10} {'words used':>11} {'Dialogue quoted':>16} {'quotes unasked':>15}")
    for r in results:
        dq, qu = r["dialogue_quoted"], r["quotes_unasked"]
        print(f"{r['model']:<12} {r['story_loss']:>10.4f} {r['words_used']:>11.1%} "
              f"{'-' if dq is None else f'{dq:.1%}':>16} {'-' if qu is None else f'{qu:.1%}':>15}")
    print(f"{len(examples)} held-out prompts ({len(asked)} ask for Dialogue), {len(rows[0])} held-out examples "
          f"for the loss, {args.gen_tokens} tokens at most, in {seconds:.0f} s")
    return {"prompts": len(examples), "dialogue_prompts": len(asked), "loss_examples": len(rows[0]),
            "gen_tokens": args.gen_tokens, "temperature": args.temperature, "top_k": args.top_k, "seed": args.seed,
            "seconds": seconds, "rows": results, "sample": sample}


def file_sizes(out_dir: Path, args: argparse.Namespace, model: GPT) -> dict:
    adapter_bytes = adapter_path(out_dir).stat().st_size
    base_bytes = checkpoint_path(args.init_from).stat().st_size
    trainable, total = trainable_share(model)
    weight_bytes = sum(p.numel() * p.element_size() for p in lora_parameters(model))
    return {"trainable": trainable, "params": total, "trainable_share": trainable / total,
            "adapter_bytes": adapter_bytes, "adapter_weight_bytes": weight_bytes, "checkpoint_bytes": base_bytes,
            "adapter_share_of_checkpoint": adapter_bytes / base_bytes}


def merge_to(out: str, base: GPT, base_state: dict, args: argparse.Namespace, tok_hash: str | None,
             out_dir: Path) -> dict:
    """Write base + adapter, merged, as an ordinary checkpoint that every reader loads: into a new or
    empty folder, or (--overwrite) over a checkpoint, never over the base or the adapter it reads."""
    reads = {"--init-from": checkpoint_path(args.init_from), "--out-dir (the adapter)": out_dir,
             "--data-dir": args.data_dir}
    claim(out, "checkpoint", "--merge", overwrite=args.overwrite, reads=reads)
    state = load_adapter(base, out_dir, tok_hash)
    merge(base)
    lora = {"adapter": str(adapter_path(out_dir)), "base": str(args.init_from), "rank": state["rank"],
            "alpha": state["alpha"], "steps": state.get("step"), "args": state.get("args")}
    with RunLock(out):  # no training writes into OUT meanwhile
        claim(out, "checkpoint", "--merge", overwrite=args.overwrite, reads=reads)
        path = save_checkpoint(checkpoint_in(out), base, tokenizer_hash=tok_hash, step=base_state.get("step"),
                               args=base_state.get("args"), lora=lora)
    print(f"merged {adapter_path(out_dir)} into {args.init_from} -> {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return {"merged": str(path)}


def start_or_resume(model: GPT, args: argparse.Namespace, out_dir: Path, tok_hash: str | None, log_path: Path):
    """Wrap `model` with new adapters, or load the run folder's (--resume) with their optimizer and step."""
    step, elapsed, losses = 0, 0.0, []
    if args.resume:
        saved = read_adapter(out_dir)
        missing = [k for k in ("optimizer", "step", "elapsed") if k not in saved]
        if missing:
            raise UserError(f"{adapter_path(out_dir)} has no {', '.join(missing)}: it cannot be continued; "
                            "start again with --overwrite")
        for flag in ("rank", "alpha"):
            if getattr(args, flag) is not None and getattr(args, flag) != saved[flag]:
                raise SystemExit(f"error: {adapter_path(out_dir)} has {flag} {saved[flag]:g}, not "
                                 f"{getattr(args, flag):g}: drop --{flag} to resume, or start a new run")
        saved = load_adapter(model, out_dir, tok_hash)
        args.rank, args.alpha = saved["rank"], saved["alpha"]
    else:
        args.rank = args.rank or DEFAULT_RANK
        args.alpha = args.alpha or DEFAULT_ALPHA
        apply_lora(model, args.rank, args.alpha, args.seed)
    params = lora_parameters(model)
    optimizer = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0)
    if args.resume:
        try:
            optimizer.load_state_dict(saved["optimizer"])
        except (ValueError, KeyError, TypeError, RuntimeError) as e:
            raise UserError(f"{adapter_path(out_dir)}'s optimizer does not fit its adapter ({clip(str(e), 100)}): "
                            "start again with --overwrite") from None
        step, elapsed, losses = saved["step"], saved["elapsed"], list(saved.get("losses") or [])
        read_log(log_path, step)
        print(f"resuming {out_dir} at step {step} ({elapsed / 60:.1f} minutes done)")
    else:  # a new fine-tune: the folder was claimed for it, an old one there goes (--overwrite)
        adapter_path(out_dir).unlink(missing_ok=True)
        log_path.unlink(missing_ok=True)
    return params, optimizer, step, elapsed, losses


def train(model: GPT, args: argparse.Namespace, device, tok_hash: str | None, out_dir: Path) -> dict:
    """Fine-tune an adapter on the base `model` (wrapped in place): batches of examples, loss on
    the story tokens, the base frozen."""
    base_hash = weights_hash(model)
    T = model.config.block_size
    train_data = load_instruct(args.data_dir, "train", T)
    val = load_instruct(args.data_dir, "val", T)
    if not len(train_data[2]) or not len(val[2]):
        raise SystemExit(f"error: no prompt in {args.data_dir} leaves room for its story in a window of {T} tokens: "
                         "fine-tune a model with a longer context")
    rows = example_rows(*val[:2], val[2][: args.eval_examples], T)
    log_path = out_dir / "log.jsonl"

    params, optimizer, step, elapsed, losses = start_or_resume(model, args, out_dir, tok_hash, log_path)
    dtype = resolve_dtype(args.dtype, device)
    args.dtype = dtype_name(dtype)  # the dtype used, in the adapter's args and the summary
    trainable, total = trainable_share(model)
    threads = cpu_threads(args.threads, device)  # the cores other programs leave free (mvgpt/perf/threads.py)
    on = f"{device}, {threads.start() if threads else describe(torch.get_num_threads())}" \
        if device.type == "cpu" else str(device)
    print(f"{out_dir.name}: LoRA rank {args.rank}, alpha {args.alpha:g} on {len(params) // 2} linear layers: "
          f"{trainable:,} trainable weights of {total:,} ({trainable / total:.2%}), base {args.init_from} frozen, "
          f"on {on} in {args.dtype}")

    out_dir.mkdir(parents=True, exist_ok=True)
    # the one training step (mvgpt/train.py): the adapters train, in the run's precision (bf16 products where
    # native, as in pretraining; attention batched on a CPU, as there); the loss is on the story tokens only
    batch_attention_where_it_pays(model, device, dtype)
    train_step = Step(model, optimizer, device, dtype, grad_clip=args.grad_clip,
                      loss=lambda x, y: story_loss(model, x, y))
    budget = args.minutes * 60 if args.minutes else float("inf")
    val_loss, evaluated_at = None, None
    watch, saved_at, start = LossWatch(losses), step, step  # has the fine-tune diverged? (mvgpt/train.py)

    def save() -> Path:
        """Save the adapter, only from sane weights: finite, and their held-out story loss (this
        step's evaluation, or one batch) not run away; otherwise stop, the last adapter kept."""
        nonlocal saved_at
        problem = None if all_finite(params) else f"the adapter's weights became non-finite at step {step}"
        if problem is None:
            check = val_loss if evaluated_at == step else held_out_story_loss(model, (rows[0][:8], rows[1][:8]), device)
            problem = watch.check(check, step)
        if problem:
            raise diverged(problem, out_dir, saved_at, "adapter")
        saved_at = step
        return save_adapter(out_dir, model, base_hash, tok_hash, optimizer=optimizer.state_dict(), step=step,
                            elapsed=elapsed, losses=losses, val_loss=val_loss, base=str(args.init_from),
                            args=vars(args))

    log = RunLog(out_dir, args.runs_dir, step, args.max_steps, tags=TAGS)
    with StopSignals() as stop:
        try:
            model.train()
            while step < args.max_steps and elapsed < budget:
                t0 = time.perf_counter()
                # warm-up, then cosine to a tenth of --lr at --max-steps (mvgpt/train.py)
                lr = lr_at(step, args.lr, args.warmup, 0.1, args.max_steps)
                x, y = instruct_batch(*train_data, args.batch_size, T, args.seed, step)
                loss, _ = train_step(x, y, lr)
                loss_value = loss.item()
                problem = watch.step(loss_value, step + 1)  # non-finite, or run away: stop before any save
                if problem:
                    raise diverged(problem, out_dir, saved_at, "adapter")
                step += 1
                elapsed += time.perf_counter() - t0
                losses.append(loss_value)
                if threads and (line := threads.check()):  # a core taken, or given back: the threads follow
                    log.say(f"step {step}: {line}")
                record = {"step": step, "loss": loss_value, "lr": lr, "elapsed": elapsed}
                if step % args.eval_every == 0 or step == args.max_steps:
                    t1 = time.perf_counter()
                    val_loss, evaluated_at = held_out_story_loss(model, rows, device), step
                    elapsed += time.perf_counter() - t1
                    record["val_loss"] = val_loss
                log.write(record)
                if step % args.ckpt_every == 0 or stop.signal is not None:
                    save()
                if stop.signal is not None:
                    log.say(f"interrupted at step {step}: saved {out_dir}; {again('continue with --resume')}")
                    raise SystemExit(130 if stop.signal == signal.SIGINT else 143)
            if step == start:  # resumed when it had finished: nothing trained, the adapter stays as it is
                val_loss, path = read_adapter(out_dir).get("val_loss"), adapter_path(out_dir)
            else:
                if evaluated_at != step:
                    val_loss, evaluated_at = held_out_story_loss(model, rows, device), step
                    log.write({"step": step, "val_loss": val_loss, "elapsed": elapsed})
                path = save()
        finally:
            log.close()
    size = path.stat().st_size
    base_size = checkpoint_path(args.init_from).stat().st_size
    shown = "-" if val_loss is None else f"{val_loss:.4f}"
    print(f"{out_dir.name}: {step} steps in {elapsed / 60:.1f} min, held-out story loss {shown}; "
          f"adapter {path} {size / 1e6:.2f} MB, {size / base_size:.1%} of the base checkpoint's "
          f"{base_size / 1e6:.1f} MB")
    return read_adapter(out_dir)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = pick_device(args.device)
    tok_hash = data_tokenizer_hash(args.data_dir)
    if tok_hash is None:
        raise SystemExit(f"error: {no_data(args.data_dir)}")  # the fix for each case, as the other scripts say
    base, base_state = load_model(args.init_from, device, tok_hash)
    check_fits_training(base.config, args.batch_size)  # the batch's activations too: said before any work
    if args.rank is not None and args.rank > max_rank(base):
        raise UserError(f"--rank {args.rank} makes an update larger than the layer it adapts (this model's smallest "
                        f"takes rank {max_rank(base)} at most): give a smaller --rank (default {DEFAULT_RANK})")
    out_dir = Path(args.out_dir) if args.out_dir else default_out_dir(base)
    reads = {"--init-from": checkpoint_path(args.init_from), "--data-dir": args.data_dir}
    if args.json:  # never over an input, nor over a file of the adapter or the merge this command makes
        adapter = {"--out-dir (the adapter)": adapter_path(out_dir)} if args.measure or args.merge else {}
        making = [("--merge", args.merge, "checkpoint")] if args.merge else [] if args.measure else [
            ("--out-dir", out_dir, "lora")]
        claim_file(args.json, "--json", reads=reads | adapter, making=making)
    if args.merge:
        return merge_to(args.merge, base, base_state, args, tok_hash, out_dir)
    if not args.measure:  # the run folder: ours alone (mvgpt/kit/runfolder.py), checked again once it is locked
        claim(out_dir, "lora", "--out-dir", resume=args.resume, overwrite=args.overwrite, reads=reads)
    meta = prepare_instruct(args.data_dir)

    model = copy.deepcopy(base)  # the base stays as it is, to be measured beside the fine-tuned model
    if args.measure:
        state = load_adapter(model, out_dir, tok_hash)
    else:
        with RunLock(out_dir):
            claim(out_dir, "lora", "--out-dir", resume=args.resume, overwrite=args.overwrite, reads=reads)
            state = train(model, args, device, tok_hash, out_dir)
    model.eval()
    trained, losses = state.get("args") or {}, state.get("losses") or []
    summary = {"run": out_dir.name, "base": str(args.init_from), "rank": state["rank"], "alpha": state["alpha"],
               "layers": len(state.get("targets") or []), "steps": state.get("step"),
               "batch_size": trained.get("batch_size"), "lr": trained.get("lr"),
               "minutes": (state.get("elapsed") or 0.0) / 60, "val_loss": state.get("val_loss"),
               "train_loss_first": losses[0] if losses else None, "train_loss_last": losses[-1] if losses else None,
               "train_examples": meta["train"]["examples"], "val_examples": meta["val"]["examples"],
               **file_sizes(out_dir, args, model), "machine": machine(device)}
    if args.prompts:
        val = load_instruct(args.data_dir, "val", model.config.block_size)
        rows = example_rows(*val[:2], val[2][: args.eval_examples], model.config.block_size)
        summary["measure"] = measure({"base": base, out_dir.name: model}, args, device, rows)
    if args.json:
        write_json(args.json, summary)
    return summary


if __name__ == "__main__":
    run_main(main)
