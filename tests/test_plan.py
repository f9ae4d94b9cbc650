import math

import pytest
import torch
from conftest import tiny_config

from mvgpt.perf import plan
from mvgpt.perf.flops import forward_flops, training_flops_per_token
from mvgpt.perf.plan import (
    LORA_OVERHEAD,
    PROCESS_S,
    REPORT_S,
    SAMPLING_OVERHEAD,
    SAVE_S,
    Job,
    Progress,
    Rates,
    below_floor,
    measure,
    stages,
    steps_for,
)


def rates(**overrides) -> Rates:
    r = Rates(step_s={"learned": 2.0, "rope": 2.5}, compile_s={"learned": 40.0, "rope": 60.0},
              eager_step_s=3.0, eval_s=0.5, eval_float32_s=0.5, window_s=0.06,
              token_s=0.008, seconds=90.0)
    for k, v in overrides.items():
        setattr(r, k, v)
    return r


class Timestamps:
    """A clock whose timed calls take the given seconds, in order (plan._times reads it twice a call)."""

    def __init__(self, durations: list[float]) -> None:
        self.stamps, t = [0.0], 0.0  # the first read: measure's start
        for d in durations:
            self.stamps += [t, t + d]
            t += d
        self.stamps.append(t)  # the last: its end
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return self.stamps[self.calls - 1]


class Quiet:
    """An OtherLoad that reads no clock and saw nothing else running (or `cores`, set by a test)."""

    cores: float | None = 0.0

    def __init__(self, clock) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def test_measure_times_each_kind_once_a_round_keeps_the_median_and_the_first_calls_extra_as_compiling(monkeypatch):
    compiled = []
    monkeypatch.setattr(plan.torch, "compile", lambda model: compiled.append(model) or model)  # no inductor here
    names = ["learned", "rope", "eager", "eval", "eval float32", "window", "token", "peak"]
    first = [5.0, 9.0, 4.0, 1.0, 1.0, 0.5, 0.125, 0.5]  # compiling, warming up
    each = [1.0, 2.0, 1.5, 0.25, 0.25, 0.0625, 2**-7, 2**-9]  # binary fractions: exact sums
    rounds = []
    for r in range(5):
        one = list(each)
        one[0] = 8.0 if r == 2 else 1.0  # a burst of load, in one round: the learned step's third sample
        rounds += one
    clock = Timestamps(first + rounds)
    r = measure(tiny_config(), tiny_config(rope=True), torch.device("cpu"), torch.float32, compile=True,
                batch_size=2, clock=clock, load=Quiet)
    assert len(names) == len(first) and clock.calls == len(clock.stamps)  # every call timed, nothing else read
    assert r.step_s == {"learned": 1.0, "rope": 2.0} and r.compile_s == {"learned": 4.0, "rope": 7.0}
    assert r.spread == 8.0  # the burst shows, and is not the rate
    assert r.eager_step_s == 1.5
    assert (r.eval_s, r.eval_float32_s, r.window_s, r.token_s) == (0.25, 0.25, 0.0625, 2**-7)
    peak = 2 * 512**3 / 2**-9
    assert r.share_of_peak == 2 * 16 * training_flops_per_token(tiny_config()) / 1.0 / peak
    assert r.seconds == sum(first + rounds) and r.other_cores == 0.0
    assert r.busy() == "a training step ran at 0.00 of the matrix peak measured beside it"  # made-up seconds
    assert [m.config.rope for m in compiled] == [False, True]  # each kind's step compiled, as pretrain.py will
    # nothing left to train: the steps are not measured (nor compiled), the rest is
    clock = Timestamps(first[3:] + each[3:] * 5)
    r = measure(tiny_config(), tiny_config(rope=True), torch.device("cpu"), torch.float32, compile=True,
                batch_size=2, training=False, clock=clock, load=Quiet)
    assert r.step_s == {} and r.token_s == 2**-7 and len(compiled) == 2 and clock.calls == len(clock.stamps)


