"""TinyStories text -> tokens on disk, and seeded batches drawn from them.

Sources, in order: `--source PATH` (a text file, or a folder with train.txt and valid.txt), the
MVGPT_TINYSTORIES environment variable, or a download of roneneldan/TinyStories from the Hugging
Face Hub. Stories are separated by `<|endoftext|>` lines. The held-out set is the validation
file, never mixed into training. Tokens are uint16 in data/train.bin and data/val.bin, read with
np.memmap; data/meta.json, written last, says the preparation is complete and what it came from.

A preparation is made whole in data/.prepare.tmpPID/ and only then moved in, so prepared data is
never lost to a typo, a bad source, Ctrl-C or kill -9. A folder left by a killed run is removed
(or, if it was complete and being moved in, moved in) by the next run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from mvgpt.kit.errors import DISK_FULL, UserError, no_room
from mvgpt.kit.io import atomic_path, pid_alive, write_text_atomic
from mvgpt.tokenizer import EOT, Tokenizer, file_hash, train_tokenizer

if TYPE_CHECKING:  # torch is imported where batches are made: preparing data does not need it
    import torch

DATA_DIR = Path("data")
SOURCE_ENV = "MVGPT_TINYSTORIES"
HUB_URL = "https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/"
HUB_FILES = {"train": "TinyStories-train.txt", "valid": "TinyStories-valid.txt"}
DEFAULT_MAX_TRAIN_MB = 300  # of the 1.9 GB train file: hours of training on a laptop
SINGLE_FILE_HELD_OUT = 20  # a single source file: its last 1/20 of stories are held out
MIN_VOCAB, MAX_VOCAB = 258, 2**16  # 256 bytes, a merge and <|endoftext|>; ids stored as uint16
PREPARED = ("tokenizer.json", "train.bin", "val.bin", "meta.json")  # meta.json last: it says "complete"
STAGING = ".prepare.tmp"  # data/.prepare.tmpPID/: a preparation being made by process PID


class DataError(UserError):
    """A problem with the input data: one line saying what is wrong and what to do."""


# ----------------------------------------------------------------------------------------------
# Sources


def split_stories(text: str, name: str) -> list[str]:
    """Stories separated by `<|endoftext|>`, stripped, empty ones dropped."""
    if not text.strip():
        raise DataError(f"{name} is empty: point --source at TinyStories text")
    if EOT not in text:
        raise DataError(
            f"{name} has no {EOT} separators, so its stories cannot be told apart: "
            f"put a line {EOT} after each story (as TinyStories' .txt files do)"
        )
    stories = [s.strip() for s in text.split(EOT) if s.strip()]
    if not stories:
        raise DataError(f"{name} has {EOT} separators and no story between them: point --source at TinyStories "
                        "text")
    return stories


def source_files(source: str | os.PathLike) -> list[Path]:
    """The text files of a source: [file], or a folder's [train.txt, valid.txt]; checked to exist."""
    path = Path(source)
    if not path.exists():
        raise DataError(f"source {path} does not exist: pass --source a TinyStories file or folder")
    if not path.is_dir():
        if not path.is_file():  # a pipe is read once and may never end; the source is read twice
            raise DataError(f"source {path} is not a regular file (a pipe or a device): save the text to a file "
                            "and pass that")
        return [path]
    files = [path / "train.txt", path / "valid.txt"]
    for f in files:
        if not f.is_file():
            raise DataError(
                f"folder {path} has no {f.name}: it needs train.txt and valid.txt (or pass --source one text file)"
            )
    return files


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        packed = {b"\x1f\x8b": ("gzip", "gunzip -k"), b"PK": ("zip", "unzip"), b"BZ": ("bzip2", "bunzip2 -k"),
                  b"\xfd7": ("xz", "unxz -k")}.get(e.object[:2])
        if packed:  # compressed text: its fix is to unpack it, not to convert an encoding
            raise DataError(f"{path} is compressed ({packed[0]}), not text: unpack it first, e.g. `{packed[1]} "
                            f"{path}`, and pass --source the text") from None
        raise DataError(
            f"{path} is not UTF-8 text (byte {e.start} is {e.object[e.start:e.start + 1]!r}): convert it, "
            f"e.g. `iconv -f latin1 -t utf-8 {path} > stories.txt`, and pass --source the new file"
        ) from None


