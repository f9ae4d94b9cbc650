"""The main job's plan: how long each stage will take on this machine, known before it starts.

scripts/main.py measures the steps it is about to train and the other kinds of work its stages do
(`measure`: a minute or two), sets each stage's work against those rates (`stages`), chooses how
many steps both kinds train (`steps_for`: about ten minutes for the first, at most 1,000), prints
the plan, and after each stage a line with the time left (`Progress`).

Each stage's work is counted here from the scripts' defaults (batches, streams, contexts, steps),
in units the measurement times directly: a training step, an evaluation's forward, a window re-run,
a cached decoding step; where a stage's unit is larger or smaller (a longer context, a smaller
batch), by its flops (mvgpt/device.py). An estimate is good to a fifth or so: set against the AMD
EPYC's main job (results/amd-epyc/main-job: 58 minutes), the stages after pretraining came to 28.6
minutes from its bench's rates, against 28.7 measured.

Example:
    rates = measure(GPTConfig(vocab_size=8192), GPTConfig(vocab_size=8192, rope=True), device, dtype, compile=True)
    job = Job(steps=steps_for(rates), val_tokens=273_465, mixed=dtype != torch.float32)
    progress = Progress(stages(rates, job))
    ...; progress.done("evaluate")          # prints the time left
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from mvgpt.device import autocast, sync
from mvgpt.model import GPT, GPTConfig, KVCache
from mvgpt.perf.cpu_attention import batch_attention_where_it_pays
from mvgpt.perf.flops import forward_flops, training_flops_per_token
from mvgpt.perf.measure import OtherLoad, tune_malloc
from mvgpt.train import Step, configure_optimizer

TARGET_S = 600.0  # the first kind's pretraining, as in the episode: ten minutes
MAX_STEPS = 1000  # the committed runs' count: the default never trains more
STEP_ROUND = 25  # steps come in multiples of pretrain.py's --eval-every and --ckpt-every
PROCESS_S = 8.0  # a script's start: Python, torch, the checkpoints, the data
SAVE_S = 0.5  # a checkpoint (the weights and AdamW's state, 166 MB), written and renamed
REPORT_S = 10.0  # dev/report.py: the docs' tables and figures (3 and 5 s in the AMD EPYC's two main jobs)
LORA_OVERHEAD = 1.25  # a LoRA step over a full eager step of its batch (1.18 and 1.34 on the two CPUs measured)
SAMPLING_OVERHEAD = 1.3  # a sampled token with LoRA's adapters over a cached step (the AMD: 57 s for ~6,700 tokens)
DYNAMIC_OVERHEAD = 2.0  # dynamic NTK's cached step turns every held key on: about twice a cached step
# dynamic took 0.75-0.80 of its estimate below in the AMD EPYC's first three main jobs, and 0.79 of the stages
# before it's pace in the fourth (results/amd-epyc/main-job-default/, results/amd-epyc/plan-check/): its
# cached steps run faster than the measured ones say, for a reason not yet found; the estimate keeps what
# was measured. (Sinks ran at 0.71-0.87 in the first three, but level with the other stages in the fourth.)
DYNAMIC_SHARE = 0.78


# ----------------------------------------------------------------------------------------------
# The rates: seconds this machine takes for each kind of work the job does


ROUNDS = 5  # each kind of work is timed once a round: the median of five is the rate, whatever one burst does
BUSY_CORES = 0.3  # other programs busier than this while the plan measures: the plan says the machine is busy
LOW_SHARE = 0.15  # a training step below this share of the matrix peak measured beside it: something else runs


@dataclass
class Rates:
    """What main.py measured before the job, in seconds (a default model: 6 x 384, 16 x 256 batches)."""

    step_s: dict[str, float] = field(default_factory=dict)  # {kind: a pretraining step, as pretrain.py takes it}
    compile_s: dict[str, float] = field(default_factory=dict)  # {kind: what its first step takes more (compiling)}
    eager_step_s: float = 0.0  # the rope step, eager, in the run's dtype (the fine-tunes' step)
    eval_s: float = 0.0  # a forward of 8 x 256, all logits, no gradients, in the run's dtype
    eval_float32_s: float = 0.0  # the same in float32 (evaluate's comparison, the long-context scripts)
    window_s: float = 0.0  # a float32 forward of one window with the last place's logits (context.py's re-run)
    token_s: float = 0.0  # a float32 cached decoding step, batch 1, a full window held (sliding)
    seconds: float = 0.0  # what measuring them took
    other_cores: float | None = None  # cores other programs kept busy meanwhile (None: the OS does not say)
    share_of_peak: float | None = None  # the learned step's flops a second over the matrix peak measured beside it
    spread: float = 1.0  # the slowest of a training step's samples over their median: a burst shows here

    def line(self) -> str:
        kinds = " / ".join(f"{self.step_s[k]:.2f} s" for k in self.step_s)
        compiling = " / ".join(f"{self.compile_s[k]:.0f} s" for k in self.compile_s)
        steps = f"a pretraining step {kinds} (learned / rope), its first {compiling} more; " if self.step_s else ""
        return (f"measured in {self.seconds:.0f} s: {steps}a float32 window re-run {1e3 * self.window_s:.0f} ms, "
                f"a cached step {1e3 * self.token_s:.1f} ms")

    def busy(self) -> str | None:
        """Why the figures look like a busy machine's, in a few words; None when they look like its own."""
        why = []
        if self.other_cores is not None and self.other_cores > BUSY_CORES:
            why.append(f"other programs kept {self.other_cores:.1f} cores busy while the plan measured")
        if self.share_of_peak is not None and self.share_of_peak < LOW_SHARE:
            why.append(f"a training step ran at {self.share_of_peak:.2f} of the matrix peak measured beside it")
        return "; ".join(why) or None


