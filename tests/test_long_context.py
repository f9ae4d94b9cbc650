import pytest
import torch
from conftest import sharpen, tiny_model

from mvgpt.extension.long_context import DynamicNTKCache, SinkCache, rotation_between, set_context
from mvgpt.extension.rope_scaling import RopeScaling, scaled_rotary
from mvgpt.model import KVCache, rotary, rotate


def tokens(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 64, (1, n), generator=torch.Generator().manual_seed(seed))


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
    cache = SinkCache(model.config, 1, sinks=k, angles=model.angles)
    for t in range(60):
        if cache.length == W:
            cache.slide(W - 1)
        logits, _ = model(stream[:, t : t + 1], cache=cache)
    held = torch.cat([stream[:, :k], stream[:, 60 - (W - k) :]], dim=1)  # the sinks, then the newest
    reference, _ = model(held, last_only=True)  # at contiguous positions 0..W-1
    torch.testing.assert_close(logits, reference, atol=1e-5, rtol=0)
    assert cache.position == W and cache.shift == 60 - W  # positions went back with the shifted keys
    # unshifted, the sinks keep their positions and the newest keep theirs: a different answer
    cache = SinkCache(model.config, 1, sinks=k)
    for t in range(60):
        if cache.length == W:
            cache.slide(W - 1)
        unshifted, _ = model(stream[:, t : t + 1], cache=cache)
    assert cache.position == 60 and cache.shift == 0
    assert not torch.allclose(unshifted, reference, atol=1e-4)


def test_dynamic_ntk_with_a_cache_equals_a_full_forward_with_one_block():
    """The property HF transformers' cache breaks: keys cached under an older base, queries under
    the new one. Here the held keys are turned on to the current angles at each step."""
    model = sharpen(tiny_model(rope=True, n_layer=1))
    set_context(model, 48, "dynamic-ntk")
    stream = tokens(48, seed=4)
    cache = model.new_cache(model.config, 1, capacity=48)
    for t in range(48):
        logits, _ = model(stream[:, t : t + 1], cache=cache)
        full, _ = model(stream[:, : t + 1], last_only=True)  # the same length: the same base
        torch.testing.assert_close(logits, full, atol=1e-5, rtol=0)
    assert isinstance(cache, DynamicNTKCache)
    plain = sharpen(tiny_model(rope=True, n_layer=1))
    assert (plain(stream)[0][:, -1:] - logits).abs().max() > 1e-4  # past 16 the base did change


def test_dynamic_ntk_with_several_blocks_differs_a_little():
    model = sharpen(tiny_model(rope=True, n_layer=3))
    set_context(model, 48, "dynamic-ntk")
    stream = tokens(48, seed=5)
    cache = model.new_cache(model.config, 1, capacity=48)
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
        set_context(tiny_model(rope=True), 0)
    with pytest.raises(ValueError, match="learned positions"):
        set_context(tiny_model(), 32)
    with pytest.raises(ValueError, match="learned positions"):
        set_context(tiny_model(), 16, "linear")
    with pytest.raises(ValueError, match="unknown rope scaling"):
        set_context(tiny_model(rope=True), 32, "quadratic")


def test_generate_reads_and_slides_a_longer_context():
    model = tiny_model(rope=True, n_layer=1)
    set_context(model, 32, "linear-when-needed")
    prompt = tokens(3, seed=6)
    with_cache = torch.cat(list(model.generate(prompt, 70, temperature=0)), 1)
    without = torch.cat(list(model.generate(prompt, 70, temperature=0, use_cache=False)), 1)
    assert with_cache.equal(without)


def test_sinks_beyond_keep_are_refused_before_anything_moves():
    model = tiny_model(rope=True, n_layer=1)
    cache = SinkCache(model.config, 1, sinks=12, angles=model.angles)
    model(tokens(16), cache=cache)
    k_before = cache.k.clone()
    with pytest.raises(AssertionError, match="sinks <= keep"):
        cache.slide(10)
    assert cache.k.equal(k_before) and (cache.offset, cache.length, cache.position) == (0, 16, 16)


