"""The main job's plan against its stages, read back from what main.py printed (to a terminal or a log).

main.py writes results/main-job.json at its end: the plan's estimate for each stage, the time each
took, and the whole job's. A job run with an older main.py, or one whose JSON was lost, printed the
same figures (mvgpt.plan.Progress), to a tenth of a minute: this reads them back into that JSON.

Examples:
    python scripts/main.py --source DIR 2>&1 | tee main.log
    python dev/main_job_from_log.py main.log --json results/main-job.json
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mvgpt.errors import ArgumentParser, run_main, writable_file  # noqa: E402
from mvgpt.io import write_json  # noqa: E402

PLAN = re.compile(r"^plan \((?P<steps>[\d,]+) steps each.*\n(?:  .*\n)*?  total +[\d.]+ min, (?P<planned>[\d.]+) min "
                  r"with the", re.M)
STAGE = re.compile(r"^\[(?P<stage>.+?): (?P<took>[\d.]+) min \(planned (?P<planned>[\d.]+) min\); about [\d.]+ min "
                   r"left, (?P<so_far>[\d.]+) min so far\]$", re.M)


def read_log(text: str) -> dict:
    """{"steps", "planned_s", "took_s", "stages": [{"stage", "planned_s", "took_s"}]} from main.py's printout;
    took_s is the last stage's "so far" (everything but the final line's own moment)."""
    plan = PLAN.search(text)
    if plan is None:
        raise SystemExit("error: no plan in this log: give the output of a main.py that prints one")
    stages = [{"stage": m["stage"], "planned_s": 60 * float(m["planned"]), "took_s": 60 * float(m["took"])}
              for m in STAGE.finditer(text)]
    last = list(STAGE.finditer(text))
    return {"steps": int(plan["steps"].replace(",", "")), "planned_s": 60 * float(plan["planned"]),
            "took_s": 60 * float(last[-1]["so_far"]) if last else 0.0, "stages": stages}


def main(argv: list[str] | None = None) -> dict:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("log", type=Path, help="what main.py printed")
    p.add_argument("--json", type=writable_file, help="write it here (as main.py writes results/main-job.json)")
    p.add_argument("--machine", default="", help="the machine it ran on, as the other results name it")
    p.add_argument("--command", default="python scripts/main.py", help="the command that printed it")
    args = p.parse_args(argv)
    got = {"command": args.command, "machine": args.machine, **read_log(args.log.read_text(encoding="utf-8")),
           "note": "read back from its printed plan and progress lines by python dev/main_job_from_log.py"}
    for stage in got["stages"]:
        print(f"{stage['stage']:<24} planned {stage['planned_s'] / 60:5.1f} min, took {stage['took_s'] / 60:5.1f}")
    print(f"{'the job':<24} planned {got['planned_s'] / 60:5.1f} min, took {got['took_s'] / 60:5.1f}")
    if args.json:
        write_json(args.json, got)
    return got


if __name__ == "__main__":
    run_main(main)
