import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, write_corpus

from mvgpt.data import prepare


def test_the_main_job_runs_end_to_end_on_a_tiny_model(corpus_dir, tmp_path):
    """README's first command, with --tiny: every step runs and writes what the next one reads."""
    cmd = [sys.executable, str(ROOT / "scripts" / "main.py"), "--source", str(corpus_dir), "--tiny",
           "--out", str(tmp_path), "--max-steps", "4", "--finetune-steps", "2", "--device", "cpu"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "plan (4 steps each, as asked; measured in" in result.stdout  # the plan before training
    progress = [line for line in result.stdout.splitlines() if line.startswith("[")]  # a line after each stage
    assert len(progress) == 8 and all(" left, " in line for line in progress), progress
    for name in ("evaluate", "context", "sweep", "sinks", "dynamic"):
        assert json.loads((tmp_path / "results" / f"{name}.json").read_text())
    for run in ("pretrain", "pretrain-rope", "pretrain-rope-ctx128-linear"):
        assert (tmp_path / "checkpoints" / run / "ckpt.pt").exists()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)  # all done: all skipped
    assert again.returncode == 0 and again.stdout.count("skipping") == 8, again.stdout[-3000:]  # 3 runs, 5 measurements


def test_finished_steps_reads_the_step_and_refuses_a_corrupt_checkpoint(tmp_path):
    import main
    import pytest
    from conftest import tiny_model

    from mvgpt.checkpoint import save_checkpoint

    assert main.finished_steps(tmp_path / "none") == 0
    save_checkpoint(tmp_path / "run", tiny_model(), step=7)
    assert main.finished_steps(tmp_path / "run") == 7
    (tmp_path / "run" / "ckpt.pt").write_bytes(b"garbage")
    with pytest.raises(SystemExit, match="truncated or corrupt"):
        main.finished_steps(tmp_path / "run")


def long_held_out(tmp_path) -> Path:
    """Prepared data whose held-out set is long enough for the job's reading past a window of 256."""
    source, data = tmp_path / "long-source", tmp_path / "long-data"
    source.mkdir()
    write_corpus(source / "train.txt", 400, seed=1)
    write_corpus(source / "valid.txt", 600, seed=2)
    prepare(source, data, vocab_size=300)
    return data


def fake_job(monkeypatch, data_dir, tmp_path, step_s: float = 2.0, short_held_out: bool = False):
    """main() with its steps recorded instead of run, on prepared data, with a measured machine made up:
    (the commands, what it printed)."""
    import main

    from mvgpt.perf import plan

    (tmp_path / "data").symlink_to(data_dir if short_held_out else long_held_out(tmp_path))
    commands = []
    monkeypatch.setattr(main, "run", lambda step, env: commands.append(step))
    monkeypatch.setattr(main, "measure", lambda step, out, checkpoints, env: commands.append(step))
    made_up = plan.Rates(step_s={"learned": step_s, "rope": 2.5}, compile_s={"learned": 40.0, "rope": 60.0},
                         eager_step_s=3.0, eval_s=0.5, eval_float32_s=0.5, window_s=0.06,
                         token_s=0.008, seconds=90.0)
    monkeypatch.setattr(plan, "measure", lambda *args, **kwargs: made_up)
    return commands


def pretrain_commands(commands) -> list[list[str]]:
    return [c[1:] for c in commands if c[0].endswith("pretrain.py") and "--init-from" not in c]


def test_the_default_steps_fit_the_first_kind_into_ten_minutes_and_max_steps_1000_is_the_committed_runs(
        monkeypatch, data_dir, tmp_path, capsys):
    import main

    commands = fake_job(monkeypatch, data_dir, tmp_path)
    main.main(["--out", str(tmp_path), "--device", "cpu"])
    said = capsys.readouterr().out
    # 2 s a step, 40 s compiling, evaluations and checkpoints every 25 steps: 225 steps in ten minutes, fewer
    # than a useful model needs; the floor's 300 take 12.5 minutes, so the floor it is, and the plan says why
    assert [c[c.index("--max-steps") + 1] for c in pretrain_commands(commands)] == ["300", "300"]
    assert [c[c.index("--warmup") + 1] for c in pretrain_commands(commands)] == ["60", "60"]  # a fifth, as 200 of 1,000
    assert "plan (300 steps each, the floor for a useful model: this machine is slow; measured in 90 s" in said
    stages = ["pretrain (learned)", "pretrain (rope)", "evaluate", "context", "long-context fine-tune", "sweep",
              "sinks", "dynamic", "LoRA fine-tune", "report"]
    assert [line.split(":")[0] for line in said.splitlines() if line.startswith("[")] == [f"[{s}" for s in stages]
    assert all("left, " in line for line in said.splitlines() if line.startswith("["))

    commands.clear()
    main.main(["--out", str(tmp_path), "--device", "cpu", "--max-steps", "1000"])
    runs, data = tmp_path / "runs", str(tmp_path / "data")
    assert pretrain_commands(commands) == [  # the committed runs' flags, as the main job gave them before
        [*kind, "--compile", "--max-steps", "1000", "--dtype", "auto", "--device", "cpu", "--data-dir", data,
         "--runs-dir", str(runs), "--out-dir", str(tmp_path / "checkpoints" / name),
         "--json", str(tmp_path / "results" / f"{name}.json")]
        for kind, name in (([], "pretrain"), (["--rope"], "pretrain-rope"))]


