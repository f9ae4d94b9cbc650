"""Pretrain mvGPT on TinyStories, with learned positions or (--rope) rotary embeddings.

The seed, the data, the batches and the schedule are the same for both kinds, so the position
embedding is the one difference between two runs. Each kind gets its own run folder
(checkpoints/pretrain, checkpoints/pretrain-rope), and TensorBoard a run of the same name.

A run is bounded by time (--minutes, 10 by default: the learning rate follows the clock and
reaches its floor when the time is up, on any device) or by steps (--max-steps: the schedule
follows the steps, and two runs from the same seed are identical). Matrix products run in
bfloat16 where the hardware does them natively (--dtype auto), with the weights kept in float32.

Examples:
    python scripts/pretrain.py                       # learned positions, 10 minutes
    python scripts/pretrain.py --rope                # rotary embeddings, same seed and batches
    python scripts/pretrain.py --rope --resume       # continue an interrupted run (and its clock)
    python scripts/pretrain.py --rope --max-steps 1000 --compile --json results/pretrain-rope.json
    python scripts/pretrain.py --n-layer 2 --n-embd 64 --n-head 2 --block-size 32 \\
        --batch-size 4 --max-steps 20 --out-dir /tmp/tiny          # a tiny CPU run, seconds
    torchrun --nproc_per_node 2 scripts/pretrain.py --rope      # two processes (DDP)
    python scripts/pretrain.py --init-from checkpoints/pretrain-rope --block-size 1024 \\
        --rope-scaling linear --max-steps 40                      # long-context fine-tune
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mvgpt.bench import machine, tune_malloc  # noqa: E402
from mvgpt.checkpoint import config_from_dict, read_checkpoint, save_checkpoint  # noqa: E402
from mvgpt.data import DATA_DIR, data_tokenizer_hash, get_batch, load_tokens  # noqa: E402
from mvgpt.device import pick_device  # noqa: E402
from mvgpt.io import write_json  # noqa: E402
from mvgpt.model import GPT, GPTConfig  # noqa: E402
from mvgpt.precision import CHOICES as DTYPE_CHOICES  # noqa: E402
from mvgpt.precision import autocast, dtype_name, resolve_dtype  # noqa: E402
from mvgpt.rope_scaling import METHODS  # noqa: E402
from mvgpt.train import configure_optimizer, lr_at  # noqa: E402

EVAL_SEED = 1234  # the held-out batches are the same for every run
DEFAULT_MINUTES = 10.0  # a run without --max-steps trains this long, as the episode does
clock = time.perf_counter  # the run's clock (tests drive the schedule with a fake one)


def run_name(args: argparse.Namespace) -> str:
    """The run folder's name: one per kind of position embedding (and context, if changed)."""
    name = "pretrain-rope" if args.rope else "pretrain"
    if args.init_from and args.block_size:
        name += f"-ctx{args.block_size}"
    if args.rope_scaling != "none":
        name += f"-{args.rope_scaling}"
    return name


