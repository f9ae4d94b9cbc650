import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, write_corpus

from mvgpt import data
from mvgpt.data import DATA_DIR, download, get_batch, load_tokens, no_data, prepare, read_meta, resolve_source
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


def hashes(folder: Path) -> dict[str, str]:
    """Every file under folder (hidden ones included) -> the sha256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def other_corpus(folder: Path, n_train: int = 50, seed: int = 4) -> Path:
    folder.mkdir()
    write_corpus(folder / "train.txt", n_train, seed=seed)
    write_corpus(folder / "valid.txt", 10, seed=seed + 1)
    return folder


def test_interrupted_preparation_keeps_the_data_already_there(corpus_dir, tmp_path, monkeypatch):
    prepare(corpus_dir, tmp_path / "data", vocab_size=280)
    before = hashes(tmp_path / "data")
    other = other_corpus(tmp_path / "other")

    def crash(path, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(data, "write_tokens", crash)
    with pytest.raises(KeyboardInterrupt):
        prepare(other, tmp_path / "data", vocab_size=280)
    assert hashes(tmp_path / "data") == before  # untouched, no staging folder or temp file left
    assert read_meta(tmp_path / "data")["source_hash"] == data.source_fingerprint(corpus_dir)


@pytest.mark.parametrize("vocab_size", [0, -5, 257, 2**16 + 1])
def test_impossible_vocab_size_is_refused_before_anything_is_touched(corpus_dir, tmp_path, vocab_size):
    prepare(corpus_dir, tmp_path, vocab_size=280)
    before = hashes(tmp_path)
    with pytest.raises(SystemExit, match=f"a vocabulary of {vocab_size} tokens cannot be: give 258 to 65536"):
        prepare(corpus_dir, tmp_path, vocab_size=vocab_size, force=True)
    assert hashes(tmp_path) == before


def test_non_utf8_source_names_the_file_and_the_fix(corpus_dir, tmp_path):
    prepare(corpus_dir, tmp_path / "data", vocab_size=280)
    before = hashes(tmp_path / "data")
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("Zoë saw a café.\n<|endoftext|>\nTom too.\n<|endoftext|>\n".encode("latin-1"))
    with pytest.raises(SystemExit) as e:
        prepare(bad, tmp_path / "data", vocab_size=280)
    assert str(e.value.code) == (f"error: {bad} is not UTF-8 text (byte 2 is b'\\xeb'): convert it, e.g. "
                                 f"`iconv -f latin1 -t utf-8 {bad} > stories.txt`, and pass --source the new file")
    assert hashes(tmp_path / "data") == before


def test_leftovers_of_killed_runs_are_removed_or_finished(corpus_dir, tmp_path):
    out = tmp_path / "data"
    prepare(corpus_dir, out, vocab_size=280)
    pid = dead_pid()
    unfinished = out / f".prepare.tmp{pid}"  # killed while training: removed
    unfinished.mkdir()
    (unfinished / "tokenizer.json").write_text("half")
    before = hashes(out)
    del before[f".prepare.tmp{pid}/tokenizer.json"]
    assert prepare(corpus_dir, out, vocab_size=280).get("skipped")
    assert hashes(out) == before

    # killed while moving a complete preparation in: the old meta.json gone, the tokenizer moved
    newer = prepare(other_corpus(tmp_path / "other"), tmp_path / "newer", vocab_size=280)
    moving = out / f".prepare.tmp{dead_pid()}"
    moving.mkdir()
    for name in ("train.bin", "val.bin", "meta.json"):
        os.replace(tmp_path / "newer" / name, moving / name)
    os.replace(tmp_path / "newer" / "tokenizer.json", out / "tokenizer.json")
    (out / "meta.json").unlink()
    assert read_meta(out) is None
    prepare(corpus_dir, out, vocab_size=280)  # finishes the move, then sees other inputs: prepares again
    assert sorted(p.name for p in out.iterdir()) == sorted(data.PREPARED)
    newest = prepare(tmp_path / "other", out, vocab_size=280)
    assert not newest.get("skipped") and newest["tokenizer_hash"] == newer["tokenizer_hash"]


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_prepare_stopped_midway_keeps_the_data_and_leaves_no_temp_files(corpus_dir, tmp_path, sig):
    out = tmp_path / "data"
    prepare(corpus_dir, out, vocab_size=280)
    before = hashes(out)
    big = tmp_path / "big"  # long enough to be caught midway
    big.mkdir()
    write_corpus(big / "train.txt", 30000, seed=7)
    write_corpus(big / "valid.txt", 10, seed=8)
    child = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "prepare.py"), "--source", str(big),
                              "--data-dir", str(out), "--vocab-size", "400", "--force"],  # other inputs: --force
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(out.glob(".prepare.tmp*")) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    child.send_signal(sig)
    _, err = child.communicate(timeout=120)
    if sig == signal.SIGINT:
        assert child.returncode == 130
        assert err == "interrupted (Ctrl-C): nothing was changed: the data already prepared, if any, is as it was\n"
    else:
        assert child.returncode == -9
        assert [p.name for p in out.glob(".prepare.tmp*")] == [f".prepare.tmp{child.pid}"]  # what kill -9 leaves
        assert prepare(corpus_dir, out, vocab_size=280).get("skipped")  # the next run clears it away
    assert hashes(out) == before


def test_prepare_flags_are_checked_before_anything(corpus_dir, tmp_path, capsys):
    prepare(corpus_dir, tmp_path / "data", vocab_size=280)
    before = hashes(tmp_path)
    import prepare as script

    cases = {
        ("--vocab-size", "0"): "argument --vocab-size: 0 is out of range: give a whole number from 258 to 65536",
        ("--vocab-size", "x"): "argument --vocab-size: 'x' is not a number: give a whole number from 258 to 65536",
        ("--max-train-mb", "-1"): "argument --max-train-mb: -1 is out of range: give a number >= 0",
        ("--json", str(tmp_path / "data" / "meta.json" / "x.json")):
            f"argument --json: cannot write {tmp_path}/data/meta.json/x.json: {tmp_path}/data/meta.json is a file",
    }
    for flags, message in cases.items():
        with pytest.raises(SystemExit) as e:
            script.main(["--source", str(corpus_dir), "--data-dir", str(tmp_path / "data"), *flags])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1
    with pytest.raises(SystemExit):
        script.main(["--source", str(corpus_dir), "--data-dir", str(tmp_path / "data" / "meta.json")])
    assert "is a file: give a folder" in capsys.readouterr().err
    assert hashes(tmp_path) == before


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


@pytest.mark.parametrize("meta", ["null", "[]", '"text"', '{"vocab_size": -5}', '{"vocab_size": true}', "edited"])
def test_a_meta_json_that_is_not_ours_is_no_prepared_data_and_says_how_to_prepare(data_dir, tmp_path, meta):
    import shutil

    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    if meta == "edited":  # the vocabulary changed by hand, every other field as prepared: not the tokenizer's
        meta = json.dumps({**json.loads((copy / "meta.json").read_text()), "vocab_size": 9999})
    (copy / "meta.json").write_text(meta)
    assert read_meta(copy) is None
    with pytest.raises(SystemExit) as e:
        load_tokens(copy, "train")
    assert e.value.code == (f"error: the prepared data in {copy} is damaged (its meta.json, token files and "
                            "tokenizer do not agree): prepare it again from its source, `python scripts/prepare.py "
                            f"--source PATH --data-dir {copy} --force`")


def test_data_whose_meta_json_is_damaged_is_not_replaced_without_force(data_dir, corpus_dir, tmp_path):
    """Runs trained on it need its tokenizer: a damaged meta.json must not pass for no data at all."""
    import shutil

    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    (copy / "meta.json").write_text("")
    before = hashes(copy)
    with pytest.raises(SystemExit, match=f"^error: {copy} holds a tokenizer, but its meta.json is missing or "
                                         "damaged: .* pass --force to replace it$"):
        prepare(corpus_dir, copy, vocab_size=300, replace=False)
    assert hashes(copy) == before
    assert prepare(corpus_dir, copy, vocab_size=300, force=True)["vocab_size"] == 300 and read_meta(copy)


@pytest.mark.parametrize("script, args, made", [
    ("prepare.py", ["--source", "{corpus}", "--data-dir", "{tmp}/d"], "{tmp}/d"),
    ("export.py", ["{ckpt}", "{tmp}/hf", "--data-dir", "{data}"], "{tmp}/hf"),
])
def test_a_file_size_limit_is_one_line_and_nothing_half_written(script, args, made, corpus_dir, data_dir, tmp_path):
    """`ulimit -f`, or a file system's largest file: the write fails with EFBIG, not ENOSPC; one line all the same."""
    import resource

    from conftest import tiny_model

    from mvgpt.checkpoint import save_checkpoint
    from mvgpt.data import data_tokenizer_hash

    if script == "export.py":
        pytest.importorskip("safetensors", reason="export needs `pip install -e '.[export]'`")
    save_checkpoint(tmp_path / "run", tiny_model(vocab_size=300, block_size=32, n_embd=64), step=1,
                    tokenizer_hash=data_tokenizer_hash(data_dir))
    fill = {"corpus": corpus_dir, "tmp": tmp_path, "ckpt": tmp_path / "run", "data": data_dir}
    limit = 16 * 1024  # bytes: less than the training tokens (39 KB) or the weights need, more than the tokenizer
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *(a.format(**fill) for a in args)], capture_output=True,
        text=True, timeout=300, cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "a file grew past the size this system allows" in done.stderr and "Traceback" not in done.stderr
    assert not Path(made.format(**fill)).exists() or not any(Path(made.format(**fill)).iterdir())