def _times(fn: Callable[[], object], n: int, device: torch.device, clock: Callable[[], float]) -> list[float]:
    """Seconds of n calls of fn, each between two syncs."""
    seconds = []
    for _ in range(n):
        sync(device)
        t0 = clock()
        fn()
        sync(device)
        seconds.append(clock() - t0)
    return seconds


def measure(learned: GPTConfig, rope: GPTConfig, device: torch.device, dtype: torch.dtype, compile: bool,
            batch_size: int = 16, rounds: int = ROUNDS, training: bool = True,
            clock: Callable[[], float] = time.perf_counter, load: type[OtherLoad] = OtherLoad) -> Rates:
    """Time each kind of work the job does: the pretraining step of each kind as pretrain.py will take
    it (compiled where it compiles: the first call's extra seconds are its compile time), the rope
    step eager (the fine-tunes'), the measuring scripts' forwards and cached steps, and a matrix
    product at the machine's peak. Each is called once first (compiling, warming up), then once in
    each of `rounds` rounds, in turn, so a moment of load lands on one sample of each kind, never on
    all of one: a rate is the median of its samples. Meanwhile, what other programs take of the cores
    is read, and `Rates.busy` says so when it is much. `training` False: the steps are left out
    (nothing left to train)."""
    started = clock()
    if device.type == "cpu":
        tune_malloc()  # as pretrain.py runs: its steps keep their memory
    rates = Rates()
    T = rope.block_size
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, rope.vocab_size, (batch_size, T), generator=g).to(device) for _ in range(2))
    rows = torch.randint(0, rope.vocab_size, (8, T), generator=g).to(device)  # evaluate.py's batch

    def step_fn(model: GPT, forward: Callable, step_dtype: torch.dtype) -> Callable[[], None]:
        """The step pretrain.py takes (mvgpt.train.Step), its loss read as the loop reads it."""
        batch_attention_where_it_pays(model, device, step_dtype)  # as pretrain.py trains
        step = Step(model, configure_optimizer(model, lr=1e-4, weight_decay=0.1, device=device), device, step_dtype,
                    forward=forward)
        return lambda: step(x, y)[0].item()

    work: dict[str, Callable[[], object]] = {}
    if training:
        for kind, config in (("learned", learned), ("rope", rope)):
            torch.manual_seed(0)
            trained = GPT(config).to(device)
            work[kind] = step_fn(trained, torch.compile(trained) if compile else trained, dtype)
        torch.manual_seed(0)  # the fine-tunes' step: eager, in the run's dtype
        eager = GPT(rope).to(device)
        work["eager"] = step_fn(eager, eager, dtype)
    torch.manual_seed(0)
    model = GPT(rope).to(device).eval()  # as the measuring scripts load it: float32, PyTorch's attention
    cache = KVCache(rope, 1, device=device)

    def reading(fn: Callable[[], object], read_dtype: torch.dtype = torch.float32) -> Callable[[], object]:
        def read() -> object:
            with torch.no_grad(), autocast(device, read_dtype):
                return fn()
        return read

    def cached_step() -> None:
        cache.slide(T - 1)
        model(rows[:1, :1], cache=cache, last_only=True)

    work["eval"] = reading(lambda: model(rows), dtype)
    work["eval float32"] = reading(lambda: model(rows))
    work["window"] = reading(lambda: model(rows[:1], last_only=True))
    reading(lambda: model(rows[:1], cache=cache))()  # a full window held: the cached step slides it
    work["token"] = reading(cached_step)
    n = 512  # a matrix product at the peak of the run's dtype, beside the steps: the same moment's machine
    a = torch.randn(n, n, device=device).to(dtype)
    work["peak"] = lambda: a @ a

    first = {name: _times(fn, 1, device, clock)[0] for name, fn in work.items()}  # compiling, warming up
    samples: dict[str, list[float]] = {name: [] for name in work}
    with load(clock) as other:
        for _ in range(rounds):
            for name, fn in work.items():
                samples[name] += _times(fn, 1, device, clock)
    rate = {name: statistics.median(s) for name, s in samples.items()}
    if training:
        for kind in ("learned", "rope"):
            rates.step_s[kind] = rate[kind]
            rates.compile_s[kind] = max(0.0, first[kind] - rate[kind])
        rates.eager_step_s = rate["eager"]
        peak = 2 * n**3 / min(samples["peak"])  # a ceiling: the best the machine gave
        rates.share_of_peak = batch_size * T * training_flops_per_token(learned) / rate["learned"] / peak
        rates.spread = max(samples["learned"]) / rate["learned"]
    rates.eval_s, rates.eval_float32_s = rate["eval"], rate["eval float32"]
    rates.window_s, rates.token_s = rate["window"], rate["token"]
    rates.other_cores = other.cores
    del work
    gc.collect()
    rates.seconds = clock() - started
    return rates


