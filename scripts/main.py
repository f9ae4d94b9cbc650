"""The main job: prepare the data if needed, pretrain both kinds, evaluate, measure past the window,
read past the training context (a long-context fine-tune, the sweep, sinks), fine-tune the rope model on
instructions with LoRA, and write the docs' tables.

Each step is its own script, run here one after another in a subprocess. A step already done is
skipped, and an interrupted training run resumes, so the job can be run again after a stop
(Ctrl-C or SIGTERM: the step in progress is told, saves, and is waited for). Done means done for
this data: a run whose checkpoint reached its steps from the tokenizer in data/ now, with its
summary written after it; a measurement whose JSON is newer than the data and every checkpoint it
reads. A new --source over a job with trained runs is refused (their tokenizer would be replaced);
over one without, the data is prepared again, and said so first.

How long: about an hour on a 2-core CPU, of any kind. Before training, the job measures this
machine (a minute or two: the steps it will train, compiled as they will be, and the measuring
scripts' forwards), chooses how many steps both kinds train (as many as take the first about ten
minutes, at most 1,000), and prints the plan: each stage with its estimate, and the total
(mvgpt/perf/plan.py). After each stage a line gives its time and the time left. --max-steps 1000 trains
the committed runs' count, with the same flags to pretrain.py.

Examples:
    python scripts/main.py --source ../shared/data/tinystories    # about an hour on 2 cores
    python scripts/main.py --source ../shared/data/tinystories --max-steps 1000   # the committed runs
    python scripts/main.py                                          # downloads TinyStories first
    python scripts/main.py --source stories.txt --tiny      # a tiny CPU run into tiny/, a minute
    python scripts/main.py --source ../shared/data/tinystories --plan-only   # the plan alone: a minute or two
"""

from __future__ import annotations

import mvgpt.kit.starting  # noqa: F401  first, before torch loads: Ctrl-C meanwhile is one line

# isort: split
import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from mvgpt.checkpoint import checkpoint_path, read_checkpoint
from mvgpt.data import (
    SOURCE_ENV,
    data_tokenizer_hash,
    prepared_for,
    read_meta,
    source_arg,
    source_files,
    source_fingerprint,
)
from mvgpt.device import machine, pick_device
from mvgpt.extension.rope_scaling import SCALING_METHODS
from mvgpt.kit.errors import JOB_AGAIN, ArgumentParser, UserError, positive_int, run_main, writable_folder
from mvgpt.kit.io import write_json
from mvgpt.kit.runfolder import holds, named, run_folders
from mvgpt.lora import ADAPTER_NAME, read_adapter
from mvgpt.train import STEPS_WARMUP_SHARE, WARMUP_STEPS

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
STEPS = 1000  # the committed runs' count: 11 to 16 minutes for each kind on a 2-core CPU with bf16 matrix units
AGAIN = "run the same command again: the steps done are skipped, training resumes"  # after a stop
TINY = ["--n-layer", "2", "--n-head", "2", "--n-embd", "64", "--block-size", "32", "--batch-size", "4"]


def run(step: list[str], env: dict) -> None:
    print(f"\n$ python {' '.join(step)}", flush=True)
    child = subprocess.Popen([sys.executable, *step], env=env)
    terminated = []

    def on_sigterm(signum, frame) -> None:  # as Ctrl-C: the step is told, stops cleanly, and is waited for
        terminated.append(signum)
        child.send_signal(signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        code = child.wait()
    except KeyboardInterrupt:  # Ctrl-C: the step stops cleanly and says so in its one line, then we stop
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave before the step has saved
        try:
            code = child.wait(timeout=1)  # a terminal's Ctrl-C reaches the step too
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGINT)  # only we were told: pass it on
            code = child.wait()
        if code != 130:
            raise  # the step had ended: our own one line
    finally:
        signal.signal(signal.SIGTERM, previous)
    if terminated:
        if code != 143:  # a step that stopped on its own says so, with the job's advice; one that could not, here
            sys.stderr.write(f"terminated (SIGTERM): the step in progress was stopped, nothing is lost: {AGAIN}\n")
        raise SystemExit(143)
    if code < 0:
        raise UserError(f"{Path(step[0]).name} was killed by signal {-code} (out of memory?): run main.py again")
    if code:
        raise SystemExit(code)