@torch.no_grad()
def held_out_loss(model: GPT, val, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> float:
    model.eval()
    losses = []
    for i in range(args.eval_batches):
        x, y = get_batch(val, args.batch_size, model.config.block_size, EVAL_SEED, i)
        with autocast(device, dtype):
            losses.append(model(x.to(device), y.to(device))[1].item())
    model.train()
    return sum(losses) / len(losses)


def build_model(args: argparse.Namespace) -> GPT:
    """A new model from the flags, or (--init-from) one from a checkpoint's weights."""
    torch.manual_seed(args.seed)
    if not args.init_from:
        config = GPTConfig(
            vocab_size=args.vocab_size,
            block_size=args.block_size or 256,
            n_layer=args.n_layer,
            n_head=args.n_head,
            n_embd=args.n_embd,
            rope=args.rope,
            rope_theta=args.rope_theta,
        )
        if args.rope_scaling != "none":
            raise SystemExit("error: --rope-scaling is for a fine-tune to a longer context: add --init-from")
        return GPT(config)
    state = read_checkpoint(args.init_from)
    saved = config_from_dict(state["config"])
    fields = dict(state["config"])
    if args.rope_scaling == "linear":  # positions divided by the factor from now on, in training too
        if not saved.rope:
            raise SystemExit(f"error: --rope-scaling needs a rope model, and {args.init_from} has learned positions")
        factor = args.rope_factor or (args.block_size or saved.block_size) / saved.block_size
        fields["rope_linear_factor"] = saved.rope_linear_factor * factor
    elif args.rope_scaling != "none":
        raise SystemExit(
            f"error: --rope-scaling {args.rope_scaling} cannot be trained into a model here; "
            "fine-tune with linear, or pick the method when reading (context.py --rope-scaling)"
        )
    if args.block_size:
        if not saved.rope and args.block_size != saved.block_size:
            raise SystemExit(
                f"error: {args.init_from} has learned positions, whose table stops at "
                f"{saved.block_size}: --block-size cannot change (use a rope model)"
            )
        fields["block_size"] = args.block_size
    model = GPT(config_from_dict(fields))
    model.load_state_dict(state["model"])
    args.rope = model.config.rope
    return model


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rope", action="store_true", help="rotary position embeddings instead of a learned table")
    p.add_argument("--data-dir", default=str(DATA_DIR))
    p.add_argument("--out-dir", help="run folder (default: checkpoints/<kind>)")
    p.add_argument("--runs-dir", default="runs", help="TensorBoard logs, one folder per run")
    p.add_argument("--json", help="also write the run's summary here (steps, tokens/s, losses)")
    # the model
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--n-head", type=int, default=6)
    p.add_argument("--n-embd", type=int, default=384)
    p.add_argument("--block-size", type=int, help="training context (default 256, or the checkpoint's)")
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--rope-scaling", default="none", choices=METHODS,
                   help="with --init-from: linear trains with positions divided by --rope-factor")
    p.add_argument("--rope-factor", type=float, help="linear factor (default: new block size / old)")
    # the optimization
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="final lr as a share of --lr")
    p.add_argument("--warmup", type=int, default=20, help="warm-up steps")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0, help="gradient norm clip (0: none)")
    p.add_argument("--max-steps", type=int, help="train this many steps; the schedule follows the steps")
    p.add_argument("--minutes", type=float,
                   help=f"time budget; alone, the schedule follows the clock (default {DEFAULT_MINUTES:g} "
                        "without --max-steps, none with it; 0: none)")
    p.add_argument("--seed", type=int, default=1337)
    # evaluation and checkpoints
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--ckpt-every", type=int, default=25)
    # where and how it runs
    p.add_argument("--device", help="cpu, cuda, mps (default: the best present)")
    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                   help="matrix products in bfloat16 (weights stay float32) or float32; auto: bf16 where native")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--resume", action="store_true", help="continue the run folder's last checkpoint")
    p.add_argument("--init-from", help="start from another run's weights (e.g. for a longer context)")
    p.add_argument("--kill-at-step", type=int, help=argparse.SUPPRESS)  # tests: SIGKILL self after it
    args = p.parse_args(argv)
    if args.minutes is None:
        args.minutes = 0.0 if args.max_steps else DEFAULT_MINUTES
    if not args.minutes and not args.max_steps:
        p.error("nothing would stop this run: give --max-steps, or --minutes above 0")
    return args


