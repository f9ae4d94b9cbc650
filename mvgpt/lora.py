"""LoRA: fine-tune a frozen model through small low-rank updates of its linear layers.

A linear layer computes y = x W^T + b with W (out, in). LoRA (Hu and others, Microsoft, 2021)
leaves W as it is and learns an update of rank r instead:

    W' = W + (alpha / r) B A,    A (r, in), B (out, r),

so the layer computes x W^T + b + (alpha / r) (x A^T) B^T: two thin matrix products beside the
frozen one. B starts at zero, so at step 0 the update is exactly zero and the wrapped model is
exactly the base model; A starts random (seeded), so that B's gradient is not zero and training
can move. With r = 8 on every linear layer of mvGPT's 6 blocks of 384 channels, A and B hold
294,912 weights: about 2% of the model.

The wrapper replaces the model's nn.Linear children from outside (`apply_lora`), so the model's
code and its forward pass, KV cache included, do not change. The adapter (A and B of every layer)
is saved as a file of its own, a few percent of a checkpoint, with the base's config, tokenizer
hash and a hash of its weights, so it is never put on a base it was not trained on. `merge` folds
B A into W and gives back an ordinary model, with the same weight names as before.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn as nn

from mvgpt.kit.io import CheckpointError, load_state, write_state
from mvgpt.model import GPT

ADAPTER_NAME = "adapter.pt"
DEFAULT_RANK = 8  # about 2% of the 6 x 384 model's weights (294,912 of 13.8M with rope)
DEFAULT_ALPHA = 16.0  # the update is scaled by alpha / rank = 2


class LoRALinear(nn.Module):
    """A frozen nn.Linear plus a trainable low-rank update: x W^T + b + (alpha / r) x A^T B^T."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.base = base
        self.rank, self.alpha = rank, alpha
        self.scale = alpha / rank
        # A as nn.Linear initialises its own weight (uniform, bound 1/sqrt(in)), drawn on the CPU so
        # that a seed gives the same A on any device; B zero: no update yet
        A = torch.empty(rank, base.in_features)
        nn.init.kaiming_uniform_(A, a=math.sqrt(5), generator=generator)
        self.A = nn.Parameter(A.to(base.weight.device, base.weight.dtype))
        self.B = nn.Parameter(torch.zeros(base.out_features, rank, device=base.weight.device, dtype=base.weight.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, in) -> (B, T, out)
        return self.base(x) + (x @ self.A.t()) @ self.B.t() * self.scale  # (B, T, r) in between

    def delta(self) -> torch.Tensor:
        """The update of the weight, (alpha / r) B A: (out, in), the shape of W."""
        return (self.B @ self.A) * self.scale

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha:g}"


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    """The module holding the child at dotted `name`, and the child's own name."""
    path, _, child = name.rpartition(".")
    return (model.get_submodule(path) if path else model), child


def apply_lora(model: GPT, rank: int = DEFAULT_RANK, alpha: float = DEFAULT_ALPHA, seed: int = 0) -> list[str]:
    """Freeze the model and wrap every nn.Linear inside its blocks (attention qkv and proj, MLP fc
    and proj) in a LoRALinear, in place. A is drawn from a generator seeded with `seed`, layer by
    layer in the model's order, so the same seed gives the same adapter. Returns the wrapped
    layers' names, e.g. "blocks.0.attn.qkv"."""
    if rank < 1:
        raise ValueError(f"LoRA rank must be at least 1, got {rank}")
    if lora_layers(model):
        raise ValueError("this model has LoRA layers already: merge them first, or start from the base")
    for p in model.parameters():
        p.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    names = [f"blocks.{name}" for name, module in model.blocks.named_modules() if isinstance(module, nn.Linear)]
    for name in names:
        parent, child = _parent(model, name)
        setattr(parent, child, LoRALinear(getattr(parent, child), rank, alpha, generator))
    return names


