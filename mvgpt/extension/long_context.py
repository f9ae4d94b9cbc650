"""Reading past the training context: the lab beside the episode's model.

model.py reads its angles through one hook, `GPT.angles` (a `RotaryTable`), and generate makes its
cache through another, `GPT.new_cache`. Everything here enters through those two:
- `set_context(model, ctx, method)`: the window to read and a scaled table of angles
  (rope_scaling.py's methods), folded in once, so the forward never knows which method is used.
- `SinkCache`: a sliding cache that keeps the story's first tokens (attention sinks, as in
  StreamingLLM), at their positions or shifted (llama.cpp's context shift: the kept keys are
  turned back, and `position` goes back with them, so no distance exceeds what the cache holds).
- `DynamicNTKCache`: dynamic NTK's angles change as the story grows, so a key turned yesterday is
  wrong today; this cache turns every held key on to today's angles before each forward.
A SinkCache given the model's angles does the same under dynamic NTK (`turn_on`), shifted or not,
so sinks and dynamic NTK together are exact too (in one block, as DynamicNTKCache is).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from mvgpt.extension.rope_scaling import RopeScaling, scaled_rotary
from mvgpt.model import GPT, Angles, GPTConfig, KVCache, RotaryTable, rotate

AngleFn = Callable[[int, int], Angles]  # (start, T) -> cos, sin (T, head/2), as GPT.angles


def rotation_between(old: Angles, new: Angles) -> Angles:
    """cos, sin of the turn that takes keys rotated by `old` angles to `new` ones: new - old.

    cos(b - a) = cos b cos a + sin b sin a, sin(b - a) = sin b cos a - cos b sin a, divided by
    the tables' squared magnitude (1, except under YaRN's temperature).
    """
    (cos_a, sin_a), (cos_b, sin_b) = old, new
    norm = cos_a * cos_a + sin_a * sin_a
    return (cos_b * cos_a + sin_b * sin_a) / norm, (sin_b * cos_a - cos_b * sin_a) / norm


# ----------------------------------------------------------------------------------------------
# Scaled tables of angles


class ScaledTable(RotaryTable):
    """The model's table of angles with a rope_scaling method folded in."""

    def __init__(self, config: GPTConfig, scaling: RopeScaling) -> None:
        self.scaling = scaling
        super().__init__(config)

    def table(self, size: int, device: torch.device | str | None) -> Angles:
        c = self.config
        return scaled_rotary(0, size, c.head_size, device, c.rope_theta, c.rope_linear_factor, self.scaling)


class DynamicNTKTable(ScaledTable):
    """Dynamic NTK: the base depends on the length read so far, start + T, so no table is kept:
    each call computes the angles of its span at that length."""

    depends_on_length = True  # a cache holding keys must turn them on as the story grows (turn_on)

    def forward(self, start: int, T: int) -> Angles:
        return self.at(start, T, start + T)

    def at(self, start: int, T: int, length: int) -> Angles:
        """The angles of positions start..start+T-1 under the base of a story `length` tokens long."""
        c, scaling = self.config, self.scaling.at_length(length)
        return scaled_rotary(start, T, c.head_size, self.cos.device, c.rope_theta, c.rope_linear_factor, scaling)


def turn_on(cache: KVCache, table: DynamicNTKTable, spans: list[tuple[int, int, int]], T: int) -> None:
    """Before a forward of T tokens: turn the held keys, given as spans (first position, count,
    first row held), from the angles at the length read so far (cache.position) on to those at
    position + T, the ones the new queries and keys get, so every score is taken under one base."""
    length = cache.position
    for start, count, row in spans:
        if count > 0:  # every block's keys at once: (n_layer, B, H, count, head)
            turn = rotation_between(table.at(start, count, length), table.at(start, count, length + T))
            rows = slice(cache.offset + row, cache.offset + row + count)
            cache.k[:, :, :, rows] = rotate(cache.k[:, :, :, rows], *turn)


def set_context(model: GPT, ctx: int | None = None, method: str = "none", factor: float | None = None) -> None:
    """Read `ctx` tokens at once (default: the training context, block_size), with rotary
    positions scaled by `method` (see rope_scaling.py) to fit it. Learned positions cannot read
    past their table. `model.rope_scaling` records the method (export.py reads it)."""
    cfg = model.config
    ctx = cfg.block_size if ctx is None else ctx
    if ctx < 1:
        raise ValueError(f"a context of {ctx} tokens is below 1: ask for at least one token")
    if not cfg.rope and (ctx > cfg.block_size or method != "none"):
        raise ValueError(
            f"this model has learned positions, whose table stops at {cfg.block_size}: it cannot read "
            f"{ctx} tokens or scale its positions (use a rope model, or --ctx {cfg.block_size} or less)"
        )
    model.context = ctx
    model.rope_scaling = None if method == "none" else RopeScaling(method, cfg.block_size, ctx, factor)
    model.new_cache = KVCache
    if not cfg.rope:
        return
    device = model.wte.weight.device
    if model.rope_scaling is None:
        model.angles = RotaryTable(cfg).to(device)
    elif model.rope_scaling.depends_on_length:
        model.angles = DynamicNTKTable(cfg, model.rope_scaling).to(device)
        model.new_cache = partial(DynamicNTKCache, angles=model.angles)
    else:
        model.angles = ScaledTable(cfg, model.rope_scaling).to(device)


