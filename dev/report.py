"""The docs' tables and figures, and the README's Results block, made from the committed results/*.json alone.

Every table names the JSON it comes from (and the command that wrote it, where the JSON records it) and the
machine. A missing JSON gives a "not measured yet" note and a placeholder figure, so the site always builds.
`OUTPUTS` below lists every output: the JSON files it needs and the function that writes it.

Examples:
    python dev/report.py                  # docs/results/*.md, docs/figures/*.png, README.md's Results block
    python dev/report.py --check          # exit 1 if a committed table or the README block differs; writes nothing
    python dev/report.py --results-dir tiny/results --docs-dir /tmp/docs --readme ''   # a tiny run, elsewhere
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from workshop import script

from mvgpt.model import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]
README_START, README_END = "<!-- report.py: {} -->", "<!-- report.py: end -->"  # a named block of the README
PLACEHOLDER = ('!!! note "Not measured yet"\n'
               "    `{missing}` is not in `results/`: run the main job, then `python dev/report.py`.\n")
RUNS = {"pretrain.json": "learned positions", "pretrain-rope.json": "rotary embeddings"}
FINETUNE = "pretrain-rope-ctx1024-linear.json"
TEN_MINUTES = {  # the episode's commands as a learner types them: ten minutes by the clock, the step compiled where
    # that pays (the default), and the rope run once more without compiling
    "ten-minutes/pretrain.json": "learned positions", "ten-minutes/pretrain-rope.json": "rotary embeddings",
    "ten-minutes/pretrain-rope-eager.json": "rotary embeddings",
    # the same commands on the other CPU a session ran on (an AMD EPYC without AMX), kept beside ours
    "amd-epyc/ten-minutes/pretrain.json": "learned positions",
    "amd-epyc/ten-minutes/pretrain-rope.json": "rotary embeddings",
    "amd-epyc/ten-minutes/pretrain-rope-eager.json": "rotary embeddings",
    # as a CPU without bf16 units trains (--dtype float32): the warm-up bounded by the clock, then by steps alone
    "amd-epyc/ten-minutes/pretrain-rope-float32.json": "rotary embeddings",
    "amd-epyc/ten-minutes/pretrain-rope-float32-fixed-warmup.json": "rotary embeddings"}
# scripts/bench.py on other CPUs (and with --dtype float32), set beside results/bench.json
OTHER_BENCHES = ("amd-epyc/bench.json", "amd-epyc/bench-float32.json")
LINEAR_PRODUCTS = {"linear_products.json": "linear-products",  # dev/linear_products.py on each CPU: its table
                   "amd-epyc/linear_products.json": "linear-products-amd-epyc"}
DECODE = ("decode.json", "amd-epyc/decode.json")  # dev/decode_vs_llama.py on each CPU kind measured
LIVE = ("live-overhead.json", "amd-epyc/live-overhead.json")  # dev/live_overhead.py on each CPU kind measured
DECODE_PARTS = ("decode-parts.json", "amd-epyc/decode-parts.json")  # dev/decode_parts.py on each CPU kind measured
Draw = Callable  # draw(plt) -> a matplotlib figure
SPEEDS = ("Two speeds: the median step's tokens/s, the training step alone, and tokens over the run's wall time, "
          "which also counts the evaluations every 25 steps, the checkpoints and, compiled, the first step's "
          "compiling.\n\n")


# ----------------------------------------------------------------------------------------------
# Helpers: one markdown table, a header naming the sources, a moving average


def table(header: list[str], rows: list[list], align: str = "") -> str:
    """A markdown table; align gives l or r for the first columns (default: the first l), the rest are r."""
    align = (align or "l").ljust(len(header), "r")
    rule = [":---" if a == "l" else "---:" for a in align]
    return "".join("| " + " | ".join(str(c) for c in cells) + " |\n" for cells in [header, rule, *rows])


LOCAL = re.compile(r"^(?:/tmp|/work|/root|/home|/Users|/var|/mnt)/|(?:^|/)shared/data/")  # a scratch or machine path


def typed(command: str, name: str) -> str:
    """The command a learner types to make results/`name`: the folders left at their defaults (data/, runs/),
    a scratch --out-dir replaced by a folder of checkpoints/, --json pointed at the file itself, a local
    --source written as DIR."""
    words, out = shlex.split(command), []
    flags = iter(words)
    for word in flags:
        if word in ("--data-dir", "--runs-dir"):
            next(flags, None)  # data/ and runs/ are the defaults; a run elsewhere says where it read, not what
        elif word == "--json":
            next(flags, None)
            out += ["--json", f"results/{name}"]
        elif word == "--out-dir":
            folder = next(flags, "")
            out += ["--out-dir", f"checkpoints/{Path(name).stem}" if LOCAL.search(folder) else folder]
        elif word == "--source":
            folder = next(flags, "")
            out += ["--source", "DIR" if LOCAL.search(folder) else folder]
        else:
            out.append(word)
    return shlex.join(out)


def source(name: str, d: dict, as_typed: str | None = None) -> str:
    """'`results/x.json` (made by `command`)': the command it recorded, as a learner types it; or, for a file one
    of the episode's commands wrote without recording it, that command as typed (its glob unquoted), --json added."""
    command = typed(d["command"], name) if d.get("command") else as_typed and f"{as_typed} --json results/{name}"
    return f"`results/{name}`" + (f" (made by `{command}`)" if command else "")


def head(*docs: tuple[str, dict], machine: str = "not recorded", as_typed: dict[str, str] | None = None,
         first: str = "") -> str:
    """'From `results/x.json` (made by `command`) ...' and the machine(s) the numbers were measured on; `first`
    names a source before them that no script wrote (the video's figures)."""
    sources = ", ".join([*([first] if first else []), *(source(n, d, (as_typed or {}).get(n)) for n, d in docs)])
    machines = list(dict.fromkeys(d["machine"] for _, d in docs if d.get("machine")))
    return f"From {sources}, by `python dev/report.py`.  \nMachine: {'; '.join(machines) or machine}\n\n"


def at_loss(difference: float, whose: str) -> str:
    """A loss against another's, to four places, signed; one that rounds to zero said as such, not as -0.0000."""
    return f"at a loss {difference:+.4f} from {whose}" if round(difference, 4) else f"at {whose} loss, to four places"


def moving_average(values: list[float], n: int) -> list[float]:
    n = max(1, min(n, len(values)))
    sums = [0.0]
    for v in values:
        sums.append(sums[-1] + v)
    return [(sums[i + n] - sums[i]) / n for i in range(len(values) - n + 1)]


def plain_ticks(axis, ticks: list) -> None:
    """Ticks at these values, written as plain numbers (a log axis writes 3×10^2 otherwise)."""
    from matplotlib.ticker import FixedLocator, NullLocator, StrMethodFormatter

    low, high = axis.get_view_interval()
    axis.set_major_locator(FixedLocator([t for t in ticks if low <= t <= high] or ticks))
    axis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    axis.set_minor_locator(NullLocator())


def figure(plt, rows: int = 1, height: float = 3.6, **kw):
    """A figure as wide as the docs' column (8 inches, saved at 150 dpi), with readable fonts."""
    plt.rcParams.update({"font.size": 11, "axes.titlesize": 12, "legend.fontsize": 10})
    fig, axes = plt.subplots(rows, 1, figsize=(8, height * rows), squeeze=False, **kw)
    for ax in axes[:, 0]:
        ax.grid(alpha=0.3)
    return fig, list(axes[:, 0])


# ----------------------------------------------------------------------------------------------
# The writers: each takes {json name: data} and returns {output name: markdown, or a draw function}


def training(r: dict) -> dict:
    runs = {name: r[name] for name in RUNS}
    rows = [[RUNS[n], d["kind"], d["dtype"], f"{d['steps']:,}", f"{d['tokens']:,}", f"{d['seconds'] / 60:.1f}",
             f"{d['tokens_per_s']:,.0f}", f"{d['tokens'] / d['seconds']:,.0f}", f"{d['val_loss']:.4f}"]
            for n, d in runs.items()]
    body = SPEEDS + table(["run", "kind", "dtype", "steps", "tokens", "minutes", "tokens/s, median step",
                           "tokens / wall time", "held-out loss"], rows, "lll")
    learned, rope = ({e["step"]: e["val_loss"] for e in d["evals"]} for d in runs.values())
    shared = sorted(set(learned) & set(rope))
    if shared:
        body += "\nHeld-out loss at the steps both runs evaluated (the same held-out batches):\n\n" + table(
            ["step", "learned", "rope", "rope − learned"],
            [[f"{s:,}", f"{learned[s]:.4f}", f"{rope[s]:.4f}", f"{rope[s] - learned[s]:+.4f}"] for s in shared])

    return {"training": head(*runs.items()) + body, "training-loss.png": loss_figure(runs)}


def loss_figure(runs: dict[str, dict]) -> Draw:
    """Held-out and training-batch loss against step, a colour per run ({JSON name: run}, named as in RUNS)."""

    def draw(plt):
        fig, (ax,) = figure(plt, height=4.2)
        for i, (name, d) in enumerate(runs.items()):
            label = RUNS[Path(name).name]
            steps = [e["step"] for e in d["evals"]]
            ax.plot(steps, [e["val_loss"] for e in d["evals"]], "o-", color=f"C{i}", ms=3,
                    label=f"{label}, held out")
            ax.plot(steps, [math.nan if e["train_loss"] is None else e["train_loss"] for e in d["evals"]], "--",
                    color=f"C{i}", alpha=0.6,
                    label=f"{label}, training batch")
        ax.set(xlabel="optimizer step", ylabel="loss (nats per token)", title="Loss against step")
        ax.legend()
        return fig

    return draw


def cpu(machine: str) -> str:
    """A machine line's first part, the processor, without trademarks: 'Intel Xeon (AVX512)'."""
    return re.sub(r"\((R|TM)\)| Processor", "", machine.split(",")[0])


def warmup_bound(args: dict) -> str:
    """How a run's warm-up was bounded: by steps alone (--warmup-share 0, or a run from before the share)
    or by the lesser of its steps and a share of the time."""
    share = args.get("warmup_share", 0) if args.get("max_steps") is None else 0
    return f"{args['warmup']} steps" + (f", ≤ {share:.0%} of the time" if share else "")


def ten_minutes(r: dict) -> dict:
    runs = [(name, r[name]) for name in TEN_MINUTES if name in r]
    dtypes = list(dict.fromkeys(d["dtype"] for _, d in runs))
    rows = [[TEN_MINUTES[n], cpu(d["machine"]), "compiled" if d["args"]["compile"] else "eager",
             *([d["dtype"]] if len(dtypes) > 1 else []), warmup_bound(d["args"]), f"{d['steps']:,}",
             f"{d['seconds'] / 60:.1f}", f"{d['tokens_per_s']:,.0f}", f"{d['tokens'] / d['seconds']:,.0f}",
             f"{d['val_loss']:.4f}"] for n, d in runs]
    same = f"All in {dtypes[0]}. " if len(dtypes) == 1 else ""
    return {"ten-minutes": head(*runs) + "Each run trains until its ten minutes are up (compiling and evaluating "
            f"count against them), {runs[0][1]['tokens'] // runs[0][1]['steps']:,} tokens a step. " + same + SPEEDS
            + table(["run", "machine", "mode", *(["dtype"] if len(dtypes) > 1 else []), "warm-up", "steps", "minutes",
                     "tokens/s, median step", "tokens / wall time", "held-out loss"], rows,
                    "l" * (4 + (len(dtypes) > 1)))}


def evaluate(r: dict) -> dict:
    d = r["evaluate.json"]
    return {"evaluate": head(("evaluate.json", d)) + evaluate_table(d)}


