"""Training: the optimizer, the learning rate, and the one step every trainer takes.

`Step` is the step: a forward pass with the matrix products in the run's precision (autocast),
backward, the gradient's norm clipped, the optimizer's update. scripts/pretrain.py and
scripts/finetune.py train with it, scripts/bench.py times it, and the main job's plan
(mvgpt/perf/plan.py) measures it, so every figure is the speed of the step a learner runs.

Around the step, what every training loop needs: the learning-rate schedule (`lr_at`), a watch that
stops a run whose loss runs away before its weights are saved (`LossWatch`), and Ctrl-C or SIGTERM
told to the loop, which saves and exits (`StopSignals`).

Example:
    optimizer = configure_optimizer(model, lr=2e-3, weight_decay=0.1, device=device)
    step = Step(model, optimizer, device, dtype)       # dtype: mvgpt.device.resolve_dtype("auto", device)
    for i in range(max_steps):
        loss, grad_norm = step(*get_batch(data, 16, 256, seed, i), lr=lr_at(i, 2e-3, 200, 0.1, max_steps))
"""

from __future__ import annotations

import math
import signal
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.distributed as dist

from mvgpt.device import autocast, memory_bytes
from mvgpt.kit.errors import UserError
from mvgpt.model import GPT, GPTConfig

# ----------------------------------------------------------------------------------------------
# The optimizer and the learning rate


OPTIMIZERS = ("adamw", "muon")
DEFAULT_OPTIMIZER = "adamw"


def configure_optimizer(
    model: GPT, lr: float, weight_decay: float, device: torch.device | str, betas: tuple[float, float] = (0.9, 0.95),
    muon: bool = False,
) -> torch.optim.Optimizer | MuonAdamW:
    """AdamW with weight decay on the matrices (linear layers, embeddings) only; with `muon`, Muon for the
    blocks' matrices and AdamW for the rest (MuonAdamW).

    Biases and norm gains are left alone: decaying them toward 0 only fights the model (nanoGPT's
    and GPT-3's choice). The fused kernel updates every tensor in one pass (CPU and CUDA).
    """
    if muon:
        return MuonAdamW(model, lr, weight_decay, betas, device)
    return adamw(list(model.parameters()), lr, weight_decay, betas, device)


def adamw(params: list[torch.nn.Parameter], lr: float, weight_decay: float, betas: tuple[float, float],
          device: torch.device | str) -> torch.optim.AdamW:
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=torch.device(device).type in ("cpu", "cuda"))


def block_matrices(model: GPT) -> list[torch.nn.Parameter]:
    """The blocks' weight matrices (qkv, projection, the MLP's two): what Muon makes orthogonal."""
    return [p for name, p in model.named_parameters() if name.startswith("blocks.") and p.dim() == 2]


