import json
import os
import signal
import subprocess
import sys
import time

import pretrain
import pytest
import torch
from conftest import ROOT

from mvgpt.checkpoint import load_model, read_checkpoint

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16", "--batch-size", "4",
        "--eval-batches", "2", "--eval-every", "3", "--warmup", "2", "--minutes", "0"]


def train(root, name, *extra) -> dict:
    return pretrain.main([*TINY, "--data-dir", str(root.parent / "data"), "--out-dir", str(root / name),
                          "--runs-dir", str(root / "runs"), *extra])


def losses(run_dir) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]


def script(*args) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, str(ROOT / "scripts" / "pretrain.py"), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture
def root(data_dir, tmp_path):
    """A folder for runs, with the test corpus's data beside it (root/../data)."""
    (tmp_path / "data").symlink_to(data_dir)
    (tmp_path / "here").mkdir()
    return tmp_path / "here"


def run_args(root, name, *extra) -> list[str]:
    return [*TINY, "--data-dir", str(root.parent / "data"), "--out-dir", str(root / name),
            "--runs-dir", str(root / "runs"), *extra]


def test_same_seed_same_losses_and_both_kinds_share_batches(root):
    a = train(root, "a", "--max-steps", "4")
    b = train(root, "b", "--max-steps", "4")
    assert losses(root / "a") == losses(root / "b") and a["val_loss"] == b["val_loss"]
    train(root, "c", "--max-steps", "4", "--seed", "2")
    assert losses(root / "c") != losses(root / "a")
    rope = train(root, "r", "--max-steps", "4", "--rope")
    assert rope["params"] == a["params"] - 16 * 32
    assert (a["run"], rope["run"]) == ("pretrain", "pretrain-rope")


def test_kill_and_resume_continues_as_if_never_stopped(root):
    train(root, "whole", "--max-steps", "6", "--ckpt-every", "2")
    args = run_args(root, "split", "--max-steps", "6", "--ckpt-every", "2")
    killed = script(*args, "--kill-at-step", "5")
    killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL
    assert read_checkpoint(root / "split")["step"] == 4  # step 5 was lost with the kill
    pretrain.main([*args, "--resume"])
    whole, split = losses(root / "whole"), losses(root / "split")
    assert len(split) == 6
    torch.testing.assert_close(torch.tensor(split), torch.tensor(whole), atol=1e-6, rtol=0)
    a, b = read_checkpoint(root / "whole"), read_checkpoint(root / "split")
    for name, value in a["model"].items():
        assert value.equal(b["model"][name]), name


def test_ctrl_c_saves_before_it_exits(root):
    proc = script(*run_args(root, "int", "--max-steps", "100000", "--ckpt-every", "100000"))
    log = root / "int" / "log.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 3):
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert "continue with --resume" in out
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    assert read_checkpoint(root / "int")["step"] == steps[-1] >= 3


def test_a_loss_that_blows_up_stops_the_run_and_keeps_the_last_checkpoint(root):
    with pytest.raises(SystemExit, match="loss became"):
        train(root, "nan", "--max-steps", "50", "--lr", "1e30", "--warmup", "1", "--ckpt-every", "1",
              "--grad-clip", "0")
    state = read_checkpoint(root / "nan")
    assert state["step"] >= 1
    assert all(torch.isfinite(v).all() for v in state["model"].values())


def test_init_from_with_a_longer_context(root):
    train(root, "base", "--max-steps", "2", "--rope")
    out = train(root, "long", "--max-steps", "2", "--init-from", str(root / "base"), "--block-size", "32",
                "--rope-scaling", "linear")
    assert out["run"] == "pretrain-rope-ctx32-linear"
    model, _ = load_model(root / "long")
    assert model.config.block_size == 32 and model.config.rope_linear_factor == 2.0
    train(root, "learned", "--max-steps", "1")
    with pytest.raises(SystemExit, match="learned positions"):
        train(root, "x", "--max-steps", "1", "--init-from", str(root / "learned"), "--block-size", "32")


def test_tensorboard_events_are_written(root):
    train(root, "tb", "--max-steps", "3")
    assert list((root / "runs" / "tb").glob("events.out.tfevents.*"))


def test_two_processes_with_torchrun(root):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "scripts" / "pretrain.py"), *run_args(root, "ddp", "--max-steps", "12", "--lr", "3e-3")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT)))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    _, state = load_model(root / "ddp")
    assert state["step"] == 12
    record = losses(root / "ddp")
    assert sum(record[-3:]) / 3 < sum(record[:3]) / 3  # the loss falls