def check_writable(path: str) -> None:
    """Fail now, not after the whole run, if the summary cannot be written to `path`."""
    folder = Path(path).resolve().parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".{Path(path).name}.probe{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise SystemExit(f"error: cannot write --json {path} ({e.strerror}): pick a writable path") from None


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    command = shlex.join(["python", "scripts/pretrain.py", *(sys.argv[1:] if argv is None else argv)])
    if args.json:
        check_writable(args.json)

    distributed = "RANK" in os.environ
    if distributed:
        import torch.distributed as dist

        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if args.device is None and torch.cuda.is_available():
            args.device = f"cuda:{local_rank}"
        device = pick_device(args.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    else:
        rank, world = 0, 1
        device = pick_device(args.device)
    master = rank == 0
    if device.type == "cpu":
        tune_malloc()  # glibc keeps freed memory: the kernel stops eating 10-40% of a CPU step
    dtype = resolve_dtype(args.dtype, device)
    args.dtype = dtype_name(dtype)  # the dtype used, in the log and the checkpoint's args

    data_dir = Path(args.data_dir)
    train, val = load_tokens(data_dir, "train"), load_tokens(data_dir, "val")
    tok_hash = data_tokenizer_hash(data_dir)
    args.vocab_size = json.loads((data_dir / "meta.json").read_text())["vocab_size"]

    model = build_model(args)
    name = run_name(args)
    out_dir = Path(args.out_dir or Path("checkpoints") / name)
    log_path = out_dir / "log.jsonl"
    config = model.config

    optimizer = configure_optimizer(model, args.lr, args.weight_decay, device)
    step, elapsed = 0, 0.0
    if args.resume:
        state = read_checkpoint(out_dir)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, elapsed = state["step"], state["elapsed"]
        torch.set_rng_state(state["rng"])
        if master:
            truncate_log(log_path, step)
            print(f"resuming {out_dir} at step {step} ({elapsed / 60:.1f} minutes done)")
    elif master and log_path.exists():
        log_path.unlink()
    model.to(device)

    train_model = model
    if args.compile:
        train_model = torch.compile(model)
    if distributed:
        from torch.nn.parallel import DistributedDataParallel

        train_model = DistributedDataParallel(train_model, device_ids=[device.index] if device.type == "cuda" else None)

    writer = None
    if master:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(Path(args.runs_dir) / out_dir.name), purge_step=step + 1 if step else None)
        out_dir.mkdir(parents=True, exist_ok=True)
        print(f"{name}: {model.num_params():,} parameters, {config}, on {device} in {args.dtype}, "
              f"{world} process(es)")

    stop = {"signal": None}

    def on_signal(signum, frame):
        stop["signal"] = signum

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:

        def save(val_loss: float | None = None) -> None:
            if master:
                save_checkpoint(
                    out_dir, model, optimizer=optimizer.state_dict(), step=step, elapsed=elapsed,
                    rng=torch.get_rng_state(), tokenizer_hash=tok_hash, args=vars(args), val_loss=val_loss,
                )

        def log(record: dict) -> None:
            if master:
                with open(log_path, "a") as f:
                    f.write(json.dumps(record) + "\n")

        tokens_per_step = args.batch_size * config.block_size * world
        where = machine(device)
        budget = args.minutes * 60 if args.minutes else float("inf")
        max_steps = args.max_steps or math.inf
        val_loss, evaluated_at = None, None
        from tqdm import tqdm

        bar = tqdm(total=args.max_steps, initial=step, disable=None if master else True, unit="step",
                   dynamic_ncols=True)
        model.train()
        speeds, evals = [], []
        while step < max_steps and elapsed < budget:
            t0 = clock()
            lr = lr_at(step, args.lr, args.warmup, args.min_lr_ratio, args.max_steps, elapsed, budget)
            for group in optimizer.param_groups:
                group["lr"] = lr
            x, y = get_batch(train, args.batch_size, config.block_size, args.seed, step, rank)
            with autocast(device, dtype):
                _, loss = train_model(x.to(device), y.to(device))
            if not math.isfinite(loss.item()):
                raise SystemExit(
                    f"error: loss became {loss.item()} at step {step}: stopping; the last good checkpoint in "
                    f"{out_dir} is kept (try a lower --lr)"
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if args.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            optimizer.step()
            step += 1
            loss_value = loss.item()
            if distributed:
                stats = torch.tensor([loss_value], device=device)
                dist.all_reduce(stats)
                loss_value = stats.item() / world
            dt = clock() - t0
            elapsed += dt
            speeds.append(tokens_per_step / dt)
            record = {"step": step, "loss": loss_value, "lr": lr, "tokens": step * tokens_per_step,
                      "tokens_per_s": speeds[-1], "elapsed": elapsed}
            if step % args.eval_every == 0 or step == args.max_steps:
                t1 = clock()
                val_loss = held_out_loss(model, val, args, device, dtype)
                elapsed += clock() - t1  # the budget is wall time: evaluations count
                record["val_loss"], record["elapsed"], evaluated_at = val_loss, elapsed, step
                record["machine"] = where
                evals.append({"step": step, "val_loss": val_loss, "train_loss": loss_value})
            log(record)
            if writer:
                writer.add_scalar("loss/train", loss_value, step)
                writer.add_scalar("lr", lr, step)
                writer.add_scalar("tokens_per_s", speeds[-1], step)
                if "val_loss" in record:
                    writer.add_scalar("loss/held_out", val_loss, step)
            bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{speeds[-1]:,.0f}", min=f"{elapsed / 60:.1f}")
            bar.update(1)
            if distributed:  # every rank stops at the same step: rank 0's clock and signals decide
                flag = torch.tensor([float(elapsed >= budget), float(stop["signal"] is not None)], device=device)
                dist.broadcast(flag, 0)
                if flag[0]:
                    elapsed = budget
                if flag[1] and stop["signal"] is None:
                    stop["signal"] = signal.SIGTERM
            if step % args.ckpt_every == 0:
                save(val_loss)
            if args.kill_at_step == step:
                os.kill(os.getpid(), signal.SIGKILL)
            if stop["signal"] is not None:
                save(val_loss)
                bar.close()
                if master:
                    print(f"interrupted at step {step}: saved {out_dir}; continue with --resume")
                raise SystemExit(130 if stop["signal"] == signal.SIGINT else 143)
        bar.close()
        if evaluated_at != step:
            t1 = clock()
            val_loss = held_out_loss(model, val, args, device, dtype)
            elapsed += clock() - t1
            log({"step": step, "val_loss": val_loss, "elapsed": elapsed, "machine": where})
            evals.append({"step": step, "val_loss": val_loss, "train_loss": loss_value if speeds else None})
            if writer:
                writer.add_scalar("loss/held_out", val_loss, step)
        save(val_loss)
        summary = {
            "command": command,
            "machine": where,
            "run": name,
            "kind": "rope" if config.rope else "learned",
            "dtype": args.dtype,
            "steps": step,
            "tokens": step * tokens_per_step,
            "seconds": elapsed,
            "tokens_per_s": statistics.median(speeds) if speeds else 0.0,  # this process's steps, not eval
            "evals": evals,
            "val_loss": val_loss,
            "params": model.num_params(),
            "minutes": elapsed / 60,
            "args": vars(args),
        }
        if master:
            writer.close()
            print(
                f"{name}: {step} steps, {summary['tokens']:,} tokens, {summary['tokens_per_s']:,.0f} tokens/s "
                f"({args.dtype}), held-out loss {val_loss:.4f}, {summary['params']:,} parameters, "
                f"{summary['minutes']:.1f} min -> {out_dir}"
            )
            if args.json:
                write_json(args.json, summary)
        if distributed:
            dist.destroy_process_group()
        return summary
    finally:  # give the caller (a test, say) its own handlers back
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def truncate_log(path: Path, step: int) -> None:
    """Drop log lines after the checkpoint's step, so a resumed curve continues without a seam."""
    if not path.exists():
        return
    lines = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
    path.write_text("".join(line + "\n" for line in lines))


if __name__ == "__main__":
    main()
