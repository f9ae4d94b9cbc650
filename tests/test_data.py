import json

import numpy as np
import pytest
from conftest import write_corpus

from mvgpt import data
from mvgpt.data import download, get_batch, load_tokens, prepare, read_meta, resolve_source
from mvgpt.tokenizer import EOT, Tokenizer


def test_bins_equal_a_fresh_encoding(corpus_dir, data_dir):
    tok = Tokenizer.load(data_dir / "tokenizer.json")
    meta = json.loads((data_dir / "meta.json").read_text())
    assert meta["tokenizer_hash"] == tok.hash and meta["vocab_size"] == 300
    for split, name in (("train", "train.txt"), ("val", "valid.txt")):
        stories = [s.strip() for s in (corpus_dir / name).read_text().split(EOT) if s.strip()]
        expected = [i for s in stories for i in tok.encode(s) + [tok.eot]]
        got = load_tokens(data_dir, split)
        assert got.dtype == np.uint16 and got.tolist() == expected
        assert meta[f"{split}_tokens"] == len(expected)


def test_held_out_stories_are_not_in_training(data_dir, corpus_dir):
    meta = json.loads((data_dir / "meta.json").read_text())
    assert meta["val_stories"] == 60 and meta["train_stories"] == 400


def test_same_seed_same_batches_other_seed_other_batches(data_dir):
    tokens = load_tokens(data_dir, "train")
    x1, y1 = get_batch(tokens, 4, 16, seed=7, step=3)
    x2, y2 = get_batch(tokens, 4, 16, seed=7, step=3)
    assert x1.equal(x2) and y1.equal(y2)
    assert x1[:, 1:].equal(y1[:, :-1])  # targets are the inputs shifted by one
    assert not get_batch(tokens, 4, 16, seed=8, step=3)[0].equal(x1)
    assert not get_batch(tokens, 4, 16, seed=7, step=4)[0].equal(x1)
    assert not get_batch(tokens, 4, 16, seed=7, step=3, rank=1)[0].equal(x1)


def test_rerun_does_nothing_unless_forced(corpus_dir, tmp_path):
    prepare(corpus_dir, tmp_path, vocab_size=280)
    stamp = (tmp_path / "train.bin").stat().st_mtime_ns
    assert prepare(corpus_dir, tmp_path, vocab_size=280).get("skipped")
    assert (tmp_path / "train.bin").stat().st_mtime_ns == stamp
    assert not prepare(corpus_dir, tmp_path, vocab_size=280, force=True).get("skipped")


def test_single_file_holds_out_its_last_stories(tmp_path):
    source = write_corpus(tmp_path / "stories.txt", 100, seed=3)
    meta = prepare(source, tmp_path / "out", vocab_size=280)
    assert meta["train_stories"] == 95 and meta["val_stories"] == 5


def test_interrupted_preparation_leaves_nothing_that_looks_complete(corpus_dir, tmp_path, monkeypatch):
    prepare(corpus_dir, tmp_path, vocab_size=280)
    other = tmp_path / "other"
    other.mkdir()
    write_corpus(other / "train.txt", 50, seed=4)
    write_corpus(other / "valid.txt", 10, seed=5)

    def crash(path, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(data, "write_tokens", crash)
    with pytest.raises(KeyboardInterrupt):
        prepare(other, tmp_path, vocab_size=280)
    assert read_meta(tmp_path) is None  # no meta: nothing reads it as complete
    with pytest.raises(SystemExit, match="no complete prepared data"):
        load_tokens(tmp_path, "train")
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary files left behind


def test_a_write_interrupted_midway_keeps_no_partial_file(tmp_path, data_dir):
    tok = Tokenizer.load(data_dir / "tokenizer.json")

    class Boom(list):
        def __getitem__(self, item):
            if isinstance(item, slice) and item.start:
                raise KeyboardInterrupt
            return list.__getitem__(self, item)

    with pytest.raises(KeyboardInterrupt):
        data.write_tokens(tmp_path / "train.bin", tok, Boom(["Lily saw a dog."] * 10), "t", chunk=4)
    assert list(tmp_path.iterdir()) == []


def text_file(name: str, text: str):
    def make(folder):
        (folder / name).write_text(text)
        return folder / name

    return make


def folder_without_valid(folder):
    (folder / "one").mkdir()
    write_corpus(folder / "one" / "train.txt", 5, 0)
    return folder / "one"


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda p: p / "missing", "does not exist"),
        (text_file("empty.txt", ""), "is empty"),
        (text_file("plain.txt", "Once upon a time.\nThe end.\n"), "no <\\|endoftext\\|> separators"),
        (folder_without_valid, "has no valid.txt"),
    ],
    ids=["missing", "empty", "no-separators", "no-valid"],
)
def test_bad_sources_give_one_line_errors(tmp_path, setup, message):
    source = setup(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=message) as e:
        prepare(source, out)
    assert "\n" not in str(e.value.code) and str(e.value.code).startswith("error:")
    assert read_meta(out) is None


def test_download_caps_at_a_story_boundary(tmp_path):
    source = write_corpus(tmp_path / "remote.txt", 50, seed=6)
    got = download(source.as_uri(), tmp_path / "raw" / "train.txt", max_bytes=1000)
    text = got.read_text()
    assert len(text.encode()) <= 1001 and text.rstrip().endswith(EOT)
    assert source.read_text().startswith(text.rstrip())
    assert not (tmp_path / "raw" / "train.txt.part").exists()


def test_partial_download_is_never_taken_as_finished(tmp_path, monkeypatch):
    class Broken:
        headers = {"Content-Length": "100000"}

        def __init__(self):
            self.calls = 0

        def read(self, n):
            self.calls += 1
            if self.calls > 2:
                raise ConnectionResetError("connection reset")
            return b"Lily saw a dog.\n" * 10

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    monkeypatch.setattr(data.urllib.request, "urlopen", lambda url, timeout: Broken())
    dest = tmp_path / "raw" / "train.txt"
    with pytest.raises(SystemExit, match="--source"):
        download("https://example.invalid/train.txt", dest)
    assert not dest.exists()


def test_no_network_names_source(tmp_path, monkeypatch):
    monkeypatch.delenv(data.SOURCE_ENV, raising=False)
    monkeypatch.setattr(data, "HUB_URL", "http://127.0.0.1:9/")  # nothing listens there
    with pytest.raises(SystemExit, match="pass --source PATH"):
        data.fetch_tinystories(tmp_path / "raw", base_url="http://127.0.0.1:9/")
    assert not (tmp_path / "raw" / "valid.txt").exists()


def test_source_from_environment(tmp_path, monkeypatch, corpus_dir):
    monkeypatch.setenv(data.SOURCE_ENV, str(corpus_dir))
    assert resolve_source(None, tmp_path) == corpus_dir
    assert resolve_source(str(tmp_path), tmp_path) == tmp_path  # --source wins
