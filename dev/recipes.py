"""Training recipes side by side, on the clock, interleaved on one machine: which buys more held-out loss?

A recipe is everything about training but the model: the optimizer and its settings, the learning
rate's schedule, the initialisation of the residual projections, the batch. The recipes each train
their own copy of the same model, from the same seed, on the same batches (the batch of step k is
the same for all, as pretrain.py draws it), in one process, a step at a time: always the one whose
clock is furthest behind. Each has a clock of its own, the seconds of its own steps, and
a budget on it (--minutes), so a burst of load on the shared machine slows both alike, and a recipe
whose step costs more (Muon) gets fewer steps, as it would in a ten-minute run. Evaluations are off
both clocks. Compiling is left out too: it costs both the same.

It reports the held-out loss of each at equal wall time (the end of the budget, and each quarter of
it) and at equal tokens (every --eval-every steps both reached), on the whole held-out set at the
end (as evaluate.py reads it) and on --eval-batches batches on the way, for each seed, with the
spread over seeds. `--minutes 0 --steps N` trains both N steps, their schedules on the steps: a
check of the loss per token, untimed.

Examples:
    python dev/recipes.py --recipes baseline wsd --seeds 1337 1338 --json results/amd-epyc/recipes/wsd.json
    python dev/recipes.py --recipes baseline wsd beta2 wd --minutes 10     # several against the first, interleaved
    python dev/recipes.py --recipes baseline muon wsd:lr=3e-3,cooldown=0.4 --minutes 5
    python dev/recipes.py --list                                   # the recipes and what each changes
    python dev/recipes.py --recipes baseline wsd --minutes 0 --steps 20 --n-layer 1 --n-embd 32 --n-head 2 \\
        --block-size 16 --batch-size 4 --data-dir /tmp/tinydata     # tiny, seconds
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from mvgpt.data import DATA_DIR, get_batch, load_tokens
from mvgpt.device import autocast, dtype_name, machine, pick_device, resolve_dtype
from mvgpt.kit.errors import ArgumentParser, non_negative_float, positive_int, run_main
from mvgpt.kit.errors import seed as seed_arg
from mvgpt.kit.io import write_json
from mvgpt.kit.runfolder import writable_file
from mvgpt.model import GPT, GPTConfig
from mvgpt.perf.cpu_attention import batch_attention_where_it_pays
from mvgpt.train import WARMUP_SHARE, Step, adamw, block_matrices, check_fits_training, configure_optimizer, lr_at

EVAL_SEED = 1234  # pretrain.py's: the held-out batches on the way are the same for every run


# ----------------------------------------------------------------------------------------------
# The recipes


@dataclass(frozen=True)
class Recipe:
    """How to train: today's default is `baseline`; each other recipe changes one thing, or several."""

    what: str
    lr: float = 2e-3
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    schedule: str = "cosine"  # cosine: warm-up then a half cosine to min_ratio; wsd: warm-up, flat, linear down
    warmup: int = 200  # steps, bounded by warmup_share of the budget on the clock
    warmup_share: float = WARMUP_SHARE
    min_ratio: float = 0.1
    cooldown: float = 0.5  # wsd: the share of the budget the final linear decay takes
    muon: bool = False  # Muon on the blocks' matrices, AdamW on the rest
    muon_lr: float | None = None  # default: lr (Muon's update scaled to AdamW's size: match_rms_adamw)
    zero_proj: bool = False  # the two residual projections of each block start at zero
    batch_size: int = 16
    after_warmup: bool = True  # on the clock, the cosine starts at the peak when the warm-up ends