def terminated(signum: int, frame: object) -> None:
    sys.stderr.write("terminated (SIGTERM): nothing is lost: run the same command again: the steps done are "
                     "skipped, training resumes\n")
    raise SystemExit(143)


def flag_value(step: list[str], flag: str) -> str | None:
    """The value a step's command line gives `flag`, if any."""
    return step[step.index(flag) + 1] if flag in step else None


def run_file(run_dir: Path) -> Path:
    """A run folder's checkpoint, or (a LoRA run) its adapter."""
    adapter = run_dir / ADAPTER_NAME
    return adapter if adapter.exists() and not checkpoint_path(run_dir).exists() else checkpoint_path(run_dir)


def finished_steps(run_dir: Path, tok_hash: str | None = None) -> int:
    """The step a run folder's checkpoint (or adapter) reached (0 if none). A corrupt one, or one
    trained with another tokenizer than `tok_hash` (data/'s now), is a one-line error, not a reason
    to train over it."""
    file = run_file(run_dir)
    if not file.exists():
        return 0
    state = read_adapter(run_dir) if file.name == ADAPTER_NAME else read_checkpoint(run_dir)
    saved = state.get("tokenizer_hash")
    if tok_hash is not None and saved is not None and saved != tok_hash:
        raise UserError(f"{run_dir} was trained with tokenizer {saved}, but the data is now prepared with {tok_hash}: "
                        f"delete {run_dir} to train it again on this data, or give this data its own --out")
    return int(state.get("step") or 0)


def train(step: list[str], run_dir: Path, steps: int, summary: Path, common: list[str], env: dict) -> None:
    """Train into run_dir unless done: `steps` reached from this data, and the summary written after
    the checkpoint (a stop between the two makes the summary, with no training). An interrupted run
    resumes."""
    done = finished_steps(run_dir, data_tokenizer_hash(flag_value(common, "--data-dir")))
    if done >= steps and summary.exists() and summary.stat().st_mtime >= run_file(run_dir).stat().st_mtime:
        print(f"\n{run_dir} has trained {done} steps already: skipping (delete it to train again)")
        return
    if done >= steps:
        print(f"\n{run_dir} has trained {done} steps, but {summary} was not written after it: writing it")
    again = ["--resume"] if done else ["--overwrite"] if (holds(run_dir) or ("",))[0] == "log" else []  # no save yet
    run([*step, *common, "--out-dir", str(run_dir), "--json", str(summary)] + again, env)


def prepare_data(step: list[str], env: dict) -> None:
    """Prepare data/ unless done for this source. A new source where runs were trained on the data
    is refused (they need its tokenizer); where none were, the data is prepared again (--force),
    and said so first. --out must be the job's own folder, not a run's, the data's or an export's."""
    data = Path(flag_value(step, "--data-dir"))
    found = holds(data.parent)
    if found is not None and found[0] not in ("job", "files"):
        raise UserError(f"--out {data.parent} holds {found[1]}: give the job a folder of its own")
    runs = run_folders(data.parent)
    if found is not None and found[0] == "files" and runs:  # a checkpoints/ folder: the job would mix among its runs
        raise UserError(f"--out {data.parent} holds runs ({named(runs)}): give the job a folder of its own")
    source, meta = flag_value(step, "--source") or os.environ.get(SOURCE_ENV), read_meta(data)
    vocab = int(flag_value(step, "--vocab-size") or 8192)  # prepare.py's default
    damaged = meta is None and (data / "tokenizer.json").exists()  # a meta.json lost or damaged: not "no data"
    if source and (damaged or meta is not None and not prepared_for(meta, source_fingerprint(Path(source)), vocab)):
        ckpts = data.parent / "checkpoints"
        trained = sorted(d.name for d in ckpts.glob("*") if run_file(d).exists()) if ckpts.is_dir() else []
        was = ("holds a tokenizer, but its meta.json is missing or damaged" if damaged else
               f"was prepared from {meta.get('source')} (vocabulary {meta.get('vocab_size')})")
        if trained:
            raise UserError(f"{data} {was}, and {ckpts} holds runs trained on it ({', '.join(trained)}): preparing it "
                            f"from {source} (vocabulary {vocab}) would leave them unusable; give that its own --out, "
                            f"or delete {ckpts} to train again on it")
        print(f"\n{data} {was}, and no run was trained on it yet: preparing it again from {source}")
        step = [*step, "--force"]
    run(step, env)


