"""Every bad input we know of, through the real command line: one line, a non-zero exit, nothing lost.

Each case runs a script as `python scripts/X.py ARGS` does (its __main__ block, argparse, run_main)
in a world of its own: a folder holding prepared data and tiny checkpoints under the default names
(data/, checkpoints/pretrain, ...), the working directory of every case. A case's process is forked
from a driver that imported the scripts once: a fresh interpreter per case would spend minutes
importing torch on two cores. Each must exit non-zero with exactly one line on stderr and no
traceback, and leave every file of the world as it was (hashes before and after).
Kill -9 and Ctrl-C of prepare, pretrain and main run as real processes, below the table.

docs/errors.md is made from this table and what each case printed: `python dev/errors_page.py`
writes it; test_the_docs_page_is_up_to_date fails when it has drifted.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import runpy
import shlex
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
import torch
from conftest import ROOT, tiny_config, write_corpus

from mvgpt.checkpoint import read_checkpoint, save_checkpoint
from mvgpt.data import data_tokenizer_hash, prepare, read_meta
from mvgpt.lora import apply_lora, save_adapter, weights_hash
from mvgpt.model import GPT

SCRIPTS = ROOT / "scripts"
CASE_SECONDS = 60  # a case still running after this did work instead of refusing: a failure


@dataclass
class Case:
    script: str  # scripts/NAME.py
    args: str  # as typed, in the world's folder
    expect: str  # a piece of the one line
    why: str = ""  # what the case tries, for the docs page

    @property
    def command(self) -> str:
        return f"python scripts/{self.script}.py {self.args}".strip()


CASES: list[Case] = [
    # prepare: checked before anything is read or deleted
    Case("prepare", "--source stories --vocab-size 0", "--vocab-size: 0 is out of range", "a typo on prepared data"),
    Case("prepare", "--source stories --vocab-size 70000", "give a whole number from 258 to 65536",
         "ids must fit in uint16"),
    Case("prepare", "--source stories --max-train-mb nan",
         "argument --max-train-mb: nan is not a finite number: give a number >= 0"),
    Case("prepare", "--source stories --data-dir notes.txt", "notes.txt is a file: give a folder"),
    Case("prepare", "--source stories --json notes.txt/counts.json", "notes.txt is a file, not a folder"),
    Case("prepare", "--source missing", "source missing does not exist"),
    Case("prepare", "--source pipe", "source pipe is not a regular file", "a named pipe: no hang"),
    Case("prepare", "--source latin1.txt", "is not UTF-8 text", "a source in another encoding"),
    Case("prepare", "--source notes.txt", "no <|endoftext|> separators"),
    Case("prepare", "--source ''", "argument --source: is empty", "an unset variable ($SOURCE)"),
    Case("prepare", "--source stories --data-dir checkpoints", "--data-dir checkpoints holds runs (busy, lora-r2, "
         "pretrain, ...): give the data a folder of its own", "data among the run folders"),
    Case("prepare", "--source stories.gz", "stories.gz is compressed (gzip), not text: unpack it first",
         "a download not unpacked"),
    Case("prepare", "--source two.txt --data-dir tiny-data", "is too short to learn a single merge",
         "two one-letter stories: a tokenizer of bytes alone, which no script could read"),
    Case("prepare", "--source stories --data-dir damaged-data", "its meta.json is missing or damaged",
         "data whose meta.json was damaged: runs may need its tokenizer"),
    # pretrain: a run folder is someone's work
    Case("pretrain", "--max-steps 1 --out-dir checkpoints/pretrain", "holds a run (ckpt.pt) already",
         "forgetting --resume"),
    Case("pretrain", "--rope --max-steps 0", "argument --max-steps: 0 is out of range: give a whole number >= 1"),
    Case("pretrain", "--rope --n-layer 1000000000000000000000000000000", "more than this machine's",
         "a model no memory holds"),
    Case("pretrain", "--rope --batch-size 100000000", "make the model or the batch smaller", "a batch no memory holds"),
    Case("pretrain", "--runs-dir data --max-steps 1 --out-dir checkpoints/new", "data holds prepared data",
         "TensorBoard's files among the data's"),
    Case("pretrain", "--rope --minutes -1", "argument --minutes: -1 is out of range: give a number >= 0"),
    Case("pretrain", "--rope --minutes nan", "argument --minutes: nan is not a finite number: give a number >= 0"),
    Case("pretrain", "--grad-clip -1", "argument --grad-clip: -1 is out of range: give a number >= 0",
         "would reverse training"),
    Case("pretrain", "--min-lr-ratio -3", "argument --min-lr-ratio: -3 is out of range: give a number from 0 to 1",
         "a negative learning rate"),
    Case("pretrain", "--block-size 0", "argument --block-size: 0 is out of range: give a whole number >= 1"),
    Case("pretrain", "--batch-size 0", "argument --batch-size: 0 is out of range: give a whole number >= 1"),
    Case("pretrain", "--eval-every 0", "argument --eval-every: 0 is out of range: give a whole number >= 1"),
    Case("pretrain", "--eval-at 50 0", "argument --eval-at: 0 is out of range: give a whole number >= 1"),
    Case("pretrain", "--ckpt-every 0", "argument --ckpt-every: 0 is out of range: give a whole number >= 1"),
    Case("pretrain", "--seed -1", "argument --seed: -1 is out of range: give a whole number from 0 to 2**63 - 1"),
    Case("pretrain", "--lr nan", "argument --lr: nan is not a finite number: give a number above 0"),
    Case("pretrain", "--n-embd 65", "--n-embd 65 must be a multiple of --n-head 6"),
    Case("pretrain", "--resume --overwrite", "contradict each other"),
    Case("pretrain", "--max-steps 1 --out-dir checkpoints/new --json notes.txt/run.json",
         "argument --json: cannot write notes.txt/run.json: notes.txt is a file, not a folder",
         "an unwritable summary, caught before the run"),
    Case("pretrain", "--max-steps 1 --out-dir checkpoints/new --data-dir missing",
         "no folder missing: check --data-dir"),
    Case("pretrain", "--max-steps 1 --out-dir checkpoints/new --init-from corrupt.pt", "truncated or corrupt"),
    Case("pretrain", "--max-steps 1 --out-dir checkpoints/new --init-from other-tokenizer.pt",
         "was trained with tokenizer 0123456789abcdef", "another tokenizer's weights"),
    Case("pretrain", "--max-steps 1 --out-dir checkpoints/new --init-from checkpoints/pretrain-rope --block-size 64 "
         "--rope-scaling linear --rope-factor -2", "argument --rope-factor: -2 is out of range: give a number above 0"),
    Case("pretrain", "--max-steps 9 --out-dir checkpoints/busy --resume", "is in use by process",
         "a second process in a live run folder"),
    Case("pretrain", "--max-steps 1 --out-dir mine", "files of its own (log.jsonl)",
         "a folder with a log.jsonl that is not a run's"),
    Case("pretrain", "--max-steps 1 --out-dir ''", "argument --out-dir: an empty name: give a folder",
         "an unset variable, which would mean the default folder"),
    Case("pretrain", "--max-steps 1 --out-dir checkpoints/new --json ''", "argument --json: an empty name"),
    Case("pretrain", "--max-steps 1 --out-dir checkpoints/new --runs-dir checkpoints",
         "give TensorBoard a folder of its own", "TensorBoard's files inside the run folder"),
    Case("pretrain", "--max-steps 1 --out-dir stopped", "holds a run's log, with no checkpoint yet (a run stopped "
         "before its first save): start it again with --overwrite", "a run's folder with its log alone: kept"),
    Case("pretrain", "--max-steps 1 --out-dir elsewhere/pretrain --runs-dir checkpoints",
         "TensorBoard files in checkpoints/pretrain, which holds a run (ckpt.pt)",
         "TensorBoard's files in another run's folder"),
    Case("pretrain", "--max-steps 1 --out-dir elsewhere/data --runs-dir .",
         "TensorBoard files in data, which holds prepared data", "TensorBoard's files in the data"),
    Case("pretrain", "--max-steps 1 --out-dir checkpoints/new --init-from text.pt", "truncated or corrupt",
         "a text file named like a checkpoint"),
    # evaluate
    Case("evaluate", "checkpoints/pretrain --tokens 0", "--tokens: 0 is out of range"),
    Case("evaluate", "checkpoints", "it holds run folders: name them, e.g. checkpoints/*",
         "the folder of runs, where each run was meant"),
    Case("evaluate", "checkpoints/pretrain --batch-size 0", "--batch-size: 0 is out of range"),
    Case("evaluate", "checkpoints/missing", "nothing at checkpoints/missing: give a run folder"),
    Case("evaluate", "corrupt.pt", "truncated or corrupt"),
    Case("evaluate", "other-tokenizer.pt", "was trained with tokenizer 0123456789abcdef"),
    Case("evaluate", "crafted.pt", "which no model can have", "a crafted config"),
    Case("evaluate", "huge.pt", "GiB", "a config that asks for terabytes"),
    Case("evaluate", "checkpoints/pretrain-rope --ctx 20000", "held-out tokens are too few for one window of "
         "20,000: give a --ctx of at most", "a --ctx longer than the held-out text"),
    Case("evaluate", "checkpoints/pretrain-rope --ctx 100000000", "give a smaller --ctx",
         "a window no memory holds, before the table"),
    Case("evaluate", "checkpoints/pretrain --json notes.txt", "notes.txt is there already and is not JSON",
         "a user's file as the summary"),
    Case("evaluate", "wide.pt", "reads 512 token ids, but the data's tokenizer makes 300",
         "a checkpoint with more token ids than the tokenizer"),
    Case("evaluate", "checkpoints/pretrain --json notes.txt/eval.json", "notes.txt is a file, not a folder"),
    Case("evaluate", "checkpoints/pretrain --data-dir missing", "no folder missing: check --data-dir"),
    Case("evaluate", "checkpoints/pretrain --ctx 0", "--ctx: 0 is out of range"),
    Case("evaluate", "checkpoints/pretrain --ctx 64", "learned positions", "past a learned table"),
    Case("evaluate", "checkpoints/pretrain --rope-scaling quadratic", "invalid choice"),
    Case("evaluate", "checkpoints/pretrain-rope --rope-factor 7", "--rope-factor is for --rope-scaling linear or "
         "dynamic-ntk, not none", "a factor no method reads"),
    Case("sample", "checkpoints/pretrain-rope --ctx 32 --rope-scaling yarn --rope-factor 3",
         "--rope-factor is for --rope-scaling linear or dynamic-ntk, not yarn"),
    Case("evaluate", "checkpoints/pretrain --device tpu9", "unknown device"),
    # sample
    Case("sample", "checkpoints/pretrain --temperature -1", "--temperature: -1 is out of range",
         "would sample the least likely tokens"),
    Case("sample", "checkpoints/pretrain --temperature nan",
         "argument --temperature: nan is not a finite number: give a number >= 0"),
    Case("sample", "checkpoints/pretrain --top-k 0", "--top-k: 0 is out of range"),
    Case("sample", "checkpoints/pretrain --max-new-tokens -1", "--max-new-tokens: -1 is out of range"),
    Case("sample", "checkpoints/pretrain --seed -1", "--seed: -1 is out of range"),
    Case("sample", "checkpoints/missing", "no checkpoint at checkpoints/missing: train one"),
    Case("sample", "corrupt.pt", "truncated or corrupt"),
    Case("sample", "text.pt", "truncated or corrupt"),
    Case("sample", "wide.pt", "reads 512 token ids", "ids the tokenizer cannot decode"),
    Case("sample", "checkpoints/pretrain-rope --ctx 100000000", "give a smaller --ctx", "a window no memory holds"),
    Case("sample", "other-tokenizer.pt", "was trained with tokenizer 0123456789abcdef"),
    Case("sample", "checkpoints/pretrain --adapter notes.txt", "notes.txt"),
    Case("sample", "checkpoints/pretrain --data-dir missing", "no folder missing: check --data-dir"),
    Case("sample", "checkpoints/pretrain --dtype float8", "invalid choice"),
    # context and long_context
    Case("context", "checkpoints/pretrain --length 1", "--length: 1 is out of range"),
    Case("context", "checkpoints/pretrain --streams 0", "--streams: 0 is out of range"),
    Case("context", "checkpoints/pretrain --length 8", "does not reach past any model's window"),
    Case("context", "checkpoints/pretrain --json notes.txt/c.json", "notes.txt is a file, not a folder"),
    Case("context", "checkpoints/missing", "nothing at checkpoints/missing: give a run folder"),
    Case("context", "data", "no model to read: data (no checkpoint or LoRA adapter in it: name a run folder",
         "a folder with no model"),
    Case("long_context", "checkpoints/pretrain-rope --sinks -1", "--sinks: -1 is out of range"),
    Case("long_context", "checkpoints/pretrain-rope --ctx 0", "--ctx: 0 is out of range"),
    Case("long_context", "checkpoints/pretrain-rope --ctx 32 --rope-factor 0", "--rope-factor: 0 is out of range"),
    Case("long_context", "checkpoints/pretrain-rope --ctx 32 --sweep-tokens 0", "--sweep-tokens: 0 is out of range"),
    Case("long_context", "checkpoints/pretrain-rope", "one of the arguments --ctx --sinks --dynamic is required"),
    Case("long_context", "checkpoints/pretrain-rope --ctx 32 --sinks 4", "not allowed with argument"),
    Case("long_context", "checkpoints/pretrain-rope --streams 0 --dynamic", "--streams: 0 is out of range"),
    Case("long_context", "checkpoints/pretrain-rope --ctx 1", "--ctx: 1 is out of range: give a whole number >= 2",
         "a chunk with no second half to score"),
    Case("long_context", "checkpoints/pretrain-rope --sinks 16", "--sinks 16 would keep the whole window of 16 tokens",
         "more sinks than the window"),
    Case("long_context", "checkpoints/pretrain --sinks 4", "pretrain has learned positions: give a rope model"),
    Case("long_context", "checkpoints/pretrain-rope --dynamic --length 10",
         "--length 10 does not reach past the window of 16 tokens"),
    Case("long_context", "checkpoints/pretrain --ctx 32", "learned positions stop at the training context, and "
         "every --ctx is past it", "a sweep with nothing to read"),
    Case("long_context", "checkpoints/pretrain-rope --ctx 32 --rope-scaling ntk --rope-factor 2",
         "--rope-factor is linear's factor for the sweep"),
    # export and export_check
    Case("export", "checkpoints/pretrain exports/mine", "exports/mine is not empty", "the user's own README.md"),
    Case("export", "checkpoints/pretrain notes.txt --format gguf", "notes.txt is there already"),
    Case("export", "checkpoints/pretrain ''", "an empty name: give the folder to write",
         "an unset variable, which would write into the current folder"),
    Case("export", "checkpoints/pretrain exports/new --ctx 0", "--ctx: 0 is out of range"),
    Case("export", "checkpoints/pretrain exports/new --rope-scaling linear --rope-factor -2",
         "--rope-factor: -2 is out of range"),
    Case("export", "checkpoints/pretrain exports/new --f16", "--f16 is for --format gguf"),
    Case("export", "checkpoints/lora-r2 exports/new", "checkpoints/lora-r2 is a LoRA run (an adapter, no "
         "checkpoint of its own): give its base, or merge the two first, `python scripts/finetune.py --init-from "
         "BASE --out-dir checkpoints/lora-r2 --merge OUT`, and give OUT", "a LoRA run folder"),
    Case("sample", "checkpoints/lora-r2 --adapter checkpoints/lora-r2",
         "checkpoints/lora-r2 is a LoRA run already, on pretrain-rope: drop --adapter"),
    Case("export", "checkpoints/pretrain exports/new --ctx 64", "need --rope-scaling"),
    Case("export", "checkpoints/missing exports/new", "no checkpoint at checkpoints/missing: train one"),
    Case("export_check", "checkpoints/pretrain --max-new-tokens 0", "--max-new-tokens: 0 is out of range"),
    Case("export_check", "checkpoints/pretrain --held-out-tokens 0", "--held-out-tokens: 0 is out of range"),
    Case("export_check", "checkpoints/pretrain --gguf --ctx 1", "--ctx: 1 is out of range"),
    Case("export_check", "checkpoints/pretrain checkpoints/pretrain/", "checkpoints/pretrain/ is given twice",
         "one checkpoint twice"),
    Case("export_check", "checkpoints/pretrain --json notes.txt/x.json", "notes.txt is a file, not a folder"),
    Case("export_check", "checkpoints/pretrain --out notes.txt", "notes.txt is a file: give a folder"),
    Case("export_check", "checkpoints/missing", "no checkpoint at checkpoints/missing: train one"),
    # finetune
    Case("finetune", "--rank 0", "argument --rank: 0 is out of range: give a whole number >= 1"),
    Case("finetune", "--init-from checkpoints/pretrain-rope --out-dir stopped", "a run stopped before its first "
         "save): start it again with --overwrite", "a LoRA run whose adapter is gone: its log kept"),
    Case("finetune", "--alpha inf", "argument --alpha: inf is not a finite number: give a number above 0"),
    Case("finetune", "--lr nan", "argument --lr: nan is not a finite number: give a number above 0"),
    Case("finetune", "--grad-clip -1", "--grad-clip: -1 is out of range"),
    Case("finetune", "--seed -1", "--seed: -1 is out of range"),
    Case("finetune", "--temperature -1", "argument --temperature: -1 is out of range: give a number >= 0"),
    Case("finetune", "--json notes.txt/x.json", "notes.txt is a file, not a folder"),
    Case("finetune", "--init-from checkpoints/missing", "no checkpoint at checkpoints/missing: train one"),
    Case("finetune", "--init-from checkpoints/lora-r2", "checkpoints/lora-r2 is a LoRA run (an adapter, no "
         "checkpoint of its own): give its base"),
    Case("finetune", "--measure --merge merged", "separate steps"),
    # bench
    Case("bench", "--batch-size 0", "--batch-size: 0 is out of range"),
    Case("bench", "--batches 1,0", "--batches: 0 is out of range"),
    Case("bench", "--threads 0", "--threads: 0 is out of range"),
    Case("bench", "--only decoding,", "'decoding,' has an empty word", "a trailing comma, which matched every part"),
    Case("bench", "--only ''", "'' has an empty word", "an unset variable, which matched every part"),
    Case("bench", "--only decodng", "--only 'decodng' names no part", "a misspelled part"),
    Case("bench", "--threads 1000000", "--threads: 1000000 is out of range: give a whole number from 1 to"),
    Case("bench", "--n-layer 1000000000000000000000000000000", "more than this machine's",
         "a model no memory holds"),
    Case("bench", "--n-embd 30 --n-head 4", "--n-embd 30 must be --n-head 4 times an even head size"),
    Case("bench", "--json notes.txt/b.json", "notes.txt is a file, not a folder"),
    # main
    Case("main", "--max-steps 0", "--max-steps: 0 is out of range"),
    Case("main", "--finetune-steps -1", "--finetune-steps: -1 is out of range"),
    Case("main", "--out notes.txt", "notes.txt is a file: give a folder"),
    Case("main", "--source missing --out job", "source missing does not exist", "said before any step starts"),
    Case("main", "--tiny --out filejob --plan-only", "filejob/data is a file, where the main job keeps its data",
         "a file where the job's folder goes: said by main, not by a step's flag"),
    Case("main", "--tiny --out checkpoints --plan-only", "--out checkpoints holds runs (busy, lora-r2, pretrain, ...)",
         "a folder of runs, where the job's data and results would mix in among them"),
]


# ----------------------------------------------------------------------------------------------
# The world every case runs in


def make_world(root: Path) -> Path:
    """Data, checkpoints and a user's files under the names the scripts use by default."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "stories").mkdir()
    write_corpus(root / "stories" / "train.txt", 300, seed=1)
    write_corpus(root / "stories" / "valid.txt", 40, seed=2)
    prepare(root / "stories", root / "data", vocab_size=300)
    tok_hash = data_tokenizer_hash(root / "data")
    for name, rope in (("pretrain", False), ("pretrain-rope", True)):
        torch.manual_seed(0)
        model = GPT(tiny_config(vocab_size=300, rope=rope))
        save_checkpoint(root / "checkpoints" / name, model, step=3, tokenizer_hash=tok_hash)
        (root / "checkpoints" / name / "log.jsonl").write_text('{"step": 3, "loss": 5.0}\n')
    base_hash = weights_hash(model)  # the rope model's: a LoRA run on it (rank 2)
    apply_lora(model, rank=2, alpha=4)
    save_adapter(root / "checkpoints" / "lora-r2", model, base_hash, tok_hash, base="checkpoints/pretrain-rope")
    save_checkpoint(root / "other-tokenizer.pt", GPT(tiny_config(vocab_size=300)), tokenizer_hash="0123456789abcdef")
    (root / "corrupt.pt").write_bytes(b"not a checkpoint" * 64)
    (root / "mine").mkdir()
    (root / "mine" / "log.jsonl").write_text("my notes, not a run's log\n")  # a user's file of that name
    (root / "text.pt").write_bytes(b"hello\n")  # a pickle's opcodes to the unpickler: it fails in other ways
    model = GPT(tiny_config(vocab_size=300))
    for name, config in (("crafted.pt", {"n_layer": -1}), ("huge.pt", {"block_size": 2**40})):
        torch.save({"model": model.state_dict(), "config": {**asdict(model.config), **config}}, root / name)
    save_checkpoint(root / "checkpoints" / "busy", model, step=3, tokenizer_hash=tok_hash)
    (root / "checkpoints" / "busy" / "lock").write_text(str(os.getpid()))  # this process: alive all along
    (root / "latin1.txt").write_bytes("Zoë saw a café.\n<|endoftext|>\nTom too.\n<|endoftext|>\n".encode("latin-1"))
    (root / "notes.txt").write_text("a file of the user's, not a folder\n")
    (root / "filejob").mkdir()
    (root / "filejob" / "data").write_text("a file of the user's\n")
    with gzip.open(root / "stories.gz", "wb") as f:
        f.write((root / "stories" / "train.txt").read_bytes())
    (root / "stopped").mkdir()  # a run that stopped before its first save: its log alone
    (root / "stopped" / "log.jsonl").write_text('{"step": 1, "loss": 5.5}\n')
    (root / "two.txt").write_text("a\n<|endoftext|>\nb\n<|endoftext|>\n")  # no pair of bytes repeats
    shutil.copytree(root / "data", root / "damaged-data")
    (root / "damaged-data" / "meta.json").write_text("{")
    save_checkpoint(root / "wide.pt", GPT(tiny_config(vocab_size=512)))  # no tokenizer hash, more ids than the data
    os.mkfifo(root / "pipe")  # a source that is not a file: read once, maybe never ending
    (root / "exports" / "mine").mkdir(parents=True)
    (root / "exports" / "mine" / "README.md").write_text("my own notes\n")
    return root


def hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------------------------
# The driver: one process imports everything, each case is a fork of it


def run_forked(script: str, args: str, out: Path, err: Path, setup: Callable[[], None] | None = None) -> int:
    """Fork; the child runs scripts/`script`.py as __main__ with `args`, its output into `out` and `err`
    (after `setup`, in the child only); the parent waits, and returns its exit status."""
    pid = os.fork()
    if pid == 0:  # the child: as the interpreter runs `python scripts/X.py ARGS`
        code = 1
        try:
            signal.alarm(CASE_SECONDS)
            for fd, path in ((1, out), (2, err)):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            if setup is not None:
                setup()
            path = str(SCRIPTS / f"{script}.py")
            sys.argv = [path, *shlex.split(args)]  # as a shell splits it: quotes kept
            runpy.run_path(path, run_name="__main__")
            code = 0
        except SystemExit as e:  # what the interpreter does with it
            code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
            if not isinstance(e.code, int) and e.code is not None:
                sys.stderr.write(f"{e.code}\n")
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def run_case(case: Case, world: Path) -> dict:
    """One case in a fork of this process; what it printed and what it changed in the world."""
    out, err = world.parent / "case.out", world.parent / "case.err"
    before = hashes(world)
    code = run_forked(case.script, case.args, out, err)
    after = hashes(world)
    return {
        "command": case.command,
        "code": code,
        "stderr": err.read_text(errors="replace"),
        "stdout": out.read_text(errors="replace"),
        "changed": sorted(k for k in before if before[k] != after.get(k)),
        "new": sorted(after.keys() - before.keys()),
    }


