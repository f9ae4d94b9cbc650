"""The docs' tables and figures, made from the runs' logs and the scripts' JSON, never typed by hand.

Reads, each one optional (a missing input skips its outputs with a note, and a placeholder is
written where the docs would otherwise lack a file):
    checkpoints/<run>/log.jsonl   pretrain.py's log, for --runs (pretrain and pretrain-rope)
    results/evaluate.json         evaluate.py --json: held-out loss, perplexity, top-1 accuracy
    results/context.json          context.py --json: loss and ms/token past the window
    results/sweep.json            context.py --ctx ... --json: loss per context and scaling, memory
    results/sinks.json            context.py --sinks K --json: attention sinks, shifted or not
    results/dynamic.json          context.py --dynamic --json: dynamic NTK's cache against recomputing
    checkpoints/<finetune>/log.jsonl   the long-context fine-tune
    data/meta.json                prepare.py: stories, characters and tokens of each split
Writes markdown tables into docs/results/ (each headed by the command that made it and the machine
the numbers come from) and PNG figures into docs/figures/. The pages include the tables with
`--8<-- "docs/results/NAME.md"`. Three outputs come from the model's code alone and are always
made: the speeds of the rotary pairs, the weight names, and the rotation figure.

Examples:
    python scripts/report.py                            # after the main job: everything it can
    python scripts/report.py --smooth 64                # a smoother loss-against-position figure
    python scripts/report.py --results-dir /tmp/mvgpt/results --checkpoints-dir /tmp/mvgpt/checkpoints \\
        --data-dir /tmp/mvgpt/data --docs-dir /tmp/docs  # a run made elsewhere, into a scratch site
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mvgpt.model import GPT, GPTConfig  # noqa: E402

RUNS = ("pretrain", "pretrain-rope")
METHODS = ("sliding window", "sliding cache", "full context")  # context.json's order of methods
PLACEHOLDER = (
    '!!! note "Not measured yet"\n'
    "    Run `python scripts/report.py` after the main job (`python scripts/main.py`) to fill this in.\n"
)


# ----------------------------------------------------------------------------------------------
# Reading the inputs


def read_json(path: Path, notes: list[str]):
    """The parsed file, or None with a note (missing or unreadable)."""
    if not path.exists():
        notes.append(f"no {path}")
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        notes.append(f"{path} is not valid JSON ({e})")
        return None


def read_log(path: Path) -> list[dict]:
    """pretrain.py's log: one record per step, in step order.

    Lines of the same step are merged (later fields win): a run that stops between evaluations
    logs a last line {step, val_loss, elapsed} for the step it has already logged.
    """
    by_step: dict[int, dict] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            by_step.setdefault(record["step"], {}).update(record)
    return [by_step[s] for s in sorted(by_step)]


def tokens_per_step(records: list[dict]) -> int | None:
    """Tokens in one optimizer step, read back from the log.

    Each record has tokens_per_s = tokens / dt, and `elapsed` grows by dt from one step to the
    next, except after a step that also evaluated (its evaluation time comes in between). So
    tokens_per_s times the growth of `elapsed` gives the tokens of a step; the median of those is
    exact to rounding. (A record with a "tokens" field would be read directly.)
    """
    if any("tokens" in r for r in records):
        return None  # run_tokens() reads them directly
    estimates = [
        cur["tokens_per_s"] * (cur["elapsed"] - prev["elapsed"])
        for prev, cur in zip(records, records[1:], strict=False)
        if cur["step"] == prev["step"] + 1 and "val_loss" not in prev and "tokens_per_s" in cur
    ]
    return round(statistics.median(estimates)) if estimates else None


def summarize_run(name: str, records: list[dict]) -> dict:
    per_step = tokens_per_step(records)
    last = records[-1]
    if "tokens" in last:
        tokens = last["tokens"]
    else:
        tokens = per_step * last["step"] if per_step else None
    speeds = [r["tokens_per_s"] for r in records if "tokens_per_s" in r]
    held_out = {r["step"]: r["val_loss"] for r in records if "val_loss" in r}
    machine = next((r["machine"] for r in records if "machine" in r), None)
    return {
        "name": name,
        "steps": last["step"],
        "tokens": tokens,
        "tokens_per_step": per_step,
        "tokens_per_s": statistics.median(speeds) if speeds else None,
        "minutes": last["elapsed"] / 60 if "elapsed" in last else None,
        "held_out": held_out,
        "final_val_loss": held_out[max(held_out)] if held_out else None,
        "final_val_step": max(held_out) if held_out else None,
        "train": [(r["step"], r["loss"]) for r in records if "loss" in r],
        "machine": machine,
    }


def read_runs(checkpoints_dir: Path, runs: list[str], notes: list[str]) -> list[dict]:
    out = []
    for name in runs:
        path = checkpoints_dir / name / "log.jsonl"
        if not path.exists():
            notes.append(f"no {path}")
            continue
        try:
            records = read_log(path)
        except (ValueError, KeyError) as e:
            notes.append(f"{path} is not a pretrain log ({e})")
            continue
        if records:
            out.append(summarize_run(name, records))
        else:
            notes.append(f"{path} is empty")
    return out


def evaluate_rows(data) -> tuple[list[dict], str | None]:
    """evaluate.json as a list of rows (or {"machine", "rows"}) -> (rows, machine or None)."""
    if isinstance(data, dict):
        return data.get("rows", []), data.get("machine")
    return data, next((r["machine"] for r in data if "machine" in r), None)


# ----------------------------------------------------------------------------------------------
# Writing


def fmt(value, spec: str, none: str = "–") -> str:
    return none if value is None else format(value, spec)


def table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    """A markdown table; align is one letter per column, l or r (default: first l, rest r)."""
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---:" if a == "r" else ":---" for a in align]
    lines = [header, rule, *rows]
    return "".join("| " + " | ".join(cells) + " |\n" for cells in lines)


class Writer:
    """Writes the outputs into docs_dir, with the command line at the top of every table."""

    def __init__(self, docs_dir: Path, command: str, placeholders: bool) -> None:
        self.results = docs_dir / "results"
        self.figures = docs_dir / "figures"
        self.command = command
        self.placeholders = placeholders
        self.written: list[Path] = []

    def markdown(self, name: str, sources: str, machine: str, body: str) -> None:
        head = f"Made by `{self.command}` from {sources}.  \nMachine: {machine}\n\n"
        self._write(self.results / f"{name}.md", head + body)

    def figure(self, name: str, draw) -> None:
        """draw(plt) -> a matplotlib figure, saved as figures/NAME.png (skipped without matplotlib)."""
        plt = pyplot()
        path = self.figures / f"{name}.png"
        if plt is None:
            print(f"skipped {path}: matplotlib is not installed (pip install -e '.[docs]')")
            return
        fig = draw(plt)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120, bbox_inches="tight", metadata={"Software": None})
        plt.close(fig)
        self.written.append(path)

    def placeholder(self, tables: list[str], figures: list[str]) -> None:
        """Stand-ins for missing outputs, so the docs build; an existing file is never replaced."""
        if not self.placeholders:
            return
        for name in tables:
            path = self.results / f"{name}.md"
            if not path.exists():
                self._write(path, PLACEHOLDER)
        for name in figures:
            path = self.figures / f"{name}.png"
            if not path.exists():
                self.figure(name, placeholder_figure)

    def _write(self, path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        self.written.append(path)


def pyplot():
    """matplotlib's pyplot, drawing to files only; None when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def placeholder_figure(plt):
    fig, ax = plt.subplots(figsize=(7, 1.6))
    ax.axis("off")
    ax.text(0.5, 0.5, "Not measured yet: run python scripts/report.py after the main job",
            ha="center", va="center", fontsize=11)
    return fig