# ----------------------------------------------------------------------------------------------
# The job's work, stage by stage


@dataclass(frozen=True)
class Job:
    """What main.py will run: its flags, the scripts' defaults it relies on, and what is done already."""

    steps: int  # pretraining steps of each kind
    val_tokens: int  # held-out tokens (evaluate.py reads them all)
    mixed: bool  # the run's dtype is not float32: evaluate.py reads each model in float32 too
    config: GPTConfig = field(default_factory=GPTConfig)  # the model's shape (rope or not: the same work)
    batch_size: int = 16
    finetune_steps: int = 80
    lora_steps: int = 150
    lora: bool = True  # the LoRA fine-tune runs (not in a --tiny check)
    report: bool = True  # dev/report.py runs (not in a --tiny check)
    done: dict[str, int] = field(default_factory=dict)  # {training stage: its steps done already}
    skipped: tuple[str, ...] = ()  # measuring stages whose JSON is up to date


@dataclass
class Stage:
    name: str
    seconds: float
    what: str = ""  # the work, for the plan's table


def _evals(start: int, end: int, every: int) -> int:
    """Evaluations pretrain.py makes from step start to end: every `every` steps, and one at the end."""
    if end <= start:
        return 0
    return end // every - start // every + (1 if end % every else 0)  # counted, not listed: any step count


