import time

import pytest
import torch

from mvgpt.bench import machine, sync
from mvgpt.device import pick_device
from mvgpt.perf import time_it


def test_pick_device_prefers_what_is_there():
    expected = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    assert pick_device().type == expected
    assert pick_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_absent_cuda_is_a_one_line_error():
    with pytest.raises(SystemExit, match="no CUDA GPU is visible: use --device cpu") as e:
        pick_device("cuda")
    assert "\n" not in str(e.value.code)


def test_unknown_device_is_a_one_line_error():
    with pytest.raises(SystemExit, match="unknown device 'gpu7'"):
        pick_device("gpu7")


def test_sync_and_timing_on_cpu():
    sync("cpu")
    calls = []
    assert time_it(lambda: calls.append(1), "cpu", repeats=3, warmup=2) >= 0
    assert len(calls) == 5
    assert "cpu" in machine("cpu") and torch.__version__ in machine("cpu")


def test_time_it_gives_the_median_or_what_it_is_asked(monkeypatch):
    clock = iter([0.0, 3.0, 3.0, 4.0, 4.0, 6.0])  # clock reads: runs of 3, 1 and 2 seconds
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    assert time_it(lambda: None, "cpu", repeats=3, warmup=0) == 2.0
    clock = iter([0.0, 3.0, 3.0, 4.0, 4.0, 6.0])
    assert time_it(lambda: None, "cpu", repeats=3, warmup=0, summary=min) == 1.0  # a ceiling's: the best
