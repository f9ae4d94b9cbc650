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


def lr_at(
    step: int,
    lr: float,
    warmup: int,
    min_ratio: float,
    max_steps: int | None = None,
    elapsed: float = 0.0,
    budget: float | None = None,
) -> float:
    """The learning rate of step `step` (0-based): linear warm-up over `warmup` steps, then a cosine
    decay to lr * min_ratio.

    The decay runs over steps when the run has a step count (max_steps: exactly reproducible), or
    over the clock when it has only a time budget: at `elapsed` seconds of `budget`, the cosine is
    at elapsed / budget of its way, so it reaches its floor when the time is up on any device.
    """
    if step < warmup:
        return lr * (step + 1) / warmup
    if max_steps is not None:
        return lr * cosine((step - warmup) / max(1, max_steps - warmup), min_ratio)
    assert budget is not None and budget > 0, "a run without max_steps needs a time budget"
    return lr * cosine(elapsed / budget, min_ratio)
