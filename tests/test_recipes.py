"""dev/recipes.py: the recipes race on equal terms, and a recipe is named the way its docstring says."""

from __future__ import annotations

import pytest
import recipes

from mvgpt.train import DEFAULT_OPTIMIZER, WARMUP_SHARE, WARMUP_STEPS

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16", "--batch-size", "4",
        "--eval-batches", "2", "--eval-every", "2", "--no-compile", "--dtype", "float32"]


def test_a_recipe_raced_against_itself_ties_exactly(data_dir, tmp_path):
    """The same recipe under two names: the same seed, batches and steps, so every difference is 0."""
    out = recipes.main([*TINY, "--recipes", "baseline", "baseline:lr=0.002", "--minutes", "0", "--steps", "4",
                        "--seeds", "1", "2", "--data-dir", str(data_dir), "--json", str(tmp_path / "r.json")])
    tie = out["against_reference"]["baseline:lr=0.002"]
    assert tie["equal_time"] == [0.0, 0.0] and tie["equal_tokens"] == [0.0, 0.0]
    assert tie["equal_tokens_at"] == [256, 256]  # 4 steps of 4 windows of 16
    assert out["steps"] == {"baseline": [4, 4], "baseline:lr=0.002": [4, 4]}
    assert out["val_loss"]["baseline"][0] != out["val_loss"]["baseline"][1]  # two seeds, two runs
    assert (tmp_path / "r.json").exists()


def test_recipes_by_name_joined_and_changed():
    assert recipes.recipe("muon").muon and not recipes.recipe("baseline").muon
    both = recipes.recipe("muon+wd")
    assert both.muon and both.weight_decay == 0.5 and both.lr == recipes.RECIPES["baseline"].lr
    changed = recipes.recipe("wsd:lr=3e-3,cooldown=0.4,zero_proj=yes")
    assert (changed.schedule, changed.lr, changed.cooldown, changed.zero_proj) == ("wsd", 3e-3, 0.4, True)
    assert recipes.recipe("muon:muon_lr=0.02").muon_lr == 0.02
    with pytest.raises(SystemExit, match="no recipe 'adam'"):
        recipes.recipe("adam")
    with pytest.raises(SystemExit, match="no recipe field 'beta'"):
        recipes.recipe("baseline:beta=0.9")


def test_the_baseline_is_what_pretrain_trains_with():
    base = recipes.RECIPES["baseline"]
    assert (base.muon, DEFAULT_OPTIMIZER) == (False, "adamw")
    assert (base.lr, base.weight_decay, base.schedule, base.min_ratio) == (2e-3, 0.1, "cosine", 0.1)
    assert (base.warmup, base.warmup_share) == (WARMUP_STEPS, WARMUP_SHARE)
