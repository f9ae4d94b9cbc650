"""Pretrain mvGPT on TinyStories, with learned positions or (--rope) rotary embeddings.

The seed, the data, the batches and the schedule are the same for both kinds, so the position
embedding is the one difference between two runs. Each kind gets its own run folder
(checkpoints/pretrain, checkpoints/pretrain-rope), and TensorBoard a run of the same name.

A run is bounded by time (--minutes, 10 by default: the learning rate follows the clock and
reaches its floor when the time is up, on any device) or by steps (--max-steps: the schedule
follows the steps, and two runs from the same seed are identical). Matrix products run in
bfloat16 where the hardware does them natively (--dtype auto), with the weights and the loss kept
in float32. A run bounded by five minutes or more compiles its step where that pays (bf16 on a
CPU: mvgpt.perf.compile_pays); --compile and --no-compile decide otherwise.

Examples:
    python scripts/pretrain.py                       # learned positions, 10 minutes
    python scripts/pretrain.py --rope                # rotary embeddings, same seed and batches
    python scripts/pretrain.py --rope --no-compile   # the same, eager (compiled by default where it pays)
    python scripts/pretrain.py --rope --resume       # continue an interrupted run (and its clock)
    python scripts/pretrain.py --rope --max-steps 1000 --compile --json results/pretrain-rope.json
    python scripts/pretrain.py --n-layer 2 --n-embd 64 --n-head 2 --block-size 32 \\
        --batch-size 4 --max-steps 20 --out-dir /tmp/tiny          # a tiny CPU run, seconds
    torchrun --nproc_per_node 2 scripts/pretrain.py --rope      # two processes (DDP)
    python scripts/pretrain.py --init-from checkpoints/pretrain-rope --block-size 1024 \\
        --rope-scaling linear --max-steps 40                      # long-context fine-tune
    python scripts/pretrain.py --out-dir checkpoints/pretrain-rope-ctx1024-linear --resume   # ... continued

A run folder holds one run: a folder with another run in it needs --resume (continue it) or
--overwrite (start it again); one with anything else in it (a LoRA run, data, an export) is
refused. A resume is the checkpoint's run: the model (--n-layer, --n-head, --n-embd, --block-size,
--rope, --rope-theta, and what --init-from with --rope-scaling made) comes from the checkpoint, and
a flag that says otherwise is refused; the optimization, schedule, time, evaluation, checkpoint
and device flags may change (with neither --minutes nor --max-steps, it keeps the run's own limits).
A checkpoint is saved only from sane weights (mvgpt/kit/runfolder.py's LossWatch): a run whose loss
runs away stops, and its last checkpoint stays as it was.
"""

from __future__ import annotations

import mvgpt.kit.starting  # noqa: F401  first, before torch loads: Ctrl-C meanwhile is one line

# isort: split
import argparse
import json
import math
import os
import shlex
import signal
import statistics
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from mvgpt.checkpoint import (
    CHECKPOINT_NAME,
    checkpoint_in,
    checkpoint_path,
    config_from_dict,
    read_checkpoint,
    save_checkpoint,
)
from mvgpt.data import DATA_DIR, data_tokenizer_hash, get_batch, load_tokens, tokenizer_vocab
from mvgpt.device import CHOICES as DTYPE_CHOICES
from mvgpt.device import autocast, dtype_name, machine, pick_device, resolve_dtype
from mvgpt.extension.rope_scaling import SCALING_METHODS
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
    share,
)
from mvgpt.kit.io import clip, write_json
from mvgpt.kit.runfolder import RunLock, claim, claim_file, tensorboard_folder, writable_file
from mvgpt.kit.runlog import RunLog, check_runs_dir, read_log
from mvgpt.model import GPT, GPTConfig
from mvgpt.perf.cpu_attention import batch_attention_where_it_pays
from mvgpt.perf.measure import compile_pays, tune_malloc
from mvgpt.perf.threads import cpu_threads, describe, threads_arg
from mvgpt.train import (
    DEFAULT_OPTIMIZER,
    OPTIMIZERS,
    WARMUP_SHARE,
    WARMUP_STEPS,
    LossWatch,
    Step,
    StopSignals,
    all_finite,
    check_fits_training,
    configure_optimizer,
    diverged,
    lr_at,
)