RECIPES = {
    "baseline": Recipe("today's: AdamW 2e-3, betas (0.9, 0.95), wd 0.1, warm-up 200 steps or 1/2 of the clock, "
                       "then a cosine to 0.1x over the time left"),
    "clock-cosine": Recipe("the cosine over the whole clock, the warm-up's time too, as it was before `after` "
                           "(the baseline of the races before it)", after_warmup=False),
    "fifth": Recipe("the warm-up bounded by 1/5 of the clock, the cosine over the whole clock (the baseline before "
                    "the warm-up's races)", warmup_share=0.2, after_warmup=False),
    "wsd": Recipe("warm-up 50 steps or 1/20 of the clock, flat, linear down to 0.01x over the last half",
                  schedule="wsd", warmup=50, warmup_share=0.05, min_ratio=0.01, cooldown=0.5),
    "beta2": Recipe("beta2 0.99 (nanoGPT's for a 4,096-token batch)", betas=(0.9, 0.99)),
    "wd": Recipe("weight decay 0.5: 1/(lr x wd) = 1,000 steps, about the run", weight_decay=0.5),
    "zero-proj": Recipe("the residual projections start at zero", zero_proj=True),
    "muon": Recipe("Muon on the blocks' 24 matrices (lr as AdamW's, match_rms_adamw), AdamW on the rest", muon=True),
    "lr3e-3": Recipe("lr 3e-3", lr=3e-3),
    "batch32": Recipe("32 sequences a step, lr x sqrt(2)", batch_size=32, lr=2e-3 * math.sqrt(2)),
    "after": Recipe("on the clock, the cosine runs over the time left after the warm-up, from the peak (not "
                    "from where the clock is when the warm-up ends): the baseline since it won", after_warmup=True),
    "batch8": Recipe("8 sequences a step, lr / sqrt(2): twice the steps in the same time", batch_size=8,
                     lr=2e-3 / math.sqrt(2)),
}


def combined(*names: str, **changes) -> Recipe:
    """The recipes' changes from the baseline, together (a later one wins where two change the same field)."""
    base = asdict(RECIPES["baseline"])
    fields = dict(base)
    for name in names:
        fields.update({k: v for k, v in asdict(RECIPES[name]).items() if v != base[k] and k != "what"})
    fields.update(changes)
    fields["what"] = " + ".join(names) + (f" ({changes})" if changes else "")
    return Recipe(**fields)


# what a field may hold, where a type alone does not say: (lowest, highest), both included
LIMITS = {"lr": (1e-9, 1.0), "muon_lr": (1e-9, 1.0), "weight_decay": (0.0, 10.0), "warmup": (0, 10**6),
          "warmup_share": (0.0, 1.0), "min_ratio": (0.0, 1.0), "cooldown": (0.0, 1.0), "batch_size": (1, 4096)}


def field_value(key: str, text: str) -> object:
    """A recipe field's value from the command line (`lr=3e-3`, `betas=0.9/0.99`, `muon=true`), or a
    one-line error naming the field and what it takes."""
    default = getattr(RECIPES["baseline"], key)
    if key == "what":
        raise SystemExit("error: 'what' is a recipe's description, not a field to change: pick another field")
    if isinstance(default, bool):
        if text.lower() not in ("1", "true", "yes", "0", "false", "no"):
            raise SystemExit(f"error: {key}={text!r} is not a yes or no: give {key}=true or {key}=false")
        return text.lower() in ("1", "true", "yes")
    if key == "schedule":
        if text not in ("cosine", "wsd"):
            raise SystemExit(f"error: schedule={text!r} is not a schedule: give schedule=cosine or schedule=wsd")
        return text
    try:
        if key == "betas":
            b1, b2 = (float(x) for x in text.split("/"))
            if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
                raise ValueError
            return (b1, b2)
        value = (float if default is None else type(default))(text)
    except ValueError:
        example = "betas=0.9/0.99" if key == "betas" else f"{key}={default if default is not None else 2e-3}"
        raise SystemExit(f"error: {key}={text!r} is not a value {key} takes: give one as in {example}") from None
    low, high = LIMITS.get(key, (-math.inf, math.inf))
    if not low <= value <= high:  # NaN too
        raise SystemExit(f"error: {key}={text!r} is out of range: give a value from {low:g} to {high:g}")
    return value