def evaluate_table(d: dict) -> str:
    """evaluate.py's JSON as a table: a row per model, under the tokens read and the dtype."""
    both = all("loss_difference" in x for x in d["rows"])  # read in bf16, and in float32 for the difference
    rows = [[f"`{x['model']}`", f"{x['params']:,}", x["context"], f"{x['loss']:.4f}", f"{x['perplexity']:.2f}",
             f"{x['accuracy']:.1%}"] + ([f"{x['loss_difference']:+.4f}"] if both else []) for x in d["rows"]]
    tokens = ", ".join(dict.fromkeys(f"{x['tokens']:,}" for x in d["rows"]))
    dtypes = ", ".join(dict.fromkeys(x.get("dtype", "float32") for x in d["rows"]))
    return f"Over {tokens} held-out tokens, read in {dtypes}.\n\n" + table(
        ["model", "parameters", "context", "held-out loss", "perplexity", "top-1"]
        + (["bf16 - float32 loss"] if both else []), rows)


def precision(r: dict) -> dict:
    d = r["precision.json"]
    other = d["dtypes"][1]
    rows = [[x["step"], f"{x['float32']:.4f}", f"{x[other]:.4f}", f"{x['difference']:+.4f}"] for x in d["rows"]]
    header = ["step", "float32", other, "difference"]
    again = r.get("precision-again.json")  # the same comparison run once more: how far bf16 strays from itself
    if again:
        by_step = {x["step"]: x for x in again["rows"]}
        for row, x in zip(rows, d["rows"], strict=True):
            y = by_step.get(x["step"])
            row += [f"{y[other]:.4f}", f"{y['difference']:+.4f}", f"{x[other] - y[other]:+.4f}"] if y else ["", "", ""]
        header += [f"{other}, again", "difference, again", f"{other} - {other}, again"]
    verdict = "within" if d["within_tolerance"] else "outside"
    text = (f"`{d['kind']}` model, {d['steps']} steps from the same seed and batches; the largest held-out "
            f"difference is {d['max_abs_difference']:.4f}, {verdict} the tolerance of {d['tolerance']}.")
    if again:
        spread = max(abs(x[other] - by_step[x["step"]][other]) for x in d["rows"] if x["step"] in by_step)
        text += (" Run once more with the same settings (`results/precision-again.json`), the "
                 f"largest difference was {again['max_abs_difference']:.4f}, and the two {other} runs were up to "
                 f"{spread:.4f} apart.")
    return {"precision": head(("precision.json", d)) + text + "\n\n" + table(header, rows)}


PARITY = [  # every float32-against-bf16 comparison kept: with today's defaults, with 100 warm-up steps, with lr 1.5e-3
    "precision.json", "precision-again.json", "precision-third.json", "warmup100/precision.json",
    "warmup100/precision-again.json", "warmup100/precision-eager.json", "warmup100/precision-peak.json",
    "lr1.5e-3/precision.json", "lr1.5e-3/precision-again.json",
]


def precision_runs(r: dict) -> dict:
    """One line per comparison: its settings, and the largest difference, where, and every step outside tolerance."""
    rows, runs = [], [(name, r[name]) for name in PARITY if name in r]
    for name, d in runs:
        worst = max(d["rows"], key=lambda x: abs(x["difference"]))
        outside = [x["step"] for x in d["rows"] if abs(x["difference"]) > d["tolerance"]]
        rows.append([f"`{name}`", d["warmup"], f"{d['lr']:g}", "eager" if "--eager" in d["command"] else "compiled",
                     d["steps"], len(d["rows"]), f"{worst['difference']:+.4f}", worst["step"],
                     ", ".join(map(str, outside)) or "none"])
    return {"precision-runs": head(*runs) + "float32 against bf16 from the same seed and batches, with the peak lr "
            f"and warm-up each comparison trained with; a difference is bf16's loss minus float32's, and the "
            f"tolerance is {runs[0][1]['tolerance']}.\n\n" + table(
                ["results/", "--warmup", "--lr", "bf16 step", "steps", "evaluations", "largest difference",
                 "at step", "steps outside tolerance"], rows)}


def precision_peak(r: dict) -> dict:
    """The parity run evaluated after every step around the peak: how far one step moves each run's loss."""
    d = r["warmup100/precision-peak.json"]
    other = d["dtypes"][1]
    first, last = d["every_step"]
    dense = [x for x in d["rows"] if first <= x["step"] <= last]  # one row per step
    moves = {name: [None] + [b[name] - a[name] for a, b in zip(dense, dense[1:], strict=False)]
             for name in ("float32", other)}
    rows = [[x["step"], f"{x['float32']:.4f}", f"{x[other]:.4f}", f"{x['difference']:+.4f}"]
            + [f"{moves[name][i]:+.4f}" if i else "" for name in ("float32", other)] for i, x in enumerate(dense)]
    (f32, at), (bf, bf_at) = (max((abs(m), x["step"]) for m, x in zip(moves[name][1:], dense[1:], strict=True))
                              for name in ("float32", other))
    outside = [x["step"] for x in dense if abs(x["difference"]) > d["tolerance"]]
    text = (f"`{d['kind']}` model, {d['steps']} steps, the held-out loss measured after every step from "
            f"{first} to {last}. In one step float32's loss moved by up to {f32:.4f} "
            f"(into step {at}) and {other}'s by up to {bf:.4f} (into step {bf_at}); the two differed by more than "
            f"{d['tolerance']} at {len(outside)} of these {len(dense)} steps" + (f" ({', '.join(map(str, outside))})"
                                                                                 if outside else "") + ".")

    def draw(plt):
        fig, ax = plt.subplots(figsize=(7, 3.2))
        steps = [x["step"] for x in dense]
        for name, style in (("float32", "o-"), (other, "s-")):
            ax.plot(steps, [x[name] for x in dense], style, ms=3.5, label=name)
        ax.set(xlabel="step (the learning rate peaks at the end of the warm-up)", ylabel="held-out loss",
               title="Held-out loss after every step around the peak")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        return fig

    return {"precision-peak": head(("warmup100/precision-peak.json", d)) + text + "\n\n" + table(
        ["step", "float32", other, "difference", "float32, one step", f"{other}, one step"], rows),
        "precision-peak.png": draw}


def rise(losses: list[float], steps: int) -> float:
    """The largest climb of the training loss above its lowest value so far, over the first `steps` steps."""
    low, worst = math.inf, 0.0
    for loss in losses[:steps]:
        low = min(low, loss)
        worst = max(worst, loss - low)
    return worst


def warmup(r: dict) -> dict:
    d = r["warmup.json"]
    at = [25, 50, 100, 200, 300]
    rows = []
    for run in d["runs"]:
        loss = {e["step"]: e["val_loss"] for e in run["evals"]}
        rows.append([run["warmup"], f"{run['lr']:g}"] + [f"{loss[s]:.3f}" if s in loss else "" for s in at]
                    + [f"{rise(run['train_loss'], 50):.2f}"])
    commands = "".join(f"- `{run['command']}` (stopped at step {run['stopped_at']})\n" for run in d["runs"])
    return {"warmup": head(("warmup.json", d)) + f"{d['note']}.\n\n" + table(
        ["warm-up steps", "lr", *[f"held-out at {s}" for s in at], "largest rise, steps 1-50"], rows, "rr")
        + "\n" + commands}


SCHEDULE = [  # the rope model's full 1000-step runs: with the code of e04d528, the main job's then, again, and with
    # one setting changed; then the main job's with the faster step (e97d475), and the same with 200 warm-up steps
    "schedule/pretrain-rope.json", "schedule/pretrain-rope-again.json", "lr1.5e-3/pretrain-rope.json",
    "lr1.5e-3/pretrain-rope-repeat.json", "schedule/pretrain-rope-warmup50.json",
    "schedule/pretrain-rope-min0.json", "schedule/pretrain-rope-min0.3.json", "warmup100/pretrain-rope.json",
    "schedule/pretrain-rope-warmup200.json",
]


def schedule(r: dict) -> dict:
    at = [100, 300, 600, 800, 1000]
    rows, runs = [], [(name, r[name]) for name in SCHEDULE if name in r]
    for name, d in runs:
        loss = {e["step"]: e["val_loss"] for e in d["evals"]}
        a = d["args"]  # the settings the run trained with, whatever its command spelled out
        rows.append([f"`{name}`", f"{a['lr']:g}", a["warmup"], f"{a['min_lr_ratio']:g}"]
                    + [f"{loss[s]:.4f}" if s in loss else "" for s in at])
    return {"schedule": head(*runs) + "The rope model, 1000 steps each; held-out loss on pretrain.py's evaluation "
            "batches. The settings are each run's own (its args); where a command leaves one out, the JSON's "
            "note says how it was made.\n\n"
            + table(["results/", "--lr", "--warmup", "--min-lr-ratio", *[f"step {s}" for s in at]], rows)}


def attention(r: dict) -> dict:
    d = r["attention.json"]
    rows = [[x["kernel"], f"{x['ms']:.1f}", f"{x['relative']:.2f}"] for x in d["rows"]]
    shape = " x ".join(str(n) for n in d["shape"])
    return {"attention": head(("attention.json", d)) + f"One layer's attention, forward and backward, batch x heads "
            f"x tokens x head size = {shape}, causal; the median of {d['rounds']} rounds taken side by side.\n\n"
            + table(["kernel", "ms", "time / flash bf16"], rows)}


def linear_products(name: str, output: str) -> Callable[[dict], dict]:
    """dev/linear_products.py's JSON `name` (one per machine measured) as the table `output`."""

    def write(r: dict) -> dict:
        d = r[name]
        rows = [[x["layer"], x["product"], f"{x['ms']:.2f}", "" if x["tflops"] is None else f"{x['tflops']:.2f}",
                 "" if x["over_square"] is None else f"{x['over_square']:.2f}"] for x in d["rows"]]
        return {output: head((name, d)) + f"Each linear layer's products at "
                f"{d['rows_per_step']:,} rows in bf16, and the square product bench.py takes its peak from, timed "
                f"among them; the median of {d['rounds']} rounds taken side by side. A step's products (each layer's "
                f"three, times the layers) at these speeds: {d['step_ms']:.0f} ms; all at the square product's rate: "
                f"{d['step_ms_at_square_rate']:.0f} ms.\n\n"
                + table(["layer", "product", "ms", "TFLOP/s", "× the square's"], rows, "ll")}

    return write


def context(r: dict) -> dict:
    d = r["context.json"]
    body, draw = context_table(d)
    return {"context": head(("context.json", d)) + body, "context-loss.png": draw}


def context_table(d: dict, drawn: tuple[str, ...] | None = None) -> tuple[str, Draw]:
    """context.py's JSON as a table with its speed ratios, and the figure of loss against position (the rows of
    the models in `drawn` alone, all by default)."""
    rows, window, smooth = d["rows"], d["window"], 32
    body = (f"{d['streams']} streams of {d['length']} held-out tokens; loss over the tokens past the first "
            f"{window}, on `{d['device']}`.\n\n")
    body += table(["model", "method", "loss past the window", "ms per token"],
                  [[f"`{x['model']}`", x["method"], f"{x['loss']:.4f}", f"{x['ms_per_token']:.2f}"] for x in rows],
                  "llrr")
    by = {(x["model"], x["method"]): x for x in rows}
    cache, rope_window = by.get(("pretrain-rope", "sliding cache")), by.get(("pretrain-rope", "sliding window"))
    if cache and rope_window:
        body += (f"\n`pretrain-rope`'s sliding cache writes a token "
                 f"{rope_window['ms_per_token'] / cache['ms_per_token']:.1f}× faster than its sliding window")
        learned = by.get(("pretrain", "sliding window"))
        if learned:
            body += f", {learned['ms_per_token'] / cache['ms_per_token']:.1f}× faster than `pretrain`'s"
        body += ", " + at_loss(cache["loss"] - rope_window["loss"], "the window's") + ".\n"
    c_step = by.get(("pretrain-rope", "sliding cache, C step"))  # context.py's row for the one-token step in C
    if cache and c_step:
        body += (f"\nWith its one-token step in C (`mvgpt/perf/one_token.c`), the same sliding cache writes a token "
                 f"in {c_step['ms_per_token'] / cache['ms_per_token']:.2f} of the time model.py's step takes, "
                 + at_loss(c_step["loss"] - cache["loss"], "model.py's step's") + ".\n")

    def draw(plt):
        fig, (ax,) = figure(plt, height=4.2)
        styles = {"sliding window": "-", "sliding cache": "--", "full context": ":"}
        for i, x in enumerate(rows):
            if x["method"] == "sliding cache, C step" or (drawn and x["model"] not in drawn):
                continue  # its losses are the sliding cache's: one line would hide the other
            means = moving_average(x["position_losses"], smooth)
            start = window + (smooth - 1) / 2  # each mean sits in the middle of its positions
            ax.plot([start + j for j in range(len(means))], means, styles.get(x["method"], "-."), color=f"C{i}",
                    label=f"{x['model']}: {x['method']}")
        ax.set(xlabel=f"position in the stream (tokens); positions 0-{window - 1} are read, not scored",
               ylabel=f"loss (nats per token),\nmean of {smooth} positions", title="Loss past the window")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
        ax.text(0.01, 0.98, f"window and cache: each token sees the {window} before it\nfull context: every "
                f"token before it, so distances of {window} and more, never trained on",
                transform=ax.transAxes, va="top", fontsize=9, color="dimgrey")
        ax.set_ylim(top=ax.get_ylim()[1] + 0.15 * (ax.get_ylim()[1] - ax.get_ylim()[0]))
        return fig

    return body, draw