def drive(world: Path, results: Path) -> None:
    """The driver's main: import what the scripts import, then run every case in the world."""
    os.chdir(world)
    for name in sorted({c.script for c in CASES}):
        runpy.run_path(str(SCRIPTS / f"{name}.py"), run_name="preload")  # imports only: main() is not run
    results.write_text(json.dumps([run_case(case, world) for case in CASES]))


def run_all(folder: Path) -> list[dict]:
    world = make_world(folder / "world")
    results = folder / "results.json"
    code = (f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests')!r}, {str(SCRIPTS)!r}]\n"
            f"from pathlib import Path; from test_cli_errors import drive\n"
            f"drive(Path({str(world)!r}), Path({str(results)!r}))")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=30 * 60)
    outcomes = json.loads(results.read_text())
    for outcome in outcomes:  # paths read as typed in the world's folder; what varies by machine or run, named
        err = outcome["stderr"].replace(str(world) + "/", "").replace(str(world), ".")
        err = re.sub(r"this machine's [\d,]+ GiB", "this machine's N GiB", err)
        outcome["stderr"] = re.sub(r"in use by process \d+", "in use by process PID", err)
    return outcomes


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> list[dict]:
    return run_all(tmp_path_factory.mktemp("cli"))


def test_every_case_is_a_different_command():
    assert len({c.command for c in CASES}) == len(CASES)


