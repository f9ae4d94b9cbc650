"""mvGPT checkpoints as HF transformers models: weights, config and tokenizer, exactly.

Our two kinds of model are two standard architectures, so nothing is approximated:
- learned positions -> GPT-2 (`GPT2LMHeadModel`): pre-LayerNorm with biases, exact GELU
  (activation_function "gelu", not GPT-2's default tanh approximation "gelu_new"), tied
  embeddings. GPT-2's Conv1D stores each linear as (in, out), so our weights go in transposed.
- rotary positions -> GPT-NeoX (`GPTNeoXForCausalLM`) with sequential residuals
  (use_parallel_residual false), rotary over the whole head (rotary_pct 1.0), NeoX's rotate_half
  pairing channels (i, i + head/2) as ours does, biased attention, tied embeddings. Its fused
  query_key_value is ordered per head ([h0 q k v, h1 q k v, ...]), ours is [q | k | v], so the
  rows are permuted.

Context extension maps to transformers' rope types only where the computation is the same:
linear -> linear, dynamic-ntk -> dynamic, yarn -> yarn (see `rope_parameters`); the others have no
equivalent there and are refused rather than exported as a different model.

The tokenizer becomes a byte-level BPE `tokenizer.json` (the `tokenizers` library) built from our
mergeable ranks, as tiktoken-to-HF converters do, with our split pattern and `<|endoftext|>`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from mvgpt.extension.rope_scaling import RopeScaling
from mvgpt.kit.errors import DISK_FULL, no_room
from mvgpt.kit.io import atomic_path, write_text_atomic
from mvgpt.model import GPT, GPTConfig
from mvgpt.tokenizer import EOT, Tokenizer

if TYPE_CHECKING:  # the export extra: imported only where used, so mvgpt works without it
    import tokenizers

# Our context-extension methods -> transformers' rope_type, for those that compute the same angles.
# The modules of the export extra (pyproject.toml) each format writes with: scripts check them first, so a
# missing one is one line naming the install, not a traceback halfway through an export.
NEEDS = {"hf": ("safetensors", "tokenizers"), "gguf": ("gguf",), "check": ("transformers", "safetensors", "gguf")}


def missing_extra(what: str) -> str | None:
    """One line naming the export extra's modules that `what` (hf, gguf, check) needs and this Python
    lacks, and the install that brings them; None when all are there."""
    import importlib.util

    lacking = [name for name in NEEDS[what] if importlib.util.find_spec(name) is None]
    if not lacking:
        return None
    return f"{' and '.join(lacking)} {'is' if len(lacking) == 1 else 'are'} not installed: pip install -e '.[export]'"


HF_ROPE_TYPES = {"none": "default", "linear": "linear", "dynamic-ntk": "dynamic", "yarn": "yarn"}
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which our blocks use


class ExportError(SystemExit):
    """An export that transformers cannot represent exactly: one line saying why and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(f"error: {message}")


# ----------------------------------------------------------------------------------------------
# Weights


def _tensors(model: GPT) -> dict[str, torch.Tensor]:
    # float32 on the CPU, each its own storage: safetensors refuses tensors that share memory
    return {k: v.detach().to("cpu", torch.float32).clone().contiguous() for k, v in model.state_dict().items()}


def gpt2_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """Our learned-position weights under GPT2LMHeadModel's names (linears transposed for Conv1D).

    lm_head is left out, as in OpenAI's GPT-2 files: tied embeddings make it wte.
    """
    sd = _tensors(model)
    out = {
        "transformer.wte.weight": sd["wte.weight"],
        "transformer.wpe.weight": sd["wpe.weight"],
        "transformer.ln_f.weight": sd["ln_f.weight"],
        "transformer.ln_f.bias": sd["ln_f.bias"],
    }
    for i in range(model.config.n_layer):
        ours, theirs = f"blocks.{i}.", f"transformer.h.{i}."
        for a, b in (("ln_1", "ln_1"), ("ln_2", "ln_2")):
            out[f"{theirs}{b}.weight"] = sd[f"{ours}{a}.weight"]
            out[f"{theirs}{b}.bias"] = sd[f"{ours}{a}.bias"]
        for a, b in (("attn.qkv", "attn.c_attn"), ("attn.proj", "attn.c_proj"), ("mlp.fc", "mlp.c_fc"),
                     ("mlp.proj", "mlp.c_proj")):
            out[f"{theirs}{b}.weight"] = sd[f"{ours}{a}.weight"].t().contiguous()  # Conv1D: (in, out)
            out[f"{theirs}{b}.bias"] = sd[f"{ours}{a}.bias"]
    return out