EVAL_SEED = 1234  # the held-out batches are the same for every run
MODEL_FLAGS = {"n_layer": "--n-layer", "n_head": "--n-head", "n_embd": "--n-embd", "block_size": "--block-size",
               "rope_theta": "--rope-theta"}  # a new model's shape (default: GPTConfig's), a resumed one's to check
DEFAULT_MINUTES = 10.0  # a run without --max-steps trains this long, as the episode does
clock = time.perf_counter  # the run's clock (tests drive the schedule with a fake one)


# ----------------------------------------------------------------------------------------------
# The command line: every value checked before any work (mvgpt/kit/errors.py)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    shape = GPTConfig(vocab_size=0)  # a new model's defaults
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rope", action="store_true", help="rotary position embeddings instead of a learned table")
    p.add_argument("--data-dir", default=str(DATA_DIR))
    p.add_argument("--out-dir", type=folder_name, help="run folder (default: checkpoints/<kind>)")
    p.add_argument("--runs-dir", type=tensorboard_folder, default="runs", help="TensorBoard logs, one folder per run")
    p.add_argument("--json", type=writable_file, help="also write the run's summary here (steps, tokens/s, losses)")
    # the model (default: GPTConfig's; with --resume or --init-from, the checkpoint's)
    p.add_argument("--n-layer", type=positive_int, help=f"blocks (default {shape.n_layer})")
    p.add_argument("--n-head", type=positive_int, help=f"attention heads (default {shape.n_head})")
    p.add_argument("--n-embd", type=positive_int, help=f"channels (default {shape.n_embd})")
    p.add_argument("--block-size", type=positive_int, help=f"training context (default {shape.block_size})")
    p.add_argument("--rope-theta", type=positive_float, help=f"rotary base (default {shape.rope_theta:g})")
    p.add_argument("--rope-scaling", default="none", choices=SCALING_METHODS,
                   help="with --init-from: linear trains with positions divided by --rope-factor")
    p.add_argument("--rope-factor", type=positive_float, help="linear factor (default: new block size / old)")
    # the optimization
    p.add_argument("--batch-size", type=positive_int, default=16)
    p.add_argument("--lr", type=positive_float, default=2e-3)
    p.add_argument("--min-lr-ratio", type=share, default=0.1, help="final lr as a share of --lr")
    p.add_argument("--warmup", type=non_negative_int, default=WARMUP_STEPS,
                   help="warm-up steps (why 200: docs/pretraining.md); bounded by --minutes, at most the steps "
                        "that fit in --warmup-share of them")
    p.add_argument("--warmup-share", type=share, default=WARMUP_SHARE,
                   help="bounded by --minutes, the warm-up ends by this share of them at the latest (default "
                        "%(default)g: why, mvgpt/train.py; 0: by its steps alone)")
    p.add_argument("--optimizer", choices=OPTIMIZERS,
                   help=f"muon: Muon for the blocks' matrices, AdamW for the rest; adamw: AdamW for all (default "
                        f"{DEFAULT_OPTIMIZER}; a resumed run keeps its own)")
    p.add_argument("--weight-decay", type=non_negative_float, default=0.1)
    p.add_argument("--grad-clip", type=non_negative_float, default=1.0, help="gradient norm clip (0: none)")
    p.add_argument("--max-steps", type=positive_int, help="train this many steps; the schedule follows the steps")
    p.add_argument("--minutes", type=non_negative_float,
                   help=f"time budget; alone, the schedule follows the clock (default {DEFAULT_MINUTES:g} "
                        "without --max-steps, none with it; 0: none)")
    p.add_argument("--seed", type=seed, default=1337)
    # evaluation and checkpoints
    p.add_argument("--eval-every", type=positive_int, default=25)
    p.add_argument("--eval-at", type=positive_int, nargs="+", default=[], metavar="STEP",
                   help="also evaluate after these steps (e.g. each step around the learning-rate peak)")
    p.add_argument("--eval-batches", type=positive_int, default=8)
    p.add_argument("--ckpt-every", type=positive_int, default=25)
    # where and how it runs
    p.add_argument("--device", help="cpu, cuda, mps (default: the best present)")
    p.add_argument("--threads", type=threads_arg,
                   help="CPU threads, fixed (default: the cores other programs leave free, looked at as it trains: "
                        "mvgpt/perf/threads.py)")
    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                   help="matrix products in bfloat16 (weights stay float32) or float32; auto: bf16 where native")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction,
                   help="torch.compile the training step (default: where it pays, mvgpt.perf.measure.compile_pays: "
                        "a run bounded by five minutes or more, in bf16 on a CPU)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run folder's last checkpoint: its model, with the flags above that may change")
    p.add_argument("--overwrite", action="store_true", help="start again in a run folder that has a checkpoint")
    p.add_argument("--init-from", help="start from another run's weights (e.g. for a longer context)")
    args = p.parse_args(argv)
    n_embd, n_head = args.n_embd or shape.n_embd, args.n_head or shape.n_head
    if not args.resume and n_embd % n_head:
        p.error(f"--n-embd {n_embd} must be a multiple of --n-head {n_head}")
    if not args.resume and args.rope and (n_embd // n_head) % 2:
        p.error(f"--rope needs an even head size (--n-embd / --n-head), got {n_embd // n_head}")
    if args.minutes == 0 and not args.max_steps:
        p.error("nothing would stop this run: give --max-steps, or --minutes above 0")
    if args.resume and args.overwrite:
        p.error("--resume and --overwrite contradict each other: pick one")
    if args.minutes is None and not (args.resume and args.max_steps is None):  # a bare --resume: the run's own
        args.minutes = 0.0 if args.max_steps else DEFAULT_MINUTES
    return args


def run_limits(args: argparse.Namespace, state: dict) -> None:
    """A resume given neither --minutes nor --max-steps keeps the run's own: a run of 2,000 steps, or of
    three minutes, does not become one of ten minutes because its limit was not typed again."""
    saved = state.get("args") if isinstance(state.get("args"), dict) else {}
    steps, minutes = saved.get("max_steps"), saved.get("minutes")
    steps_ok = steps is None or (isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1)
    minutes_ok = minutes is None or (isinstance(minutes, (int, float)) and not isinstance(minutes, bool)
                                     and 0 <= minutes <= 10**6)
    if not (steps_ok and minutes_ok and (steps or minutes)):  # NaN fails the range too
        raise UserError(f"the checkpoint does not say how long its run was to train (max_steps={steps!r}, "
                        f"minutes={minutes!r}): give the limit, --minutes N or --max-steps N, with --resume")
    args.max_steps, args.minutes = steps, float(minutes or 0.0)


# ----------------------------------------------------------------------------------------------
# The model and its starting point


def run_name(args: argparse.Namespace) -> str:
    """The run folder's name: one per kind of position embedding (and context, if changed)."""
    name = "pretrain-rope" if args.rope else "pretrain"
    if args.init_from and args.block_size:
        name += f"-ctx{args.block_size}"
    if args.rope_scaling != "none":
        name += f"-{args.rope_scaling}"
    return name


def run_dir(args: argparse.Namespace, runs: Path = Path("checkpoints")) -> tuple[Path, str | None]:
    """The run folder, and a line to say about it, where --out-dir does not name one:
    checkpoints/<run_name>, or, when that holds a run already (the main job's, say), the next free
    one of pretrain-rope-2, -3, ..., so that the episode's command typed after the main job trains
    beside its runs and loses none. --resume continues the newest of them; --overwrite starts the
    first one again."""
    if args.out_dir:
        return Path(args.out_dir), None
    first = runs / run_name(args)
    numbered = [p for p in runs.glob(f"{first.name}-*") if p.name[len(first.name) + 1:].isdigit()]
    taken = [p for p in [first, *numbered] if checkpoint_path(p).exists()]
    if args.resume and taken:
        return max(taken, key=lambda p: checkpoint_path(p).stat().st_mtime), None
    if args.overwrite or first not in taken:
        return first, None
    n = 2
    while checkpoint_path(runs / f"{first.name}-{n}").exists():
        n += 1
    chosen = runs / f"{first.name}-{n}"
    return chosen, (f"{first} holds a run already: this one goes to {chosen} (--out-dir picks the folder, "
                    f"--overwrite starts {first} again)")


def check_tokenizer(state: dict, tok_hash: str | None, path: str | Path) -> None:
    saved, vocab = state.get("tokenizer_hash"), tokenizer_vocab(tok_hash)
    if saved is not None and tok_hash is not None and saved != tok_hash:
        raise UserError(f"{path} was trained with tokenizer {saved}, but the data has {tok_hash}: "
                        "pass the --data-dir it was trained on")
    held = (state.get("config") or {}).get("vocab_size") if isinstance(state.get("config"), dict) else None
    if vocab is not None and isinstance(held, int) and held != vocab:  # ids past the tokenizer's, or past the table
        raise UserError(f"{path} reads {held} token ids, but the data's tokenizer makes {vocab}: pass the "
                        "--data-dir it was trained on")


def new_config(args: argparse.Namespace, tok_hash: str | None = None) -> tuple[dict, dict | None]:
    """A new run's config fields from the flags, or (--init-from) from a checkpoint's config with the
    flags' context and scaling; and that checkpoint (None without --init-from)."""
    if not args.init_from:
        if args.rope_scaling != "none":
            raise SystemExit("error: --rope-scaling is for a fine-tune to a longer context: add --init-from")
        fields = {k: getattr(args, k) for k in MODEL_FLAGS if getattr(args, k) is not None}  # else GPTConfig's
        return asdict(GPTConfig(**fields, vocab_size=args.vocab_size, rope=args.rope)), None
    state = read_checkpoint(args.init_from)
    check_tokenizer(state, tok_hash, args.init_from)
    saved = config_from_dict(state["config"])
    fields = asdict(saved)
    asked = {k: getattr(args, k) for k in MODEL_FLAGS if k != "block_size" and getattr(args, k) is not None}
    asked.update({"rope": True} if args.rope else {})
    for k, value in asked.items():  # the sizes and the kind are the checkpoint's: a flag may not say otherwise
        if fields[k] != value:
            raise UserError(f"{args.init_from} has {k}={fields[k]!r}, and --{k.replace('_', '-')} asks for {value!r}: "
                            "--init-from continues from its model; drop the flag")
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
    return fields, state


def build_model(args: argparse.Namespace, fields: dict, state: dict | None = None) -> GPT:
    """A new model of new_config's fields: drawn from --seed, or (--init-from) with its checkpoint's weights."""
    torch.manual_seed(args.seed)
    model = GPT(config_from_dict(fields))
    if state is not None:
        model.load_state_dict(state["model"])
    return model


def resumed_model(args: argparse.Namespace, state: dict, out_dir: Path, tok_hash: str | None) -> GPT:
    """The checkpoint's model, to continue its run. A flag that would make another model (another
    size, kind or context; --init-from's scaling that differs from what the run was made with) is
    refused: resuming never changes the model under a run."""
    check_tokenizer(state, tok_hash, out_dir)
    saved = asdict(config_from_dict(state["config"]))
    if args.init_from:  # the command that made the run, given again: it must make this model
        implied, _ = new_config(args, tok_hash)
        asked = {k: (v, "--init-from with its flags") for k, v in implied.items()}
    else:
        asked = {k: (getattr(args, k), flag) for k, flag in MODEL_FLAGS.items() if getattr(args, k) is not None}
        if args.rope:
            asked["rope"] = (True, "--rope")
    asked.setdefault("vocab_size", (args.vocab_size, f"--data-dir {args.data_dir}"))
    for k, (value, flag) in asked.items():
        if k in saved and saved[k] != value:
            raise UserError(f"{out_dir} holds a run with {k}={saved[k]!r}, and {flag} asks for {value!r}: "
                            "a resume continues the checkpoint's model; drop the flag, or start a new run with "
                            "another --out-dir")
    config = config_from_dict(saved)
    check_fits_training(config, args.batch_size)
    return GPT(config)


def optimizer_of(args: argparse.Namespace, state: dict | None, out_dir: Path) -> str:
    """The optimizer to train with: --optimizer, else the resumed run's own (runs from before the flag
    used AdamW), else the default. A resume that asks for another is refused: the saved moments belong
    to the optimizer that made them."""
    if state is None:
        return args.optimizer or DEFAULT_OPTIMIZER
    saved = (state.get("args") if isinstance(state.get("args"), dict) else {}).get("optimizer") or "adamw"
    if saved not in OPTIMIZERS:
        raise UserError(f"{out_dir}'s checkpoint names an optimizer this version does not have ({saved!r}): start a "
                        "new run with another --out-dir")
    if args.optimizer and args.optimizer != saved:
        raise UserError(f"{out_dir} holds a run trained with {saved}, and --optimizer asks for {args.optimizer}: "
                        "drop the flag to continue it, or start a new run with another --out-dir")
    return saved


def start_or_resume(
    args: argparse.Namespace, out_dir: Path, model: GPT, optimizer, state: dict | None, master: bool
) -> tuple[int, float, list, list[dict]]:
    """(step, elapsed seconds, [seconds, steps] of the pace so far, the log's records) to start from: the
    checkpoint's with --resume (state), else 0 in a folder claimed for a new run (an old run there goes,
    with --overwrite)."""
    if state is None:
        if master:
            if args.overwrite:  # a stop before the first save must not leave the old checkpoint beside a new log
                (out_dir / CHECKPOINT_NAME).unlink(missing_ok=True)
            (out_dir / "log.jsonl").unlink(missing_ok=True)
        return 0, 0.0, [0.0, 0], []
    missing = [k for k in ("optimizer", "rng", "step", "elapsed") if k not in state]
    if missing:  # e.g. a merged LoRA checkpoint, or one saved by hand: weights without a run to continue
        raise UserError(f"{checkpoint_path(out_dir)} has no {', '.join(missing)}: it is a model, not a run to "
                        "continue; start a new run from it with --init-from")
    step, elapsed = state["step"], state["elapsed"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0 or not isinstance(elapsed, (int, float)) \
            or not math.isfinite(elapsed) or elapsed < 0:
        raise UserError(f"{checkpoint_path(out_dir)} says it is at step {step!r} after {elapsed!r} seconds, which "
                        "no run saves: use an earlier checkpoint, or start a new run with another --out-dir")
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{checkpoint_path(out_dir)} does not hold a run this model can continue "
                        f"({clip(str(e).splitlines()[0])}): start a new run with another --out-dir") from None
    # the pace's seconds and steps; a checkpoint from before it was kept: its clock's, evaluations and all
    timed = state.get("step_seconds", [elapsed, step])
    numbers = isinstance(timed, (list, tuple)) and len(timed) == 2 and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in timed)
    if not (numbers and isinstance(timed[1], int) and math.isfinite(timed[0]) and 0 <= timed[1] <= step
            and 0 <= timed[0] <= elapsed + 1e-6 and (timed[0] > 0) == (timed[1] > 0)):  # no steps in no time
        raise UserError(f"{checkpoint_path(out_dir)} says its steps took {timed!r} (seconds, steps), which no run "
                        "saves: use an earlier checkpoint, or start a new run with another --out-dir")
    records = []
    if master:
        records = read_log(out_dir / "log.jsonl", state["step"])
        print(f"resuming {out_dir} at step {state['step']} ({state['elapsed'] / 60:.1f} minutes done)")
    return state["step"], state["elapsed"], list(timed), records