@pytest.mark.parametrize("i", range(len(CASES)), ids=[c.command.removeprefix("python scripts/") for c in CASES])
def test_bad_input_is_one_line_a_nonzero_exit_and_nothing_lost(outcomes, i):
    case, got = CASES[i], outcomes[i]
    lines = got["stderr"].splitlines()
    assert "Traceback" not in got["stderr"], got["stderr"]
    assert got["code"] != 0 and len(lines) == 1, got
    assert got["stdout"] == "", got  # nothing before the refusal: no table header, no first line of a run
    assert case.expect in lines[0], lines[0]
    assert got["changed"] == [] and got["new"] == [], got


# ----------------------------------------------------------------------------------------------
# The docs page, made from the table


HARM_MARK = "\n<!-- sections below: tests/test_nothing_lost.py -->\n"  # where that file's part of the page starts


def test_the_docs_page_is_up_to_date(outcomes):
    written = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8").split(HARM_MARK)[0]
    assert written == page(outcomes), "docs/errors.md has drifted from the table: run `python dev/errors_page.py`"


def page(outcomes: list[dict]) -> str:
    """One terminal session per script: each command, its one line, its exit code."""
    sessions: dict[str, list[str]] = {}
    for case, got in zip(CASES, outcomes, strict=True):
        why = f"   # {case.why}" if case.why else ""
        sessions.setdefault(case.script, []).append(f"$ {got['command']}{why}\n{got['stderr']}(exit {got['code']})")
    body = "\n\n".join(f"## {name}.py\n\n```console\n" + "\n".join(runs) + "\n```" for name, runs in sessions.items())
    return PAGE.format(count=len(CASES), body=body)