class MuonAdamW:
    """Muon for the blocks' weight matrices (qkv, projection, the MLP's two: 24 of them), AdamW for the
    token embedding, the table of positions, biases and norms, stepped as one optimizer.

    Muon keeps a momentum of each matrix's gradient, as SGD does, and updates the matrix by that momentum
    made orthogonal (its singular values all set to about one, by five Newton-Schulz iterations): every
    direction of the matrix moves by the same amount, where AdamW's update is led by a few large ones.
    `adjust_lr_fn="match_rms_adamw"` scales the update to the size AdamW's would have, so both take
    the same learning rate and weight decay ([Muon](https://kellerjordan.github.io/posts/muon/),
    torch.optim.Muon). Its state (the momenta, AdamW's moments) is saved and resumed as one dict.
    """

    def __init__(self, model: GPT, lr: float, weight_decay: float, betas: tuple[float, float],
                 device: torch.device | str) -> None:
        matrices = block_matrices(model)
        held = {id(p) for p in matrices}
        self.muon = torch.optim.Muon(matrices, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw")
        self.adamw = adamw([p for p in model.parameters() if id(p) not in held], lr, weight_decay, betas, device)

    @property
    def param_groups(self) -> list[dict]:
        """Both optimizers' groups, looked up each time: loading a state replaces an optimizer's groups."""
        return self.adamw.param_groups + self.muon.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.adamw.zero_grad(set_to_none=set_to_none)
        self.muon.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        self.adamw.step()
        self.muon.step()

    def state_dict(self) -> dict:
        return {"adamw": self.adamw.state_dict(), "muon": self.muon.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or state.keys() != {"adamw", "muon"}:
            raise ValueError("not a Muon and AdamW state: the run was made with another optimizer")
        self.adamw.load_state_dict(state["adamw"])
        self.muon.load_state_dict(state["muon"])


def cosine(progress: float, min_ratio: float) -> float:
    """1 at progress 0, down a half cosine to min_ratio at progress 1 (and after)."""
    progress = min(1.0, max(0.0, progress))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def flat_then_down(progress: float, min_ratio: float, cooldown: float) -> float:
    """1 until the last `cooldown` share of the way, then straight down to min_ratio at progress 1 (and
    after): a warm-up, stable, decay ("WSD") schedule's tail."""
    down = (min(1.0, max(0.0, progress)) - (1 - cooldown)) / cooldown if cooldown > 0 else 0.0
    return min_ratio + (1 - min_ratio) * (1 - min(1.0, max(0.0, down)))


# A run bounded by the clock warms up for its steps, or until this share of its budget is spent where
# they take longer. Half: with a fifth, a machine that made about 75 steps in its time reached the peak lr
# by step 16, where the loss climbs (results/warmup.json), and ended 0.9 to 1.4 higher than with half
# (results/amd-epyc/recipes/slow-2min.json, docs/lab/recipes.md). A run with 400 steps or more warms
# up over its 200, as the long runs do, so it is the long run's step for step until then. The cosine
# then starts from the peak, over the time left (lr_at's after_warmup): a cosine over the whole clock
# dropped the lr to 0.55 of the peak when half's warm-up ended, and lost to a fifth at about 445 steps.
WARMUP_SHARE = 0.5
# Bounded by steps (the main job), a run gives its warm-up a fifth of them, as the 1,000-step runs that
# tuned it do (docs/lab/schedule.md).
STEPS_WARMUP_SHARE = 0.2
WARMUP_STEPS = 200  # pretrain.py's --warmup (why 200: docs/pretraining.md)


def lr_at(
    step: int,
    lr: float,
    warmup: int,
    min_ratio: float,
    max_steps: int | None = None,
    elapsed: float = 0.0,
    budget: float | None = None,
    step_seconds: float | None = None,
    share: float = WARMUP_SHARE,
    schedule: str = "cosine",
    cooldown: float = 0.5,
    after_warmup: bool = True,
) -> float:
    """The learning rate of step `step` (0-based): linear warm-up over `warmup` steps, then a cosine
    decay to lr * min_ratio (`schedule` "cosine"), or a flat lr and a straight decay to lr * min_ratio
    over the last `cooldown` share of the run ("wsd": warm-up, stable, decay).

    The decay runs over steps when the run has a step count (max_steps: exactly reproducible), or
    over the clock when it has only a time budget: at `elapsed` seconds of `budget`, the cosine is
    at elapsed / budget of its way, so it reaches its floor when the time is up on any device.
    Bounded by the clock, the warm-up is too: at `step_seconds` a step (the pace so far), it takes
    the lesser of `warmup` steps and the steps that fit in `share` of the budget, so a slow machine
    leaves it in time to decay (a fast one, whose steps end it first, is unchanged; share 0: the
    steps alone). The pace is the steps' own, not the clock's so far, so the time a first step
    spends compiling does not hurry the warm-up.

    On the clock, the cosine runs over the time left after the warm-up's steps (`after_warmup`), so
    it starts from the peak when the warm-up ends, as it does over steps. `after_warmup=False` is
    the schedule before it: the cosine at elapsed / budget of its way, which counts the warm-up's time,
    so the lr drops when a long warm-up ends (half the time gone: from the peak to 0.55 of it). Raced
    side by side in docs/lab/recipes.md; the first step, with no pace yet, is on the clock's cosine.
    """
    if max_steps is None:
        assert budget is not None and budget > 0, "a run without max_steps needs a time budget"
        if step_seconds and share:
            warmup = min(warmup, max(1.0, share * budget / step_seconds))
    if step < warmup:
        return lr * min(1.0, (step + 1) / warmup)
    if schedule == "wsd":  # flat after the warm-up, then straight down over the last `cooldown` of the run
        return lr * flat_then_down(step / max_steps if max_steps is not None else elapsed / budget, min_ratio,
                                   cooldown)
    if max_steps is not None:
        return lr * cosine((step - warmup) / max(1, max_steps - warmup), min_ratio)
    if after_warmup and step_seconds:  # the cosine over the time left after the warm-up's steps, from the peak
        warm_s = warmup * step_seconds
        return lr * cosine((elapsed - warm_s) / max(budget - warm_s, 1e-9), min_ratio)
    return lr * cosine(elapsed / budget, min_ratio)


# ----------------------------------------------------------------------------------------------
# The step


class Step:
    """One training step: `step(x, y, lr)` -> (the loss, the gradient's norm before clipping).

    The forward pass runs under autocast in `dtype` (bf16 products where the hardware has them,
    weights, gradients and the optimizer's state in float32: mvgpt/device.py), then backward, the
    gradient's norm clipped to `grad_clip` (0: measured, left alone), and the update of the
    parameters that train (a LoRA run's adapters; all of them in pretraining). Both values are
    tensors, so a GPU is not made to wait for them; `.item()` reads them.

    `forward` is what runs the model (the model itself, or it compiled, or wrapped for several
    processes); `loss` turns a batch into the loss (default: the model's own, over every target).
    A faster attention for training is the caller's to put in (its hook, `CausalSelfAttention.attend`:
    mvgpt/perf/cpu_attention.py's `use_batched_attention` where it pays).
    """

    def __init__(self, model: GPT, optimizer: torch.optim.Optimizer, device: torch.device | str, dtype: torch.dtype,
                 *, grad_clip: float = 1.0, forward: Callable | None = None,
                 loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> None:
        self.optimizer, self.device, self.dtype, self.grad_clip = optimizer, torch.device(device), dtype, grad_clip
        self.params = [p for p in model.parameters() if p.requires_grad]
        forward = model if forward is None else forward
        self.loss = loss or (lambda x, y: forward(x, y)[1])

    def __call__(self, x: torch.Tensor, y: torch.Tensor, lr: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        with autocast(self.device, self.dtype):
            loss = self.loss(x.to(self.device), y.to(self.device))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip or math.inf)
        self.optimizer.step()
        return loss.detach(), grad_norm


def training_bytes(config: GPTConfig, batch_size: int) -> int:
    """About what a training step of this model and batch holds in memory, at most (float32 throughout):
    weights, gradients and AdamW's two moments (16 bytes a weight); each block's activations kept for
    the backward pass (about 16 numbers a channel a token, and the attention's T x T scores a head);
    the logits, their softmax and gradient. A bound to check against the machine before anything is
    allocated, not a measurement."""
    L, C, T, V, H = config.n_layer, config.n_embd, config.block_size, config.vocab_size, config.n_head
    weights = L * 12 * C * C + V * C + T * C
    activations = L * batch_size * T * (16 * C + 2 * H * T) + 3 * batch_size * T * V
    return 16 * weights + 4 * activations


def check_fits_training(config: GPTConfig, batch_size: int) -> None:
    """A one-line error before any work where training this model and batch would not fit in memory."""
    need, have = training_bytes(config, batch_size), memory_bytes()
    if have is not None and need > have:
        blocks = f"{config.n_layer} block{'s' if config.n_layer > 1 else ''}"
        raise UserError(f"training {blocks} of {config.n_embd} channels, a window of "
                        f"{config.block_size}, {batch_size} sequences a step asks for about {need / 2**30:,.0f} GiB, "
                        f"more than this machine's {have / 2**30:,.0f} GiB: make the model or the batch smaller")


# ----------------------------------------------------------------------------------------------
# Sane weights only


def all_finite(params: Iterable[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in params)


class LossWatch:
    """Has the run diverged? The losses of recent steps against the median of those before.

    `step(loss)` after each step's forward: non-finite, or the median of the last SMOOTH losses
    more than FACTOR times the median of the WINDOW losses before them, is divergence.
    `check(loss)` before a save, with the loss of the weights about to be saved: the same bound.
    Either way the caller stops with the message, and the last checkpoint stays as it was.
    """

    WINDOW, SMOOTH, FACTOR = 50, 3, 2.0

    def __init__(self, losses: Iterable[float] = ()) -> None:
        losses = losses if isinstance(losses, (list, tuple)) else []  # a checkpoint's, maybe crafted
        self.losses = [x for x in losses if isinstance(x, (int, float)) and math.isfinite(x)][-self.WINDOW:]

    def reference(self, recent: int = 0) -> float | None:
        """The median of the WINDOW losses before the last `recent` ones (None with too few)."""
        before = self.losses[: len(self.losses) - recent] if recent else self.losses
        return statistics.median(before[-self.WINDOW:]) if len(before) >= self.SMOOTH else None

    def step(self, loss: float, at: int) -> str | None:
        """Record a step's loss; a one-line reason when the run has diverged, else None."""
        if not math.isfinite(loss):
            return f"the loss became {loss} at step {at}"
        self.losses.append(loss)
        ref = self.reference(self.SMOOTH)
        now = statistics.median(self.losses[-self.SMOOTH:])
        self.losses = self.losses[-(self.WINDOW + self.SMOOTH):]
        if ref is not None and now > self.FACTOR * ref:
            return (f"the loss ran away at step {at} (the last {self.SMOOTH} steps' median {now:.4g}, more than "
                    f"{self.FACTOR:g}x the {ref:.4g} of the steps before)")
        return None

    def check(self, loss: float, at: int) -> str | None:
        """Before a save: the loss of the weights about to be saved, against the recent median."""
        if not math.isfinite(loss):
            return f"the weights of step {at} give a loss of {loss}"
        ref = self.reference()
        if ref is not None and loss > self.FACTOR * ref:
            return (f"the weights of step {at} give a loss of {loss:.4g}, more than {self.FACTOR:g}x the recent "
                    f"median {ref:.4g}")
        return None


def diverged(reason: str, folder: Path, saved: int | None, what: str = "checkpoint") -> UserError:
    """The one line a diverging run stops with: what happened, what is kept, what to do."""
    if saved:
        return UserError(f"{reason}: the run has diverged and stops; the {what} of step {saved} in {folder} is "
                         "kept as it was: resume with a lower --lr")
    return UserError(f"{reason}: the run has diverged and stops, before any {what} was saved: run again with a "
                     "lower --lr")


# ----------------------------------------------------------------------------------------------
# Stopping on a signal


class StopSignals:
    """Ctrl-C (SIGINT) and SIGTERM ask the loop to stop after the current step, save, and exit.

    Under DDP every rank must follow one clock (the schedule reads it) and stop at the same step:
    rank 0's clock decides for all, and a signal to any rank stops all.
    The previous handlers come back on exit (a test calling main() keeps its own).
    """

    def __init__(self) -> None:
        self.signal: int | None = None

    def __enter__(self) -> StopSignals:
        self.previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)

    def _on_signal(self, signum, frame) -> None:
        self.signal = signum

    def agree(self, elapsed: float, device: torch.device) -> tuple[float, bool]:
        """(elapsed seconds, stop now), the same on every rank: rank 0's clock, and whether any rank
        has had a signal. A signal arriving after this waits for the next step."""
        stop = self.signal is not None
        if dist.is_initialized():  # one sum: rank 0's seconds (the others add 0) and the signals
            mine = [elapsed if dist.get_rank() == 0 else 0.0, float(stop)]
            shared = torch.tensor(mine, dtype=torch.float64, device=device)
            dist.all_reduce(shared)
            elapsed, stop = shared[0].item(), bool(shared[1])
        return elapsed, stop