# ----------------------------------------------------------------------------------------------
# Where it runs: one process, or one of several (DDP); stopping on Ctrl-C


def setup_device(args: argparse.Namespace) -> tuple[torch.device, int, int]:
    """(device, rank, world size); under torchrun, joins the process group (one GPU per process)."""
    if "RANK" not in os.environ:
        device = pick_device(args.device)
        rank, world = 0, 1
    else:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if args.device is None and torch.cuda.is_available():
            args.device = f"cuda:{os.environ.get('LOCAL_RANK', 0)}"
        device = pick_device(args.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cpu":
        tune_malloc()  # a CPU step frees and maps the same large buffers every step: keep them (perf.py)
    return device, rank, world


def mean_over_ranks(value: float, device: torch.device) -> float:
    """The mean of a number over all processes (itself when there is one)."""
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], device=device)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


@torch.no_grad()
def held_out_loss(model: GPT, val, args: argparse.Namespace, device: torch.device, dtype: torch.dtype,
                  batches: int | None = None) -> float:
    model.eval()
    losses = []
    for i in range(batches or args.eval_batches):
        x, y = get_batch(val, args.batch_size, model.config.block_size, EVAL_SEED, i)
        with autocast(device, dtype):
            losses.append(model(x.to(device), y.to(device))[1].item())
    model.train()
    return sum(losses) / len(losses)