def data(r: dict) -> dict:
    d = r["data.json"]
    rows = [[name, f"{d[k]['stories']:,}", f"{d[k]['tokens']:,}", f"{d[k]['chars_per_token']:.2f}"]
            for k, name in (("train", "training"), ("held_out", "held out"))]
    body = table(["split", "stories", "tokens", "characters per token"], rows)
    split = re.sub(r"\S*/([^/\s]+\.txt)", r"`\1`", d["split"])  # the files, not where they sat
    body += (f"\nVocabulary: {d['vocab_size']:,} tokens, `<|endoftext|>` included; tokenizer hash "
             f"`{d['tokenizer_hash']}`.  \nSource: {split}\n")
    return {"data": head(("data.json", d), machine="none needed (counts, not timings)") + body}


def sweep(r: dict) -> dict:
    """Loss only (perplexity = exp(loss)), one table per model: rows n_ctx, columns methods, best in bold."""
    d, body = r["sweep.json"], ""
    names = list(dict.fromkeys(x["model"] for x in d["rows"]))
    for name in names:
        mine = [x for x in d["rows"] if x["model"] == name]
        methods = list(dict.fromkeys(x["method"] for x in mine))
        rows = []
        for ctx in dict.fromkeys(x["ctx"] for x in mine):
            cells = {x["method"]: x["loss"] for x in mine if x["ctx"] == ctx}
            best = min(cells.values())
            rows.append([ctx] + [("**{:.3f}**" if cells[m] == best else "{:.3f}").format(cells[m]) if m in cells
                                 else "–" for m in methods])
        train_ctx = mine[0]["train_ctx"]
        past = {(x["method"], x["ctx"]): x["loss"] for x in mine if x["ctx"] > train_ctx}
        ctxs = sorted({c for _, c in past})
        if "none" in methods and ctxs:  # a generated summary, so the prose need not count
            rows.append([f"below `none` past {train_ctx}"] + [
                "–" if m == "none" else f"{sum(past.get((m, c), math.inf) < past[('none', c)] for c in ctxs)} "
                f"of {len(ctxs)}" for m in methods])
        body += f"`{name}`, trained at {mine[0]['train_ctx']} tokens (best of each row in bold):\n\n"
        body += table(["n_ctx", *methods], rows) + "\n"
    body += ("Each row scores its own tokens (the second half of each n_ctx chunk), so compare the methods "
             "within a row; across rows the text differs as well as the context.\n")
    out = {"sweep": head(("sweep.json", d)) + body}
    if d.get("memory"):
        out["memory"] = head(("sweep.json", d)) + table(
            ["n_ctx", "KV cache bytes per token", "KV cache MiB", "peak of one forward, MiB"],
            [[m["ctx"], f"{m['kv_bytes_per_token']:,}", f"{m['kv_bytes'] / 2**20:.1f}",
              "–" if m["peak_bytes"] is None else f"{m['peak_bytes'] / 2**20:.1f}"] for m in d["memory"]])

    def draw(plt):
        fig, axes = figure(plt, rows=len(names), height=3.4, sharex=True)
        for ax, name in zip(axes, names, strict=True):
            mine = [x for x in d["rows"] if x["model"] == name]
            for i, method in enumerate(dict.fromkeys(x["method"] for x in mine)):
                points = sorted((x["ctx"], x["loss"]) for x in mine if x["method"] == method)
                ax.plot(*zip(*points, strict=True), "o-", color=f"C{i}", ms=3, label=method)
            ax.axvline(mine[0]["train_ctx"], color="grey", ls=":")
            ax.set(xscale="log", ylabel="loss (nats/token)", title=f"{name}: trained at {mine[0]['train_ctx']} "
                   "tokens (dotted line)")
            plain_ticks(ax.xaxis, sorted({x["ctx"] for x in mine}))
        axes[-1].set_xlabel("n_ctx (tokens read at once, log scale)")
        axes[0].legend(fontsize=8, ncol=2)
        fig.tight_layout()
        return fig

    out["sweep.png"] = draw
    return out


def streams(name: str, intro: str) -> Callable[[dict], dict]:
    """context.py --sinks / --dynamic: model, method, loss and ms per token."""

    def write(r: dict) -> dict:
        d = r[f"{name}.json"]
        losses = [x["loss"] for x in d["rows"]]
        return {name: head((f"{name}.json", d)) + intro.format(**d) + "\n\n" + table(
            ["model", "method", "loss", "ms per token"],
            [[f"`{x['model']}`", x["method"], f"{x['loss']:.4f}", f"{x['ms_per_token']:.2f}"] for x in d["rows"]],
            "llrr") + f"\nThe losses of these rows span {max(losses) - min(losses):.4f}.\n"}

    return write


def finetune(r: dict) -> dict:
    """The long-context fine-tune's run (the sweep shows the fine-tuned model beside the original)."""
    d = r[FINETUNE]
    return {"finetune": head((FINETUNE, d)) + table(
        ["run", "steps", "tokens", "minutes", "held-out loss, first evaluation", "last"],
        [[f"`{FINETUNE[:-5]}`", f"{d['steps']:,}", f"{d['tokens']:,}", f"{d['seconds'] / 60:.1f}",
          f"{d['evals'][0]['val_loss']:.4f} (step {d['evals'][0]['step']})", f"{d['val_loss']:.4f}"]])}


def bench(r: dict) -> dict:
    """scripts/bench.py's JSON: each figure against its bound; absent optional keys leave their rows out."""
    b = r["bench.json"]
    c, d, goals = b["ceilings"], b["decoding"], b.get("goals", {})
    goal = lambda key, fmt: fmt.format(goals[key]) if key in goals else ""
    peak_name = "bf16" if c.get("training_peak") == "matmul_bf16_flops" else "fp32"
    rows = [[f"{kind} matmul peak", f"{c[key] / 1e9:,.1f} GFLOP/s", f"{c.get(key[:-6] + '_n', c['matmul_n'])}² product"
             + (" (bench's probe)" if key[:-6] + "_n" in c else ""), "", ""]
            for kind, key in (("fp32", "matmul_fp32_flops"), ("bf16", "matmul_bf16_flops")) if key in c]
    rows += [[f"memory read{label}", f"{c[key] / 1e9:.1f} GB/s", f"sum of {c['bandwidth_mbytes']} MB", "", ""]
             for label, key in (("", "read_bandwidth"), (", 1 thread", "read_bandwidth_1_thread")) if key in c]
    untuned = [{**b["training_malloc_untuned"], "kind": b["training_malloc_untuned"]["kind"] + ", malloc untuned"}
               ] if b.get("training_malloc_untuned") else []
    for t in b["training"] + untuned:
        batch = t.get("batch") or b["training"][0]["batch"]  # the untuned-malloc row runs the same batch
        label = ", ".join([t["kind"], *([t["dtype"]] if t.get("dtype") else []),
                           *([f"compiled ({t['compile_s']:.0f} s)" if t.get("compile_s") is not None else "compiled"]
                             if t.get("compiled") else []),
                           *(["PyTorch's attention kernel"] if t.get("compiled") and t.get("attention") == "sdpa"
                             and t.get("dtype") == "bfloat16" and b.get("training_batched_attention_speedup")
                             else []), "×".join(map(str, batch))])
        rows.append([f"training ({label})", f"{t['tokens_per_s']:,.0f} tokens/s = {t['flops'] / 1e9:,.1f} GFLOP/s",
                     f"{peak_name} peak", f"{t['share_of_peak']:.2f} of peak",
                     goal("training_share_of_peak", "≥ {:g}")])
    rows += [[f"training ({kind}, float32): against float32's products", f"{share:.2f} of the fp32 peak",
              f"fp32 peak {c['matmul_fp32_flops'] / 1e9:,.1f} GFLOP/s", "", ""]
             for kind, share in float32_shares(b).items()]
    rows += [[f"training ({kind}): compiled over eager, side by side",
              ", ".join(f"{name} {ratio:.2f}×" for name, ratio in ratios.items()), "the same step", "", ""]
             for kind, ratios in b.get("training_compiled_over_eager", {}).items()]
    rows += [[f"training ({kind}, compiled bf16): attention's batched products over PyTorch's kernel",
              f"{ratio:.2f}× the tokens/s", "side by side", "", ""]
             for kind, ratio in b.get("training_batched_attention_speedup", {}).items()]
    # batch-1 decoding with the cache: in each precision (its own floor), by threads, and the fast step (float32)
    for name, ms in d.get("cached_ms_by_dtype", {}).items():
        floor_ms = d["floor_ms_by_dtype"][name]
        rows.append([f"decoding, sliding cache, {name} weights", f"{ms:.2f} ms/token", f"floor {floor_ms:.2f} ms",
                     f"{ms / floor_ms:.2f}× floor", goal("cached_over_floor", "≤ {:g}×")])
    headline = f"{d['dtype']}, " if d.get("dtype") else ""
    for n, ms in d["cached_ms_by_threads"].items():
        rows.append([f"decoding, sliding cache, {headline}{n} thread{'s' * (int(n) > 1)}", f"{ms:.2f} ms/token",
                     f"floor {d['floor_ms']:.2f} ms", f"{ms / d['floor_ms']:.2f}× floor",
                     goal("cached_over_floor", "≤ {:g}×")])
    k = b.get("c_step")
    if k:
        floor_ms = d.get("floor_ms_by_dtype", {}).get("float32", d["floor_ms"])
        pays = f"pays after {k['break_even_tokens']:,.0f} tokens" if k.get("break_even_tokens") else "never pays"
        side = (f", {k['speedup']:.2f}× the eager step's {k['eager_ms']:.2f} side by side: {pays}"
                if "speedup" in k else "")
        rows.append(["decoding, sliding cache, float32, fast step (fast_decode.py)",
                     f"{k['ms']:.2f} ms/token (making it: {k['build_s']:.0f} s{side})", f"floor {floor_ms:.2f} ms",
                     f"{k['ms'] / floor_ms:.2f}× floor", goal("cached_over_floor", "≤ {:g}×")])
    floors = f" ({d['floors_ratio']:.1f}× the cache's floor)" if "floors_ratio" in d else ""
    rows.append([f"decoding, re-run window (learned, {b['config']['block_size']})", f"{d['rerun_ms']:.1f} ms/token",
                 f"compute floor {d['rerun_compute_floor_ms']:.1f} ms{floors}",
                 f"{d['rerun_over_cached']:.1f}× the cache", goal("rerun_over_cached", "≥ {:g}×")])
    rows += [[f"generation, batch {g['batch']}", f"{g['tokens_per_s']:,.0f} tokens/s",
              f"floor {g['floor_tokens_per_s']:,.0f}", f"{g['share_of_floor']:.2f} of floor", ""]
             for g in b["generation"]]
    rows += [[skipped["part"], "skipped", f"about {skipped['estimated_seconds'] / 60:,.0f} min on this machine",
              "", ""] for skipped in b.get("skipped", [])]
    body = table(["figure", "measured", "against", "ratio", "goal"], rows, "lllrl")
    body += f"\n{b['threads']} threads" + (", glibc malloc tuned" if b.get("malloc_tuned") else "") + (
        ", --quick (rougher figures)" if b.get("quick") else "") + f", {b['date'][:10]}. {b.get('note', '')}".rstrip()
    profiles = [("One cached decoding step (rope, batch 1, a full window held)", d.get("profile")),
                ("The same step, fast (fast_decode.py)", (k or {}).get("profile")),
                *[(f"One training step ({t['kind']}, {t.get('dtype', 'float32')}"
                   f"{', compiled' if t.get('compiled') else ''})", t["profile"])  # the last one profiled
                  for t in [t for t in b["training"] if t.get("profile")][-1:]]]

    def draw(plt):
        fig, (ax1, ax2, ax3) = figure(plt, rows=3, height=3.0)
        peak = c[c.get("training_peak", "matmul_fp32_flops")] / 1e9
        ax1.barh([t["kind"] + (f", {t['dtype']}" if t.get("dtype") else "") for t in b["training"]],
                 [t["flops"] / 1e9 for t in b["training"]], color="C0")
        ax1.axvline(peak, color="black", label=f"{peak_name} matmul peak")
        ax1.set(xlabel="GFLOP/s", title="Training: achieved FLOP/s against the matmul peak")
        ax1.legend(loc="lower right")
        bars = [("floor", d["floor_ms"])] + [(f"cache, {n} thr", ms) for n, ms in d["cached_ms_by_threads"].items()]
        bars += [("cache, fast step", k["ms"])] if k else []
        bars += [("re-run: floor", d["rerun_compute_floor_ms"]), ("re-run window", d["rerun_ms"])]
        colors = ["grey"] + ["C2"] * (len(bars) - 3) + ["silver", "C3"]
        ax2.barh([n for n, _ in bars], [v for _, v in bars], color=colors)
        for y, (_, v) in enumerate(bars):
            ax2.text(v, y, f" {v:.1f}", va="center", fontsize=9)
        ax2.set(xscale="log", xlabel="ms per token (log scale)", title="Decoding one token, batch 1")
        plain_ticks(ax2.xaxis, [1, 2, 5, 10, 20, 50, 100])
        gen = b["generation"]
        ax3.plot([g["batch"] for g in gen], [g["tokens_per_s"] for g in gen], "o-", label="measured")
        ax3.plot([g["batch"] for g in gen], [g["floor_tokens_per_s"] for g in gen], "s--", color="grey", label="floor")
        ax3.set(xscale="log", yscale="log", xlabel="sequences at once (batch)", ylabel="tokens/s (log scale)",
                title="Generation with the cache")
        plain_ticks(ax3.xaxis, [g["batch"] for g in gen])
        plain_ticks(ax3.yaxis, [100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000])
        ax3.legend()
        fig.tight_layout()
        return fig

    return {"bench": head(("bench.json", b)) + body + "\n",
            "bench-profiles": "".join(f"**{t}**\n\n```text\n{p.strip()}\n```\n\n" for t, p in profiles if p),
            "bench-parts": head(("bench.json", b)) + step_parts(b["training"]),
            "bench.png": draw}


