import argparse

import pytest
from conftest import tiny_model

from mvgpt.extension.flags import add_context_args, apply_context_args, at_least, positive_float


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_context_args(p)
    p.add_argument("--n", type=at_least(2))
    p.add_argument("--x", type=positive_float)
    return p.parse_args(argv)


@pytest.mark.parametrize("argv, message", [
    (["--ctx", "0"], "argument --ctx: 0 is out of range: give a whole number >= 1"),
    (["--n", "1"], "argument --n: 1 is out of range: give a whole number >= 2"),
    (["--n", "2.5"], "argument --n: '2.5' is not a number: give a whole number >= 2"),
    (["--x", "0"], "argument --x: 0 is out of range: give a number above 0"),
    (["--x", "nan"], "argument --x: nan is not a finite number: give a number above 0"),
    (["--rope-factor", "x"], "argument --rope-factor: 'x' is not a number"),
    (["--rope-scaling", "quadratic"], "argument --rope-scaling: invalid choice"),
])
def test_bad_values_stop_at_parse_time_in_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        parse(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and "Traceback" not in err


def test_good_values_parse_and_apply():
    args = parse(["--ctx", "32", "--rope-scaling", "linear", "--rope-factor", "2", "--n", "2", "--x", "0.5"])
    assert (args.ctx, args.rope_scaling, args.rope_factor, args.n, args.x) == (32, "linear", 2.0, 2, 0.5)
    model = tiny_model(rope=True)
    apply_context_args(model, args)
    assert model.context == 32 and model.rope_scaling.s == 2.0


def test_a_context_the_model_cannot_read_is_one_line():
    with pytest.raises(SystemExit, match="^error: this model has learned positions, whose table stops at 16"):
        apply_context_args(tiny_model(), parse(["--ctx", "32"]))