def moving_average(values: list[float], n: int) -> tuple[list[float], int]:
    """Means of n consecutive values (fewer values: one mean of all); returns (means, n used)."""
    n = max(1, min(n, len(values)))
    sums = [0.0]
    for v in values:
        sums.append(sums[-1] + v)
    return [(sums[i + n] - sums[i]) / n for i in range(len(values) - n + 1)], n


# ----------------------------------------------------------------------------------------------
# Outputs


def training_outputs(runs: list[dict], log_names: str, w: Writer) -> None:
    machine = next((r["machine"] for r in runs if r["machine"]), None) or "not recorded in the logs"
    rows = [
        [f"`{r['name']}`", str(r["steps"]), fmt(r["tokens"], ","), fmt(r["tokens_per_s"], ",.0f"),
         fmt(r["minutes"], ".1f"), fmt(r["final_val_step"], "d"), fmt(r["final_val_loss"], ".4f")]
        for r in runs
    ]
    body = table(["run", "steps", "tokens", "median tokens/s", "minutes", "last evaluated step",
                  "held-out loss there"], rows)
    shared = sorted(set.intersection(*(set(r["held_out"]) for r in runs))) if len(runs) > 1 else []
    if shared:
        names = [r["name"] for r in runs]
        header = ["step", *(f"`{n}`" for n in names)]
        if len(runs) == 2:
            header.append(f"`{names[1]}` − `{names[0]}`")
        rows = []
        for step in shared:
            cells = [str(step), *(f"{r['held_out'][step]:.4f}" for r in runs)]
            if len(runs) == 2:
                cells.append(f"{runs[1]['held_out'][step] - runs[0]['held_out'][step]:+.4f}")
            rows.append(cells)
        body += "\nHeld-out loss at the steps both runs evaluated (the same held-out batches):\n\n"
        body += table(header, rows)
        if len(runs) == 2:
            last = shared[-1]
            a, b = runs[0]["held_out"][last], runs[1]["held_out"][last]
            word = "lower" if b < a else "higher" if b > a else "the same as"
            gap = f"{abs(b - a):.4f} " if b != a else ""
            body += (f"\nAt step {last}, the last both evaluated, `{names[1]}`'s held-out loss is "
                     f"{gap}{word}{' than' if b != a else ''} `{names[0]}`'s.\n")
    w.markdown("training", log_names, machine, body)

    def draw(plt):
        fig, ax = plt.subplots(figsize=(7, 4))
        for i, r in enumerate(runs):
            color = f"C{i}"
            steps, losses = zip(*r["train"], strict=True) if r["train"] else ((), ())
            if losses:
                smooth, n = moving_average(list(losses), 25)
                ax.plot(steps[n - 1:], smooth, color=color, alpha=0.35, linewidth=1,
                        label=f"{r['name']}: training loss (mean of {n} steps)")
            held = sorted(r["held_out"].items())
            ax.plot([s for s, _ in held], [v for _, v in held], "o-", color=color, markersize=3,
                    label=f"{r['name']}: held-out loss")
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats per token)")
        ax.set_title("Held-out loss against step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        return fig

    w.figure("training-loss", draw)


def evaluate_outputs(rows: list[dict], machine: str | None, source: str, w: Writer) -> None:
    body = table(
        ["model", "parameters", "context", "held-out loss", "perplexity", "top-1 accuracy", "tokens"],
        [[f"`{r['model']}`", f"{r['params']:,}", str(r["context"]), f"{r['loss']:.4f}",
          f"{r['perplexity']:.3f}", f"{r['accuracy']:.2%}", f"{r['tokens']:,}"] for r in rows],
    )
    w.markdown("evaluate", source, machine or "not recorded in evaluate.json", body)


def models_outputs(rows: list[dict], machine: str | None, runs: list[dict], sources: str, w: Writer) -> None:
    """The two models side by side: size and speed from training, quality from evaluate.py."""
    by_name = {r["name"]: r for r in runs}
    out = []
    for r in rows:
        run = by_name.get(r["model"], {})
        out.append([f"`{r['model']}`", f"{r['params']:,}", fmt(run.get("steps"), "d"),
                    fmt(run.get("tokens_per_s"), ",.0f"), f"{r['loss']:.4f}", f"{r['perplexity']:.3f}",
                    f"{r['accuracy']:.2%}"])
    body = table(["model", "parameters", "training steps", "median training tokens/s", "held-out loss",
                  "perplexity", "top-1 accuracy"], out)
    if len(rows) == 2 and rows[0]["params"] != rows[1]["params"]:
        big, small = sorted(rows, key=lambda r: -r["params"])
        body += (f"\n`{small['model']}` has {big['params'] - small['params']:,} fewer parameters than "
                 f"`{big['model']}`.\n")
    w.markdown("models", sources, machine or "not recorded in evaluate.json", body)


def context_outputs(data: dict, source: str, smooth: int, w: Writer) -> None:
    rows = data.get("rows", [])
    window, length = data.get("window"), data.get("length")
    body = (f"{data.get('streams', '?')} streams of {length} held-out tokens; the loss is over the tokens "
            f"past the first window of {window}, on device `{data.get('device', '?')}`.\n\n")
    body += table(
        ["model", "method", "loss past the window", "perplexity", "ms per token"],
        [[f"`{r['model']}`", r["method"], f"{r['loss']:.4f}", f"{math.exp(r['loss']):.3f}",
          f"{r['ms_per_token']:.2f}"] for r in rows],
        "llrrr",
    )
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        by_method = {r["method"]: r for r in rows if r["model"] == model}
        base = by_method.get("sliding window")
        if base is None:
            continue
        for method in ("sliding cache", "full context"):
            other = by_method.get(method)
            if other is None:
                continue
            line = (f"`{model}`, {method} against the sliding window: loss "
                    f"{other['loss'] - base['loss']:+.4f}")
            # only the cache writes one token at a time like the window; the full context reads
            # all tokens in one pass, so its time per token is no writing speed
            if method == "sliding cache" and other["ms_per_token"] > 0 and base["ms_per_token"] > 0:
                ratio = base["ms_per_token"] / other["ms_per_token"]
                line += (f", {other['ms_per_token']:.2f} ms per token against {base['ms_per_token']:.2f}: "
                         + (f"{ratio:.1f}× faster" if ratio >= 1 else f"{1 / ratio:.1f}× slower"))
            lines.append(f"- {line}.\n")
    if lines:
        body += "\n" + "".join(lines)
    if data.get("notes"):
        body += "\nNotes from `context.py`:\n\n" + "".join(f"- {n}\n" for n in data["notes"])
    w.markdown("context", source, data.get("machine", "not recorded in context.json"), body)

    def draw(plt):
        fig, ax = plt.subplots(figsize=(7, 4))
        n_used = smooth
        for i, r in enumerate(rows):
            losses = r.get("position_losses") or []
            if not losses:
                continue
            means, n_used = moving_average(losses, smooth)
            start = (window or 0) + (n_used - 1) / 2  # each mean sits at the middle of its positions
            style = {"sliding window": "-", "sliding cache": "--", "full context": ":"}.get(r["method"], "-.")
            ax.plot([start + j for j in range(len(means))], means, style, color=f"C{i}", linewidth=1.5,
                    label=f"{r['model']}: {r['method']}")
        if window and length:
            for edge in range(window, length, window):
                ax.axvline(edge, color="grey", linewidth=0.5, alpha=0.5)
        ax.set_xlabel("position in the stream (tokens)")
        ax.set_ylabel(f"loss, mean of {n_used} positions")
        ax.set_title("Loss past the context window")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        return fig

    w.figure("context-loss", draw)


def data_outputs(meta: dict, source: str, w: Writer) -> None:
    rows = []
    for split, name in (("train", "training"), ("val", "held out")):
        chars, tokens = meta.get(f"{split}_chars"), meta.get(f"{split}_tokens")
        rows.append([name, fmt(meta.get(f"{split}_stories"), ","), fmt(chars, ","), fmt(tokens, ","),
                     f"{chars / tokens:.2f}" if chars and tokens else "–"])
    body = table(["split", "stories", "characters", "tokens", "characters per token"], rows)
    body += (f"\nVocabulary: {meta.get('vocab_size', '?'):,} tokens, `<|endoftext|>` included; "
             f"tokenizer hash `{meta.get('tokenizer_hash', '?')}`.  \nSplit: {meta.get('split', '?')}\n")
    w.markdown("data", source, "not needed (counts, not timings)", body)


def rope_speeds_outputs(w: Writer, config: GPTConfig, other_base: float = 100000.0) -> None:
    """θ_i = base^(-2i/d) and the tokens a pair takes to turn once, for our base and nanochat's."""
    d = config.head_size
    pairs = sorted({0, 1, 2, 4, 8, 16, d // 2 - 1})
    rows = []
    for i in pairs:
        ours = config.rope_theta ** (-2 * i / d)
        theirs = other_base ** (-2 * i / d)
        rows.append([str(i), f"{i}, {i + d // 2}", f"{ours:.3g}", f"{2 * math.pi / ours:,.1f}",
                     f"{2 * math.pi / theirs:,.1f}"])
    body = table(["pair i", "channels", "θ_i (radians per token)", "tokens per turn",
                  f"tokens per turn, base {other_base:,.0f}"], rows, "lrrrr")
    w.markdown("rope-speeds", f"the formula θ_i = {config.rope_theta:,.0f}^(-2i/{d}) (`GPTConfig` defaults)",
               "not needed (computed, not measured)", body)


def weights_outputs(w: Writer) -> None:
    """The saved weight names and shapes of both kinds, one line per name (blocks folded)."""
    import torch

    models = {}
    for rope in (False, True):
        with torch.device("meta"):
            models[rope] = GPT(GPTConfig(rope=rope))
    names: dict[str, tuple] = {}
    for rope, model in models.items():
        for name, tensor in model.state_dict().items():
            folded = re.sub(r"^blocks\.\d+\.", "blocks.N.", name)
            names.setdefault(folded, (tuple(tensor.shape), set()))[1].add(rope)
    n_layer = models[False].config.n_layer
    rows = []
    for name, (shape, kinds) in names.items():
        where = "both" if len(kinds) == 2 else ("rope" if True in kinds else "learned")
        rows.append([f"`{name}`", " × ".join(map(str, shape)), where])
    body = table(["name", "shape", "in"], rows, "lrl")
    learned, rope = models[False].num_params(), models[True].num_params()
    body += (f"\n`N` runs from 0 to {n_layer - 1}. `lm_head.weight` is saved but is the same tensor as "
             f"`wte.weight` (tied), so it is counted once: {learned:,} parameters with learned positions, "
             f"{rope:,} with rope, {learned - rope:,} fewer.\n")
    w.markdown("weights", "`GPT(GPTConfig())` and `GPT(GPTConfig(rope=True))`", "not needed (no training)",
               body)


def rotation_figure(w: Writer, config: GPTConfig) -> None:
    """A pair of channels as an arrow, turned by m·θ_i for positions m = 0..5, for three pairs."""

    def draw(plt):
        d = config.head_size
        pairs = (0, 8, d // 2 - 1)
        fig, axes = plt.subplots(1, len(pairs), figsize=(10, 3.6))
        x0, y0 = math.cos(0.3), math.sin(0.3)  # the pair's two channels at position 0
        for ax, i in zip(axes, pairs, strict=True):
            theta = config.rope_theta ** (-2 * i / d)
            for m in range(6):
                a = m * theta
                x, y = x0 * math.cos(a) - y0 * math.sin(a), x0 * math.sin(a) + y0 * math.cos(a)
                ax.annotate("", xy=(x, y), xytext=(0, 0),
                            arrowprops={"arrowstyle": "->", "color": f"C{m}", "linewidth": 1.5})
                if theta >= 0.1:  # slower pairs barely move: one label for all
                    ax.text(1.12 * x, 1.12 * y, f"m={m}", color=f"C{m}", fontsize=8, ha="center", va="center")
            if theta < 0.1:
                ax.text(0.45, -0.35, "m = 0..5, one on another", fontsize=8, ha="center")
            ax.set_xlim(-1.3, 1.3)
            ax.set_ylim(-1.3, 1.3)
            ax.set_aspect("equal")
            ax.axhline(0, color="grey", linewidth=0.5)
            ax.axvline(0, color="grey", linewidth=0.5)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"pair {i}: θ = {theta:.3g} rad per token", fontsize=10)
        fig.suptitle("One pair of channels turned by m·θ_i at positions m = 0..5")
        return fig

    w.figure("rope-rotation", draw)


# ----------------------------------------------------------------------------------------------
# Reading past the training context (context.py --ctx / --sinks / --dynamic, the fine-tune)


def sweep_outputs(data: dict, source: str, w: Writer) -> None:
    """One table per model (rows n_ctx, columns methods), the memory table, loss against n_ctx."""
    rows = data.get("rows", [])
    models = list(dict.fromkeys(r["model"] for r in rows))
    factor = data.get("linear_factor") or "the largest n_ctx over the training context"
    body = (f"Held-out loss / perplexity; chunks of n_ctx tokens, each scored on its second half "
            f"(about {data.get('sweep_tokens', '?'):,} tokens read per cell); `linear` uses one factor, "
            f"{factor}.\n\n")
    for model in models:
        mine = [r for r in rows if r["model"] == model]
        methods = list(dict.fromkeys(r["method"] for r in mine))
        best = {}
        for r in mine:
            if r["ctx"] not in best or r["loss"] < best[r["ctx"]]:
                best[r["ctx"]] = r["loss"]
        out = []
        for ctx in dict.fromkeys(r["ctx"] for r in mine):
            cells = {r["method"]: r for r in mine if r["ctx"] == ctx}
            out.append([str(ctx)] + [
                ("**{:.3f}** / {:.2f}" if cells[m]["loss"] == best[ctx] else "{:.3f} / {:.2f}").format(
                    cells[m]["loss"], cells[m]["perplexity"]) if m in cells else "–" for m in methods])
        body += f"`{model}`, trained at {mine[0]['train_ctx']} tokens (best of each row in bold):\n\n"
        body += table(["n_ctx", *(f"`{m}`" for m in methods)], out) + "\n"
    w.markdown("sweep", source, data.get("machine", "not recorded"), body)

    memory = data.get("memory") or []
    if memory:
        body = table(["n_ctx", "KV cache bytes per token", "KV cache MiB", "measured peak of a forward, MiB"],
                     [[str(m["ctx"]), f"{m['kv_bytes_per_token']:,}", f"{m['kv_bytes'] / 2**20:.1f}",
                       f"{m['peak_bytes'] / 2**20:.1f}"] for m in memory])
        body += (f"\nThe peak is measured on `{data.get('device', '?')}` (on the CPU: the growth of a fresh "
                 "process's peak resident memory over one forward with a KV cache, logits included).\n")
        w.markdown("memory", source, data.get("machine", "not recorded"), body)

    def draw(plt):
        fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
        for ax, model in zip(axes[0], models, strict=True):
            mine = [r for r in rows if r["model"] == model]
            for i, method in enumerate(dict.fromkeys(r["method"] for r in mine)):
                points = sorted((r["ctx"], r["loss"]) for r in mine if r["method"] == method)
                ax.plot(*zip(*points, strict=True), "o-", color=f"C{i}", markersize=3, label=method)
            ax.axvline(mine[0]["train_ctx"], color="grey", linewidth=0.8, linestyle=":")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("n_ctx (tokens read at once)")
            ax.set_ylabel("held-out loss, second half of each chunk")
            ax.set_title(f"{model} (trained at {mine[0]['train_ctx']})", fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        return fig

    w.figure("sweep", draw)


def streams_table(name: str, data: dict, source: str, w: Writer, intro: str) -> None:
    """A table of context.py rows (model, method, loss, ms/token) for --sinks and --dynamic."""
    body = intro.format(**data) + "\n\n" + table(
        ["model", "method", "loss", "perplexity", "ms per token"],
        [[f"`{r['model']}`", r["method"], f"{r['loss']:.4f}", f"{math.exp(r['loss']):.3f}",
          f"{r['ms_per_token']:.2f}"] for r in data.get("rows", [])], "llrrr")
    w.markdown(name, source, data.get("machine", "not recorded"), body)


def finetune_outputs(run: dict, sweep: dict | None, base: str, source: str, w: Writer) -> None:
    """The long-context fine-tune: its run, and the sweep before (base model) and after."""
    held = sorted(run["held_out"].items())
    body = table(["run", "steps", "tokens", "held-out loss at its first evaluation", "at its last"],
                 [[f"`{run['name']}`", str(run["steps"]), fmt(run["tokens"], ","),
                   f"{held[0][1]:.4f} (step {held[0][0]})" if held else "–",
                   f"{held[-1][1]:.4f} (step {held[-1][0]})" if held else "–"]])
    if sweep:
        rows = sweep.get("rows", [])
        before = {r["ctx"]: r for r in rows if r["model"] == base and r["method"] == "linear-when-needed"}
        plain = {r["ctx"]: r for r in rows if r["model"] == base and r["method"] == "none"}
        after = {r["ctx"]: r for r in rows if r["model"] == run["name"] and r["method"] == "none"}
        shared = [c for c in after if c in plain]
        if shared:
            body += (f"\nHeld-out loss in the sweep, before (`{base}`) and after (`{run['name']}`, read "
                     "as trained):\n\n")
            body += table(["n_ctx", "before, plain rope", "before, linear-when-needed", "after"],
                          [[str(c), f"{plain[c]['loss']:.3f}", f"{before[c]['loss']:.3f}" if c in before else "–",
                            f"{after[c]['loss']:.3f}"] for c in shared])
    w.markdown("finetune", source, run.get("machine") or "not recorded in the log", body)


# ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> list[Path]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results-dir", default="results", help="where evaluate.json and context.json are")
    p.add_argument("--checkpoints-dir", default="checkpoints", help="run folders with log.jsonl")
    p.add_argument("--data-dir", default="data", help="where prepare.py's meta.json is")
    p.add_argument("--docs-dir", default="docs", help="writes DOCS/results/*.md and DOCS/figures/*.png")
    p.add_argument("--runs", nargs="+", default=list(RUNS), help="run folders to compare, in order")
    p.add_argument("--finetune", default="pretrain-rope-ctx1024-linear", help="the long-context fine-tune's run")
    p.add_argument("--smooth", type=int, default=32, help="positions per mean in the context figure")
    p.add_argument("--readme", default="README.md", help="copy the main tables between this file's markers ('' : no)")
    p.add_argument("--no-placeholders", action="store_true",
                   help="for a missing input, write nothing (default: a placeholder if the file is absent)")
    args = p.parse_args(argv)
    if args.smooth < 1:
        raise SystemExit("error: --smooth must be at least 1")

    command = " ".join(["python scripts/report.py", *map(shlex.quote, argv if argv is not None else sys.argv[1:])])
    w = Writer(Path(args.docs_dir), command, not args.no_placeholders)
    results, ckpts = Path(args.results_dir), Path(args.checkpoints_dir)

    def skip(what: str, notes: list[str], tables: list[str], figures: tuple[str, ...] = ()) -> None:
        print(f"skipped {what}: {'; '.join(notes)}")
        w.placeholder(tables, list(figures))

    notes: list[str] = []
    runs = read_runs(ckpts, args.runs, notes)
    if runs:
        for note in notes:  # a run that is missing while another is there
            print(f"note: {note}")
        logs = ", ".join(f"`{ckpts / r['name'] / 'log.jsonl'}`" for r in runs)
        training_outputs(runs, logs, w)
    else:
        skip("the training table and figure", notes, ["training"], ("training-loss",))

    notes = []
    data = read_json(results / "evaluate.json", notes)
    if data:
        rows, machine = evaluate_rows(data)
        source = f"`{results / 'evaluate.json'}`"
        evaluate_outputs(rows, machine, source, w)
        if runs:
            source += " and " + ", ".join(f"`{ckpts / r['name'] / 'log.jsonl'}`" for r in runs)
        models_outputs(rows, machine, runs, source, w)
    else:
        skip("the evaluation tables", notes or ["evaluate.json holds no rows"], ["evaluate", "models"])

    notes = []
    data = read_json(results / "context.json", notes)
    if data:
        context_outputs(data, f"`{results / 'context.json'}`", args.smooth, w)
    else:
        skip("the table and figure past the window", notes or ["context.json is empty"], ["context"],
             ("context-loss",))

    notes = []
    meta = read_json(Path(args.data_dir) / "meta.json", notes)
    if meta:
        data_outputs(meta, f"`{Path(args.data_dir) / 'meta.json'}`", w)
    else:
        skip("the data table", notes or ["meta.json is empty"], ["data"])

    notes = []
    sweep = read_json(results / "sweep.json", notes)
    if sweep:
        sweep_outputs(sweep, f"`{results / 'sweep.json'}`", w)
    else:
        skip("the context sweep", notes, ["sweep", "memory"], ("sweep",))
    for name, intro in (
        ("sinks", "{streams} streams of {length} held-out tokens through a cache that slides at the window, "
                  "keeping {sinks} attention sinks or none; the loss is over the tokens past the first window."),
        ("dynamic", "{streams} streams of {length} held-out tokens, read one token at a time into a cache "
                    "that never slides, the loss over the tokens past the first window."),
    ):
        notes = []
        data = read_json(results / f"{name}.json", notes)
        if data:
            streams_table(name, data, f"`{results / (name + '.json')}`", w, intro)
        else:
            skip(f"the {name} table", notes, [name])
    notes = []
    long_runs = read_runs(ckpts, [args.finetune], notes)
    if long_runs:
        finetune_outputs(long_runs[0], sweep, args.runs[-1], f"`{ckpts / args.finetune / 'log.jsonl'}`"
                         + (f" and `{results / 'sweep.json'}`" if sweep else ""), w)
    else:
        skip("the fine-tune table", notes, ["finetune"])

    config = GPTConfig()
    rope_speeds_outputs(w, config)
    weights_outputs(w)
    rotation_figure(w, config)

    if args.readme:
        readme_outputs(Path(args.readme), w, ["models", "context", "sweep"])
    for path in w.written:
        print(f"wrote {path}")
    return w.written


README_START, README_END = "<!-- report.py: start -->", "<!-- report.py: end -->"


def readme_outputs(readme: Path, w: Writer, names: list[str]) -> None:
    """Copy some of the tables into the README, between its two markers (the rest stays as written)."""
    if not readme.exists():
        return
    text = readme.read_text(encoding="utf-8")
    if README_START not in text or README_END not in text:
        print(f"note: {readme} has no {README_START} ... {README_END} markers: left alone")
        return
    parts = []
    for name in names:
        path = w.results / f"{name}.md"
        if path.exists() and "Not measured yet" not in path.read_text(encoding="utf-8"):
            parts.append(path.read_text(encoding="utf-8").strip())
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    block = "\n\n".join(parts) if parts else "Run the main job, then `python scripts/report.py`."
    w._write(readme, f"{head}{README_START}\n{block}\n{README_END}{tail}")


if __name__ == "__main__":
    main()
