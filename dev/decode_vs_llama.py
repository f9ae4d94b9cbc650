"""Writing a token: mvGPT's sliding-cache step beside llama.cpp's, same weights, same threads, batch 1.

The model (the default rope shape with random weights, seed 0, or a checkpoint) goes to llama.cpp
through our own GGUF export (mvgpt/export/gguf.py): float32, and float16 for the two-byte row. Every engine
reads a prompt of 255 tokens, then writes one token at a time; before each, the oldest is dropped so
that 255 stay held (our KVCache.slide, llama.cpp's llama_memory_seq_rm), so every step attends to 256,
as generate does past the window. The engines take turns: each writes --steps tokens, --rounds
rounds, and the figure is each one's median ms/token over the rounds (a busy machine slows them alike).

- mvGPT eager: GPT.decode, the model's own forward (float32 weights; bf16 weights where the CPU
  multiplies bf16 natively);
- mvGPT C step: mvgpt.fast_decode.FastDecode (mvgpt/perf/one_token.c), the time to build it beside it;
- llama.cpp: llama-cpp-python's low-level API, one llama_decode of a one-token batch per step, the
  KV cache in the weights' type (f32 with f32, f16 with f16), flash attention off and on. What
  Python adds to each of its steps (the batch's fields, the ctypes calls) is timed on its own.

Each against its floor: the bytes a step must read (every weight once, the keys and values of 256
tokens) at the memory's read bandwidth (scripts/bench.py's measure_ceilings and bench.decode_floor_ms).
With one thread, each engine's CPU time per token too: a busy machine stretches the clock, not that.
And where our steps spend their time: each profiled (torch.profiler), by part.

Examples:
    python dev/decode_vs_llama.py --threads 1 2 --json results/amd-epyc/decode.json   # a few minutes
    python dev/decode_vs_llama.py checkpoints/pretrain-rope --data-dir data --json /tmp/decode.json
    python dev/decode_vs_llama.py --n-layer 2 --n-head 2 --n-embd 64 --block-size 32 --vocab-size 300 \\
        --rounds 3 --steps 4 --json /tmp/decode.json          # tiny, under a minute
"""

from __future__ import annotations

import argparse
import copy
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path

import torch
from workshop import script

from mvgpt.checkpoint import load_model
from mvgpt.device import cpu_bf16_native, dtype_name, machine
from mvgpt.export.gguf import export_gguf, llama_cpp_missing
from mvgpt.kit.io import write_json
from mvgpt.model import GPT, GPTConfig, KVCache
from mvgpt.perf.fast_decode import FastDecode
from mvgpt.perf.flops import decode_bytes_per_token, forward_flops
from mvgpt.perf.measure import matmul_flops, profile
from mvgpt.tokenizer import Tokenizer

bench = script("bench")  # scripts/bench.py (dev/workshop.py)

GOALS = {"over_llama_cpp": 1.0, "over_floor": 1.5}  # issue 29: no slower than llama.cpp, within 1.5x the floor
PARTS = (  # our eager step's operations, by the names the profiler gives them (the first that matches)
    ("matrix products", ("addmm", "aten::mm", "aten::linear", "aten::matmul")),
    ("attention", ("scaled_dot_product", "flash_attention")),
    ("norms", ("layer_norm",)),
    ("GELU", ("gelu",)),
)


class Ours:
    """mvGPT writing a token: `step()` slides the cache to `held` tokens and writes the next one of
    `tokens` (its logits in `last`), eagerly or with the C step. The first `held` tokens are read at set-up."""

    def __init__(self, model: GPT, tokens: torch.Tensor, held: int, fast: bool) -> None:
        self.model, self.tokens, self.held = model, tokens, held
        self.decode = FastDecode(model) if fast else model.decode
        self.build_s = self.decode.build_s if fast else None
        weight = model.wte.weight
        self.cache = KVCache(model.config, 1, 2 * model.config.block_size, weight.device, weight.dtype)
        with torch.no_grad():
            model(tokens[:, :held], cache=self.cache)
        self.t = held
        self.last = None

    def step(self) -> None:
        self.cache.slide(self.held)
        token = self.tokens[:, self.t % self.tokens.shape[1]][:, None]
        with torch.no_grad():
            self.last = self.decode(token, self.cache)
        self.t += 1