def read_source(source: str | os.PathLike) -> tuple[list[str], list[str], str]:
    """(train stories, held-out stories, a description of the split) from a file or folder."""
    path = Path(source)
    files = source_files(path)
    if len(files) == 2:
        train, valid = files
        return (
            split_stories(read_text(train), str(train)),
            split_stories(read_text(valid), str(valid)),
            f"{train} for training, {valid} held out",
        )
    stories = split_stories(read_text(path), str(path))
    if len(stories) < 2:
        raise DataError(f"{path} holds one story: at least two are needed, one to train on and one held out")
    n_val = max(1, len(stories) // SINGLE_FILE_HELD_OUT)
    return stories[:-n_val], stories[-n_val:], f"{path}: last {n_val} of {len(stories)} stories held out"


def download(url: str, dest: Path, max_bytes: int | None = None) -> Path:
    """Fetch url to dest with a progress bar, at most max_bytes (cut at a story boundary).

    The bytes go to dest.part and are renamed to dest only when complete, so a partial
    download is never mistaken for a finished one; a later run starts it again.
    """
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=30) as response, open(part, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            if max_bytes is not None and total is not None:
                total = min(total, max_bytes)
            done = 0
            with tqdm(total=total, unit="B", unit_scale=True, desc=dest.name, disable=None) as bar:
                while max_bytes is None or done < max_bytes:
                    chunk = response.read(1 << 20)
                    if not chunk:
                        break
                    out.write(chunk)
                    done += len(chunk)
                    bar.update(len(chunk))
        if max_bytes is not None and done >= max_bytes:  # capped: keep whole stories only
            data = part.read_bytes()[:max_bytes]
            cut = data.rfind(EOT.encode())
            part.write_bytes(data[: cut + len(EOT)] + b"\n" if cut >= 0 else data)
    except (urllib.error.URLError, OSError) as e:
        raise DataError(
            f"could not download {url} ({getattr(e, 'reason', e)}); "
            "with no network, pass --source PATH to a local TinyStories file or folder"
        ) from None
    os.replace(part, dest)
    return dest


def fetch_tinystories(raw_dir: Path, max_train_mb: float = DEFAULT_MAX_TRAIN_MB, base_url: str = HUB_URL) -> Path:
    """Download TinyStories' train (capped) and valid files into raw_dir as train.txt/valid.txt."""
    max_bytes = int(max_train_mb * 1e6) if max_train_mb else None
    download(base_url + HUB_FILES["valid"], raw_dir / "valid.txt")
    download(base_url + HUB_FILES["train"], raw_dir / "train.txt", max_bytes)
    return raw_dir


def source_arg(text: str) -> str:
    """--source, never empty: an empty one (an unset variable) would download instead, without a word."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: give a TinyStories file or folder, or leave the flag out to "
                                         "download it")
    return text


def resolve_source(source: str | None, data_dir: Path, max_train_mb: float = DEFAULT_MAX_TRAIN_MB) -> Path:
    """--source, else $MVGPT_TINYSTORIES, else a download into data_dir/raw."""
    source = source or os.environ.get(SOURCE_ENV)
    if source:
        return Path(source)
    return fetch_tinystories(data_dir / "raw", max_train_mb)


# ----------------------------------------------------------------------------------------------
# Preparation: tokenizer + bins + meta


def source_fingerprint(source: Path) -> str:
    """A hash of the source's bytes, so a re-run with the same inputs can do nothing."""
    h = hashlib.sha256()
    for f in source_files(source):
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 24), b""):
                h.update(block)
    return h.hexdigest()[:16]


