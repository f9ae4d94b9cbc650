"""Nothing lost, anywhere: every way we know to lose a user's work, through the real command line.

Each case runs a script as `python scripts/X.py ARGS` does, forked from one driver as in
tests/test_cli_errors.py, in a world holding what a user's folder holds after some work: data, tiny
trained runs (a pretraining run with a history, a LoRA run), an export, a main job, a few damaged
files. A full disk is the kernel's: the case's writes to the files it names go to /dev/full.
Each must end with the one line shown (on stderr; on stdout for a note when the command goes on),
the exit code shown, no traceback, and every file of the world as it was, except those named by
the case: a run that goes on may grow its log and TensorBoard's files, never replace what it had.

docs/errors.md's sections after the scripts' are made from this table and what each case printed
(`python dev/errors_page.py`); test_the_docs_page_is_up_to_date fails when they have drifted.
The tests after the table check the rest: the rules under the scripts, and what now simply works.
"""

from __future__ import annotations

import fnmatch
import io
import json
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import finetune
import main as main_job
import numpy as np
import pretrain
import pytest
import torch
from conftest import ROOT, tiny_model
from test_cli_errors import HARM_MARK, hashes, make_world, run_forked
from test_instruct import write_corpus as write_instruct_corpus

from mvgpt.checkpoint import read_checkpoint, save_checkpoint
from mvgpt.data import data_tokenizer_hash, load_tokens, prepare
from mvgpt.device import pick_device
from mvgpt.kit.errors import UserError
from mvgpt.kit.runfolder import RunLock, claim, claim_file, holds, process_start
from mvgpt.kit.runlog import read_log
from mvgpt.model import sample
from mvgpt.train import LossWatch

SCRIPTS = ROOT / "scripts"
RUN = "--batch-size 4 --eval-batches 1"  # a resumed tiny run's flags (its model comes from its checkpoint)
BASE = "--init-from checkpoints/ibase --data-dir idata"  # the LoRA runs' base and data


@dataclass
class Harm:
    script: str  # scripts/NAME.py
    args: str  # as typed, in the world's folder
    expect: str  # a piece of the one line
    section: str  # the docs page's section
    code: int = 1  # the exit code
    why: str = ""  # what the case tries, for the docs page
    disk_full: str = ""  # writes to files whose names match this go to /dev/full
    grows: tuple[str, ...] = ()  # files that may grow, their old bytes kept in front
    may_change: tuple[str, ...] = ()  # files a run that goes on replaces (it trained on)
    new_under: tuple[str, ...] = ("runs/",)  # where new files may appear (TensorBoard's events)
    extra: str = ""  # the optional extra the case needs (tests/conftest.py), if any

    @property
    def command(self) -> str:
        return f"python scripts/{self.script}.py {self.args}".strip()


FOLDERS, RESUME, DIVERGE, DAMAGE, FULL, CRAFTED, JOB = (
    "Run folders", "Resuming", "Runs that diverge", "Torn and damaged files", "Full disks",
    "Devices, seeds and crafted files", "The main job")

