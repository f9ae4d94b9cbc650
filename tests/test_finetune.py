import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import evaluate
import finetune
import pretrain
import pytest
import sample
import torch
from conftest import ROOT
from test_instruct import write_corpus

from mvgpt.checkpoint import load_model
from mvgpt.data import prepare
from mvgpt.lora import adapter_path, load_adapter, read_adapter

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32", "--batch-size", "4",
        "--eval-batches", "1", "--eval-every", "5", "--warmup", "2", "--minutes", "0", "--max-steps", "6"]
FAST = ["--batch-size", "4", "--eval-examples", "8", "--eval-every", "2", "--warmup", "1", "--prompts", "3",
        "--gen-tokens", "8"]


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def script(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "finetune.py"), *args], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Prepared data, a tiny rope base and a tiny learned one, and a fine-tune of the rope base run
    end to end in a subprocess (its result and JSON)."""
    root = tmp_path_factory.mktemp("finetune")
    data = root / "data"
    prepare(write_corpus(tmp_path_factory.mktemp("corpus")), data, vocab_size=300)
    common = ["--data-dir", str(data), "--runs-dir", str(root / "runs")]
    pretrain.main([*TINY, *common, "--rope", "--out-dir", str(root / "base-rope")])
    pretrain.main([*TINY, *common, "--out-dir", str(root / "base")])
    before = sha(root / "base-rope" / "ckpt.pt")
    run = script("--init-from", str(root / "base-rope"), *common, "--out-dir", str(root / "lora-rope"),
                 "--max-steps", "4", *FAST, "--json", str(root / "lora.json"))
    assert run.returncode == 0, run.stderr
    assert sha(root / "base-rope" / "ckpt.pt") == before  # the base checkpoint is only read
    return {"root": root, "data": data, "common": common, "run": run,
            "summary": json.loads((root / "lora.json").read_text())}


def test_finetune_end_to_end(world):
    root, summary = world["root"], world["summary"]
    assert "trainable weights of" in world["run"].stdout and "of the base checkpoint's" in world["run"].stdout
    assert sorted(os.listdir(root / "lora-rope")) == ["adapter.pt", "log.jsonl"]
    assert (root / "runs" / "lora-rope").is_dir()  # TensorBoard
    assert (summary["run"], summary["steps"], summary["rank"], summary["alpha"], summary["layers"]) == (
        "lora-rope", 4, 8, 16.0, 4)
    assert summary["trainable"] == 8 * ((32 + 96) + (32 + 32) + (32 + 128) + (128 + 32))
    assert summary["trainable_share"] == summary["trainable"] / summary["params"]
    assert summary["adapter_bytes"] == (root / "lora-rope" / "adapter.pt").stat().st_size
    assert summary["adapter_weight_bytes"] == 4 * summary["trainable"] < summary["adapter_bytes"]
    assert summary["adapter_bytes"] < summary["checkpoint_bytes"]
    log = [json.loads(line) for line in (root / "lora-rope" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4] and [r["val_loss"] for r in log if "val_loss" in r]
    measured = summary["measure"]
    assert (measured["prompts"], measured["gen_tokens"], measured["loss_examples"]) == (3, 8, 8)
    base, tuned = measured["rows"]
    assert (base["model"], tuned["model"]) == ("base", "lora-rope")
    assert tuned["story_loss"] == summary["val_loss"]  # the same held-out rows, the same model
    assert tuned["story_loss"] < base["story_loss"]
    for row in (base, tuned):
        assert 0 <= row["words_used"] <= 1 and row["story_tokens"] <= 8


def test_measure_again_gives_the_same_figures(world, tmp_path):
    root = world["root"]
    again = finetune.main(["--init-from", str(root / "base-rope"), *world["common"], "--out-dir",
                           str(root / "lora-rope"), *FAST, "--measure", "--json", str(tmp_path / "m.json")])
    first = world["summary"]["measure"]
    assert again["measure"]["rows"] == first["rows"] and again["measure"]["sample"] == first["sample"]
    assert json.loads((tmp_path / "m.json").read_text())["steps"] == 4


def test_merge_writes_a_checkpoint_every_reader_loads(world, tmp_path):
    root, data = world["root"], world["data"]
    base_dir = root / "base-rope"
    finetune.main(["--init-from", str(base_dir), *world["common"], "--out-dir", str(root / "lora-rope"),
                   "--merge", str(tmp_path / "merged")])
    merged, state = load_model(tmp_path / "merged")
    assert state["lora"]["rank"] == 8 and state["lora"]["steps"] == 4
    adapted, _ = load_model(base_dir)
    load_adapter(adapted, root / "lora-rope")
    x = torch.randint(0, 300, (2, 32))
    torch.testing.assert_close(merged(x)[0], adapted(x)[0], atol=1e-5, rtol=0)
    rows = evaluate.main([str(tmp_path / "merged"), "--data-dir", str(data), "--device", "cpu"])
    assert rows[0]["tokens"] > 0
    base, _ = load_model(base_dir)
    assert not torch.allclose(merged(x)[0], base(x)[0], atol=1e-4)
    flags = ["--data-dir", str(data), "--device", "cpu", "--temperature", "1", "--top-k", "300",
             "--max-new-tokens", "12", "--prompt", "Words: a, b, c\nStory:\n"]
    with_adapter = sample.main([str(base_dir), "--adapter", str(root / "lora-rope"), *flags])
    assert with_adapter == sample.main([str(tmp_path / "merged"), *flags])


STEPS = 60  # enough that a kill from outside lands midway


def test_kill_and_resume_continues_as_if_never_stopped(world):
    root = world["root"]
    args = ["--init-from", str(root / "base-rope"), *world["common"], "--max-steps", str(STEPS), "--ckpt-every", "2",
            "--batch-size", "4", "--eval-every", "2", "--eval-examples", "4", "--prompts", "0"]
    finetune.main([*args, "--out-dir", str(root / "whole")])
    killed = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "finetune.py"), *args, "--out-dir",
                               str(root / "split")], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not adapter_path(root / "split").exists() and killed.poll() is None:
        time.sleep(0.005)
    killed.kill()  # kill -9 from outside as soon as an adapter is on disk
    assert killed.wait(timeout=120) == -signal.SIGKILL
    assert 2 <= read_adapter(root / "split")["step"] < STEPS
    finetune.main([*args, "--out-dir", str(root / "split"), "--resume"])
    whole, split = read_adapter(root / "whole"), read_adapter(root / "split")
    torch.testing.assert_close(torch.tensor(split["losses"]), torch.tensor(whole["losses"]), atol=1e-6, rtol=0)
    assert len(split["losses"]) == STEPS
    for name, t in whole["lora"].items():
        torch.testing.assert_close(split["lora"][name], t, atol=1e-6, rtol=0)


def test_learned_positions_get_their_own_run_folder(world, monkeypatch):
    root = world["root"]
    monkeypatch.chdir(root)
    summary = finetune.main(["--init-from", str(root / "base"), "--data-dir", str(world["data"]), "--max-steps", "2",
                             "--batch-size", "2", "--eval-examples", "2", "--prompts", "0", "--rank", "2"])
    assert summary["run"] == "lora" and (root / "checkpoints" / "lora" / "adapter.pt").exists()
    assert (root / "runs" / "lora").is_dir() and summary["rank"] == 2


@pytest.mark.parametrize("flags, words", [
    (["--rank", "0"], "argument --rank: 0 is out of range: give a whole number >= 1"),
    (["--alpha", "-1"], "argument --alpha: -1 is out of range: give a number above 0"),
    (["--lr", "0"], "argument --lr: 0 is out of range: give a number above 0"),
    (["--lr", "nan"], "argument --lr: nan is not a finite number: give a number above 0"),
    (["--max-steps", "0"], "argument --max-steps: 0 is out of range: give a whole number >= 1"),
    (["--batch-size", "0"], "argument --batch-size: 0 is out of range: give a whole number >= 1"),
    (["--minutes", "-2"], "argument --minutes: -2 is out of range: give a number >= 0"),
    (["--prompts", "-1"], "argument --prompts: -1 is out of range: give a whole number >= 0"),
    (["--measure", "--merge", "x"], "--measure and --merge are separate steps: run one, then the other"),
    (["--resume", "--measure"], "--resume trains: drop it with --measure or --merge"),
])
def test_bad_flags_are_one_line_errors(flags, words, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        finetune.main([*flags, "--data-dir", str(tmp_path / "nothing-read-yet")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"error: {words} (see ") and err.count("\n") == 1, err


def test_errors_from_the_command_line_are_one_line(world):
    root = world["root"]
    bad = script("--rank", "0")
    assert bad.returncode == 2 and bad.stderr == ("error: argument --rank: 0 is out of range: give a whole number >= 1 "
                                                   "(see finetune.py --help)\n")
    # an adapter put on another base: one line, nothing written
    other = script("--init-from", str(root / "base"), *world["common"], "--out-dir", str(root / "lora-rope"),
                   "--measure", "--prompts", "1")
    assert other.returncode != 0 and "Traceback" not in other.stderr
    assert len(other.stderr.strip().splitlines()) == 1
    assert "trained on another base (rope True vs False)" in other.stderr
    missing = script("--init-from", str(root / "base-rope"), *world["common"], "--out-dir", str(root / "none"),
                     "--resume")
    assert missing.returncode != 0 and missing.stderr.strip().startswith("error: no adapter at")
    assert not (root / "none").exists()


def test_a_json_over_the_adapter_being_made_is_refused(world, tmp_path):
    out = tmp_path / "lora"
    with pytest.raises(SystemExit) as e:
        finetune.main(["--init-from", str(world["root"] / "base-rope"), *world["common"], "--out-dir", str(out),
                       "--max-steps", "2", *FAST, "--json", str(out / "adapter.pt")])
    assert e.value.code == (f"error: --json {out / 'adapter.pt'} is a file of --out-dir {out}, which this command "
                            "writes: pick another file")
    assert not out.exists()


def test_a_rank_past_the_layers_width_is_refused_before_any_work(world, tmp_path):
    # the tiny base's layers are 32 wide: a rank-16 update of a 32 x 32 layer holds as many weights as it
    with pytest.raises(SystemExit) as e:
        finetune.main(["--init-from", str(world["root"] / "base-rope"), *world["common"], "--out-dir",
                       str(tmp_path / "lora"), "--rank", "16", *FAST])
    assert e.value.code == ("error: --rank 16 makes an update larger than the layer it adapts (this model's smallest "
                            "takes rank 15 at most): give a smaller --rank (default 8)")
    assert not (tmp_path / "lora").exists()


def test_a_fine_tune_trains_in_the_precision_pretraining_does(world, tmp_path):
    """bf16 products where native, as pretrain.py: the dtype is in the adapter's args, and the losses differ
    from a float32 run's by bf16's rounding, not more."""
    runs = {}
    for dtype in ("bfloat16", "float32"):
        summary = finetune.main(["--init-from", str(world["root"] / "base-rope"), *world["common"], "--out-dir",
                                 str(tmp_path / dtype), "--max-steps", "3", *FAST, "--dtype", dtype])
        runs[dtype] = read_adapter(tmp_path / dtype)
        assert runs[dtype]["args"]["dtype"] == dtype and summary["steps"] == 3
    bf16, fp32 = runs["bfloat16"]["losses"], runs["float32"]["losses"]
    assert bf16 != fp32 and max(abs(a - b) for a, b in zip(bf16, fp32, strict=True)) < 0.05
