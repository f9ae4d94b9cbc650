"""mvgpt/live/views.py: the page's events come from generate and KVCache as they are, and the read and
angles views from context.py's and rope_scaling's own functions."""

from __future__ import annotations

import statistics

import context
import pytest
import torch
from conftest import sharpen, tiny_model

from mvgpt.data import load_tokens
from mvgpt.extension.rope_scaling import RopeScaling, scaled_rotary
from mvgpt.live import views as live
from mvgpt.live.views import Limits, LiveError
from mvgpt.model import KVCache
from mvgpt.tokenizer import Tokenizer

W = 16  # conftest's tiny window


@pytest.fixture(scope="module")
def tokenizer(data_dir) -> Tokenizer:
    return Tokenizer.load(data_dir / "tokenizer.json")


def model(rope: bool, seed: int = 0):
    return sharpen(tiny_model(seed, vocab_size=300, rope=rope))


def generate_watched_by_hand(m, prompt: list[int], n: int, **kw) -> tuple[list[int], list[tuple], list]:
    """generate's tokens; its cache's (offset, length, position) right after each; and the tokens of
    each forward pass run without the cache since the previous token (the test's own hooks)."""
    caches, plain = [], []
    m.new_cache = lambda *a, **k: caches.append(KVCache(*a, **k)) or caches[-1]
    hook = m.register_forward_pre_hook(
        lambda mod, args, kwargs: plain.append(args[0].clone()) if kwargs.get("cache") is None else None,
        with_kwargs=True)
    tokens, fields, reruns = [], [], []
    try:
        for t in m.generate(torch.tensor([prompt]), n, **kw):
            tokens.append(t.item())
            c = caches[0]
            fields.append((c.offset, c.length, c.position))
            reruns.append(plain[0] if plain else None)
            plain.clear()
    finally:
        hook.remove()
        m.new_cache = KVCache
    return tokens, fields, reruns


@pytest.mark.parametrize("rope", [True, False], ids=["rope", "learned"])
@pytest.mark.parametrize("prompt_len", [3, 20], ids=["short-prompt", "prompt-past-the-window"])
def test_the_events_are_generates_tokens_and_its_caches_fields_after_each(rope, prompt_len, tokenizer):
    m = model(rope)
    prompt = torch.randint(0, 300, (prompt_len,), generator=torch.Generator().manual_seed(1)).tolist()
    n = 40  # well past the window of 16, and past the cache's 32 rows (it compacts)
    tokens, fields, reruns = generate_watched_by_hand(m, prompt, n, temperature=1.0, top_k=20, seed=7)
    events = list(live.write_story(m, "m", prompt, n, 1.0, 20, 7, tokenizer))
    assert m.new_cache is KVCache  # the hook is the model's own again
    assert [e.token for e in events] == tokens
    assert [(e.offset, e.length, e.position) for e in events] == fields
    assert "".join(e.text for e in events) == tokenizer.decode(tokens)
    cut = max(0, prompt_len - W)
    for i, e in enumerate(events):
        assert e.index == i and e.capacity == 2 * W and e.ms > 0
        assert e.held == (e.position - e.length + cut, e.position + cut)
        if reruns[i] is None:
            assert e.rerun is None
        else:  # generate ran a window without the cache: the event names exactly those story tokens
            story = prompt + tokens
            assert e.rerun is not None and story[e.rerun[0] : e.rerun[1]] == reruns[i][0].tolist()
    if rope:  # the cache slides: one token dropped per token once full, never a re-run
        assert all(e.rerun is None for e in events)
        slid = [e for e in events if e.dropped]
        assert len(slid) == n - 1 - (W - min(prompt_len, W)) and all(e.dropped[1] - e.dropped[0] == 1 for e in slid)
        assert [e.held[1] for e in events] == [prompt_len + i for i in range(n)]
    else:  # learned positions: the cache stops at the window, and the window re-runs for every token after
        assert all(e.dropped is None for e in events)
        first = W - min(prompt_len, W) + 1
        assert [i for i, r in enumerate(reruns) if r is not None] == list(range(first, n))
        assert all(e.rerun == (prompt_len + e.index - W, prompt_len + e.index) for e in events[first:])


def test_interleave_takes_turns_and_closing_it_stops_every_generate(tokenizer):
    rope, learned = model(True), model(False, seed=1)
    streams = [live.write_story(rope, "rope", [5, 6], 4, 0.0, None, 0, tokenizer),
               live.write_story(learned, "learned", [5, 6], 6, 0.0, None, 0, tokenizer)]
    events = list(live.interleave(streams))
    assert [e.model for e in events] == ["rope", "learned"] * 4 + ["learned"] * 2
    expected = [t.item() for t in rope.generate(torch.tensor([[5, 6]]), 4, temperature=0.0)]
    assert [e.token for e in events if e.model == "rope"] == expected

    stream = live.interleave([live.write_story(rope, "rope", [5], 30, 1.0, 5, 0, tokenizer),
                              live.write_story(learned, "learned", [5], 30, 1.0, 5, 0, tokenizer)])
    next(stream), next(stream), next(stream)
    assert rope.new_cache is not KVCache and learned.new_cache is not KVCache  # both generating
    stream.close()  # what the server does when the page leaves
    assert rope.new_cache is KVCache and learned.new_cache is KVCache


def test_summary_is_the_first_tokens_time_and_the_median_of_the_rest():
    assert live.summary([40.0, 5.0, 7.0, 6.0, 100.0]) == {"tokens": 5, "first_ms": 40.0,
                                                          "median_ms": statistics.median([5.0, 7.0, 6.0, 100.0])}
    assert live.summary([3.0]) == {"tokens": 1, "first_ms": 3.0, "median_ms": None}


