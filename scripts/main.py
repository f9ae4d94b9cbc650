"""The main job: prepare the data if needed, pretrain both kinds, evaluate, measure past the window,
read past the training context (a long-context fine-tune, the sweep, sinks), fine-tune the rope model on
instructions with LoRA, and write the docs' tables.

Each step is its own script, run here one after another in a subprocess. A step already done is
skipped (a measurement, when its JSON is newer than the checkpoints it reads), and an interrupted
training run resumes, so the job can be run again after a stop.

Examples:
    python scripts/main.py --source ../shared/data/tinystories    # here: 40 to 60 minutes on 2 cores
    python scripts/main.py                                          # downloads TinyStories first
    python scripts/main.py --source stories.txt --tiny      # a tiny CPU run into tiny/, a minute
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

from mvgpt.checkpoint import checkpoint_path, read_checkpoint
from mvgpt.errors import ArgumentParser, UserError, positive_int, run_main, writable_folder
from mvgpt.rope_scaling import SCALING_METHODS

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
STEPS = 1000  # 11 to 16 minutes for each kind on a 2-core CPU with bf16 matrix units (see the README)
TINY = ["--n-layer", "2", "--n-head", "2", "--n-embd", "64", "--block-size", "32", "--batch-size", "4"]


def run(step: list[str], env: dict) -> None:
    print(f"\n$ python {' '.join(step)}", flush=True)
    child = subprocess.Popen([sys.executable, *step], env=env)
    try:
        code = child.wait()
    except KeyboardInterrupt:  # Ctrl-C: the step stops cleanly and says so in its one line, then we stop
        try:
            code = child.wait(timeout=1)  # a terminal's Ctrl-C reaches the step too
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGINT)  # only we were told: pass it on
            code = child.wait()
        if code != 130:
            raise  # the step had ended: our own one line
    if code < 0:
        raise UserError(f"{Path(step[0]).name} was killed by signal {-code} (out of memory?): run main.py again")
    if code:
        raise SystemExit(code)


def finished_steps(run_dir: Path) -> int:
    """The step a run folder's checkpoint reached (0 if none); a corrupt one is a one-line error,
    not a reason to train over it."""
    if not checkpoint_path(run_dir).exists():
        return 0
    return int(read_checkpoint(run_dir).get("step", 0))


def train(step: list[str], run_dir: Path, steps: int, summary: Path, common: list[str], env: dict) -> None:
    """Train into run_dir unless it has reached `steps` already; an interrupted run resumes."""
    done = finished_steps(run_dir)
    if done >= steps:
        print(f"\n{run_dir} has trained {done} steps already: skipping (delete it to train again)")
        return
    run([*step, *common, "--out-dir", str(run_dir), "--json", str(summary)] + (["--resume"] if done else []), env)


def measure(step: list[str], out: Path, checkpoints: list[str], env: dict) -> None:
    """Run a measuring step unless its JSON is newer than every checkpoint it reads."""
    newest = max(checkpoint_path(c).stat().st_mtime for c in checkpoints)
    if out.exists() and out.stat().st_mtime > newest:
        print(f"\n{out} is newer than its checkpoints: skipping (delete it to measure again)")
        return
    run([*step, "--json", str(out)], env)


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", help="TinyStories file or folder (default: $MVGPT_TINYSTORIES, else download)")
    p.add_argument("--out", type=writable_folder,
                   help="where data/, checkpoints/, runs/ and results/ go (default: here; tiny/ with --tiny)")
    p.add_argument("--max-steps", type=positive_int, default=STEPS, help="training steps for each kind (same for both)")
    p.add_argument("--device", help="cpu, cuda, mps (default: the best present)")
    p.add_argument("--finetune-steps", type=positive_int, default=80, help="steps of the long-context fine-tune")
    p.add_argument("--lora-steps", type=positive_int, default=150, help="steps of the LoRA instruction fine-tune")
    p.add_argument("--tiny", action="store_true", help="a tiny model and vocabulary: checks the pipeline")
    args = p.parse_args(argv)

    out = Path(args.out or ("tiny" if args.tiny else "."))  # a tiny check never overwrites the real results
    data, ckpts, runs, results = out / "data", out / "checkpoints", out / "runs", out / "results"
    env = dict(os.environ)
    device = ["--device", args.device] if args.device else []
    data_flag = ["--data-dir", str(data)]
    window = 32 if args.tiny else 256
    common = [*device, *data_flag, "--runs-dir", str(runs)]  # every training step's

    # the data: a tokenizer and token files (skipped when data/ is prepared already)
    prepare = [str(SCRIPTS / "prepare.py"), *data_flag, "--json", str(results / "data.json")]
    if args.source:
        prepare += ["--source", args.source]
    if args.tiny:
        prepare += ["--vocab-size", "512"]
    run(prepare, env)

    # both kinds from the same seed, data and batches, the same number of steps, in bfloat16 where it is native
    model = TINY if args.tiny else ["--compile"]  # compiling pays over a thousand steps, not over a tiny run
    for kind, name in (([], "pretrain"), (["--rope"], "pretrain-rope")):
        train([str(SCRIPTS / "pretrain.py"), *kind, *model, "--max-steps", str(args.max_steps), "--dtype", "auto"],
              ckpts / name, args.max_steps, results / f"{name}.json", common, env)

    # the episode's comparison: held-out loss, then past the window
    both = [str(ckpts / "pretrain"), str(ckpts / "pretrain-rope")]
    rope = str(ckpts / "pretrain-rope")
    measure([str(SCRIPTS / "evaluate.py"), *both, *device, *data_flag, "--dtype", "auto"],  # bf16 beside float32
            results / "evaluate.json", both, env)
    measure([str(SCRIPTS / "context.py"), *both, *device, *data_flag, "--length", str(3 * window)],
            results / "context.json", both, env)

    # reading past the training context: a fine-tune to 4 windows, the sweep, sinks, dynamic NTK
    long_dir = ckpts / f"pretrain-rope-ctx{4 * window}-linear"
    train([str(SCRIPTS / "pretrain.py"), "--init-from", rope, "--block-size", str(4 * window),
           "--rope-scaling", "linear", "--batch-size", "4", "--max-steps", str(args.finetune_steps), "--warmup", "5",
           "--lr", "5e-4", "--eval-every", "20", "--ckpt-every", "20", "--dtype", "auto"],
          long_dir, args.finetune_steps, results / f"{long_dir.name}.json", common, env)
    contexts = [str(window * k // 4) for k in (4, 6, 8, 12, 16, 24, 32)]
    long_context = str(SCRIPTS / "long_context.py")
    measure([long_context, rope, str(long_dir), *device, *data_flag, "--ctx", *contexts,
             "--rope-scaling", *SCALING_METHODS], results / "sweep.json", [rope, str(long_dir)], env)
    measure([long_context, rope, *device, *data_flag, "--sinks", "4", "--length", str(4 * window),
             "--streams", "4"], results / "sinks.json", [rope], env)
    measure([long_context, rope, *device, *data_flag, "--dynamic", "--length", str(2 * window),
             "--streams", "4"], results / "dynamic.json", [rope], env)

    # episode 9: instruction fine-tuning with LoRA on the rope model, measured against its base (a tiny check's
    # few short stories have no words rare enough to ask for: tests/test_finetune.py covers it on its own data)
    if not args.tiny:
        measure([str(SCRIPTS / "finetune.py"), "--init-from", rope, *common, "--out-dir", str(ckpts / "lora-rope"),
                 "--max-steps", str(args.lora_steps)], results / "lora.json", [rope], env)

    if not args.tiny:  # the docs' tables and figures describe the real runs, not a tiny check
        run([str(ROOT / "dev" / "report.py"), "--results-dir", str(results)], env)
    print(f"\ndone: checkpoints in {ckpts}, TensorBoard logs in {runs} (tensorboard --logdir {runs}), "
          f"tables in {results}")


if __name__ == "__main__":
    run_main(main, interrupted="run the same command again: the steps done are skipped, training resumes")
