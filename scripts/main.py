"""The main job: prepare the data if needed, pretrain both kinds, evaluate, measure past the window.

Each step is its own script, run here one after another in a subprocess (with glibc's malloc
tuned, which keeps the kernel from eating 10-40% of a CPU training step). A step already done
is skipped, and an interrupted training run resumes, so the job can be run again after a stop.

Examples:
    python scripts/main.py --source ../shared/data/tinystories    # here: about 25 minutes on 2 cores
    python scripts/main.py                                          # downloads TinyStories first
    python scripts/main.py --source stories.txt --tiny --out /tmp/mvgpt   # a tiny CPU run, a minute
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mvgpt.checkpoint import checkpoint_path  # noqa: E402

SCRIPTS = Path(__file__).resolve().parent
TINY = ["--n-layer", "2", "--n-head", "2", "--n-embd", "64", "--block-size", "32", "--batch-size", "4"]


def run(step: list[str], env: dict) -> None:
    print(f"\n$ python {' '.join(step)}", flush=True)
    result = subprocess.run([sys.executable, *step], env=env)
    if result.returncode:
        raise SystemExit(result.returncode)


def finished_steps(run_dir: Path) -> int:
    """The step a run folder's checkpoint reached (0 if none), read without building the model."""
    import torch

    file = checkpoint_path(run_dir)
    if not file.exists():
        return 0
    try:
        return int(torch.load(file, map_location="cpu", weights_only=True).get("step", 0))
    except Exception:
        return 0


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", help="TinyStories file or folder (default: $MVGPT_TINYSTORIES, else download)")
    p.add_argument("--out", default=".", help="where data/, checkpoints/, runs/ and results/ go")
    p.add_argument("--max-steps", type=int, default=250, help="training steps for each kind")
    p.add_argument("--minutes", type=float, default=0, help="time budget for each run (0: steps decide)")
    p.add_argument("--device", help="cpu, cuda, mps (default: the best present)")
    p.add_argument("--tiny", action="store_true", help="a tiny model and vocabulary: checks the pipeline")
    args = p.parse_args(argv)

    out = Path(args.out)
    data, ckpts, runs, results = out / "data", out / "checkpoints", out / "runs", out / "results"
    env = dict(os.environ, MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_="100000000000")
    device = ["--device", args.device] if args.device else []

    prepare = [str(SCRIPTS / "prepare.py"), "--data-dir", str(data)]
    if args.source:
        prepare += ["--source", args.source]
    if args.tiny:
        prepare += ["--vocab-size", "512"]
    run(prepare, env)

    model = TINY if args.tiny else []
    for kind in ([], ["--rope"]):
        run_dir = ckpts / ("pretrain-rope" if kind else "pretrain")
        done = finished_steps(run_dir)
        if done >= args.max_steps:
            print(f"\n{run_dir} has trained {done} steps already: skipping (delete it to train again)")
            continue
        train = [str(SCRIPTS / "pretrain.py"), *kind, *model, *device, "--data-dir", str(data),
                 "--out-dir", str(run_dir), "--runs-dir", str(runs), "--max-steps", str(args.max_steps),
                 "--minutes", str(args.minutes)]
        run(train + (["--resume"] if done else []), env)

    both = [str(ckpts / "pretrain"), str(ckpts / "pretrain-rope")]
    run([str(SCRIPTS / "evaluate.py"), *both, *device, "--data-dir", str(data),
         "--json", str(results / "evaluate.json")], env)
    context = SCRIPTS / "context.py"
    if context.exists():
        length = ["--length", "96"] if args.tiny else []
        run([str(context), *both, *device, *length, "--data-dir", str(data),
             "--json", str(results / "context.json")], env)
    print(f"\ndone: checkpoints in {ckpts}, TensorBoard logs in {runs} (tensorboard --logdir {runs}), "
          f"tables in {results}")


if __name__ == "__main__":
    main()