def test_a_source_too_short_for_a_single_merge_is_refused_and_nothing_is_written(tmp_path):
    source = tmp_path / "two.txt"
    source.write_text("a\n<|endoftext|>\nb\n<|endoftext|>\n")
    with pytest.raises(SystemExit, match=f"^error: {source} is too short to learn a single merge \\(257 tokens, "
                                         "fewer than 258\\): give it more text$"):
        prepare(source, tmp_path / "d", vocab_size=300)
    assert not (tmp_path / "d" / "meta.json").exists()


def test_typed_from_inside_scripts_the_missing_data_says_to_run_from_the_root(data_dir, tmp_path, monkeypatch):
    (tmp_path / "data").symlink_to(data_dir)  # the repository's data/, beside scripts/
    (tmp_path / "scripts").mkdir()
    monkeypatch.chdir(tmp_path / "scripts")
    monkeypatch.setattr(sys, "argv", ["pretrain.py", "--rope"])
    assert no_data(DATA_DIR) == ("no prepared data in scripts/data: run the scripts from the repository's root: "
                                 "`cd .. && python scripts/pretrain.py --rope`")


def test_missing_data_offers_data_dir_only_where_it_was_not_passed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert no_data(DATA_DIR) == (f"no complete prepared data in {DATA_DIR}: run `python scripts/prepare.py --source "
                                 f"PATH --data-dir {DATA_DIR}` (or pass --data-dir)")
    (tmp_path / "elsewhere").mkdir()
    assert no_data(tmp_path / "elsewhere") == (f"no complete prepared data in {tmp_path / 'elsewhere'}: run `python "
                                               f"scripts/prepare.py --source PATH --data-dir {tmp_path / 'elsewhere'}`")


def test_a_data_dir_that_is_not_there_is_named_as_a_path_to_check(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert no_data("dat") == ("no folder dat: check --data-dir (the prepared data is where prepare.py wrote it, "
                              f"{DATA_DIR} by default), or prepare it there, `python scripts/prepare.py --source PATH "
                              "--data-dir dat`")
