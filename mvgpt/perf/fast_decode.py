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
`cache_losses` call. The scripts that decode take `--decode-step {auto,model,c}` (`add_decode_step_arg`),
and `use_decode_step` puts a `FastDecode` in the model's place as it asks, saying which step decodes. The
C step is an optimisation, never a failure: where it does not build (no compiler, one that fails, hangs
or makes no library that loads) the model's own step decodes, and the line says why. The logits are the
eager step's up to float rounding (the sums are added in another order: tests/test_fast_decode.py holds
them to a tolerance, and greedy tokens to equality).

Examples:
    model.decode = FastDecode(model)                 # builds now; model.generate(...) then uses it
    print(use_decode_step(model, "auto", 5000))      # the same where it pays for 5000 tokens, and says so
    CC='ccache gcc' python scripts/sample.py ...     # $CC is run as the shell splits it
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from contextlib import suppress
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
BUILD_TIMEOUT_S = 60.0  # the build takes a fraction of a second: a compiler still at it after a minute has hung


def compiler() -> list[str] | None:
    """The C compiler's command: $CC split as the shell splits it (`CC='ccache gcc'`, `CC='gcc -O2'` run as
    typed), else the first of cc, gcc, clang on the PATH (None: none). A $CC that is not a command here is
    still returned: building with it then says so."""
    given = os.environ.get("CC", "").strip()
    if given:
        try:
            return shlex.split(given)
        except ValueError:  # an unclosed quote: one word, which then cannot be run, and the build says so
            return [given]
    return next(([found] for name in ("cc", "gcc", "clang") if (found := shutil.which(name))), None)


def c_builds_here(device: torch.device | str) -> bool:
    """Whether the C step can run here: on a CPU, on Linux or macOS, with a C compiler."""
    return torch.device(device).type == "cpu" and platform.system() in ("Linux", "Darwin") and compiler() is not None


def run_compiler(command: list[str], name: str) -> subprocess.CompletedProcess:
    """One run of the compiler, stopped (it and what it started: a driver's cc1 too) after BUILD_TIMEOUT_S.
    Raises RuntimeError, in one line, where it cannot be run or takes longer."""
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # a group of its own, to stop as one
    except OSError as error:  # not there, not executable, not a program: named as given, path and all
        raise RuntimeError(f"{command[0]} could not be run ({error.strerror or error}): set CC to a C compiler, "
                           "or install one (cc, gcc or clang)") from None
    with proc:
        try:
            out, err = proc.communicate(timeout=BUILD_TIMEOUT_S)
        except BaseException as error:  # the time is up, or Ctrl-C: nothing of the build runs on
            with suppress(ProcessLookupError):  # it may have ended on its own meanwhile
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            if isinstance(error, subprocess.TimeoutExpired):
                raise RuntimeError(f"{name} was still building {SOURCE.name} after {BUILD_TIMEOUT_S:g} s, so it "
                                   "was stopped: set CC to a compiler that works") from None
            raise
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


@cache
def library() -> ctypes.CDLL:
    """mvgpt/perf/one_token.c, built for this machine into a folder of this process's own, and loaded.
    Raises RuntimeError, in one line, where it is not built: no compiler, a compiler that cannot be run,
    fails with every set of flags (its last words), hangs, or makes no library, or one that does not load
    or has no `one_token` in it."""
    if platform.system() not in ("Linux", "Darwin"):
        raise RuntimeError(f"the C step is built on Linux and macOS, not {platform.system()}")
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler: install one (cc, gcc or clang), or set CC")
    name = Path(cc[0]).name
    folder = Path(tempfile.mkdtemp(prefix="mvgpt-"))
    out = folder / "one_token.so"
    try:
        for flags in FLAG_SETS:
            command = [*cc, "-O2", *flags, "-ffp-contract=fast", "-shared", "-fPIC", str(SOURCE), "-o", str(out), "-lm"]
            done = run_compiler(command, name)
            if done.returncode == 0:
                break
        else:
            last_words = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise RuntimeError(f"{name} could not build {SOURCE.name}: {last_words}")
        if not out.is_file():
            raise RuntimeError(f"{name} said it built {SOURCE.name} but made no {out.name}: set CC to a C compiler")
        try:
            lib = ctypes.CDLL(str(out))
        except OSError as error:  # dlopen's words begin with the file's path, gone in a moment: left out
            why = str(error).removeprefix(f"{out}: ")
            raise RuntimeError(f"{name} made a {out.name} that does not load ({why}): set CC to a C compiler "
                               "for this machine") from None
    finally:  # loaded, or not built: the file is no longer needed, and nothing is left behind
        shutil.rmtree(folder, ignore_errors=True)
    for symbol in ("one_token", "matvec"):
        if not hasattr(lib, symbol):
            raise RuntimeError(f"{name} made a {out.name} without {symbol} in it: set CC to a C compiler")
    lib.one_token.argtypes = [ctypes.POINTER(ModelWeightsC), ctypes.POINTER(StepArgsC)]
    lib.one_token.restype = ctypes.c_int
    P, I64, INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int  # noqa: N806
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