HARMS: list[Harm] = [
    # one run per folder, of one kind; an input is never an output
    Harm("pretrain", "--max-steps 1 --out-dir checkpoints/lora-rope", "holds a LoRA run (adapter.pt), not a run",
         FOLDERS, why="a LoRA run's folder"),
    Harm("finetune", f"{BASE} --max-steps 2 --prompts 0", "holds a LoRA run (adapter.pt) already: continue it with "
         "--resume, start it again with --overwrite", FOLDERS, why="a finished fine-tune, run again"),
    Harm("finetune", f"{BASE} --out-dir checkpoints/ibase", "--out-dir checkpoints/ibase is where --init-from is "
         "read from", FOLDERS, why="the base's own folder"),
    Harm("finetune", f"{BASE} --merge checkpoints/ibase --overwrite", "--merge checkpoints/ibase is where "
         "--init-from is read from", FOLDERS, why="--overwrite never means the input"),
    Harm("finetune", f"{BASE} --merge checkpoints/real", "checkpoints/real holds a run (ckpt.pt) already: replace "
         "it with --overwrite", FOLDERS, why="another run's checkpoint"),
    Harm("export", "checkpoints/pretrain checkpoints/pretrain/ckpt.pt --format gguf --overwrite",
         "is read as the checkpoint", FOLDERS, why="the source checkpoint as the GGUF file"),
    Harm("export", "checkpoints/pretrain data --overwrite", "data is where --data-dir is read from", FOLDERS),
    Harm("export_check", "checkpoints/pretrain --out user", "user/pretrain is not empty, it holds files of its own",
         FOLDERS, why="a folder of the user's"),
    Harm("prepare", "--source stories --data-dir exports/hf", "holds an export (config.json), not prepared data",
         FOLDERS, why="an export's tokenizer.json"),
    Harm("prepare", "--source stories2", "data holds data prepared from stories", FOLDERS,
         why="another source over data runs were trained on"),
    Harm("pretrain", "--max-steps 1 --out-dir checkpoints/new --json checkpoints/pretrain/ckpt.pt",
         "is part of a run (ckpt.pt) in checkpoints/pretrain", FOLDERS, code=2, why="a summary over a checkpoint"),
    Harm("pretrain", "--max-steps 1 --out-dir checkpoints/new --json checkpoints/new/ckpt.pt",
         "is a file of --out-dir checkpoints/new, which this command writes", FOLDERS,
         why="a summary over the checkpoint the run is about to write"),
    Harm("finetune", f"{BASE} --max-steps 2 --prompts 0 --out-dir checkpoints/lora-new --json "
         "checkpoints/lora-new/adapter.pt", "is a file of --out-dir checkpoints/lora-new, which this command writes",
         FOLDERS, why="a summary over the adapter the fine-tune is about to write"),
    Harm("evaluate", "checkpoints/pretrain --json data/meta.json", "is part of prepared data (meta.json) in data",
         FOLDERS, code=2),
    # a resume continues the checkpoint's run
    Harm("pretrain", f"--out-dir checkpoints/real --resume --block-size 64 {RUN}", "holds a run with block_size=16, "
         "and --block-size asks for 64", RESUME),
    Harm("pretrain", f"--out-dir checkpoints/real --resume --rope-theta 500 {RUN}", "holds a run with "
         "rope_theta=10000.0, and --rope-theta asks for 500.0", RESUME),
    Harm("pretrain", f"--out-dir checkpoints/pretrain --resume {RUN}", "has no optimizer, rng, elapsed: it is a "
         "model, not a run to continue", RESUME, why="weights saved without their run"),
    # divergence: the run stops, the checkpoint before stays
    Harm("pretrain", f"--out-dir checkpoints/diverge --resume --lr 1e3 --max-steps 40 {RUN}", "the run has diverged "
         "and stops; the checkpoint of step 10 in checkpoints/diverge is kept as it was", DIVERGE,
         why="a learning rate a million times too high", grows=("checkpoints/diverge/log.jsonl",)),
    Harm("pretrain", f"--out-dir checkpoints/diverge-save --resume --lr 1e3 --max-steps 40 --ckpt-every 1 {RUN}",
         "the weights of step 11 give a loss of", DIVERGE, why="a save due right after the blow-up",
         grows=("checkpoints/diverge-save/log.jsonl",)),
    Harm("finetune", f"{BASE} --out-dir checkpoints/lora-diverge --resume --lr 1e30 --max-steps 40 --prompts 0",
         "the adapter of step 8 in checkpoints/lora-diverge is kept as it was", DIVERGE,
         grows=("checkpoints/lora-diverge/log.jsonl",)),
    # torn and damaged files
    Harm("pretrain", f"--out-dir checkpoints/torn --resume --max-steps 11 {RUN}", "note: checkpoints/torn/log.jsonl: "
         "dropped 1 damaged line", DAMAGE, code=0, why="a log line cut short, NUL bytes after it",
         may_change=("checkpoints/torn/ckpt.pt", "checkpoints/torn/log.jsonl")),
    Harm("pretrain", "--max-steps 1 --out-dir checkpoints/new --data-dir bad-data", "bad-data/train.bin is damaged: "
         "token 3 is id 65535, outside the vocabulary of 300", DAMAGE, why="a flipped bit in the tokens"),
    Harm("sample", "damaged.pt", "checkpoint damaged.pt is damaged on disk (the checksum of its record", DAMAGE,
         why="a flipped bit in the weights"),
    # full disks: one line, and the file before kept
    Harm("pretrain", f"--out-dir checkpoints/full-ckpt --resume --max-steps 12 --ckpt-every 1 {RUN}",
         "the disk is full: checkpoints/full-ckpt/ckpt.pt not saved (the previous checkpoint, if any, is kept)", FULL,
         disk_full=".ckpt.pt.tmp*", grows=("checkpoints/full-ckpt/log.jsonl",)),
    Harm("pretrain", f"--out-dir checkpoints/full-log --resume --max-steps 12 {RUN}",
         "cannot write checkpoints/full-log/log.jsonl at step 11 (No space left on device)", FULL,
         disk_full="log.jsonl"),
    Harm("pretrain", f"--out-dir checkpoints/full-tb --resume --max-steps 12 {RUN}", "note: TensorBoard's log in "
         "runs/full-tb is not written from here on (No space left on device): the run goes on", FULL, code=0,
         disk_full="events.out.tfevents*", may_change=("checkpoints/full-tb/ckpt.pt", "checkpoints/full-tb/log.jsonl")),
    Harm("finetune", f"{BASE} --out-dir checkpoints/lora-full --resume --max-steps 10 --ckpt-every 1 --prompts 0",
         "the disk is full: checkpoints/lora-full/adapter.pt not saved", FULL, disk_full=".adapter.pt.tmp*",
         grows=("checkpoints/lora-full/log.jsonl",)),
    Harm("finetune", f"{BASE} --merge merged", "the disk is full: merged/ckpt.pt not saved", FULL,
         disk_full=".ckpt.pt.tmp*"),
    Harm("export", "checkpoints/pretrain exports/hf --overwrite", "the disk is full: the export to exports/hf was not "
         "written (what it held before is kept)", FULL, disk_full="model.safetensors", extra="export"),
    Harm("export", "checkpoints/pretrain-rope exports/x.gguf --format gguf", "the disk is full: exports/x.gguf not "
         "written", FULL, disk_full=".x.gguf.tmp*", extra="export"),
    Harm("prepare", "--source stories2 --force", "the disk is full: data was not prepared (the data there before, "
         "if any, is as it was)", FULL, disk_full=".train.bin.tmp*"),
    # devices, seeds and crafted files
    Harm("sample", "checkpoints/pretrain --device xpu", "device 'xpu' asked for, but this machine has none", CRAFTED,
         why="a device torch knows, this machine lacks"),
    Harm("sample", "checkpoints/pretrain --seed 18446744073709551616", "--seed: 18446744073709551616 is out of range",
         CRAFTED, code=2),
    Harm("pretrain", "--seed 18446744073709551616", "--seed: 18446744073709551616 is out of range", CRAFTED, code=2),
    Harm("sample", "checkpoints/ibase --data-dir idata --adapter rank0.pt", "adapter rank0.pt has rank 0, which no "
         "adapter can have", CRAFTED),
    Harm("sample", "checkpoints/ibase --data-dir idata --adapter rank-huge.pt", "has rank 1000000000000 (its weights "
         "have rank 8), which no adapter can have", CRAFTED, why="it would ask for terabytes"),
    Harm("sample", "checkpoints/ibase --data-dir idata --adapter alpha-nan.pt", "has alpha nan, which no adapter "
         "can have", CRAFTED),
    # the main job
    Harm("main", "--source stories2 --out job --tiny", "job/data was prepared from stories (vocabulary 300)", JOB,
         why="a new source over trained runs"),
    Harm("main", "--source stories --out checkpoints/pretrain --tiny", "--out checkpoints/pretrain holds a run "
         "(ckpt.pt): give the job a folder of its own", JOB),
]