def test_the_plan_says_the_machine_is_busy_from_other_programs_or_a_step_far_below_the_peak():
    assert rates(other_cores=0.2, share_of_peak=0.4).busy() is None
    assert rates(other_cores=1.1, share_of_peak=0.4).busy() == \
        "other programs kept 1.1 cores busy while the plan measured"
    assert rates(other_cores=None, share_of_peak=0.05).busy() == \
        "a training step ran at 0.05 of the matrix peak measured beside it"


def test_a_machine_too_slow_or_busy_for_the_default_is_told_so_with_a_smaller_job():
    assert below_floor(rates()) is None  # 225 steps fit ten minutes, 300 take 12.5 of them: slow, but it trains
    busy = rates(step_s={"learned": 6.8, "rope": 6.0}, other_cores=1.1)
    assert steps_for(busy) == 75 and below_floor(busy) == (
        "this machine took 6.80 s a pretraining step while the plan measured (other programs kept 1.1 cores busy "
        "while the plan measured): ten minutes would train 75 steps a model, fewer than the 300 a useful one "
        "needs: run it when the machine is quieter, ask for the steps, `python scripts/main.py --max-steps 300` "
        f"(about {(PROCESS_S + 40 + 300 * (6.8 + (16 * 0.5 + SAVE_S) / 25)) / 60:.1f} min a model here), or "
        "check the install in minutes with `python scripts/main.py --tiny`")


def test_the_default_steps_take_the_first_kind_about_ten_minutes_and_never_more_than_1000():
    # 2 s a step, an evaluation of 8 batches of 16 every 25 steps, a checkpoint too: 2.34 s a step
    assert (600 - PROCESS_S - 40.0) / (2.0 + (16 * 0.5 + SAVE_S) / 25) == pytest.approx(235.9, abs=0.1)
    assert steps_for(rates()) == 225  # in multiples of 25
    assert steps_for(rates(step_s={"learned": 0.1})) == 1000  # a fast machine: the committed count
    assert steps_for(rates(step_s={"learned": 60.0})) == 25  # a very slow one: one evaluation's worth