def float32_shares(b: dict) -> dict[str, float]:
    """{kind: the eager float32 training step's FLOP/s over the fp32 matmul peak} of a bench.json (computed
    from its figures where the bench predates the key)."""
    if "training_float32_share_of_fp32_peak" in b:
        return b["training_float32_share_of_fp32_peak"]
    return {t["kind"]: t["flops"] / b["ceilings"]["matmul_fp32_flops"] for t in b["training"]
            if t.get("dtype", "float32") == "float32" and not t.get("compiled")}


def bench_machines(r: dict) -> dict:
    """The bench's ceilings, its fastest training step of each kind and batch-1 decoding on every CPU measured,
    a column each."""
    benches = [(n, r[n]) for n in ("bench.json", *OTHER_BENCHES) if n in r]

    def peak(b: dict, key: str) -> str:
        c = b["ceilings"]
        if key not in c:
            return "–"
        times = f" ({c[key] / c['matmul_fp32_flops']:.1f}× fp32)" if key != "matmul_fp32_flops" else ""
        return f"{c[key] / 1e9:,.1f} GFLOP/s{times}"

    def fastest(b: dict, kind: str) -> str:
        t = max((t for t in b["training"] if t["kind"] == kind), key=lambda t: t["tokens_per_s"], default=None)
        if t is None:
            return "–"
        how = ", ".join([t.get("dtype", "float32"), *(["compiled"] if t.get("compiled") else [])])
        return f"{t['tokens_per_s']:,.0f} tokens/s = {t['share_of_peak']:.2f} of peak ({how})"

    def products(b: dict) -> str:
        steps = [t for t in b["training"] if t.get("profile_parts") and t["kind"] == "rope"]
        if not steps:
            return "–"
        parts = steps[-1]["profile_parts"]
        return f"{parts.get('matrix products', 0.0) / sum(parts.values()):.0%} of {sum(parts.values()) * 1e3:,.0f} ms"

    def decoding(b: dict, dtype: str) -> str:
        d = b["decoding"]
        ms = d.get("cached_ms_by_dtype", {}).get(dtype)
        return "–" if ms is None else f"{ms:.2f} ms/token = {ms / d['floor_ms_by_dtype'][dtype]:.2f}× its floor"

    def c_step(b: dict) -> str:
        k = b.get("c_step") or {}
        return f"{k['speedup']:.2f}× the eager step's speed" if "speedup" in k else "–"

    rows = [["fp32 matmul peak", *(peak(b, "matmul_fp32_flops") for _, b in benches)],
            ["bf16 matmul peak", *(peak(b, "matmul_bf16_flops") for _, b in benches)],
            ["memory read", *(f"{b['ceilings']['read_bandwidth'] / 1e9:.1f} GB/s" for _, b in benches)],
            *[[f"training, {kind}: the fastest step", *(fastest(b, kind) for _, b in benches)]
              for kind in ("learned", "rope")],
            ["training, float32 (eager): the fp32 peak's share", *(", ".join(
                f"{kind} {share:.2f}" for kind, share in float32_shares(b).items()) or "–" for _, b in benches)],
            ["the matrix products' share of the last profiled rope step", *(products(b) for _, b in benches)],
            *[[f"decoding, sliding cache, {dtype} weights", *(decoding(b, dtype) for _, b in benches)]
              for dtype in ("float32", "bfloat16")],
            ["decoding, float32, fast step (fast_decode.py)", *(c_step(b) for _, b in benches)],
            ["measured", *(b["date"][:10] for _, b in benches)]]
    names = [cpu(b["machine"]) + (", --dtype float32" if b.get("dtype") == "float32" else "") for _, b in benches]
    return {"bench-machines": head(*benches) + table(["figure", *names], rows)}


def step_parts(training: list[dict]) -> str:
    """Each profiled training step's time by part (mvgpt.perf.time_by_part), a column per step."""
    steps = [t for t in training if t.get("profile_parts")]
    if not steps:
        return "No step's time by part in this bench (made before bench.py measured it).\n"
    # in the order of the last step (largest first), then any only the others have
    parts = list(dict.fromkeys([*steps[-1]["profile_parts"], *(p for t in steps for p in t["profile_parts"])]))
    totals = [sum(t["profile_parts"].values()) for t in steps]

    def cell(t: dict, total: float, part: str) -> str:
        seconds = t["profile_parts"].get(part)
        return "" if seconds is None else f"{seconds * 1e3:,.1f} ms ({seconds / total:.0%})"

    header = ["part of the step"] + [f"{t['kind']}, {t['dtype']}{', compiled' if t['compiled'] else ''}"
                                     for t in steps]
    rows = [[part] + [cell(t, total, part) for t, total in zip(steps, totals, strict=True)] for part in parts]
    rows.append(["the parts added up"] + [f"{total * 1e3:,.1f} ms" for total in totals])
    B, T = steps[-1]["batch"]
    return (f"A training step ({B} x {T}) under the profiler, its operations' own time summed by part "
            "(`mvgpt.perf.time_by_part`; a fused kernel counts under the first part its name contains, in the "
            "order of `STEP_PARTS`), each part the median of three profiled steps. A compiled step was compiled "
            "once more for this, with its kernels named.\n\n" + table(header, rows))


def quoted(text: str, limit: int = 400) -> str:
    """A generated story as a markdown quote: up to its first <|endoftext|>, cut at a word near `limit`
    characters, markdown's special characters escaped so the story shows as written."""
    text = text.split("<|endoftext|>")[0].strip()
    if len(text) > limit:
        text = text[:limit].rsplit(" ", 1)[0] + " …"
    text = re.sub(r"([\\`*_\[\]<>#|])", r"\\\1", text)
    return "".join(f"> {line}\n" if line.strip() else ">\n" for line in text.splitlines()) or "> (nothing)\n"


def escaped(text: str) -> str:
    """Generated text as markdown shows it: its special characters escaped, `<|endoftext|>` a visible mark."""
    return " *(end of story)* ".join(re.sub(r"([\\`*_\[\]<>#|])", r"\\\1", part).strip()
                                     for part in text.split("<|endoftext|>"))


def stories(r: dict) -> dict:
    """dev/stories.py: one story from each model, the same prompt and seed, the window's end marked in it."""
    d = r["stories.json"]
    body = (f"Each model continued the prompt by {d['tokens']} tokens, with the same seed ({d['seed']}), "
            f"temperature {d['temperature']:g} and top-k {d['top_k']}. Where the text passes the model's window, "
            "a mark says so; from there on a rope model slides its cache, and a model with learned positions runs "
            "its whole window again for every token.\n\n")
    for x in d["rows"]:
        text = (escaped(d["prompt"] + x["before_window"]) + f" **[token {x['window']}: the window ends here]** "
                + escaped(x["past_window"]))
        quote = "".join(f"> {line.strip()}\n" if line.strip() else ">\n" for line in text.splitlines())
        body += (f"`{x['model']}` ({x['kind']} positions, {x['ms_per_token']:.1f} ms a token on the "
                 f"machine above):\n\n{quote}\n")
    return {"stories": head(("stories.json", d)) + body}


def lora(r: dict) -> dict:
    """finetune.py --json: the run (sizes, steps, losses) and the base beside the fine-tuned model on held-out
    prompts."""
    d = r["lora.json"]
    command = d.get("command") or f"python scripts/finetune.py --init-from {d['base']} --json results/lora.json"
    pct = lambda v: "–" if v is None else f"{v:.0%}"
    body = table(["run", f"`{d['run']}`"], [
        ["base", f"`{d['base']}`"],
        ["rank r, alpha", f"{d['rank']}, {d['alpha']:g} (on {d['layers']} linear layers)"],
        ["trainable weights", f"{d['trainable']:,} of {d['params']:,} ({d['trainable_share']:.2%})"],
        ["adapter file", f"{d['adapter_bytes'] / 1e6:.2f} MB ({d['adapter_weight_bytes'] / 1e6:.2f} MB of A and B, "
                         "the rest the optimizer's moments)"],
        ["base checkpoint", f"{d['checkpoint_bytes'] / 1e6:.1f} MB: the adapter is "
                            f"{d['adapter_share_of_checkpoint']:.1%} of it"],
        ["training", f"{d['steps']:,} steps of {d['batch_size']} examples, lr {d['lr']:g}, {d['minutes']:.1f} min"],
        ["examples", f"{d['train_examples']:,} for training, {d['val_examples']:,} held out"],
        ["training batch loss", "–" if d["train_loss_first"] is None
         else f"{d['train_loss_first']:.4f} at the first step, {d['train_loss_last']:.4f} at the last"],
        ["held-out story loss", f"{d['val_loss']:.4f}"],
    ], "ll")
    out = {"lora": head(("lora.json", {**d, "command": command})) + body}
    m = d.get("measure")
    if not m:
        out["lora"] += "\nNo measurement in the JSON (it was written with `--prompts 0`).\n"
        return out
    out["lora"] += (
        f"\nThe base and `{d['run']}` on the same {m['prompts']} held-out prompts ({m['dialogue_prompts']} ask for "
        f"Dialogue), each story at most {m['gen_tokens']} tokens, sampled with the same seeds (temperature "
        f"{m['temperature']:g}, top-k {m['top_k']}, seed {m['seed']} and up); the story loss over "
        f"{m['loss_examples']} held-out examples:\n\n" + table(
            ["model", "story loss", "requested words used", "Dialogue prompts quoted", "quotes when not asked",
             "tokens per story"],
            [[f"`{x['model']}`", f"{x['story_loss']:.4f}", pct(x["words_used"]), pct(x["dialogue_quoted"]),
              pct(x["quotes_unasked"]), f"{x['story_tokens']:.0f}"] for x in m["rows"]]))
    sample = m.get("sample") or {}
    if sample.get("prompt") and all(x["model"] in sample for x in m["rows"]):
        out["lora"] += ("\nThe first prompt and each model's story (as generated, cut at about 400 characters):\n\n"
                        f"```text\n{sample['prompt'].strip()}\n```\n\n" + "\n".join(
                            f"`{x['model']}`:\n\n{quoted(sample[x['model']])}" for x in m["rows"]))
    return out


