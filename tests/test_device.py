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


# ----------------------------------------------------------------------------------------------
# Apple's GPU (MPS) has no float64: nothing the model runs may make a float64 tensor off the CPU


class Float64OffTheCPU(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every operation whose result is a float64 tensor on a device other than the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        results = out if isinstance(out, tuple | list) else [out]
        if any(isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.device.type != "cpu" for t in results):
            self.seen.append(str(func))
        return out


@pytest.mark.parametrize("method", ["none", "linear", "ntk", "yarn", "dynamic-ntk"])
def test_the_model_generate_and_the_scaled_tables_make_no_float64_tensor_off_the_cpu(method):
    """The "meta" device stands in for a GPU (it keeps shapes and dtypes, no data): the model reads its
    angles there, through generate past twice the window (the table grows on the device), with each
    scaled table (long_context.set_context) and dynamic NTK's, whose angles are made at every step."""
    from conftest import tiny_model

    from mvgpt.long_context import DynamicNTKCache, set_context

    model = tiny_model(rope=True)  # block_size 16: the table holds 32 positions, then grows
    if method != "none":
        set_context(model, 32, method)
    model.to("meta")
    prompt = torch.zeros(1, 5, dtype=torch.long, device="meta")
    with Float64OffTheCPU() as mode:
        for _ in model.generate(prompt, 60, temperature=0):
            pass
        model(torch.zeros(2, 16, dtype=torch.long, device="meta"), torch.zeros(2, 16, dtype=torch.long, device="meta"))
    assert mode.seen == []
    assert model.angles.cos.device.type == "meta" and model.angles.cos.dtype == torch.float32
    if method == "dynamic-ntk":
        assert model.new_cache.func is DynamicNTKCache
    else:  # the table grew, on the device, in float32
        assert model.angles.cos.shape[0] > 60
