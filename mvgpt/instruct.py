"""Instructions made from our own TinyStories, offline, in the style of TinyStories-Instruct.

TinyStories-Instruct puts a few lines before each story that say what the story must hold. We
make them from each story itself, so no text is fetched and held-out prompts come from held-out
stories:

    Words: icy, slippery, leaves        three words the story uses, picked by a seeded rule
    Features: Dialogue                  only when the story has quoted speech
    Story:
    Once upon a time, ...

The rule for the words: the story's lowercase words of 3 letters or more that are not common,
that is, used by at most 5% of the training stories ("happy", "said", "day" never are: any
story could pass with those), and used by at least 2 of them (so the model has seen the word);
three of them, drawn from a generator seeded with (seed, split, story index).

Each example is `<|endoftext|>` + prompt + story, and the stories end with `<|endoftext|>`, so the
examples follow one another in one token stream, as the stories do in train.bin. A mask byte per
token says whether it is a target of the loss: the story's tokens and its closing
`<|endoftext|>` (the model learns to stop), never the prompt's. Targets elsewhere are IGNORE (-1).
The stream and mask are cached beside the token files (data/instruct-train.bin, -mask.bin,
data/instruct.json written last); they are made from train.bin and val.bin (decoding is exact for
a byte-level BPE), so nothing but the prepared data is needed.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mvgpt.data import DATA_DIR, DataError, load_tokens, read_meta
from mvgpt.kit.io import atomic_path, write_text_atomic
from mvgpt.tokenizer import Tokenizer

IGNORE = -1  # the target of a token that is not trained on (the prompt, padding)
WORDS_SEED = 1337  # the seed of the word-picking rule: part of the data, not of a run
N_WORDS = 3
MAX_SHARE = 0.05  # a word used by more of the training stories than this is too common to ask for
MIN_STORIES = 2  # ... and one used by fewer is too rare
VERSION = 1  # of the rule and the format: a cache made by another version is made again
SPLITS = {"train": 0, "val": 1}

WORD = re.compile(r"[A-Za-z]+")
QUOTE = re.compile(r"\"[^\"\n]+\"|“[^”\n]+”")  # straight or curly quotes around some words on one line


@dataclass
class Example:
    words: list[str]  # the words the story must use
    dialogue: bool  # the prompt asks for quoted speech
    story: str  # the story the prompt was made from

    @property
    def prompt(self) -> str:
        return make_prompt(self.words, self.dialogue)


def make_prompt(words: list[str], dialogue: bool) -> str:
    lines = [f"Words: {', '.join(words)}"]
    if dialogue:
        lines.append("Features: Dialogue")
    return "\n".join(lines) + "\nStory:\n"


def has_dialogue(text: str) -> bool:
    return QUOTE.search(text) is not None


def words_used(text: str, words: list[str]) -> list[bool]:
    """For each word, whether the text uses it as a whole word (any case)."""
    return [re.search(rf"\b{re.escape(w)}\b", text, re.IGNORECASE) is not None for w in words]


def story_words(story: str) -> list[str]:
    """The story's lowercase words of 3 letters or more, once each, in order of first use."""
    return list(dict.fromkeys(w for w in WORD.findall(story) if len(w) >= 3 and w.islower()))


def common_counts(stories: list[str]) -> Counter:
    """How many of the stories use each word (the training stories: the rule's word counts)."""
    counts = Counter()
    for story in stories:
        counts.update(story_words(story))
    return counts


def pick_words(story: str, counts: Counter, n_stories: int, seed: int, split: int, index: int) -> list[str] | None:
    """Three of the story's words that are neither common nor rare, drawn by the seeded rule
    (None: the story has fewer than three such words, and gets no prompt)."""
    limit = MAX_SHARE * n_stories
    candidates = [w for w in story_words(story) if MIN_STORIES <= counts[w] <= limit]
    if len(candidates) < N_WORDS:
        return None
    rng = np.random.default_rng([seed, split, index])
    return [candidates[i] for i in rng.choice(len(candidates), N_WORDS, replace=False)]


def make_examples(
    stories: list[str], counts: Counter, n_stories: int, split: str, seed: int = WORDS_SEED
) -> list[Example]:
    """A prompt for each story that has three words to ask for, in the stories' order."""
    out = []
    for i, story in enumerate(stories):
        words = pick_words(story, counts, n_stories, seed, SPLITS[split], i)
        if words is not None:
            out.append(Example(words, has_dialogue(story), story))
    return out


def encode_examples(examples: list[Example], tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, mask), uint16 and uint8: <eot> prompt story <eot> prompt story ... <eot>.

    mask[j] is 1 where token j is a target of the loss: a story's tokens and the <eot> after it."""
    prompts = tokenizer.encode_batch([e.prompt for e in examples])
    stories = tokenizer.encode_batch([e.story for e in examples])
    tokens, mask = [tokenizer.eot], [0]
    for prompt, story in zip(prompts, stories, strict=True):
        tokens += prompt + story + [tokenizer.eot]
        mask += [0] * len(prompt) + [1] * (len(story) + 1)
    return np.asarray(tokens, dtype=np.uint16), np.asarray(mask, dtype=np.uint8)


# ----------------------------------------------------------------------------------------------
# The cache beside the token files


def split_stories(tokens: np.ndarray, tokenizer: Tokenizer) -> list[str]:
    """The stories of a token file, as text: its pieces between <eot> tokens, decoded."""
    ends = np.flatnonzero(tokens == tokenizer.eot)
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [tokenizer.decode(tokens[s:e].tolist()) for s, e in zip(starts, ends, strict=True) if e > s]


def instruct_files(data_dir: Path, split: str) -> tuple[Path, Path]:
    return data_dir / f"instruct-{split}.bin", data_dir / f"instruct-{split}-mask.bin"