# dev/recipes.py: the races, each a table
RECIPES = ("amd-epyc/recipes/slow-2min.json", "amd-epyc/recipes/warmup-4min.json", "amd-epyc/recipes/muon-wd.json",
           "amd-epyc/recipes/screen-1337.json", "amd-epyc/recipes/wd-10min.json",
           "amd-epyc/recipes/warmup-10min.json", "amd-epyc/recipes/warmup-10min-quiet.json",
           "amd-epyc/recipes/after-10min.json", "amd-epyc/recipes/after-10min-float32.json",
           "amd-epyc/recipes/after-vs-today-10min.json")


def recipes(r: dict) -> dict:
    """dev/recipes.py: each recipe's held-out loss against the first's, at equal time and at equal tokens,
    one table per screen (its budget, seeds and machine in its head)."""
    parts = []
    for name in RECIPES:
        if name not in r:
            continue
        d = r[name]
        budget = f"{d['minutes']:g} minutes each on its own clock" if d["minutes"] else f"{d['steps']:,} steps each"
        rows = []
        for recipe in d["recipes"]:
            runs = [d["runs"][str(s)][recipe] for s in d["seeds"]]
            vs = d["against_reference"].get(recipe)
            mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
            what = runs[0]["recipe"].get("what", "").replace("today's: ", "the default when raced: ")
            rows.append([f"`{recipe}`", what, f"{mean([x['steps'] for x in runs]):,.0f}",
                         f"{1e3 * mean([x['step_s'] for x in runs]):,.0f}",
                         " / ".join(f"{x['val_loss']:.4f}" for x in runs),
                         "–" if vs is None else " / ".join(f"{v:+.4f}" for v in vs["equal_time"]),
                         "–" if vs is None or not vs["equal_tokens"] else " / ".join(
                             f"{v:+.4f}" for v in vs["equal_tokens"])])
        spread = {k: v for k, v in d["seed_spread"].items() if v is not None}
        note = ("Seed spread (the largest minus the smallest held-out loss over seeds): "
                + ", ".join(f"`{k}` {v:.4f}" for k, v in spread.items()) + ".\n") if spread else \
            "One seed: no spread measured in this screen.\n"
        parts.append(head((name, d)) + f"{budget}, seeds {', '.join(map(str, d['seeds']))}, against "
                     f"`{d['reference']}`. Held-out loss on the whole held-out set at the end; the differences at "
                     "equal tokens are at the most tokens every seed of both evaluated on the way (8 batches).\n\n"
                     + table(["recipe", "what it changes", "steps", "ms a step", "held-out", "against the first, "
                              "equal time", "equal tokens"], rows, "llrrrrr") + "\n" + note)
    if not parts:
        return {"recipes": PLACEHOLDER.format(missing=" or ".join(RECIPES))}
    return {"recipes": "\n".join(parts)}


def llama_cpp(r: dict) -> dict:
    """export_check.py --gguf: llama.cpp's greedy story, tokenizer and perplexity beside ours on the same chunks."""
    d = r["llama_cpp.json"]
    command = d.get("command") or ("python scripts/export_check.py --gguf --ctx " + " ".join(map(str, d["contexts"]))
                                   + " --json results/llama_cpp.json")
    name = lambda x: f"`{Path(x['checkpoint']).parent.name}`"
    options = lambda o, plain: ", ".join(f"`{k}` {v:g}" if isinstance(v, float) else f"`{k}` {v}"
                                         for k, v in o.items() if v is not None and v != plain.get(k))
    body = f"llama.cpp: {d['llama_cpp']}. Each sweep cell reads {d['sweep_tokens']:,} held-out tokens.\n\n"
    body += table(["model", "llama.cpp architecture", "greedy story", "held-out text tokenized"], [
        [name(x), f"`{x['architecture']}`",
         f"{x['new_tokens']} tokens, " + ("the same" if x["match"] else f"differs at token {x['first_difference']}"),
         f"{x['held_out_tokens']:,} tokens, " + ("the same" if x["held_out_tokens_match"] else "different")]
        for x in d["models"]], "lll")
    for x in d["models"]:
        body += (f"\n{name(x)} (trained at {x['train_ctx']} tokens): mean loss on the same chunks, ours with the "
                 "exact GELU and with llama.cpp's, and llama.cpp's; max Δ: the largest difference between "
                 "llama.cpp's loss and ours on one token:\n\n")
        body += table(["n_ctx", "method", "mvGPT", "mvGPT, ggml GELU", "llama.cpp", "max Δ", "max Δ, ggml GELU"],
                      [[s["ctx"], s["method"], f"{s['loss_mvgpt']:.5f}", f"{s['loss_mvgpt_ggml_gelu']:.5f}",
                        f"{s['loss_llama_cpp']:.5f}", f"{s['max_token_loss_difference']:.1e}",
                        f"{s['max_token_loss_difference_ggml_gelu']:.1e}"] for s in x["sweep"]], "rl")
        plain = next((s["llama_cpp_options"] for s in x["sweep"] if s["method"] == "none"), {})
        given = [f"{s['method']} at {s['ctx']}: {o}" for s in x["sweep"]
                 if s["method"] != "none" and (o := options(s["llama_cpp_options"], plain))]
        if given:
            body += "\nllama.cpp's rope options, where they differ from plain RoPE's: " + "; ".join(given) + ".\n"
        if x["not_in_llama_cpp"]:
            body += f"\nNot in llama.cpp: {', '.join(x['not_in_llama_cpp'])}.\n"
    cells = [s for x in d["models"] for s in x["sweep"]]
    if cells:
        body += (f"\nOver these {len(cells)} cells, llama.cpp's GELU moves our mean loss by at most "
                 f"{max(abs(s['loss_mvgpt_ggml_gelu'] - s['loss_mvgpt']) for s in cells):.1e}; the largest "
                 f"difference on one token from llama.cpp is {max(s['max_token_loss_difference'] for s in cells):.1e}"
                 f" with our exact GELU and {max(s['max_token_loss_difference_ggml_gelu'] for s in cells):.1e} with "
                 "llama.cpp's.\n")
    perplexity = head(("llama_cpp.json", {**d, "command": command})) + (
        f"Perplexity over the same held-out chunks ({d['sweep_tokens']:,} tokens a cell, the second half of each "
        "chunk scored), with llama.cpp's own rope options for each method:\n\n") + table(
        ["model", "n_ctx", "method", "mvGPT", "llama.cpp"],
        [[name(x), s["ctx"], s["method"], f"{s['perplexity_mvgpt']:.3f}", f"{s['perplexity_llama_cpp']:.3f}"]
         for x in d["models"] for s in x["sweep"]], "lrl")
    return {"llama-cpp": head(("llama_cpp.json", {**d, "command": command})) + body,
            "llama-cpp-perplexity": perplexity}


def decode(r: dict) -> dict:
    """dev/decode_vs_llama.py: ms/token of our steps and llama.cpp's, side by side, each against its floor;
    a table per CPU kind, and our steps' time by part."""
    runs = [(n, r[n]) for n in DECODE if n in r]
    if not runs:
        return {"decode": PLACEHOLDER.format(missing=" or ".join(DECODE))}
    text = ""
    for name, d in runs:
        llama = f"llama.cpp through llama-cpp-python {d['llama_cpp']}" if d.get("llama_cpp") else "no llama.cpp"
        text += (head((name, d)) + f"Weights: {d['weights']}; {d['held']} tokens held, then one written per step "
                 f"(so each attends to {d['held'] + 1}), {d['rounds']} rounds of {d['steps']} steps per engine in "
                 f"turn, the median; {llama}. The floor: the bytes a step reads at "
                 f"{max(v for k, v in d['ceilings'].items() if k.startswith('read_bandwidth')) / 1e9:.1f} GB/s "
                 "(the re-run window's: its flops at the matrix-product peak of its dtype and threads). "
                 "× llama.cpp: against the faster of llama.cpp's two rows at the same bytes per weight.")
        text += f" Note: {d['note']}\n\n" if d.get("note") else "\n\n"
        rows = []
        for x in d["rows"]:
            how = x["step"] + (f" ({x['build_s']:.1f} s to build)" if (x.get("build_s") or 0) >= 0.05 else "")
            floor = x.get("floor_ms", x.get("compute_floor_ms"))
            rows.append([x["threads"], x["engine"], how, x["weights"] if x["step"] == "re-run window" else
                         f"{x['weights']}, KV {x['kv']}", f"{x['ms']:.2f}",
                         f"{x['cpu_ms']:.2f}" if "cpu_ms" in x else "–", f"{floor:.2f}", f"{x['over_floor']:.2f}×",
                         f"{x['over_llama_cpp']:.2f}×" if "over_llama_cpp" in x else "–"])
        text += table(["threads", "engine", "step", "weights", "ms/token", "CPU ms/token", "floor ms", "× floor",
                       "× llama.cpp"], rows, "rlll") + "\n"
        for threads, profiles in d["profiles"].items():
            parts = list(dict.fromkeys(p for prof in profiles.values() for p in prof))
            text += (f"Our steps' time by part, {threads} thread{'s' if threads != '1' else ''}, ms per token "
                     "(the profiler's self time of each part's operations; outside them: Python, dispatch and "
                     "the profiler's own, and for the C step the C call itself, which it cannot see inside):\n\n")
            cells = [[p, *(f"{prof[p]:.3f}" if p in prof else "–" for prof in profiles.values())] for p in parts]
            text += table(["part", *profiles], cells) + "\n"
    return {"decode": text}


def decode_parts(r: dict) -> dict:
    """dev/decode_parts.py: the C step, its call alone, and the call's parts against their floors."""
    runs = [(n, r[n]) for n in DECODE_PARTS if n in r]
    if not runs:
        return {"decode-parts": PLACEHOLDER.format(missing=" or ".join(DECODE_PARTS))}
    text = ""
    for name, d in runs:
        rows = []
        for x in d["rows"]:
            floor = sum(p["floor_ms"] for p in x["parts"])  # the bytes of all three parts
            rows += [[x["dtype"], "the whole step", f"{x['whole_ms']:.3f}", f"{floor:.3f}",
                      f"{x['whole_ms'] / floor:.2f}×"],
                     [x["dtype"], "around the call (Python: the angles, room in the cache, the arguments)",
                      f"{x['around_ms']:.3f}", "", ""],
                     [x["dtype"], "the C call", f"{x['call_ms']:.3f}", f"{floor:.3f}", f"{x['call_ms'] / floor:.2f}×"]]
            rows += [[x["dtype"], f"– {p['part']}", f"{p['ms']:.3f}", f"{p['floor_ms']:.3f}", f"{p['over_floor']:.2f}×"]
                     for p in x["parts"]]
            alone = x["products_alone"]
            rows.append([x["dtype"], f"for comparison: {alone['part']}", f"{alone['ms']:.3f}",
                         f"{alone['floor_ms']:.3f}", f"{alone['over_floor']:.2f}×"])
        text += (head((name, d)) + f"{d['threads']} threads, {d['held']} held; {d['rounds']} turns of {d['calls']} "
                 "steps each, each step timed after a read of other data larger than the caches; the medians. A "
                 f"part's floor: its bytes at {d['read_bandwidth'] / 1e9:.1f} GB/s, the memory's read bandwidth "
                 "measured in the same run; the step's, the three parts' bytes.\n\n"
                 + table(["weights", "what", "ms/token", "floor ms", "× floor"], rows, "ll") + "\n")
    return {"decode-parts": text}


