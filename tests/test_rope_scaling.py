import math

import pytest
import torch
from conftest import tiny_model

from mvgpt.extension.long_context import set_context
from mvgpt.extension.rope_scaling import SCALING_METHODS, RopeScaling, scaled_rotary, yarn_magnitude
from mvgpt.model import rotary

WHEN_NEEDED = ["linear-when-needed", "pr-nonlinear", "ntk", "dynamic-ntk", "yarn"]


def scaled(start: int, T: int, d: int, scaling: RopeScaling, theta: float = 10000.0):
    """rotary's cos, sin with a scaling applied (no linear fine-tune)."""
    return scaled_rotary(start, T, d, None, theta, 1.0, scaling)


def tokens(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 64, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("method", WHEN_NEEDED)
def test_when_needed_methods_change_nothing_within_the_training_context(method):
    model = tiny_model(rope=True)
    idx = tokens(16)
    for ctx in (1, 8, 16):
        set_context(model, ctx, "none")
        plain, _ = model(idx[:, :ctx])
        set_context(model, ctx, method)
        assert model(idx[:, :ctx])[0].equal(plain), (method, ctx)


def test_linear_with_a_factor_turns_position_p_like_p_over_s():
    scaling = RopeScaling("linear", train_ctx=16, ctx=16, factor=4.0)  # a factor: scaled even within 16
    cos, sin = scaled(0, 64, 8, scaling)
    plain_cos, plain_sin = rotary(0, 16, 8)
    assert cos[::4].equal(plain_cos) and sin[::4].equal(plain_sin)  # position 4p turns like p
    model = tiny_model(rope=True)
    before, _ = model(tokens(16))
    set_context(model, 16, "linear", 2.0)
    assert not model(tokens(16))[0].equal(before)  # also within the training context


def test_linear_when_needed_scales_by_n_over_train_ctx():
    cos, _ = scaled(0, 64, 8, RopeScaling("linear-when-needed", train_ctx=16, ctx=64))
    assert cos[::4].equal(rotary(0, 16, 8)[0])


def test_pr_nonlinear_positions():
    train, n, d = 16, 64, 8
    cos, _ = scaled(0, n, d, RopeScaling("pr-nonlinear", train, n))
    a = math.sqrt(train / n)
    b = a * n / (1 - a)
    for p0 in (0, 1, 17, 63):
        p = p0 * a / (1 + p0 / b)
        expected = torch.tensor([math.cos(p * 10000 ** (-2 * i / d)) for i in range(d // 2)])
        torch.testing.assert_close(cos[p0], expected, atol=1e-6, rtol=0)


def angles_for(base: float, n: int, d: int) -> torch.Tensor:
    speeds = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    return torch.outer(torch.arange(n, dtype=torch.float64), speeds)


def test_ntk_and_dynamic_ntk_angles_equal_their_formulas():
    d, train, n = 16, 16, 48
    s = n / train
    base = 10000 * s ** (d / (d - 2))
    cos, sin = scaled(0, n, d, RopeScaling("ntk", train, n))
    angles = angles_for(base, n, d)
    torch.testing.assert_close(cos, angles.cos().float())
    torch.testing.assert_close(sin, angles.sin().float())
    for f, length in ((1.0, 40), (2.0, 40), (1.0, 12)):
        scaling = RopeScaling("dynamic-ntk", train, n, factor=f, length=length)
        cos, _ = scaled(0, n, d, scaling)
        dyn = 10000 * ((f * length / train) - (f - 1)) ** (d / (d - 2)) if length > train else 10000
        angles = angles_for(dyn, n, d)
        torch.testing.assert_close(cos, angles.cos().float())


def test_yarn_angles_equal_the_formula():
    d, train, n, theta = 64, 256, 1024, 10000.0
    s = n / train
    cos, sin = scaled(0, n, d, RopeScaling("yarn", train, n), theta)
    speeds = [theta ** (-2 * i / d) for i in range(d // 2)]
    turns = [train * w / (2 * math.pi) for w in speeds]  # rotations of each pair over train_ctx
    low = math.floor(d * math.log(train / (32 * 2 * math.pi)) / (2 * math.log(theta)))
    high = math.ceil(d * math.log(train / (1 * 2 * math.pi)) / (2 * math.log(theta)))
    m = 0.1 * math.log(s) + 1
    for i, w in enumerate(speeds):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        blended = w / s * ramp + w * (1 - ramp)
        if turns[i] > 32:
            assert blended == w  # fast pairs keep their speed
        if turns[i] < 1:
            assert blended == w / s  # slow pairs are interpolated in full
        for p in (1, 300, 1023):
            assert math.isclose(cos[p, i].item(), m * math.cos(p * blended), abs_tol=2e-6)
            assert math.isclose(sin[p, i].item(), m * math.sin(p * blended), abs_tol=2e-6)
    assert yarn_magnitude(1.0) == 1.0


def test_no_scaling_is_plain_rotary_and_methods_are_named_once():
    for start, T, d in ((0, 40, 8), (1000, 7, 64)):
        plain, none = rotary(start, T, d), scaled_rotary(start, T, d, None, 10000.0, 1.0, None)
        assert plain[0].equal(none[0]) and plain[1].equal(none[1])
    assert set(SCALING_METHODS) == {"none", "linear", *WHEN_NEEDED}
    with pytest.raises(ValueError, match="unknown rope scaling"):
        RopeScaling("quadratic", 16, 32)
    with pytest.raises(ValueError, match="below 1"):
        RopeScaling("linear", 16, 0)
