import math

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config, tiny_model

from mvgpt.model import GPT, KVCache, rotary, rotate


def one_at_a_time(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    cache = KVCache(model.config, idx.shape[0])
    return torch.cat([model(idx[:, i : i + 1], cache=cache)[0] for i in range(idx.shape[1])], dim=1)


@pytest.mark.parametrize("rope", [False, True])
def test_cached_decoding_equals_full_forward(rope):
    model = tiny_model(rope=rope)
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    full, _ = model(idx)
    torch.testing.assert_close(one_at_a_time(model, idx), full, atol=1e-5, rtol=0)
    cache = KVCache(model.config, 2)  # chunks of several tokens too: the mask over held tokens
    chunks = [model(idx[:, a:b], cache=cache)[0] for a, b in ((0, 5), (5, 6), (6, 16))]
    torch.testing.assert_close(torch.cat(chunks, 1), full, atol=1e-5, rtol=0)
    assert cache.position == cache.length == 16


def test_rope_has_no_table_of_positions_and_the_same_weight_names():
    learned, rope = tiny_model(), tiny_model(rope=True)
    cfg = learned.config
    assert learned.num_params() - rope.num_params() == cfg.block_size * cfg.n_embd
    assert set(learned.state_dict()) - set(rope.state_dict()) == {"wpe.weight"}
    assert set(rope.state_dict()) <= set(learned.state_dict())  # rotary tables are not weights
    assert {name for name, _ in rope.named_buffers()} == {"angles.cos", "angles.sin"}  # ...but follow .to()
    for name, value in rope.state_dict().items():  # same seed: the shared parts start the same
        assert value.equal(learned.state_dict()[name]), name


def test_rope_scores_depend_on_distance_only():
    g = torch.Generator().manual_seed(0)
    head = 64
    cos, sin = rotary(0, 5000, head)
    for _ in range(20):
        q, k = torch.randn(head, generator=g), torch.randn(head, generator=g)
        m, n, s = (int(v) for v in torch.randint(0, 2000, (3,), generator=g))
        rot = lambda x, p: rotate(x.view(1, 1, 1, head), cos[p : p + 1], sin[p : p + 1]).flatten()  # noqa: E731
        score = rot(q, m) @ rot(k, n)
        shifted = rot(q, m + s) @ rot(k, n + s)
        assert math.isclose(score.item(), shifted.item(), rel_tol=1e-4, abs_tol=1e-4)
        assert math.isclose(rot(q, m).norm().item(), q.norm().item(), rel_tol=1e-5)  # norms are kept
    cos, sin = rotary(0, 1, head)
    x = torch.randn(1, 1, 1, head, generator=g)
    assert rotate(x, cos, sin).equal(x)  # position 0 is not turned


def test_rotary_speeds_and_pairs():
    cos, sin = rotary(3, 2, 8, theta=100.0)
    speeds = 100.0 ** (-torch.arange(0, 8, 2) / 8)
    expected = torch.outer(torch.tensor([3.0, 4.0]), speeds)
    torch.testing.assert_close(cos, expected.cos())
    torch.testing.assert_close(sin, expected.sin())
    x = torch.zeros(1, 1, 1, 8)
    x[..., 1] = 1.0  # channel 1 pairs with channel 1 + 4
    y = rotate(x, cos[:1], sin[:1])
    assert torch.allclose(y[..., 1], cos[0, 1]) and torch.allclose(y[..., 5], sin[0, 1])
    assert y[..., [0, 2, 3, 4, 6, 7]].abs().max() == 0


def test_values_are_never_rotated():
    model = tiny_model(rope=True)
    idx = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(2))
    cache = KVCache(model.config, 1)
    model(idx, cache=cache)
    attn = model.blocks[0].attn
    x = model.blocks[0].ln_1(model.wte(idx))
    _, k, v = attn.qkv(x).split(model.config.n_embd, dim=2)
    v = v.view(1, 6, 2, 16).transpose(1, 2)
    k = k.view(1, 6, 2, 16).transpose(1, 2)
    torch.testing.assert_close(cache.v[0, :, :, :6], v)  # values as projected
    torch.testing.assert_close(cache.k[0, :, :, :6], rotate(k, *rotary(0, 6, 16)))  # keys rotated


def test_cache_position_keeps_counting_after_slide():
    cfg = tiny_config(rope=True)
    model = GPT(cfg).eval()
    cache = KVCache(cfg, 2)
    model(torch.zeros(2, 10, dtype=torch.long), cache=cache)
    cache.slide(4)
    assert (cache.length, cache.position) == (4, 10)
    model(torch.zeros(2, 1, dtype=torch.long), cache=cache)
    assert (cache.length, cache.position) == (5, 11)
    cache.slide(0)
    assert (cache.length, cache.position) == (0, 11)
    with pytest.raises(AssertionError, match="slide"):
        model(torch.zeros(2, cache.capacity + 1, dtype=torch.long), cache=cache)