def stages(rates: Rates, job: Job) -> list[Stage]:
    """Each stage main.py runs after measuring, with its estimated seconds (0 where it is done)."""
    c, W = job.config, job.config.block_size
    per_token = lambda ctx: forward_flops(c, ctx, ctx) / ctx  # noqa: E731  float32 forward flops a token at ctx
    token_s = rates.eval_float32_s / (8 * W)  # a token through a float32 forward at the training context
    eval_batch = rates.eval_s * job.batch_size / 8  # pretrain.py evaluates batches of its own size (16 x 256)
    out = []

    for kind in ("learned", "rope"):  # pretrain.py --compile --max-steps N, evaluating and saving every 25
        name, done = f"pretrain ({kind})", job.done.get(f"pretrain ({kind})", 0)
        if done >= job.steps:
            out.append(Stage(name, 0.0, "done"))
            continue
        evals = _evals(done, job.steps, 25)
        seconds = (PROCESS_S + rates.compile_s[kind] + (job.steps - done) * rates.step_s[kind]
                   + evals * 8 * eval_batch + (job.steps - done) // 25 * SAVE_S)
        out.append(Stage(name, seconds, f"{job.steps - done:,} steps"))

    windows = (job.val_tokens - 1) // W  # evaluate.py: every held-out window, 8 at a time, each model
    reading = rates.eval_s + (rates.eval_float32_s if job.mixed else 0.0)
    out.append(Stage("evaluate", PROCESS_S + 2 * -(-windows // 8) * reading, f"{2 * windows * W:,} tokens"))

    L, streams = 3 * W, 8  # context.py: 8 streams of 3 windows; learned re-runs its window, rope three ways
    per_stream = 2 * (L - W) * rates.window_s + (L - 1) * rates.token_s + L * token_s * per_token(L) / per_token(W)
    out.append(Stage("context", PROCESS_S + streams * per_stream, f"{streams} streams of {L}"))

    T, B, n = 4 * W, 4, job.finetune_steps  # the long-context fine-tune: 4 x 1024, eager, evaluating every 20
    done = job.done.get("long-context fine-tune", 0)
    if done < n:
        scale = (B * T * training_flops_per_token(replace(c, block_size=T))
                 / (job.batch_size * W * training_flops_per_token(c)))
        evals = _evals(done, n, 20)
        seconds = (PROCESS_S + (n - done) * scale * rates.eager_step_s
                   + evals * 8 * rates.eval_s * (B * T * per_token(T)) / (8 * W * per_token(W)) + evals * SAVE_S)
        out.append(Stage("long-context fine-tune", seconds, f"{n - done} steps of {B} x {T}"))
    else:
        out.append(Stage("long-context fine-tune", 0.0, "done"))

    # long_context.py --ctx: both rope models, 7 methods, 7 contexts, 16,384 tokens each; a forward at each
    contexts = [W * k // 4 for k in (4, 6, 8, 12, 16, 24, 32)]
    tokens = {ctx: ctx * min((job.val_tokens // ctx), max(1, 16384 // ctx)) for ctx in contexts}
    seconds = sum(2 * 7 * tokens[ctx] * token_s * per_token(ctx) / per_token(W) for ctx in contexts)
    seconds += sum(ctx * token_s * per_token(ctx) / per_token(W) for ctx in contexts)  # the memory table
    out.append(Stage("sweep", PROCESS_S + seconds, f"{2 * 7 * sum(tokens.values()):,} tokens"))

    L = 4 * W  # --sinks: 4 streams of 4 windows, three caches and the re-run window
    out.append(Stage("sinks", PROCESS_S + 4 * (3 * (L - 1) * rates.token_s + (L - W) * rates.window_s),
                     f"4 streams of {L}"))
    L = 2 * W  # --dynamic: 4 streams of 2 windows, two caches and a forward over every prefix
    prefixes = sum(rates.window_s * t * per_token(t) / (W * per_token(W)) for t in range(W, L))
    out.append(Stage("dynamic", PROCESS_S + DYNAMIC_SHARE * 4 * ((1 + DYNAMIC_OVERHEAD) * (L - 1) * rates.token_s
                                                                 + prefixes),
                     f"4 streams of {L}"))

    if job.lora and "LoRA fine-tune" in job.skipped:
        out.append(Stage("LoRA fine-tune", 0.0))
    elif job.lora:  # finetune.py: 150 steps of 8 x 256 in the run's dtype, then 24 stories of 160 tokens by each model
        seconds = (job.lora_steps * LORA_OVERHEAD * rates.eager_step_s / 2
                   + 2 * 24 * 160 * SAMPLING_OVERHEAD * rates.token_s + 2 * 8 * rates.eval_float32_s)
        out.append(Stage("LoRA fine-tune", PROCESS_S + seconds, f"{job.lora_steps} steps, 48 stories"))
    if job.report:
        out.append(Stage("report", REPORT_S, "tables and figures"))
    for stage in out:
        if stage.name in job.skipped:
            stage.seconds, stage.what = 0.0, "up to date"
    return out


def steps_for(rates: Rates, target_s: float = TARGET_S, cap: int = MAX_STEPS) -> int:
    """Pretraining steps for both kinds: as many as fit the first kind (learned positions) into
    `target_s`, counting its compile time, evaluations and checkpoints, in multiples of 25, at most `cap`."""
    fits = (target_s - PROCESS_S - rates.compile_s["learned"]) / step_seconds(rates)
    return int(min(cap, max(STEP_ROUND, round(fits / STEP_ROUND) * STEP_ROUND)))


def step_seconds(rates: Rates) -> float:
    """A pretraining step of the first kind, with its share of the evaluations and checkpoints (every 25)."""
    return rates.step_s["learned"] + (8 * 16 / 8 * rates.eval_s + SAVE_S) / 25


# Fewer steps than this train a model that writes nonsense: 75 steps left held-out loss at 5.29, where 300
# reach about 3.6 and the committed 1,000 about 2.8 (results/warmup.json, results/pretrain-rope.json). A
# machine that fits fewer into ten minutes, but the floor into SLOW_OK times them, trains the floor; one
# slower still, or too busy, is told so, with the command for a smaller job.
STEP_FLOOR = 300
SLOW_OK = 1.5


def floor_seconds(rates: Rates) -> float:
    """What the first kind's pretraining takes at the floor's steps, at these rates."""
    return PROCESS_S + rates.compile_s["learned"] + STEP_FLOOR * step_seconds(rates)


def below_floor(rates: Rates) -> str | None:
    """Why the default job would train a useless model here, and what to run instead, in one line;
    None where the floor fits (steps_for, or the floor itself on a machine a little slow)."""
    if steps_for(rates) >= STEP_FLOOR or floor_seconds(rates) <= SLOW_OK * TARGET_S:
        return None
    busy = rates.busy()
    return (f"this machine took {rates.step_s['learned']:.2f} s a pretraining step while the plan measured"
            + (f" ({busy})" if busy else "") + f": ten minutes would train {steps_for(rates)} steps a model, "
            f"fewer than the {STEP_FLOOR} a useful one needs: run it when the machine is quieter, ask for the "
            f"steps, `python scripts/main.py --max-steps {STEP_FLOOR}` (about {minutes(floor_seconds(rates))} a "
            "model here), or check the install in minutes with `python scripts/main.py --tiny`")


# ----------------------------------------------------------------------------------------------
# The plan printed, and the time left after each stage, planned again from what the stages took


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


REPLAN = 0.1  # the rest's estimate changed by more than this share: say why
SLOWER = 1.5  # a stage that took this many times its plan (and half a minute more) is said to


def busy(stage: dict) -> bool:
    """Did other programs keep more than BUSY_CORES busy while this stage ran?"""
    return stage["other_cores"] is not None and stage["other_cores"] > BUSY_CORES


class Progress:
    """The plan's table, then after each stage a line: its time against its estimate, and the time left.

    The time left is planned again after every stage: the stages left, at the pace the stages so far
    kept against their plan (a machine busy while the plan measured, or a core taken since, shows
    there first). The line says when that moved the estimate, and a stage far slower than planned
    is said, with what other programs took of the cores meanwhile."""

    def __init__(self, plan: list[Stage], started: float | None = None, clock: Callable[[], float] = time.perf_counter,
                 say: Callable[[str], None] = print, load: type[OtherLoad] = OtherLoad) -> None:
        """started: the clock when the job began (the data's preparation and the measuring count too)."""
        self.plan, self.clock, self.say, self.load = plan, clock, say, load
        self.last = clock()
        self.started = self.last if started is None else started
        self.left = {stage.name: stage.seconds for stage in plan}
        self.planned_s = self.total  # the whole job's estimate, the time before the plan included (show)
        self.took: list[dict] = []  # each stage done: its name, estimate and time
        self.pace = 1.0  # the stages so far: their time over their plan
        self.other = load(clock).__enter__()  # other programs' share of the cores during the stage

    @property
    def total(self) -> float:
        return sum(stage.seconds for stage in self.plan)

    def show(self, head: str) -> None:
        width = max(len(stage.name) for stage in self.plan)
        lines = [f"plan ({head}):"]
        lines += [f"  {stage.name:<{width}}  {stage.what:<24} {minutes(stage.seconds):>9}" for stage in self.plan]
        self.planned_s = self.last - self.started + self.total
        lines.append(f"  {'total':<{width}}  {'':<24} {minutes(self.total):>9}, "
                     f"{minutes(self.planned_s)} with the {minutes(self.last - self.started)} so far")
        self.say("\n".join(lines))

    def done(self, name: str) -> None:
        now = self.clock()
        took, self.last = now - self.last, now
        self.other.__exit__(None, None, None)
        other, self.other = self.other.cores, self.load(self.clock).__enter__()
        planned = self.left.pop(name)
        before = sum(self.left.values()) * self.pace
        self.took.append({"stage": name, "planned_s": planned, "took_s": took, "other_cores": other})
        timed = [t for t in self.took if t["planned_s"] > 0]
        # a stage slowed by other programs that have stopped since says nothing of the rest: while the last
        # stage ran quiet, the pace is the quiet stages'; while other programs still run, every stage counts
        quiet = [t for t in timed if not busy(t)]
        basis = quiet if quiet and not busy(self.took[-1]) else timed
        left_out = [t["stage"] for t in timed if t not in basis]
        if basis:
            self.pace = sum(t["took_s"] for t in basis) / sum(t["planned_s"] for t in basis)
        left = sum(self.left.values()) * self.pace
        self.took[-1]["left_s"] = left  # the estimate of the rest, said after this stage
        notes = []
        if planned > 0 and took > SLOWER * planned and took - planned > 30:
            notes.append(f"{name} took {took / planned:.1f}x its plan" + (
                f": other programs kept {other:.1f} cores busy meanwhile" if other and other > BUSY_CORES else
                ": this machine ran slower than when the plan measured it"))
        if self.left and abs(left - before) > REPLAN * max(before, 60.0):
            notes.append(f"the stages so far took {self.pace:.2f}x their plan" + (
                f" ({', '.join(left_out)} left out: other programs ran meanwhile)" if left_out else "")
                + f": the rest planned again, from {minutes(before)} to {minutes(left)}")
        rest = ("nothing left" if not self.left else f"about {minutes(left)} left" if left >= 60 else
                "less than a minute left")  # finer than a minute, the estimate is not worth its digits
        self.say(f"\n[{name}: {minutes(took)} (planned {minutes(planned)}); " + "".join(n + "; " for n in notes)
                 + f"{rest}, {minutes(now - self.started)} so far]")

    def summary(self) -> dict:
        """The plan against the job as it went: main.py writes it to results/main-job.json."""
        return {"planned_s": self.planned_s, "took_s": self.clock() - self.started, "stages": self.took}
