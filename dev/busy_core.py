"""The training step and the decoding step when another program takes a core: 1 thread against all.

A learner's machine always runs something else: a browser, an editor, a sync client. This times the
pretraining step (as pretrain.py takes it: mvgpt.train.Step, bf16 where native) and the one-token
decoding step with each thread count, one after the other in rounds, while the machine is quiet and
while another process holds a core: a busy loop (at normal priority, and at nice 19), and a second
training run. It prints tokens/s for each, and writes them with --json.

How long: about two minutes a load on a 2-core CPU.

Examples:
    python dev/busy_core.py --json results/amd-epyc/busy-core.json
    python dev/busy_core.py --loads quiet spin --rounds 3 --steps 2
    python dev/busy_core.py --compile        # the compiled step, as a ten-minute run takes it
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

import torch

from mvgpt.device import dtype_name, machine, resolve_dtype
from mvgpt.kit.errors import ArgumentParser, positive_int, run_main
from mvgpt.kit.io import write_json
from mvgpt.kit.runfolder import writable_file
from mvgpt.model import GPT, GPTConfig, KVCache
from mvgpt.perf.cpu_attention import batch_attention_where_it_pays
from mvgpt.perf.measure import OtherLoad, tune_malloc
from mvgpt.train import Step, configure_optimizer

SPIN = "while True: pass"
TRAIN = ("import torch\n"
         "from mvgpt.model import GPT, GPTConfig\nfrom mvgpt.train import Step, configure_optimizer\n"
         "from mvgpt.device import resolve_dtype\nfrom mvgpt.perf.cpu_attention import batch_attention_where_it_pays\n"
         "torch.manual_seed(1); m = GPT(GPTConfig(rope=True)).train()\n"
         "d = resolve_dtype('auto', 'cpu'); batch_attention_where_it_pays(m, 'cpu', d)\n"
         "s = Step(m, configure_optimizer(m, 1e-4, 0.1, 'cpu'), 'cpu', d)\n"
         "x = torch.randint(0, 8192, (16, 256)); print('ready', flush=True)\nwhile True: s(x, x)\n")
LOADS = {  # what holds a core meanwhile: the command, its nice level
    "quiet": None,
    "spin": ([sys.executable, "-c", SPIN], 0),
    "spin, nice 19": ([sys.executable, "-c", SPIN], 19),
    "a training run": ([sys.executable, "-c", TRAIN], 0),
}


def start(load: str) -> subprocess.Popen | None:
    if LOADS[load] is None:
        return None
    command, nice = LOADS[load]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True,
                             preexec_fn=(lambda: os.nice(nice)) if nice else None)
    if load == "a training run":
        child.stdout.readline()  # its model made: it trains from now on
    time.sleep(2.0)
    return child


def stop(child: subprocess.Popen | None) -> None:
    if child is not None:
        child.send_signal(signal.SIGKILL)
        child.wait()


def main(argv: list[str] | None = None) -> dict:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loads", nargs="+", default=list(LOADS), choices=list(LOADS))
    p.add_argument("--rounds", type=positive_int, default=5, help="rounds of each thread count, in turn")
    p.add_argument("--steps", type=positive_int, default=3, help="training steps a round")
    p.add_argument("--tokens", type=positive_int, default=32, help="decoding steps a round")
    p.add_argument("--compile", action="store_true", help="the compiled training step (a ten-minute run's)")
    p.add_argument("--json", type=writable_file)
    args = p.parse_args(argv)
    tune_malloc()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = sorted({cores, 1}, reverse=True)
    dtype = resolve_dtype("auto", "cpu")
    config = GPTConfig(rope=True)
    torch.manual_seed(0)
    model = GPT(config).train()
    batch_attention_where_it_pays(model, "cpu", dtype)
    step = Step(model, configure_optimizer(model, 1e-4, 0.1, "cpu"), "cpu", dtype,
                forward=torch.compile(model) if args.compile else None)
    x = torch.randint(0, config.vocab_size, (16, config.block_size))
    reader = GPT(config).eval()
    cache = KVCache(config, 1)
    with torch.no_grad():
        reader(x[:1], cache=cache)

    def train() -> None:
        for _ in range(args.steps):
            step(x, x)[0].item()

    def decode() -> None:
        with torch.no_grad():
            for i in range(args.tokens):
                cache.slide(config.block_size - 1)
                reader.decode(x[:1, i:i + 1], cache)

    for n in threads:  # compiled or not, each thread count's first call out of the clock
        torch.set_num_threads(n)
        train()
        decode()
    rows = []
    for load in args.loads:
        child = start(load)
        times = {(work, n): [] for work in ("train", "decode") for n in threads}
        with OtherLoad() as other:
            for _ in range(args.rounds):
                for n in threads:
                    torch.set_num_threads(n)
                    for work, fn in (("train", train), ("decode", decode)):
                        t0 = time.perf_counter()
                        fn()
                        times[(work, n)].append(time.perf_counter() - t0)
        stop(child)
        for (work, n), t in times.items():
            per = statistics.median(t)
            tokens = args.steps * x.numel() if work == "train" else args.tokens
            rows.append({"load": load, "work": work, "threads": n, "tokens_per_s": tokens / per,
                         "other_cores": other.cores})
            print(f"{load:<16} {work:<7} {n} thread{'s' if n > 1 else ' '} {tokens / per:>10,.0f} tokens/s "
                  f"(other programs: {other.cores or 0:.1f} cores)", flush=True)
    torch.set_num_threads(cores)
    result = {"command": "python dev/busy_core.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": machine("cpu"), "dtype": dtype_name(dtype), "compiled": args.compile, "rows": rows}
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    run_main(main)