def test_a_job_run_again_keeps_the_steps_it_chose(monkeypatch, data_dir, tmp_path):
    import main
    from conftest import tiny_model

    from mvgpt.checkpoint import save_checkpoint

    commands = fake_job(monkeypatch, data_dir, tmp_path, step_s=0.5)  # a faster machine would choose more
    save_checkpoint(tmp_path / "checkpoints" / "pretrain", tiny_model(), step=100, args={"max_steps": 225})
    assert main.steps_trained_before(tmp_path / "checkpoints") == 225
    main.main(["--out", str(tmp_path), "--device", "cpu"])
    assert [c[c.index("--max-steps") + 1] for c in pretrain_commands(commands)] == ["225", "225"]


def test_a_job_asked_for_fewer_steps_than_its_runs_trained_records_the_steps_they_trained(
        monkeypatch, data_dir, tmp_path):
    import main
    from conftest import tiny_model

    from mvgpt.checkpoint import save_checkpoint

    fake_job(monkeypatch, data_dir, tmp_path)
    for name in ("pretrain", "pretrain-rope"):
        save_checkpoint(tmp_path / "checkpoints" / name, tiny_model(), step=10, args={"max_steps": 10})
    main.main(["--out", str(tmp_path), "--device", "cpu", "--max-steps", "5"])
    assert json.loads((tmp_path / "results" / "main-job.json").read_text())["steps"] == 10  # not the 5 asked


def test_a_job_over_data_with_a_damaged_meta_json_keeps_it_for_its_runs_or_prepares_it_again(
        monkeypatch, data_dir, corpus_dir, tmp_path, capsys):
    import shutil

    import main
    import pytest
    from conftest import tiny_model

    from mvgpt.checkpoint import save_checkpoint

    data = tmp_path / "data"
    shutil.copytree(data_dir, data)
    (data / "meta.json").write_text("{")
    prepare = [str(ROOT / "scripts" / "prepare.py"), "--data-dir", str(data), "--source", str(corpus_dir)]
    steps = []
    monkeypatch.setattr(main, "run", lambda step, env: steps.append(step))
    save_checkpoint(tmp_path / "checkpoints" / "pretrain", tiny_model(), step=3)
    with pytest.raises(SystemExit, match=f"^error: {data} holds a tokenizer, but its meta.json is missing or damaged, "
                                         f"and {tmp_path / 'checkpoints'} holds runs trained on it \\(pretrain\\)"):
        main.prepare_data(prepare, {})
    assert steps == []
    shutil.rmtree(tmp_path / "checkpoints")
    main.prepare_data(prepare, {})
    assert steps == [[*prepare, "--force"]]
    said = capsys.readouterr().out
    assert "meta.json is missing or damaged, and no run was trained on it yet: preparing it again" in said


def test_a_measurement_is_up_to_date_when_newer_than_every_checkpoint_it_reads(tmp_path):
    import main
    from conftest import tiny_model

    from mvgpt.checkpoint import save_checkpoint

    out = tmp_path / "evaluate.json"
    data = tmp_path / "data"  # no meta.json: only the checkpoints count
    assert not main.up_to_date(out, [tmp_path / "a"], data)
    save_checkpoint(tmp_path / "a", tiny_model(), step=1)
    out.write_text("{}")
    assert main.up_to_date(out, [tmp_path / "a"], data)
    assert not main.up_to_date(out, [tmp_path / "a", tmp_path / "b"], data)
    data.mkdir()
    (data / "meta.json").write_text("{}")  # the data prepared again, after the measurement
    os.utime(data / "meta.json", (out.stat().st_mtime + 5,) * 2)
    assert not main.up_to_date(out, [tmp_path / "a"], data)
    (data / "meta.json").unlink()
    os.utime(out, (0, 0))  # older than the checkpoint
    assert not main.up_to_date(out, [tmp_path / "a"], data)