def live_overhead(r: dict) -> dict:
    """dev/live_overhead.py: the live page's ms per token against context.py's step, per model."""
    runs = [(n, r[n]) for n in LIVE if n in r]
    if not runs:
        return {"live-overhead": PLACEHOLDER.format(missing=" or ".join(LIVE))}
    text = ""
    for name, d in runs:
        rows = [[x["model"], x["context_method"], f"{x['context_ms_per_step']:.2f}", f"{x['shown_ms_per_token']:.2f}",
                 f"{x['stream_ms_per_token']:.2f}", f"{x['overhead']:+.1%}", f"{x['stream_over_shown']:+.1%}",
                 f"{x['first_token_ms']:.0f}"] for x in d["rows"]]
        text += (head((name, d)) + f"Each model wrote {d['rows'][0]['tokens']} tokens past the window, "
                 f"{d['rows'][0]['repeats']} times, taking turns with context.py; the medians.\n\n"
                 + table(["model", "context.py's path", "its ms/step", "page shows, ms/token", "stream, ms/token",
                          "overhead", "the page's own share", "first token, ms"], rows, "ll") + "\n")
    return {"live-overhead": text}


def ours(r: dict, where: str) -> float | None:
    """Our figure for an episode one: "file:model:method:field" (a row), "file:@step:field" (an evaluation of a
    run), "file::field" (the file's own), or "A / B" and "A - B" of two of those. None if not measured."""
    for op, f in ((" / ", lambda a, b: a / b), (" - ", lambda a, b: a - b)):
        if op in where:
            a, b = (ours(r, w) for w in where.split(op))
            return None if a is None or b is None else f(a, b)
    name, *keys, field = where.split(":")
    d = r.get(name)
    if d is not None and keys[0].startswith("@"):
        d = next((e for e in d["evals"] if e["step"] == int(keys[0][1:])), None)
    elif d is not None and keys[0]:
        d = next((x for x in d["rows"] if [x["model"], x.get("method", "")] == (keys + [""])[:2]), None)
    return None if d is None else d[field]


def episode(r: dict) -> dict:
    """Every figure the video quotes beside ours, from the episode page's one run set (ONE_RUN_SET)."""
    e = r["episode.json"]
    specs = [(f, on_machine(f["ours"], ONE_RUN_SET)) for f in e["figures"]]
    def run(f: dict) -> str:  # which of our runs a row reads: the one typed, or the main job's two
        return ("as typed, `pretrain-rope-2`" if "ten-minutes/pretrain-rope" in f["ours"] else "as typed"
                if "ten-minutes/" in f["ours"] else "the main job's")

    rows = [[f["what"], f"{f['text']} ({f['at']})", *(["–", ""] if (v := ours(r, spec)) is None else
                                                     [f["format"].format(v), run(f)])] for f, spec in specs]
    used = ["episode.json", *(n for n in dict.fromkeys([*ONE_RUN_SET.values(), "context-gpu.json"])
                              if n in r and any(s.startswith(f"{n}:") or f" {n}:" in s for _, s in specs))]
    body = f"The episode: {e['hardware']}. Ours: the machine above; `–`: not measured here.\n\n"
    as_typed = {path: command for key, command in EPISODE_COMMANDS.items() if (path := EPISODE_RUNS.get(key))}
    return {"episode": head(*[(n, r[n]) for n in used[1:]], as_typed=as_typed,
                            first="`results/episode.json` (the video's figures, from its transcript)")
            + body + table(["figure", "episode (at)", "ours", "our run"], rows, "lrrl")}


