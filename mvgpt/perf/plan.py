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
from mvgpt.perf.cpu_attention import batched_attention_pays, use_batched_attention
from mvgpt.perf.flops import forward_flops, training_flops_per_token
from mvgpt.train import configure_optimizer

TARGET_S = 600.0  # the first kind's pretraining, as in the episode: ten minutes
MAX_STEPS = 1000  # the committed runs' count: the default never trains more
STEP_ROUND = 25  # steps come in multiples of pretrain.py's --eval-every and --ckpt-every
PROCESS_S = 8.0  # a script's start: Python, torch, the checkpoints, the data
SAVE_S = 0.5  # a checkpoint (the weights and AdamW's state, 166 MB), written and renamed
REPORT_S = 30.0  # dev/report.py: the docs' tables and figures
LORA_OVERHEAD = 1.25  # a LoRA step over a full float32 step of its batch (1.18 and 1.34 on the two CPUs measured)
SAMPLING_OVERHEAD = 1.3  # a sampled token with LoRA's adapters over a cached step (the AMD: 57 s for ~6,700 tokens)
DYNAMIC_OVERHEAD = 2.0  # dynamic NTK's cached step turns every held key on: about twice a cached step


# ----------------------------------------------------------------------------------------------
# The rates: seconds this machine takes for each kind of work the job does