def test_token_texts_join_to_the_decoded_text(tokenizer):
    ids = tokenizer.encode("Zoë saw a kite 🪁 and a café.")
    texts = live.token_texts(tokenizer, ids)
    assert len(texts) == len(ids) and "".join(texts) == tokenizer.decode(ids)


# ----------------------------------------------------------------------------------------------
# Read past the window


@pytest.mark.parametrize("rope", [True, False], ids=["rope", "learned"])
def test_the_read_view_scores_with_context_pys_functions(rope, data_dir):
    m = model(rope)
    piece = torch.from_numpy(load_tokens(data_dir, "val")[3 * W : 6 * W].astype("int64"))[None]
    results = list(live.score_piece(m, piece, context.LOSS_METHODS))
    expected = {"sliding window": context.window_losses(m, piece)}
    if rope:
        expected |= {"sliding cache": context.cache_losses(m, piece), "full context": context.full_losses(m, piece)}
    assert [r["method"] for r in results] == list(expected)
    for r in results:
        want = expected[r["method"]]
        assert r["losses"] == want.tolist() and len(r["losses"]) == 2 * W
        assert r["mean"] == want.mean().item() and r["ms_per_token"] > 0
    methods, notes = live.methods_for(m, context.LOSS_METHODS)
    assert methods == list(expected) and bool(notes) == (not rope)


# ----------------------------------------------------------------------------------------------
# Rotary angles


@pytest.mark.parametrize("ctx", [16, 64, 200])
def test_the_angles_view_is_scaled_rotarys_angles(ctx):
    config = tiny_model(rope=True).config
    pair = 5
    view = live.angles_view(config, ctx, pair)
    assert list(view["methods"]) == ["none", "linear", "ntk", "yarn"] and view["pairs"] == config.head_size // 2
    for method, got in view["methods"].items():
        scaling = None if method == "none" else RopeScaling(method, config.block_size, ctx)
        cos, sin = scaled_rotary(0, ctx, config.head_size, None, config.rope_theta, 1.0, scaling)
        angles = torch.tensor(got["angles"], dtype=torch.float64)
        assert angles.shape == (ctx,)
        torch.testing.assert_close((got["magnitude"] * angles.cos()).float(), cos[:, pair], atol=2e-6, rtol=0)
        torch.testing.assert_close((got["magnitude"] * angles.sin()).float(), sin[:, pair], atol=2e-6, rtol=0)
        torch.testing.assert_close(angles, torch.arange(ctx, dtype=torch.float64) * got["speeds"][pair],
                                   atol=1e-12, rtol=1e-12)
    none = torch.tensor(view["methods"]["none"]["speeds"])
    torch.testing.assert_close(none, 10000.0 ** (-torch.arange(0, config.head_size, 2) / config.head_size))
    s = ctx / config.block_size
    torch.testing.assert_close(torch.tensor(view["methods"]["linear"]["speeds"]), none / s)
    ntk = view["methods"]["ntk"]["speeds"]
    if s > 1:  # NTK keeps pair 0 and slows the last pair by s; YaRN keeps the fast pairs, the slow ones by s
        assert ntk[0] == pytest.approx(none[0].item()) and ntk[-1] == pytest.approx(none[-1].item() / s)
        yarn = view["methods"]["yarn"]
        assert yarn["speeds"][0] == pytest.approx(none[0].item()) and yarn["magnitude"] > 1
    else:
        assert ntk == pytest.approx(none.tolist())


# ----------------------------------------------------------------------------------------------
# Requests


def parse(**query):
    return live.parse_write({k: [str(v)] for k, v in query.items()}, ["pretrain-rope", "pretrain"], 8192,
                            Limits(prompt_chars=50, tokens=100))


def test_a_write_request_takes_its_values_and_defaults():
    req = parse(models="pretrain-rope,pretrain,pretrain-rope", prompt="Hi", temperature="0", top_k="8", tokens="100",
                seed="3")
    assert req == live.WriteRequest("Hi", ("pretrain-rope", "pretrain"), 0.0, 8, 100, 3)
    assert parse(models="pretrain") == live.WriteRequest("Once upon a time", ("pretrain",), 0.8, 50, 100, 1337)


@pytest.mark.parametrize("query, message", [
    (dict(models="pretrain", prompt="x" * 51), "prompt: 51 characters is over the limit of 50"),
    (dict(models="gpt-4"), "unknown model 'gpt-4': this server has pretrain-rope, pretrain"),
    (dict(models=""), "no model asked for"),
    (dict(models="pretrain", temperature="hot"), "temperature: 'hot' is not a number: give a number from 0 to 5"),
    (dict(models="pretrain", temperature="nan"), "temperature: nan is not a finite number"),
    (dict(models="pretrain", temperature="-1"), "temperature: -1 is out of range"),
    (dict(models="pretrain", temperature="9"), "temperature: 9 is out of range: give a number from 0 to 5"),
    (dict(models="pretrain", top_k="0"), "top_k: 0 is out of range: give a whole number from 1 to 8,192"),
    (dict(models="pretrain", tokens="101"), "tokens: 101 is out of range: give a whole number from 1 to 100"),
    (dict(models="pretrain", tokens="1e9"), "tokens: '1e9' is not a number"),
    (dict(models="pretrain", seed="-2"), "seed: -2 is out of range"),
])
def test_a_bad_write_request_is_one_line_naming_the_fix(query, message):
    with pytest.raises(LiveError, match="^" + message.replace("(", r"\(")) as e:
        parse(**query)
    assert "\n" not in str(e.value)


def test_an_event_is_one_line_of_json():
    assert live.sse("token", {"text": "a\nb"}) == b'event: token\ndata: {"text":"a\\nb"}\n\n'