# ----------------------------------------------------------------------------------------------
# Caches


class SinkCache(KVCache):
    """A sliding cache that keeps its first `sinks` tokens as it slides (attention sinks).

    angles: the model's `GPT.angles`. Without it the sinks and the newest tokens keep their
    positions, so distances grow past anything seen in training. With it (and shift, its default),
    the keys that move are re-rotated to contiguous positions after the sinks (R(a)R(b) = R(a+b), as
    llama.cpp's context shift does), and `position`, the next token's rotary position, goes back by
    as many. Angles that change with the length (dynamic NTK) need them given, shifted or not: the
    held keys are then turned on before each forward, as DynamicNTKCache does.
    """

    def __init__(self, config: GPTConfig, batch_size: int = 1, capacity: int | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32, *,
                 sinks: int, angles: AngleFn | None = None, shift: bool | None = None) -> None:
        super().__init__(config, batch_size, capacity, device, dtype)
        self.sinks, self.angles = sinks, angles
        self.shifting = angles is not None if shift is None else shift
        if self.shifting and angles is None:
            raise ValueError("a SinkCache that shifts needs the model's angles: SinkCache(..., angles=model.angles)")
        self.shift = 0  # how far positions went back (shifting)
        self.start: int | None = None  # the first sink's position

    def reserve(self, T: int) -> None:
        super().reserve(T)
        if self.start is None:
            self.start = self.position
        if self.length and getattr(self.angles, "depends_on_length", False):  # dynamic NTK: the held keys move on
            s = min(self.sinks, self.length)  # the sinks, then the newest tokens, each at contiguous positions
            turn_on(self, self.angles, [(self.start, s, 0), (self.position - (self.length - s), self.length - s, s)], T)

    def slide(self, keep: int) -> None:
        sinks = self.sinks
        assert 0 <= sinks <= keep, f"slide needs 0 <= sinks <= keep, got keep={keep}, sinks={sinks}"
        drop = self.length - keep
        if drop <= 0:
            return
        if sinks == 0:  # nothing to keep at the front: move the offset on, nothing is copied
            self.offset += drop
        else:  # the newest tokens move down to follow the sinks
            src = slice(self.offset + sinks + drop, self.offset + self.length)
            dst = slice(self.offset + sinks, self.offset + keep)
            self.k[:, :, :, dst] = self.k[:, :, :, src].clone()
            self.v[:, :, :, dst] = self.v[:, :, :, src].clone()
        if self.shifting:  # turn the moved keys back by `drop` positions
            moved = keep - sinks
            old_start = self.position - moved
            turn = rotation_between(self.angles(old_start, moved), self.angles(old_start - drop, moved))
            rows = slice(self.offset + sinks, self.offset + keep)
            self.k[:, :, :, rows] = rotate(self.k[:, :, :, rows], *turn)
            if getattr(self.angles, "depends_on_length", False) and sinks:  # the story is shorter now: so is
                turn = rotation_between(self.angles.at(self.start, sinks, self.position),  # the sinks' base
                                        self.angles.at(self.start, sinks, self.position - drop))
                rows = slice(self.offset, self.offset + sinks)
                self.k[:, :, :, rows] = rotate(self.k[:, :, :, rows], *turn)
            self.position -= drop
            self.shift += drop
        self.length = keep


class DynamicNTKCache(KVCache):
    """A cache for dynamic NTK, whose angles at a length L are not those at L - 1.

    Before each forward of T tokens, the held keys (turned by the angles at the length read so
    far, `position`) are turned on to the angles at position + T, the ones the new queries and
    keys get, so every score is taken under one base (the property HF transformers' cache breaks).
    angles: the model's `GPT.angles` (a `DynamicNTKTable`).
    """

    def __init__(self, config: GPTConfig, batch_size: int = 1, capacity: int | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32, *,
                 angles: AngleFn) -> None:
        super().__init__(config, batch_size, capacity, device, dtype)
        self.angles = angles

    def reserve(self, T: int) -> None:
        super().reserve(T)
        turn_on(self, self.angles, [(self.position - self.length, self.length, 0)], T)