def per_head_qkv(t: torch.Tensor, n_head: int) -> torch.Tensor:
    """Rows [q | k | v] (heads contiguous in each) -> [h0 q, h0 k, h0 v, h1 q, ...], NeoX's order.

    Works for the weight (3C, C) and the bias (3C,).
    """
    C = t.shape[0] // 3
    return t.reshape(3, n_head, C // n_head, *t.shape[1:]).transpose(0, 1).reshape(t.shape).contiguous()


def neox_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """Our rope weights under GPTNeoXForCausalLM's names, query_key_value permuted per head.

    embed_out (NeoX's lm_head) is written as a copy of embed_in although the config ties them:
    transformers loads either way, and llama.cpp's GPT-NeoX loader requires an output tensor.
    """
    sd = _tensors(model)
    H = model.config.n_head
    out = {
        "gpt_neox.embed_in.weight": sd["wte.weight"],
        "gpt_neox.final_layer_norm.weight": sd["ln_f.weight"],
        "gpt_neox.final_layer_norm.bias": sd["ln_f.bias"],
        "embed_out.weight": sd["wte.weight"].clone(),
    }
    for i in range(model.config.n_layer):
        ours, theirs = f"blocks.{i}.", f"gpt_neox.layers.{i}."
        names = (("ln_1", "input_layernorm"), ("ln_2", "post_attention_layernorm"), ("attn.proj", "attention.dense"),
                 ("mlp.fc", "mlp.dense_h_to_4h"), ("mlp.proj", "mlp.dense_4h_to_h"))
        for a, b in names:
            out[f"{theirs}{b}.weight"] = sd[f"{ours}{a}.weight"]
            out[f"{theirs}{b}.bias"] = sd[f"{ours}{a}.bias"]
        out[f"{theirs}attention.query_key_value.weight"] = per_head_qkv(sd[f"{ours}attn.qkv.weight"], H)
        out[f"{theirs}attention.query_key_value.bias"] = per_head_qkv(sd[f"{ours}attn.qkv.bias"], H)
    return out


def hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    return neox_state_dict(model) if model.config.rope else gpt2_state_dict(model)


# ----------------------------------------------------------------------------------------------
# Config


def rope_parameters(config: GPTConfig, scaling: RopeScaling | None) -> tuple[dict[str, Any], int]:
    """transformers' rope dict for our rotary angles, and the max_position_embeddings to go with it.

    Refuses (ExportError) whatever transformers would compute differently.
    """
    train_ctx = config.block_size
    lf = config.rope_linear_factor  # a linear fine-tune: positions always divided by this
    method = "none" if scaling is None else scaling.method
    if method not in HF_ROPE_TYPES:
        raise ExportError(
            f"rope scaling {method!r} has no transformers equivalent; exportable: "
            "none, linear, dynamic-ntk (as dynamic), yarn (as yarn, with --ctx above the training context)"
        )
    base = {"rope_theta": float(config.rope_theta), "partial_rotary_factor": 1.0}
    if method in ("dynamic-ntk", "yarn") and lf != 1.0:
        # ours: (p / lf) * scaled speed; transformers' dynamic and yarn have no second factor
        raise ExportError(
            f"this model was fine-tuned with linear positions (factor {lf:g}), which transformers cannot "
            f"combine with {method}: export it with linear or none"
        )
    if method == "none":
        if lf != 1.0:  # positions / lf is transformers' linear type with that factor
            return {"rope_type": "linear", "factor": float(lf), **base}, train_ctx
        return {"rope_type": "default", **base}, train_ctx
    if method == "linear":  # ours divides by lf, then by s: one division by their product
        return {"rope_type": "linear", "factor": float(lf * scaling.s), **base}, max(scaling.ctx, train_ctx)
    if method == "dynamic-ntk":
        # transformers' dynamic: base * (f L / max_position_embeddings - (f - 1))^(d/(d-2)) once the
        # length L passes max_position_embeddings, which must therefore be our training context
        factor = scaling.factor if scaling.factor is not None else 1.0
        return {"rope_type": "dynamic", "factor": float(factor), **base}, train_ctx
    # yarn: ours turns on only when the asked context passes the training one, transformers' always;
    # past it the two agree (same ramp rounding, same 0.1 ln(s) + 1 on cos and sin)
    if not scaling.needed:
        raise ExportError(
            f"yarn at --ctx {scaling.ctx} (not above the training context {train_ctx}) leaves mvGPT's rotary "
            "angles unchanged: export without --rope-scaling, or with a larger --ctx"
        )
    yarn = {
        "rope_type": "yarn",
        "factor": float(scaling.s),
        "original_max_position_embeddings": train_ctx,
        "beta_fast": float(scaling.beta_fast),
        "beta_slow": float(scaling.beta_slow),
        **base,
    }
    return yarn, scaling.ctx


def hf_config(model: GPT, eot: int) -> dict[str, Any]:
    """config.json for the model (reading `model.rope_scaling`, set by long_context.set_context)."""
    c = model.config
    rope_scaling = getattr(model, "rope_scaling", None)  # None: a model read at its training context
    common = {
        "vocab_size": c.vocab_size,
        "bos_token_id": eot,  # stories are separated by <|endoftext|>, and a new one starts after it
        "eos_token_id": eot,
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": "float32",
        "torch_dtype": "float32",  # the name before transformers 5
    }
    if not c.rope:
        if rope_scaling is not None and rope_scaling.method != "none":
            raise ExportError("--rope-scaling needs a rope model; this one has learned positions")
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "n_positions": c.block_size,  # the learned table stops here
            "n_embd": c.n_embd,
            "n_layer": c.n_layer,
            "n_head": c.n_head,
            "n_inner": 4 * c.n_embd,
            "activation_function": "gelu",  # exact erf GELU, as F.gelu
            "resid_pdrop": 0.0,  # we train without dropout
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "layer_norm_epsilon": LAYER_NORM_EPS,
            "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False,
            "reorder_and_upcast_attn": False,
            **common,
        }
    rope, max_positions = rope_parameters(c, rope_scaling)
    scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor")}
    return {
        "architectures": ["GPTNeoXForCausalLM"],
        "model_type": "gpt_neox",
        "hidden_size": c.n_embd,
        "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head,
        "intermediate_size": 4 * c.n_embd,
        "hidden_act": "gelu",
        "max_position_embeddings": max_positions,
        "layer_norm_eps": LAYER_NORM_EPS,
        "use_parallel_residual": False,
        "attention_bias": True,
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
        "rope_parameters": rope,  # transformers 5's names
        # the same under transformers 4's names, which llama.cpp's converter also reads
        "rotary_pct": 1.0,
        "rotary_emb_base": float(c.rope_theta),
        "rope_scaling": scaling if scaling["rope_type"] != "default" else None,
        **common,
    }


