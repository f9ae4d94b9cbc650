import contextlib
import json

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model

from mvgpt.device import autocast, bf16_pays, dtype_name, resolve_dtype


def tokens(model, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, model.config.vocab_size, (2, model.config.block_size), generator=g)
    return x, x.roll(-1, dims=1)


def test_autocast_gives_bf16_logits_and_a_float32_loss():
    model = tiny_model(rope=True)
    x, y = tokens(model)
    with autocast("cpu", torch.bfloat16):
        logits, loss = model(x, y)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32  # the loss: autocast's float32 list
    assert torch.equal(loss, F.cross_entropy(logits.float().flatten(0, 1), y.flatten()))


def test_parity_script_compares_float32_and_bf16_at_every_evaluation(data_dir, tmp_path, monkeypatch):
    import precision_parity

    out = tmp_path / "parity.json"
    monkeypatch.chdir(tmp_path)  # the run folders go to the default --out-dir, under here
    result = precision_parity.main(["--eager", "--max-steps", "4", "--eval-every", "2", "--every-step", "1", "2",
                                    "--data-dir", str(data_dir), "--json", str(out), "--",
                                    "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16",
                                    "--batch-size", "2", "--eval-batches", "1"])
    assert result == json.loads(out.read_text())
    assert result["dtypes"] == ["float32", "bfloat16"] and [r["step"] for r in result["rows"]] == [1, 2, 4]
    for r in result["rows"]:
        assert r["difference"] == r["bfloat16"] - r["float32"] and r["float32"] != r["bfloat16"]
    assert result["max_abs_difference"] == max(abs(r["difference"]) for r in result["rows"])
    assert result["within_tolerance"] == (result["max_abs_difference"] <= result["tolerance"])
    # --eager's own default folder: the compiled comparison's checkpoints/precision is left alone
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["precision-eager"]
    assert (tmp_path / "checkpoints" / "precision-eager" / "bfloat16" / "ckpt.pt").is_file()


def test_resolve_dtype_takes_a_named_dtype_as_asked_and_auto_from_the_hardware():
    assert resolve_dtype("float32", "cpu") == torch.float32 and resolve_dtype("bfloat16", "cpu") == torch.bfloat16
    assert resolve_dtype("auto", "cpu") == (torch.bfloat16 if bf16_pays(torch.device("cpu")) else torch.float32)
    with pytest.raises(ValueError, match="unknown dtype 'float16'"):
        resolve_dtype("float16", "cpu")


def test_apples_gpu_trains_in_float32_unless_asked_and_autocasts_to_bf16_when_asked():
    """MPS's choices, held without MPS: nothing here touches the device (bf16_pays decides before any
    product), so they hold on any machine."""
    assert resolve_dtype("auto", "mps") == torch.float32 and bf16_pays(torch.device("mps")) is False
    assert resolve_dtype("bfloat16", "mps") == torch.bfloat16
    assert isinstance(autocast("mps", torch.float32), contextlib.nullcontext)  # float32: no autocast at all
    asked = autocast("mps", torch.bfloat16)
    assert isinstance(asked, torch.autocast) and (asked.device, asked.fast_dtype) == ("mps", torch.bfloat16)


def test_pretrain_uncompiled_trains_in_the_dtype_auto_resolves_to(data_dir, tmp_path):
    import pretrain

    tiny = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16", "--batch-size", "2",
            "--eval-batches", "1", "--max-steps", "2", "--data-dir", str(data_dir),
            "--runs-dir", str(tmp_path / "runs")]
    summary = pretrain.main([*tiny, "--out-dir", str(tmp_path / "auto"), "--dtype", "auto"])
    assert summary["dtype"] == dtype_name(resolve_dtype("auto", "cpu"))
