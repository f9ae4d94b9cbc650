"""Reading scripts pointed at run folders: the main job's layout, LoRA folders, what is skipped.

The layout test builds, at tiny size, the folders the main job leaves in checkpoints/ (two
pretrained models, the long-context fine-tune, a LoRA adapter) and runs the README's reading
commands in it exactly as written, through a shell, so `checkpoints/*` expands as it does for a
learner.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import ROOT, tiny_model

from mvgpt.checkpoint import existing_path, find_models, load_source, read_models, save_checkpoint
from mvgpt.data import data_tokenizer_hash
from mvgpt.kit.io import CheckpointError
from mvgpt.lora import apply_lora, lora_layers, save_adapter, weights_hash

VOCAB = 300  # the tiny data's tokenizer


def lora_on(base, seed: int = 1):
    """The base wrapped with an adapter whose update is not zero (as if trained)."""
    model = tiny_model(rope=base.config.rope, vocab_size=VOCAB)
    model.load_state_dict(base.state_dict())
    apply_lora(model, rank=2, alpha=4)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.B.copy_(torch.randn(layer.B.shape, generator=g))
    return model


def main_job_layout(checkpoints: Path, tok_hash: str | None, recorded_base: str) -> dict:
    """The run folders the main job leaves, tiny: pretrain, pretrain-rope, the long-context
    fine-tune (4 windows, linear positions), lora-rope (an adapter only)."""
    learned = tiny_model(vocab_size=VOCAB, seed=1)
    rope = tiny_model(vocab_size=VOCAB, rope=True, seed=2)
    long = tiny_model(vocab_size=VOCAB, rope=True, seed=3, block_size=64, rope_linear_factor=4.0)
    for name, model in (("pretrain", learned), ("pretrain-rope", rope), ("pretrain-rope-ctx64-linear", long)):
        save_checkpoint(checkpoints / name, model, tokenizer_hash=tok_hash, step=4)
    adapted = lora_on(rope)
    save_adapter(checkpoints / "lora-rope", adapted, weights_hash(rope), tok_hash, base=recorded_base)
    return {"pretrain": learned, "pretrain-rope": rope, "lora-rope": adapted}


def test_find_models_reads_each_run_and_an_adapter_on_its_base(tmp_path, data_dir):
    h = data_tokenizer_hash(data_dir)
    made = main_job_layout(tmp_path / "checkpoints", h, "checkpoints/pretrain-rope")  # recorded relative
    (tmp_path / "checkpoints" / "exports").mkdir()  # a folder with no model in it
    (tmp_path / "checkpoints" / "notes.txt").write_text("tried lr 3e-3")
    paths = sorted(str(p) for p in (tmp_path / "checkpoints").iterdir())
    models, skipped = find_models(paths, h)
    assert [m.name for m in models] == ["lora-rope (LoRA on pretrain-rope)", "pretrain",
                                        "pretrain-rope", "pretrain-rope-ctx64-linear"]
    assert models[0].checkpoint == tmp_path / "checkpoints" / "pretrain-rope" / "ckpt.pt"
    assert skipped == [f"{tmp_path / 'checkpoints' / 'exports'} (no checkpoint or LoRA adapter in it: name a run "
                       "folder, one that holds a ckpt.pt or an adapter.pt)",
                       f"{tmp_path / 'checkpoints' / 'notes.txt'} (not a run folder or a .pt file: name a run "
                       "folder, e.g. checkpoints/pretrain-rope, or the .pt file in it)"]
    files, _ = find_models([str(m.checkpoint) for m in models[1:]] + [str(models[0].adapter)], h)  # files work too
    assert [(m.checkpoint, m.adapter) for m in files] == [(m.checkpoint, m.adapter) for m in models[1:] + models[:1]]
    x = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(0))
    read = load_source(models[0], "cpu", h)
    torch.testing.assert_close(read(x)[0], made["lora-rope"](x)[0], rtol=0, atol=0)
    assert not torch.allclose(read(x)[0], made["pretrain-rope"](x)[0])  # the adapter is applied


def test_an_adapter_whose_base_changed_is_skipped_with_the_reason(tmp_path, data_dir, capsys):
    h = data_tokenizer_hash(data_dir)
    main_job_layout(tmp_path, h, str(tmp_path / "pretrain-rope"))
    save_checkpoint(tmp_path / "pretrain-rope", tiny_model(vocab_size=VOCAB, rope=True, seed=9), tokenizer_hash=h)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "ckpt.pt").write_bytes(b"PK\x03\x04 not a whole archive")
    models = read_models([str(tmp_path / "lora-rope"), str(tmp_path / "pretrain"), str(tmp_path / "broken")], "cpu", h)
    assert [name for name, _ in models] == ["pretrain"]
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and line.startswith("skipped 2: ")
    assert "holds the base it was trained on: fine-tune it again" in line
    assert f"{tmp_path / 'broken'} (checkpoint {tmp_path / 'broken' / 'ckpt.pt'} is truncated or corrupt" in line
    with pytest.raises(CheckpointError, match=r"no model to read: .*lora-rope \(adapter .* holds the base it was"):
        read_models([str(tmp_path / "lora-rope")], "cpu", h)


def test_a_path_that_does_not_exist_is_an_error_not_a_skip(tmp_path):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="nothing at"):
        existing_path(str(tmp_path / "typo"))
    assert existing_path(str(tmp_path)) == str(tmp_path)


def readme_commands(script: str) -> list[str]:
    """The README's commands that run `script`, as written (a trailing comment dropped)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    found = [re.sub(r"\s+#.*$", "", line.strip()) for line in lines if line.strip().startswith(f"python {script}")]
    return [line for line in found if not line.endswith("\\")]  # a one-line command