def test_each_stage_is_its_work_at_the_measured_rates():
    c, W = GPT_CONFIG, 256
    r = rates()
    job = Job(steps=200, val_tokens=273_465, mixed=True, config=c)
    plan_ = {s.name: s for s in stages(r, job)}
    assert list(plan_) == ["pretrain (learned)", "pretrain (rope)", "evaluate", "context", "long-context fine-tune",
                           "sweep", "sinks", "dynamic", "LoRA fine-tune", "report"]
    # pretraining: compiling, the steps, 8 evaluations of 8 batches of 16 x 256, a checkpoint every 25 steps
    assert plan_["pretrain (learned)"].seconds == PROCESS_S + 40.0 + 200 * 2.0 + 8 * 8 * (2 * 0.5) + 8 * SAVE_S
    assert plan_["pretrain (rope)"].seconds == PROCESS_S + 60.0 + 200 * 2.5 + 8 * 8 * (2 * 0.5) + 8 * SAVE_S
    # evaluate: 1,068 windows, 134 batches of 8, for each model, in bf16 and in float32
    assert plan_["evaluate"].seconds == PROCESS_S + 2 * 134 * (0.5 + 0.5)
    assert plan_["evaluate"].what == f"{2 * 1068 * 256:,} tokens"
    # context: 8 streams of 768; 512 window re-runs for each kind, 767 cached steps, one full forward (rope)
    full = 768 * 0.5 / (8 * W) * (forward_flops(c, 768, 768) / 768) / (forward_flops(c, W, W) / W)
    assert plan_["context"].seconds == pytest.approx(PROCESS_S + 8 * (2 * 512 * 0.06 + 767 * 0.008 + full))
    # the long-context fine-tune: 80 eager steps of 4 x 1024, by flops against the measured 16 x 256
    per_step = 4 * 1024 * training_flops_per_token(GPT_LONG) / (16 * 256 * training_flops_per_token(c))
    per_token = lambda ctx: forward_flops(c, ctx, ctx) / ctx  # noqa: E731
    evaluation = 8 * 0.5 * (4 * 1024 * per_token(1024)) / (8 * 256 * per_token(256))  # 8 batches of 4 x 1024
    assert plan_["long-context fine-tune"].seconds == pytest.approx(
        PROCESS_S + 80 * per_step * 3.0 + 4 * evaluation + 4 * SAVE_S)  # evaluating and saving every 20 steps
    assert per_step > 1  # a longer context: more flops a token
    # the sweep: 7 contexts from 256 to 2,048, each read for 16,384 tokens (whole chunks) by 7 methods, 2 models
    chunks = sum(ctx * (16384 // ctx) for ctx in (256, 384, 512, 768, 1024, 1536, 2048))
    assert plan_["sweep"].what == f"{14 * chunks:,} tokens"
    # sinks: 4 streams of 1024 through three caches, and the window re-run past the first window
    assert plan_["sinks"].seconds == pytest.approx(PROCESS_S + 4 * (3 * 1023 * 0.008 + 768 * 0.06))
    # LoRA: 150 eager steps of 8 x 256 in the run's dtype (half the measured batch), 48 stories, 16 evaluations
    assert plan_["LoRA fine-tune"].seconds == pytest.approx(
        PROCESS_S + 150 * LORA_OVERHEAD * 3.0 / 2 + 2 * 24 * 160 * SAMPLING_OVERHEAD * 0.008 + 2 * 8 * 0.5)
    assert plan_["report"].seconds == REPORT_S
    # float32 runs read each model once; done and up-to-date stages take nothing
    again = Job(steps=200, val_tokens=273_465, mixed=False, config=c, done={"pretrain (learned)": 200,
                "pretrain (rope)": 150, "long-context fine-tune": 80}, skipped=("sweep",), lora=False, report=False)
    plan_ = {s.name: s for s in stages(r, again)}
    assert plan_["evaluate"].seconds == PROCESS_S + 2 * 134 * 0.5
    assert (plan_["pretrain (learned)"].seconds, plan_["pretrain (learned)"].what) == (0.0, "done")
    assert plan_["pretrain (rope)"].seconds == PROCESS_S + 60.0 + 50 * 2.5 + 2 * 8 * (2 * 0.5) + 2 * SAVE_S
    assert plan_["long-context fine-tune"].seconds == 0.0 and plan_["sweep"].seconds == 0.0
    assert "LoRA fine-tune" not in plan_ and "report" not in plan_


GPT_CONFIG = plan.GPTConfig()
GPT_LONG = plan.GPTConfig(block_size=1024)


def test_the_plan_prints_each_stage_and_the_total_then_the_time_left_after_each():
    said, now = [], [100.0]
    stages_ = [plan.Stage("pretrain (learned)", 600.0, "225 steps"), plan.Stage("evaluate", 120.0, "1 token"),
               plan.Stage("report", 30.0, "tables")]
    progress = Progress(stages_, started=10.0, clock=lambda: now[0], say=said.append, load=Quiet)
    progress.show("225 steps each")
    assert said[0].splitlines() == [
        "plan (225 steps each):",
        "  pretrain (learned)  225 steps                 10.0 min",
        "  evaluate            1 token                    2.0 min",
        "  report              tables                     0.5 min",
        "  total                                         12.5 min, 14.0 min with the 1.5 min so far"]
    now[0] = 100.0 + 630.0  # 1.05x its plan: the rest is planned again, but by less than a tenth: not said
    progress.done("pretrain (learned)")
    assert said[1] == "\n[pretrain (learned): 10.5 min (planned 10.0 min); about 2.6 min left, 12.0 min so far]"
    now[0] += 60.0
    progress.done("evaluate")  # the two stages so far: 690 s for 720 planned
    assert said[2] == "\n[evaluate: 1.0 min (planned 2.0 min); less than a minute left, 13.0 min so far]"
    assert math.isclose(progress.total, 750.0)
    assert progress.summary() == {"planned_s": 840.0, "took_s": 780.0, "stages": [
        {"stage": "pretrain (learned)", "planned_s": 600.0, "took_s": 630.0, "other_cores": 0.0,
         "left_s": pytest.approx(150.0 * 1.05)},
        {"stage": "evaluate", "planned_s": 120.0, "took_s": 60.0, "other_cores": 0.0,
         "left_s": pytest.approx(30.0 * 690 / 720)}]}


def test_a_plan_measured_in_a_busy_moment_is_planned_again_from_what_its_first_stage_took():
    """The issue's job: 75 steps planned at 6.8 s, trained at 0.9 s: the time left follows the stages."""
    said, now = [], [0.0]
    stages_ = [plan.Stage("pretrain (learned)", 600.0), plan.Stage("pretrain (rope)", 540.0),
               plan.Stage("context", 11_500.0), plan.Stage("report", 30.0)]
    progress = Progress(stages_, clock=lambda: now[0], say=said.append, load=Quiet)
    now[0] = 114.0  # 0.19x the plan
    progress.done("pretrain (learned)")
    assert said[-1] == ("\n[pretrain (learned): 1.9 min (planned 10.0 min); the stages so far took 0.19x their plan: "
                        "the rest planned again, from 201.2 min to 38.2 min; about 38.2 min left, 1.9 min so far]")
    now[0] += 540.0  # a core taken since: the rope run took its whole plan, and the estimate moves back up
    progress.done("pretrain (rope)")
    assert progress.pace == (114.0 + 540.0) / 1140.0
    assert said[-1].startswith("\n[pretrain (rope): 9.0 min (planned 9.0 min); the stages so far took 0.57x their "
                               "plan: the rest planned again, from 36.5 min to 110.2 min; about 110.2 min left")


def test_a_stage_far_slower_than_planned_is_said_with_what_other_programs_took_meanwhile():
    said, now = [], [0.0]

    class Busy(Quiet):
        cores = 1.2

    progress = Progress([plan.Stage("pretrain (rope)", 300.0), plan.Stage("report", 30.0)], clock=lambda: now[0],
                        say=said.append, load=Busy)
    now[0] = 700.0
    progress.done("pretrain (rope)")
    assert said[-1].startswith("\n[pretrain (rope): 11.7 min (planned 5.0 min); pretrain (rope) took 2.3x its plan: "
                               "other programs kept 1.2 cores busy meanwhile; ")


def test_a_stage_slowed_by_other_programs_that_then_stopped_does_not_set_the_pace_of_the_rest():
    said, now, load = [], [0.0], [1.0]

    class Measured(Quiet):  # what other programs took during each stage, as the test says
        def __exit__(self, *exc) -> None:
            self.cores = load[0]

    stages_ = [plan.Stage(name, 600.0) for name in ("pretrain (learned)", "pretrain (rope)", "context", "sweep")]
    progress = Progress(stages_, clock=lambda: now[0], say=said.append, load=Measured)
    now[0] = 900.0  # 1.5x, with a core taken: the pace after it is that stage's, the only one
    progress.done("pretrain (learned)")
    assert progress.pace == 1.5
    load[0], now[0] = 0.0, 900.0 + 540.0  # quiet again, 0.9x: the busy stage is left out of the pace
    progress.done("pretrain (rope)")
    assert progress.pace == 0.9 and progress.took[-1]["left_s"] == pytest.approx(2 * 600.0 * 0.9)
    assert ("the stages so far took 0.90x their plan (pretrain (learned) left out: other programs ran meanwhile): "
            "the rest planned again, from 30.0 min to 18.0 min; about 18.0 min left") in said[-1]
    load[0], now[0] = 1.0, now[0] + 900.0  # busy again: still running, so every stage counts
    progress.done("context")
    assert progress.pace == pytest.approx((900.0 + 540.0 + 900.0) / 1800.0)


def test_the_rates_line_names_the_steps_only_where_they_were_measured():
    assert rates().line() == ("measured in 90 s: a pretraining step 2.00 s / 2.50 s (learned / rope), its first "
                              "40 s / 60 s more; a float32 window re-run 60 ms, a cached step 8.0 ms")
    nothing_to_train = rates(step_s={}, compile_s={})  # measure(training=False): the steps are not timed
    assert nothing_to_train.line() == "measured in 90 s: a float32 window re-run 60 ms, a cached step 8.0 ms"
