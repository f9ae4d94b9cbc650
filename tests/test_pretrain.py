import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pretrain
import pytest
import torch
from conftest import ROOT

from mvgpt.checkpoint import load_model, read_checkpoint, save_checkpoint
from mvgpt.data import get_batch, load_tokens
from mvgpt.model import GPT, GPTConfig
from mvgpt.train import cosine, lr_at

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


def test_eval_at_adds_evaluations_and_leaves_the_training_alone(root):
    every = train(root, "every", "--max-steps", "6", "--eval-every", "1")
    some = train(root, "some", "--max-steps", "6", "--eval-at", "1", "2", "5")  # and every 3rd, and the last
    assert [e["step"] for e in some["evals"]] == [1, 2, 3, 5, 6]
    by_step = {e["step"]: e for e in every["evals"]}
    assert all(e == by_step[e["step"]] for e in some["evals"])
    assert losses(root / "some") == losses(root / "every")


def test_same_seed_same_losses_and_both_kinds_share_batches(root):
    a = train(root, "a", "--max-steps", "4")
    b = train(root, "b", "--max-steps", "4")
    assert losses(root / "a") == losses(root / "b") and a["val_loss"] == b["val_loss"]
    train(root, "c", "--max-steps", "4", "--seed", "2")
    assert losses(root / "c") != losses(root / "a")
    rope = train(root, "r", "--max-steps", "4", "--rope")
    assert rope["params"] == a["params"] - 16 * 32
    assert (a["run"], rope["run"]) == ("pretrain", "pretrain-rope")


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_kill_and_resume_continues_as_if_never_stopped(root, optimizer):
    args = run_args(root, "split", "--max-steps", "300", "--ckpt-every", "2", "--eval-every", "100",
                    "--threads", "1", "--optimizer", optimizer)  # one thread: the same sums in both runs
    killed = script(*args)
    for line in killed.stdout:  # kill -9 from outside as soon as a checkpoint is on disk
        if "checkpoint saved" in line:
            killed.kill()
            break
    killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL
    at = read_checkpoint(root / "split")["step"]
    assert 2 <= at < 300 and not (root / "split" / "ckpt.pt.tmp").exists()
    pretrain.main([*args[:-2], "--resume"])  # the dead process's lock is taken over; the run keeps its optimizer
    train(root, "whole", "--max-steps", "300", "--ckpt-every", "2", "--eval-every", "100", "--threads", "1",
          "--optimizer", optimizer)
    whole, split = losses(root / "whole"), losses(root / "split")
    assert len(split) == 300
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
    train(root, "nan", "--max-steps", "4")
    before = (root / "nan" / "ckpt.pt").read_bytes()
    with pytest.raises(SystemExit, match="the run has diverged and stops; the checkpoint of step 4 in"):
        train(root, "nan", "--max-steps", "50", "--lr", "1e30", "--warmup", "1", "--ckpt-every", "1",
              "--grad-clip", "0", "--resume")
    assert (root / "nan" / "ckpt.pt").read_bytes() == before
    with pytest.raises(SystemExit, match="before any checkpoint was saved: run again with a lower --lr"):
        train(root, "fresh", "--max-steps", "50", "--lr", "1e30", "--warmup", "1", "--ckpt-every", "1",
              "--grad-clip", "0")
    assert not (root / "fresh" / "ckpt.pt").exists()


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


def free_port() -> int:
    """A free port of our own for a rendezvous, whatever ran before this test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_group(cmd: list[str], env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    """subprocess.run in a session of its own: on a timeout every process it started is killed too
    (torchrun's workers would outlive it, and slow every test after)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{cmd[:4]}... hung for {timeout} s:\n{out[-2000:]}{err[-2000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_two_processes_with_torchrun(root):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--nproc_per_node", "2",
           str(ROOT / "scripts" / "pretrain.py"), *run_args(root, "ddp", "--max-steps", "12", "--lr", "3e-3")]
    result = run_group(cmd, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT)))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    _, state = load_model(root / "ddp")
    assert state["step"] == 12
    record = losses(root / "ddp")
    assert sum(record[-3:]) / 3 < sum(record[:3]) / 3  # the loss falls


