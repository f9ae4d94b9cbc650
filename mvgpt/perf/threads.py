"""How many threads a CPU step runs on: the cores this process may use, less those other programs take now.

A CPU step splits its work between threads that meet at the end of every stage (OpenMP). When another
program holds a core, one of the threads is often off its core at a meeting, and the others wait for
it to come back. On a 2-core machine with a busy loop beside it, the training step ran about twice as
fast on 1 thread as on 2, and the one-token step too; with a second training run beside it, the same
(dev/busy_core.py, results/amd-epyc/busy-core.json). A program at the lowest priority (nice 19) takes
almost nothing from ours, and 2 threads stay the faster.

So the threads follow what the machine gives now. `Threads.check()`, called once a step, reads every
`every_s` seconds how many cores other programs kept busy meanwhile (mvgpt.perf.measure.OtherLoad),
and sets torch's threads to the cores left, once the same answer has come twice in a row (a burst of
a few seconds changes nothing). It returns a line to say when it changed them.

Example:
    threads = Threads()
    print(threads.start())                       # "2 threads (2 cores, none taken)"
    for step in range(steps):
        ...
        if (line := threads.check()):
            print(f"step {step}: {line}")
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch

from mvgpt.kit.errors import number
from mvgpt.perf.measure import cores_taken, cpu_ticks


def usable_cores() -> int:
    """The cores this process may run on (a container or taskset may give it fewer than the machine has)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threads_arg(text: str) -> int:
    """--threads: a whole number from 1 to the cores this process may use (more only wait for each other)."""
    cores = usable_cores()
    return number(int, lambda v: 1 <= v <= cores, f"a whole number from 1 to this machine's {cores} cores")(text)


def fitting(cores: int, taken: float) -> int:
    """Threads for `cores` when other programs keep `taken` of them busy: the cores left, rounded, 1 at least."""
    return max(1, min(cores, int(cores - taken + 0.5)))


class Threads:
    """torch's CPU threads, set to the cores other programs leave free, checked every `every_s` seconds."""

    def __init__(self, cores: int | None = None, every_s: float = 10.0, clock: Callable[[], float] = time.perf_counter,
                 ticks: Callable[[], tuple[int, int] | None] = cpu_ticks, sleep: Callable[[float], None] = time.sleep,
                 set_threads: Callable[[int], None] = torch.set_num_threads) -> None:
        self.cores = cores or usable_cores()
        self.every_s, self.clock, self.ticks, self.sleep, self.set_threads = every_s, clock, ticks, sleep, set_threads
        self.threads = self.cores
        self.wanted: int | None = None  # an answer seen once: it is taken when it comes again
        self.last: tuple[float, tuple[int, int] | None] | None = None

    def start(self, look_s: float = 0.3) -> str:
        """Look at the machine for a moment before the first step, and set the threads from it."""
        t0, before = self.clock(), self.ticks()
        self.sleep(look_s)
        t1, after = self.clock(), self.ticks()
        taken = cores_taken(before, after, t1 - t0)
        self.threads = fitting(self.cores, taken or 0.0)
        self.set_threads(self.threads)
        self.last = (t1, after)
        return describe(self.threads, self.cores, taken)

    def check(self) -> str | None:
        """Once a step: every `every_s` seconds, the threads that fit what other programs take now; a line when
        they change."""
        now = self.clock()
        if self.last is None:
            self.last = (now, self.ticks())
            return None
        if now - self.last[0] < self.every_s:
            return None
        after = self.ticks()
        taken = cores_taken(self.last[1], after, now - self.last[0])
        self.last = (now, after)
        if taken is None:
            return None
        # with all our threads at work, the others' share of the cores is what they take from us
        want = fitting(self.cores, taken)
        if want == self.threads:
            self.wanted = None
            return None
        if self.wanted != want:  # once: wait for the next look, a burst of a few seconds changes nothing
            self.wanted = want
            return None
        self.threads, self.wanted = want, None
        self.set_threads(want)
        return f"other programs keep {taken:.1f} of the {self.cores} cores busy: {describe(want, self.cores)} now"


    def around(self, step: Callable, say: Callable[[str], None]) -> Callable:
        """A one-token step that looks at the machine first (every `every_s` seconds): `model.decode =
        threads.around(model.decode, note)`. Whatever step it is, the model's or the C one, it runs on
        the threads the machine leaves free, and `say` hears when they change."""

        def checked(*args, **kwargs):
            if line := self.check():
                say(line)
            return step(*args, **kwargs)

        return checked


def cpu_threads(fixed: int | None, device: torch.device | str, processes: int = 1) -> Threads | None:
    """A training run's threads: --threads as given (and kept), else, on a CPU with one process, a Threads
    that follows what the machine leaves free (None: torch's own, on a GPU or under several processes)."""
    if fixed:
        torch.set_num_threads(fixed)
    return Threads() if torch.device(device).type == "cpu" and processes == 1 and not fixed else None


def describe(threads: int, cores: int | None = None, taken: float | None = None) -> str:
    """"1 thread (other programs keep 1.0 of the 2 cores busy)", as a script's first line says it."""
    what = f"{threads} thread{'s' if threads > 1 else ''}"
    if taken is None:
        return what
    busy = "none taken" if taken < 0.25 else f"other programs keep {taken:.1f} busy"
    return f"{what} ({cores} cores, {busy})"
