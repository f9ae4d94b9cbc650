"""mvgpt/perf/threads.py: the threads follow the cores other programs leave free, driven by a made-up machine."""

from __future__ import annotations

import os

import pytest

from mvgpt.perf.measure import cores_taken
from mvgpt.perf.threads import Threads, cpu_threads, describe, fitting

HZ = os.sysconf("SC_CLK_TCK")


class Machine:
    """A clock and /proc's ticks, moved by hand: `run(seconds, others, ours)` spends that many seconds with
    other programs keeping `others` cores busy, and this process `ours`."""

    def __init__(self) -> None:
        self.now, self.busy, self.mine, self.threads = 0.0, 0, 0, []

    def run(self, seconds: float, others: float, ours: float) -> None:
        self.now += seconds
        self.busy += round((others + ours) * seconds * HZ)
        self.mine += round(ours * seconds * HZ)

    def threads_of(self, others: float) -> Threads:
        t = Threads(cores=2, every_s=10.0, clock=lambda: self.now, ticks=lambda: (self.busy, self.mine),
                    sleep=lambda s: self.run(s, others, 0.0), set_threads=self.threads.append)
        return t


def test_the_threads_that_fit_are_the_cores_left_rounded_and_one_at_least():
    assert [fitting(2, taken) for taken in (0.0, 0.4, 0.6, 1.0, 1.6, 2.0)] == [2, 2, 1, 1, 1, 1]
    assert [fitting(8, taken) for taken in (0.0, 2.4, 2.6, 7.9)] == [8, 6, 5, 1]
    assert cores_taken((100, 10), (100 + 3 * HZ, 10 + 2 * HZ), 2.0) == 0.5  # 3 cores' seconds busy, 2 of them ours
    assert cores_taken(None, (1, 1), 1.0) is None and cores_taken((1, 1), (2, 2), 0.0) is None


@pytest.mark.parametrize("others, threads, said", [(0.0, 2, "2 threads (2 cores, none taken)"),
                                                   (1.0, 1, "1 thread (2 cores, other programs keep 1.0 busy)")])
def test_a_run_starts_on_the_cores_other_programs_leave_free(others, threads, said):
    machine = Machine()
    t = machine.threads_of(others)
    assert t.start() == said and t.threads == threads and machine.threads == [threads]


def test_a_core_taken_mid_run_is_followed_after_two_looks_and_given_back_after_two_more():
    machine = Machine()
    t = machine.threads_of(0.0)
    t.start()
    machine.run(5.0, 0.0, 2.0)
    assert t.check() is None  # under every_s since the last look: nothing read
    machine.run(6.0, 0.0, 2.0)
    assert t.check() is None and t.threads == 2  # quiet: 2 threads, as they are
    machine.run(11.0, 0.7, 1.3)  # a busy loop comes: with our 2 threads, it gets about two thirds of a core
    assert t.check() is None and t.threads == 2  # once: a burst of a few seconds changes nothing
    machine.run(11.0, 0.7, 1.3)
    assert t.check() == "other programs keep 0.7 of the 2 cores busy: 1 thread now" and machine.threads == [2, 1]
    machine.run(11.0, 1.0, 1.0)  # on 1 thread: the loop keeps its core, we keep ours
    assert t.check() is None and t.threads == 1
    machine.run(11.0, 0.0, 1.0)  # it ends: the other core idles
    assert t.check() is None
    machine.run(11.0, 0.0, 1.0)
    assert t.check() == "other programs keep 0.0 of the 2 cores busy: 2 threads now" and machine.threads == [2, 1, 2]


def test_a_step_wrapped_looks_at_the_machine_before_each_call_and_says_when_the_threads_change():
    machine, said, calls = Machine(), [], []
    t = machine.threads_of(0.0)
    t.start()
    step = t.around(lambda token, cache: calls.append((token, cache)) or "logits", said.append)
    for _ in range(3):
        machine.run(11.0, 0.8, 1.2)
        assert step("token", "cache") == "logits"
    assert calls == [("token", "cache")] * 3 and said == ["other programs keep 0.8 of the 2 cores busy: 1 thread now"]


def test_threads_given_are_kept_and_a_gpu_or_several_processes_leave_torchs_own(monkeypatch):
    import torch

    before = torch.get_num_threads()
    try:
        assert cpu_threads(1, "cpu") is None and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert cpu_threads(None, "cuda") is None and cpu_threads(None, "cpu", processes=2) is None
    assert isinstance(cpu_threads(None, "cpu"), Threads)
    assert describe(1) == "1 thread" and describe(4, 4, 0.1) == "4 threads (4 cores, none taken)"


def test_a_child_waited_for_is_this_programs_own_work_not_another_programs():
    """The main job runs each stage as a script and waits for it: its ticks are the job's, not taken."""
    import os
    import subprocess
    import sys

    from mvgpt.perf.measure import cpu_ticks

    before = cpu_ticks()
    subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"  # a second of one core
                    "while time.process_time() - t < 1.0: pass"], check=True)
    after = cpu_ticks()
    assert after[1] - before[1] >= 0.9 * os.sysconf("SC_CLK_TCK")  # ours, so not counted as another program's
