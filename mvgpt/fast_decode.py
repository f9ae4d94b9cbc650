"""A faster one-token step for decoding with the KV cache: the model's own step, compiled whole.

At batch 1 a new token multiplies a vector by every weight matrix, reading each weight once and doing
two flops with it, so the step is bounded by memory (mvgpt/bench.py counts the bytes). The eager
step is far from that bound on some CPUs: it is about a hundred small PyTorch operations, each
dispatched from Python, and its matrix-vector products go to the math library, which reads a matrix
well below the memory's bandwidth on an AMD EPYC (MKL's float32 product at a fraction of it, bf16's
slower still).

Here the same step is one function of plain tensor operations, compiled by torch.compile into one
graph: a matrix-vector product is written as a multiply and a sum, which inductor turns into a C++
loop over the weights that reads them near the memory's speed, in float32 or bf16, with the norms,
GELU, rotations and attention fused around them. What stays in Python is the cache's bookkeeping
(`reserve`, `slide`, `advance`, on the model's own KVCache or a subclass of it): the graph reads the
held keys and values, returns the new token's, and they are written after it (a write into the
cache inside the graph would copy the whole cache at every token).

It enters through one hook: `GPT.decode`, the one-token step `generate` and context.py's
`cache_losses` call. `use_fast_decode(model)` puts a `FastDecode` in its place on that model. The
logits are the eager step's up to float rounding (the sums are added in another order:
tests/test_fast_decode.py holds them to a tolerance, and greedy tokens to equality). Compiling
takes seconds with inductor's on-disk cache warm, tens of seconds cold, so `fast_decode_pays`
weighs it against the tokens to write.

Examples:
    model.decode = FastDecode(model)                 # compiles now; model.generate(...) then uses it
    use_fast_decode(model, tokens=5000)              # the same, where it pays for 5000 tokens
"""

from __future__ import annotations

import time
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from mvgpt.model import GPT, MLP, Block, CausalSelfAttention, KVCache, rotate
from mvgpt.perf import inductor_builds_here
from mvgpt.precision import dtype_name

# Inductor inlines cheap elementwise work into the loop that reads it. Into a matrix-vector product's
# loop over the weights that means the norm, or the GELU, before it is computed again for every
# output row (384 to 8192 times): writing anything of more than 8 operations to memory first made
# the step's products 1.7 times faster in float32 and 2.5 times in bf16 (1 thread, AMD EPYC). A
# multiply and an add in one instruction (FMA, one rounding instead of two): bf16's loop 1.2 times.
# And every loop split among the threads: by default a loop of under 512 elements runs on one
# thread while the others wait at its end, attention over the 6 heads among them.
INDUCTOR_OPTIONS = {"realize_opcount_threshold": 8, "cpp.enable_floating_point_contract_flag": "fast",
                    "cpp.min_chunk_size": 1}


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
    """The weights one_token reads: the token embedding, each block's, the last norm's, the output layer's.

    Tensors, not modules: torch.compile then guards the graph by their shapes and dtypes alone, which
    is quick to check at every token, and one graph serves every model of the same shape. They are
    the model's own parameters (a later model.to(dtype) is seen; a layer wrapped later, by LoRA, is not).
    """
    pair = lambda m: (m.weight, m.bias)  # noqa: E731
    blocks = tuple(BlockWeights(pair(b.ln_1), pair(b.attn.qkv), pair(b.attn.proj), pair(b.ln_2), pair(b.mlp.fc),
                                pair(b.mlp.proj)) for b in model.blocks)
    return model.wte.weight, blocks, pair(model.ln_f), model.lm_head.weight