def recipe(name: str) -> Recipe:
    """A named recipe, or names joined by + (wsd+beta2), or field=value changes after a colon
    (wsd:lr=3e-3,cooldown=0.4)."""
    names, colon, changes = name.partition(":")
    if colon and not changes:
        raise SystemExit(f"error: {name!r} has no change after its colon: give field=value pairs (wsd:lr=3e-3) or "
                         "drop the colon")
    values = {}
    for pair in changes.split(",") if changes else []:
        key, _, value = pair.partition("=")
        if key not in asdict(RECIPES["baseline"]):  # the fields alone (hasattr would take __class__)
            fields = ", ".join(k for k in asdict(RECIPES["baseline"]) if k != "what")
            raise SystemExit(f"error: no recipe field {key!r} in {name!r}: pick from {fields}")
        if key in values:
            raise SystemExit(f"error: {name!r} changes {key} twice: give it once")
        values[key] = field_value(key, value)
    parts = names.split("+")
    unknown = [p for p in parts if p not in RECIPES]
    if unknown:
        raise SystemExit(f"error: no recipe {unknown[0]!r} in {name!r}: pick from {', '.join(RECIPES)} (--list says "
                         "what each is)")
    if len(set(parts)) != len(parts):
        raise SystemExit(f"error: {name!r} names a recipe twice: give each once")
    r = RECIPES[parts[0]] if len(parts) == 1 and not values else combined(*parts, **values)
    idle = idle_fields(r)
    if idle:
        raise SystemExit(f"error: {name!r} sets {idle}, which does nothing here: drop it, or set what it acts on")
    return r


def idle_fields(r: Recipe) -> str | None:
    """A field that changes nothing in this recipe (a cooldown without wsd's schedule), named with
    what it acts on; None where every field set acts."""
    base = RECIPES["baseline"]
    if r.schedule != "wsd" and r.cooldown != base.cooldown:
        return f"cooldown={r.cooldown:g} (only the wsd schedule has a cooldown: schedule=wsd)"
    if r.schedule == "wsd" and r.after_warmup != base.after_warmup:
        return "after_warmup (a change to the cosine; wsd's decay is its own)"
    if not r.muon and r.muon_lr is not None:
        return f"muon_lr={r.muon_lr:g} (Muon's lr, with muon=true)"
    return None


# ----------------------------------------------------------------------------------------------
# What a recipe sets up: the optimizer, the schedule, the start


class Optimizers:
    """Several optimizers stepped as one (Muon for the matrices, AdamW for the rest), with one lr:
    each group keeps its share of the lr it was made with (`scale`)."""

    def __init__(self, *optimizers: torch.optim.Optimizer) -> None:
        self.optimizers = optimizers
        self.param_groups = [g for o in optimizers for g in o.param_groups]
        base = self.param_groups[0]["lr"]
        for g in self.param_groups:
            g["scale"] = g["lr"] / base

    def set_lr(self, lr: float) -> None:
        for g in self.param_groups:
            g["lr"] = lr * g["scale"]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for o in self.optimizers:
            o.step()


def make_optimizer(model: GPT, r: Recipe, device: torch.device) -> Optimizers:
    """pretrain.py's optimizer for the recipe (mvgpt.train.configure_optimizer); a Muon lr of its own
    makes the pair here, each group keeping its share of the lr."""
    if not r.muon or r.muon_lr is None:
        return Optimizers(configure_optimizer(model, r.lr, r.weight_decay, device, r.betas, muon=r.muon))
    matrices = block_matrices(model)
    ids = {id(p) for p in matrices}
    muon = torch.optim.Muon(matrices, lr=r.muon_lr, weight_decay=r.weight_decay, adjust_lr_fn="match_rms_adamw")
    return Optimizers(adamw([p for p in model.parameters() if id(p) not in ids], r.lr, r.weight_decay, r.betas,
                            device), muon)


def lr_of(r: Recipe, step: int, clock: float, budget: float, pace: float | None, steps: int | None) -> float:
    """The lr of `step`: on the clock (`clock` seconds of `budget`, `pace` seconds a step so far) or over
    `steps`, by pretrain.py's own schedules (mvgpt.train.lr_at): cosine, or wsd (warm-up, flat, then
    straight down over the last `cooldown` of the run)."""
    return lr_at(step, r.lr, r.warmup, r.min_ratio, steps, clock, budget or None, pace, r.warmup_share,
                 schedule=r.schedule, cooldown=r.cooldown, after_warmup=r.after_warmup)


