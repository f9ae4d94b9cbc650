"""What a training step needs besides the model: the optimizer, and the learning-rate schedule.

scripts/pretrain.py trains with these, and scripts/bench.py times the same step, so a benchmark
figure is the speed of the step a learner runs.
"""

from __future__ import annotations

import math

import torch

from mvgpt.model import GPT


def configure_optimizer(
    model: GPT, lr: float, weight_decay: float, device: torch.device | str, betas: tuple[float, float] = (0.9, 0.95)
) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices (linear layers, embeddings) only.

    Biases and norm gains are left alone: decaying them toward 0 only fights the model (nanoGPT's
    and GPT-3's choice). The fused kernel updates every tensor in one pass (CPU and CUDA).
    """
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=torch.device(device).type in ("cpu", "cuda"))


def cosine(progress: float, min_ratio: float) -> float:
    """1 at progress 0, down a half cosine to min_ratio at progress 1 (and after)."""
    progress = min(1.0, max(0.0, progress))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


# A run bounded by the clock warms up for at most this share of its budget: the share the step-bounded
# default gives its warm-up (200 of the main job's 1,000 steps, the schedule the warm-up was tuned on:
# docs/pretraining.md), so a machine that gets fewer steps runs the same shape of schedule, shrunk. A
# smaller share (5-10%, common elsewhere) would put the slowest CPU's ten minutes (about 145 steps) at
# the peak within 7 to 15 steps, where a 20-step warm-up already made the loss climb by two nats
# (results/warmup.json).
WARMUP_SHARE = 0.2
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
) -> float:
    """The learning rate of step `step` (0-based): linear warm-up over `warmup` steps, then a cosine
    decay to lr * min_ratio.

    The decay runs over steps when the run has a step count (max_steps: exactly reproducible), or
    over the clock when it has only a time budget: at `elapsed` seconds of `budget`, the cosine is
    at elapsed / budget of its way, so it reaches its floor when the time is up on any device.
    Bounded by the clock, the warm-up is too: at `step_seconds` a step (the pace so far), it takes
    the lesser of `warmup` steps and the steps that fit in `share` of the budget, so a slow machine
    leaves it in time to decay (a fast one, whose steps end it first, is unchanged; share 0: the
    steps alone). The pace is the steps' own, not the clock's so far, so the time a first step
    spends compiling does not hurry the warm-up.
    """
    if max_steps is None:
        assert budget is not None and budget > 0, "a run without max_steps needs a time budget"
        if step_seconds and share:
            warmup = min(warmup, max(1.0, share * budget / step_seconds))
    if step < warmup:
        return lr * min(1.0, (step + 1) / warmup)
    if max_steps is not None:
        return lr * cosine((step - warmup) / max(1, max_steps - warmup), min_ratio)
    return lr * cosine(elapsed / budget, min_ratio)