RANKS = """
import signal, sys, torch, torch.distributed as dist, pretrain
dist.init_process_group("gloo")
rank = dist.get_rank()
stop = pretrain.StopSignals()
stop.signal = signal.SIGINT if rank == {signalled} else None
elapsed, stopping = stop.agree(10.0 + rank, torch.device("cpu"))
loss = pretrain.mean_over_ranks(float("inf") if rank == 1 else 2.0, torch.device("cpu"))
print(rank, elapsed, stopping, loss)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("signalled", [None, 0, 1])
def test_every_rank_follows_rank_0s_clock_stops_on_any_signal_and_sees_a_bad_loss(signalled):
    """Under DDP the schedule reads rank 0's clock on every rank (else the learning rates part and the
    ranks stop at different steps, one waiting for the other for good); a signal to any rank stops
    all at the same step; a non-finite loss on any rank reaches all, so all stop together."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "scripts"), WORLD_SIZE="2",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    procs = [subprocess.Popen([sys.executable, "-c", RANKS.format(signalled=signalled)], text=True,
                              env=dict(env, RANK=str(rank)), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for rank in (0, 1)]
    try:
        lines = [p.communicate(timeout=120)[0].strip() for p in procs]
    finally:  # neither outlives the test, whatever happened
        for p in procs:
            p.kill()
    assert lines == [f"{rank} 10.0 {signalled is not None} inf" for rank in (0, 1)]


def test_alone_the_clock_and_a_signal_are_the_process_own():
    stop = pretrain.StopSignals()
    assert stop.agree(12.5, torch.device("cpu")) == (12.5, False)
    stop.signal = signal.SIGTERM
    assert stop.agree(12.5, torch.device("cpu")) == (12.5, True)


class FakeClock:
    """pretrain.clock, advancing `tick` seconds a call: the schedule's clock without waiting for it.
    With `interrupt_at`, the call of that number raises SIGINT, as Ctrl-C would mid-run."""

    def __init__(self, tick: float, interrupt_at: int | None = None) -> None:
        self.now, self.tick, self.calls, self.interrupt_at = 0.0, tick, 0, interrupt_at

    def __call__(self) -> float:
        self.calls += 1
        if self.calls == self.interrupt_at:
            signal.raise_signal(signal.SIGINT)
        self.now += self.tick
        return self.now


def records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]


def test_lr_schedule_by_steps_and_by_the_clock():
    lr = lambda step, **kw: lr_at(step, 1.0, 10, 0.1, **kw)  # noqa: E731
    assert [lr(s, max_steps=110) for s in (0, 4, 9)] == [0.1, 0.5, 1.0]  # warm-up by steps, either way
    assert [lr(s, budget=60.0, elapsed=0.0) for s in (0, 9)] == [0.1, 1.0]
    assert lr(10, max_steps=110) == 1.0 and math.isclose(lr(60, max_steps=110), 0.55)
    assert lr(110, max_steps=110) == lr(500, max_steps=110) == pytest.approx(0.1)
    # after the warm-up the clock decides: half the budget gone, the cosine is half way down
    assert lr(10, budget=60.0, elapsed=0.0) == 1.0
    assert lr(11, budget=60.0, elapsed=30.0) == lr(5000, budget=60.0, elapsed=30.0) == pytest.approx(0.55)
    assert lr(12, budget=60.0, elapsed=60.0) == lr(12, budget=60.0, elapsed=75.0) == pytest.approx(0.1)


def test_a_run_bounded_by_time_follows_the_clock(root, monkeypatch):
    monkeypatch.setattr(pretrain, "clock", FakeClock(0.5))
    out = train(root, "clock", "--minutes", "0.1", "--warmup", "2", "--eval-every", "5")  # 6 s, 0.5 s a step
    log = [r for r in records(root / "clock") if "loss" in r]
    before = [0.0] + [r["elapsed"] for r in log[:-1]]  # the clock when each step began
    for r, t in zip(log, before, strict=True):  # the pace: 0.5 s, from the second step on (the first is off it)
        assert r["lr"] == lr_at(r["step"] - 1, 2e-3, 2, 0.1, None, t, 6.0, 0.5 if r["step"] > 2 else None)
    assert before[-1] < 6.0 <= log[-1]["elapsed"]  # it stopped when the time was up, not before
    after_warmup = [r["lr"] for r in log[2:]]
    assert after_warmup == sorted(after_warmup, reverse=True) and after_warmup[-1] < 2e-3 / 4
    assert out["steps"] == log[-1]["step"] == 10  # 10 steps and 2 evaluations of 0.5 s
    assert out["seconds"] == 6.0 and [e["step"] for e in out["evals"]] == [5, 10]


