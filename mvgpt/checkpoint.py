"""Checkpoints: weights + config (+ tokenizer hash, step, optimizer, ...), saved atomically.

A checkpoint is a dict of tensors and plain values, written to a temporary file and renamed into
place, so a crash never leaves a half-written one. It is read with weights_only=True: no pickled
code is ever run. Its config rebuilds its own model; a config saved before `rope` existed loads
as a learned-position model, and the patch is logged. A config is checked before any memory is
given to it: sane values, and a size this machine can hold (a crafted file must not make us
allocate half a terabyte). A full disk or a folder we may not write is one
line, and the previous checkpoint stays as it was.

A checkpoint is a zip archive with a checksum (CRC-32) per record: they are checked before it is
read, so a flipped bit on disk is reported as damage, not loaded as weights. It is always read into
CPU memory first and moved afterwards, so a device this machine lacks is never blamed on the file.

The models a path holds, for a reading script: run folders, checkpoint files, LoRA adapters on their base.

`python scripts/context.py checkpoints/*` hands over every folder the main job made: two
pretrained models, a long-context fine-tune and a LoRA adapter, which holds no checkpoint of its
own. Each path becomes a model to read, or a one-line reason it is skipped:
- a run folder (or file) with a checkpoint: that model;
- a LoRA run folder (or adapter file): its base with the adapter applied, named as such. The base is
  the checkpoint the adapter recorded, or a checkpoint beside the adapter's folder with the same
  weights (the hash the adapter keeps), so the layout may move as a whole;
- anything else that exists (a folder of exports, a note): skipped, and said so.
A path that does not exist at all is an error, as a typo should be.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from mvgpt.data import tokenizer_vocab
from mvgpt.device import memory_bytes
from mvgpt.kit.io import CheckpointError, first_non_finite, load_state, write_state
from mvgpt.kit.runfolder import run_folders
from mvgpt.lora import adapter_path, check_base, load_adapter, read_adapter, weights_hash
from mvgpt.model import GPT, GPTConfig

log = logging.getLogger(__name__)
CHECKPOINT_NAME = "ckpt.pt"


def checkpoint_path(path: str | os.PathLike) -> Path:
    """A run folder means its ckpt.pt; a file means itself."""
    path = Path(path)
    return path / CHECKPOINT_NAME if path.is_dir() else path


def checkpoint_in(folder: str | os.PathLike) -> Path:
    """A run folder's checkpoint file, whatever the folder is called (a folder named run.pt too)."""
    return Path(folder) / CHECKPOINT_NAME


def no_checkpoint(path: str | os.PathLike) -> str:
    """Why there is no checkpoint at path, and the fix: a LoRA run folder holds an adapter only."""
    if not str(path).strip():  # Path("") is ".", the folder the script runs in: not what a blank argument meant
        return f"{str(path)!r} is an empty path: name a run folder or a .pt file"
    if (Path(path) / "adapter.pt").is_file():  # mvgpt/lora.py's ADAPTER_NAME
        return (f"{path} is a LoRA run (an adapter, no checkpoint of its own): give its base, or merge the two "
                f"first, `python scripts/finetune.py --init-from BASE --out-dir {path} --merge OUT`, and give OUT")
    return f"no checkpoint at {checkpoint_path(path)}: train one with `python scripts/pretrain.py`, or check the path"


def checkpoint_arg(text: str) -> str:
    """An argparse type: a run folder with a checkpoint, or a checkpoint file, checked to be there."""
    if not text.strip() or not checkpoint_path(text).is_file():
        raise argparse.ArgumentTypeError(no_checkpoint(text))
    return text


def save_checkpoint(path: str | os.PathLike, model: GPT, **extra) -> Path:
    """Write {model, config, **extra} atomically to path (a file, or a run folder's ckpt.pt)."""
    path = Path(path)
    if path.suffix != ".pt":
        path = path / CHECKPOINT_NAME
    model = getattr(model, "module", model)  # unwrap DistributedDataParallel
    model = getattr(model, "_orig_mod", model)  # unwrap torch.compile
    return write_state(path, {"model": model.state_dict(), "config": asdict(model.config), **extra}, "checkpoint")


