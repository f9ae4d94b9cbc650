import json
import os
import subprocess
import sys

from conftest import ROOT


def test_the_main_job_runs_end_to_end_on_a_tiny_model(corpus_dir, tmp_path):
    """README's first command, with --tiny: every step runs and writes what the next one reads."""
    cmd = [sys.executable, str(ROOT / "scripts" / "main.py"), "--source", str(corpus_dir), "--tiny",
           "--out", str(tmp_path), "--max-steps", "4", "--finetune-steps", "2", "--device", "cpu"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
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