@dataclass
class Rates:
    """What main.py measured before the job, in seconds (a default model: 6 x 384, 16 x 256 batches)."""

    step_s: dict[str, float] = field(default_factory=dict)  # {kind: a pretraining step, as pretrain.py takes it}
    compile_s: dict[str, float] = field(default_factory=dict)  # {kind: what its first step takes more (compiling)}
    eager_step_s: dict[str, float] = field(default_factory=dict)  # {"float32", "auto"}: the rope step, eager
    eval_s: float = 0.0  # a forward of 8 x 256, all logits, no gradients, in the run's dtype
    eval_float32_s: float = 0.0  # the same in float32 (evaluate's comparison, the long-context scripts)
    window_s: float = 0.0  # a float32 forward of one window with the last place's logits (context.py's re-run)
    token_s: float = 0.0  # a float32 cached decoding step, batch 1, a full window held (sliding)
    seconds: float = 0.0  # what measuring them took

    def line(self) -> str:
        kinds = " / ".join(f"{self.step_s[k]:.2f} s" for k in self.step_s)
        compiling = " / ".join(f"{self.compile_s[k]:.0f} s" for k in self.compile_s)
        return (f"measured in {self.seconds:.0f} s: a pretraining step {kinds} (learned / rope), its first "
                f"{compiling} more; a float32 window re-run {1e3 * self.window_s:.0f} ms, a cached step "
                f"{1e3 * self.token_s:.1f} ms")


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
            batch_size: int = 16, steps: int = 3, training: bool = True,
            clock: Callable[[], float] = time.perf_counter) -> Rates:
    """Time each kind of work: the pretraining step of each kind as pretrain.py will take it (compiled
    where it compiles, the first step's extra seconds kept as its compile time), the rope step eager
    (the fine-tunes'), and the measuring scripts' forwards and cached steps. `training` False: only
    the latter (nothing left to train)."""
    started = clock()
    rates = Rates()
    T = rope.block_size
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, rope.vocab_size, (batch_size, T), generator=g).to(device) for _ in range(2))
    rows = torch.randint(0, rope.vocab_size, (8, T), generator=g).to(device)  # evaluate.py's batch

    def step_fn(model: GPT, forward: Callable, step_dtype: torch.dtype) -> Callable[[], None]:
        optimizer = configure_optimizer(model, lr=1e-4, weight_decay=0.1, device=device)

        def step() -> None:
            with autocast(device, step_dtype):
                _, loss = forward(x, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            loss.item()

        return step

    if training:
        for kind, config in (("learned", learned), ("rope", rope)):
            torch.manual_seed(0)
            trained = GPT(config).to(device)
            if batched_attention_pays(device, dtype):  # as pretrain.py trains
                use_batched_attention(trained)
            step = step_fn(trained, torch.compile(trained) if compile else trained, dtype)
            first, *rest = _times(step, 1 + steps, device, clock)
            rates.step_s[kind] = statistics.median(rest)
            rates.compile_s[kind] = max(0.0, first - rates.step_s[kind])
            del trained, step
        for name, step_dtype in (("auto", dtype), ("float32", torch.float32)):
            if name == "float32" and dtype == torch.float32:
                rates.eager_step_s[name] = rates.eager_step_s["auto"]
                continue
            torch.manual_seed(0)
            eager = GPT(rope).to(device)
            if batched_attention_pays(device, step_dtype):
                use_batched_attention(eager)
            rates.eager_step_s[name] = statistics.median(_times(step_fn(eager, eager, step_dtype), 1 + steps,
                                                                device, clock)[1:])
            del eager
    torch.manual_seed(0)
    model = GPT(rope).to(device).eval()  # as the measuring scripts load it: float32, PyTorch's attention
    with torch.no_grad():
        for name, eval_dtype in (("eval_s", dtype), ("eval_float32_s", torch.float32)):
            with autocast(device, eval_dtype):
                setattr(rates, name, statistics.median(_times(lambda: model(rows), 3, device, clock)[1:]))
        rates.window_s = statistics.median(_times(lambda: model(rows[:1], last_only=True), 3, device, clock)[1:])
        cache = KVCache(rope, 1, device=device)
        model(rows[:1], cache=cache)

        def cached_step() -> None:
            cache.slide(T - 1)
            model(rows[:1, :1], cache=cache, last_only=True)

        rates.token_s = statistics.median(_times(cached_step, 6, device, clock)[1:])
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
    return len({s for s in range(start + 1, end + 1) if s % every == 0} | ({end} if end > start else set()))


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
        seconds = (PROCESS_S + (n - done) * scale * rates.eager_step_s["auto"]
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
    out.append(Stage("dynamic", PROCESS_S + 4 * ((1 + DYNAMIC_OVERHEAD) * (L - 1) * rates.token_s + prefixes),
                     f"4 streams of {L}"))

    if job.lora and "LoRA fine-tune" in job.skipped:
        out.append(Stage("LoRA fine-tune", 0.0))
    elif job.lora:  # finetune.py: 150 float32 steps of 8 x 256, then 24 stories of 160 tokens by each model
        seconds = (job.lora_steps * LORA_OVERHEAD * rates.eager_step_s["float32"] / 2
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
    per_step = rates.step_s["learned"] + (8 * 16 / 8 * rates.eval_s + SAVE_S) / 25  # an evaluation every 25
    fits = (target_s - PROCESS_S - rates.compile_s["learned"]) / per_step
    return int(min(cap, max(STEP_ROUND, round(fits / STEP_ROUND) * STEP_ROUND)))


# ----------------------------------------------------------------------------------------------
# The plan printed, and the time left after each stage


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


class Progress:
    """The plan's table, then after each stage a line: its time against its estimate, and the time left."""

    def __init__(self, plan: list[Stage], started: float | None = None, clock: Callable[[], float] = time.perf_counter,
                 say: Callable[[str], None] = print) -> None:
        """started: the clock when the job began (the data's preparation and the measuring count too)."""
        self.plan, self.clock, self.say = plan, clock, say
        self.last = clock()
        self.started = self.last if started is None else started
        self.left = {stage.name: stage.seconds for stage in plan}
        self.planned_s = self.total  # the whole job's estimate, the time before the plan included (show)
        self.took: list[dict] = []  # each stage done: its name, estimate and time

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
        planned = self.left.pop(name)
        left = sum(self.left.values())
        self.took.append({"stage": name, "planned_s": planned, "took_s": took})
        self.say(f"\n[{name}: {minutes(took)} (planned {minutes(planned)}); about {minutes(left)} left, "
                 f"{minutes(now - self.started)} so far]")

    def summary(self) -> dict:
        """The plan against the job as it went: main.py writes it to results/main-job.json."""
        return {"planned_s": self.planned_s, "took_s": self.clock() - self.started, "stages": self.took}