def max_rank(model: GPT) -> int:
    """The largest rank whose update (r x in + out x r weights) stays smaller than every layer it
    adapts (in x out): past it, the "low-rank" adapter outweighs the model it fine-tunes."""
    shapes = [m.weight.shape for m in model.blocks.modules() if isinstance(m, nn.Linear)]
    return min((rows * cols - 1) // (rows + cols) for rows, cols in shapes)


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    """A and B of every wrapped layer: the only weights a fine-tune trains."""
    return [p for m in lora_layers(model).values() for p in (m.A, m.B)]


def trainable_share(model: nn.Module) -> tuple[int, int]:
    """(trainable weights, all weights) of a model, tied weights counted once."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


@torch.no_grad()
def merge(model: GPT) -> GPT:
    """Fold every adapter into its base weight, W + (alpha / r) B A, in place: the model becomes an
    ordinary GPT again, with plain nn.Linear layers under their old names, and its state_dict
    loads anywhere a checkpoint does. The base layers' own tensors are left untouched (new ones are
    made), so a copy of the base that shares them stays the base."""
    for name, lora in lora_layers(model).items():
        base = lora.base
        merged = nn.Linear(base.in_features, base.out_features, bias=base.bias is not None,
                           device=base.weight.device, dtype=base.weight.dtype)
        merged.weight.copy_(base.weight + lora.delta().to(base.weight.dtype))
        if base.bias is not None:
            merged.bias.copy_(base.bias)
        merged.requires_grad_(False)
        parent, child = _parent(model, name)
        setattr(parent, child, merged)
    return model


# ----------------------------------------------------------------------------------------------
# The adapter as a file of its own


def weights_hash(model: nn.Module) -> str:
    """A short hash of a model's weights (LoRA's A and B left out): tells one base from another of
    the same shape, e.g. the same run trained longer."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        if name.endswith((".A", ".B")) and ".base." not in name:
            continue
        h.update(name.replace(".base.", ".").encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def adapter_path(path: str | os.PathLike) -> Path:
    """A run folder means its adapter.pt; a file means itself."""
    path = Path(path)
    return path / ADAPTER_NAME if path.is_dir() or path.suffix != ".pt" else path


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """{"blocks.0.attn.qkv.A": (r, in), "blocks.0.attn.qkv.B": (out, r), ...}: the adapter alone."""
    state = {}
    for name, m in lora_layers(model).items():
        state[f"{name}.A"], state[f"{name}.B"] = m.A.detach().clone(), m.B.detach().clone()
    return state


def save_adapter(path: str | os.PathLike, model: GPT, base_hash: str, tokenizer_hash: str | None, **extra) -> Path:
    """Write the adapter (A and B of every wrapped layer, rank, alpha) with what it needs to find
    its base again (config, tokenizer hash, weights hash), atomically. Returns the file's path."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError("this model has no LoRA layers: apply_lora first")
    first = next(iter(layers.values()))
    state = {
        "lora": adapter_state(model),
        "rank": first.rank,
        "alpha": first.alpha,
        "targets": list(layers),
        "base_config": asdict(model.config),
        "base_hash": base_hash,
        "tokenizer_hash": tokenizer_hash,
        **extra,
    }
    return write_state(adapter_path(path), state, "adapter")


def read_adapter(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """The adapter file's dict, or a one-line error for a missing, corrupt or foreign file."""
    file = adapter_path(path)
    if not file.exists():
        raise CheckpointError(
            f"no adapter at {file}: fine-tune one with `python scripts/finetune.py`, or check the path"
        )
    state = load_state(file, map_location, "adapter", "fine-tune again")
    if not isinstance(state, dict) or not {"lora", "rank", "alpha", "base_config"} <= state.keys():
        raise CheckpointError(f"{file} is not an mvGPT LoRA adapter (no lora weights, rank or base config in it)")
    check_fields(state, file)
    return state


def check_fields(state: dict, file: Path) -> None:
    """An adapter's rank, alpha and weights must be ones an adapter can have, before anything is
    allocated from them: a crafted rank of 10**12 must not ask for terabytes, nor alpha NaN poison
    every output."""
    rank, alpha, weights = state["rank"], state["alpha"], state["lora"]

    def crafted(what: str) -> CheckpointError:
        return CheckpointError(f"adapter {file} has {what}, which no adapter can have: the file is corrupt or "
                               "crafted; fine-tune again")

    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise crafted(f"rank {rank!r}")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not (0 < alpha < math.inf):
        raise crafted(f"alpha {alpha!r}")
    if not isinstance(weights, dict) or not weights or not all(isinstance(t, torch.Tensor) for t in weights.values()):
        raise crafted("no weights as tensors")
    for name, t in weights.items():
        if t.dim() != 2:
            raise crafted(f"{name} of shape {tuple(t.shape)}")
        held = t.shape[0] if name.endswith(".A") else t.shape[1]  # A (r, in), B (out, r)
        if held != rank:
            raise crafted(f"rank {rank} (its weights have rank {held})")
        if not torch.isfinite(t).all():
            raise crafted(f"{name} not finite")


def check_base(state: dict, model: GPT, file: str | os.PathLike, tokenizer_hash: str | None = None,
               base_hash: str | None = None) -> None:
    """One-line error unless `model` (and the data's tokenizer) is the base the adapter was trained on."""
    saved, ours = state["base_config"], asdict(model.config)
    diff = [f"{k} {saved.get(k)!r} vs {ours.get(k)!r}" for k in sorted(ours.keys() | saved.keys())
            if saved.get(k, ours.get(k)) != ours.get(k, saved.get(k))]
    if diff:
        raise CheckpointError(
            f"adapter {file} was trained on another base ({', '.join(diff[:3])}): "
            "give it the checkpoint it was fine-tuned from"
        )
    saved_tok = state.get("tokenizer_hash")
    if tokenizer_hash is not None and saved_tok is not None and saved_tok != tokenizer_hash:
        raise CheckpointError(
            f"adapter {file} was trained with tokenizer {saved_tok}, but this base or data has {tokenizer_hash}: "
            "use the data and checkpoint it was fine-tuned with"
        )
    if base_hash is not None and state.get("base_hash") not in (None, base_hash):
        raise CheckpointError(
            f"adapter {file} was trained on other weights of this shape (base {state['base_hash']}, this one "
            f"{base_hash}): give it the checkpoint it was fine-tuned from, or fine-tune again"
        )


def load_adapter(model: GPT, path: str | os.PathLike, tokenizer_hash: str | None = None) -> dict:
    """Wrap `model` (the base) with the adapter saved at path, unmerged; returns the adapter's dict.

    A base of another shape, tokenizer or weights is a one-line error, before anything is changed."""
    state = read_adapter(path)
    file = adapter_path(path)
    check_base(state, model, file, tokenizer_hash, weights_hash(model))
    device = next(model.parameters()).device
    targets = apply_lora(model, state["rank"], state["alpha"])
    if sorted(targets) != sorted(state.get("targets", targets)):
        raise CheckpointError(f"adapter {file} wraps other layers than this model has: fine-tune again")
    try:
        with torch.no_grad():
            for name, lora in lora_layers(model).items():
                lora.A.copy_(state["lora"][f"{name}.A"].to(device))
                lora.B.copy_(state["lora"][f"{name}.B"].to(device))
    except (KeyError, RuntimeError) as e:
        raise CheckpointError(f"adapter {file} does not fit this model ({str(e).splitlines()[0]})") from None
    return state
