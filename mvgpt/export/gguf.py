"""mvGPT checkpoints as GGUF files, for llama.cpp and what is built on it (ollama, LM Studio, llama-server).

One file holds the weights, the hyper-parameters and the tokenizer, written with llama.cpp's own
Python writer (the `gguf` package). Our two kinds of model are two architectures llama.cpp has:
- rotary positions -> `gptneox` with use_parallel_residual false (attention, then the MLP, as our
  blocks do) and rotary over the whole head, NeoX's pairing (i, i + head/2) as ours. llama.cpp
  splits the fused qkv weight as [q | k | v], our own order, so it goes in unpermuted (HF's NeoX
  interleaves per head, see export.py). Its loader requires `output.weight` even though the
  embeddings are tied, so the embedding is written twice.
- learned positions -> `gpt2`: the table of positions is `position_embd`, and positions past the
  training context do not exist.
GGUF stores each matrix as PyTorch does, (out, in) for a linear, so nothing is transposed.

Where llama.cpp computes something else:
- GELU: llama.cpp's MLP uses the tanh approximation, looked up in a float16 table; ours is the
  exact erf GELU. `ggml_gelu` reproduces llama.cpp's, and `ggml_activation(model)` swaps it into a
  model from the outside, so the two can be compared to float noise (tests/test_gguf.py).
- Rotary scaling: llama.cpp has linear (`rope_freq_scale`), YaRN, and a base (`rope_freq_base`);
  our linear, yarn and ntk map onto them (`gguf_rope`); dynamic-ntk, linear-when-needed and
  pr-nonlinear change with the length read, which llama.cpp does not do: they are refused.

The tokenizer goes in as llama.cpp's GPT-2-style BPE: the vocabulary in GPT-2's byte-to-character
alphabet, the merges in tiktoken's order (both from export.py), the `llama-bpe` pre-tokenizer (the
split pattern of ours, GPT-4's), `<|endoftext|>` a control token that begins and ends a story, and
no token added in front, so llama.cpp tokenizes and scores a text as we do.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mvgpt.export.hf import LAYER_NORM_EPS, ExportError, bpe_vocab_and_merges
from mvgpt.extension.rope_scaling import RopeScaling
from mvgpt.kit.errors import DISK_FULL, no_room
from mvgpt.kit.io import atomic_path, clip
from mvgpt.model import GPT, GPTConfig
from mvgpt.tokenizer import EOT, Tokenizer

GGUF_ROPE_METHODS = ("none", "linear", "yarn", "ntk")  # the ones llama.cpp computes as we do
PRE_TOKENIZER = "llama-bpe"  # llama.cpp's name for GPT-4's split pattern, which rustbpe uses


# ----------------------------------------------------------------------------------------------
# Weights


def gguf_tensors(model: GPT, f16: bool = False) -> dict[str, np.ndarray]:
    """Our weights under llama.cpp's tensor names, as numpy arrays in PyTorch's (out, in) layout.

    f16: matrices in float16, norms and biases in float32 (as llama.cpp's converter does).
    """
    sd = {k: v.detach().to("cpu", torch.float32).numpy().copy() for k, v in model.state_dict().items()}

    def matrix(a: np.ndarray) -> np.ndarray:
        return a.astype(np.float16) if f16 else a

    out = {
        "token_embd.weight": matrix(sd["wte.weight"]),
        "output_norm.weight": sd["ln_f.weight"],
        "output_norm.bias": sd["ln_f.bias"],
        "output.weight": matrix(sd["wte.weight"]),  # tied: the same matrix again (gptneox needs it)
    }
    if not model.config.rope:
        out["position_embd.weight"] = matrix(sd["wpe.weight"])
    names = (("ln_1", "attn_norm"), ("ln_2", "ffn_norm"), ("attn.qkv", "attn_qkv"), ("attn.proj", "attn_output"),
             ("mlp.fc", "ffn_up"), ("mlp.proj", "ffn_down"))
    for i in range(model.config.n_layer):
        for ours, theirs in names:
            weight = sd[f"blocks.{i}.{ours}.weight"]
            out[f"blk.{i}.{theirs}.weight"] = matrix(weight) if weight.ndim == 2 else weight
            out[f"blk.{i}.{theirs}.bias"] = sd[f"blocks.{i}.{ours}.bias"]
    return out


# ----------------------------------------------------------------------------------------------
# Rotary scaling


def gguf_rope(config: GPTConfig, scaling: RopeScaling | None) -> dict[str, Any]:
    """What to write so llama.cpp turns queries and keys by our angles: freq_base, and a scaling
    type with its factor (and YaRN's original context) when there is one.

    llama.cpp's angle is p * freq_scale * freq_base^(-2i/d), freq_scale = 1 / factor. Refuses
    (ExportError) whatever it would compute differently.
    """
    train_ctx, lf = config.block_size, config.rope_linear_factor
    d = config.head_size
    method = "none" if scaling is None else scaling.method
    if method not in GGUF_ROPE_METHODS:
        hint = ", or linear with the same --ctx (positions divided at every length)" if method == (
            "linear-when-needed") else ""
        raise ExportError(
            f"rope scaling {method!r} changes with the length read, which llama.cpp cannot do: export with "
            f"none, linear, yarn or ntk{hint}"
        )
    if method in ("yarn", "ntk") and not scaling.needed:
        raise ExportError(
            f"{method} at --ctx {scaling.ctx} (not above the training context {train_ctx}) leaves mvGPT's rotary "
            "angles unchanged: export without --rope-scaling, or with a larger --ctx"
        )
    rope: dict[str, Any] = {"freq_base": float(config.rope_theta), "type": "none", "factor": None,
                            "original_context": None}
    if lf != 1.0:  # a linear fine-tune: positions / lf always, llama.cpp's linear type
        rope.update(type="linear", factor=float(lf))
    if method == "linear":  # ours divides by lf, then by s: one division by their product
        rope.update(type="linear", factor=float(lf * scaling.s))
    elif method == "ntk":  # a larger base, on top of any fine-tuned linear factor
        rope["freq_base"] = float(config.rope_theta * scaling.s ** (d / (d - 2)))
    elif method == "yarn":
        if lf != 1.0:  # ours: (p / lf) * YaRN's speeds; llama.cpp's YaRN has one factor
            raise ExportError(
                f"this model was fine-tuned with linear positions (factor {lf:g}), which llama.cpp cannot combine "
                "with yarn: export it with linear, ntk or none"
            )
        rope.update(type="yarn", factor=float(scaling.s), original_context=train_ctx)
    return rope


# ----------------------------------------------------------------------------------------------
# Tokenizer


def gguf_vocab(tokenizer: Tokenizer) -> tuple[list[str], list[int], list[str]]:
    """Tokens (id order, GPT-2's byte alphabet), their llama.cpp types, and merges as "left right"."""
    from gguf import TokenType

    vocab, merges = bpe_vocab_and_merges(tokenizer.ranks)
    tokens = [""] * tokenizer.vocab_size
    for text, rank in vocab.items():
        tokens[rank] = text
    tokens[tokenizer.eot] = EOT
    types = [int(TokenType.NORMAL)] * tokenizer.vocab_size
    types[tokenizer.eot] = int(TokenType.CONTROL)  # never split from text, never printed as text
    # GPT-2's alphabet has no space (it is "Ġ"), so one space separates the two halves unambiguously
    return tokens, types, [f"{left} {right}" for left, right in merges]


# ----------------------------------------------------------------------------------------------
# The file


def export_gguf(
    model: GPT,
    tokenizer: Tokenizer,
    path: str | os.PathLike,
    checkpoint: str | os.PathLike = "(in memory)",
    state: dict | None = None,
    f16: bool = False,
) -> Path:
    """Write one .gguf file (reading `model.rope_scaling` for a rope model), atomically."""
    import gguf

    c, scaling = model.config, getattr(model, "rope_scaling", None)  # set by long_context.set_context
    if tokenizer.vocab_size != c.vocab_size:
        raise ExportError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but the model {c.vocab_size}: "
            "pass the --data-dir the model was trained with"
        )
    path = Path(path)
    if path.is_dir():
        raise ExportError(f"{path} is a folder: give the .gguf file to write")
    if c.rope:
        rope = gguf_rope(c, scaling)  # first: it refuses what cannot be exported
    elif scaling is not None and scaling.method != "none":
        raise ExportError("--rope-scaling needs a rope model; this one has learned positions")
    arch = "gptneox" if c.rope else "gpt2"
    tensors = gguf_tensors(model, f16)
    tokens, types, merges = gguf_vocab(tokenizer)

    try:  # a full disk: one line, and the file there before (if any) kept, as atomic_path leaves it
        with atomic_path(path) as tmp:
            w = gguf.GGUFWriter(str(tmp), arch)
            name = Path(checkpoint).parent.name if Path(checkpoint).suffix == ".pt" else Path(checkpoint).name
            w.add_name(f"mvGPT {name}")
            w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
            w.add_context_length(c.block_size)  # the training context (llama.cpp's n_ctx_train)
            w.add_embedding_length(c.n_embd)
            w.add_block_count(c.n_layer)
            w.add_feed_forward_length(4 * c.n_embd)
            w.add_head_count(c.n_head)
            w.add_layer_norm_eps(LAYER_NORM_EPS)
            if c.rope:
                w.add_rope_dimension_count(c.head_size)  # rotary over the whole head
                w.add_parallel_residual(False)
                w.add_rope_freq_base(rope["freq_base"])
                w.add_rope_scaling_type(gguf.RopeScalingType(rope["type"]))
                if rope["factor"] is not None:
                    w.add_rope_scaling_factor(rope["factor"])
                if rope["original_context"] is not None:
                    w.add_rope_scaling_orig_ctx_len(rope["original_context"])
                    w.add_rope_scaling_yarn_beta_fast(float(scaling.beta_fast))
                    w.add_rope_scaling_yarn_beta_slow(float(scaling.beta_slow))
            if state and "step" in state:
                w.add_string("mvgpt.step", str(state["step"]))
            w.add_string("mvgpt.tokenizer_hash", tokenizer.hash)
            w.add_tokenizer_model("gpt2")  # byte-level BPE with merges
            w.add_tokenizer_pre(PRE_TOKENIZER)
            w.add_token_list(tokens)
            w.add_token_types(types)
            w.add_token_merges(merges)
            w.add_bos_token_id(tokenizer.eot)  # a story starts after <|endoftext|> ...
            w.add_eos_token_id(tokenizer.eot)  # ... and ends with it
            w.add_add_bos_token(False)  # we never put one in front of a text: neither may llama.cpp
            w.add_add_eos_token(False)
            for tname, array in tensors.items():
                w.add_tensor(tname, array)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()
    except OSError as e:  # numpy's short write says "N requested and M written", with no errno
        if e.errno in DISK_FULL or (e.errno is None and "written" in str(e)):
            cause, fix = no_room(e)  # no errno (numpy's short write): a full disk
            raise ExportError(f"{cause}: {path} not written (the file there before, if any, is kept): {fix}") from None
        raise
    return path


# ----------------------------------------------------------------------------------------------
# llama.cpp's GELU, to compare with it from our side

SQRT_2_OVER_PI = 0.79788456080286535587989211986876  # ggml's constants (float32 in its C code)
GELU_COEF_A = 0.044715


def ggml_gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU as llama.cpp's CPU backend computes it in float32: 0 below -10, x above 10, and in
    between the tanh approximation of x rounded to float16, itself rounded to float16 (a table
    of 65536 values built at start-up)."""
    h = x.to(torch.float16).to(torch.float32)
    # ggml's expression as written (torch's fused tanh GELU rounds its tail to 0 near x = -5)
    y = 0.5 * h * (1 + torch.tanh(SQRT_2_OVER_PI * h * (1 + GELU_COEF_A * h * h)))
    y = y.to(torch.float16).to(torch.float32)
    return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, y)).to(x.dtype)


@contextmanager
def ggml_activation(model: GPT) -> Iterator[GPT]:
    """Within the block, the model's MLPs use `ggml_gelu` instead of the exact GELU."""

    def forward(mlp: torch.nn.Module):
        return lambda x: mlp.proj(ggml_gelu(mlp.fc(x)))

    mlps = [block.mlp for block in model.blocks]
    for mlp in mlps:
        mlp.forward = forward(mlp)  # an instance attribute shadows the class's forward
    try:
        yield model
    finally:
        for mlp in mlps:
            del mlp.forward


# ----------------------------------------------------------------------------------------------
# Running the file with llama.cpp (llama-cpp-python), where it is installed


def llama_cpp_missing() -> str | None:
    """Why llama.cpp cannot be used here (None when it can)."""
    try:
        import llama_cpp  # noqa: F401
    except (ImportError, OSError) as e:  # not installed, or its shared library does not load
        return f"llama.cpp is not available ({clip(str(e).splitlines()[0])}): pip install llama-cpp-python"
    return None


def llama_cpp_kwargs(rope: dict[str, Any] | None = None) -> dict[str, Any]:
    """llama_cpp.Llama arguments for llama.cpp's run-time rope options (as its tools' --rope-scaling,
    --rope-scale, --rope-freq-base, --yarn-orig-ctx), from a `gguf_rope` dict."""
    import llama_cpp

    if not rope:  # a learned-position model: no rotary options
        return {}
    types = {"none": llama_cpp.LLAMA_ROPE_SCALING_TYPE_NONE, "linear": llama_cpp.LLAMA_ROPE_SCALING_TYPE_LINEAR,
             "yarn": llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN}
    kwargs: dict[str, Any] = {"rope_scaling_type": types[rope["type"]], "rope_freq_base": rope["freq_base"]}
    if rope["factor"] is not None:
        kwargs["rope_freq_scale"] = 1.0 / rope["factor"]
    if rope["original_context"] is not None:
        kwargs["yarn_orig_ctx"] = rope["original_context"]
    return kwargs


def llama_cpp_model(path: str | os.PathLike, n_ctx: int, rope: dict[str, Any] | None = None, threads: int = 2):
    """The GGUF loaded by llama.cpp, with the logits of every position kept (for scoring).

    The KV cache holds float32 keys and values, as ours (llama.cpp's default is float16, which
    would round every key and value), and attention is llama.cpp's plain one (no flash attention).
    """
    import llama_cpp

    return llama_cpp.Llama(
        model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True, n_threads=threads,
        n_threads_batch=threads, type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, flash_attn=False,
        verbose=False, seed=0, **llama_cpp_kwargs(rope),
    )


def llama_cpp_logits(llm, ids: list[int]) -> torch.Tensor:
    """llama.cpp's logits (T, vocab) for the token ids, read from an empty context."""
    llm.reset()  # the next eval drops every cached position
    llm.eval(ids)
    return torch.from_numpy(np.array(llm.scores[: len(ids)], dtype=np.float32))


def llama_cpp_greedy(llm, ids: list[int], n: int) -> list[int]:
    """n new tokens by llama.cpp's own sampler at temperature 0 (greedy), through its KV cache."""
    out = []
    for token in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        out.append(token)
        if len(out) == n:
            break
    return out