def test_bounded_by_the_clock_the_warm_up_is_the_lesser_of_its_steps_and_a_share_of_the_budget():
    from mvgpt.train import WARMUP_SHARE

    lr = lambda step, **kw: lr_at(step, 1.0, 200, 0.1, budget=600.0, **kw)  # noqa: E731
    # 4 s a step: half of ten minutes holds 75 steps, so the warm-up is 75 steps, not 200
    assert WARMUP_SHARE * 600.0 / 4.0 == 75
    assert [lr(s, elapsed=4.0 * s, step_seconds=4.0) for s in (0, 74)] == [1 / 75, 1.0]
    assert lr(75, elapsed=300.0, step_seconds=4.0) == 1.0  # then the cosine, from the peak over the 300 s left
    assert lr(75, elapsed=450.0, step_seconds=4.0) == cosine(0.5, 0.1)
    # 0.5 s a step: 200 steps take 100 s, inside the share: the steps end it, as without a pace
    assert [lr(s, elapsed=0.5 * s, step_seconds=0.5) for s in (0, 99, 199, 200, 700)] == [
        1 / 200, 0.5, 1.0, 1.0, cosine(250 / 500, 0.1)]
    assert [lr(s, elapsed=0.5 * s) for s in (0, 99, 199)] == [1 / 200, 0.5, 1.0]
    assert lr(0, elapsed=0.0, step_seconds=1e6) == 1.0  # a step longer than the share: at the peak at once
    # bounded by steps, the pace changes nothing
    assert lr_at(5, 1.0, 200, 0.1, max_steps=1000, step_seconds=4.0) == lr_at(5, 1.0, 200, 0.1, max_steps=1000)
    assert lr(29, elapsed=116.0, step_seconds=4.0, share=0.0) == 30 / 200  # share 0: the steps alone


@pytest.mark.parametrize("tick, warmup, leaves_at", [
    (0.1, 200, 30),  # slow: 60 steps in the 6 s, the warm-up ends when half the time is gone (3 s)
    (0.02, 5, 5),  # fast: 300 steps, its 5 warm-up steps end before the share does, as they always did
])
def test_a_run_bounded_by_time_leaves_its_warm_up_in_time_and_ends_at_the_floor(root, monkeypatch, tick, warmup,
                                                                               leaves_at):
    monkeypatch.setattr(pretrain, "clock", FakeClock(tick))
    train(root, "run", "--minutes", "0.1", "--warmup", str(warmup), "--eval-every", "1000", "--ckpt-every", "1000")
    log = [r for r in records(root / "run") if "loss" in r]
    rates = [r["lr"] for r in log]
    peak = rates.index(max(rates))  # the last warm-up step (one more where the pace's float rounding says so)
    assert max(rates) == 2e-3 and peak in (leaves_at - 1, leaves_at)
    assert rates[: peak + 1] == sorted(rates[: peak + 1])  # up, then down to the floor when the time is up
    assert rates[peak:] == sorted(rates[peak:], reverse=True)
    assert log[-1]["elapsed"] >= 6.0 and rates[-1] == pytest.approx(2e-4, rel=0.01)
    before = [0.0] + [r["elapsed"] for r in log[:-1]]  # the clock when each step began
    if warmup == 5:  # where the steps bound it, the warm-up is its steps; the cosine runs over the time after them
        assert rates == pytest.approx([lr_at(r["step"] - 1, 2e-3, warmup, 0.1, None, t, 6.0, tick if r["step"] > 2
                                             else None) for r, t in zip(log, before, strict=True)], rel=1e-9)
        assert rates[warmup] == 2e-3  # the first step after it: at the peak
    else:  # a fixed-step warm-up would still be climbing when the time is up: --warmup-share 0 keeps it
        assert lr_at(len(log) - 1, 2e-3, warmup, 0.1, None, before[-1], 6.0) < 2e-3 / 3
        monkeypatch.setattr(pretrain, "clock", FakeClock(tick))
        train(root, "fixed", "--minutes", "0.1", "--warmup", str(warmup), "--eval-every", "1000", "--ckpt-every",
              "1000", "--warmup-share", "0")
        fixed = [r["lr"] for r in records(root / "fixed") if "loss" in r]
        assert fixed == [2e-3 * min(1.0, (s + 1) / warmup) for s in range(len(fixed))] and fixed[-1] < 2e-3 / 3


def test_a_checkpoint_keeps_the_pace_its_schedule_read_and_one_from_before_reads_its_clock(root, monkeypatch):
    monkeypatch.setattr(pretrain, "clock", FakeClock(0.5))
    train(root, "r", "--minutes", "0.1", "--warmup", "2", "--eval-every", "5")  # 10 steps: all but the first timed
    state = read_checkpoint(root / "r")
    assert state["step"] == 10 and state["step_seconds"] == [4.5, 9]
    del state["step_seconds"]  # a checkpoint saved before the pace was kept
    torch.save(state, root / "r" / "ckpt.pt")
    monkeypatch.setattr(pretrain, "clock", FakeClock(0.5))
    out = train(root, "r", "--minutes", "0.2", "--warmup", "2", "--eval-every", "5", "--resume")
    timed = out["steps"] - 11  # this process's steps after its first (step 11), on the old run's whole clock
    assert timed > 0 and read_checkpoint(root / "r")["step_seconds"] == [6.0 + 0.5 * timed, 10 + timed]