def matvec(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (B, in), float32 -> (B, out) in the weights' dtype, as F.linear: a multiply and a sum, which
    inductor compiles into one loop over the weights (eagerly it would hold the whole product in
    memory: this is for the compiled step only). x comes in float32, so that the loop converts
    only the weights: bf16 weights' loop ran 1.4 times faster so."""
    y = (x[:, None, :] * weight).sum(-1, dtype=torch.float32)
    return (y if bias is None else y + bias).to(weight.dtype)


def norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """LayerNorm in float32 (nn.LayerNorm's default eps, as the model's), whatever the weights' dtype."""
    return F.layer_norm(x.float(), x.shape[-1:], weight.float(), bias.float())


def one_token(
    weights: tuple, token: torch.Tensor, angles: torch.Tensor | None, position: torch.Tensor | None,
    K: torch.Tensor, V: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GPT.forward for one token per sequence with a cache, written for torch.compile.

    weights: step_weights(model); token (B,); angles: cos and sin stacked (2, 1, head/2) for rope,
    or position: the row of the table of positions (1, C); K, V (n_layer, B, H, held, head): the keys
    and values held. Returns the logits (B, 1, vocab) and the new token's keys and values (n_layer,
    B, H, head), for the cache.
    """
    wte, blocks, ln_f, lm_head = weights
    B, C, H = token.shape[0], wte.shape[1], K.shape[2]
    x = wte[token]  # (B, C)
    if position is not None:  # learned positions: add the position's row
        x = x + position
    new_k, new_v = [], []
    for layer, w in enumerate(blocks):
        q, k, v = matvec(norm(x, *w.ln_1), *w.qkv).view(B, 3, H, C // H).unbind(1)  # (B, H, head) each
        if angles is not None:  # rope: turn queries and keys; values never turn
            q, k = rotate(q, angles[0], angles[1]), rotate(k, angles[0], angles[1])
        new_k.append(k)
        new_v.append(v)
        # the held keys' scores and the new key's, one softmax over both, in float32 (as the eager kernel)
        held = (q[:, :, None] * K[layer]).sum(-1, dtype=torch.float32)  # (B, H, held)
        new = (q * k).sum(-1, keepdim=True, dtype=torch.float32)  # (B, H, 1)
        p = (torch.cat([held, new], -1) * (C // H) ** -0.5).softmax(-1).to(v.dtype)  # (B, H, held + 1)
        y = (p[..., :-1, None] * V[layer]).sum(-2) + p[..., -1:] * v  # (B, H, head)
        x = x + matvec(y.reshape(B, C).float(), *w.proj)
        x = x + matvec(F.gelu(matvec(norm(x, *w.ln_2), *w.fc).float()), *w.mlp_proj)
    logits = matvec(norm(x, *ln_f), lm_head)  # (B, vocab); lm_head is the token embedding, tied
    return logits[:, None], torch.stack(new_k), torch.stack(new_v)


STEP_MODULES = (GPT, Block, CausalSelfAttention, MLP, nn.ModuleList, nn.Linear, nn.LayerNorm, nn.Embedding)


def compilable(model: GPT) -> str | None:
    """Why `one_token` would not compute what this model's forward does (None when it would). It
    knows the episode's modules only: a LoRA layer, or an MLP with a forward of its own
    (gguf.ggml_activation), is left to the model. The table of angles may be any (it is read in Python)."""
    for name, module in model.named_modules():
        if name == "angles" or name.startswith("angles."):
            continue
        if type(module) not in STEP_MODULES:
            return f"{name} is a {type(module).__name__}"
        if "forward" in vars(module):
            return f"{name or 'the model'} has a forward of its own"
    return None


class FastDecode:
    """GPT.decode, compiled: `fast(token, cache)` -> logits (B, 1, vocab), the cache moved on by one.

    Steps it does not cover go to the model's own forward: more than one token, a cache holding
    fewer than two (a size of 0 or 1 would compile a graph of its own), a model `compilable` refuses.
    Compiles on creation, and `warmup_s` says how long that took. Not an nn.Module: set on a model
    as `model.decode`, it adds nothing to its state_dict.
    """

    def __init__(self, model: GPT) -> None:
        self.model = model
        self.why_not = compilable(model)
        self.weights = step_weights(model) if self.why_not is None else None
        self.step = torch.compile(one_token, options=INDUCTOR_OPTIONS)
        self.warmup_s = 0.0
        if self.why_not is None:
            t0 = time.perf_counter()
            weight = model.wte.weight
            cache = KVCache(model.config, 1, 2 * model.context, weight.device, weight.dtype)  # as generate makes it
            with torch.no_grad():
                model(torch.zeros(1, 2, dtype=torch.long, device=weight.device), cache=cache)
            for _ in range(2):  # 2 held, then 3: one graph for any number held
                self(torch.zeros(1, 1, dtype=torch.long, device=weight.device), cache)
            self.warmup_s = time.perf_counter() - t0

    @torch.no_grad()
    def __call__(self, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
        model = self.model
        if self.why_not is not None or token.shape[1] != 1 or cache.length < 2:
            return model(token, cache=cache, last_only=True)[0]
        p = cache.position  # as GPT.forward: the angles (or the position's row), then room in the cache
        angles = torch.stack(model.angles(p, 1)) if model.config.rope else None  # copies: no storage offset
        position = None if model.config.rope else model.wpe.weight[p : p + 1].clone()
        cache.reserve(1)
        start, end = cache.offset, cache.offset + cache.length
        K, V = cache.k[:, :, :, start:end], cache.v[:, :, :, start:end]  # views: nothing is copied
        torch._dynamo.mark_dynamic(K, 3)  # how many are held, and where they start: symbols of the graph
        torch._dynamo.mark_dynamic(V, 3)
        logits, k, v = self.step(self.weights, token.reshape(-1).contiguous(), angles, position, K, V)
        cache.k[:, :, :, end] = k
        cache.v[:, :, :, end] = v
        cache.advance(1)
        return logits


# ----------------------------------------------------------------------------------------------
# Where it pays: the time it saves against the time it takes to compile

# Measured side by side by dev/decode_vs_llama.py on an AMD EPYC (AVX512-BF16, no AMX), 2 threads
# (results/amd-epyc/decode.json): (eager ms/token, compiled ms/token, seconds to compile). Compiling took
# 0.5 to 9 s with inductor's on-disk cache warm and 26 s with it empty on a busy host; 10 s stands
# between the two. So compiling pays after about 4,200 tokens in float32 and 6,500 in bf16: not for a
# story of a few hundred, and for context.py's eight streams of three windows (6,144 steps).
MEASURED = {"float32": (3.94, 1.55, 10.0), "bfloat16": (2.40, 0.86, 10.0)}


def break_even_tokens(eager_ms: float, fast_ms: float, warmup_s: float) -> float | None:
    """After how many tokens the compiled step has saved the time it took to compile (None: never)."""
    saved_s = (eager_ms - fast_ms) / 1e3
    return warmup_s / saved_s if saved_s > 0 else None


def fast_decode_pays(device: torch.device | str, dtype: torch.dtype, tokens: int,
                     measured: dict[str, tuple[float, float, float]] = MEASURED) -> bool:
    """Whether compiling the one-token step pays for itself over `tokens` steps on this device, by the
    figures `measured` for its dtype (eager ms, compiled ms, compile seconds). Not measured on a GPU."""
    figures = measured.get(dtype_name(dtype))
    if figures is None or not inductor_builds_here(device):
        return False
    tokens_needed = break_even_tokens(*figures)
    return tokens_needed is not None and tokens >= tokens_needed


def eager_because(model: GPT, tokens: int) -> str | None:
    """Why a model keeps its eager step where compiling would pay for `tokens` steps (a LoRA layer, say),
    so that a script can say so; None where it does not pay anyway, or the model is one it covers."""
    weight = model.wte.weight
    return compilable(model) if fast_decode_pays(weight.device, weight.dtype, tokens) else None


def use_fast_decode(model: GPT, tokens: int) -> FastDecode | None:
    """Put the compiled step in place of model.decode where it pays for `tokens` one-token steps (and
    the model is one it covers); compiles now. Returns it, or None where the model keeps its own."""
    weight = model.wte.weight
    if compilable(model) is not None or not fast_decode_pays(weight.device, weight.dtype, tokens):
        return None
    model.decode = FastDecode(model)
    return model.decode