def measure(step: list[str], out: Path, checkpoints: list[str], env: dict) -> None:
    """Run a measuring step unless its JSON is newer than the data and every checkpoint it reads."""
    if up_to_date(out, [Path(c) for c in checkpoints], Path(flag_value(step, "--data-dir") or "data")):
        print(f"\n{out} is newer than its checkpoints: skipping (delete it to measure again)")
        return
    run([*step, "--json", str(out)], env)


def steps_trained_before(ckpts: Path) -> int | None:
    """The --max-steps a job started before chose (its first pretraining checkpoint's), so that a job
    run again trains both kinds to the same count."""
    for name in ("pretrain", "pretrain-rope"):
        if checkpoint_path(ckpts / name).exists():
            return read_checkpoint(ckpts / name).get("args", {}).get("max_steps")
    return None


def up_to_date(out: Path, checkpoints: list[Path], data: Path) -> bool:
    """A measurement's JSON is newer than the data (its meta.json) and every checkpoint it reads."""
    files = [checkpoint_path(c) for c in checkpoints]
    if (data / "meta.json").exists():
        files.append(data / "meta.json")
    if not out.exists() or not all(f.exists() for f in files):
        return False
    return out.stat().st_mtime > max(f.stat().st_mtime for f in files)


def plan_job(args: argparse.Namespace, data: Path, ckpts: Path, results: Path, started: float):
    """Measure this machine, choose the steps where --max-steps does not, and print the plan
    (mvgpt/perf/plan.py); returns (the Progress that says the time left after each stage, the steps)."""
    from mvgpt.device import dtype_name, resolve_dtype
    from mvgpt.model import GPTConfig
    from mvgpt.perf.plan import STEP_FLOOR, Job, Progress, below_floor, measure, stages, steps_for

    device = pick_device(args.device)
    dtype = resolve_dtype("auto", device)  # as pretrain.py --dtype auto will
    shape = {flag[2:].replace("-", "_"): int(value) for flag, value in zip(TINY[::2], TINY[1::2], strict=True)
             } if args.tiny else {}  # the model pretrain.py will train: the tiny one, or its defaults
    batch_size = shape.pop("batch_size", 16)
    shape["vocab_size"] = json.loads((data / "meta.json").read_text())["vocab_size"]
    learned, rope = GPTConfig(**shape), GPTConfig(**shape, rope=True)
    W = rope.block_size
    held_out, needed = (data / "val.bin").stat().st_size // 2, 8 * 3 * W + 1  # context.py: 8 streams of 3 windows
    if held_out < needed:  # said before any training, not by a measuring step an hour in
        raise UserError(f"the held-out set in {data} has {held_out:,} tokens, and the job's reading past the window "
                        f"takes {needed:,} (8 streams of 3 windows of {W}): prepare it from a source with more "
                        "held-out text (valid.txt)")
    before = steps_trained_before(ckpts)
    steps = args.max_steps or before
    long_dir = ckpts / f"pretrain-rope-ctx{4 * W}-linear"
    done = {"pretrain (learned)": finished_steps(ckpts / "pretrain"),
            "pretrain (rope)": finished_steps(ckpts / "pretrain-rope"),
            "long-context fine-tune": finished_steps(long_dir)}
    trained = steps is not None and min(done["pretrain (learned)"], done["pretrain (rope)"]) >= steps \
        and done["long-context fine-tune"] >= args.finetune_steps
    both, rope_dir = [ckpts / "pretrain", ckpts / "pretrain-rope"], ckpts / "pretrain-rope"
    reads = {"evaluate": ("evaluate", both), "context": ("context", both), "sweep": ("sweep", [rope_dir, long_dir]),
             "sinks": ("sinks", [rope_dir]), "dynamic": ("dynamic", [rope_dir]), "LoRA fine-tune": ("lora", [rope_dir])}
    skipped = tuple(stage for stage, (name, paths) in reads.items()  # measurements that `measure` will skip
                    if trained and up_to_date(results / f"{name}.json", paths, data))
    print(f"\nmeasuring this machine for the plan ({device}, {dtype_name(dtype)}"
          f"{'' if args.tiny else ', compiled: a minute or two'})", flush=True)
    lora_left = not args.tiny and "LoRA fine-tune" not in skipped
    rates = measure(learned, rope, device, dtype, compile=not args.tiny, batch_size=batch_size,
                    training=not trained or lora_left)
    if steps is None and not args.tiny and below_floor(rates) and rates.busy():  # a busy moment: once more
        print(f"the machine looks busy ({rates.busy()}): measuring again", flush=True)
        rates = measure(learned, rope, device, dtype, compile=True, batch_size=batch_size)
    if steps is None and not args.tiny and (why := below_floor(rates)):
        raise UserError(why)
    if steps is None:
        fits = steps_for(rates, cap=STEPS)
        steps = fits if args.tiny else max(fits, STEP_FLOOR)
    if rates.busy():  # the plan is planned again after each stage, from what the stages took
        print(f"note: the machine looks busy ({rates.busy()}): the plan's times may be long", flush=True)
    job = Job(steps=steps, val_tokens=(data / "val.bin").stat().st_size // 2, mixed=dtype_name(dtype) != "float32",
              config=rope, batch_size=batch_size, finetune_steps=args.finetune_steps, lora_steps=args.lora_steps,
              lora=not args.tiny, report=not args.tiny, done=done, skipped=skipped)
    progress = Progress(stages(rates, job), started=started, say=lambda text: print(text, flush=True))
    chosen = "as asked" if args.max_steps else "as before" if before else (
        "the floor for a useful model: this machine is slow" if steps > steps_for(rates, cap=STEPS) else
        "about ten minutes for the first kind here")
    progress.show(f"{steps:,} steps each, {chosen}; {rates.line()}")
    return progress, steps