def test_a_bare_resume_keeps_the_runs_own_limits(root, monkeypatch):
    def bare(name: str, *extra: str) -> list[str]:  # TINY's flags but its --minutes 0: no limit typed
        argv = run_args(root, name, "--resume", *extra)
        i = argv.index("--minutes")
        return argv[:i] + argv[i + 2:]

    monkeypatch.setattr(pretrain, "clock", FakeClock(100.0))  # were the limit ten minutes, 6 steps more
    train(root, "steps", "--max-steps", "2")
    out = pretrain.main(bare("steps"))
    assert out["steps"] == 2 and (out["args"]["max_steps"], out["args"]["minutes"]) == (2, 0.0)
    monkeypatch.setattr(pretrain, "clock", FakeClock(0.5))
    done = train(root, "clock", "--minutes", "0.1")["steps"]  # its 6 s are up
    monkeypatch.setattr(pretrain, "clock", FakeClock(0.5))
    out = pretrain.main(bare("clock"))
    assert out["steps"] == done and (out["args"]["max_steps"], out["args"]["minutes"]) == (None, 0.1)
    out = pretrain.main(bare("clock", "--minutes", "0.15"))  # a limit typed: that one
    assert out["steps"] > done and out["args"]["minutes"] == 0.15
    state = read_checkpoint(root / "clock")
    for limits in ({"minutes": float("nan")}, {"minutes": "0.1"}, {"minutes": 0, "max_steps": None},
                   {"minutes": 0.1, "max_steps": True}):  # a limit no run saves: asked for, not ten minutes
        torch.save({**state, "args": {**state["args"], **limits}}, root / "clock" / "ckpt.pt")
        with pytest.raises(SystemExit, match=r"^error: the checkpoint does not say how long its run was to train "
                                             r"\(max_steps=.*: give the limit, --minutes N or --max-steps N, with "
                                             r"--resume$"):
            pretrain.main(bare("clock"))
    torch.save({**state, "args": [1]}, root / "clock" / "ckpt.pt")  # not a dict at all: the same line
    with pytest.raises(SystemExit, match="does not say how long its run was to train"):
        pretrain.main(bare("clock"))


def test_resume_continues_the_clock(root, monkeypatch):
    args = ("--minutes", "0.1", "--warmup", "2", "--eval-every", "5", "--ckpt-every", "100")
    monkeypatch.setattr(pretrain, "clock", FakeClock(0.5))
    train(root, "whole", *args)
    monkeypatch.setattr(pretrain, "clock", FakeClock(0.5, interrupt_at=14))  # Ctrl-C in step 6
    with pytest.raises(SystemExit) as stopped:
        train(root, "split", *args)
    assert stopped.value.code == 130 and read_checkpoint(root / "split")["step"] == 6
    monkeypatch.setattr(pretrain, "clock", FakeClock(0.5))
    train(root, "split", *args, "--resume")
    whole, split = records(root / "whole"), records(root / "split")
    clock_of = lambda log: [(r["step"], r.get("lr"), r["elapsed"]) for r in log]  # noqa: E731
    assert clock_of(split) == clock_of(whole)
    assert losses(root / "split") == losses(root / "whole")


def test_max_steps_keeps_the_schedule_exact_whatever_the_clock(root, monkeypatch):
    monkeypatch.setattr(pretrain, "clock", FakeClock(0.01))
    train(root, "fast", "--max-steps", "6")
    monkeypatch.setattr(pretrain, "clock", FakeClock(100.0))  # a slow machine: --minutes is not in play
    out = train(root, "slow", "--max-steps", "6", "--minutes", "0")
    assert out["steps"] == 6
    assert [r.get("lr") for r in records(root / "slow")] == [r.get("lr") for r in records(root / "fast")]
    assert losses(root / "slow") == losses(root / "fast")
    assert [r["lr"] for r in records(root / "slow") if "lr" in r] == [lr_at(s, 2e-3, 2, 0.1, 6) for s in range(6)]


@pytest.mark.parametrize("flags, compiled", [
    (["--minutes", "10", "--dtype", "bfloat16"], True),  # the episode's ten minutes: compiling pays
    (["--minutes", "10", "--dtype", "bfloat16", "--no-compile"], False),
    (["--minutes", "10", "--dtype", "float32"], False),  # float32 on a CPU: it does not
    (["--minutes", "4", "--dtype", "bfloat16"], False),  # too short to earn the compile time back
    (["--max-steps", "4", "--dtype", "bfloat16"], False),  # bounded by steps: as asked
    (["--max-steps", "4", "--dtype", "float32", "--compile"], True),
])
def test_the_step_is_compiled_where_it_pays_unless_asked(root, monkeypatch, capsys, flags, compiled):
    compiles = []
    monkeypatch.setattr(pretrain.torch, "compile", lambda model: compiles.append(model) or model)  # no inductor
    monkeypatch.setattr("mvgpt.perf.measure.shutil.which", lambda name: f"/usr/bin/{name}")  # a C++ compiler is there
    (root / "include").mkdir()
    (root / "include" / "Python.h").write_text("")  # and Python's headers
    monkeypatch.setattr("mvgpt.perf.measure.sysconfig.get_paths", lambda: {"include": str(root / "include")})
    monkeypatch.setattr(pretrain, "clock", FakeClock(100.0))  # 100 s a step: ten minutes in a few steps
    out = train(root, "run", *flags)
    assert out["args"]["compile"] is compiled and len(compiles) == compiled
    said = capsys.readouterr().out.splitlines()
    assert said[0].endswith(f"{'compiled' if compiled else 'eager'}, 1 process(es)")
    assert ("the first step compiles the model" in said[1]) is compiled  # why the bar stands still a while
    assert read_checkpoint(root / "run")["args"]["compile"] is compiled  # what the run did, kept with it