def read_meta(data_dir: Path) -> dict | None:
    """The meta JSON of a complete preparation, or None (missing, corrupt or bins not matching)."""
    try:
        meta = json.loads((data_dir / "meta.json").read_text())
        vocab = meta.get("vocab_size") if isinstance(meta, dict) else None
        if not isinstance(vocab, int) or isinstance(vocab, bool) or not MIN_VOCAB <= vocab <= MAX_VOCAB:
            return None  # not ours, or damaged: nothing read from it can be trusted
        for split in ("train", "val"):
            if (data_dir / f"{split}.bin").stat().st_size != 2 * meta[f"{split}_tokens"]:
                return None
        if file_hash(data_dir / "tokenizer.json") != meta["tokenizer_hash"]:
            return None
        if len(json.loads((data_dir / "tokenizer.json").read_text())["ranks"]) + 1 != vocab:
            return None  # the vocabulary meta.json says is not the tokenizer's: a model sized by it would be wrong
        return meta
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_tokens(path: Path, tokenizer: Tokenizer, stories: list[str], desc: str, chunk: int = 4096) -> int:
    """Encode stories (each followed by `<|endoftext|>`) into a uint16 file, atomically."""
    if tokenizer.vocab_size > 2**16:
        raise ValueError(f"vocab of {tokenizer.vocab_size} does not fit in uint16")
    n = 0
    with atomic_path(path) as tmp, open(tmp, "wb") as out:
        for i in tqdm(range(0, len(stories), chunk), desc=desc, unit="chunk", leave=False, disable=None):
            for ids in tokenizer.encode_batch(stories[i : i + chunk]):
                ids.append(tokenizer.eot)
                out.write(np.asarray(ids, dtype=np.uint16).tobytes())
                n += len(ids)
        out.flush()
    return n


def recover(data_dir: Path) -> None:
    """Tidy up after preparations whose process died (kill -9, a power cut): one that was complete
    was being moved in, so finish that; an unfinished one is removed."""
    for staging in data_dir.glob(STAGING + "*"):
        pid = staging.name.removeprefix(STAGING)
        if pid.isdigit() and int(pid) != os.getpid() and pid_alive(int(pid)):
            continue  # still at work
        if (staging / "meta.json").exists():
            move_in(staging, data_dir)
        else:
            shutil.rmtree(staging, ignore_errors=True)


def move_in(staging: Path, data_dir: Path) -> None:
    """Replace data_dir's preparation by the complete one in staging. The old meta.json goes first,
    so a mix of old and new files never looks complete; the new one comes last. A move cut short
    is finished by recover()."""
    (data_dir / "meta.json").unlink(missing_ok=True)
    for name in PREPARED:
        if (staging / name).exists():
            os.replace(staging / name, data_dir / name)
    shutil.rmtree(staging, ignore_errors=True)


def prepared_for(meta: dict | None, fingerprint: str, vocab_size: int) -> bool:
    """Was this preparation made from these inputs (the source's bytes, the vocabulary asked for)?"""
    return meta is not None and (meta.get("source_hash"), meta.get("vocab_asked", meta.get("vocab_size"))) == (
        fingerprint, vocab_size)