def main(argv: list[str] | None = None) -> None:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", type=source_arg,
                   help="TinyStories file or folder (default: $MVGPT_TINYSTORIES, else download)")
    p.add_argument("--out", type=writable_folder,
                   help="where data/, checkpoints/, runs/ and results/ go (default: here; tiny/ with --tiny)")
    p.add_argument("--max-steps", type=positive_int,
                   help="training steps for each kind, the same for both (default: as many as take the first kind "
                        f"about ten minutes here, at most {STEPS}; a job run again keeps its count)")
    p.add_argument("--device", help="cpu, cuda, mps (default: the best present)")
    p.add_argument("--finetune-steps", type=positive_int, default=80, help="steps of the long-context fine-tune")
    p.add_argument("--lora-steps", type=positive_int, default=150, help="steps of the LoRA instruction fine-tune")
    p.add_argument("--tiny", action="store_true", help="a tiny model and vocabulary: checks the pipeline")
    p.add_argument("--plan-only", action="store_true",
                   help="prepare the data, measure this machine and print the plan, then stop: how long the job "
                        "would take here")
    args = p.parse_args(argv)
    if args.source:
        source_files(args.source)  # a source that is not there: said now, before any step starts
    pick_device(args.device)  # a device this machine lacks: said now, before the data is prepared
    started = time.perf_counter()
    # SIGTERM between the steps (measuring the machine, say) ends the job as Ctrl-C does: one line, and the
    # same command later goes on from where it stopped. While a step runs, run() passes it on to the step.
    signal.signal(signal.SIGTERM, terminated)

    out = Path(args.out or ("tiny" if args.tiny else "."))  # a tiny check never overwrites the real results
    data, ckpts, runs, results = out / "data", out / "checkpoints", out / "runs", out / "results"
    env = dict(os.environ, **{JOB_AGAIN: AGAIN})  # a step stopped by Ctrl-C says how to go on with the job
    device = ["--device", args.device] if args.device else []
    data_flag = ["--data-dir", str(data)]
    window = 32 if args.tiny else 256
    common = [*device, *data_flag, "--runs-dir", str(runs)]  # every training step's
    for what, path in (("data", data), ("checkpoints", ckpts), ("TensorBoard logs", runs), ("results", results)):
        if path.exists() and not path.is_dir():  # said by the job, not by a step's flag the user never typed
            raise UserError(f"{path} is a file, where the main job keeps its {what}: move it away, or give the job "
                            "another --out")

    # the data: a tokenizer and token files (skipped when data/ is prepared already)
    prepare = [str(SCRIPTS / "prepare.py"), *data_flag, "--json", str(results / "data.json")]
    if args.source:
        prepare += ["--source", args.source]
    if args.tiny:
        prepare += ["--vocab-size", "512"]
    prepare_data(prepare, env)

    # the plan: this machine measured, each stage's time from it, the steps both kinds train
    progress, args.max_steps = plan_job(args, data, ckpts, results, started)
    if args.plan_only:
        return

    # both kinds from the same seed, data and batches, the same number of steps, in bfloat16 where it is native;
    # fewer steps than 1,000 warm up for a fifth of them, as 1,000 do for pretrain.py's 200
    model = TINY if args.tiny else ["--compile"]  # compiling pays over a thousand steps, not over a tiny run
    warmup = int(STEPS_WARMUP_SHARE * args.max_steps)
    model += ["--warmup", str(max(1, warmup))] if warmup < WARMUP_STEPS else []
    for kind, name in (([], "pretrain"), (["--rope"], "pretrain-rope")):
        train([str(SCRIPTS / "pretrain.py"), *kind, *model, "--max-steps", str(args.max_steps), "--dtype", "auto"],
              ckpts / name, args.max_steps, results / f"{name}.json", common, env)
        progress.done(f"pretrain ({'rope' if kind else 'learned'})")

    trained_steps = finished_steps(ckpts / "pretrain")  # runs trained further before are kept: say what they reached

    # the episode's comparison: held-out loss, then past the window
    both = [str(ckpts / "pretrain"), str(ckpts / "pretrain-rope")]
    rope = str(ckpts / "pretrain-rope")
    measure([str(SCRIPTS / "evaluate.py"), *both, *device, *data_flag, "--dtype", "auto"],  # bf16 beside float32
            results / "evaluate.json", both, env)
    progress.done("evaluate")
    measure([str(SCRIPTS / "context.py"), *both, *device, *data_flag, "--length", str(3 * window)],
            results / "context.json", both, env)
    progress.done("context")

    # reading past the training context: a fine-tune to 4 windows, the sweep, sinks, dynamic NTK
    long_dir = ckpts / f"pretrain-rope-ctx{4 * window}-linear"
    train([str(SCRIPTS / "pretrain.py"), "--init-from", rope, "--block-size", str(4 * window),
           "--rope-scaling", "linear", "--batch-size", "4", "--max-steps", str(args.finetune_steps), "--warmup", "5",
           "--lr", "5e-4", "--eval-every", "20", "--ckpt-every", "20", "--dtype", "auto"],
          long_dir, args.finetune_steps, results / f"{long_dir.name}.json", common, env)
    progress.done("long-context fine-tune")
    contexts = [str(window * k // 4) for k in (4, 6, 8, 12, 16, 24, 32)]
    long_context = str(SCRIPTS / "long_context.py")
    measure([long_context, rope, str(long_dir), *device, *data_flag, "--ctx", *contexts,
             "--rope-scaling", *SCALING_METHODS], results / "sweep.json", [rope, str(long_dir)], env)
    progress.done("sweep")
    measure([long_context, rope, *device, *data_flag, "--sinks", "4", "--length", str(4 * window),
             "--streams", "4"], results / "sinks.json", [rope], env)
    progress.done("sinks")
    measure([long_context, rope, *device, *data_flag, "--dynamic", "--length", str(2 * window),
             "--streams", "4"], results / "dynamic.json", [rope], env)
    progress.done("dynamic")

    # episode 9: instruction fine-tuning with LoRA on the rope model, measured against its base (a tiny check's
    # few short stories have no words rare enough to ask for: tests/test_finetune.py covers it on its own data)
    if not args.tiny:
        train([str(SCRIPTS / "finetune.py"), "--init-from", rope, "--max-steps", str(args.lora_steps)],
              ckpts / "lora-rope", args.lora_steps, results / "lora.json", common, env)
        progress.done("LoRA fine-tune")

    if not args.tiny:  # the docs' tables and figures describe the real runs, not a tiny check
        run([str(ROOT / "dev" / "report.py"), "--results-dir", str(results)], env)
        progress.done("report")
    summary = progress.summary()  # the plan against the job as it went
    command = shlex.join(["python", "scripts/main.py", *(sys.argv[1:] if argv is None else argv)])
    write_json(results / "main-job.json", {"command": command, "machine": machine(pick_device(args.device)),
                                           "steps": trained_steps, **summary})
    print(f"\ndone in {summary['took_s'] / 60:.1f} min (planned {summary['planned_s'] / 60:.1f}): checkpoints in "
          f"{ckpts}, TensorBoard logs in {runs} (tensorboard --logdir {runs}), tables in {results}")


if __name__ == "__main__":
    run_main(main, interrupted=AGAIN)