def test_bf16_autocast_tracks_float32(root):
    """Mixed precision keeps float32 weights and loss: over 8 steps of a tiny model the bf16 losses
    stay within 0.002 of float32's (measured here: 1e-4), and the weights stay float32."""
    fp32 = train(root, "fp32", "--max-steps", "8", "--dtype", "float32")
    bf16 = train(root, "bf16", "--max-steps", "8", "--dtype", "bfloat16")
    assert (fp32["dtype"], bf16["dtype"]) == ("float32", "bfloat16")
    a, b = losses(root / "fp32"), losses(root / "bf16")
    assert a != b  # the products did run in bf16
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 0.002, (a, b)
    assert abs(fp32["val_loss"] - bf16["val_loss"]) < 0.002
    state = read_checkpoint(root / "bf16")
    assert state["args"]["dtype"] == "bfloat16"
    assert all(v.dtype == torch.float32 for v in state["model"].values() if v.is_floating_point())


def test_the_logged_gradient_norm_is_the_steps_before_clipping(root):
    """Resumed at step 2, the record of step 3 holds the norm of the gradient of step 3's batch at the
    weights the checkpoint kept, clipped or not (--grad-clip 0 measures it all the same)."""
    flags = ("--dtype", "float32", "--no-compile")
    train(root, "g", "--max-steps", "2", *flags)
    state = read_checkpoint(root / "g")
    model = load_model(root / "g")[0]  # float32, eval mode: the tiny model has no dropout to switch off
    x, y = get_batch(load_tokens(root.parent / "data", "train"), 4, 16, 1337, 2)
    model(x, y)[1].backward()
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])).item()
    for clip in ("1.0", "0"):
        shutil.copytree(root / "g", root / f"g{clip}")
        train(root, f"g{clip}", "--max-steps", "3", "--resume", "--grad-clip", clip, *flags)
        logged = [json.loads(line) for line in (root / f"g{clip}" / "log.jsonl").read_text().splitlines()]
        assert [r["step"] for r in logged if "grad_norm" in r] == [1, 2, 3]
        assert logged[-1]["grad_norm"] == pytest.approx(norm, rel=1e-5) and norm > 1.0  # above the clip
    assert state["step"] == 2


def test_json_summary(root):
    out = root / "results" / "run.json"
    summary = train(root, "j", "--max-steps", "4", "--json", str(out), "--dtype", "float32")
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(summary))
    assert saved["command"].startswith("python scripts/pretrain.py ") and "--json" in saved["command"]
    assert (saved["kind"], saved["steps"], saved["tokens"], saved["dtype"]) == ("learned", 4, 4 * 4 * 16, "float32")
    assert [e["step"] for e in saved["evals"]] == [3, 4]
    assert saved["val_loss"] == saved["evals"][-1]["val_loss"] and saved["tokens_per_s"] > 0
    assert saved["args"]["max_steps"] == 4 and "cpu" in saved["machine"]


def test_an_unwritable_json_path_fails_before_training(root, capsys):
    (root / "file").write_text("")
    with pytest.raises(SystemExit) as e:
        train(root, "w", "--max-steps", "4", "--json", str(root / "file" / "run.json"))
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith(
        f"error: argument --json: cannot write {root / 'file' / 'run.json'}: {root / 'file'} is a file, not a folder "
        "(see "), err  # (see PROG --help): PROG is how pytest was started
    assert not (root / "w").exists()


BAD_FLAGS = [
    ["--batch-size", "0"], ["--eval-every", "0"], ["--ckpt-every", "0"], ["--seed", "-1"], ["--lr", "nan"],
    ["--lr", "0"], ["--grad-clip", "-1"], ["--min-lr-ratio", "-3"], ["--min-lr-ratio", "1.5"], ["--block-size", "0"],
    ["--minutes", "nan"], ["--minutes", "-1"], ["--minutes", "inf"], ["--max-steps", "0"], ["--warmup", "-1"],
    ["--eval-batches", "0"], ["--weight-decay", "-0.1"], ["--n-head", "5"], ["--rope-factor", "0"],
    ["--minutes", "0", "--max-steps", "-5"], ["--dtype", "float16"], ["--resume", "--overwrite"],
    ["--warmup-share", "1.5"], ["--warmup-share", "-0.1"],
]