def read_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """The checkpoint's dict, or a one-line error for a missing, truncated or corrupt file."""
    file = checkpoint_path(path)
    if not file.exists():
        raise CheckpointError(no_checkpoint(path))
    state = load_state(file, map_location, "checkpoint", "use an earlier checkpoint or train again")
    if not isinstance(state, dict) or "model" not in state or "config" not in state:
        raise CheckpointError(f"{file} is not an mvGPT checkpoint (no model or config in it)")
    # every reader (a model to load, a run to resume, a base to start from) refuses NaN or inf weights
    if isinstance(state["model"], dict) and (bad := first_non_finite(state["model"])) is not None:
        raise CheckpointError(f"checkpoint {file} holds non-finite weights ({bad}): it cannot be read; use an "
                              "earlier checkpoint, or train again with a lower --lr")
    return state


def config_from_dict(saved: dict) -> GPTConfig:
    """A GPTConfig from a saved dict; fields it lacks take their defaults (old behaviour), logged.

    Every value must be of its field's kind and sane: whole numbers >= 1, finite numbers > 0,
    True or False; anything else is a one-line error (a corrupt or crafted file).
    """
    if not isinstance(saved, dict):
        raise CheckpointError("the checkpoint's config is not a dict: the file is corrupt or not mvGPT's")
    known = {f.name: f.default for f in fields(GPTConfig)}
    missing = sorted(known.keys() - saved.keys())
    shapes = [m for m in missing if m in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")]
    if shapes:  # every checkpoint we ever wrote has its shapes: a default would only fail at the weights
        raise CheckpointError(f"the checkpoint's config has no {', '.join(shapes)}: the file is damaged or not "
                              "mvGPT's")
    if missing:  # settings added since (rope, its base and scaling): an older checkpoint has the defaults
        log.warning("checkpoint config has no %s: using defaults (%s)", ", ".join(missing),
                    ", ".join(f"{m}={known[m]!r}" for m in missing))
    values = {k: v for k, v in saved.items() if k in known}
    for name, value in values.items():
        kind, number = type(known[name]), isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind is bool:
            sane = isinstance(value, bool)
        elif kind is int:
            sane = number and isinstance(value, int) and value >= 1
        elif kind is float:
            sane = number and math.isfinite(value) and value > 0
        else:
            sane = True  # a field of another kind checks itself in GPTConfig
        if not sane:
            raise CheckpointError(f"the checkpoint's config has {name}={value!r}, which no model can have: "
                                  "the file is corrupt or crafted; use another checkpoint")
    try:
        return GPTConfig(**values)
    except (TypeError, ValueError, ZeroDivisionError) as e:
        raise CheckpointError(f"the checkpoint's config is inconsistent ({e}): use another checkpoint") from None


def check_fits(config: GPTConfig, weights: dict, file: Path) -> None:
    """Before allocating: a model this size (weights, a KV cache of two windows) fits in memory,
    and the weights hold at least a tensor per block (a block count no file backs is crafted)."""
    kv = 2 * config.n_layer * 2 * config.block_size * config.n_embd * 4  # keys and values, float32
    need = 4 * (config.vocab_size + config.block_size + 12 * config.n_layer * config.n_embd) * config.n_embd + kv
    have = memory_bytes()
    if config.n_layer > len(weights):
        raise CheckpointError(f"checkpoint {file} does not match its config ({config.n_layer} blocks from "
                              f"{len(weights)} tensors): the file is crafted or corrupt; use another checkpoint")
    if have is not None and need > have:
        raise CheckpointError(f"checkpoint {file} asks for {need / 2**30:,.1f} GiB (n_layer={config.n_layer}, "
                              f"n_embd={config.n_embd}, block_size={config.block_size}), more than this "
                              f"machine's {have / 2**30:,.0f} GiB: the file is crafted or corrupt")


def load_model(
    path: str | os.PathLike,
    device: str | torch.device = "cpu",
    tokenizer_hash: str | None = None,
) -> tuple[GPT, dict]:
    """Rebuild a checkpoint's model on device (eval mode); returns (model, the checkpoint dict).

    With tokenizer_hash (the one in data/), a checkpoint trained with another tokenizer is refused.
    """
    state = read_checkpoint(path)  # into CPU memory; the model goes to device once built
    saved = state.get("tokenizer_hash")
    if tokenizer_hash is not None and saved is not None and saved != tokenizer_hash:
        raise CheckpointError(
            f"checkpoint {checkpoint_path(path)} was trained with tokenizer {saved}, but the data read has "
            f"{tokenizer_hash}: prepare the data it was trained on, or pass --data-dir"
        )
    config = config_from_dict(state["config"])
    vocab = tokenizer_vocab(tokenizer_hash)  # the data's token ids, where this process read the data
    if vocab is not None and config.vocab_size != vocab:  # ids past the tokenizer's, or tokens past the table
        raise CheckpointError(f"checkpoint {checkpoint_path(path)} reads {config.vocab_size} token ids, but the data's "
                              f"tokenizer makes {vocab}: pass the --data-dir it was trained with")
    if not isinstance(state["model"], dict):
        raise CheckpointError(f"{checkpoint_path(path)} is not an mvGPT checkpoint (its model is not a dict)")
    check_fits(config, state["model"], checkpoint_path(path))
    model = GPT(config)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        raise CheckpointError(
            f"checkpoint {checkpoint_path(path)} does not match its config ({str(e).splitlines()[0]})"
        ) from None
    return model.to(device).eval(), state


# ----------------------------------------------------------------------------------------------
# The models a path holds: run folders, checkpoint files, LoRA adapters on their base


@dataclass
class ModelSource:
    name: str  # what the tables call it: the run folder's name (and the base, for an adapter)
    given: str  # the path as the user gave it
    checkpoint: Path  # the weights to load
    adapter: Path | None = None  # LoRA, applied unmerged on top

    def files(self) -> tuple[str, str | None]:
        """The files read, as the disk knows them: two paths to one model give the same pair."""
        return os.path.realpath(self.checkpoint), self.adapter and os.path.realpath(self.adapter)


def existing_path(text: str) -> str:
    """An argparse type: a path that exists (what it holds is sorted out by find_models)."""
    if not text.strip():  # Path(" ") may exist as a file named " "; Path("") is the folder the script runs in
        raise argparse.ArgumentTypeError(no_checkpoint(text))
    if not Path(text).exists():
        raise argparse.ArgumentTypeError(f"nothing at {text}: give a run folder or a checkpoint file "
                                         "(train one with `python scripts/pretrain.py`), or check the path")
    return text


def model_arg(text: str) -> str:
    """An argparse type for one model: a checkpoint, or a LoRA run (read on its base by find_models),
    as a run folder or a file, checked to be there."""
    return text if text.strip() and adapter_path(text).is_file() else checkpoint_arg(text)


def base_candidates(adapter_file: Path, recorded: object) -> list[Path]:
    """Where an adapter's base may be: the path it recorded, that name beside the adapter's folder,
    then every other checkpoint there."""
    home = adapter_file.parent.parent  # checkpoints/, for checkpoints/lora-rope/adapter.pt
    found = []
    if isinstance(recorded, str) and recorded:
        found += [Path(recorded), home / Path(recorded).name]
    found += sorted(p.parent for p in home.glob(f"*/{checkpoint_path('.').name}"))
    unique = []
    for path in found:
        if checkpoint_path(path).is_file() and checkpoint_path(path).resolve() not in {
                checkpoint_path(u).resolve() for u in unique}:
            unique.append(path)
    return unique


def find_base(adapter_file: Path, tokenizer_hash: str | None) -> Path:
    """The checkpoint an adapter was trained on (same config, tokenizer and weights), or a one-line error."""
    state = read_adapter(adapter_file)
    recorded = state.get("base")
    other_data = None  # a base that is there, trained on other data than --data-dir's: that is what to fix
    for candidate in base_candidates(adapter_file, recorded):
        try:
            model, _ = load_model(candidate, "cpu", None)
            check_base(state, model, adapter_file, None, weights_hash(model))
            load_model(candidate, "cpu", tokenizer_hash)  # the base it is: now, is the data the base's?
        except CheckpointError as e:
            if other_data is None and "tokenizer" in str(e) and "trained with" in str(e):
                other_data = e
            continue
        return checkpoint_path(candidate)
    if other_data is not None:
        raise other_data
    where = f"at {recorded} or beside its folder" if recorded else "beside its folder"
    raise CheckpointError(f"adapter {adapter_file}: no checkpoint {where} holds the base it was trained on: "
                          "fine-tune it again on the base you have")


def find_models(paths: list[str], tokenizer_hash: str | None = None) -> tuple[list[ModelSource], list[str]]:
    """(the models the paths hold, one reason per path that holds none), in the order given."""
    models, skipped, seen = [], [], {}
    for text in paths:
        if not text.strip():  # Path("") is ".", the folder the script runs in: not what a blank argument meant
            skipped.append(f"{text!r} (an empty path: name a run folder or a .pt file)")
            continue
        path = Path(text)
        if path.is_dir():
            weights, adapter = checkpoint_path(path), adapter_path(path)
        elif path.suffix == ".pt":  # a file: a checkpoint, or an adapter saved under its own name
            weights, adapter = (None, path) if is_adapter(path) else (path, None)
        elif not path.exists():
            skipped.append(f"{text} (nothing there: check the path; `ls checkpoints` lists the run folders)")
            continue
        else:
            skipped.append(f"{text} (not a run folder or a .pt file: name a run folder, e.g. "
                           "checkpoints/pretrain-rope, or the .pt file in it)")
            continue
        if weights is not None and weights.is_file():
            models.append(ModelSource(path.name, text, weights))
        elif adapter.is_file():
            try:
                base = find_base(adapter, tokenizer_hash)
            except CheckpointError as e:
                skipped.append(f"{text} ({reason(e)})")
                continue
            models.append(ModelSource(f"{path.name} (LoRA on {base.parent.name})", text, base, adapter))
        else:
            runs = run_folders(path)
            skipped.append(f"{text} (no checkpoint or LoRA adapter in it" + (
                f"; it holds run folders: name them, e.g. {text.rstrip('/')}/*)" if runs else
                ": name a run folder, one that holds a ckpt.pt or an adapter.pt)"))
            continue
        same = seen.setdefault(models[-1].files(), text)
        if same is not text:  # one model named twice (pretrain, ./pretrain/, pretrain/ckpt.pt): one row, not two
            models.pop()
            skipped.append(f"{text} (the same model as {same})")
    return models, skipped


def find_model(path: str, tokenizer_hash: str | None = None) -> ModelSource:
    """The one model a path holds, for a script that takes one (a LoRA run: on its base), or a
    one-line error saying why there is none."""
    models, skipped = find_models([path], tokenizer_hash)
    if not models:
        raise CheckpointError(f"no model at {skipped[0]}")
    return models[0]


def is_adapter(file: Path) -> bool:
    """Whether a .pt file holds a LoRA adapter (its own dict), not a checkpoint."""
    try:
        return "lora" in read_adapter(file)
    except CheckpointError:
        return False


def reason(e: CheckpointError) -> str:
    return str(e).removeprefix("error: ")


def load_source(source: ModelSource, device: torch.device | str, tokenizer_hash: str | None = None) -> GPT:
    """The model a source names, on device, in eval mode (an adapter applied unmerged)."""
    model, _ = load_model(source.checkpoint, device, tokenizer_hash)
    if source.adapter is not None:
        load_adapter(model, source.adapter, tokenizer_hash)
    return model.eval()


def read_models(paths: list[str], device: torch.device | str,
                tokenizer_hash: str | None = None) -> list[tuple[str, GPT]]:
    """(name, model) for every model the paths hold, for a reading script. What holds none, or
    cannot be read (corrupt, another tokenizer), is told in one line; none at all is an error
    that gives the reasons."""
    models, skipped = find_models(paths, tokenizer_hash)
    loaded = []
    for source in models:
        try:
            loaded.append((source.name, load_source(source, device, tokenizer_hash)))
        except CheckpointError as e:
            skipped.append(f"{source.given} ({reason(e)})")
    if not loaded:  # nothing to read: the reasons are the error
        raise CheckpointError("no model to read: " + "; ".join(skipped))
    if skipped:
        print(f"skipped {len(skipped)}: " + "; ".join(skipped))
    return loaded