def build(r: Recipe, config: GPTConfig, seed: int, device: torch.device, dtype: torch.dtype,
          compile: bool) -> tuple[GPT, Step, Optimizers]:
    torch.manual_seed(seed)
    model = GPT(config).to(device).train()
    if r.zero_proj:
        with torch.no_grad():
            for block in model.blocks:
                block.attn.proj.weight.zero_()
                block.mlp.proj.weight.zero_()
    optimizer = make_optimizer(model, r, device)
    batch_attention_where_it_pays(model, device, dtype)
    forward = torch.compile(model) if compile else model
    return model, Step(model, optimizer, device, dtype, forward=forward), optimizer


# ----------------------------------------------------------------------------------------------
# Two recipes, interleaved


@dataclass
class Run:
    name: str
    r: Recipe
    model: GPT
    step_fn: Step
    optimizer: Optimizers
    step: int = 0
    clock: float = 0.0
    first_s: float = 0.0
    evals: list[dict] = field(default_factory=list)
    times: list[float] = field(default_factory=list)


@torch.no_grad()
def held_out(model: GPT, val: np.ndarray, batch_size: int, batches: int | None, device, dtype) -> float:
    """Mean loss: `batches` random batches of pretrain.py's held-out draw, or (None) every window of the
    held-out set, as evaluate.py reads it."""
    model.eval()
    T, losses = model.config.block_size, []
    if batches is None:
        n = (len(val) - 1) // T  # windows of T + 1 tokens, one token shared: each token scored once
        for i in range(0, n, 16):
            chunk = torch.from_numpy(np.stack([val[j * T: j * T + T + 1] for j in range(i, min(i + 16, n))])
                                     .astype(np.int64)).to(device)
            with autocast(device, dtype):
                losses.append((model(chunk[:, :-1], chunk[:, 1:])[1].item(), len(chunk)))
        model.train()
        return sum(loss * n for loss, n in losses) / sum(n for _, n in losses)
    for i in range(batches):
        x, y = get_batch(val, batch_size, T, EVAL_SEED, i)
        with autocast(device, dtype):
            losses.append(model(x.to(device), y.to(device))[1].item())
    model.train()
    return sum(losses) / len(losses)


def step_s(run: Run) -> float:
    """The median seconds of a recipe's timed steps (its first, off the clock, where it took no other)."""
    return statistics.median(run.times) if run.times else run.first_s


def race(args: argparse.Namespace, names: tuple[str, ...], seed: int, config: GPTConfig, train, val,
         device, dtype) -> dict:
    runs = []
    for name in names:
        r = recipe(name)
        if args.batch_size:  # the flag's batch for every recipe raced (main refuses one that sets its own)
            r = replace(r, batch_size=args.batch_size)
        model, step_fn, optimizer = build(r, config, seed, device, dtype, args.compile)
        runs.append(Run(name, r, model, step_fn, optimizer))
    budget = args.minutes * 60
    T = config.block_size
    quarters = [budget * q / 4 for q in (1, 2, 3)] if budget else []

    def evaluate(run: Run, at: str) -> None:
        run.evals.append({"step": run.step, "tokens": run.step * run.r.batch_size * T, "seconds": run.clock,
                          "at": at, "val_loss": held_out(run.model, val, 16, args.eval_batches, device, dtype)})

    def done(run: Run) -> bool:
        return run.clock >= budget if budget else run.step >= args.steps

    while not all(done(run) for run in runs):
        run = min((r for r in runs if not done(r)), key=lambda r: (r.clock, names.index(r.name)))
        pace = statistics.median(run.times) if len(run.times) > 1 else None  # the steps' own, compiling left out
        lr = lr_of(run.r, run.step, run.clock, budget, pace, None if budget else args.steps)
        run.optimizer.set_lr(lr)
        x, y = get_batch(train, run.r.batch_size, T, seed, run.step)
        t0 = time.perf_counter()
        loss, _ = run.step_fn(x, y)
        loss.item()
        dt = time.perf_counter() - t0
        if run.step == 0:  # off every clock: compiling, and the process's one-off start-up, which fell on
            run.first_s = dt  # whichever recipe stepped first (about a second; a step or two in ten minutes)
        else:
            run.clock += dt
            run.times.append(dt)
        run.step += 1
        if not math.isfinite(loss.item()):
            raise SystemExit(f"error: {run.name} diverged at step {run.step} (loss {loss.item()})")
        if run.step % args.eval_every == 0:
            evaluate(run, "step")
        while quarters and len([e for e in run.evals if e["at"] == "quarter"]) < 3 and \
                run.clock >= quarters[len([e for e in run.evals if e["at"] == "quarter"])]:
            evaluate(run, "quarter")
    out = {}
    for run in runs:
        final = held_out(run.model, val, 16, None, device, dtype)
        out[run.name] = {"recipe": asdict(run.r), "steps": run.step, "seconds": run.clock,
                         "tokens": run.step * run.r.batch_size * T, "step_s": step_s(run),
                         "val_loss": final, "evals": run.evals}
        print(f"  seed {seed} {run.name:<24} {run.step:>5} steps, {step_s(run) * 1e3:6.0f} ms a step, "
              f"held-out {final:.4f} (whole set)", flush=True)
    return out


