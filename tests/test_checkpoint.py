import argparse
import logging
import os
import signal
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from conftest import tiny_model

from mvgpt.checkpoint import load_model, model_arg, read_checkpoint, save_checkpoint
from mvgpt.kit import io


@pytest.mark.parametrize("rope", [False, True])
def test_round_trip_gives_identical_logits(tmp_path, rope):
    model = tiny_model(rope=rope)
    path = save_checkpoint(tmp_path / "run", model, step=7, tokenizer_hash="abc")
    assert path == tmp_path / "run" / "ckpt.pt"
    again, state = load_model(tmp_path / "run", tokenizer_hash="abc")
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    assert again(idx)[0].equal(model(idx)[0])
    assert state["step"] == 7 and again.config == model.config
    assert not list((tmp_path / "run").glob(".*tmp*"))


def test_old_config_without_rope_loads_with_its_table(tmp_path, caplog):
    model = tiny_model()
    config = asdict(model.config)
    del config["rope"], config["rope_theta"], config["rope_linear_factor"]
    torch.save({"model": model.state_dict(), "config": config}, tmp_path / "old.pt")
    with caplog.at_level(logging.WARNING):
        again, _ = load_model(tmp_path / "old.pt")
    assert not again.config.rope and hasattr(again, "wpe")
    assert "rope" in caplog.text  # the patch is logged
    idx = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(0))
    assert again(idx)[0].equal(model(idx)[0])


def test_a_config_without_its_shapes_is_one_line_not_a_default_and_a_mismatch(tmp_path):
    model = tiny_model()
    config = asdict(model.config)
    del config["n_embd"]  # a default of 384 would only fail at the weights, after a misleading note
    torch.save({"model": model.state_dict(), "config": config}, tmp_path / "cut.pt")
    with pytest.raises(SystemExit) as e:
        load_model(tmp_path / "cut.pt")
    assert one_line_error(e).endswith("the checkpoint's config has no n_embd: the file is damaged or not mvGPT's")


def one_line_error(excinfo) -> str:
    message = str(excinfo.value.code)
    assert message.startswith("error:") and "\n" not in message
    return message


def test_missing_truncated_and_corrupt_checkpoints(tmp_path):
    with pytest.raises(SystemExit, match="no checkpoint at") as e:
        load_model(tmp_path / "nothing")
    one_line_error(e)
    path = save_checkpoint(tmp_path / "a.pt", tiny_model())
    data = path.read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(SystemExit, match="truncated or corrupt") as e:
        load_model(tmp_path / "truncated.pt")
    one_line_error(e)
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all" * 10)
    with pytest.raises(SystemExit, match="truncated or corrupt") as e:
        load_model(tmp_path / "garbage.pt")
    one_line_error(e)
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(SystemExit, match="not an mvGPT checkpoint"):
        load_model(tmp_path / "other.pt")


class Sneaky:  # a pickled object: loading it would run code, so weights_only refuses it
    pass


def test_pickled_code_is_never_loaded(tmp_path):
    torch.save({"model": {}, "config": {}, "payload": Sneaky()}, tmp_path / "evil.pt")
    with pytest.raises(SystemExit, match="truncated or corrupt"):
        read_checkpoint(tmp_path / "evil.pt")


def test_tokenizer_hash_mismatch_is_refused(tmp_path):
    save_checkpoint(tmp_path / "run", tiny_model(), tokenizer_hash="aaaa")
    with pytest.raises(SystemExit, match="trained with tokenizer aaaa, but the data read has bbbb") as e:
        load_model(tmp_path / "run", tokenizer_hash="bbbb")
    one_line_error(e)