PAGE = """# What a bad input gets

Every command below was run by `tests/test_cli_errors.py` in a folder holding prepared data
(`data/`), two tiny run folders (`checkpoints/pretrain`, `checkpoints/pretrain-rope`) and a few
files of a user's (`notes.txt`, `exports/mine/README.md`, ...). Each stopped before any work with
the one line shown, on stderr, and the exit code shown, and left every file as it was. The page is
made from the test's table by `python dev/errors_page.py`; the test fails when it no longer matches.

{count} inputs.

{body}
"""


# ----------------------------------------------------------------------------------------------
# Stopped midway: Ctrl-C (SIGINT, to the whole process group, as a terminal sends it) and kill -9


TINY_RUN = ("--n-layer 1 --n-head 2 --n-embd 32 --block-size 16 --batch-size 4 --eval-every 1000 "
            "--eval-batches 1 --ckpt-every 1 --minutes 0 --data-dir data --runs-dir runs").split()


def python(world: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / script), *args], cwd=world, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"), timeout=600)


def stop_midway(world: Path, argv: list[str], ready, sig: int) -> tuple[int, str]:
    """Start `python ARGV` in world, wait until ready() (it is then mid-work), send sig to its group."""
    with open(world.parent / "midway.out", "w") as out:
        child = subprocess.Popen([sys.executable, *argv], cwd=world, stdout=out, stderr=subprocess.PIPE, text=True,
                                 env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"),
                                 start_new_session=True)
        deadline = time.monotonic() + 300
        while not ready() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert child.poll() is None, f"it ended before it could be stopped: {child.stderr.read()}"
        os.killpg(child.pid, sig)
        _, err = child.communicate(timeout=300)
    assert "Traceback" not in err, err
    return child.returncode, err


