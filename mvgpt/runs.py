"""The models a reading script is pointed at: run folders, checkpoint files, LoRA adapters on their base.

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
from dataclasses import dataclass
from pathlib import Path

import torch

from mvgpt.checkpoint import CheckpointError, checkpoint_arg, checkpoint_path, load_model
from mvgpt.lora import adapter_path, check_base, load_adapter, read_adapter, weights_hash
from mvgpt.model import GPT


@dataclass
class ModelSource:
    name: str  # what the tables call it: the run folder's name (and the base, for an adapter)
    given: str  # the path as the user gave it
    checkpoint: Path  # the weights to load
    adapter: Path | None = None  # LoRA, applied unmerged on top


def existing_path(text: str) -> str:
    """An argparse type: a path that exists (what it holds is sorted out by find_models)."""
    if not Path(text).exists():
        raise argparse.ArgumentTypeError(f"nothing at {text}: give a run folder or a checkpoint file "
                                         "(train one with `python scripts/pretrain.py`), or check the path")
    return text


def model_arg(text: str) -> str:
    """An argparse type for one model: a checkpoint, or a LoRA run (read on its base by find_models),
    as a run folder or a file, checked to be there."""
    return text if adapter_path(text).is_file() else checkpoint_arg(text)


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
    for candidate in base_candidates(adapter_file, recorded):
        try:
            model, _ = load_model(candidate, "cpu", tokenizer_hash)
            check_base(state, model, adapter_file, tokenizer_hash, weights_hash(model))
        except CheckpointError:
            continue
        return checkpoint_path(candidate)
    where = f"at {recorded} or beside its folder" if recorded else "beside its folder"
    raise CheckpointError(f"adapter {adapter_file}: no checkpoint {where} holds the base it was trained on: "
                          "fine-tune it again on the base you have")


def find_models(paths: list[str], tokenizer_hash: str | None = None) -> tuple[list[ModelSource], list[str]]:
    """(the models the paths hold, one reason per path that holds none), in the order given."""
    models, skipped = [], []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            weights, adapter = checkpoint_path(path), adapter_path(path)
        elif path.suffix == ".pt":  # a file: a checkpoint, or an adapter saved under its own name
            weights, adapter = (None, path) if is_adapter(path) else (path, None)
        else:
            skipped.append(f"{text} (not a run folder or a .pt file)")
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
            skipped.append(f"{text} (no checkpoint or LoRA adapter in it)")
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
