"""dev/attention_mask.py on a tiny model: the mask built in the step computes the same training as
the mask made once, and every figure the docs quote is there."""


import attention_mask
import torch

from mvgpt.perf.cpu_attention import batched_causal_attention


def test_the_mask_built_in_the_step_attends_as_the_mask_made_once():
    q, k, v = (torch.randn(2, 3, 8, 4, generator=torch.Generator().manual_seed(s)) for s in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(attention_mask.attention_mask_in_the_step(q, k, v), batched_causal_attention(q, k, v))


def test_each_kind_is_timed_with_each_mask_and_the_peak_both_ways(tmp_path):
    out = attention_mask.main(["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16",
                               "--vocab-size", "64", "--batch-size", "2", "--rounds", "2", "--peak-n", "64",
                               "--no-compile", "--json", str(tmp_path / "am.json")])
    assert [(s["kind"], s["compiled"], s["mask"]) for s in out["steps"]] == [
        ("learned", False, "made once"), ("learned", False, "built in the step"),
        ("rope", False, "made once"), ("rope", False, "built in the step")]
    assert [(q["kind"], q["same_losses"]) for q in out["pairs"]] == [("learned", True), ("rope", True)]
    once, built = out["steps"][:2]
    assert out["pairs"][0]["made_once_over_built"] == built["step_ms"] / once["step_ms"]
    assert len(out["peak_median_of_three"]) == len(out["peak_best_of_ten"]) == 10
    assert (tmp_path / "am.json").exists()