# ----------------------------------------------------------------------------------------------
# The world: test_cli_errors's, and what a user has after some work


def flip_a_weight(src: Path, dst: Path) -> None:
    """A copy of a checkpoint with one bit flipped inside a tensor's bytes (as a disk's decay would)."""
    data = bytearray(src.read_bytes())
    with zipfile.ZipFile(src) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)  # the largest tensor
    name_len, extra_len = int.from_bytes(data[info.header_offset + 26: info.header_offset + 28], "little"), \
        int.from_bytes(data[info.header_offset + 28: info.header_offset + 30], "little")
    data[info.header_offset + 30 + name_len + extra_len + 5] ^= 0x10
    dst.write_bytes(bytes(data))


def make_harm_world(root: Path) -> Path:
    world = make_world(root)
    runs, ckpts = str(world / "runs"), world / "checkpoints"
    tiny = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16", "--batch-size", "4",
            "--eval-batches", "1", "--warmup", "2", "--minutes", "0", "--runs-dir", runs, "--device", "cpu"]
    # a pretraining run with a history: 10 steps, saved at 10; copies of it for the cases that go on
    pretrain.main([*tiny, "--rope", "--max-steps", "10", "--ckpt-every", "10", "--eval-every", "5",
                   "--data-dir", str(world / "data"), "--out-dir", str(ckpts / "real")])
    for name in ("diverge", "diverge-save", "torn", "full-ckpt", "full-log", "full-tb"):
        shutil.copytree(ckpts / "real", ckpts / name)
    with open(ckpts / "torn" / "log.jsonl", "ab") as f:  # what a power cut leaves: a line cut short, NUL padding
        f.write(b'{"step": 11, "loss": 4.9, "gr' + b"\x00" * 64)
    # a LoRA run on a base trained on instruction-ready data
    (world / "istories").mkdir()
    write_instruct_corpus(world / "istories")
    prepare(world / "istories", world / "idata", vocab_size=300)
    pretrain.main([*tiny, "--rope", "--max-steps", "6", "--block-size", "32", "--data-dir", str(world / "idata"),
                   "--out-dir", str(ckpts / "ibase")])  # a window that holds a prompt and its story
    finetune.main(["--init-from", str(ckpts / "ibase"), "--data-dir", str(world / "idata"), "--out-dir",
                   str(ckpts / "lora-rope"), "--runs-dir", runs, "--max-steps", "8", "--ckpt-every", "8",
                   "--batch-size", "4", "--eval-examples", "8", "--prompts", "0", "--device", "cpu"])
    for name in ("lora-diverge", "lora-full"):
        shutil.copytree(ckpts / "lora-rope", ckpts / name)
    adapter = torch.load(ckpts / "lora-rope" / "adapter.pt", weights_only=True)
    for name, change in (("rank0.pt", {"rank": 0}), ("rank-huge.pt", {"rank": 10**12}),
                         ("alpha-nan.pt", {"alpha": float("nan")})):
        torch.save({**adapter, **change}, world / name)
    # an export, another source, a job with a trained run, a folder of the user's, damaged files
    (world / "exports" / "hf").mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        (world / "exports" / "hf" / name).write_text(f"an export's {name}\n")
    (world / "stories2").mkdir()
    from conftest import write_corpus
    write_corpus(world / "stories2" / "train.txt", 300, seed=3)
    write_corpus(world / "stories2" / "valid.txt", 40, seed=4)
    shutil.copytree(world / "data", world / "job" / "data")
    shutil.copytree(ckpts / "pretrain", world / "job" / "checkpoints" / "pretrain")
    (world / "user" / "pretrain").mkdir(parents=True)
    (world / "user" / "pretrain" / "my-notes.txt").write_text("mine\n")
    shutil.copytree(world / "data", world / "bad-data")
    tokens = bytearray((world / "bad-data" / "train.bin").read_bytes())
    tokens[6:8] = b"\xff\xff"  # token 3: id 65535, past any vocabulary of ours
    (world / "bad-data" / "train.bin").write_bytes(bytes(tokens))
    flip_a_weight(ckpts / "pretrain" / "ckpt.pt", world / "damaged.pt")
    return world