@pytest.mark.parametrize("bad", BAD_FLAGS, ids=lambda bad: " ".join(bad))
def test_a_bad_flag_is_one_line_and_exit_2_before_any_work(root, capsys, bad):
    (root / "old").mkdir()
    (root / "old" / "ckpt.pt").write_bytes(b"a run")  # nothing may touch it
    (root / "old" / "log.jsonl").write_text("{}\n")
    with pytest.raises(SystemExit) as e:
        pretrain.main([*run_args(root, "old"), *bad])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "error:" in err, err
    assert (root / "old" / "ckpt.pt").read_bytes() == b"a run" and (root / "old" / "log.jsonl").read_text() == "{}\n"


def test_a_bad_flag_from_the_command_line_has_no_traceback(root):
    done = script(*run_args(root, "x", "--lr", "nan"))
    out, _ = done.communicate(timeout=120)
    assert done.returncode == 2 and out == ("error: argument --lr: nan is not a finite number: give a number above 0 "
                                            "(see pretrain.py --help)\n"), out
    assert not (root / "x").exists()


def test_a_run_folder_with_a_checkpoint_needs_resume_or_overwrite(root):
    train(root, "kept", "--max-steps", "2")
    before = (root / "kept" / "ckpt.pt").read_bytes(), (root / "kept" / "log.jsonl").read_text()
    with pytest.raises(SystemExit, match=r"holds a run \(ckpt.pt\) already: continue it with --resume"):
        train(root, "kept", "--max-steps", "1")
    assert ((root / "kept" / "ckpt.pt").read_bytes(), (root / "kept" / "log.jsonl").read_text()) == before
    assert train(root, "kept", "--max-steps", "1", "--overwrite")["steps"] == 1
    assert read_checkpoint(root / "kept")["step"] == 1 and len(losses(root / "kept")) == 1


def test_a_live_run_folder_is_locked_and_a_dead_ones_lock_is_taken_over(root, capsys):
    (root / "busy").mkdir()
    (root / "busy" / "lock").write_text(str(os.getpid()))  # a live process holds it: this one
    with pytest.raises(SystemExit, match="in use by process"):
        train(root, "busy", "--max-steps", "1")
    assert not (root / "busy" / "ckpt.pt").exists() and (root / "busy" / "lock").exists()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (root / "busy" / "lock").write_text(str(dead.pid))  # a process that is gone
    assert train(root, "busy", "--max-steps", "1")["steps"] == 1
    assert f"left by process {dead.pid}, which is gone" in capsys.readouterr().out
    assert not (root / "busy" / "lock").exists()  # released at the end


def test_non_finite_weights_are_never_saved(root, monkeypatch):
    real = pretrain.configure_optimizer

    def blows_up_at_step_3(model, *args, **kwargs):
        optimizer = real(model, *args, **kwargs)
        step = optimizer.step

        def broken_step(*a, **k):
            step(*a, **k)
            if optimizer.state[model.wte.weight]["step"] == 3:  # the third update makes a weight inf
                with torch.no_grad():
                    model.wte.weight[0, 0] = math.inf

        optimizer.step = broken_step
        return optimizer

    monkeypatch.setattr(pretrain, "configure_optimizer", blows_up_at_step_3)
    with pytest.raises(SystemExit, match="non-finite at step 3: the run has diverged and stops; the checkpoint of "
                                         "step 2"):
        train(root, "inf", "--max-steps", "10", "--ckpt-every", "1")
    state = read_checkpoint(root / "inf")
    assert state["step"] == 2 and all(torch.isfinite(v).all() for v in state["model"].values())


def test_another_tokenizers_data_is_refused_on_resume_and_init_from(root, tmp_path):
    train(root, "t", "--max-steps", "2", "--rope")
    state = read_checkpoint(root / "t")
    state["tokenizer_hash"] = "another"
    torch.save(state, root / "t" / "ckpt.pt")
    with pytest.raises(SystemExit, match="trained with tokenizer another"):
        train(root, "t", "--max-steps", "4", "--rope", "--resume")
    with pytest.raises(SystemExit, match="trained with tokenizer another"):
        train(root, "u", "--max-steps", "1", "--init-from", str(root / "t"))
    assert read_checkpoint(root / "t")["tokenizer_hash"] == "another" and not (root / "u" / "ckpt.pt").exists()


