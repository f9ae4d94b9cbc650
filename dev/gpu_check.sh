#!/usr/bin/env bash
# One NVIDIA GPU, measured in one go (about 8 minutes, 6 of them training): the tests that use CUDA, both kinds trained
# for two minutes with --dtype auto (the rope model compiled and not), the episode's table past the
# window on the GPU, and bench.py's decoding (eager, bf16 weights; the C step is the CPU's), all into
# results/<gpu>/, a folder named after the GPU (e.g. results/nvidia-h200/). Then choices.json sets
# what was measured beside what the code chooses there (dtype, compiling training).
#
#   bash dev/gpu_check.sh                        # needs prepared data (data/, or --source to prepare it)
#   bash dev/gpu_check.sh --source ../shared/data/tinystories --minutes 2
#   bash dev/gpu_check.sh --dry-run --gpu-name "NVIDIA H200"      # the commands, run nowhere (any machine)
set -euo pipefail

minutes=2
data=data
source_dir="${MVGPT_TINYSTORIES:-}"
dry_run=0
gpu_name=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --source) source_dir="$2"; shift 2 ;;
    --gpu-name) gpu_name="$2"; shift 2 ;;  # the results folder's name (default: the GPU's)
    --dry-run) dry_run=1; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's mvgpt, whatever is installed

if [[ $dry_run == 0 ]]; then  # the GPU torch sees names the folder (--gpu-name: another name for it)
  seen="$(python -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")')"
  if [[ -z "$seen" ]]; then
    echo "error: no CUDA GPU is visible to torch: run this on a machine with one (or --dry-run to see the commands)" >&2
    exit 1
  fi
  gpu_name="${gpu_name:-$seen}"
fi
gpu_name="${gpu_name:-NVIDIA GPU}"
# the folder: the GPU's name in lower case, anything but letters and digits a dash ("NVIDIA H200" -> nvidia-h200)
machine="$(printf '%s' "$gpu_name" | tr '[:upper:]' '[:lower:]' | sed -E 's/[^a-z0-9]+/-/g; s/^-+//; s/-+$//')"
out="results/$machine"
ckpts="checkpoints/gpu-check"
runs="runs/gpu-check"

step() {  # print a command, then run it unless --dry-run, under a time limit (seconds) so one stall cannot eat the rest
  local limit="$1"; shift
  printf '$'; printf ' %q' "$@"; printf '\n'  # quoted as a shell reads it: ready to copy
  if [[ $dry_run == 0 ]]; then
    SECONDS=0
    timeout "$limit" "$@"
    echo "  ($SECONDS s)"
  fi
}

echo "GPU check: $gpu_name -> $out/ ($minutes-minute runs)"
[[ $dry_run == 1 ]] || mkdir -p "$out"
if [[ ! -f "$data/meta.json" ]]; then
  if [[ -z "$source_dir" ]]; then
    echo "error: no prepared data in $data/: give --source (TinyStories text) or --data (a prepared folder)" >&2
    exit 1
  fi
  step 300 python scripts/prepare.py --data-dir "$data" --source "$source_dir" --json "$out/data.json"
fi

# 1. the tests that use CUDA (they skip without one), and the device's choices
step 300 python -m pytest -q -rs tests/test_device.py tests/test_precision.py -k "cuda or device or float64 or resolve"

# 2. both kinds for two minutes each, --dtype auto, as typed (a GPU does not compile unless asked), and the
#    rope model compiled: the same two minutes, compiled against eager (what mvgpt.perf.compile_pays weighs)
common=(--minutes "$minutes" --dtype auto --device cuda --data-dir "$data" --runs-dir "$runs" --overwrite)  # a check: run again
limit=$(python -c "print(int(60 * float('$minutes') + 120))")  # the budget, a start, an evaluation, a save
step "$limit" python scripts/pretrain.py "${common[@]}" --out-dir "$ckpts/pretrain" --json "$out/pretrain.json"
step "$limit" python scripts/pretrain.py --rope "${common[@]}" --out-dir "$ckpts/pretrain-rope" \
  --json "$out/pretrain-rope.json"
step "$limit" python scripts/pretrain.py --rope --compile "${common[@]}" --out-dir "$ckpts/pretrain-rope-compiled" \
  --json "$out/pretrain-rope-compiled.json"

# 3. the episode's table past the window, on the GPU (the episode's GPU rows: ms/token)
step 240 python scripts/context.py "$ckpts/pretrain" "$ckpts/pretrain-rope" --device cuda --data-dir "$data" \
  --streams 2 --json "$out/context-gpu.json"

# 4. bench.py's decoding on the GPU: the cached step eager, with float32 and bf16 weights
step 300 python scripts/bench.py --device cuda --only decoding --json "$out/bench.json" \
  --note "dev/gpu_check.sh: decoding only"

# 5. what was measured, beside what the code chooses on this GPU
step 60 python - "$out" <<'EOF'
import json, sys
from pathlib import Path

import torch

from mvgpt.perf import compile_pays
from mvgpt.device import dtype_name, resolve_dtype

out = Path(sys.argv[1])
read = lambda name: json.loads((out / name).read_text())  # noqa: E731
eager, compiled, bench = read("pretrain-rope.json"), read("pretrain-rope-compiled.json"), read("bench.json")
dtype = resolve_dtype("auto", "cuda")
speedup = compiled["tokens_per_s"] / eager["tokens_per_s"]  # the steps' median speeds: compile time left out
choices = {
    "machine": bench["machine"],
    "dtype_auto": dtype_name(dtype),
    "training_compiled_over_eager": speedup,
    "training_steps": {"eager": eager["steps"], "compiled": compiled["steps"]},  # in the same minutes
    "compile_pays_says": compile_pays("cuda", dtype, 600.0),
    "compiling_paid_in_these_minutes": compiled["steps"] > eager["steps"],
    "decoding_ms": {"eager": bench["decoding"]["cached_ms"]},
}
(out / "choices.json").write_text(json.dumps(choices, indent=1) + "\n")
print(json.dumps(choices, indent=1))
EOF
echo "done: $out/"
