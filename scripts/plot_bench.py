"""Turn scripts/bench.py's JSON into the performance page's table, profiler tables and plot.

Writes three files, which docs/performance.md includes or shows, so no measured number is typed
into the page by hand:
- docs/results/bench.md: the table, with the machine and the command that measured it;
- docs/results/bench-profiles.md: the profiler tables of one decoding and one training step;
- docs/figures/bench.png: training against the matrix-product peak, decoding against its floor,
  generation at each batch size against its floor.

Examples:
    python scripts/bench.py --compile --json results/bench.json && python scripts/plot_bench.py results/bench.json
    python scripts/plot_bench.py /tmp/bench.json --out-dir /tmp/docs     # a tiny run's figures, elsewhere
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mvgpt.bench import summary_rows  # noqa: E402


def markdown_table(result: dict) -> str:
    rows = summary_rows(result)
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows[1:]]
    settings = f"{result['threads']} thread{'s' if result['threads'] > 1 else ''}"
    if result.get("malloc_tuned"):
        settings += ", glibc malloc tuned (mvgpt.bench.tune_malloc)"
    quick = " (--quick: fewer steps, rougher figures)" if result.get("quick") else ""
    note = f" {result['note']}" if result.get("note") else ""
    return (
        "\n".join(lines)
        + f"\n\nMeasured on {result['machine']}, {settings}, {result['date']}{quick}, with\n"
        + f"`{result['command']}` ({result['seconds']:.0f} s).{note}\n"
    )


def markdown_profiles(result: dict) -> str:
    tables = [("One cached decoding step (rope, batch 1, a full window held)", result["decoding"]["profile"])]
    if "compiled_decoding" in result:
        tables.append(("The same step, compiled (compile_for_decoding)", result["compiled_decoding"]["profile"]))
    tables.append((f"One training step ({result['training'][-1]['kind']})", result["training"][-1]["profile"]))
    parts = []
    for title, text in tables:
        parts.append(f"**{title}**\n\n```text\n{text.strip()}\n```\n")
    return "\n".join(parts)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no window, no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    c, d = result["ceilings"], result["decoding"]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.5), gridspec_kw={"width_ratios": [1, 1.7, 1.2]})

    peak = c[c["training_peak"]] / 1e9
    kinds = [t["kind"] for t in result["training"]]
    ax1.bar(kinds, [t["flops"] / 1e9 for t in result["training"]], color="tab:blue")
    ax1.axhline(peak, color="black", label=f"{c['training_peak'][7:11]} matmul peak, {peak:,.0f} GFLOP/s")
    ax1.axhline(peak * result["goals"]["training_share_of_peak"], color="gray", linestyle="--", label="goal")
    ax1.set_ylabel("GFLOP/s")
    ax1.set_title("Training: achieved FLOP/s")
    ax1.set_ylim(0, peak * 1.4)  # room above the peak for the legend
    ax1.legend(loc="upper left", fontsize=8)

    labels = ["floor"]
    values = [d["floor_ms"]]
    for n, ms in d["cached_ms_by_threads"].items():
        labels.append(f"sliding cache, {n} thr")
        values.append(ms)
    if "compiled_decoding" in result:
        labels.append("sliding cache, compiled")
        values.append(result["compiled_decoding"]["ms"])
    labels += ["re-run window: compute floor", "re-run window"]
    values += [d["rerun_compute_floor_ms"], d["rerun_ms"]]
    colors = ["gray"] + ["tab:green"] * (len(labels) - 3) + ["lightgray", "tab:red"]
    ax2.barh(labels, values, color=colors)
    ax2.set_xscale("log")
    ax2.xaxis.set_major_formatter(ScalarFormatter())  # 1, 10, 100 rather than powers of ten
    ax2.xaxis.set_minor_formatter(NullFormatter())  # no labels crowding between them
    ax2.set_xlabel("ms per token (log scale)")
    ax2.set_title("Decoding, batch 1")
    for y, v in enumerate(values):
        ax2.text(v, y, f" {v:.2f}", va="center", fontsize=8)

    batches = [g["batch"] for g in result["generation"]]
    ax3.plot(batches, [g["tokens_per_s"] for g in result["generation"]], "o-", label="measured")
    ax3.plot(batches, [g["floor_tokens_per_s"] for g in result["generation"]], "s--", color="gray",
             label="floor")
    for g in result["generation"]:
        ax3.annotate(f"{g['tokens_per_s']:,.0f}", (g["batch"], g["tokens_per_s"]), textcoords="offset points",
                     xytext=(0, 7), ha="center", fontsize=8)
    ax3.margins(y=0.15)  # room for the labels
    ax3.set_xscale("log", base=2)
    ax3.set_yscale("log")
    ax3.yaxis.set_major_formatter(ScalarFormatter())
    ax3.yaxis.set_minor_formatter(NullFormatter())
    ax3.set_xticks(batches, [str(b) for b in batches])
    ax3.set_xlabel("sequences at once")
    ax3.set_ylabel("tokens/s (log scale)")
    ax3.set_title("Generation with the cache")
    ax3.legend()

    fig.suptitle(result["machine"], fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Path]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", help="scripts/bench.py --json output")
    p.add_argument("--out-dir", default="docs", help="results/ and figures/ go in here")
    args = p.parse_args(argv)

    result = json.loads(Path(args.json).read_text())
    out = Path(args.out_dir)
    paths = {
        "table": out / "results" / "bench.md",
        "profiles": out / "results" / "bench-profiles.md",
        "plot": out / "figures" / "bench.png",
    }
    paths["table"].parent.mkdir(parents=True, exist_ok=True)
    paths["table"].write_text(markdown_table(result))
    paths["profiles"].write_text(markdown_profiles(result))
    plot(result, paths["plot"])
    for path in paths.values():
        print(path)
    return paths


if __name__ == "__main__":
    main()