# one_token.c's three structs, field for field: a weight is its address (None: NULL)
class BlockWeightsC(ctypes.Structure):
    """one_token.c's BlockWeights: ln_1_weight, ln_1_bias, qkv_weight, ... in BlockWeights' order."""

    _fields_ = [(f"{name}_{part}", ctypes.c_void_p) for name in BlockWeights._fields for part in ("weight", "bias")]


class ModelWeightsC(ctypes.Structure):
    """one_token.c's ModelWeights: the shape, the dtype (DTYPES), the weights."""

    _fields_ = [("n_layer", ctypes.c_int64), ("n_embd", ctypes.c_int64), ("n_head", ctypes.c_int64),
                ("vocab_size", ctypes.c_int64), ("dtype", ctypes.c_int), ("wte", ctypes.c_void_p),
                ("wpe", ctypes.c_void_p), ("blocks", ctypes.POINTER(BlockWeightsC)), ("ln_f_weight", ctypes.c_void_p),
                ("ln_f_bias", ctypes.c_void_p), ("lm_head", ctypes.c_void_p)]


class StepArgsC(ctypes.Structure):
    """one_token.c's StepArgs: one call's tokens, angles or position, cache, logits, scratch and threads."""

    _fields_ = [("tokens", ctypes.c_void_p), ("batch", ctypes.c_int64), ("cos", ctypes.c_void_p),
                ("sin", ctypes.c_void_p), ("angles_dtype", ctypes.c_int), ("position", ctypes.c_int64),
                ("cache_k", ctypes.c_void_p), ("cache_v", ctypes.c_void_p), ("stride_layer", ctypes.c_int64),
                ("stride_batch", ctypes.c_int64), ("stride_head", ctypes.c_int64), ("held", ctypes.c_int64),
                ("logits", ctypes.c_void_p), ("scratch", ctypes.c_void_p), ("threads", ctypes.c_int)]


STEP_MODULES = (GPT, Block, CausalSelfAttention, MLP, nn.ModuleList, nn.Linear, nn.LayerNorm, nn.Embedding)


def not_covered(model: GPT) -> str | None:
    """Why one_token.c does not compute what this model's forward does (None: it does), in one line. It
    knows the episode's modules only: a LoRA layer, or an MLP with a forward of its own
    (gguf.ggml_activation), is left to the model; and float32 or bf16 weights on a CPU. The table of
    angles may be any. Whether it builds on this machine is `build_error`'s to say.

    Example: not_covered(model.half()) -> 'its weights are float16, not float32 or bfloat16'
    """
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
    return None