def equal_tokens(a: dict, b: dict) -> tuple[int, float, float] | None:
    """(tokens, loss of a, loss of b) at the most tokens both evaluated at, on the way."""
    la = {e["tokens"]: e["val_loss"] for e in a["evals"] if e["at"] == "step"}
    lb = {e["tokens"]: e["val_loss"] for e in b["evals"] if e["at"] == "step"}
    both = sorted(la.keys() & lb.keys())
    return (both[-1], la[both[-1]], lb[both[-1]]) if both else None


def summary(names: tuple[str, ...], seeds: dict[int, dict]) -> dict:
    """Each recipe against the first: held-out loss at equal time (the end of the budget) and at equal
    tokens, seed by seed, and the seed spread of each."""
    a = names[0]
    ends = {n: [s[n]["val_loss"] for s in seeds.values()] for n in names}
    against = {}
    for b in names[1:]:
        tok = [equal_tokens(s[a], s[b]) for s in seeds.values()]
        diffs = [s[b]["val_loss"] - s[a]["val_loss"] for s in seeds.values()]
        against[b] = {"equal_time": diffs, "equal_time_mean": statistics.mean(diffs),
                      "equal_tokens": [t[2] - t[1] for t in tok if t], "equal_tokens_at": [t[0] for t in tok if t]}
    return {"reference": a, "recipes": list(names), "seeds": list(seeds), "val_loss": ends,
            "seed_spread": {n: (max(v) - min(v)) if len(v) > 1 else None for n, v in ends.items()},
            "against_reference": against,
            "steps": {n: [s[n]["steps"] for s in seeds.values()] for n in names},
            "step_s": {n: [s[n]["step_s"] for s in seeds.values()] for n in names}}