# ----------------------------------------------------------------------------------------------
# Tokenizer


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which byte-level BPE vocabularies are written in."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:  # control bytes and spaces get unused code points above 255, in order
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def bpe_vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocabulary and merges for a BPE model from tiktoken's mergeable ranks.

    tiktoken merges the adjacent pair whose joined token has the lowest rank. A merge list gives
    that order when every split of a token into two known tokens is a merge, sorted by the
    joined token's rank (ties by the parts' ranks), as transformers' TikTokenConverter does.
    """
    char = bytes_to_unicode()

    def text(token: bytes) -> str:
        return "".join(char[b] for b in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    merges.sort(key=lambda m: m[:3])
    return vocab, [(text(left), text(right)) for *_, left, right in merges]


def hf_tokenizer(tokenizer: Tokenizer) -> tokenizers.Tokenizer:
    """A `tokenizers` byte-level BPE that encodes and decodes as our tiktoken one does."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as HFTokenizer

    vocab, merges = bpe_vocab_and_merges(tokenizer.ranks)
    # ignore_merges: a piece that is itself a token is taken whole, as tiktoken does before merging
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=True))
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(tokenizer.pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),  # bytes -> chars only
        ]
    )
    hf.decoder = decoders.ByteLevel()
    hf.post_processor = processors.ByteLevel(trim_offsets=False)
    hf.add_special_tokens([AddedToken(EOT, special=True, normalized=False)])
    if hf.token_to_id(EOT) != tokenizer.eot:
        raise ExportError(f"{EOT} got id {hf.token_to_id(EOT)} in the exported tokenizer, not {tokenizer.eot}")
    return hf