class FastDecode:
    """GPT.decode in C: `fast(token, cache)` -> logits (B, 1, vocab), the cache moved on by one.

    Steps it does not cover go to the model's own forward: more than one token, a model it does not cover
    (`not_covered`; or one moved since to another device or dtype) or a machine where it does not build
    (`why_not` says which), a cache not of the weights' dtype or not laid out as KVCache lays it for these
    tokens, a learned position past the table (the model says why, or does it). Builds
    mvgpt/perf/one_token.c on creation (once per process), and `build_s` says how long that took. Not an
    nn.Module: set on a model as `model.decode`, it adds nothing to its state_dict.
    """

    def __init__(self, model: GPT) -> None:
        self.model = model
        t0 = time.perf_counter()
        self.why_not = not_covered(model) or build_error()  # builds the C step, the first time
        self.lib = library() if self.why_not is None else None
        self.build_s = time.perf_counter() - t0
        covered = self.why_not is None  # model.to() moves these two with the rest:
        self.ends = (model.wte.weight, model.blocks[-1].mlp.proj.weight) if covered else ()
        self.table: tuple = (None, (), None)  # where the ends were; the weights (aliases); the struct
        self.scratch = threading.local()  # each thread its own: serve.py's requests run on threads

    def weights(self) -> ModelWeightsC:
        """The model as one_token.c reads it, made again when model.to() moved the weights. The table holds
        aliases of the weights, so that C never reads memory freed under it: a weight whose storage was
        replaced on its own (not by model.to) is read as it was; make a new FastDecode then."""
        where = tuple(t.data_ptr() for t in self.ends)
        if self.table[0] != where:
            config = self.model.config
            wte, blocks, ln_f, lm_head = step_weights(self.model)
            wpe = None if config.rope else self.model.wpe.weight
            alias = lambda t: None if t is None else t.detach()  # noqa: E731
            wte, wpe, lm_head, ln_f = alias(wte), alias(wpe), alias(lm_head), tuple(map(alias, ln_f))
            blocks = [[alias(t) for pair in block for t in pair] for block in blocks]
            aliases = [wte, wpe, lm_head, *ln_f, *(t for block in blocks for t in block)]
            assert all(t is None or (t.is_contiguous() and t.dtype == wte.dtype) for t in aliases)
            rows = (BlockWeightsC * len(blocks))(*(BlockWeightsC(*map(address, block)) for block in blocks))
            struct = ModelWeightsC(config.n_layer, config.n_embd, config.n_head, config.vocab_size, DTYPES[wte.dtype],
                                   address(wte), address(wpe), ctypes.cast(rows, ctypes.POINTER(BlockWeightsC)),
                                   *map(address, ln_f), address(lm_head))
            self.table = (where, (aliases, rows), struct)
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
        cos = sin = None
        if config.rope:  # the position's angles, from the model's table (a scaled one too)
            cos, sin = (a.contiguous() if a.dtype in DTYPES else a.float() for a in model.angles(p, 1))
        cache.reserve(1)
        B, held, threads = token.shape[0], cache.length, torch.get_num_threads()
        tokens = token if token.dtype == torch.int64 and token.is_contiguous() else token.to(torch.int64).contiguous()
        logits = torch.empty(B, 1, config.vocab_size, dtype=weight.dtype)
        C, H = config.n_embd, config.n_head  # noqa: N806
        scratch = self.floats(10 * B * C + B * H * (held + 1) + threads * B * 4 * C)  # one_token.c says what for
        row = cache.offset * cache.k.stride(3) * cache.k.element_size()  # the first row held, in bytes
        args = StepArgsC(tokens.data_ptr(), B, address(cos), address(sin), DTYPES[cos.dtype] if cos is not None else 0,
                         p, cache.k.data_ptr() + row, cache.v.data_ptr() + row, *cache.k.stride()[:3], held,
                         logits.data_ptr(), scratch.data_ptr(), threads)
        return StepCall(self.lib, self.weights(), args, logits, (tokens, cos, sin, scratch, cache))


class StepCall(NamedTuple):
    """One call of one_token.c with its arguments: `run()` returns 0, or 1 + the first sequence whose token
    is not in the vocabulary. `keep`: the tensors its addresses point into, kept alive with it."""

    lib: ctypes.CDLL
    weights: ModelWeightsC
    args: StepArgsC
    logits: torch.Tensor
    keep: tuple

    def run(self) -> int:
        return self.lib.one_token(ctypes.byref(self.weights), ctypes.byref(self.args))


# ----------------------------------------------------------------------------------------------
# Where it pays: the time it saves against the time it takes to build