def rope_speeds(_: dict, other_base: float = 100000.0) -> dict:
    """θ_i = base^(-2i/d), the speed of pair i, and the tokens it takes to turn once, for ours and nanochat's base."""
    config = GPTConfig()
    d = config.head_size
    speed = lambda base, i: base ** (-2 * i / d)
    rows = [[i, f"{i}, {i + d // 2}", f"{speed(config.rope_theta, i):.3g}",
             f"{2 * math.pi / speed(config.rope_theta, i):,.1f}", f"{2 * math.pi / speed(other_base, i):,.1f}"]
            for i in sorted({0, 1, 2, 4, 8, 16, d // 2 - 1})]
    return {"rope-speeds": f"Computed from `GPTConfig()` (base {config.rope_theta:,.0f}, head size {d}), by "
            "`python dev/report.py`.\n\n" + table(["pair i", "channels", "speed θᵢ, rad/token", "tokens per turn",
                                                   f"tokens per turn, base {other_base:,.0f}"], rows, "lrrrr")}


def weights(_: dict) -> dict:
    """The saved weight names and shapes of both kinds, blocks folded into one line per name."""
    import torch

    with torch.device("meta"):
        kinds = {rope: GPT(GPTConfig(rope=rope)) for rope in (False, True)}
    names: dict[str, tuple] = {}
    for rope, model in kinds.items():
        for name, tensor in model.state_dict().items():
            names.setdefault(re.sub(r"^blocks\.\d+\.", "blocks.N.", name), (tuple(tensor.shape), set()))[1].add(rope)
    rows = [[f"`{n}`", " × ".join(map(str, shape)), "both" if len(k) == 2 else ("rope" if True in k else "learned")]
            for n, (shape, k) in names.items()]
    learned, rope = kinds[False].num_params(), kinds[True].num_params()
    return {"weights": "Computed from `GPT(GPTConfig())` and `GPT(GPTConfig(rope=True))`, by `python dev/report.py`."
            "\n\n" + table(["name", "shape", "in"], rows, "lrl") +
            f"\n`N` runs from 0 to {kinds[False].config.n_layer - 1}. `lm_head.weight` is the same tensor as "
            f"`wte.weight` (tied) and counts once: {learned:,} parameters with learned positions, {rope:,} with "
            f"rope, {learned - rope:,} fewer.\n"}


def rotation(_: dict) -> dict:
    """A pair of channels as an arrow turned by m·θ_i at positions m = 0..5: a fast, a slower and the slowest pair."""

    def draw(plt):
        config = GPTConfig()
        d = config.head_size
        plt.rcParams.update({"font.size": 11})
        fig, axes = plt.subplots(1, 3, figsize=(8, 3.1))
        for ax, i in zip(axes, (0, 8, d // 2 - 1), strict=True):
            theta = config.rope_theta ** (-2 * i / d)
            for m in range(6):
                a = 0.3 + m * theta
                ax.annotate("", xy=(math.cos(a), math.sin(a)), xytext=(0, 0),
                            arrowprops={"arrowstyle": "->", "color": f"C{m}", "lw": 1.5})
                if theta > 0.5:
                    ax.text(1.2 * math.cos(a), 1.2 * math.sin(a), str(m), color=f"C{m}", ha="center", va="center")
            if theta < 0.5:
                ax.text(0, -0.9, "0…5 " + ("close together" if theta > 0.01 else "on top of each other"),
                        ha="center", fontsize=10)
            ax.set(xlim=(-1.35, 1.35), ylim=(-1.35, 1.35), aspect="equal", xticks=[], yticks=[],
                   title=f"pair {i}\nθ = {theta:.3g} rad/token")
        fig.suptitle("Positions m = 0…5 (numbered) turn a pair by m·θ", fontsize=11)
        fig.tight_layout()
        return fig

    return {"rope-rotation.png": draw}


# ----------------------------------------------------------------------------------------------
# The README's blocks: each of the episode's commands with the lines it printed in a committed run, what
# to expect beside the video, the main job's results. Made from results/ like every table, so they cannot
# go stale; tests/test_report.py checks that the printed lines are the ones the scripts print.

README_BLOCK = re.compile(r"<!-- report\.py: (?!end )([\w-]+) -->\n.*?<!-- report\.py: end -->", re.S)
README_BLOCK_NAME = re.compile(r"<!-- report\.py: (?!end )([\w-]+) -->")
EPISODE_COMMANDS = {  # as the README gives them; the video types `python pretrain.py --rope` (scripts/ here)
    "pretrain": "python scripts/pretrain.py --rope",
    "evaluate": "python scripts/evaluate.py checkpoints/* --dtype auto",
    "context": "python scripts/context.py checkpoints/* --device cpu",
}
# The main job as typed (its plan against its time, main-job.json, and its runs), and what the episode's commands
# printed typed one after another after it (each with --json added): on one machine
MAIN_JOB = "amd-epyc/main-job-default/"
EPISODE_RUNS = {"pretrain": "amd-epyc/episode/pretrain-rope.json", "evaluate": "amd-epyc/episode/evaluate.json",
                "context": "amd-epyc/episode/context.json"}
# The episode's page reads one run set, on one machine: the main job as typed (MAIN_JOB) and the episode's commands
# typed after it (EPISODE_RUNS). Each JSON an episode figure names (results/episode.json), mapped to that set's own;
# the learned model's ten minutes as typed (`python scripts/pretrain.py`, into checkpoints/pretrain-2) were run after
# the rope's, and taken out of checkpoints/ before evaluate.py and context.py, which read the flow the page types
ONE_RUN_SET = {"pretrain.json": MAIN_JOB + "pretrain.json", "pretrain-rope.json": MAIN_JOB + "pretrain-rope.json",
               "ten-minutes/pretrain.json": "amd-epyc/episode/pretrain.json",
               "ten-minutes/pretrain-rope.json": EPISODE_RUNS["pretrain"],
               "evaluate.json": EPISODE_RUNS["evaluate"], "context.json": EPISODE_RUNS["context"]}
INTRO = {  # the video's headline (0:19), by the names episode.json gives its figures: the intro table's label of each
    "CPU ms/token: learned, sliding window": "learned positions: the window run again, ms a token",
    "CPU ms/token: rope, sliding cache": "rotary embeddings: the sliding cache, ms a token",
    "CPU: learned window ÷ rope's sliding cache": "the learned window's time ÷ the rope cache's",
}


def load_all(results: Path) -> dict:
    """Every JSON under results/, by its path there ('ten-minutes/pretrain-rope.json')."""
    return {p.relative_to(results).as_posix(): json.loads(p.read_text(encoding="utf-8"))
            for p in sorted(results.rglob("*.json"))}


def where(d: dict) -> str:
    """The machine a JSON was measured on, short: 'a 2-core Intel Xeon (AVX512)'."""
    cores = re.search(r"of (\d+) cores", d["machine"])
    return f"a {cores.group(1)}-core {cpu(d['machine'])}" if cores else f"an {cpu(d['machine'])}"


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} minutes" if seconds >= 90 else f"{seconds:.0f} seconds"


def pretrain_printed(d: dict, out_dir: str | None = None) -> str:
    """pretrain.py's last line, as scripts/pretrain.py prints it at the end of a run."""
    out_dir = out_dir or d["args"].get("out_dir") or f"checkpoints/{d['run']}"
    return (f"{d['run']}: {d['steps']} steps, {d['tokens']:,} tokens, {d['tokens_per_s']:,.0f} tokens/s "
            f"({d['dtype']}), held-out loss {d['val_loss']:.4f}, {d['params']:,} parameters, "
            f"{d['minutes']:.1f} min -> {out_dir}")


def evaluate_printed(d: dict, models: list[str] | None = None) -> str:
    """evaluate.py's table, as it prints it (the rows of `models`, all by default)."""
    evaluate = script("evaluate")  # scripts/evaluate.py: the table is made by the function that prints it

    return evaluate.table([x for x in d["rows"] if models is None or x["model"] in models])


def context_printed(d: dict, models: tuple[str, ...] | None = None) -> str:
    """context.py's table, as it prints it; with `models`, their rows and notes alone, and a line saying so."""
    context = script("context")

    rows, notes = d["rows"], d.get("notes", [])
    if models:
        rows = [x for x in rows if x["model"] in models]
        notes = [n for n in notes if n.split(":")[0] in models]
    more = len({x["model"] for x in d["rows"]} - {x["model"] for x in rows})
    cut = [f"(rows of {more} more model{'s' if more > 1 else ''} cut here)"] if more else []
    return "\n".join([context.table(context.title(d["streams"], d["length"]), rows, notes), *cut,
                      f"measured on {d['machine']}"])


def context_seconds(d: dict) -> float:
    """The time context.py spent measuring: its own seconds where it recorded them, else each method's ms per
    token times the tokens it scored."""
    if "seconds" in d:
        return d["seconds"]
    return sum(x["ms_per_token"] * (d["length"] - x["window"]) * d["streams"] for x in d["rows"]) / 1000


def readme_pretrain(r: dict) -> str:
    name = EPISODE_RUNS["pretrain"]
    d = r[name]
    return (f"```bash\n{EPISODE_COMMANDS['pretrain']}\n```\n\n"
            f"After the main job, `checkpoints/pretrain-rope` holds its run, so this one goes to "
            f"`{d['args']['out_dir']}`, and its first line says so. It trains for ten minutes by the clock, then "
            f"prints (`results/{name}`, on {where(d)}):\n\n"
            f"```text\n{pretrain_printed(d)}\n```\n\n"
            f"Its tokens/s is the median step's; over the whole run, with evaluations and compiling, it is "
            f"{d['tokens'] / d['seconds']:,.0f}.")


def pretrain_typed(r: dict) -> dict:
    """The episode's `pretrain.py --rope` as typed after a main job: the line it printed, for the docs."""
    name = EPISODE_RUNS["pretrain"]
    d = r[name]
    return {"pretrain-typed": head((name, {**d, "command": EPISODE_COMMANDS["pretrain"] + f" --json results/{name}"}))
            + f"```text\n{pretrain_printed(d)}\n```\n\n" + typed_range(r)}


def typed_head(name: str, d: dict, command: str) -> str:
    """head() for a JSON that one of the episode's commands wrote, the command as a learner types it (its glob
    unquoted), --json added."""
    return head((name, {**d, "command": None}), as_typed={name: command})


def episode_intro(r: dict) -> dict:
    """The video's headline past the window, ratio against ratio, beside context.py's as typed after the main job."""
    name = EPISODE_RUNS["context"]
    figures = {f["what"]: f for f in r["episode.json"]["figures"]}
    rows = []
    for what, label in INTRO.items():
        f = figures[what]
        v = ours(r, on_machine(f["ours"], ONE_RUN_SET))
        said = f["text"] + (" (derived)" if f["at"] == "derived" else "")  # worked out from its figures, not said
        rows.append([label, said, "–" if v is None else f["format"].format(v)])
    return {"episode-intro": typed_head(name, r[name], EPISODE_COMMANDS["context"])
            + "Ours: `pretrain`'s sliding window and `pretrain-rope`'s sliding cache, the main job's two models.\n\n"
            + table(["past the window, on a CPU", "the video (0:19)", "ours"], rows, "lrr")}


def episode_training(r: dict) -> dict:
    """The main job's two runs as typed, side by side, and their loss against step: the episode's 10:16."""
    runs = {MAIN_JOB + n: r[MAIN_JOB + n] for n in RUNS}
    rows = [[RUNS[Path(n).name], f"{d['steps']:,}", f"{d['tokens_per_s']:,.0f}", f"{d['val_loss']:.4f}"]
            for n, d in runs.items()]
    steps = " and ".join(dict.fromkeys(f"{d['steps']:,}" for d in runs.values()))
    warmup = " and ".join(dict.fromkeys(f"{d['args']['warmup']:,}" for d in runs.values()))
    return {"episode-training": head(*runs.items()) + f"{steps} steps each, as the main job picked them from this "
            f"machine's speed, {warmup} of them to warm up. The held-out loss is `pretrain.py`'s "
            "own estimate at the last step, on its fixed held-out batches.\n\n"
            + table(["run", "steps", "tokens/s, median step", "held-out loss"], rows),
            "episode-loss.png": loss_figure(runs)}


def episode_evaluate(r: dict) -> dict:
    """`evaluate.py checkpoints/*` as typed after the main job: every model there, and how long it took."""
    name = EPISODE_RUNS["evaluate"]
    d = r[name]
    took = f"\nIt took {minutes(d['seconds'])} for all {len(d['rows'])} models.\n" if d.get("seconds") else ""
    return {"episode-evaluate": typed_head(name, d, EPISODE_COMMANDS["evaluate"]) + evaluate_table(d) + took}


def episode_context(r: dict) -> dict:
    """`context.py checkpoints/*` as typed after the main job: every model and method, the speed ratios, how long it
    took, and the figure of the main job's two models."""
    name = EPISODE_RUNS["context"]
    d = r[name]
    body, draw = context_table(d, README_CONTEXT_MODELS)
    notes = "".join(f"- {note}\n" for note in d.get("notes", []))
    return {"episode-context": typed_head(name, d, EPISODE_COMMANDS["context"]) + body
            + (f"\nIts notes:\n\n{notes}" if notes else "") + f"\nIt took {minutes(context_seconds(d))} in all.\n",
            "episode-context-loss.png": draw}


def readme_evaluate(r: dict) -> str:
    name = EPISODE_RUNS["evaluate"]
    d = r[name]
    more = len(d["rows"]) - sum(x["model"] in README_EVALUATE_MODELS for x in d["rows"])
    cut = f"(rows of {more} more model{'s' if more > 1 else ''} cut here)\n" if more else ""
    return (f"```bash\n{EPISODE_COMMANDS['evaluate']}\n```\n\n"
            f"It reads every held-out story with each model in `checkpoints/`. For the main job's two "
            f"({r[MAIN_JOB + 'pretrain-rope.json']['steps']:,} steps each) and the run above, it printed "
            f"(`results/{name}`):\n\n```text\n{evaluate_printed(d, README_EVALUATE_MODELS)}\n{cut}```"
            f"\n\nIt took {minutes(d['seconds'])} for all {len(d['rows'])} models. The last column is what bf16's "
            f"products cost in loss, against float32.")


README_EVALUATE_MODELS = ("pretrain", "pretrain-rope", "pretrain-rope-2")  # the rows the README shows


def readme_context(r: dict) -> str:
    name = EPISODE_RUNS["context"]
    d = r[name]
    return (f"```bash\n{EPISODE_COMMANDS['context']}\n```\n\n"
            f"It printed, for the main job's two models (`results/{name}`):\n\n"
            f"```text\n{context_printed(d, README_CONTEXT_MODELS)}\n```\n\n"
            f"It took {minutes(context_seconds(d))} in all.")


README_CONTEXT_MODELS = ("pretrain", "pretrain-rope")  # the rows the README shows: the episode's two models


# The machines the README's figures come from: the committed main job's (results/) and this CPU kind's
# episode commands as typed (EPISODE_RUNS), each JSON an episode figure names mapped to that machine's own
EXPECT_MACHINES = {
    "Intel Xeon (AVX512)": {},
    "AMD EPYC (AVX512)": {"ten-minutes/pretrain-rope.json": EPISODE_RUNS["pretrain"],
                              "evaluate.json": EPISODE_RUNS["evaluate"], "context.json": EPISODE_RUNS["context"]},
}


def on_machine(spec: str, files: dict[str, str]) -> str:
    """An episode figure's `ours` with each JSON it names swapped for a machine's own."""
    for name, theirs in files.items():
        spec = re.sub(rf"(^| ){re.escape(name)}:", rf"\g<1>{theirs}:", spec)
    return spec


# Every ten-minute rope run as typed (bf16, today's recipe) that we committed: the range a learner's run may land in
TYPED_RUNS = ("ten-minutes/pretrain-rope.json", "amd-epyc/ten-minutes/pretrain-rope-as-typed-earlier.json",
              EPISODE_RUNS["pretrain"])


def typed_range(r: dict) -> str:
    """One paragraph: the held-out loss of each committed ten-minute rope run as typed, with its machine and
    speed, slowest first; the spread is the tokens seen, so the speed of the host on the day."""
    names = sorted((name for name in TYPED_RUNS if name in r), key=lambda name: r[name]["tokens_per_s"])
    runs = [r[name] for name in names]  # slowest first, the files in the same order
    kinds: dict[str, list[float]] = {}
    for d in runs:
        kinds.setdefault(cpu(d["machine"]).split(" (")[0], []).append(d["tokens_per_s"])
    spread = max(max(v) / min(v) for v in kinds.values())
    said = "; ".join(f"{d['val_loss']:.2f} at {d['tokens_per_s']:,.0f} tokens/s ({d['steps']:,} steps, "
                     f"{cpu(d['machine']).split(' (')[0]})" for d in runs)
    return (f"Ten minutes as typed, the rope run's held-out loss has been, over the {len(runs)} runs we committed "
            f"({', '.join(f'`results/{n}`' for n in names)}, each made by `python scripts/pretrain.py --rope` with its "
            f"`--json`): {said}. The loss follows the tokens a run sees, and "
            "those follow the machine's speed that day: the hosts are shared, and one kind of machine ran at "
            f"up to {spread:.1f} times the speed of another of its kind.\n")


def typed_span(r: dict) -> str:
    """typed_range in one sentence, for the README."""
    runs = sorted((r[name] for name in TYPED_RUNS if name in r), key=lambda d: d["val_loss"])
    speeds = sorted(d["tokens_per_s"] for d in runs)
    return (f"Over the {len(runs)} such runs we committed, the loss ran from {runs[0]['val_loss']:.2f} to "
            f"{runs[-1]['val_loss']:.2f}, as the host's speed that day ran from {speeds[0]:,.0f} to "
            f"{speeds[-1]:,.0f} tokens/s ([each run](docs/rope.md#the-run)).\n")


def readme_expect(r: dict) -> str:
    e, data = r["episode.json"], r["data.json"]
    figures = [f for f in e["figures"] if f.get("readme")]
    rows = []
    for f in figures:
        values = [ours(r, on_machine(f["ours"], files)) for files in EXPECT_MACHINES.values()]
        rows.append([f["what"], f"{f['text']} ({f['at']})",
                     *("–" if v is None else f["format"].format(v) for v in values)])
    main_run = r["pretrain-rope.json"]
    typed_rows = sum("ten-minutes/" in f["ours"] for f in figures)  # the episode's pretrain.py --rope, as typed
    first = f"{typed_rows} rows are" if typed_rows > 1 else "row is"
    main_steps = [main_run["steps"], r[MAIN_JOB + "pretrain-rope.json"]["steps"]]  # the Intel's, the AMD's
    tokens_seen = " and ".join(f"{ours(r, on_machine('ten-minutes/pretrain-rope.json::tokens', files)) / 1e6:.1f}M "
                               f"({machine.split(' (')[0]})" for machine, files in EXPECT_MACHINES.items())
    video_tokens = next(f["value"] for f in e["figures"] if f["ours"] == "ten-minutes/pretrain-rope.json::tokens")
    return ("On the two 2-core CPUs we measured, both training in bf16 (the Intel's figures from "
            "`results/ten-minutes/`, `results/evaluate.json` and `results/context.json`; the AMD's from the "
            "blocks above):\n\n"
            + table(["figure", "the video (at)", *EXPECT_MACHINES], rows, "lr" + "r" * len(EXPECT_MACHINES))
            + f"\nThe first {first} `pretrain.py --rope` as typed; the rest, the main job's rope model "
            f"(`--max-steps {main_steps[0]}` on the Intel; {main_steps[1]:,} steps, as the job chose, on the AMD).\n"
            + "\n" + typed_span(r)
            + f"\nWhy they differ, one line each:\n\n"
            f"- **The training.** The video's own figures put its rope run at up to {video_tokens / 1e6:.1f}M "
            f"tokens; ours saw {tokens_seen}.\n"
            f"- **The data.** Our runs read {data['train']['tokens'] / 1e6:.1f}M training tokens "
            f"({data['train']['stories']:,} stories), a small part of TinyStories.\n"
            f"- **The tokenizer.** Ours has {data['vocab_size']:,} tokens; the video's differs, so a loss per "
            f"token compares only roughly. Bits per byte does not depend on it.\n"
            f"- **Milliseconds** belong to a machine. Compare the ratios, each measured side by side in one run.\n"
            f"- **To get closer**, train longer (`--max-steps`) on more of TinyStories (online, the main job reads "
            f"300 MB), on a GPU if you have one.\n")


def readme_results(r: dict) -> str:
    runs = [(RUNS[n], r[n]) for n in RUNS]
    held_out = {x["model"]: x for x in r["evaluate.json"]["rows"]}
    rows = [[name, f"{d['steps']:,}", f"{d['tokens']:,}", f"{d['seconds'] / 60:.1f}", f"{d['tokens_per_s']:,.0f}",
             f"{d['tokens'] / d['seconds']:,.0f}", f"{held_out[d['run']]['loss']:.4f}",
             f"{held_out[d['run']]['perplexity']:.1f}"] for name, d in runs]
    d = runs[0][1]
    return (f"The main job's two runs with `--max-steps {d['steps']}`, from the same seed and batches, on {where(d)}. "
            f"From `results/pretrain*.json` and `results/evaluate.json`:\n\n"
            + table(["run", "steps", "tokens", "minutes", "tokens/s, median step", "tokens / wall time",
                     "held-out loss (evaluate.py)", "perplexity"], rows))




def readme_main(r: dict) -> str:
    """How long the main job took against its plan, by default, and its pretraining with --max-steps 1000,
    on each machine it was run on."""
    said = []
    if f"{MAIN_JOB}main-job.json" in r:
        job = r[f"{MAIN_JOB}main-job.json"]
        said.append(f"As typed (offline, with `--source DIR`), on {where(job)}, it chose {job['steps']:,} steps a "
                    f"model, planned {job['planned_s'] / 60:.0f} minutes and took {job['took_s'] / 60:.0f} "
                    f"(`results/{MAIN_JOB}main-job.json`).")
    spans = []  # the two runs with --max-steps 1000, on each machine that ran them: their minutes
    for folder in ("", "amd-epyc/main-job/"):
        if f"{folder}pretrain.json" in r:
            learned, rope = r[f"{folder}pretrain.json"], r[f"{folder}pretrain-rope.json"]
            low, high = (f"{s / 60:.0f}" for s in sorted((learned["seconds"], rope["seconds"])))
            unit = "" if spans else " minutes"
            spans.append(f"{low if low == high else f'{low} to {high}'}{unit} on the "
                         f"{cpu(learned['machine']).split(' (')[0]}")
    said.append("With `--max-steps 1000` (the runs under Results), a model trained for " + " and ".join(spans) + ".")
    return " ".join(said)


README_BLOCKS: dict[str, Callable[[dict], str]] = {
    "main": readme_main, "pretrain": readme_pretrain, "evaluate": readme_evaluate, "context": readme_context,
    "expect": readme_expect, "results": readme_results,
}


PLAN_CHECKS = ("amd-epyc/plan-check/main-job.json",)  # the jobs that recorded the estimate of the rest


def plan_check(r: dict) -> dict:
    """The main job's plan against its stages, in each job that recorded the estimate of the rest after each:
    what each stage took of its estimate, and the "left" line against what the rest then took."""
    out = ""
    for name in (n for n in PLAN_CHECKS if n in r):
        d, rows = r[name], []
        for i, stage in enumerate(d["stages"]):
            rest = sum(t["took_s"] for t in d["stages"][i + 1:])
            said = stage.get("left_s")
            rows.append([stage["stage"], f"{stage['planned_s'] / 60:.1f}", f"{stage['took_s'] / 60:.1f}",
                         f"{stage['took_s'] / stage['planned_s']:.2f}" if stage["planned_s"] else "–",
                         "–" if said is None else f"{said / 60:.1f}", f"{rest / 60:.1f}",
                         f"{said / rest - 1:+.0%}" if said is not None and rest >= 60 else "–"])
        out += (head((name, d)) + f"{d['steps']:,} steps a model; planned {d['planned_s'] / 60:.1f} min, took "
                f"{d['took_s'] / 60:.1f}. Minutes; `–` where the rest was under a minute.\n\n"
                + table(["stage", "planned", "took", "took ÷ planned", "\"left\" said after it", "the rest took",
                         "off by"], rows, "lrrrrrr") + "\n")
    return {"plan-check": out or PLACEHOLDER.format(missing=", ".join(PLAN_CHECKS))}


OUTPUTS: list[tuple[tuple[str, ...], tuple[str, ...], Callable[[dict], dict], tuple[str, ...]]] = [
    ((), PLAN_CHECKS, plan_check, ("plan-check",)),
    # (JSON needed, JSON used if present, writer, what it writes)
    (tuple(RUNS), (), training, ("training", "training-loss.png")),
    (("evaluate.json",), (), evaluate, ("evaluate",)),
    (("precision.json",), ("precision-again.json",), precision, ("precision",)),
    ((PARITY[0],), tuple(PARITY[1:]), precision_runs, ("precision-runs",)),
    (("warmup100/precision-peak.json",), (), precision_peak, ("precision-peak", "precision-peak.png")),
    (("warmup.json",), (), warmup, ("warmup",)),
    ((SCHEDULE[0],), tuple(SCHEDULE[1:]), schedule, ("schedule",)),
    (("attention.json",), (), attention, ("attention",)),
    *[((name,), (), linear_products(name, output), (output,)) for name, output in LINEAR_PRODUCTS.items()],
    (("context.json",), (), context, ("context", "context-loss.png")),
    (("data.json",), (), data, ("data",)),
    (("sweep.json",), (), sweep, ("sweep", "memory", "sweep.png")),
    (("sinks.json",), (), streams("sinks", "{streams} streams of {length} held-out tokens through a cache that "
                                  "slides, keeping {sinks} attention sinks or none; loss past the first window."),
     ("sinks",)),
    (("dynamic.json",), (), streams("dynamic", "{streams} streams of {length} held-out tokens read one at a time "
                                    "into a cache that never slides; loss past the first window."), ("dynamic",)),
    (tuple(TEN_MINUTES)[:2], tuple(TEN_MINUTES)[2:], ten_minutes, ("ten-minutes",)),
    ((FINETUNE,), (), finetune, ("finetune",)),
    (("lora.json",), (), lora, ("lora",)),
    (("stories.json",), (), stories, ("stories",)),
    (("llama_cpp.json",), (), llama_cpp, ("llama-cpp", "llama-cpp-perplexity")),
    ((), RECIPES, recipes, ("recipes",)),
    (("bench.json",), (), bench, ("bench", "bench-profiles", "bench-parts", "bench.png")),
    (("bench.json",), OTHER_BENCHES, bench_machines, ("bench-machines",)),
    ((), DECODE, decode, ("decode",)),
    ((), LIVE, live_overhead, ("live-overhead",)),
    ((), DECODE_PARTS, decode_parts, ("decode-parts",)),
    ((EPISODE_RUNS["pretrain"],), TYPED_RUNS[:2], pretrain_typed, ("pretrain-typed",)),
    (("episode.json", EPISODE_RUNS["context"]), (), episode_intro, ("episode-intro",)),
    (tuple(MAIN_JOB + n for n in RUNS), (), episode_training, ("episode-training", "episode-loss.png")),
    ((EPISODE_RUNS["evaluate"],), (), episode_evaluate, ("episode-evaluate",)),
    ((EPISODE_RUNS["context"],), (), episode_context, ("episode-context", "episode-context-loss.png")),
    (("episode.json",), (*dict.fromkeys(ONE_RUN_SET.values()), "context-gpu.json"), episode, ("episode",)),
    ((), (), rope_speeds, ("rope-speeds",)),
    ((), (), weights, ("weights",)),
    ((), (), rotation, ("rope-rotation.png",)),
]


def build(results: Path) -> tuple[dict[str, str], dict[str, Draw | None]]:
    """Every table ({name: markdown}) and figure ({name.png: draw, or None for a placeholder})."""
    tables, figures = {}, {}
    for needed, optional, write, names in OUTPUTS:
        r = {n: json.loads((results / n).read_text(encoding="utf-8")) for n in needed + optional
             if (results / n).exists()}
        missing = [n for n in needed if n not in r]
        out = write(r) if not missing else {n: PLACEHOLDER.format(missing=", ".join(missing)) for n in names}
        for name in names:
            if name.endswith(".png"):
                figures[name] = None if missing else out[name]
            else:
                tables[name] = out.get(name, PLACEHOLDER.format(missing="its rows"))
    return tables, figures


def readme_block(text: str, results: Path) -> str:
    """The README with each of its named blocks (`<!-- report.py: NAME -->` ... end) made again from results/."""
    r = load_all(results)

    def fill(m: re.Match) -> str:
        name = m.group(1)
        try:
            block = README_BLOCKS[name](r).strip()
        except KeyError as e:  # a JSON the block reads is missing (a fresh clone, a tiny run)
            block = f"Not measured yet (`results/{e.args[0]}`): run the main job, then `python dev/report.py`."
        return f"{README_START.format(name)}\n{block}\n{README_END}"

    return README_BLOCK.sub(fill, text)


def save_figure(path: Path, draw: Draw | None) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    if draw is None:
        fig, ax = plt.subplots(figsize=(8, 1.2))
        ax.axis("off")
        ax.text(0.5, 0.5, "Not measured yet: run the main job, then python dev/report.py", ha="center", va="center")
    else:
        fig = draw(plt)
    fig.savefig(path, dpi=150, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results-dir", default=str(ROOT / "results"), help="the scripts' JSON (committed)")
    p.add_argument("--docs-dir", default=str(ROOT / "docs"), help="writes DOCS/results/*.md and DOCS/figures/*.png")
    p.add_argument("--readme", default=str(ROOT / "README.md"), help="fill this file's Results block ('': none)")
    p.add_argument("--no-figures", action="store_true", help="tables only (seconds, no matplotlib needed)")
    p.add_argument("--check", action="store_true", help="compare with the files, write nothing; exit 1 if any differ")
    args = p.parse_args(argv)
    results, docs = Path(args.results_dir), Path(args.docs_dir)
    if not results.is_dir():
        print(f"error: {results} is not a folder of results: pass --results-dir", file=sys.stderr)
        return 2
    tables, figures = build(results)
    files = {docs / "results" / f"{name}.md": text for name, text in tables.items()}
    if args.readme:
        readme = Path(args.readme)
        text = readme.read_text(encoding="utf-8")
        unknown = sorted(set(README_BLOCK_NAME.findall(text)) - set(README_BLOCKS))
        if not README_BLOCK.search(text) or unknown:
            what = f"names no block report.py makes ({', '.join(unknown)})" if unknown else "has no report.py block"
            print(f"error: {readme} {what}: mark a block `{README_START.format('NAME')}` ... `{README_END}` with NAME "
                  f"one of {', '.join(README_BLOCKS)}, or pass --readme ''", file=sys.stderr)
            return 2
        files[readme] = readme_block(text, results)
    if args.check:
        stale = [str(path) for path, text in files.items()
                 if not path.exists() or path.read_text(encoding="utf-8") != text]
        for path in stale:
            print(f"differs from what dev/report.py makes of {results}: {path}")
        return 1 if stale else 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    if not args.no_figures:
        (docs / "figures").mkdir(parents=True, exist_ok=True)
        for name, draw in figures.items():
            save_figure(docs / "figures" / name, draw)
            print(f"wrote {docs / 'figures' / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
