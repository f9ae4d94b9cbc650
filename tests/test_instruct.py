import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from mvgpt.data import prepare
from mvgpt.instruct import (
    IGNORE,
    example_rows,
    has_dialogue,
    held_out_examples,
    instruct_batch,
    load_instruct,
    make_examples,
    make_prompt,
    pick_words,
    prepare_instruct,
    story_loss,
    story_words,
    words_used,
)
from mvgpt.tokenizer import Tokenizer

SYLLABLES = ["ba", "ko", "mi", "tu", "le", "ran", "so", "vi", "dep", "ul", "gor", "na"]


def made_up_words(n: int, rng: random.Random) -> list[str]:
    words = set()
    while len(words) < n:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))))
    return sorted(words)


def make_story(rng: random.Random, vocab: list[str]) -> str:
    """Common words in every story, a few rarer ones, quoted speech in about half of them."""
    name = rng.choice(["Lily", "Tom", "Mia"])
    rare = rng.sample(vocab, rng.randint(4, 8))
    text = f"{name} and the {rare[0]} went to the {rare[1]}. It was a {' '.join(rare[2:])} day."
    if rng.random() < 0.5:
        text += f' "Look at the {rare[0]}!" said {name}.'
    return text


def write_corpus(folder: Path, seed: int = 0) -> Path:
    rng = random.Random(seed)
    vocab = made_up_words(400, rng)
    for name, n in (("train.txt", 300), ("valid.txt", 40)):
        stories = [make_story(rng, vocab) for _ in range(n)]
        (folder / name).write_text("".join(s + "\n<|endoftext|>\n" for s in stories), encoding="utf-8")
    return folder


@pytest.fixture(scope="session")
def instruct_data(tmp_path_factory) -> Path:
    """Prepared data (tokens and tokenizer) from stories whose words make prompts."""
    corpus = write_corpus(tmp_path_factory.mktemp("instruct-corpus"))
    out = tmp_path_factory.mktemp("instruct-data")
    prepare(corpus, out, vocab_size=300)
    return out


def test_prompt_format_and_dialogue_and_words():
    assert make_prompt(["kite", "windy", "string"], True) == "Words: kite, windy, string\nFeatures: Dialogue\nStory:\n"
    assert make_prompt(["kite", "windy", "string"], False) == "Words: kite, windy, string\nStory:\n"
    assert has_dialogue('Tom said, "Hi!"') and has_dialogue("She said “yes” to it.")
    assert not has_dialogue("No quotes here.") and not has_dialogue('A lone " mark.\nAnd " another.')
    assert words_used("The Kite flew. Kites fly.", ["kite", "fly", "string"]) == [True, True, False]
    assert story_words("Once, a big dog and a big Cat ran. I ran.") == ["big", "dog", "and", "ran"]


def test_the_word_rule_is_seeded_and_leaves_out_common_and_rare_words():
    story = "the cat sat on the mat with a hat and a bat near a rat and a vat"
    counts = Counter({"the": 90, "cat": 5, "sat": 5, "mat": 2, "with": 50, "hat": 3, "and": 99, "bat": 1,
                      "near": 4, "rat": 6, "vat": 0})
    allowed = {"cat", "sat", "mat", "hat", "near", "rat"}  # 2 <= count <= 5% of 100 stories... and "rat" at 6 is out
    picks = {tuple(pick_words(story, counts, 120, seed=1, split=0, index=i)) for i in range(30)}
    assert len(picks) > 5  # the index changes the draw
    assert all(len(set(p)) == 3 and set(p) <= allowed for p in picks)
    assert pick_words(story, counts, 120, 1, 0, 7) == pick_words(story, counts, 120, 1, 0, 7)
    assert pick_words(story, counts, 120, 1, 0, 7) != pick_words(story, counts, 120, 2, 0, 7)
    assert pick_words("the cat and the rat", counts, 120, 1, 0, 0) is None  # fewer than three to ask for
    examples = make_examples([story, "the cat and the rat", story], counts, 120, "train", seed=1)
    assert [e.story for e in examples] == [story, story] and examples[0].dialogue is False