def read_instruct_meta(data_dir: Path, seed: int = WORDS_SEED) -> dict | None:
    """instruct.json if the cache is complete and made from these token files by this rule, else None."""
    data_meta = read_meta(data_dir)
    try:
        meta = json.loads((data_dir / "instruct.json").read_text())
        if data_meta is None or meta["tokenizer_hash"] != data_meta["tokenizer_hash"]:
            return None
        if meta["version"] != VERSION or meta["seed"] != seed or meta["source_hash"] != data_meta.get("source_hash"):
            return None
        for split in SPLITS:
            tokens, mask = instruct_files(data_dir, split)
            n = meta[split]["tokens"]
            if tokens.stat().st_size != 2 * n or mask.stat().st_size != n:
                return None
        return meta
    except (OSError, ValueError, KeyError, TypeError):
        return None


def prepare_instruct(data_dir: str | os.PathLike = DATA_DIR, seed: int = WORDS_SEED, force: bool = False) -> dict:
    """Make the instruction data from data_dir's token files, unless the cache is there already."""
    data_dir = Path(data_dir)
    meta = None if force else read_instruct_meta(data_dir, seed)
    if meta is not None:
        return meta
    tokenizer = Tokenizer.load(data_dir / "tokenizer.json")
    data_meta = read_meta(data_dir)
    stories = {split: split_stories(load_tokens(data_dir, split), tokenizer) for split in SPLITS}
    counts = common_counts(stories["train"])
    (data_dir / "instruct.json").unlink(missing_ok=True)  # from here on, nothing looks complete
    meta = {"version": VERSION, "seed": seed, "tokenizer_hash": data_meta["tokenizer_hash"],
            "source_hash": data_meta.get("source_hash"), "words": N_WORDS, "max_share": MAX_SHARE,
            "min_stories": MIN_STORIES}
    for split in SPLITS:
        examples = make_examples(stories[split], counts, len(stories["train"]), split, seed)
        if not examples:
            raise DataError(f"no {split} story has {N_WORDS} words to ask for: the stories are too short or too few")
        tokens, mask = encode_examples(examples, tokenizer)
        for path, array in zip(instruct_files(data_dir, split), (tokens, mask), strict=True):
            with atomic_path(path) as tmp:
                array.tofile(tmp)
        meta[split] = {"stories": len(stories[split]), "examples": len(examples), "tokens": len(tokens),
                       "targets": int(mask.sum()), "dialogue": sum(e.dialogue for e in examples)}
    write_text_atomic(data_dir / "instruct.json", json.dumps(meta, indent=2))
    return meta


def load_instruct(
    data_dir: str | os.PathLike, split: str, block_size: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, mask, starts) of a split, memory-mapped; starts are the <eot> each example opens
    with. With block_size, only the examples whose prompt leaves a story token in the window."""
    tokens_path, mask_path = instruct_files(Path(data_dir), split)
    tokens = np.memmap(tokens_path, dtype=np.uint16, mode="r")
    mask = np.memmap(mask_path, dtype=np.uint8, mode="r")
    eot = int(tokens[0])
    starts = np.flatnonzero(np.asarray(tokens[:-1]) == eot)
    if block_size is not None:  # the first target of the example at s is token s + len(prompt) + 1
        targets = np.flatnonzero(mask)
        first = targets[np.searchsorted(targets, starts, side="right")]
        starts = starts[first - starts <= block_size]
    return tokens, mask, starts


def held_out_examples(data_dir: str | os.PathLike, n: int, seed: int = WORDS_SEED) -> list[Example]:
    """The first n held-out examples (prompt, words, story), rebuilt by the same rule as the cache."""
    data_dir = Path(data_dir)
    tokenizer = Tokenizer.load(data_dir / "tokenizer.json")
    train = split_stories(load_tokens(data_dir, "train"), tokenizer)
    val = split_stories(load_tokens(data_dir, "val"), tokenizer)
    return make_examples(val, common_counts(train), len(train), "val", seed)[:n]


# ----------------------------------------------------------------------------------------------
# Batches and the loss on story tokens


def example_rows(
    tokens: np.ndarray, mask: np.ndarray, starts: np.ndarray, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y), each (len(starts), block_size): one example per row, from its opening <eot>.

    y is x shifted by one, with IGNORE wherever the target is not a story token of the row's
    own example (its prompt, a next example, padding past the end of the stream)."""
    eot = int(tokens[0])
    x = np.full((len(starts), block_size + 1), eot, dtype=np.int64)
    keep = np.zeros((len(starts), block_size + 1), dtype=bool)
    for i, s in enumerate(starts):
        row = np.asarray(tokens[s : s + block_size + 1], dtype=np.int64)
        x[i, : len(row)] = row
        m = np.asarray(mask[s : s + block_size + 1], dtype=bool)
        own = np.flatnonzero(row[1:] == eot)  # the example ends at its closing <eot>
        end = own[0] + 2 if len(own) else len(row)
        keep[i, :end] = m[:end]
    y = np.where(keep[:, 1:], x[:, 1:], IGNORE)
    return torch.from_numpy(x[:, :-1]), torch.from_numpy(y)


def instruct_batch(
    tokens: np.ndarray, mask: np.ndarray, starts: np.ndarray, batch_size: int, block_size: int, seed: int, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """batch_size examples drawn by (seed, step), as get_batch draws windows: a resumed run picks up
    at its step with no state."""
    rng = np.random.default_rng([seed, step])
    return example_rows(tokens, mask, starts[rng.integers(0, len(starts), size=batch_size)], block_size)


def story_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the story tokens only: the targets that are not IGNORE.

    GPT.forward's own loss counts every target, so the logits are scored here."""
    logits, _ = model(x)
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=IGNORE)
