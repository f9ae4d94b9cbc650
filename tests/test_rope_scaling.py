import math

import pytest
import torch
from conftest import sharpen, tiny_model

from mvgpt.model import KVCache, rotary, rotate, rotation_between
from mvgpt.rope_scaling import METHODS, RopeScaling, yarn_magnitude

WHEN_NEEDED = ["linear-when-needed", "pr-nonlinear", "ntk", "dynamic-ntk", "yarn"]


def tokens(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 64, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("method", WHEN_NEEDED)
def test_when_needed_methods_change_nothing_within_the_training_context(method):
    model = tiny_model(rope=True)
    idx = tokens(16)
    for ctx in (1, 8, 16):
        model.set_context(ctx, "none")
        plain, _ = model(idx[:, :ctx])
        model.set_context(ctx, method)
        assert model(idx[:, :ctx])[0].equal(plain), (method, ctx)


def test_linear_with_a_factor_turns_position_p_like_p_over_s():
    scaling = RopeScaling("linear", train_ctx=16, ctx=16, factor=4.0)  # a factor: scaled even within 16
    cos, sin = rotary(0, 64, 8, scaling=scaling)
    plain_cos, plain_sin = rotary(0, 16, 8)
    assert cos[::4].equal(plain_cos) and sin[::4].equal(plain_sin)  # position 4p turns like p
    model = tiny_model(rope=True)
    before, _ = model(tokens(16))
    model.set_context(16, "linear", 2.0)
    assert not model(tokens(16))[0].equal(before)  # also within the training context


def test_linear_when_needed_scales_by_n_over_train_ctx():
    cos, _ = rotary(0, 64, 8, scaling=RopeScaling("linear-when-needed", train_ctx=16, ctx=64))
    assert cos[::4].equal(rotary(0, 16, 8)[0])


def test_pr_nonlinear_positions():
    train, n, d = 16, 64, 8
    cos, _ = rotary(0, n, d, scaling=RopeScaling("pr-nonlinear", train, n))
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
    cos, sin = rotary(0, n, d, scaling=RopeScaling("ntk", train, n))
    angles = angles_for(base, n, d)
    torch.testing.assert_close(cos, angles.cos().float())
    torch.testing.assert_close(sin, angles.sin().float())
    for f, length in ((1.0, 40), (2.0, 40), (1.0, 12)):
        scaling = RopeScaling("dynamic-ntk", train, n, factor=f, length=length)
        cos, _ = rotary(0, n, d, scaling=scaling)
        dyn = 10000 * ((f * length / train) - (f - 1)) ** (d / (d - 2)) if length > train else 10000
        angles = angles_for(dyn, n, d)
        torch.testing.assert_close(cos, angles.cos().float())


def test_yarn_angles_equal_the_formula():
    d, train, n, theta = 64, 256, 1024, 10000.0
    s = n / train
    cos, sin = rotary(0, n, d, theta=theta, scaling=RopeScaling("yarn", train, n))
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


def test_rerotating_a_cached_key_equals_computing_it_at_its_shifted_position():
    cos, sin = rotary(0, 600, 64)
    k = torch.randn(1, 2, 5, 64, generator=torch.Generator().manual_seed(0))
    p, d = 500, 137
    rotated = rotate(k, cos[p : p + 5], sin[p : p + 5])
    turn = rotation_between((cos[p : p + 5], sin[p : p + 5]), (cos[p - d : p - d + 5], sin[p - d : p - d + 5]))
    torch.testing.assert_close(rotate(rotated, *turn), rotate(k, cos[p - d : p - d + 5], sin[p - d : p - d + 5]),
                               atol=1e-5, rtol=0)


def test_shifted_sinks_cache_equals_a_forward_over_sinks_and_newest_with_one_block():
    model = tiny_model(rope=True, n_layer=1)
    stream = tokens(60, seed=3)
    W, k = 16, 4
    cache = KVCache(model.config, 1)
    for t in range(60):
        if cache.length == W:
            cache.slide(W - 1, sinks=k, angles=model.angles)
        logits, _ = model(stream[:, t : t + 1], cache=cache)
    held = torch.cat([stream[:, :k], stream[:, 60 - (W - k) :]], dim=1)  # the sinks, then the newest
    reference, _ = model(held, last_only=True)  # at contiguous positions 0..W-1
    torch.testing.assert_close(logits, reference, atol=1e-5, rtol=0)
    assert cache.rotary_position == W and cache.position == 60
    # unshifted, the sinks keep their positions and the newest keep theirs: a different answer
    cache = KVCache(model.config, 1)
    for t in range(60):
        if cache.length == W:
            cache.slide(W - 1, sinks=k)
        unshifted, _ = model(stream[:, t : t + 1], cache=cache)
    assert cache.rotary_position == 60
    assert not torch.allclose(unshifted, reference, atol=1e-4)


def test_dynamic_ntk_with_a_cache_equals_a_full_forward_with_one_block():
    """The property HF transformers' cache breaks: keys cached under an older base, queries under
    the new one. Here keys are stored unrotated and turned by the current angles at each step."""
    model = sharpen(tiny_model(rope=True, n_layer=1))
    model.set_context(48, "dynamic-ntk")
    stream = tokens(48, seed=4)
    cache = KVCache(model.config, 1, capacity=48)
    for t in range(48):
        logits, _ = model(stream[:, t : t + 1], cache=cache)
        full, _ = model(stream[:, : t + 1], last_only=True)  # the same length: the same base
        torch.testing.assert_close(logits, full, atol=1e-5, rtol=0)
    assert not cache.rotated
    plain = sharpen(tiny_model(rope=True, n_layer=1))
    assert (plain(stream)[0][:, -1:] - logits).abs().max() > 1e-4  # past 16 the base did change


def test_dynamic_ntk_with_several_blocks_differs_a_little():
    model = sharpen(tiny_model(rope=True, n_layer=3))
    model.set_context(48, "dynamic-ntk")
    stream = tokens(48, seed=5)
    cache = KVCache(model.config, 1, capacity=48)
    gaps = []
    for t in range(48):
        logits, _ = model(stream[:, t : t + 1], cache=cache)
        full, _ = model(stream[:, : t + 1], last_only=True)
        gaps.append((logits - full).abs().max().item())
    print(f"\nthree blocks, dynamic NTK: cached vs full logits, max gap {max(gaps):.2e} "
          "(older tokens' values were computed under an older base)")
    assert max(gaps[:16]) < 1e-5 < max(gaps[16:])


def test_bad_contexts_are_clear_errors():
    with pytest.raises(ValueError, match="below 1"):
        tiny_model(rope=True).set_context(0)
    with pytest.raises(ValueError, match="learned positions"):
        tiny_model().set_context(32)
    with pytest.raises(ValueError, match="learned positions"):
        tiny_model().set_context(16, "linear")
    with pytest.raises(ValueError, match="unknown rope scaling"):
        RopeScaling("quadratic", 16, 32)
    assert set(METHODS) == {"none", "linear", *WHEN_NEEDED}


def test_generate_reads_and_slides_a_longer_context():
    model = tiny_model(rope=True, n_layer=1)
    model.set_context(32, "linear-when-needed")
    prompt = tokens(3, seed=6)
    with_cache = torch.cat(list(model.generate(prompt, 70, temperature=0)), 1)
    without = torch.cat(list(model.generate(prompt, 70, temperature=0, use_cache=False)), 1)
    assert with_cache.equal(without)


def test_sinks_on_unrotated_keys_without_angles_is_refused_before_anything_moves():
    model = tiny_model(rope=True, n_layer=1)
    model.set_context(48, "dynamic-ntk")
    cache = KVCache(model.config, 1, capacity=48)
    model(tokens(20), cache=cache)
    k_before = cache.k.clone()
    with pytest.raises(ValueError, match="contiguous positions"):
        cache.slide(10, sinks=2)
    assert cache.k.equal(k_before) and (cache.start, cache.length) == (0, 20)