def test_cache_is_deterministic_and_masks_exactly_the_prompt(instruct_data, tmp_path):
    meta = prepare_instruct(instruct_data)
    again = prepare_instruct(instruct_data)  # from the cache
    assert again == meta and json.loads((instruct_data / "instruct.json").read_text()) == meta
    files = ["instruct-train.bin", "instruct-train-mask.bin", "instruct-val.bin", "instruct-val-mask.bin"]
    first = {f: (instruct_data / f).read_bytes() for f in files}
    prepare_instruct(instruct_data, force=True)
    assert {f: (instruct_data / f).read_bytes() for f in files} == first
    assert meta["train"]["examples"] > 250 and meta["val"]["examples"] > 30
    assert 0.3 < meta["train"]["dialogue"] / meta["train"]["examples"] < 0.7

    tokenizer = Tokenizer.load(instruct_data / "tokenizer.json")
    tokens, mask, starts = load_instruct(instruct_data, "val")
    examples = held_out_examples(instruct_data, 1000)
    assert len(starts) == len(examples) == meta["val"]["examples"]
    assert tokens[0] == tokens[-1] == tokenizer.eot and mask[0] == 0
    ends = list(starts[1:]) + [len(tokens) - 1]
    for s, end, e in zip(starts, ends, examples, strict=True):
        prompt, story = tokenizer.encode(e.prompt), tokenizer.encode(e.story)
        assert tokens[s + 1 : end + 1].tolist() == prompt + story + [tokenizer.eot]
        assert mask[s + 1 : end + 1].tolist() == [0] * len(prompt) + [1] * (len(story) + 1)
        assert all(w in story_words(e.story) for w in e.words) and e.dialogue == has_dialogue(e.story)
    # the stories are exactly the held-out token file's stories, token for token
    val = np.fromfile(instruct_data / "val.bin", dtype=np.uint16)
    assert np.array_equal(tokens[mask.astype(bool)], val)


def test_rows_start_at_a_prompt_and_score_only_its_story(instruct_data):
    prepare_instruct(instruct_data)
    tokenizer = Tokenizer.load(instruct_data / "tokenizer.json")
    tokens, mask, starts = load_instruct(instruct_data, "val")
    examples = held_out_examples(instruct_data, 1000)
    T = 64
    x, y = example_rows(tokens, mask, starts, T)
    assert x.shape == y.shape == (len(starts), T) and x.dtype == y.dtype == torch.int64
    for i, e in enumerate(examples):
        prompt, story = tokenizer.encode(e.prompt), tokenizer.encode(e.story)
        assert x[i, 0] == tokenizer.eot and x[i, 1 : 1 + len(prompt)].tolist() == prompt[: T - 1]
        wanted = ([IGNORE] * len(prompt) + story + [tokenizer.eot])[:T]
        wanted += [IGNORE] * (T - len(wanted))  # the next example's tokens and padding are not scored
        assert y[i].tolist() == wanted
    # the last example runs into the end of the stream: padded with <eot>, unscored
    left = len(tokens) - starts[-1]
    assert left < T and (x[-1, left:] == tokenizer.eot).all() and (y[-1, left - 1 :] == IGNORE).all()
    for T in (24, 26, 41):  # a window too short for some prompts: those examples are left out
        kept = load_instruct(instruct_data, "val", block_size=T)[2]
        scored = (example_rows(tokens, mask, starts, T)[1] != IGNORE).any(dim=1).numpy()
        assert np.array_equal(kept, starts[scored]) and 0 < len(kept) < len(starts)
    a = instruct_batch(tokens, mask, starts, 4, T, seed=3, step=5)
    b = instruct_batch(tokens, mask, starts, 4, T, seed=3, step=5)
    c = instruct_batch(tokens, mask, starts, 4, T, seed=3, step=6)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[0], c[0])


def test_story_loss_counts_only_the_story_targets():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    model = lambda x: (logits, None)
    y = torch.tensor([[IGNORE, 3, 4, IGNORE, IGNORE], [1, IGNORE, IGNORE, IGNORE, 6]])
    kept = [(0, 1), (0, 2), (1, 0), (1, 4)]
    expected = torch.stack([torch.nn.functional.cross_entropy(logits[i, j], y[i, j]) for i, j in kept]).mean()
    torch.testing.assert_close(story_loss(model, None, y), expected)
