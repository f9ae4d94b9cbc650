"""A faster one-token step for decoding with the KV cache: the model's own step, written out in C.

At batch 1 a new token multiplies a vector by every weight matrix, reading each weight once and doing
two flops with it, so the step is bounded by memory (mvgpt/device.py counts the bytes). The eager
step is far from that bound: it is about a hundred small PyTorch operations, each dispatched from
Python, and on an AMD EPYC the math library's matrix-vector products read a matrix well below the
memory's speed (bf16's slower still).

mvgpt/perf/one_token.c is the same step as one C function: one call per token, one parallel region, each
weight read once at close to the memory's speed, in float32 or bf16, the new token's keys and values
written straight into the cache. This file builds it with the machine's C compiler (`cc`, a fraction
of a second, once per process), and calls it through ctypes. What stays in Python is the cache's
bookkeeping (`reserve`, `advance`, on the model's own KVCache or a subclass of it) and the position's
angles, read from the model's table (so any table of angles will do, scaled ones too).

It enters through one hook: `GPT.decode`, the one-token step `generate` and context.py's
`cache_losses` call. `use_fast_decode(model, tokens)` puts a `FastDecode` in its place on that model,
where it pays. The logits are the eager step's up to float rounding (the sums are added in another
order: tests/test_fast_decode.py holds them to a tolerance, and greedy tokens to equality).

Examples:
    model.decode = FastDecode(model)                 # builds now; model.generate(...) then uses it
    use_fast_decode(model, tokens=5000)              # the same, where it pays for 5000 tokens
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
from functools import cache
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn as nn

from mvgpt.device import dtype_name
from mvgpt.model import GPT, MLP, Block, CausalSelfAttention, KVCache

SOURCE = Path(__file__).with_name("one_token.c")
DTYPES = {torch.float32: 0, torch.bfloat16: 1}  # the C file's F32, BF16
# -march=native: the CPU's own vectors; -fopenmp: its cores; -ffp-contract=fast: a multiply and an add
# in one instruction. Where a compiler refuses one (Apple's clang has no OpenMP), the next set.
# OpenMP, not threads of its own: the library links libgomp.so.1, which resolves to the copy torch has
# loaded already, so the step shares torch's threads instead of competing with them for the cores (a
# pool of its own was tried: after any torch operation, torch's threads spun on for milliseconds and
# the step took twice as long). libgomp's one weakness: a step run on any thread but the process's
# first waits on sleeping threads at every stage (about twice as slow), as torch's own operations do.
FLAG_SETS = (["-march=native", "-fopenmp"], ["-mcpu=native", "-fopenmp"], ["-march=native"], ["-mcpu=native"], [])


def compiler() -> str | None:
    """The C compiler to build with: $CC, else the first of cc, gcc, clang on the PATH (None: none)."""
    names = [os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc", "clang"]
    return next((found for name in names if (found := shutil.which(name))), None)


def c_builds_here(device: torch.device | str) -> bool:
    """Whether the C step can run here: on a CPU, on Linux or macOS, with a C compiler."""
    return torch.device(device).type == "cpu" and platform.system() in ("Linux", "Darwin") and compiler() is not None


@cache
def library() -> ctypes.CDLL:
    """mvgpt/perf/one_token.c, built for this machine into a folder of this process's own, and loaded.
    Raises RuntimeError with the compiler's last words where no set of flags builds it."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler: install one (cc, gcc or clang), or set CC")
    folder = Path(tempfile.mkdtemp(prefix="mvgpt-"))
    out = folder / "one_token.so"
    try:
        for flags in FLAG_SETS:
            cmd = [cc, "-O2", *flags, "-ffp-contract=fast", "-shared", "-fPIC", str(SOURCE), "-o", str(out), "-lm"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode == 0:
                break
        else:
            last_words = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise RuntimeError(f"{Path(cc).name} could not build {SOURCE.name}: {last_words}")
        lib = ctypes.CDLL(str(out))
    finally:  # loaded, or not built: the file is no longer needed, and nothing is left behind
        shutil.rmtree(folder, ignore_errors=True)
    P, I64, INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int  # noqa: N806
    lib.one_token.argtypes = [P, INT, I64, I64, I64, I64, P, I64, P, P, INT, P, P, P, I64, I64, I64, I64, P, P, INT]
    lib.one_token.restype = INT
    lib.matvec.argtypes = [P, I64, P, P, I64, I64, INT, P, P, INT]
    lib.matvec.restype = None
    return lib


@cache
def build_error() -> str | None:
    """Why the C step cannot be built here, in one line (None: it is built, once per process)."""
    try:
        library()
    except RuntimeError as error:
        return str(error)
    return None


Pair = tuple[torch.Tensor, torch.Tensor | None]  # a layer's weight and bias


class BlockWeights(NamedTuple):
    """One block's weights, as (weight, bias) pairs named after the modules they come from."""

    ln_1: Pair
    qkv: Pair
    proj: Pair
    ln_2: Pair
    fc: Pair
    mlp_proj: Pair


def step_weights(model: GPT) -> tuple[torch.Tensor, tuple[BlockWeights, ...], Pair, torch.Tensor]:
    """The weights the step reads: the token embedding, each block's, the last norm's, the output layer's.

    The model's own parameters (a later model.to(dtype) is seen; a layer wrapped later, by LoRA, is not).
    """
    pair = lambda m: (m.weight, m.bias)  # noqa: E731
    blocks = tuple(BlockWeights(pair(b.ln_1), pair(b.attn.qkv), pair(b.attn.proj), pair(b.ln_2), pair(b.mlp.fc),
                                pair(b.mlp.proj)) for b in model.blocks)
    return model.wte.weight, blocks, pair(model.ln_f), model.lm_head.weight


def address(t: torch.Tensor | None) -> int | None:
    """Where a tensor's data starts, for C (None: NULL)."""
    return None if t is None else t.data_ptr()


def flat_weights(model: GPT) -> list[torch.Tensor | None]:
    """step_weights in one list, in the order one_token.c reads them (a missing bias is None)."""
    wte, blocks, ln_f, lm_head = step_weights(model)
    return [wte, *(t for block in blocks for pair in block for t in pair), *ln_f, lm_head]


STEP_MODULES = (GPT, Block, CausalSelfAttention, MLP, nn.ModuleList, nn.Linear, nn.LayerNorm, nn.Embedding)


def compilable(model: GPT) -> str | None:
    """Why one_token.c would not compute what this model's forward does (None when it would). It knows
    the episode's modules only: a LoRA layer, or an MLP with a forward of its own (gguf.ggml_activation),
    is left to the model; and float32 or bf16 weights on a CPU. The table of angles may be any. Last, it
    must build here (the first call builds it)."""
    weight = model.wte.weight
    if weight.device.type != "cpu":
        return f"its weights are on {weight.device.type}, not the CPU"
    if weight.dtype not in DTYPES:
        return f"its weights are {dtype_name(weight.dtype)}, not float32 or bfloat16"
    for name, module in model.named_modules():
        if name == "angles" or name.startswith("angles."):
            continue
        if type(module) not in STEP_MODULES:
            return f"{name} is a {type(module).__name__}"
        if "forward" in vars(module):
            return f"{name or 'the model'} has a forward of its own"
    return build_error()


class FastDecode:
    """GPT.decode in C: `fast(token, cache)` -> logits (B, 1, vocab), the cache moved on by one.

    Steps it does not cover go to the model's own forward: more than one token, a model `compilable`
    refuses (or one moved since to another device or dtype), a cache not of the weights' dtype or not
    laid out as KVCache lays it for these tokens, a learned position past the table (the model says
    why, or does it). Builds mvgpt/perf/one_token.c on creation (once per
    process), and `warmup_s` says how long that took. Not an nn.Module: set on a model as
    `model.decode`, it adds nothing to its state_dict.
    """

    def __init__(self, model: GPT) -> None:
        self.model = model
        t0 = time.perf_counter()
        self.why_not = compilable(model)  # builds the C step, the first time
        self.lib = library() if self.why_not is None else None
        self.warmup_s = time.perf_counter() - t0
        covered = self.why_not is None  # model.to() moves these two with the rest:
        self.ends = (model.wte.weight, model.blocks[-1].mlp.proj.weight) if covered else ()
        self.table: tuple = (None, (), None)  # where the ends were; the weights (aliases); their addresses
        self.scratch = threading.local()  # each thread its own: serve.py's requests run on threads

    def pointers(self) -> ctypes.Array:
        """The weights' addresses, in one_token.c's order, made again when model.to() moved them. The table
        holds aliases of the weights, so that C never reads memory freed under it: a weight whose storage
        was replaced on its own (not by model.to) is read as it was; make a new FastDecode then."""
        where = tuple(t.data_ptr() for t in self.ends)
        if self.table[0] != where:
            aliases = tuple(t if t is None else t.detach() for t in flat_weights(self.model))
            assert all(t is None or (t.is_contiguous() and t.dtype == aliases[0].dtype) for t in aliases)
            self.table = (where, aliases, (ctypes.c_void_p * len(aliases))(*map(address, aliases)))
        return self.table[2]

    def floats(self, n: int) -> torch.Tensor:
        """This thread's scratch of at least n floats, kept from call to call."""
        buffer = getattr(self.scratch, "buffer", None)
        if buffer is None or buffer.numel() < n:
            self.scratch.buffer = buffer = torch.empty(n)
        return buffer

    @torch.no_grad()
    def __call__(self, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
        model, config, weight = self.model, self.model.config, self.model.wte.weight
        k, v = cache.k, cache.v
        laid_out = (config.n_layer, token.shape[0], config.n_head, k.shape[3], config.head_size)  # as KVCache lays it
        if (self.why_not is not None or token.shape[1] != 1 or weight.dtype not in DTYPES
                or not weight.device.type == token.device.type == k.device.type == "cpu"
                or k.dtype != weight.dtype or v.dtype != k.dtype or k.shape != laid_out or v.shape != laid_out
                or not (k.is_contiguous() and v.is_contiguous())
                or (not config.rope and cache.position >= model.wpe.weight.shape[0])):
            return model(token, cache=cache, last_only=True)[0]
        call = self.prepare(token, cache)
        if bad := call.run():
            raise IndexError(f"token {token[bad - 1, 0].item()} is not in the vocabulary of {model.config.vocab_size}")
        cache.advance(1)
        return call.logits

    def prepare(self, token: torch.Tensor, cache: KVCache) -> StepCall:
        """Room for the token in the cache, and the C call that writes it there, ready to run."""
        model, config = self.model, self.model.config
        weight, p = model.wte.weight, cache.position
        cos = sin = position = None
        if config.rope:  # the position's angles, from the model's table (a scaled one too)
            cos, sin = (a.contiguous() if a.dtype in DTYPES else a.float() for a in model.angles(p, 1))
        else:
            position = model.wpe.weight[p]
        cache.reserve(1)
        B, held, threads = token.shape[0], cache.length, torch.get_num_threads()
        tokens = token if token.dtype == torch.int64 and token.is_contiguous() else token.to(torch.int64).contiguous()
        logits = torch.empty(B, 1, config.vocab_size, dtype=weight.dtype)
        C, H = config.n_embd, config.n_head  # noqa: N806
        scratch = self.floats(10 * B * C + B * H * (held + 1) + threads * B * 4 * C)  # one_token.c says what for
        row = cache.offset * cache.k.stride(3) * cache.k.element_size()  # the first row held, in bytes
        sL, sB, sH = cache.k.stride()[:3]  # noqa: N806
        args = (self.pointers(), DTYPES[weight.dtype], config.n_layer, config.n_embd, config.n_head,
                config.vocab_size, tokens.data_ptr(), B, address(cos), address(sin),
                DTYPES[cos.dtype] if cos is not None else 0, address(position), cache.k.data_ptr() + row,
                cache.v.data_ptr() + row, sL, sB, sH, held, logits.data_ptr(), scratch.data_ptr(), threads)
        return StepCall(self.lib, args, logits, (tokens, cos, sin, position, scratch, cache))


class StepCall(NamedTuple):
    """One call of one_token.c with its arguments: `run()` returns 0, or 1 + the first sequence whose token
    is not in the vocabulary. `keep`: the tensors its addresses point into, kept alive with it."""

    lib: ctypes.CDLL
    args: tuple
    logits: torch.Tensor
    keep: tuple

    def run(self) -> int:
        return self.lib.one_token(*self.args)


# ----------------------------------------------------------------------------------------------
# Where it pays: the time it saves against the time it takes to build

# Measured side by side by dev/decode_vs_llama.py on an AMD EPYC (AVX512-BF16, no AMX), 2 threads
# (results/amd-epyc/decode.json): (eager ms/token, C step ms/token, seconds to build it). The build took
# 0.26 s there, once per process. So the C step pays after about 90 tokens in float32 and 130 in bf16:
# for any story sample.py writes but the shortest, and for every read context.py makes.
MEASURED = {"float32": (4.30, 1.38, 0.26), "bfloat16": (2.59, 0.54, 0.26)}


def break_even_tokens(eager_ms: float, fast_ms: float, warmup_s: float) -> float | None:
    """After how many tokens the fast step has saved the time it took to build (None: never)."""
    saved_s = (eager_ms - fast_ms) / 1e3
    return warmup_s / saved_s if saved_s > 0 else None


def fast_decode_pays(device: torch.device | str, dtype: torch.dtype, tokens: int,
                     measured: dict[str, tuple[float, float, float]] | None = None) -> bool:
    """Whether building the C step pays for itself over `tokens` steps on this device, by the figures
    `measured` for its dtype (eager ms, C step ms, build seconds; default MEASURED)."""
    figures = (MEASURED if measured is None else measured).get(dtype_name(dtype))
    if figures is None or not c_builds_here(device):
        return False
    tokens_needed = break_even_tokens(*figures)
    return tokens_needed is not None and tokens >= tokens_needed


def eager_because(model: GPT, tokens: int) -> str | None:
    """Why a model keeps its eager step where the C step would pay for `tokens` steps (a LoRA layer, say),
    so that a script can say so; None where it does not pay anyway, or the model is one it covers."""
    weight = model.wte.weight
    return compilable(model) if fast_decode_pays(weight.device, weight.dtype, tokens) else None


def built(fast: FastDecode) -> str:
    """What a script says of the C step: its file, and the seconds its build took (once per process)."""
    name = "mvgpt/perf/one_token.c"
    return f"{name}, built in {fast.warmup_s:.1f} s" if fast.warmup_s >= 0.05 else name


def use_fast_decode(model: GPT, tokens: int) -> FastDecode | None:
    """Put the C step in place of model.decode where it pays for `tokens` one-token steps (and the model
    is one it covers); builds it now. Returns it, or None where the model keeps its own."""
    weight = model.wte.weight
    if not fast_decode_pays(weight.device, weight.dtype, tokens):
        return None
    fast = FastDecode(model)  # builds the C step here, the first time: warmup_s says how long it took
    if fast.why_not is not None:
        return None
    model.decode = fast
    return fast