def test_the_episode_command_after_the_main_job_trains_beside_its_run(data_dir, tmp_path, monkeypatch, capsys):
    """`pretrain.py --rope` typed after the main job: checkpoints/pretrain-rope holds the main job's
    run, so the new run goes to pretrain-rope-2, then -3; --resume continues the newest; the main
    job's run is left as it was."""
    monkeypatch.chdir(tmp_path)
    flags = [*TINY, "--rope", "--data-dir", str(data_dir), "--runs-dir", "runs", "--max-steps", "2"]
    pretrain.main([*flags, "--out-dir", "checkpoints/pretrain-rope"])  # the main job's run
    main_job = (tmp_path / "checkpoints" / "pretrain-rope" / "ckpt.pt").read_bytes()
    capsys.readouterr()
    for n in (2, 3):
        summary = pretrain.main(flags)
        assert summary["args"]["out_dir"] == f"checkpoints/pretrain-rope-{n}"
        assert (tmp_path / "checkpoints" / f"pretrain-rope-{n}" / "ckpt.pt").exists()
        assert capsys.readouterr().out.splitlines()[0] == (
            f"checkpoints/pretrain-rope holds a run already: this one goes to checkpoints/pretrain-rope-{n} "
            "(--out-dir picks the folder, --overwrite starts checkpoints/pretrain-rope again)")
    resumed = pretrain.main([*flags[:-1], "4", "--resume"])
    assert resumed["args"]["out_dir"] == "checkpoints/pretrain-rope-3" and resumed["steps"] == 4
    assert (tmp_path / "checkpoints" / "pretrain-rope" / "ckpt.pt").read_bytes() == main_job
    assert not (tmp_path / "checkpoints" / "pretrain-rope-4").exists()


@pytest.mark.parametrize("name", ["ckpt.pt", "log.jsonl", "lock"])
def test_a_json_over_a_file_of_the_run_being_made_is_refused_before_training(root, capsys, name):
    with pytest.raises(SystemExit) as e:
        train(root, "new", "--max-steps", "2", "--json", str(root / "new" / name))
    assert e.value.code == (f"error: --json {root / 'new' / name} is a file of --out-dir {root / 'new'}, which this "
                            "command writes: pick another file")
    assert not (root / "new").exists()


def test_a_json_beside_the_run_files_in_its_folder_is_written(root):
    summary = train(root, "new", "--max-steps", "2", "--json", str(root / "new" / "summary.json"))
    assert json.loads((root / "new" / "summary.json").read_text())["steps"] == summary["steps"] == 2


def test_a_run_folder_named_like_a_file_trains_saves_and_resumes(root):
    train(root, "run.pt", "--max-steps", "2")
    assert sorted(p.name for p in (root / "run.pt").iterdir()) == ["ckpt.pt", "log.jsonl"]
    assert train(root, "run.pt", "--max-steps", "4", "--resume")["steps"] == 4


@pytest.mark.parametrize("vocab", [64, 512])
def test_init_from_a_checkpoint_with_no_tokenizer_hash_and_another_vocabulary_is_one_line(root, vocab):
    save_checkpoint(root / "old", GPT(GPTConfig(vocab_size=vocab, block_size=16, n_layer=1, n_head=2, n_embd=32)),
                    step=1)
    with pytest.raises(SystemExit) as e:
        train(root, "new", "--max-steps", "2", "--init-from", str(root / "old"))
    assert e.value.code == (f"error: {root / 'old'} reads {vocab} token ids, but the data's tokenizer makes 300: "
                            "pass the --data-dir it was trained on")
    assert not (root / "new").exists()


def test_a_held_out_set_too_short_for_one_window_is_refused_before_any_step(tmp_path):
    from conftest import write_corpus

    from mvgpt.data import prepare

    source = tmp_path / "source"
    source.mkdir()
    write_corpus(source / "train.txt", 200, seed=1)
    (source / "valid.txt").write_text("Hi.\n<|endoftext|>\n")
    prepare(source, tmp_path / "data", vocab_size=300)
    with pytest.raises(SystemExit) as e:
        pretrain.main([*TINY, "--data-dir", str(tmp_path / "data"), "--out-dir", str(tmp_path / "run"), "--max-steps",
                       "30", "--runs-dir", str(tmp_path / "runs")])
    assert str(e.value.code).startswith(f"error: the held-out set in {tmp_path / 'data'} has ") and \
        str(e.value.code).endswith("tokens, too few for windows of 16: prepare it from more text "
                                   "(`python scripts/prepare.py --source DIR --force`)")
    assert not (tmp_path / "run").exists()


