"""Reading past the training context: ways to scale rotary positions (context extension).

A rope model trained on windows of `train_ctx` tokens has only seen distances below train_ctx.
Asked for a context of N > train_ctx, it meets angles it never saw. The methods here change the
positions, or the speeds of the pairs, so that the angles stay in (or near) the trained range.
With s = N / train_ctx and d = head size:

- none: plain RoPE, positions as they are.
- linear: every position divided by s, whenever a factor is given, also within the training
  context (llama.cpp's first attempt: it costs perplexity at short contexts).
- linear-when-needed: positions divided by s only when N > train_ctx (the llama.cpp PR's rule).
- pr-nonlinear: p = p0 * a / (1 + p0 / b), a = sqrt(train_ctx / N), b = a * N / (1 - a), when
  N > train_ctx (the PR's last paragraph).
- ntk: the base becomes base * s^(d / (d - 2)) when N > train_ctx: the slow pairs are
  interpolated, the fast ones barely change.
- dynamic-ntk: the NTK base computed from the length L read so far, when L > train_ctx:
  base * ((f * L / train_ctx) - (f - 1))^(d / (d - 2)), as HF transformers' `dynamic` type.
- yarn: per pair, a blend between unscaled (fast pairs, many turns over the training context)
  and interpolated by s (slow pairs), over a ramp between beta_fast and beta_slow turns; queries
  and keys are each scaled by 0.1 ln(s) + 1, so attention logits by its square.

`scaled_rotary` is model.py's `rotary` with a method applied; long_context.py folds it into the
table of angles the model reads, so the model never knows which method is in use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

SCALING_METHODS = ("none", "linear", "linear-when-needed", "pr-nonlinear", "ntk", "dynamic-ntk", "yarn")


@dataclass(frozen=True)
class RopeScaling:
    method: str  # one of SCALING_METHODS
    train_ctx: int  # the context the model was trained at (GPTConfig.block_size)
    ctx: int  # the context asked for, N
    factor: float | None = None  # linear: s (default N / train_ctx); dynamic-ntk: f (default 1)
    beta_fast: float = 32.0  # yarn: pairs turning more often than this over train_ctx stay as they are
    beta_slow: float = 1.0  # yarn: pairs turning less often than this are interpolated in full
    length: int | None = None  # dynamic-ntk: the length read so far (set per forward)

    def __post_init__(self) -> None:
        if self.method not in SCALING_METHODS:
            raise ValueError(f"unknown rope scaling {self.method!r}: choose one of {', '.join(SCALING_METHODS)}")
        if self.ctx < 1:
            raise ValueError(f"a context of {self.ctx} tokens is below 1: ask for at least one token")
        if self.factor is not None and self.factor <= 0:
            raise ValueError(f"rope scaling factor must be positive, got {self.factor}")

    @property
    def s(self) -> float:
        """The scale factor: the given one (linear), else N / train_ctx."""
        if self.method == "linear" and self.factor is not None:
            return self.factor
        return self.ctx / self.train_ctx

    @property
    def needed(self) -> bool:
        return self.ctx > self.train_ctx

    @property
    def depends_on_length(self) -> bool:
        return self.method == "dynamic-ntk"

    def at_length(self, length: int) -> RopeScaling:
        return replace(self, length=length)


def scaled_rotary(
    start: int,
    T: int,
    head_size: int,
    device: torch.device | str | None,
    theta: float,
    linear_factor: float,
    scaling: RopeScaling | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """model.rotary's cos, sin (T, head/2) for positions start..start+T-1, with `scaling` applied.

    Under yarn they are scaled by its magnitude (see `scaled_angles`), so they are not unit length.
    """
    # in float64 on the CPU, as model.rotary (Apple's GPU has no float64), then float32 to the device
    positions = torch.arange(start, start + T, device="cpu", dtype=torch.float64) / linear_factor
    speeds = theta ** (-torch.arange(0, head_size, 2, device="cpu", dtype=torch.float64) / head_size)
    angles, magnitude = scaled_angles(positions, speeds, scaling, theta)  # (T, head/2), in float64
    return (magnitude * angles.cos()).float().to(device), (magnitude * angles.sin()).float().to(device)


def scaled_angles(
    positions: torch.Tensor, speeds: torch.Tensor, scaling: RopeScaling | None, theta: float
) -> tuple[torch.Tensor, float]:
    """positions (T,) x speeds (d/2,) -> angles (T, d/2) and the magnitude of cos and sin.

    The magnitude is 1 except for yarn, whose temperature scales queries and keys.
    """
    method = "none" if scaling is None else scaling.method
    d = 2 * speeds.shape[0]
    if method == "linear":
        positions = positions / scaling.s
    elif method == "linear-when-needed" and scaling.needed:
        positions = positions / scaling.s
    elif method == "pr-nonlinear" and scaling.needed:
        a = math.sqrt(scaling.train_ctx / scaling.ctx)
        b = a * scaling.ctx / (1 - a)
        positions = positions * a / (1 + positions / b)
    elif method == "ntk" and scaling.needed:
        speeds = _speeds(theta * scaling.s ** (d / (d - 2)), d, speeds)
    elif method == "dynamic-ntk":
        length = scaling.length if scaling.length is not None else scaling.ctx
        if length > scaling.train_ctx:
            f = scaling.factor if scaling.factor is not None else 1.0
            base = theta * ((f * length / scaling.train_ctx) - (f - 1)) ** (d / (d - 2))
            speeds = _speeds(base, d, speeds)
    elif method == "yarn" and scaling.needed:
        speeds = yarn_speeds(speeds, theta, scaling)
        return torch.outer(positions, speeds), yarn_magnitude(scaling.s)
    return torch.outer(positions, speeds), 1.0


def _speeds(base: float, d: int, like: torch.Tensor) -> torch.Tensor:
    """theta_i = base^(-2i/d) for i = 0..d/2-1."""
    return base ** (-torch.arange(0, d, 2, dtype=like.dtype, device=like.device) / d)


def yarn_speeds(speeds: torch.Tensor, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """YaRN's per-pair blend: pairs that turn often over train_ctx keep their speed, slow ones are
    divided by s, and a linear ramp between beta_fast and beta_slow turns mixes the two."""
    d = 2 * speeds.shape[0]

    def pair_for(turns: float) -> float:  # the pair that turns `turns` times over train_ctx
        return d * math.log(scaling.train_ctx / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(pair_for(scaling.beta_fast)), 0)
    high = min(math.ceil(pair_for(scaling.beta_slow)), d - 1)
    if low == high:
        high += 0.001  # a ramp of zero width would divide by zero
    ramp = ((torch.arange(d // 2, dtype=speeds.dtype, device=speeds.device) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1 for fast pairs (unscaled), 0 for slow ones (interpolated)
    return speeds / scaling.s * (1 - keep) + speeds * keep


def yarn_magnitude(s: float) -> float:
    """YaRN's temperature: queries and keys each scaled by 0.1 ln(s) + 1."""
    return 0.1 * math.log(s) + 1.0 if s > 1 else 1.0