def window_and_cache_losses(model: GPT, stream: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss of each token past the first window: by re-running the window, and by the sliding cache."""
    W = model.config.block_size
    window = []
    for t in range(W, stream.shape[1]):
        logits, _ = model(stream[:, t - W : t], last_only=True)
        window.append(F.cross_entropy(logits[:, -1], stream[:, t]))
    cache, cached = KVCache(model.config, 1), []
    for t in range(stream.shape[1] - 1):
        if cache.length == W:
            cache.slide(W - 1)
        logits, _ = model(stream[:, t : t + 1], cache=cache)
        if t + 1 >= W:
            cached.append(F.cross_entropy(logits[:, -1], stream[:, t + 1]))
    return torch.stack(window), torch.stack(cached)


def test_sliding_cache_equals_sliding_window_with_one_block():
    model = tiny_model(rope=True, n_layer=1)
    stream = torch.randint(0, 64, (1, 3 * 16), generator=torch.Generator().manual_seed(3))
    window, cached = window_and_cache_losses(model, stream)
    assert window.shape == cached.shape == (2 * 16,)
    torch.testing.assert_close(cached, window, atol=1e-4, rtol=0)


def test_sliding_cache_differs_a_little_with_several_blocks():
    """With several blocks, a cached key or value of an older token was computed while that token
    saw tokens that have since left the window, so the cache and the re-run window disagree."""
    model = tiny_model(rope=True, n_layer=3)
    stream = torch.randint(0, 64, (1, 3 * 16), generator=torch.Generator().manual_seed(3))
    window, cached = window_and_cache_losses(model, stream)
    gap = (cached - window).abs()
    print(f"\nthree blocks: sliding cache vs window, max |loss difference| {gap.max():.2e}, mean {gap.mean():.2e}")
    assert gap[0] < 1e-5  # the first token past the window: nothing has left yet
    assert gap.max() > 1e-5  # later ones: the cache remembers what the window forgot
    assert (cached.mean() - window.mean()).abs() < 0.1  # ...but only a little


def greedy(model: GPT, prompt: torch.Tensor, n: int, use_cache: bool) -> torch.Tensor:
    return torch.cat(list(model.generate(prompt, n, temperature=0, use_cache=use_cache)), dim=1)


@pytest.mark.parametrize("rope", [False, True])
def test_greedy_generation_with_cache_equals_without_inside_the_window(rope):
    model = tiny_model(seed=4, rope=rope)
    prompt = torch.randint(0, 64, (2, 3), generator=torch.Generator().manual_seed(5))
    assert greedy(model, prompt, 13, True).equal(greedy(model, prompt, 13, False))


def test_generation_past_the_window():
    prompt = torch.randint(0, 64, (2, 3), generator=torch.Generator().manual_seed(5))
    rope = tiny_model(seed=4, rope=True, n_layer=1)  # one block: the sliding cache is exact
    assert greedy(rope, prompt, 50, True).equal(greedy(rope, prompt, 50, False))
    learned = tiny_model(seed=4)  # both re-run the window past it
    assert greedy(learned, prompt, 50, True).equal(greedy(learned, prompt, 50, False))


def test_prompt_longer_than_the_window():
    for rope in (False, True):
        model = tiny_model(rope=rope)
        prompt = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(6))
        out = greedy(model, prompt, 5, True)
        assert out.shape == (1, 5)
        assert out.equal(greedy(model, prompt[:, -16:], 5, True))  # the prompt is cut to the window


def test_learned_positions_past_the_table_is_a_clear_error():
    model = tiny_model()
    with pytest.raises(AssertionError, match="past the learned table"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_sampling_is_seeded_and_top_k_one_is_greedy():
    model = tiny_model(rope=True)
    prompt = torch.zeros(1, 1, dtype=torch.long)
    run = lambda seed: torch.cat(list(model.generate(prompt, 20, temperature=1.0, top_k=10, seed=seed)), 1)  # noqa: E731
    assert run(1).equal(run(1)) and not run(1).equal(run(2))
    top1 = torch.cat(list(model.generate(prompt, 20, temperature=1.0, top_k=1, seed=3)), 1)
    assert top1.equal(greedy(model, prompt, 20, True))


def test_cache_compacts_its_storage_and_stays_exact():
    """Sliding many windows' worth moves the held rows to the front of the storage now and then."""
    model = tiny_model(rope=True, n_layer=1)
    cache = KVCache(model.config, 1, capacity=20)
    stream = torch.randint(0, 64, (1, 100), generator=torch.Generator().manual_seed(7))
    for t in range(100):
        if cache.length == 16:
            cache.slide(15)
        logits, _ = model(stream[:, t : t + 1], cache=cache)
    start = cache.position - 16
    reference, _ = model(stream[:, start:], last_only=True)  # one block: the window, re-run
    torch.testing.assert_close(logits, reference, atol=1e-5, rtol=0)
    assert cache.offset + cache.length <= cache.capacity


def test_the_angle_table_is_rotary_and_grows_with_the_story():
    model = tiny_model(rope=True)
    assert model.angles.cos.shape == (2 * 16, 8)  # made at set-up: two windows, head/2 pairs
    cos, sin = model.angles(5, 3)
    assert cos.equal(rotary(5, 3, 16)[0]) and sin.equal(rotary(5, 3, 16)[1])
    cos, _ = model.angles(100, 4)  # a sliding cache keeps counting: the table is made again, longer
    assert model.angles.cos.shape[0] == 2 * 104 and cos.equal(rotary(100, 4, 16)[0])
    fine_tuned = tiny_model(rope=True, rope_linear_factor=2.0)  # positions divided by the factor
    assert fine_tuned.angles(0, 8)[0][::2].equal(model.angles(0, 4)[0])


def test_slide_keeps_the_newest_rows_and_moves_nothing():
    model = tiny_model(rope=True)
    cache = KVCache(model.config, 1)
    model(torch.zeros(1, 10, dtype=torch.long), cache=cache)
    k = cache.k.clone()
    cache.slide(4)
    assert (cache.offset, cache.length) == (6, 4) and cache.k.equal(k)
    cache.slide(8)  # keeping more than is held drops nothing
    assert (cache.offset, cache.length, cache.position) == (6, 4, 10)