# ----------------------------------------------------------------------------------------------
# The driver: one process imports everything, each case is a fork of it


def disk_full(pattern: str) -> None:
    """From now on, in this process, a file opened for writing whose name matches `pattern` is
    /dev/full, where the kernel answers every write with ENOSPC (a full disk, as it is)."""
    real = io.open

    def full_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)) and set(mode) & set("wax+") and \
                fnmatch.fnmatch(Path(os.fsdecode(file)).name, pattern):
            return real("/dev/full", mode.replace("x", "w"), *args, **kwargs)
        return real(file, mode, *args, **kwargs)

    import builtins
    builtins.open = io.open = full_open


def run_case(case: Harm, world: Path) -> dict:
    """One case in a fork of this process (a full disk set up in the child); what it printed, what it
    changed in the world, and whether a file it grew kept what it held in front."""
    out, err = world.parent / "case.out", world.parent / "case.err"
    before = {k: (world / k).read_bytes() for k in hashes(world)}
    code = run_forked(case.script, case.args, out, err,
                      (lambda: disk_full(case.disk_full)) if case.disk_full else None)
    after = hashes(world)
    changed = sorted(k for k in before if k not in after or hashes_of(before[k]) != after[k])
    return {
        "command": case.command,
        "code": code,
        "stderr": err.read_text(errors="replace"),
        "notes": [line for line in out.read_text(errors="replace").splitlines() if line.startswith("note: ")],
        "changed": changed,
        "kept_in_front": sorted(k for k in changed if k in case.grows and (world / k).exists()
                                and (world / k).read_bytes().startswith(before[k])),
        "new": sorted(after.keys() - before.keys()),
    }


def hashes_of(data: bytes) -> str:
    import hashlib
    return hashlib.sha256(data).hexdigest()


def drive(world: Path, results: Path) -> None:
    """The driver's main: import what the scripts import, then run every case in the world."""
    os.chdir(world)
    for name in sorted({c.script for c in HARMS}):
        runpy.run_path(str(SCRIPTS / f"{name}.py"), run_name="preload")  # imports only: main() is not run
    results.write_text(json.dumps([run_case(case, world) for case in HARMS]))


