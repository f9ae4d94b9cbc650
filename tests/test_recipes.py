"""dev/recipes.py: the recipes race on equal terms, and a recipe is named the way its docstring says."""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest
import recipes

from mvgpt.train import DEFAULT_OPTIMIZER, WARMUP_SHARE, WARMUP_STEPS, lr_at

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
    assert base.after_warmup == inspect.signature(lr_at).parameters["after_warmup"].default


def test_the_baseline_runs_the_cosine_from_the_peak_and_clock_cosine_as_it_was():
    base, before = recipes.RECIPES["baseline"], recipes.recipe("clock-cosine")
    assert recipes.recipe("after") == replace(base, what=recipes.RECIPES["after"].what)  # the winner, now the baseline
    assert not recipes.RECIPES["fifth"].after_warmup  # raced as it was: the clock's cosine, a fifth's warm-up
    assert replace(before, after_warmup=True, what=base.what) == base  # the one change
    # 2 s a step, ten minutes: the warm-up is 150 steps (half the time); the step after it is at the peak
    assert recipes.lr_of(base, 150, 300.0, 600.0, 2.0, None) == base.lr
    assert recipes.lr_of(before, 150, 300.0, 600.0, 2.0, None) == pytest.approx(0.55 * 2e-3)


@pytest.mark.parametrize("name, fix", [
    ("after:after_warmup=maybe", "after_warmup='maybe' is not a yes or no: give after_warmup=true or "
                                 "after_warmup=false"),
    ("baseline:lr=fast", "lr='fast' is not a value lr takes: give one as in lr=0.002"),
    ("baseline:lr=nan", "lr='nan' is out of range: give a value from 1e-09 to 1"),
    ("baseline:lr=-1", "lr='-1' is out of range: give a value from 1e-09 to 1"),
    ("baseline:batch_size=0", "batch_size='0' is out of range: give a value from 1 to 4096"),
    ("baseline:warmup=2.5", "warmup='2.5' is not a value warmup takes: give one as in warmup=200"),
    ("baseline:warmup_share=2", "warmup_share='2' is out of range: give a value from 0 to 1"),
    ("baseline:betas=0.9", "betas='0.9' is not a value betas takes: give one as in betas=0.9/0.99"),
    ("baseline:betas=0.9/1.5", "betas='0.9/1.5' is not a value betas takes: give one as in betas=0.9/0.99"),
    ("baseline:schedule=linear", "schedule='linear' is not a schedule: give schedule=cosine or schedule=wsd"),
    ("baseline:what=x", "'what' is a recipe's description, not a field to change: pick another field"),
    ("baseline:lr", "lr='' is not a value lr takes: give one as in lr=0.002"),
    ("baseline:__class__=x", "no recipe field '__class__' in 'baseline:__class__=x': pick from lr, betas, "
                             "weight_decay, schedule, warmup, warmup_share, min_ratio, cooldown, muon, muon_lr, "
                             "zero_proj, batch_size, after_warmup"),
])
def test_a_bad_field_value_is_one_line_naming_the_field_and_what_it_takes(name, fix):
    with pytest.raises(SystemExit) as e:
        recipes.recipe(name)
    assert str(e.value) == f"error: {fix}"


def test_field_values_of_each_kind_are_read():
    r = recipes.recipe("baseline:betas=0.9/0.99,after_warmup=no,warmup=0,batch_size=8,muon=yes,muon_lr=0.02")
    assert (r.betas, r.after_warmup, r.warmup, r.batch_size, r.muon_lr) == ((0.9, 0.99), False, 0, 8, 0.02)


def test_batch_size_flag_refuses_a_recipe_whose_change_is_its_batch(data_dir):
    with pytest.raises(SystemExit) as e:
        recipes.main([*TINY, "--recipes", "baseline", "batch8", "--minutes", "0", "--steps", "1",
                      "--data-dir", str(data_dir)])
    assert str(e.value) == ("error: batch8 sets its own batch, which --batch-size would overwrite: race it without "
                            "--batch-size, or give the batch in the recipe (baseline:batch_size=N)")
    assert recipes.RECIPES["batch8"].batch_size == 8  # left as it is


@pytest.mark.parametrize("name, problem", [
    ("wsd+wsd", "'wsd+wsd' names a recipe twice: give each once"),
    ("wsd++beta2", "no recipe '' in 'wsd++beta2': pick from"),
    ("wsd:", "'wsd:' has no change after its colon: give field=value pairs (wsd:lr=3e-3) or drop the colon"),
    ("wsd:lr=3e-3,,cooldown=0.4", "no recipe field '' in 'wsd:lr=3e-3,,cooldown=0.4': pick from"),
    ("wsd:lr=3e-3,lr=1e-3", "'wsd:lr=3e-3,lr=1e-3' changes lr twice: give it once"),
    ("baseline:cooldown=0.4", "'baseline:cooldown=0.4' sets cooldown=0.4 (only the wsd schedule has a cooldown: "
                              "schedule=wsd), which does nothing here: drop it, or set what it acts on"),
    ("baseline:muon_lr=0.02", "'baseline:muon_lr=0.02' sets muon_lr=0.02 (Muon's lr, with muon=true), which does "
                              "nothing here: drop it, or set what it acts on"),
])
def test_a_recipe_with_a_part_twice_empty_or_idle_is_refused_in_one_line(name, problem):
    with pytest.raises(SystemExit) as e:
        recipes.recipe(name)
    assert str(e.value).startswith(f"error: {problem}")


@pytest.mark.parametrize("flags, problem", [
    (["--seeds", "-1"], "argument --seeds: -1 is out of range: give a whole number from 0 to 2**63 - 1"),
    (["--seeds", "1", "1"], "give each seed once (a seed twice is the same race twice, and no spread)"),
    (["--n-embd", "30", "--n-head", "4"], "--n-embd 30 must be a multiple of --n-head 4"),
    (["--n-embd", "30", "--n-head", "2"], "--rope needs an even head size (--n-embd / --n-head), got 15"),
    (["--minutes", "1", "--steps", "5"], "--steps counts only with --minutes 0 (otherwise the recipes run on the "
                                         "clock): add --minutes 0, or drop --steps"),
    (["--minutes", "0", "--recipes", "baseline", "clock-cosine"], "clock-cosine changes only after_warmup, which "
                                                                  "acts on the clock: race it with --minutes above 0"),
    (["--minutes", "0", "--recipes", "baseline", "fifth"], "fifth changes only warmup_share and after_warmup, which "
                                                           "act on the clock: race it with --minutes above 0"),
    (["--minutes", "0", "--block-size", "100000"], "too few for windows of --block-size 100000: give a smaller "
                                                   "--block-size, or prepare more text"),
])
def test_a_race_that_cannot_run_as_asked_stops_before_its_first_step(flags, problem, data_dir, capsys):
    tiny = list(TINY)
    if "--n-embd" in flags:  # the flag's own shape, not TINY's
        tiny = TINY[:2] + TINY[6:]
    with pytest.raises(SystemExit) as e:
        recipes.main([*tiny, *flags, "--data-dir", str(data_dir)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert problem in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_model_too_big_for_the_memory_is_one_line_before_any_is_made(data_dir):
    with pytest.raises(SystemExit) as e:
        recipes.main([*TINY[:2], *TINY[6:], "--minutes", "0", "--steps", "1", "--n-embd", "65536", "--n-head", "2",
                      "--data-dir", str(data_dir)])
    assert str(e.value).startswith("error: training 1 block of 65536 channels, a window of 16, 4 sequences a step "
                                   "asks for about ") and str(e.value).endswith(": make the model or the batch smaller")