def prepare(
    source: str | os.PathLike,
    data_dir: str | os.PathLike = DATA_DIR,
    vocab_size: int = 8192,
    force: bool = False,
    replace: bool = True,
) -> dict:
    """Train the tokenizer and write the bins and meta.json; skip if done for the same inputs.

    Everything is made in a staging folder and moved in only when complete: until then the data
    already in data_dir stays as it was, whatever happens (a bad source, Ctrl-C, kill -9).
    replace=False (prepare.py without --force): data made from other inputs is refused, not replaced,
    since every checkpoint trained on it needs its tokenizer.
    """
    data_dir, source = Path(data_dir), Path(source)
    if not MIN_VOCAB <= vocab_size <= MAX_VOCAB:
        raise DataError(f"a vocabulary of {vocab_size} tokens cannot be: give {MIN_VOCAB} to {MAX_VOCAB}")
    if data_dir.exists():
        recover(data_dir)
    fingerprint = source_fingerprint(source)
    meta = read_meta(data_dir)
    if not force and prepared_for(meta, fingerprint, vocab_size):
        meta["skipped"] = True
        return meta
    train, valid, split = read_source(source)  # a bad source is said first: it is what to fix
    if meta is None and not replace and not force and (data_dir / "tokenizer.json").exists():
        raise DataError(  # a damaged meta.json must not pass for no data: runs may need this tokenizer
            f"{data_dir} holds a tokenizer, but its meta.json is missing or damaged: runs trained on that data "
            "need its tokenizer: prepare into another --data-dir, or pass --force to replace it")
    if meta is not None and not replace and not force:
        raise DataError(
            f"{data_dir} holds data prepared from {meta.get('source')} (vocabulary {meta.get('vocab_size')}, "
            f"tokenizer {meta.get('tokenizer_hash')}), which any run trained on it needs: prepare into another "
            "--data-dir, or pass --force to replace it"
        )
    staging = data_dir / f"{STAGING}{os.getpid()}"
    staging.mkdir(parents=True, exist_ok=True)
    try:
        tokenizer = train_tokenizer(train, vocab_size)
        if tokenizer.vocab_size < MIN_VOCAB:  # not one pair of bytes repeats: a tokenizer of bytes alone
            raise DataError(f"{source} is too short to learn a single merge ({tokenizer.vocab_size} tokens, fewer "
                            f"than {MIN_VOCAB}): give it more text")
        tokenizer.save(staging / "tokenizer.json")
        meta = {
            "vocab_size": tokenizer.vocab_size,
            "vocab_asked": vocab_size,  # a small text may give fewer tokens than asked: the same inputs all the same
            "tokenizer_hash": tokenizer.hash,
            "source": str(source),
            "source_hash": fingerprint,
            "split": split,
            "train_stories": len(train),
            "val_stories": len(valid),
            "train_chars": sum(len(s) for s in train),
            "val_chars": sum(len(s) for s in valid),
        }
        meta["train_tokens"] = write_tokens(staging / "train.bin", tokenizer, train, "train.bin")
        meta["val_tokens"] = write_tokens(staging / "val.bin", tokenizer, valid, "val.bin")
        write_text_atomic(staging / "meta.json", json.dumps(meta, indent=2))
    except BaseException as e:  # Ctrl-C or a full disk included: leave nothing half-made behind
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(e, OSError) and e.errno in DISK_FULL:
            cause, fix = no_room(e)
            raise DataError(f"{cause}: {data_dir} was not prepared (the data there before, if any, is as it was): "
                            f"{fix}") from None
        raise
    move_in(staging, data_dir)
    return meta


# ----------------------------------------------------------------------------------------------
# Reading tokens and drawing batches


def load_tokens(data_dir: str | os.PathLike = DATA_DIR, split: str = "train") -> np.ndarray:
    """The uint16 tokens of a split, memory-mapped, checked once against the vocabulary: a damaged
    file (a flipped bit) is one line naming the first bad id and its place, not an IndexError at the
    same step of every run."""
    data_dir = Path(data_dir)
    meta = read_meta(data_dir)
    if meta is None:
        raise DataError(no_data(data_dir))
    path = data_dir / f"{split}.bin"
    tokens = np.memmap(path, dtype=np.uint16, mode="r")
    vocab = meta["vocab_size"]
    if len(tokens) and int(tokens.max()) >= vocab:  # one pass over the file: a fraction of a second
        at = int(np.argmax(tokens >= vocab))
        raise DataError(f"{path} is damaged: token {at:,} is id {int(tokens[at])}, outside the vocabulary of "
                        f"{vocab}: prepare the data again (python scripts/prepare.py --source PATH "
                        f"--data-dir {data_dir} --force)")
    return tokens