@pytest.fixture
def world(tmp_path) -> Path:
    return make_world(tmp_path / "world")


def data_kept(world: Path, before: dict[str, str]) -> None:
    assert hashes(world / "data") == before  # no staging folder, no temp file, nothing replaced
    assert read_meta(world / "data") is not None


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_prepare_stopped_midway_keeps_the_data(world, sig):
    before = hashes(world / "data")
    (world / "big").mkdir()
    write_corpus(world / "big" / "train.txt", 30000, seed=7)  # long enough to be caught midway
    write_corpus(world / "big" / "valid.txt", 10, seed=8)
    code, err = stop_midway(world, [str(SCRIPTS / "prepare.py"), "--source", "big", "--vocab-size", "400", "--force"],
                            lambda: any((world / "data").glob(".prepare.tmp*")), sig)
    if sig == signal.SIGINT:
        assert code == 130 and err.startswith("interrupted (Ctrl-C): nothing was changed") and err.count("\n") == 1
    else:
        assert code == -9
        again = python(world, "prepare.py", "--source", "stories", "--vocab-size", "300")
        assert again.returncode == 0 and "already prepared" in again.stdout  # and the leftovers are gone
    data_kept(world, before)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_pretrain_stopped_midway_keeps_a_checkpoint_that_resumes(world, sig):
    before = hashes(world)
    run = world / "checkpoints" / "fresh"
    code, err = stop_midway(world, [str(SCRIPTS / "pretrain.py"), *TINY_RUN, "--out-dir", str(run),
                                    "--max-steps", "1000000"], (run / "ckpt.pt").exists, sig)
    assert code == (130 if sig == signal.SIGINT else -9) and err.count("\n") <= 1, err
    step = read_checkpoint(run)["step"]
    assert step >= 1
    again = python(world, "pretrain.py", *TINY_RUN, "--out-dir", str(run), "--max-steps", str(step + 1), "--resume")
    assert again.returncode == 0, again.stderr
    assert read_checkpoint(run)["step"] == step + 1
    after = hashes(world)
    assert {k: v for k, v in after.items() if k in before} == before  # the other runs and the data untouched


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_main_stopped_midway_keeps_its_data_and_checkpoint(world, sig):
    out = world / "job"
    code, err = stop_midway(world, [str(SCRIPTS / "main.py"), "--source", "stories", "--tiny", "--out", "job",
                                    "--max-steps", "1000000", "--device", "cpu"],
                            (out / "checkpoints" / "pretrain" / "ckpt.pt").exists, sig)
    assert code == (130 if sig == signal.SIGINT else -9) and err.count("\n") <= 1, err
    assert read_meta(out / "data") is not None and read_checkpoint(out / "checkpoints" / "pretrain")["step"] >= 1
    if sig == signal.SIGINT:
        assert not list(out.rglob(".*tmp*")) and not (out / "checkpoints" / "pretrain" / "lock").exists()
        # the step's own line gives the job's advice, not a flag of the step's command, which the user never typed
        said = (world.parent / "midway.out").read_text() + err
        assert "run the same command again: the steps done are skipped, training resumes" in said, said
        assert "--resume" not in said, said


@pytest.mark.parametrize("fmt, lacking", [("hf", "safetensors and tokenizers are"), ("gguf", "gguf is")])
def test_an_export_without_the_export_extra_is_one_line_and_writes_nothing(data_dir, tmp_path, monkeypatch, fmt,
                                                                           lacking):
    import export

    save_checkpoint(tmp_path / "run", GPT(tiny_config(vocab_size=300)), step=1,
                    tokenizer_hash=data_tokenizer_hash(data_dir))
    for module in lacking.removesuffix(" is").removesuffix(" are").split(" and "):
        monkeypatch.setitem(sys.modules, module, None)  # as if the extra were not installed: find_spec says None
    out = tmp_path / ("out.gguf" if fmt == "gguf" else "out")
    with pytest.raises(SystemExit) as stop:
        export.main([str(tmp_path / "run"), str(out), "--format", fmt, "--data-dir", str(data_dir)])
    assert stop.value.code == f"error: an export needs the export extra: {lacking} not installed: " \
                              "pip install -e '.[export]'"
    assert not out.exists()