def main(argv: list[str] | None = None) -> dict:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipes", nargs="+", default=["baseline", "wsd"],
                   help="the reference first, then the others (a name, names joined by +, or name:k=v,...)")
    p.add_argument("--list", action="store_true", help="print the recipes and what each changes, then stop")
    p.add_argument("--seeds", type=seed_arg, nargs="+", default=[1337])
    p.add_argument("--minutes", type=non_negative_float, default=10.0, help="each recipe's budget on its clock")
    p.add_argument("--steps", type=positive_int, help="with --minutes 0: each recipe's steps (default 1000)")
    p.add_argument("--eval-every", type=positive_int, default=100)
    p.add_argument("--eval-batches", type=positive_int, default=8)
    p.add_argument("--data-dir", default=str(DATA_DIR))
    p.add_argument("--rope", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--n-layer", type=positive_int, default=6)
    p.add_argument("--n-head", type=positive_int, default=6)
    p.add_argument("--n-embd", type=positive_int, default=384)
    p.add_argument("--block-size", type=positive_int, default=256)
    p.add_argument("--batch-size", type=positive_int, help="every recipe's batch (default: each recipe's own)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"))
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--json", type=writable_file)
    args = p.parse_args(argv)
    if args.list:
        width = max(map(len, RECIPES))
        for name, r in RECIPES.items():
            print(f"{name:<{width}}  {r.what}")
        return {}
    names = tuple(args.recipes)
    if len(set(names)) != len(names):
        p.error("give each recipe once")
    if len(set(args.seeds)) != len(args.seeds):
        p.error("give each seed once (a seed twice is the same race twice, and no spread)")
    if args.minutes and args.steps:
        p.error("--steps counts only with --minutes 0 (otherwise the recipes run on the clock): add --minutes 0, or "
                "drop --steps")
    args.steps = args.steps or 1000
    if args.n_embd % args.n_head:
        p.error(f"--n-embd {args.n_embd} must be a multiple of --n-head {args.n_head}")
    if args.rope and (args.n_embd // args.n_head) % 2:
        p.error(f"--rope needs an even head size (--n-embd / --n-head), got {args.n_embd // args.n_head}")
    for n in names:
        changed = [k for k, v in asdict(recipe(n)).items() if k != "what" and v != getattr(RECIPES["baseline"], k)]
        if not args.minutes and changed and set(changed) <= {"warmup_share", "after_warmup"}:  # a tie, by steps
            p.error(f"{n} changes only {' and '.join(changed)}, which act{'s' * (len(changed) == 1)} on the clock: "
                    "race it with --minutes above 0")
    device = pick_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    if args.batch_size:  # every recipe's batch, but one whose batch is what it changes (batch8, batch32)
        own = [n for n in args.recipes if recipe(n).batch_size != RECIPES["baseline"].batch_size]
        if own:
            raise SystemExit(f"error: {own[0]} sets its own batch, which --batch-size would overwrite: race it "
                             "without --batch-size, or give the batch in the recipe (baseline:batch_size=N)")
    train, val = load_tokens(args.data_dir, "train"), load_tokens(args.data_dir, "val")
    for split, tokens in (("training", train), ("held-out", val)):  # before any step, not at the first evaluation
        if len(tokens) <= args.block_size + 1:
            p.error(f"the {split} data in {args.data_dir} has {len(tokens):,} tokens, too few for windows of "
                    f"--block-size {args.block_size}: give a smaller --block-size, or prepare more text")
    import json
    vocab = json.loads((Path(args.data_dir) / "meta.json").read_text())["vocab_size"]
    config = GPTConfig(vocab_size=vocab, block_size=args.block_size, n_layer=args.n_layer, n_head=args.n_head,
                       n_embd=args.n_embd, rope=args.rope)
    for n in names:  # before any model is made: one line, not an allocation's traceback
        check_fits_training(config, args.batch_size or recipe(n).batch_size)
    print(f"{', '.join(names)}: " + (f"{args.minutes:g} minutes each on its own clock" if args.minutes
                                      else f"{args.steps} steps each"), flush=True)
    t0 = time.perf_counter()
    seeds = {seed: race(args, names, seed, config, train, val, device, dtype) for seed in args.seeds}
    result = {"command": "python dev/recipes.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": machine(device), "dtype": dtype_name(dtype), "config": asdict(config),
              "minutes": args.minutes, "steps": None if args.minutes else args.steps,
              "runs": {str(k): v for k, v in seeds.items()}, **summary(names, seeds),
              "seconds": time.perf_counter() - t0}
    for b, d in result["against_reference"].items():
        tokens = ", ".join(f"{x:+.4f}" for x in d["equal_tokens"])
        at = "equal time" if args.minutes else "equal steps"
        print(f"{b} - {names[0]}, held-out at {at}: " + ", ".join(f"{x:+.4f}" for x in d["equal_time"])
              + (f"; at equal tokens ({d['equal_tokens_at'][0]:,}): {tokens}" if d["equal_tokens_at"] else ""))
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    run_main(main)