def no_data(data_dir: str | os.PathLike) -> str:
    """Why there is no prepared data to read, and the fix. Typed from inside scripts/ (the video types
    `python pretrain.py`), data/ is looked for there: the fix is to run from the repository's root."""
    here = Path.cwd()
    if Path(data_dir) == DATA_DIR and here.name == "scripts" and read_meta(here.parent / DATA_DIR) is not None:
        typed = shlex.join(["python", f"scripts/{Path(sys.argv[0]).name}", *sys.argv[1:]])
        return f"no prepared data in scripts/{data_dir}: run the scripts from the repository's root: `cd .. && {typed}`"
    if (Path(data_dir) / "tokenizer.json").exists():  # prepared once, then damaged: prepare.py refuses without --force
        return (f"the prepared data in {data_dir} is damaged (its meta.json, token files and tokenizer do not agree): "
                f"prepare it again from its source, `python scripts/prepare.py --source PATH --data-dir {data_dir} "
                "--force`")
    if Path(data_dir) != DATA_DIR and not Path(data_dir).exists():  # a typo in --data-dir, most often
        return (f"no folder {data_dir}: check --data-dir (the prepared data is where prepare.py wrote it, {DATA_DIR} "
                f"by default), or prepare it there, `python scripts/prepare.py --source PATH --data-dir {data_dir}`")
    elsewhere = " (or pass --data-dir)" if Path(data_dir) == DATA_DIR else ""  # not when it was passed
    return (f"no complete prepared data in {data_dir}: run `python scripts/prepare.py --source PATH --data-dir "
            f"{data_dir}`{elsewhere}")


def prepared_data(text: str) -> str:
    """An argparse type: a folder of complete prepared data."""
    if read_meta(Path(text)) is None:
        raise argparse.ArgumentTypeError(no_data(text))
    return text


_VOCABS: dict[str, int] = {}  # tokenizer hash -> its vocabulary size, for the data this process has read


def data_tokenizer_hash(data_dir: str | os.PathLike = DATA_DIR) -> str | None:
    """The hash of the tokenizer the data was prepared with (None where there is no prepared data)."""
    meta = read_meta(Path(data_dir))
    if not meta:
        return None
    if isinstance(meta.get("vocab_size"), int):
        _VOCABS[meta["tokenizer_hash"]] = meta["vocab_size"]
    return meta["tokenizer_hash"]


def tokenizer_vocab(tokenizer_hash: str | None) -> int | None:
    """The vocabulary size of a tokenizer whose data this process has read (data_tokenizer_hash), so a
    checkpoint that records no tokenizer hash is still checked against the token ids the data holds."""
    return _VOCABS.get(tokenizer_hash) if tokenizer_hash is not None else None


def get_batch(
    tokens: np.ndarray, batch_size: int, block_size: int, seed: int, step: int, rank: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows (x, y), each (batch_size, block_size) int64, y = x shifted by one.

    The windows of a batch depend only on (seed, rank, step): two runs with the same seed see
    the same batches in the same order, and a resumed run picks up at its step with no state.
    """
    if len(tokens) <= block_size + 1:
        raise DataError(f"{len(tokens)} tokens are too few for windows of {block_size}: use more text")
    import torch

    rng = np.random.default_rng([seed, rank, step])
    starts = rng.integers(0, len(tokens) - block_size - 1, size=batch_size)
    rows = np.stack([tokens[s : s + block_size + 1] for s in starts]).astype(np.int64)
    rows = torch.from_numpy(rows)
    return rows[:, :-1], rows[:, 1:]


def windows(tokens: np.ndarray, length: int, count: int | None = None) -> Iterator[torch.Tensor]:
    """Consecutive, non-overlapping pieces of `length` tokens, from the start."""
    import torch

    n = (len(tokens) // length) if count is None else min(count, len(tokens) // length)
    for i in range(n):
        yield torch.from_numpy(tokens[i * length : (i + 1) * length].astype(np.int64))
