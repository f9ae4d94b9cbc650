"""A byte-level BPE tokenizer: trained with rustbpe, encoded with tiktoken.

rustbpe learns the merges from the training stories; we export its mergeable ranks (token bytes
-> rank) and load them into a `tiktoken.Encoding`, which encodes fast, in batches, on all cores.
`<|endoftext|>` is one special token, the last id, that separates stories and never merges.
The saved file's hash goes into the data's meta JSON and every checkpoint, so a model is never
paired with a tokenizer it was not trained with.
"""

from __future__ import annotations

import base64
import codecs
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

import rustbpe
import tiktoken

from mvgpt.kit.io import write_text_atomic

EOT = "<|endoftext|>"


class Tokenizer:
    def __init__(self, ranks: dict[bytes, int], pattern: str) -> None:
        self.ranks = ranks
        self.pattern = pattern
        self.eot = len(ranks)  # the special token comes last
        self.vocab_size = len(ranks) + 1
        self.encoding = tiktoken.Encoding(
            name=f"mvgpt-bpe-{self.vocab_size}",
            pat_str=pattern,
            mergeable_ranks=ranks,
            special_tokens={EOT: self.eot},
        )

    def encode(self, text: str) -> list[int]:
        """Text -> ids; `<|endoftext|>` in the text becomes the one special token."""
        return self.encoding.encode(text, allowed_special={EOT})

    def encode_batch(self, texts: list[str], num_threads: int | None = None) -> list[list[int]]:
        """Many texts at once, in parallel (tiktoken's batch encoder); no special tokens inside."""
        return self.encoding.encode_ordinary_batch(texts, num_threads=num_threads or os.cpu_count() or 1)

    def decode(self, ids: Iterable[int]) -> str:
        return self.encoding.decode(list(ids))

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        return self.encoding.decode_bytes(list(ids))

    def token_bytes(self) -> list[int]:
        """How many bytes of text each id stands for (`<|endoftext|>` stands for none): what turns a
        loss per token into bits per byte, a figure that compares models with other tokenizers."""
        lengths = [0] * self.vocab_size
        for token, i in self.ranks.items():
            lengths[i] = len(token)
        return lengths

    def stream(self) -> TextStream:
        """A decoder for ids that come one at a time (see TextStream)."""
        return TextStream(self)

    # --- saving and loading ---------------------------------------------------------------------

    def to_json(self) -> str:
        ordered = sorted(self.ranks.items(), key=lambda kv: kv[1])
        return json.dumps(
            {
                "pattern": self.pattern,
                "special": {EOT: self.eot},
                "ranks": [base64.b64encode(token).decode("ascii") for token, _ in ordered],
            }
        )

    @property
    def hash(self) -> str:
        return tokenizer_hash(self.to_json())

    def save(self, path: str | os.PathLike) -> None:
        write_text_atomic(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer:
        path = Path(path)
        if not path.exists():
            raise SystemExit(f"error: no tokenizer at {path}: run `python scripts/prepare.py` first")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            ranks = {base64.b64decode(t): i for i, t in enumerate(data["ranks"])}
            return cls(ranks, data["pattern"])
        except (ValueError, KeyError) as e:
            raise SystemExit(
                f"error: tokenizer file {path} is corrupt ({e}): run `python scripts/prepare.py --force`"
            ) from None


class TextStream:
    """Ids -> text as they come, for printing a story while it is written.

    A token is bytes, and a character's bytes can be split across tokens (an emoji is 4 bytes):
    the bytes of a character not yet whole are held back until it is. Bytes that can never make
    a character come out as U+FFFD, as in decode(), and the stream goes on: all the pieces, then
    flush(), join to exactly decode(ids).
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # holds the pending bytes

    def add(self, token: int) -> str:
        """The text that token completes ("" while a character waits for its next bytes)."""
        return self.utf8.decode(self.tokenizer.decode_bytes([token]))

    def flush(self) -> str:
        """At the end: bytes still pending can no longer be completed (U+FFFD for them)."""
        return self.utf8.decode(b"", final=True)


def tokenizer_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def file_hash(path: str | os.PathLike) -> str:
    """The hash of a saved tokenizer, as recorded in meta JSON and checkpoints."""
    return tokenizer_hash(Path(path).read_text(encoding="utf-8"))


def train_tokenizer(texts: Iterable[str], vocab_size: int = 8192) -> Tokenizer:
    """Train a byte-level BPE of `vocab_size` tokens: vocab_size - 1 merges' worth, then EOT."""
    if vocab_size < 257 + 1:
        raise ValueError(f"vocab_size must be at least 258 (256 bytes, a merge, {EOT}), got {vocab_size}")
    bpe = rustbpe.Tokenizer()
    bpe.train_from_iterator(iter(texts), vocab_size - 1)
    ranks = {bytes(token): rank for token, rank in bpe.get_mergeable_ranks()}
    return Tokenizer(ranks, bpe.get_pattern())
