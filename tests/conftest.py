"""Shared fixtures: a small made-up corpus (no network, nothing from ../shared), tiny models."""

from __future__ import annotations

import importlib.util
import random
import shutil
from pathlib import Path

import pytest
import torch

from mvgpt.data import prepare
from mvgpt.model import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]

# What each optional extra of pyproject.toml brings: a test marked @pytest.mark.extra("export") skips, saying
# which install brings it, where one of its modules is missing. The README's set-up installs none of them, and
# `python -m pytest` is green there; .ci/run then adds them and runs `python -m pytest -m extra`.
EXTRAS = {"export": ("transformers", "safetensors", "gguf"),
          "docs": ("mkdocs", "material", "matplotlib", "latex2mathml")}


def missing(extra: str) -> list[str]:
    """The modules of an extra that this environment lacks."""
    return [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "extra(name): needs an optional extra (export, docs); skipped without it")
    config.addinivalue_line("markers", "browser: drives Debian's chromium (apt-get install -y chromium); skipped "
                                       "without it")


def pytest_collection_modifyitems(config, items) -> None:
    browser = any(shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome"))
    for item in items:
        if item.get_closest_marker("browser") and not browser:
            item.add_marker(pytest.mark.skip(reason="no chromium on PATH: apt-get install -y chromium "
                                                    "(.ci/run installs it)"))
        for mark in item.iter_markers("extra"):
            lacking = missing(mark.args[0])
            if lacking:
                item.add_marker(pytest.mark.skip(reason=f"needs the {mark.args[0]} extra ({', '.join(lacking)} "
                                                        f"missing): pip install -e '.[{mark.args[0]}]'"))


NAMES = ["Lily", "Tom", "Mia", "Ben", "Zoë", "José"]
THINGS = ["a red ball", "a big dog", "a shiny car", "a small bird", "a café", "a kite 🪁"]
VERBS = ["saw", "liked", "found", "wanted", "lost", "shared"]


def make_story(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(2, 5)):
        name, verb, thing = rng.choice(NAMES), rng.choice(VERBS), rng.choice(THINGS)
        lines.append(f"{name} {verb} {thing}. \"It is {rng.choice(['fun', 'nice', 'sad'])}!\" said {name}.")
    return "\n".join(lines)


def write_corpus(path: Path, n_stories: int, seed: int) -> Path:
    rng = random.Random(seed)
    path.write_text("".join(make_story(rng) + "\n<|endoftext|>\n" for _ in range(n_stories)), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    write_corpus(folder / "train.txt", 400, seed=1)
    write_corpus(folder / "valid.txt", 60, seed=2)
    return folder


@pytest.fixture(scope="session")
def data_dir(corpus_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data")
    prepare(corpus_dir, out, vocab_size=300)
    return out


def tiny_config(**overrides) -> GPTConfig:
    fields = dict(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
    fields.update(overrides)
    return GPTConfig(**fields)


def tiny_model(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(tiny_config(**overrides)).eval()


def sharpen(model: GPT, scale: float = 8.0) -> GPT:
    """Larger query and key weights: at init attention is nearly uniform, so positions barely
    matter; sharper attention makes a test that compares position schemes able to fail."""
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[: 2 * model.config.n_embd] *= scale
    return model