def test_set_context_folds_the_scaling_into_the_table_and_back():
    model = tiny_model(rope=True)
    plain = model.angles(0, 40)
    set_context(model, 64, "yarn")
    assert model.context == 64 and model.rope_scaling == RopeScaling("yarn", 16, 64)
    assert model.angles(0, 40)[0].equal(scaled_rotary(0, 40, 16, None, 10000.0, 1.0, model.rope_scaling)[0])
    assert model.new_cache is KVCache  # angles that do not change with the length: the plain cache
    set_context(model)
    assert model.context == 16 and model.rope_scaling is None and model.angles(0, 40)[0].equal(plain[0])


def test_dynamic_ntk_generation_with_a_cache_equals_without():
    """generate makes its cache through model.new_cache: under dynamic NTK the re-rotating one,
    so with one block cached decoding equals re-reading everything (here within 2x the window)."""
    model = sharpen(tiny_model(rope=True, n_layer=1))
    set_context(model, 48, "dynamic-ntk")
    prompt = tokens(3, seed=7)
    with_cache = torch.cat(list(model.generate(prompt, 40, temperature=0)), 1)
    without = torch.cat(list(model.generate(prompt, 40, temperature=0, use_cache=False)), 1)
    assert with_cache.equal(without)


@pytest.mark.parametrize("shift", [True, False], ids=["shifted", "unshifted"])
def test_sinks_under_dynamic_ntk_equal_a_forward_over_what_the_cache_holds_with_one_block(shift):
    """A SinkCache given the model's angles follows dynamic NTK's base as the story grows: its held
    keys (sinks and newest) are turned on at each step, so the logits are those of a full forward
    over what it holds, at their positions, under the base of the length read (one block: exact)."""
    model = sharpen(tiny_model(rope=True, n_layer=1))
    set_context(model, 64, "dynamic-ntk")  # a window of 32 past the training context of 16: the base moves
    stream = tokens(80, seed=6)
    W, k = 32, 4
    cache = SinkCache(model.config, 1, capacity=2 * W, sinks=k, angles=model.angles, shift=shift)
    for t in range(80):
        if cache.length == W:
            cache.slide(W - 1)
        logits, _ = model(stream[:, t : t + 1], cache=cache)
    newest = stream[:, 80 - (W - k):]
    if shift:  # sinks and newest at contiguous positions 0..W-1: a plain forward over them
        reference, _ = model(torch.cat([stream[:, :k], newest], dim=1), last_only=True)
    else:  # sinks at 0..k-1, the newest at their own positions, all under the base of length 80
        angles = model.angles.at(0, 80, 80)
        keep = torch.cat([torch.arange(k), torch.arange(80 - (W - k), 80)])
        reference = reference_at_positions(model, torch.cat([stream[:, :k], newest], dim=1),
                                           (angles[0][keep], angles[1][keep]))
    torch.testing.assert_close(logits, reference, atol=1e-5, rtol=0)
    stale = SinkCache(model.config, 1, capacity=2 * W, sinks=k)  # without the angles: keys left under old bases
    for t in range(80):
        if stale.length == W:
            stale.slide(W - 1)
        unturned, _ = model(stream[:, t : t + 1], cache=stale)
    if not shift:
        assert (unturned - reference).abs().max() > 1e-3


def reference_at_positions(model, idx, angles):
    """The last token's logits of a forward over idx whose tokens sit at the given angles' positions."""
    class Fixed(torch.nn.Module):
        def forward(self, start, T):
            return angles[0][start : start + T], angles[1][start : start + T]

    real = model.angles
    model.angles = Fixed()
    try:
        logits, _ = model(idx, last_only=True)
    finally:
        model.angles = real
    return logits