def run_all(folder: Path) -> list[dict]:
    head = (f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests')!r}, {str(SCRIPTS)!r}]\n"
            f"from pathlib import Path; from test_nothing_lost import drive, make_harm_world\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    # the world is made in a process of its own: the driver's forks must not inherit the thread pools that
    # training a tokenizer starts (a fork's copy of a pool has no threads, and waits for them for good)
    for line in (f"make_harm_world(Path({str(folder / 'world')!r}))",
                 f"drive(Path({str(folder / 'world')!r}), Path({str(folder / 'results.json')!r}))"):
        subprocess.run([sys.executable, "-c", head + line], check=True, env=env, timeout=30 * 60)
    outcomes = json.loads((folder / "results.json").read_text())
    world = folder / "world"
    for outcome in outcomes:  # paths as typed in the world's folder; what varies by run, named
        for key in ("stderr",):
            text = outcome[key].replace(str(world) + "/", "").replace(str(world), ".")
            text = re.sub(r"(give a loss of|median) [\d.e+-]+", r"\1 X", text)
            outcome[key] = re.sub(r"the [\d.e+-]+ of the steps before", "the X of the steps before", text)
        outcome["notes"] = [n.replace(str(world) + "/", "") for n in outcome["notes"]]
    return outcomes


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> list[dict]:
    return run_all(tmp_path_factory.mktemp("harm"))


def test_every_case_is_a_different_command():
    assert len({(c.command, c.disk_full) for c in HARMS}) == len(HARMS)


@pytest.mark.parametrize("i", [pytest.param(i, marks=[pytest.mark.extra(c.extra)] if c.extra else [],
                                            id=c.command.removeprefix("python scripts/")
                                            + (" (disk full)" if c.disk_full else "")) for i, c in enumerate(HARMS)])
def test_one_line_the_exit_code_and_nothing_lost(outcomes, i):
    case, got = HARMS[i], outcomes[i]
    assert "Traceback" not in got["stderr"], got["stderr"]
    assert got["code"] == case.code, got
    lines = got["stderr"].splitlines() if case.code else got["notes"]
    assert len(lines) == 1 and case.expect in lines[0], got
    if case.code == 0:
        assert got["stderr"] == "", got["stderr"]
    assert set(got["changed"]) <= set(case.grows) | set(case.may_change), got  # nothing else touched
    assert [k for k in got["changed"] if k in case.grows] == got["kept_in_front"], got  # grown, not rewritten
    assert all(k.startswith(case.new_under) or k in case.may_change for k in got["new"]), got


# ----------------------------------------------------------------------------------------------
# The docs page: its sections after the scripts'

def harm_page(outcomes: list[dict]) -> str:
    sessions: dict[str, list[str]] = {}
    for case, got in zip(HARMS, outcomes, strict=True):
        said = [w for w in (case.why, "a full disk" if case.disk_full else "") if w]
        why = f"   # {', '.join(said)}" if said else ""
        shown = got["stderr"] if case.code else "".join(n + "\n" for n in got["notes"])
        sessions.setdefault(case.section, []).append(f"$ {got['command']}{why}\n{shown}(exit {got['code']})")
    body = "\n\n".join(f"### {name}\n\n{textwrap.fill(INTROS[name], 100)}\n\n```console\n" + "\n".join(runs)
                       + "\n```" for name, runs in sessions.items())
    return HARM_MARK + HARM_PAGE.format(count=len(HARMS), body=body)


INTROS = {
    FOLDERS: "A run folder holds one run. Another run there needs `--resume` or `--overwrite`. Another kind "
             "of thing is refused, whatever the flags. `--overwrite` never means a file the command reads.",
    RESUME: "A resume continues the checkpoint's run. Its model comes from the checkpoint; a flag that says "
            "otherwise is refused. The optimization, time, evaluation and device flags may change.",
    DIVERGE: "A checkpoint is saved only from sane weights. The run stops when its loss runs away: the median of "
             "its last 3 losses, or the loss of the weights about to be saved, above twice the median of the 50 "
             "losses before. The last checkpoint stays as it was; the log keeps the steps that ran.",
    DAMAGE: "A torn log line is dropped on resume, with a note. Token files are checked against the vocabulary "
            "when loaded. A checkpoint's checksums are checked before it is read.",
    FULL: "Each write below went to a full disk. The file there before is kept. TensorBoard's log is a view "
          "of the run: without it the run goes on, and log.jsonl has every step.",
    CRAFTED: "A device this machine lacks is named as such, never blamed on a checkpoint. Seeds stop where "
             "torch's generators do. A crafted adapter is refused before anything is allocated from it.",
    JOB: "main.py's \"done\" means done for this data. A new source over trained runs is refused. SIGTERM "
         "is passed to the step in progress, which saves; main.py waits for it and says so in one line.",
}

HARM_PAGE = """
## What is never lost

The sections below were run by `tests/test_nothing_lost.py` in the same kind of folder, with more
in it: a trained run (`checkpoints/real` and copies), a LoRA run, an export, a job, damaged files.
Each ended with the one line shown and the exit code shown, and left every file as it was, but for
a run that went on: its log grew, and TensorBoard's files were added. {count} cases.

{body}

### What now simply works

These ended in a traceback before; tests in `tests/test_nothing_lost.py` check that they work:
exporting a checkpoint saved before its first evaluation, `--temperature 1e-40` (it samples as
greedy does), resuming a long-context fine-tune with no flags (its position interpolation stays),
a lock left by a process whose number the system has since given to another (it is taken over),
and sinks with dynamic NTK in one cache (as exact as dynamic NTK's own cache).
"""


@pytest.mark.extra("export")  # the page shows every case, the export's too
def test_the_docs_page_is_up_to_date(outcomes):
    written = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    assert HARM_MARK in written and HARM_MARK + written.split(HARM_MARK)[1] == harm_page(outcomes), \
        "docs/errors.md has drifted from the table: run `python dev/errors_page.py`"


# ----------------------------------------------------------------------------------------------
# The rules underneath


def test_what_a_folder_holds_and_who_may_write_it(tmp_path):
    run, lora, data, mine = (tmp_path / n for n in ("run", "lora", "data", "mine"))
    save_checkpoint(run, tiny_model(), step=1)
    (run / "log.jsonl").write_text("")
    (run / "lock").write_text("1 2")  # a lock and temporary files say nothing of what a folder is
    for folder, name in ((lora, "adapter.pt"), (lora, ".adapter.pt.tmp9"), (data, "meta.json"), (mine, "notes.txt")):
        folder.mkdir(exist_ok=True)
        (folder / name).write_text("x")
    assert [holds(p)[0] for p in (run, lora, data, mine)] == ["checkpoint", "lora", "data", "files"]
    assert holds(tmp_path / "none") is None
    claim(run, "checkpoint", "--out-dir", resume=True)
    claim(run, "checkpoint", "--out-dir", resume=False, overwrite=True)
    claim(tmp_path / "new", "checkpoint", "--out-dir", resume=False)
    for folder, kind, flags, message in [
        (run, "checkpoint", {"resume": False}, "holds a run (ckpt.pt) already: continue it with --resume"),
        (run, "lora", {"resume": False, "overwrite": True}, "holds a run (ckpt.pt), not a LoRA run"),
        (data, "export", {"overwrite": True}, "holds prepared data (meta.json), not an export"),
        (mine, "export", {}, "is not empty, it holds files of its own (notes.txt)"),
        (run, "checkpoint", {"overwrite": True, "reads": {"--init-from": run / "ckpt.pt"}},
         "is where --init-from is read from"),
    ]:
        with pytest.raises(UserError, match=re.escape(message)):
            claim(folder, kind, "--out-dir", **flags)
    claim(mine, "export", "OUT", overwrite=True)
    (mine / "README.md").write_text("my notes")  # a name an export writes: the refusal says it would go
    with pytest.raises(UserError, match=re.escape("write there anyway (it replaces their README.md)")):
        claim(mine, "export", "OUT")
    with pytest.raises(UserError, match="is read as --init-from"):
        claim_file(run / "ckpt.pt", "OUT", reads={"--init-from": run / "ckpt.pt"})
    with pytest.raises(UserError, match="is part of a LoRA run"):
        claim_file(lora / "adapter.pt", "--json")
    with pytest.raises(UserError, match="is there already"):
        claim_file(mine / "notes.txt", "OUT", overwrite=False)


def test_a_stale_lock_is_named_and_taken_over_a_live_one_refuses(tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    me = process_start(os.getpid())
    (folder / "lock").write_text(f"{os.getpid()} {me}")  # this very process: alive, the same start
    with pytest.raises(UserError, match=f"{folder} is in use by process {os.getpid()}"):
        RunLock(folder).__enter__()
    (folder / "lock").write_text(f"{os.getpid()} {int(me) - 1}")  # its number, another start: a reused pid
    with RunLock(folder):
        assert (folder / "lock").read_text() == f"{os.getpid()} {me}\n"
    assert "which is gone (its number now belongs to another process)" in capsys.readouterr().out
    for damaged in ("garbage", "99999999999999999999 5", "-1 5", "0 5"):  # no process has these numbers
        (folder / "lock").write_text(damaged)
        with RunLock(folder):
            pass
        assert "names no process (the file is damaged)" in capsys.readouterr().out, damaged
    assert sorted(p.name for p in folder.iterdir()) == []  # released, and nothing left behind
    with pytest.raises(UserError):  # a refused run leaves no folder it made
        with RunLock(tmp_path / "made"):
            raise UserError("refused")
    assert not (tmp_path / "made").exists()


def test_a_torn_log_keeps_its_whole_records_up_to_the_step(tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    log.write_bytes(b'{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.0}\n{"step": 3, "loss": 3.0}\n{"step": 4, "l'
                    + b"\x00" * 30)
    assert read_log(log, 2) == [{"step": 1, "loss": 5.0}, {"step": 2, "loss": 4.0}]
    assert log.read_text() == '{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.0}\n'
    assert capsys.readouterr().out.count("\n") == 1
    read_log(log, 2)
    assert capsys.readouterr().out == ""  # a whole log: no note


def test_the_divergence_rule():
    steady = [5.0 - 0.01 * i for i in range(60)]
    watch = LossWatch(steady)
    assert watch.step(4.9, 61) is None and watch.step(9.5, 62) is None  # one bad batch is not a run away
    assert "ran away at step 63" in watch.step(9.6, 63)  # two in the last three are
    assert LossWatch([1.0, 2.0]).step(100.0, 3) is None  # too little history to judge: only non-finite stops
    assert "became nan" in LossWatch().step(float("nan"), 1)
    assert LossWatch(steady).check(4.0, 60) is None and "more than 2x" in LossWatch(steady).check(9.5, 60)
    assert LossWatch("crafted").losses == []


# ----------------------------------------------------------------------------------------------
# What now works, and the job's stops


TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16", "--batch-size", "4",
        "--eval-batches", "1", "--eval-every", "3", "--warmup", "2", "--minutes", "0"]


def tiny_run(data_dir, root, name, *extra) -> dict:
    return pretrain.main([*TINY, "--data-dir", str(data_dir), "--out-dir", str(root / name),
                          "--runs-dir", str(root / "runs"), *extra])


def test_a_long_context_fine_tune_resumes_as_itself(data_dir, tmp_path):
    tiny_run(data_dir, tmp_path, "base", "--max-steps", "2", "--rope")
    tiny_run(data_dir, tmp_path, "long", "--max-steps", "2", "--init-from", str(tmp_path / "base"),
             "--block-size", "32", "--rope-scaling", "linear")
    out = pretrain.main(["--batch-size", "2", "--eval-batches", "1", "--max-steps", "3", "--resume", "--data-dir",
                         str(data_dir), "--out-dir", str(tmp_path / "long"), "--runs-dir", str(tmp_path / "runs")])
    config = read_checkpoint(tmp_path / "long")["config"]
    assert (out["steps"], config["block_size"], config["rope_linear_factor"]) == (3, 32, 2.0)


def test_a_finished_run_resumed_writes_its_summary_and_trains_nothing(data_dir, tmp_path):
    first = tiny_run(data_dir, tmp_path, "done", "--max-steps", "6")
    before = (tmp_path / "done" / "ckpt.pt").read_bytes()
    again = tiny_run(data_dir, tmp_path, "done", "--max-steps", "6", "--resume")
    assert (tmp_path / "done" / "ckpt.pt").read_bytes() == before
    keys = ("steps", "tokens", "evals", "val_loss", "tokens_per_s")
    assert {k: again[k] for k in keys} == {k: first[k] for k in keys}  # the whole run's, from its log


def test_main_makes_a_summary_a_stop_left_unmade(data_dir, tmp_path):
    """A kill between the last checkpoint and the summary: the next main.py writes the summary, trains nothing."""
    tiny_run(data_dir, tmp_path, "run", "--max-steps", "4")
    before = (tmp_path / "run" / "ckpt.pt").read_bytes()
    summary = tmp_path / "results" / "run.json"
    common = ["--data-dir", str(data_dir), "--runs-dir", str(tmp_path / "runs"), "--device", "cpu"]
    main_job.train([str(SCRIPTS / "pretrain.py"), *TINY, "--max-steps", "4"], tmp_path / "run", 4, summary,
                   common, dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"))
    assert json.loads(summary.read_text())["steps"] == 4 and (tmp_path / "run" / "ckpt.pt").read_bytes() == before


def test_main_counts_a_run_from_other_data_as_not_done_and_says_so(data_dir, tmp_path):
    save_checkpoint(tmp_path / "run", tiny_model(), step=7, tokenizer_hash="0123456789abcdef")
    assert main_job.finished_steps(tmp_path / "run") == 7
    with pytest.raises(UserError, match="trained with tokenizer 0123456789abcdef, but the data is now prepared with"):
        main_job.finished_steps(tmp_path / "run", data_tokenizer_hash(data_dir))


def test_main_prepares_a_new_source_again_when_no_run_was_trained(corpus_dir, tmp_path, monkeypatch, capsys):
    prepare(corpus_dir, tmp_path / "job" / "data", vocab_size=300)
    other = tmp_path / "other"
    other.mkdir()
    for name in ("train.txt", "valid.txt"):
        (other / name).write_text((corpus_dir / name).read_text() + "One more.\n<|endoftext|>\n")
    steps = []
    monkeypatch.setattr(main_job, "run", lambda step, env: steps.append(step))
    base = ["prepare.py", "--data-dir", str(tmp_path / "job" / "data"), "--vocab-size", "300"]
    main_job.prepare_data([*base, "--source", str(corpus_dir)], {})  # the same source: as it is
    main_job.prepare_data([*base, "--source", str(other)], {})
    assert steps == [[*base, "--source", str(corpus_dir)], [*base, "--source", str(other), "--force"]]
    assert "no run was trained on it yet: preparing it again" in capsys.readouterr().out


def test_sigterm_to_main_stops_its_step_waits_and_says_so_once(corpus_dir, tmp_path):
    out = tmp_path / "job"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    with open(tmp_path / "main.out", "w") as log:
        child = subprocess.Popen([sys.executable, str(SCRIPTS / "main.py"), "--source", str(corpus_dir), "--tiny",
                                  "--out", str(out), "--max-steps", "1000000", "--device", "cpu"],
                                 stdout=log, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
        ckpt = out / "checkpoints" / "pretrain" / "ckpt.pt"
        deadline = time.monotonic() + 300
        while not ckpt.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        child.send_signal(signal.SIGTERM)  # to main.py alone, as `kill PID` does
        _, err = child.communicate(timeout=300)
    # one line: the step's own, with the job's advice (it stopped after a step and saved), none from main.py
    said = (tmp_path / "main.out").read_text() + err
    assert child.returncode == 143 and err == "" and said.count("run the same command again") == 1, said
    assert not (out / "checkpoints" / "pretrain" / "lock").exists()  # the step ended, its lock with it
    assert read_checkpoint(out / "checkpoints" / "pretrain")["step"] >= 1


@pytest.mark.extra("export")
def test_a_checkpoint_saved_before_its_first_evaluation_exports(data_dir, tmp_path):
    import export

    save_checkpoint(tmp_path / "early", tiny_model(vocab_size=300), step=1, val_loss=None,
                    tokenizer_hash=data_tokenizer_hash(data_dir))
    export.main([str(tmp_path / "early"), str(tmp_path / "hf"), "--data-dir", str(data_dir)])
    assert "Held-out loss" not in (tmp_path / "hf" / "README.md").read_text()
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == [
        "README.md", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json"]  # and no staging folder left


def test_a_tiny_temperature_samples_as_greedy():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 30
    greedy = sample(logits, 0)
    assert torch.equal(sample(logits, 1e-40, generator=torch.Generator().manual_seed(1)), greedy)
    assert torch.equal(sample(logits, 1e-40, top_k=5, generator=torch.Generator().manual_seed(1)), greedy)


def test_a_token_file_is_checked_once_when_loaded(data_dir, tmp_path):
    bad = tmp_path / "data"
    shutil.copytree(data_dir, bad)
    tokens = np.fromfile(bad / "val.bin", dtype=np.uint16)
    tokens[1234] = 300  # one past the vocabulary
    tokens.tofile(bad / "val.bin")
    with pytest.raises(SystemExit, match=r"val.bin is damaged: token 1,234 is id 300, outside the vocabulary of 300"):
        load_tokens(bad, "val")
    assert len(load_tokens(bad, "train")) > 0  # the other split is sound


def test_a_sound_checkpoint_is_never_called_corrupt_and_a_damaged_one_is(data_dir, tmp_path):
    save_checkpoint(tmp_path / "run", tiny_model(), step=1)
    state = read_checkpoint(tmp_path / "run", map_location="meta")  # read on the CPU, then moved: never "corrupt"
    assert state["step"] == 1 and state["model"]["wte.weight"].device.type == "meta"
    flip_a_weight(tmp_path / "run" / "ckpt.pt", tmp_path / "flipped.pt")
    with pytest.raises(SystemExit, match="is damaged on disk"):
        read_checkpoint(tmp_path / "flipped.pt")
    with pytest.raises(SystemExit, match="device 'xpu' asked for, but this machine has none"):
        pick_device("xpu")