class LlamaCpp:
    """llama.cpp writing a token, as Ours does: the oldest position removed, one llama_decode."""

    def __init__(self, path: Path, tokens: list[int], held: int, threads: int, kv: str, flash: bool) -> None:
        import llama_cpp

        kv_type = {"f32": llama_cpp.GGML_TYPE_F32, "f16": llama_cpp.GGML_TYPE_F16}[kv]
        self.llm = llama_cpp.Llama(
            model_path=str(path), n_ctx=held + 1, n_batch=held + 1, n_ubatch=held + 1, n_threads=threads,
            n_threads_batch=threads, type_k=kv_type, type_v=kv_type, flash_attn=flash, verbose=False)
        self.lib, self.ctx = llama_cpp, self.llm._ctx.ctx
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(held, 0, 1)
        self.tokens, self.held = tokens, held
        self.fill(tokens[:held], 0)
        assert llama_cpp.llama_decode(self.ctx, self.batch) == 0
        self.t = held

    def fill(self, ids: list[int], start: int) -> None:
        b = self.batch
        b.n_tokens = len(ids)
        for i, token in enumerate(ids):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = token, start + i, 1, 0, 0
        b.logits[len(ids) - 1] = 1

    def step(self, decode: bool = True) -> None:
        lib = self.lib
        lib.llama_memory_seq_rm(self.memory, 0, 0, self.t - self.held)  # slide: positions before t - held go
        self.fill([self.tokens[self.t % len(self.tokens)]], self.t)
        if decode:
            assert lib.llama_decode(self.ctx, self.batch) == 0
            self.t += 1
        lib.llama_get_logits_ith(self.ctx, -1)

    def python_us(self, n: int = 2000) -> float:
        """Microseconds of Python per step: the same calls without llama_decode (nothing to remove then)."""
        t0 = time.perf_counter()
        for _ in range(n):
            self.step(decode=False)
        return 1e6 * (time.perf_counter() - t0) / n

    def close(self) -> None:
        self.lib.llama_batch_free(self.batch)
        self.llm.close()


def synthetic_tokenizer(vocab_size: int) -> Tokenizer:
    """A byte-level BPE of vocab_size tokens (the 256 bytes, then pairs of them, then <|endoftext|>): what the
    GGUF file needs to load, for random weights (no text is tokenized here)."""
    ranks = {bytes([b]): b for b in range(256)}
    pairs = (bytes([a, b]) for a in range(256) for b in range(256))
    while len(ranks) < vocab_size - 1:
        ranks[next(pairs)] = len(ranks)
    return Tokenizer(ranks, r"\S+|\s+")


def part_of(name: str) -> str:
    name = name.lower()
    return next((part for part, keys in PARTS if any(k in name for k in keys)), "other operations")


def time_by_part(engine: Ours, ms: float, steps: int = 20) -> dict[str, float]:
    """ms per step in each part (the profiler's self times over `steps` steps), and what no operation
    took: `ms`, the step's measured median, minus the profiled parts (Python, dispatch, the profiler's own)."""
    events = profile(lambda: [engine.step() for _ in range(steps)], "cpu")
    parts: dict[str, float] = {}
    for event in events:
        part = part_of(event.key)
        parts[part] = parts.get(part, 0.0) + event.self_cpu_time_total / 1e3 / steps
    parts["outside the operations"] = max(ms - sum(parts.values()), 0.0)
    return dict(sorted(parts.items(), key=lambda kv: -kv[1]))