@pytest.mark.parametrize("script", ["scripts/evaluate.py", "scripts/context.py"])
def test_the_readme_reading_commands_work_as_typed_after_the_main_job(script, tmp_path, data_dir):
    commands = readme_commands(script)
    assert commands, f"the README shows no `python {script}` command"
    shutil.copytree(data_dir, tmp_path / "data")
    models = main_job_layout(tmp_path / "checkpoints", data_tokenizer_hash(data_dir),
                             str(tmp_path / "elsewhere" / "pretrain-rope"))  # moved since: found beside
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for command in commands:
        command = command.replace("python scripts/", f"python {ROOT}/scripts/", 1)
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, command + "\n" + done.stdout[-2000:] + done.stderr[-2000:]
        named = [name for name in models if name in command or "checkpoints/*" in command]
        for name in named:
            assert f"\n{name} " in done.stdout, (command, done.stdout)
        if "checkpoints/*" in command:
            assert "lora-rope (LoRA on pretrain-rope)" in done.stdout


def test_sample_reads_a_lora_run_folder_on_its_base(tmp_path, data_dir):
    """`sample.py checkpoints/lora-rope` writes what `sample.py checkpoints/pretrain-rope --adapter
    checkpoints/lora-rope` writes, and says which base it used; both at once is one line, exit 1."""
    shutil.copytree(data_dir, tmp_path / "data")
    main_job_layout(tmp_path / "checkpoints", data_tokenizer_hash(data_dir), "checkpoints/pretrain-rope")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")

    def sample(args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", f"python {ROOT}/scripts/sample.py {args} --max-new-tokens 40 "
                               "--temperature 0 --device cpu --threads 1"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)

    folder, named, base = (sample("checkpoints/lora-rope"), sample("checkpoints/pretrain-rope --adapter "
                           "checkpoints/lora-rope"), sample("checkpoints/pretrain-rope"))
    assert folder.returncode == named.returncode == base.returncode == 0, folder.stderr + named.stderr
    assert folder.stdout == named.stdout != base.stdout  # the adapter is applied, on the right base
    step = "decoding with model.py's step, not the C step: blocks.0.attn.qkv is a LoRALinear\n"  # said first
    assert folder.stderr == step + "sampling with lora-rope (LoRA on pretrain-rope)\n" and named.stderr == step
    both = sample("checkpoints/lora-rope --adapter checkpoints/lora-rope")
    assert both.returncode == 1 and both.stdout == ""
    assert both.stderr == "error: checkpoints/lora-rope is a LoRA run already, on pretrain-rope: drop --adapter\n"