def save_tokenizer(tokenizer: Tokenizer, outdir: str | os.PathLike, model_max_length: int) -> None:
    """tokenizer.json and tokenizer_config.json, so AutoTokenizer.from_pretrained(outdir) works."""
    outdir = Path(outdir)
    with atomic_path(outdir / "tokenizer.json") as tmp:
        hf_tokenizer(tokenizer).save(str(tmp))
    config = {
        # the class name transformers 4 and 5 both resolve to a tokenizer.json-backed tokenizer
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOT,
        "eos_token": EOT,
        "pad_token": EOT,  # generate() and batching need one; no story is padded in training
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,  # it would turn " ." into "." when decoding
        "add_prefix_space": False,
    }
    write_text_atomic(outdir / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")


# ----------------------------------------------------------------------------------------------
# The whole folder


def readme(checkpoint: str | os.PathLike, model: GPT, state: dict, config: dict[str, Any], outdir: Path) -> str:
    """A short model card: where it came from, its context, how it was trained."""
    c = model.config
    checkpoint = Path(checkpoint)
    name = checkpoint.parent.name if checkpoint.suffix == ".pt" else checkpoint.name  # the run folder's name
    args = state.get("args") or {}
    kind = "rotary positions (GPT-NeoX)" if c.rope else "learned positions (GPT-2)"
    trained = ", ".join(
        f"{k}={args[k]}" for k in ("max_steps", "batch_size", "lr", "warmup", "weight_decay", "seed", "init_from",
                                   "rope_scaling", "rope_factor") if args.get(k) not in (None, "none")
    )
    lines = [
        f"# mvGPT export: {name}",
        "",
        f"- Source checkpoint: `{checkpoint}` (step {state.get('step', '?')}, "
        f"tokenizer {state.get('tokenizer_hash', '?')})",
        f"- Architecture: mvGPT with {kind}, exported as `{config['architectures'][0]}`: "
        f"{c.n_layer} layers, {c.n_head} heads, {c.n_embd} channels, vocabulary {c.vocab_size}, "
        f"{model.num_params():,} parameters",
        f"- Training context: {c.block_size} tokens",
        f"- Trained with `scripts/pretrain.py`: {trained or 'defaults'}",
    ]
    if c.rope:
        fine_tuned = f", positions divided by {c.rope_linear_factor:g}" if c.rope_linear_factor != 1 else ""
        lines.append(f"- Rotary: theta {c.rope_theta:g}{fine_tuned}; "
                     f"transformers rope parameters: `{json.dumps(config['rope_parameters'])}`")
    if state.get("val_loss") is not None:  # a checkpoint saved before its first evaluation has none
        lines.append(f"- Held-out loss at export (from the checkpoint): {state['val_loss']:.4f}")
    lines += [
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        f'tok = AutoTokenizer.from_pretrained("{outdir}")',
        f'model = AutoModelForCausalLM.from_pretrained("{outdir}")',
        'ids = tok("Once upon a time", return_tensors="pt").input_ids',
        "print(tok.decode(model.generate(ids, max_new_tokens=100, do_sample=False)[0]))",
        "```",
        "",
    ]
    return "\n".join(lines)


def export(
    model: GPT,
    tokenizer: Tokenizer,
    outdir: str | os.PathLike,
    checkpoint: str | os.PathLike = "(in memory)",
    state: dict | None = None,
) -> Path:
    """Write config.json, generation_config.json, model.safetensors, the tokenizer and README.md.

    All of them are made in a staging folder inside outdir and moved in only when complete, so a
    full disk or a stop leaves what outdir held as it was, not half an export (nor a mix of two)."""
    from safetensors.torch import save

    if tokenizer.vocab_size != model.config.vocab_size:
        raise ExportError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but the model {model.config.vocab_size}: "
            "pass the --data-dir the model was trained with"
        )
    outdir = Path(outdir)
    if outdir.exists() and not outdir.is_dir():
        raise ExportError(f"{outdir} is a file: give a folder to export into")
    config = hf_config(model, tokenizer.eot)  # first: it refuses what cannot be exported
    made = not outdir.exists()
    outdir.mkdir(parents=True, exist_ok=True)
    staging = outdir / f".export.tmp{os.getpid()}"
    try:
        staging.mkdir(exist_ok=True)
        # safetensors' bytes written by us: a full disk is then an OSError (ENOSPC), told in one line
        (staging / "model.safetensors").write_bytes(save(hf_state_dict(model), metadata={"format": "pt"}))
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        generation = {"bos_token_id": tokenizer.eot, "eos_token_id": tokenizer.eot, "pad_token_id": tokenizer.eot}
        (staging / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        save_tokenizer(tokenizer, staging, config.get("n_positions", config.get("max_position_embeddings")))
        (staging / "README.md").write_text(readme(checkpoint, model, state or {}, config, outdir))
        for f in staging.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        for f in sorted(staging.iterdir()):
            os.replace(f, outdir / f.name)
    except OSError as e:
        if e.errno in DISK_FULL:
            cause, fix = no_room(e)
            raise ExportError(f"{cause}: the export to {outdir} was not written (what it held before is kept): "
                              f"{fix}") from None
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if made and not any(outdir.iterdir()):
            outdir.rmdir()
    return outdir

