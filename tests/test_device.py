import math
import time

import pytest
import torch

from mvgpt.device import machine, pick_device, sync
from mvgpt.perf.measure import time_it


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

    from mvgpt.extension.long_context import DynamicNTKCache, set_context

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


# ----------------------------------------------------------------------------------------------
# On a CUDA GPU (skipped without one; dev/gpu_check.sh runs these first)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here (dev/gpu_check.sh runs these on one)")


@cuda
def test_on_a_cuda_gpu_the_cache_gives_the_full_forwards_logits_and_the_angles_grow_in_float32():
    from conftest import tiny_model

    from mvgpt.model import KVCache

    model = tiny_model(rope=True).cuda()
    idx = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(1)).cuda()
    full, _ = model(idx)  # 40 positions: the table of 32 grows, on the GPU
    cache = KVCache(model.config, 2, capacity=40, device="cuda")
    steps = torch.cat([model(idx[:, i : i + 1], cache=cache)[0] for i in range(40)], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-4, rtol=0)
    assert model.angles.cos.device.type == "cuda" and model.angles.cos.dtype == torch.float32
    tokens = torch.cat(list(model.generate(idx[:1, :5], 60, temperature=0)), dim=1)  # sliding past the window
    assert tokens.shape == (1, 60) and tokens.device.type == "cuda"


@cuda
def test_on_a_cuda_gpu_pretrain_trains_in_the_dtype_auto_picks(data_dir, tmp_path):
    import pretrain

    from mvgpt.device import dtype_name, resolve_dtype

    summary = pretrain.main(["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16",
                             "--batch-size", "4", "--eval-batches", "1", "--max-steps", "3", "--device", "cuda",
                             "--data-dir", str(data_dir), "--out-dir", str(tmp_path / "run"),
                             "--runs-dir", str(tmp_path / "runs")])
    assert summary["steps"] == 3 and summary["dtype"] == dtype_name(resolve_dtype("auto", "cuda"))
    assert "cuda" in summary["machine"] and math.isfinite(summary["val_loss"])


@cuda
def test_on_a_cuda_gpu_bench_measures_decoding():
    import bench

    result = bench.main(["--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--block-size", "16", "--vocab-size",
                         "64", "--batch-size", "2", "--batches", "1,2", "--device", "cuda", "--quick", "--only",
                         "decoding"])
    assert result["device"] == "cuda" and result["decoding"]["cached_ms"] > 0
    assert set(result["decoding"]["cached_ms_by_dtype"]) == {"float32", "bfloat16"}