# ----------------------------------------------------------------------------------------------
# Training


def train(run: dict, args: argparse.Namespace) -> dict:
    """The loop: one step at a time until --max-steps or the time budget; returns the run summary."""
    model, train_step, optimizer = run["model"], run["step_fn"], run["optimizer"]
    device, dtype, log, stop, out_dir = run["device"], run["dtype"], run["log"], run["stop"], run["out_dir"]
    step, elapsed = run["step"], run["elapsed"]
    block_size = model.config.block_size
    tokens_per_step = args.batch_size * block_size * run["world"]
    budget = args.minutes * 60 if args.minutes else math.inf
    max_steps = args.max_steps or math.inf
    # a resumed run's summary covers the whole run: its speeds and evaluations so far, from the log
    speeds = [r["tokens_per_s"] for r in run["records"] if "tokens_per_s" in r]
    evals, val_loss, loss_value = [], None, None
    for r in run["records"]:
        loss_value = r.get("loss", loss_value)
        if "val_loss" in r:
            val_loss = r["val_loss"]
            evals.append({"step": r["step"], "val_loss": val_loss, "train_loss": loss_value})
    watch, saved_at = LossWatch(run["losses"]), run["step"]  # has the run diverged? (mvgpt/train.py)

    def checkpoint(due: bool) -> None:
        """Save, only from sane weights: finite, and their loss (held-out: this step's evaluation, or
        one batch) not run away. Otherwise stop, and the last checkpoint stays as it was."""
        nonlocal saved_at
        problem = None if all_finite(model.parameters()) else f"the weights became non-finite at step {step}"
        if problem is None:  # (one batch's forward is left off the clock: a resumed run's clock stays the same)
            check = val_loss if due else held_out_loss(model, run["val_data"], args, device, dtype, batches=1)
            problem = watch.check(check, step)
        if problem:
            raise diverged(problem, out_dir, saved_at)
        if run["master"]:
            save_checkpoint(checkpoint_in(out_dir), model, optimizer=optimizer.state_dict(), step=step, elapsed=elapsed,
                            step_seconds=[timed_s, timed_n],
                            rng=torch.get_rng_state(), tokenizer_hash=run["tok_hash"], args=vars(args),
                            val_loss=val_loss, losses=watch.losses)
        saved_at = step

    model.train()
    first = step  # this process's first step (it compiles, where it does): the pace leaves it out
    timed_s, timed_n = run["timed"]  # the seconds of the steps that set the pace, and how many (kept on --resume)
    while step < max_steps and elapsed < budget:
        t0 = clock()
        # the learning rate: warm-up, then cosine over the steps (--max-steps) or over the time left after the
        # warm-up; bounded by the clock, the warm-up ends in time too, at the pace of the steps so far (each
        # process's first left out, and evaluations), the same on every rank
        pace = mean_over_ranks(timed_s / timed_n, device) if timed_n else None
        lr = lr_at(step, args.lr, args.warmup, args.min_lr_ratio, args.max_steps, elapsed, budget, pace,
                   args.warmup_share)
        # the batch: depends only on (seed, rank, step), so a resumed run sees the same ones
        x, y = get_batch(run["train_data"], args.batch_size, block_size, args.seed, step, run["rank"])
        # forward (matrix products in bf16 under autocast), backward, clip, update (mvgpt/train.py)
        loss, grad_norm = train_step(x, y, lr)
        loss_value = mean_over_ranks(loss.item(), device)  # the same on every rank: all stop together
        problem = watch.step(loss_value, step + 1)  # non-finite, or run away: stop before any save
        if problem:
            raise diverged(problem, out_dir, saved_at)
        step += 1
        # a core taken by another program (or given back): the threads follow (mvgpt/perf/threads.py)
        if run["threads"] and (line := run["threads"].check()):
            log.say(f"step {step}: {line}")
        dt = clock() - t0
        elapsed += dt
        if step > first + 1:
            timed_s, timed_n = timed_s + dt, timed_n + 1
        speeds.append(tokens_per_step / dt)
        record = {"step": step, "loss": loss_value, "grad_norm": grad_norm.item(), "lr": lr,
                  "tokens": step * tokens_per_step, "tokens_per_s": speeds[-1], "elapsed": elapsed}
        # evaluate on held-out batches now and then (the budget is wall time: evaluations count)
        due = step % args.eval_every == 0 or step == args.max_steps or step in args.eval_at
        if due:
            t1 = clock()
            val_loss = held_out_loss(model, val=run["val_data"], args=args, device=device, dtype=dtype)
            elapsed += clock() - t1
            record.update(val_loss=val_loss, elapsed=elapsed, machine=run["machine"])
            evals.append({"step": step, "val_loss": val_loss, "train_loss": loss_value})
        # log: JSONL, TensorBoard, the bar
        log.write(record)
        # checkpoint now and then; stop when the time is up or on a signal (rank 0's clock, any rank's signal)
        elapsed, stopping = stop.agree(elapsed, device)
        saved = step % args.ckpt_every == 0 or stopping
        if saved:
            checkpoint(due)
        if due or saved:
            log.say(f"step {step}: loss {loss_value:.4f}" + (f", held-out {val_loss:.4f}" if due else "")
                    + f", {speeds[-1]:,.0f} tokens/s, {elapsed / 60:.1f} min" + (", checkpoint saved" if saved else ""))
        if stopping:
            log.say(f"interrupted at step {step}: saved {out_dir}; {again('continue with --resume')}")
            raise SystemExit(130 if stop.signal == signal.SIGINT else 143)
    # a last evaluation at the step the run stopped at, and the final checkpoint
    if not evals or evals[-1]["step"] != step:
        t1 = clock()
        val_loss = held_out_loss(model, run["val_data"], args, device, dtype)
        elapsed += clock() - t1
        log.write({"step": step, "val_loss": val_loss, "elapsed": elapsed, "machine": run["machine"]})
        evals.append({"step": step, "val_loss": val_loss, "train_loss": loss_value})
    if step > saved_at:  # a run resumed when it had finished trains nothing, and its checkpoint stays as it is
        checkpoint(due=True)
    return {
        "command": run["command"], "machine": run["machine"], "run": run["name"],
        "kind": "rope" if model.config.rope else "learned", "dtype": args.dtype,
        "steps": step, "tokens": step * tokens_per_step, "seconds": elapsed,
        "tokens_per_s": statistics.median(speeds) if speeds else 0.0,  # a step's, evaluations left out
        "evals": evals, "val_loss": val_loss, "params": model.num_params(), "minutes": elapsed / 60,
        "args": vars(args),
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    command = shlex.join(["python", "scripts/pretrain.py", *(sys.argv[1:] if argv is None else argv)])
    device, rank, world = setup_device(args)
    master = rank == 0
    dtype = resolve_dtype(args.dtype, device)
    args.dtype = dtype_name(dtype)  # the dtype used, in the log and the checkpoint's args

    # the data, and the run folder: ours alone (mvgpt/kit/runfolder.py), checked again once it is locked
    data_dir = Path(args.data_dir)
    train_data, val_data = load_tokens(data_dir, "train"), load_tokens(data_dir, "val")
    tok_hash = data_tokenizer_hash(data_dir)
    args.vocab_size = json.loads((data_dir / "meta.json").read_text())["vocab_size"]
    fields, init = (None, None) if args.resume else new_config(args, tok_hash)  # a new run's model, checked now
    if fields:  # its training must fit in this machine's memory: said now, not after minutes of swapping
        check_fits_training(config_from_dict(fields), args.batch_size)
    args.rope = args.rope or bool(fields and fields["rope"])  # --init-from a rope model: a rope run
    out_dir, note = run_dir(args)
    args.out_dir = str(out_dir)  # the folder used, in the checkpoint's args and the summary
    if note and master:
        print(note)
    reads = {"--init-from": args.init_from and checkpoint_path(args.init_from), "--data-dir": data_dir}
    claim(out_dir, "checkpoint", "--out-dir", resume=args.resume, overwrite=args.overwrite, reads=reads)
    if args.json:  # never over an input, nor over a file of the run this command makes
        claim_file(args.json, "--json", reads=reads, making=[("--out-dir", out_dir, "checkpoint")])

    with RunLock(out_dir) if master else nullcontext(), StopSignals() as stop:
        claim(out_dir, "checkpoint", "--out-dir", resume=args.resume, overwrite=args.overwrite, reads=reads)
        # the model: the checkpoint's (--resume), or a new one from the flags (or --init-from's weights)
        state = read_checkpoint(out_dir) if args.resume else None
        model = resumed_model(args, state, out_dir, tok_hash) if state else build_model(args, fields, init)
        for k in MODEL_FLAGS:  # the values used, in the checkpoint's args and the summary
            setattr(args, k, getattr(model.config, k))
        args.rope = model.config.rope
        name = run_name(args)
        for split, tokens in (("training", train_data), ("held-out", val_data)):  # said now, not at step 25
            if len(tokens) <= model.config.block_size + 1:
                raise UserError(f"the {split} set in {data_dir} has {len(tokens):,} tokens, too few for windows of "
                                f"{model.config.block_size}: prepare it from more text (`python scripts/prepare.py "
                                "--source DIR --force`)")
        args.optimizer = optimizer_of(args, state, out_dir)
        optimizer = configure_optimizer(model, args.lr, args.weight_decay, device, muon=args.optimizer == "muon")
        step, elapsed, timed, records = start_or_resume(args, out_dir, model, optimizer, state, master)
        if state and args.minutes is None:  # --resume alone: the run's own limits
            run_limits(args, state)
        check_runs_dir(out_dir, args.runs_dir)  # before the first line: a refusal is the only line
        if master and args.max_steps and step > args.max_steps:  # said, not taken as a wish to go back
            print(f"{out_dir} is at step {step}, past --max-steps {args.max_steps}: nothing to train (its summary "
                  "follows)")
        model.to(device)
        if args.compile is None:  # neither asked for nor against: where it earns its compile time back
            args.compile = not args.max_steps and compile_pays(device, dtype, args.minutes * 60 - elapsed)
        train_model = torch.compile(model) if args.compile else model
        if world > 1:
            train_model = DistributedDataParallel(train_model, device_ids=[device.index] if device.type == "cuda"
                                                  else None)
        # a CPU's threads: the cores other programs leave free now, looked at again as it trains
        threads = cpu_threads(args.threads, device, world)
        on = f"{device}, {threads.start() if threads else describe(torch.get_num_threads())}" \
            if device.type == "cpu" else str(device)
        if master:
            print(f"{name}: {model.num_params():,} parameters, {model.config}, on {on} in {args.dtype}, "
                  f"{'compiled' if args.compile else 'eager'}, {world} process(es)")
            if args.compile:  # the bar stands still meanwhile: say why
                print("the first step compiles the model: a while when inductor's cache is empty, seconds "
                      "after (--no-compile skips it)")
        # the one training step (mvgpt/train.py): bf16 products where native; in bf16 on a CPU, attention's
        # products over all heads at once (a hook: mvgpt/perf/cpu_attention.py)
        batch_attention_where_it_pays(model, device, dtype)
        step_fn = Step(model, optimizer, device, dtype, grad_clip=args.grad_clip, forward=train_model)
        log = RunLog(out_dir, args.runs_dir, step, args.max_steps, master=master)
        run = dict(model=model, step_fn=step_fn, optimizer=optimizer, threads=threads, device=device, dtype=dtype,
                   log=log, stop=stop, out_dir=out_dir, step=step, elapsed=elapsed, timed=timed, world=world, rank=rank,
                   master=master, train_data=train_data, val_data=val_data, tok_hash=tok_hash, machine=machine(device),
                   command=command, name=name, records=records, losses=(state or {}).get("losses", []))
        try:
            summary = train(run, args)
        finally:
            log.close()

    if master:
        print(f"{name}: {summary['steps']} steps, {summary['tokens']:,} tokens, {summary['tokens_per_s']:,.0f} "
              f"tokens/s ({args.dtype}), held-out loss {summary['val_loss']:.4f}, {summary['params']:,} parameters, "
              f"{summary['minutes']:.1f} min -> {out_dir}")
        if args.json:
            write_json(args.json, summary)
    if world > 1:
        # DDP before the process group: left as its last owner, DDP frees it holding Python's lock, and
        # gloo's threads, waiting for that lock to free a tensor, hang the exit (it did, under load)
        del run, train_model, step_fn
        dist.destroy_process_group()
    return summary


if __name__ == "__main__":
    run_main(main, interrupted="the last checkpoint saved is kept: continue with --resume")