def race(engines: dict[str, Ours | LlamaCpp], rounds: int, steps: int, cpu: bool) -> dict[str, dict]:
    """Each engine writes `steps` tokens in turn, `rounds` rounds: per engine, ms per token each round (and
    the CPU time, when one thread runs it all). Before each turn the processor's caches are filled with
    something else, so that no engine starts with the weights another left there (two bytes a weight,
    the model nearly fits a 32 MB last-level cache). Each round starts with the next engine, so each
    follows each other one as often: the one before leaves its threads spinning a while, waiting for
    more work, and the clock may have slowed or sped up."""
    out = {name: {"ms": [], "cpu_ms": []} for name in engines}
    other = torch.ones(64 * 2**20 // 4)  # larger than any last-level cache of a CPU with few cores
    for engine in engines.values():  # one round unmeasured: caches, pages, the first call of each kernel
        for _ in range(steps):
            engine.step()
    names = list(engines)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            engine = engines[name]
            other.sum()
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(steps):
                engine.step()
            out[name]["ms"].append(1e3 * (time.perf_counter() - t0) / steps)
            out[name]["cpu_ms"].append(1e3 * (time.process_time() - c0) / steps)
    if not cpu:
        for times in out.values():
            del times["cpu_ms"]
    return out


def largest_difference(a: Ours, b: Ours, steps: int = 16) -> float:
    """The largest difference between two of our engines' logits, step by step on the same tokens."""
    diff = 0.0
    for _ in range(steps):
        a.step()
        b.step()
        diff = max(diff, (a.last.float() - b.last.float()).abs().max().item())
    return diff


def measure(model32: GPT, files: dict[str, Path], threads: int, args, ceilings: dict) -> tuple[list, dict, dict]:
    """The rows at one thread count, the profiles of our steps, and the logits' differences."""
    torch.set_num_threads(threads)
    W = model32.config.block_size
    held = W - 1
    stream = bench.random_tokens((1, 4 * W), model32.config.vocab_size, torch.device("cpu"), seed=3)
    dtypes = [torch.float32] + ([torch.bfloat16] if cpu_bf16_native() else [])
    models = {d: model32 if d == torch.float32 else copy.deepcopy(model32).to(d) for d in dtypes}
    engines: dict[str, Ours | LlamaCpp] = {}
    rows = {}
    bandwidth = max(v for k, v in ceilings.items() if k.startswith("read_bandwidth"))
    peak = ceilings["matmul_fp32_flops"]
    for d, m in models.items():
        floor = {"floor_ms": bench.decode_floor_ms(m, W, 1, bandwidth, peak),
                 "floor_bytes": decode_bytes_per_token(m, W)}
        for fast in (False, True):
            name = f"mvGPT {'C step' if fast else 'eager'}, {dtype_name(d)}"
            engines[name] = Ours(m, stream, held, fast)
            rows[name] = {"engine": "mvGPT", "step": "C step" if fast else "eager", "weights": dtype_name(d),
                          "kv": dtype_name(d), "bytes_per_weight": m.wte.weight.element_size(), **floor,
                          "build_s": engines[name].build_s}
        if not llama_cpp_missing():
            kv = "f32" if d == torch.float32 else "f16"
            for flash in (False, True):
                name = f"llama.cpp, {kv}{', flash attention' if flash else ''}"
                engines[name] = LlamaCpp(files[kv], stream[0].tolist(), held, threads, kv, flash)
                rows[name] = {"engine": "llama.cpp", "step": "flash attention" if flash else "llama_decode",
                              "weights": kv, "kv": kv, "bytes_per_weight": m.wte.weight.element_size(), **floor}
    timed = race(engines, args.rounds, args.steps, cpu=threads == 1)
    out = []
    for name, row in rows.items():
        ms = statistics.median(timed[name]["ms"])
        row = {"name": name, "threads": threads, **row, "ms": ms, "ms_rounds": timed[name]["ms"],
               "over_floor": ms / row["floor_ms"]}
        if "cpu_ms" in timed[name]:
            row["cpu_ms"] = statistics.median(timed[name]["cpu_ms"])
        out.append(row)
    for row in out:  # ours against llama.cpp's best at the same bytes per weight
        peers = [r for r in out if r["engine"] == "llama.cpp" and r["bytes_per_weight"] == row["bytes_per_weight"]]
        if row["engine"] == "mvGPT" and peers:
            best = min(peers, key=lambda r: r["ms"])
            row["llama_cpp"], row["over_llama_cpp"] = best["name"], row["ms"] / best["ms"]
            if "cpu_ms" in row:
                row["cpu_over_llama_cpp"] = row["cpu_ms"] / min(r["cpu_ms"] for r in peers)
    profiles = {name: time_by_part(engines[name], r["ms"]) for name, r in zip(rows, out, strict=True)
                if isinstance(engines[name], Ours)}
    differences = {dtype_name(d): largest_difference(engines[f"mvGPT eager, {dtype_name(d)}"],
                                                     engines[f"mvGPT C step, {dtype_name(d)}"]) for d in dtypes}
    out += rerun_rows(model32.config, threads, dtypes, args.quick)
    python_us = {name: e.python_us() for name, e in engines.items() if isinstance(e, LlamaCpp)}
    for e in engines.values():
        if isinstance(e, LlamaCpp):
            e.close()
    return out, profiles, {"max_abs_logit_diff": differences, "llama_cpp_python_us": python_us}


def rerun_rows(config: GPTConfig, threads: int, dtypes: list[torch.dtype], quick: bool) -> list[dict]:
    """The other way to write a token past the window: learned positions re-run the whole window (the
    same shape, random weights), eagerly, against its compute floor: its flops at the matrix-product
    peak measured now, at this thread count, in its dtype (a 256-row product runs near that peak)."""
    torch.manual_seed(0)
    learned = GPT(replace(config, rope=False)).eval()
    prompt = bench.random_tokens((1, config.block_size), config.vocab_size, torch.device("cpu"), seed=5)
    rows = []
    for d in dtypes:
        model = copy.deepcopy(learned).to(d)
        peak = matmul_flops("cpu", 1024 if quick else 2048, d, repeats=3 if quick else 5)
        ms = 1e3 * bench.generate_seconds_per_token(model, prompt, False, 2, 3 if quick else 5)
        floor_ms = 1e3 * forward_flops(config, config.block_size) / peak
        rows.append({"name": f"mvGPT re-run window, {dtype_name(d)}", "engine": "mvGPT", "step": "re-run window",
                     "weights": dtype_name(d), "threads": threads, "ms": ms, "compute_floor_ms": floor_ms,
                     "peak_flops": peak, "over_floor": ms / floor_ms})
    return rows


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", nargs="?", help="a rope checkpoint (default: random weights of the shape below)")
    p.add_argument("--data-dir", default="data", help="with a checkpoint: where its tokenizer is")
    p.add_argument("--threads", type=int, nargs="+", default=[torch.get_num_threads()],
                   help="thread counts, each for both engines (default: torch's)")
    p.add_argument("--rounds", type=int, default=16, help="rounds of turns; the median of each engine's")
    p.add_argument("--steps", type=int, default=8, help="tokens each engine writes per turn")
    p.add_argument("--quick", action="store_true", help="smaller ceilings (bench.py --quick's)")
    p.add_argument("--note", default="", help="a line on the conditions, kept with the figures")
    p.add_argument("--json", help="write the figures here")
    for flag, default in (("--n-layer", 6), ("--n-head", 6), ("--n-embd", 384), ("--block-size", 256),
                          ("--vocab-size", 8192)):
        p.add_argument(flag, type=int, default=default)
    args = p.parse_args(argv)
    started = time.perf_counter()

    if args.checkpoint:
        model, _ = load_model(args.checkpoint, "cpu")
        tokenizer, weights = Tokenizer.load(Path(args.data_dir) / "tokenizer.json"), Path(args.checkpoint).name
    else:
        torch.manual_seed(0)
        config = GPTConfig(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, block_size=args.block_size,
                           vocab_size=args.vocab_size, rope=True)
        model, tokenizer, weights = GPT(config), synthetic_tokenizer(args.vocab_size), "random (seed 0)"
    model.eval()
    if not model.config.rope:
        raise SystemExit("error: this compares the sliding cache, which needs a rope model: pick a rope checkpoint")
    missing = llama_cpp_missing()
    print(machine(), f"; llama.cpp: {missing or 'llama-cpp-python ' + __import__('llama_cpp').__version__}")
    ceilings = bench.with_threads(max(args.threads), lambda: bench.measure_ceilings(torch.device("cpu"), args.quick,
                                                                        max(args.threads)))
    print(f"read bandwidth {ceilings['read_bandwidth'] / 1e9:.1f} GB/s "
          f"(1 thread {ceilings.get('read_bandwidth_1_thread', ceilings['read_bandwidth']) / 1e9:.1f})", flush=True)
    rows, profiles, checks = [], {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        if not missing:
            files = {"f32": export_gguf(model, tokenizer, Path(tmp) / "f32.gguf"),
                     "f16": export_gguf(model, tokenizer, Path(tmp) / "f16.gguf", f16=True)}
        for threads in args.threads:
            got, prof, check = measure(model, files, threads, args, ceilings)
            rows += got
            profiles[str(threads)], checks[str(threads)] = prof, check
            for r in got:
                vs = f", {r['over_llama_cpp']:.2f}x llama.cpp" if "over_llama_cpp" in r else ""
                cpu = f" (CPU {r['cpu_ms']:.2f})" if "cpu_ms" in r else ""
                floor = r.get("floor_ms", r.get("compute_floor_ms"))
                print(f"{threads} thread(s), {r['name']}: {r['ms']:.2f} ms/token{cpu}, "
                      f"{r['over_floor']:.2f}x its floor of {floor:.2f}{vs}", flush=True)
    result = {
        "machine": machine(), "threads": args.threads, "torch": torch.__version__,
        "llama_cpp": None if missing else __import__("llama_cpp").__version__, "llama_cpp_missing": missing,
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "note": args.note,
        "command": shlex.join(["python", "dev/decode_vs_llama.py", *(sys.argv[1:] if argv is None else argv)]),
        "config": asdict(model.config), "weights": weights, "held": model.config.block_size - 1,
        "rounds": args.rounds, "steps": args.steps, "ceilings": ceilings, "rows": rows, "profiles": profiles,
        "checks": checks, "goals": GOALS, "seconds": time.perf_counter() - started,
    }
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