# Measured side by side by dev/decode_vs_llama.py on an AMD EPYC (AVX512-BF16, no AMX), 2 threads
# (results/amd-epyc/decode.json): (eager ms/token, C step ms/token, seconds to build it). The build took
# 0.26 s there, once per process. So the C step pays after about 90 tokens in float32 and 130 in bf16:
# for any story sample.py writes but the shortest, and for every read context.py makes.
MEASURED = {"float32": (4.30, 1.38, 0.26), "bfloat16": (2.59, 0.54, 0.26)}


def break_even_tokens(eager_ms: float, fast_ms: float, build_s: float) -> float | None:
    """After how many tokens the fast step has saved the time it took to build (None: never)."""
    saved_s = (eager_ms - fast_ms) / 1e3
    return build_s / saved_s if saved_s > 0 else None


def fast_decode_pays(device: torch.device | str, dtype: torch.dtype, tokens: int,
                     measured: dict[str, tuple[float, float, float]] | None = None) -> bool:
    """Whether building the C step pays for itself over `tokens` steps on this device, by the figures
    `measured` for its dtype (eager ms, C step ms, build seconds; default MEASURED)."""
    figures = (MEASURED if measured is None else measured).get(dtype_name(dtype))
    if figures is None or not c_builds_here(device):
        return False
    tokens_needed = break_even_tokens(*figures)
    return tokens_needed is not None and tokens >= tokens_needed


def built(fast: FastDecode) -> str:
    """What a script says of the C step: its file, and the seconds its build took (once per process)."""
    name = "mvgpt/perf/one_token.c"
    return f"{name}, built in {fast.build_s:.1f} s" if fast.build_s >= 0.05 else name


def c_step(model: GPT) -> tuple[FastDecode | None, str]:
    """The C step for this model, built now (once per process), and what a script says of it: its file
    and build time; or None and why not, in one line (a model it does not cover, a build that failed)."""
    why = not_covered(model)
    fast = FastDecode(model) if why is None else None
    why = why or fast.why_not
    return (fast, f"the C step ({built(fast)})") if why is None else (None, why)


# ----------------------------------------------------------------------------------------------
# Choosing the step: --decode-step, the same in every script that decodes

DECODE_STEPS = ("auto", "model", "c")
MODEL_STEP = "decoding with model.py's step"


def add_decode_step_arg(parser: argparse.ArgumentParser, default: str = "auto", help: str | None = None) -> None:
    """--decode-step {auto,model,c}: which one-token step decodes (`use_decode_step` puts it in place)."""
    parser.add_argument("--decode-step", choices=DECODE_STEPS, default=default, help=help or (
        "the one-token step that writes each token: model (model.py's own, as the video wrote it), c (the C "
        "step, mvgpt/perf/one_token.c, wherever it builds), auto (the C step where its build pays for the "
        "tokens asked for, on rope models; default %(default)s)"))


def use_decode_step(model: GPT, choice: str, tokens: int) -> str:
    """Put the step `choice` asks for (--decode-step) in place of model.decode, for `tokens` one-token steps,
    and return the line a script says first: which step decodes, and why not the C step where it is not.

    model: model.py's own step. c: the C step wherever it builds and covers the model. auto: the C step
    where its build pays for `tokens` (fast_decode_pays), on a rope model (past the window a model with
    learned positions re-runs it, and its one-token steps stop). Anything that keeps the C step from
    building (no compiler, one that fails or hangs, a library that does not load) leaves the model's step.

    Example: use_decode_step(model, "auto", 600) -> 'decoding with the C step (mvgpt/perf/one_token.c, built
    in 0.3 s)'
    """
    if choice == "model":
        return f"{MODEL_STEP} (--decode-step model)"
    weight = model.wte.weight
    if choice == "auto" and not model.config.rope:
        return f"{MODEL_STEP}: auto takes the C step for rope models, whose cache slides (--decode-step c: here too)"
    if (choice == "auto" and not_covered(model) is None and c_builds_here(weight.device)
            and not fast_decode_pays(weight.device, weight.dtype, tokens)):
        return f"{MODEL_STEP}: building the C step would not pay for {tokens} tokens (--decode-step c: build it anyway)"
    fast, said = c_step(model)
    if fast is None:
        return f"{MODEL_STEP}, not the C step: {said}"
    model.decode = fast
    return f"decoding with {said}"