def dead_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def test_temp_files_of_dead_writers_are_removed_by_the_next_save(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    stale = run / f".ckpt.pt.tmp{dead_pid()}"
    stale.write_bytes(b"half a checkpoint")
    live = run / f".ckpt.pt.tmp{os.getppid()}"  # a process still running may still be writing it
    live.write_bytes(b"being written")
    other = run / f".log.jsonl.tmp{dead_pid()}"  # another file's temp: not this write's business
    other.write_bytes(b"x")
    save_checkpoint(run, tiny_model())
    assert sorted(p.name for p in run.iterdir()) == sorted(["ckpt.pt", live.name, other.name])


KILLED_MID_SAVE = """
import sys, time, torch
sys.path.insert(0, {root!r}); sys.path.insert(0, {root!r} + "/tests")
from conftest import tiny_model
from mvgpt import checkpoint
def half_then_hang(state, f):
    f.write(b"PK half a zip"); f.flush()
    print("writing", flush=True)
    time.sleep(60)
checkpoint.torch.save = half_then_hang
checkpoint.save_checkpoint({run!r}, tiny_model(seed=1))
"""


def test_kill_9_mid_save_keeps_the_previous_checkpoint_and_the_next_save_cleans_up(tmp_path):
    run = tmp_path / "run"
    save_checkpoint(run, tiny_model(seed=0), step=1)
    before = (run / "ckpt.pt").read_bytes()
    code = KILLED_MID_SAVE.format(root=str(Path(__file__).resolve().parents[1]), run=str(run))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "writing\n"
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert (run / "ckpt.pt").read_bytes() == before  # intact, and still loads
    assert read_checkpoint(run)["step"] == 1
    assert [p.name for p in run.glob(".ckpt.pt.tmp*")] == [f".ckpt.pt.tmp{child.pid}"]
    save_checkpoint(run, tiny_model(seed=2), step=2)
    assert sorted(p.name for p in run.iterdir()) == ["ckpt.pt"] and read_checkpoint(run)["step"] == 2


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_full_disk_is_one_line_that_says_disk_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    run = tmp_path / "run"
    save_checkpoint(run, tiny_model(seed=0), step=1)
    before = (run / "ckpt.pt").read_bytes()
    # every write of the checkpoint goes to /dev/full, where the kernel answers ENOSPC
    monkeypatch.setattr(io, "open", lambda path, mode: open("/dev/full", mode), raising=False)  # write_state's
    with pytest.raises(SystemExit, match="the disk is full") as e:
        save_checkpoint(run, tiny_model(seed=1), step=2)
    one_line_error(e)
    assert (run / "ckpt.pt").read_bytes() == before and [p.name for p in run.iterdir()] == ["ckpt.pt"]


def test_unwritable_place_is_one_line(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(SystemExit, match=r"cannot write .*pick a folder you can write") as e:
        save_checkpoint(tmp_path / "file" / "run", tiny_model())
    one_line_error(e)
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(SystemExit, match="Permission denied") as e:
            save_checkpoint(locked, tiny_model())
        one_line_error(e)


def save_with_config(path, model, **config):
    state = {"model": model.state_dict(), "config": {**asdict(model.config), **config}}
    torch.save(state, path)
    return path


@pytest.mark.parametrize("config, message", [
    (dict(n_layer=-1), "n_layer=-1, which no model can have"),
    (dict(n_head=0), "n_head=0, which no model can have"),
    (dict(vocab_size="64"), "vocab_size='64', which no model can have"),
    (dict(rope_theta=float("nan")), "rope_theta=nan, which no model can have"),
    (dict(rope=1), "rope=1, which no model can have"),
    (dict(n_head=3), "inconsistent"),  # 32 channels do not split into 3 heads
    (dict(n_layer=10**6, n_embd=2**16, n_head=2**8), "does not match its config"),  # terabytes, never built
    (dict(n_embd=64), "does not match its config"),  # weights of 32 channels
])
def test_insane_configs_are_refused_before_anything_is_allocated(tmp_path, config, message):
    path = save_with_config(tmp_path / "crafted.pt", tiny_model(), **config)
    with pytest.raises(SystemExit, match=message) as e:
        load_model(path)
    one_line_error(e)


def test_a_config_too_big_for_the_machine_is_refused(tmp_path):
    # a rope model has no table of positions, so its weights fit any block size: only the size says no
    path = save_with_config(tmp_path / "huge.pt", tiny_model(rope=True), block_size=2**40)
    with pytest.raises(SystemExit, match=r"asks for [\d,.]+ GiB .*block_size=1099511627776.*crafted") as e:
        load_model(path)
    one_line_error(e)


@pytest.mark.parametrize("free, said", [(0, "the disk is full: "), (1 << 40, "torch's writer stopped: ")])
def test_a_write_that_fails_inside_torchs_zip_writer_is_one_line_and_keeps_the_previous(tmp_path, monkeypatch,
                                                                                         free, said):
    run = tmp_path / "run"
    save_checkpoint(run, tiny_model(seed=0), step=1)
    before = (run / "ckpt.pt").read_bytes()

    def stopped(state, f):  # what torch says when the disk fills under its zip writer
        f.write(b"PK partial")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(io.torch, "save", stopped)
    monkeypatch.setattr(io, "free_bytes", lambda folder: free)
    with pytest.raises(SystemExit) as e:
        save_checkpoint(run, tiny_model(seed=1), step=2)
    one_line_error(e)
    assert said in str(e.value.code) and "the previous checkpoint, if any, is kept" in str(e.value.code)
    assert (run / "ckpt.pt").read_bytes() == before and [p.name for p in run.iterdir()] == ["ckpt.pt"]


def test_a_checkpoint_with_a_non_finite_weight_is_refused_in_one_line(tmp_path):
    model = tiny_model()
    with torch.no_grad():
        model.blocks[0].mlp.fc.weight[0, 0] = float("nan")
    save_checkpoint(tmp_path / "run", model, step=1)
    with pytest.raises(SystemExit) as e:
        load_model(tmp_path / "run")
    assert e.value.code == (f"error: checkpoint {tmp_path / 'run' / 'ckpt.pt'} holds non-finite weights "
                            "(blocks.0.mlp.fc.weight): it cannot be read; use an earlier checkpoint, or train again "
                            "with a lower --lr")


@pytest.mark.parametrize("vocab, hashed", [(64, False), (400, False), (64, True)])
def test_a_checkpoint_whose_vocabulary_is_not_the_datas_is_one_line(data_dir, tmp_path, vocab, hashed):
    """Fewer ids: the data's tokens index past the table. More: sampling writes ids no tokenizer decodes.
    A crafted checkpoint can even record the data's tokenizer hash with another vocabulary."""
    from mvgpt.data import data_tokenizer_hash

    tok_hash = data_tokenizer_hash(data_dir)
    save_checkpoint(tmp_path / "old", tiny_model(vocab_size=vocab), step=1, tokenizer_hash=tok_hash if hashed else None)
    with pytest.raises(SystemExit) as e:
        load_model(tmp_path / "old", "cpu", tok_hash)
    assert e.value.code == (f"error: checkpoint {tmp_path / 'old' / 'ckpt.pt'} reads {vocab} token ids, but the "
                            "data's tokenizer makes 300: pass the --data-dir it was trained with")
    save_checkpoint(tmp_path / "same", tiny_model(vocab_size=300), step=1)  # the data's vocabulary: reads
    assert load_model(tmp_path / "same", "cpu", tok_hash)[0].config.vocab_size == 300


def test_one_model_named_twice_is_read_once_and_the_repeat_said(tmp_path):
    from mvgpt.checkpoint import find_models

    save_checkpoint(tmp_path / "run", tiny_model(), step=1)
    save_checkpoint(tmp_path / "other", tiny_model(), step=1)
    run = str(tmp_path / "run")
    models, skipped = find_models([run, run + "/", f"{run}/ckpt.pt", str(tmp_path / "other")])
    assert [m.given for m in models] == [run, str(tmp_path / "other")]
    assert skipped == [f"{run}/ (the same model as {run})", f"{run}/ckpt.pt (the same model as {run})"]


def test_a_blank_path_is_named_as_blank_not_read_as_the_folder_the_script_runs_in(tmp_path, monkeypatch):
    from mvgpt.checkpoint import find_models

    save_checkpoint(tmp_path, tiny_model(), step=1)  # a checkpoint in the very folder "" would have meant
    monkeypatch.chdir(tmp_path)
    models, skipped = find_models(["", " "])
    assert models == []
    assert skipped == ["'' (an empty path: name a run folder or a .pt file)",
                       "' ' (an empty path: name a run folder or a .pt file)"]
    for arg in ("", " "):  # sample.py's and finetune.py's argument: not ckpt.pt in the folder it runs in
        with pytest.raises(argparse.ArgumentTypeError, match=f"^{arg!r} is an empty path: name a run folder or a .pt "
                           "file$"):
            model_arg(arg)


def test_a_path_with_nothing_there_is_named_as_a_path_to_check(tmp_path):
    from mvgpt.checkpoint import find_models

    models, skipped = find_models([str(tmp_path / "pretrain-rop")])
    assert models == [] and skipped == [f"{tmp_path / 'pretrain-rop'} (nothing there: check the path; `ls checkpoints` "
                                        "lists the run folders)"]


def test_a_quoted_message_is_cut_at_a_word():
    from mvgpt.kit.io import clip

    assert clip("short") == "short"
    assert clip("one two three four", 9) == "one two ..."
    assert clip("one, two three", 5) == "one ..."
    assert clip("x" * 30, 10) == "x" * 10 + " ..."  # no space to cut at: the characters