def test_a_resume_keeps_the_runs_optimizer_and_refuses_another(root):
    train(root, "m", "--max-steps", "2", "--optimizer", "muon")
    with pytest.raises(SystemExit, match="trained with muon, and --optimizer asks for adamw"):
        pretrain.main(run_args(root, "m", "--max-steps", "4", "--resume", "--optimizer", "adamw"))
    out = pretrain.main(run_args(root, "m", "--max-steps", "4", "--resume"))
    assert out["args"]["optimizer"] == "muon" and read_checkpoint(root / "m")["optimizer"].keys() == {"adamw", "muon"}
    # a run saved before --optimizer existed holds AdamW's moments: it resumes with AdamW
    train(root, "old", "--max-steps", "2", "--optimizer", "adamw")
    state = read_checkpoint(root / "old")
    del state["args"]["optimizer"]
    torch.save(state, root / "old" / "ckpt.pt")
    assert pretrain.main(run_args(root, "old", "--max-steps", "4", "--resume"))["args"]["optimizer"] == "adamw"
    state["args"]["optimizer"] = "sgd"  # a checkpoint edited by hand
    torch.save(state, root / "old" / "ckpt.pt")
    with pytest.raises(SystemExit, match="names an optimizer this version does not have"):
        pretrain.main(run_args(root, "old", "--max-steps", "6", "--resume"))


@pytest.mark.parametrize("field, value, says", [
    ("step", -3, "says it is at step -3"),
    ("step", "5", "says it is at step '5'"),
    ("elapsed", float("nan"), "after nan seconds"),
    ("model", None, "holds non-finite weights"),
    ("step_seconds", [float("nan"), 1], r"says its steps took \[nan, 1\] \(seconds, steps\), which no run saves"),
    ("step_seconds", [1.0, 5], r"says its steps took \[1.0, 5\]"),  # more timed steps than it took
    ("step_seconds", {"s": 1}, r"says its steps took \{'s': 1\}"),
    ("step_seconds", [True, 1], r"says its steps took \[True, 1\]"),  # a yes, not seconds
    ("step_seconds", [0.0, 1], r"says its steps took \[0.0, 1\]"),  # a step in no time
    ("step_seconds", [5.0, 0], r"says its steps took \[5.0, 0\]"),  # time in no steps
    ("step_seconds", [1e6, 1], r"says its steps took \[1000000.0, 1\]"),  # more time than the run's clock
])
def test_a_checkpoint_no_run_saves_is_refused_on_resume_and_kept(root, field, value, says):
    train(root, "r", "--max-steps", "2")
    state = read_checkpoint(root / "r")
    if field == "model":
        state["model"]["wte.weight"][0, 0] = float("nan")
    else:
        state[field] = value
    torch.save(state, root / "r" / "ckpt.pt")
    before = (root / "r" / "ckpt.pt").read_bytes()
    with pytest.raises(SystemExit, match=says):
        pretrain.main(run_args(root, "r", "--max-steps", "4", "--resume"))
    assert (root / "r" / "ckpt.pt").read_bytes() == before


def test_a_resume_below_its_step_says_there_is_nothing_to_train(root, capsys):
    train(root, "r", "--max-steps", "4")
    out = pretrain.main(run_args(root, "r", "--max-steps", "2", "--resume"))
    assert "is at step 4, past --max-steps 2: nothing to train" in capsys.readouterr().out and out["steps"] == 4


def test_on_the_clock_the_cosine_starts_at_the_peak_after_the_warm_up_and_ends_at_the_floor():
    lr = lambda step, **kw: lr_at(step, 1.0, 200, 0.1, budget=600.0, **kw)  # noqa: E731
    # 2 s a step: half of ten minutes holds 150 steps, so the warm-up is 150 steps and ends at 300 s
    assert lr(149, elapsed=298.0, step_seconds=2.0) == 1.0
    assert lr(150, elapsed=300.0, step_seconds=2.0) == 1.0  # the peak: the cosine begins there
    # the schedule before (after_warmup=False): the cosine at the clock's half, so the lr drops to 0.55
    assert lr(150, elapsed=300.0, step_seconds=2.0, after_warmup=False) == cosine(0.5, 0.1)
    # then down over the 300 s left: half way at 450 s, the floor when the time is up (and after)
    assert lr(225, elapsed=450.0, step_seconds=2.0) == cosine(0.5, 0.1)
    assert lr(300, elapsed=600.0, step_seconds=2.0) == lr(310, elapsed=620.0, step_seconds=2.0) == pytest.approx(0.1)
    rates = [lr(s, elapsed=2.0 * s, step_seconds=2.0) for s in range(300)]
    assert rates[149:] == sorted(rates[149:], reverse=True) and rates[:150] == sorted(rates[:150])
    # without a pace (the first step) there is no warm-up time to leave out: the clock's cosine
    assert lr(200, elapsed=100.0) == lr(200, elapsed=100.0, after_warmup=False) == cosine(100 / 600, 0.1)
    # bounded by steps it changes nothing: that cosine already starts at the warm-up's end
    assert lr_at(300, 1.0, 200, 0.1, max_steps=1000, step_seconds=2.0) == lr_at(
        300, 1.0, 200, 0.1, max_steps=1000, step_seconds=2.0, after_warmup=False)