def test_sigterm_while_the_job_measures_the_machine_is_one_line_and_exit_143(corpus_dir, tmp_path):
    """Between the steps no step holds the signal: the job itself ends in one line, and nothing is lost."""
    code = ("import sys, time; sys.argv[0] = 'main.py'; import main\n"
            "def measuring(*args):\n    print('measuring', flush=True); time.sleep(60)\n"
            "main.plan_job = measuring\n"
            f"main.main(['--source', {str(corpus_dir)!r}, '--tiny', '--out', {str(tmp_path / 'job')!r}])\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "scripts")]))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
    for line in child.stdout:
        if line.startswith("measuring"):
            break
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 143 and err == ("terminated (SIGTERM): nothing is lost: run the same command again: "
                                               "the steps done are skipped, training resumes\n")
    assert (tmp_path / "job" / "data" / "meta.json").exists()  # the data prepared before is kept


def test_a_busy_moment_is_measured_again_and_a_machine_still_too_slow_is_told_so_with_a_smaller_job(
        monkeypatch, data_dir, tmp_path, capsys):
    import main
    import pytest

    from mvgpt.perf import plan

    commands = fake_job(monkeypatch, data_dir, tmp_path)
    busy = plan.Rates(step_s={"learned": 6.8, "rope": 6.0}, compile_s={"learned": 8.0, "rope": 6.0},
                      eager_step_s=7.0, eval_s=0.25, eval_float32_s=0.3, window_s=1.4,
                      token_s=0.006, seconds=147.0, other_cores=1.1)
    quiet = plan.Rates(**{**busy.__dict__, "step_s": {"learned": 0.9, "rope": 0.8}, "other_cores": 0.0})
    measured = [busy, quiet]
    monkeypatch.setattr(plan, "measure", lambda *args, **kwargs: measured.pop(0))
    main.main(["--out", str(tmp_path), "--device", "cpu"])
    said = capsys.readouterr().out
    assert "the machine looks busy (other programs kept 1.1 cores busy while the plan measured): measuring again" \
        in said and measured == []
    assert [c[c.index("--max-steps") + 1] for c in pretrain_commands(commands)] == ["550", "550"]  # the quiet figures
    # busy both times: no job that trains a useless model, but one line with what to run instead
    commands.clear()
    monkeypatch.setattr(plan, "measure", lambda *args, **kwargs: busy)
    with pytest.raises(SystemExit) as e:
        main.main(["--out", str(tmp_path), "--device", "cpu"])
    assert str(e.value.code).startswith("error: this machine took 6.80 s a pretraining step while the plan measured "
                                        "(other programs kept 1.1 cores busy while the plan measured): ten minutes "
                                        "would train 75 steps a model")
    assert pretrain_commands(commands) == []


def test_plan_only_measures_and_prints_the_plan_and_runs_no_step(monkeypatch, data_dir, tmp_path, capsys):
    import main

    commands = fake_job(monkeypatch, data_dir, tmp_path)
    main.main(["--out", str(tmp_path), "--device", "cpu", "--plan-only"])
    said = capsys.readouterr().out
    assert [Path(c[0]).name for c in commands] == ["prepare.py"]  # the data (done already: skipped), no step after
    assert "plan (300 steps each" in said and "  total  " in said
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "results" / "main-job.json").exists()


def test_a_device_this_machine_lacks_is_refused_before_the_data_is_prepared(corpus_dir, tmp_path):
    import main
    import pytest

    with pytest.raises(SystemExit, match="^error: unknown device 'tpu'"):
        main.main(["--source", str(corpus_dir), "--out", str(tmp_path / "job"), "--device", "tpu"])
    assert not (tmp_path / "job" / "data").exists()


def test_a_held_out_set_too_short_for_the_jobs_reading_past_the_window_is_said_before_training(
        monkeypatch, data_dir, tmp_path):
    import main
    import pytest

    commands = fake_job(monkeypatch, data_dir, tmp_path, short_held_out=True)
    held_out = (data_dir / "val.bin").stat().st_size // 2
    with pytest.raises(SystemExit) as e:  # the default model's window: 8 x 3 x 256 tokens are more than the tests'
        main.main(["--out", str(tmp_path), "--device", "cpu"])
    assert e.value.code == (f"error: the held-out set in {tmp_path / 'data'} has {held_out:,} tokens, and the job's "
                            "reading past the window takes 6,145 (8 streams of 3 windows of 256): prepare it from a "
                            "source with more held-out text (valid.txt)")
    assert pretrain_commands(commands) == []
