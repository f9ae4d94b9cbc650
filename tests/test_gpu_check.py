"""dev/gpu_check.sh, as far as a machine without a GPU can check it: it parses, its dry run prints the
commands it would run into a folder named after the GPU, and without a GPU or data it says so in one line."""

import subprocess

import pytest
from conftest import ROOT

SCRIPT = ROOT / "dev" / "gpu_check.sh"


def gpu_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_it_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


@pytest.mark.parametrize("name, folder", [("NVIDIA H200", "nvidia-h200"),
                                          ("NVIDIA GeForce RTX 4090", "nvidia-geforce-rtx-4090"),
                                          ("  Tesla T4 (16 GB)  ", "tesla-t4-16-gb")])
def test_a_dry_run_prints_each_command_into_the_gpus_own_folder(tmp_path, name, folder):
    (tmp_path / "meta.json").write_text("{}")  # prepared data, as far as the script looks
    done = gpu_check("--dry-run", "--gpu-name", name, "--data", str(tmp_path), "--minutes", "1.5")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"GPU check: {name} -> results/{folder}/ (1.5-minute runs)"
    assert lines[-1] == f"done: results/{folder}/"
    commands = [line[2:] for line in lines if line.startswith("$ ")]
    assert [c.split()[1] for c in commands] == ["-m", *["scripts/pretrain.py"] * 3, "scripts/context.py",
                                                "scripts/bench.py", "-"]
    trained = [c for c in commands if "pretrain.py" in c]
    assert all("--minutes 1.5 --dtype auto --device cuda" in c and f"--json results/{folder}/" in c for c in trained)
    assert ["--rope" in c for c in trained] == [False, True, True]  # both kinds, and rope compiled too
    assert ["--compile" in c for c in trained] == [False, False, True]
    assert f"--device cuda --data-dir {tmp_path} --streams 2 --json results/{folder}/context-gpu.json" in commands[4]
    assert f"--device cuda --only decoding --json results/{folder}/bench.json" in commands[5]
    assert not (ROOT / "results" / folder).exists()  # a dry run makes nothing


def test_without_data_or_a_gpu_it_says_so_in_one_line(tmp_path):
    done = gpu_check("--dry-run", "--data", str(tmp_path / "none"))
    assert done.returncode == 1 and done.stderr == (
        f"error: no prepared data in {tmp_path / 'none'}/: give --source (TinyStories text) or --data (a prepared "
        "folder)\n")
    done = gpu_check("--dry-run", "--data", str(tmp_path / "none"), "--source", "stories.txt", "--gpu-name", "X 1")
    assert f"$ python scripts/prepare.py --data-dir {tmp_path / 'none'} --source stories.txt" in done.stdout
    import torch

    if not torch.cuda.is_available():  # naming the folder does not make a GPU
        done = gpu_check("--data", str(tmp_path), "--gpu-name", "NVIDIA H200")
        assert done.returncode == 1 and done.stderr.startswith("error: no CUDA GPU is visible to torch")
    assert gpu_check("--bogus").stderr == "error: unknown flag --bogus (see --help)\n"
