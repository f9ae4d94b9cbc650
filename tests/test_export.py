"""Export to HF transformers: the exported models compute what ours do, token for token.

Tiny models on the CPU; the parameters are perturbed away from their init (biases zero, LayerNorm
weights one) so a bias or a norm mapped to the wrong place cannot go unnoticed.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import tiny_model

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here may reach the Hub (read when huggingface_hub is imported)
pytestmark = pytest.mark.extra("export")  # transformers, safetensors (tests/conftest.py)
pytest.importorskip("transformers", reason="needs the export extra: pip install -e '.[export]'")

import export as export_script  # noqa: E402  (scripts/export.py, on the path from conftest)
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from mvgpt.checkpoint import save_checkpoint  # noqa: E402
from mvgpt.export.hf import export, per_head_qkv, save_tokenizer  # noqa: E402
from mvgpt.extension.long_context import set_context  # noqa: E402
from mvgpt.extension.rope_scaling import RopeScaling  # noqa: E402
from mvgpt.model import GPT  # noqa: E402
from mvgpt.tokenizer import Tokenizer, train_tokenizer  # noqa: E402

ATOL = 1e-5
TEXTS = [
    'Zoë and José went to the café. "Look, a kite 🪁!" said Mia.\n\nThe end.<|endoftext|>Once upon a time',
    "naïve façade — 日本語, emoji 👨‍👩‍👧 and 🙂🙂\r\n\ttabs,   spaces    and\n\n\nnewlines  ",
    "<|endoftext|><|endoftext|>Lily's dog didn't bark!!!... 12345 67",
    "",
]


@pytest.fixture(scope="module")
def tokenizer(data_dir) -> Tokenizer:
    return Tokenizer.load(data_dir / "tokenizer.json")


def model_for(tokenizer: Tokenizer, rope: bool, seed: int = 0, **overrides) -> GPT:
    model = tiny_model(seed, rope=rope, vocab_size=tokenizer.vocab_size, **overrides)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model


def exported(model: GPT, tokenizer: Tokenizer, outdir) -> torch.nn.Module:
    export(model, tokenizer, outdir)
    hf, info = AutoModelForCausalLM.from_pretrained(outdir, dtype=torch.float32, output_loading_info=True)
    assert info["missing_keys"] == set() or info["missing_keys"] == []
    assert not info["unexpected_keys"]
    return hf.eval()


def tokens(tokenizer: Tokenizer, B: int, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, tokenizer.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("rope", [False, True], ids=["gpt2", "neox"])
def test_logits_equal(tokenizer, tmp_path, rope):
    model = model_for(tokenizer, rope)
    hf = exported(model, tokenizer, tmp_path)
    assert type(hf).__name__ == ("GPTNeoXForCausalLM" if rope else "GPT2LMHeadModel")
    assert hf.get_output_embeddings().weight.data_ptr() == hf.get_input_embeddings().weight.data_ptr()  # tied
    idx = tokens(tokenizer, 2, model.config.block_size)
    with torch.no_grad():
        ours, _ = model(idx)
        theirs = hf(idx).logits
    assert theirs.dtype == torch.float32
    torch.testing.assert_close(theirs, ours, atol=ATOL, rtol=0)


@pytest.mark.parametrize("rope", [False, True], ids=["gpt2", "neox"])
def test_greedy_generation_equal_inside_the_window(tokenizer, tmp_path, rope):
    model = model_for(tokenizer, rope, seed=1)
    hf = exported(model, tokenizer, tmp_path)
    prompt = torch.tensor([tokenizer.encode("Lily saw")])
    n = model.config.block_size - prompt.shape[1]  # prompt and story fill the window exactly
    ours = torch.cat(list(model.generate(prompt, n, temperature=0)), dim=1)
    # eos_token_id=None: ours does not stop at <|endoftext|>, so neither may transformers here
    theirs = hf.generate(prompt, max_new_tokens=n, do_sample=False, eos_token_id=None)[:, prompt.shape[1]:]
    assert theirs.shape == (1, n)
    assert theirs.tolist() == ours.tolist()


@pytest.fixture(scope="module")
def rich_tokenizer(corpus_dir) -> Tokenizer:
    # the test corpus runs out of merges at ~350 tokens: every word is then one token, and test
    # text that is not a word has to be merged in exactly tiktoken's order
    text = (corpus_dir / "train.txt").read_text(encoding="utf-8")
    return train_tokenizer(text.split("<|endoftext|>"), vocab_size=400)


@pytest.mark.parametrize("which", ["data", "rich"])
def test_tokenizer_encodes_and_decodes_as_ours(tokenizer, rich_tokenizer, tmp_path, which):
    tok = tokenizer if which == "data" else rich_tokenizer
    save_tokenizer(tok, tmp_path, model_max_length=16)
    hf = AutoTokenizer.from_pretrained(tmp_path)
    assert hf.eos_token == "<|endoftext|>" and hf.eos_token_id == tok.eot and len(hf) == tok.vocab_size
    for text in TEXTS:
        ids = tok.encode(text)
        assert hf.encode(text, add_special_tokens=False) == ids, text
        assert hf(text)["input_ids"] == ids, text  # nothing added around the text
        assert hf.decode(ids) == text == tok.decode(ids)
    assert hf.encode("<|endoftext|>", add_special_tokens=False) == [tok.eot]
    everything = list(range(tok.vocab_size))  # every token decodes to the same bytes
    assert hf.decode(everything) == tok.decode(everything)


def test_neox_qkv_is_ordered_per_head():
    C, H = 6, 3  # head size 2: rows [q h0 h1 h2 | k h0 h1 h2 | v ...] -> [h0 q k v | h1 q k v | ...]
    rows = torch.arange(3 * C)
    assert per_head_qkv(rows, H).tolist() == [0, 1, 6, 7, 12, 13, 2, 3, 8, 9, 14, 15, 4, 5, 10, 11, 16, 17]
    weight = torch.arange(3 * C).repeat_interleave(C).reshape(3 * C, C)
    assert per_head_qkv(weight, H)[:, 0].tolist() == per_head_qkv(rows, H).tolist()


def check_scaled(tokenizer, tmp_path, model: GPT, lengths: list[int], method: str) -> dict:
    hf = exported(model, tokenizer, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for T in lengths:
        idx = tokens(tokenizer, 1, T, seed=T)
        with torch.no_grad():
            ours, _ = model(idx)
            theirs = hf(idx).logits
        where = f"{method} at {T} tokens"
        torch.testing.assert_close(theirs, ours, atol=ATOL, rtol=0, msg=lambda m, where=where: f"{where}: {m}")
    return config["rope_parameters"]


@pytest.mark.parametrize("factor", [None, 2.5])
def test_linear_scaling_equal_past_the_training_context(tokenizer, tmp_path, factor):
    model = model_for(tokenizer, True, seed=2)
    set_context(model, 64, "linear", factor)  # train_ctx 16
    rope = check_scaled(tokenizer, tmp_path, model, [64, 40, 8], "linear")
    assert rope["rope_type"] == "linear" and rope["factor"] == (factor or 4.0)


def test_yarn_equal_past_the_training_context(tokenizer, tmp_path):
    model = model_for(tokenizer, True, seed=3, n_embd=64)  # head 32: ramp bounds fall inside the pairs
    set_context(model, 64, "yarn")
    # mvGPT's yarn is on for every length once ctx > train_ctx, as transformers' always is
    rope = check_scaled(tokenizer, tmp_path, model, [64, 50, 8], "yarn")
    assert rope == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32.0,
                    "beta_slow": 1.0, "rope_theta": 10000.0, "partial_rotary_factor": 1.0}


@pytest.mark.parametrize("factor", [None, 2.0])
def test_dynamic_ntk_equal_in_a_full_forward(tokenizer, tmp_path, factor):
    model = model_for(tokenizer, True, seed=4)
    set_context(model, 64, "dynamic-ntk", factor)
    # transformers' dynamic keeps the longest length it has seen, so lengths go up (see docs/export.md)
    rope = check_scaled(tokenizer, tmp_path, model, [8, 16, 40, 64], "dynamic-ntk")
    assert rope["rope_type"] == "dynamic" and rope["factor"] == (factor or 1.0)


def test_linear_fine_tuned_model_exports_its_factor(tokenizer, tmp_path):
    model = model_for(tokenizer, True, seed=5, block_size=32, rope_linear_factor=2.0)
    assert check_scaled(tokenizer, tmp_path / "a", model, [32, 12], "fine-tuned")["factor"] == 2.0
    set_context(model, 96, "linear")  # and read 3x further on top
    assert check_scaled(tokenizer, tmp_path / "b", model, [96], "fine-tuned + linear")["factor"] == 6.0


@pytest.mark.parametrize(
    "rope, overrides, scaling, message",
    [
        (True, {}, ("linear-when-needed", 64), "no transformers equivalent; exportable: none, linear, dynamic-ntk"),
        (True, {}, ("pr-nonlinear", 64), "'pr-nonlinear' has no transformers equivalent"),
        (True, {}, ("ntk", 64), "'ntk' has no transformers equivalent"),
        (True, {}, ("yarn", 16), "yarn at --ctx 16 .* leaves mvGPT's rotary angles unchanged"),
        (True, {"rope_linear_factor": 2.0}, ("yarn", 64), "cannot combine with yarn"),
        (True, {"rope_linear_factor": 2.0}, ("dynamic-ntk", 64), "cannot combine with dynamic-ntk"),
        (False, {}, ("linear", 64), "--rope-scaling needs a rope model"),
    ],
)
def test_what_transformers_cannot_compute_is_refused(tokenizer, tmp_path, rope, overrides, scaling, message):
    model = model_for(tokenizer, rope, **overrides)
    model.rope_scaling = RopeScaling(scaling[0], train_ctx=16, ctx=scaling[1])
    with pytest.raises(SystemExit, match=message) as e:
        export(model, tokenizer, tmp_path / "out")
    assert str(e.value.code).startswith("error: ") and "\n" not in str(e.value.code)
    assert not (tmp_path / "out").exists()  # refused before anything is written


def saved_checkpoint(tokenizer, tmp_path, rope: bool) -> str:
    model = model_for(tokenizer, rope, seed=6)
    args = {"rope": rope, "max_steps": 40, "batch_size": 4, "lr": 0.002, "init_from": None, "rope_scaling": "none"}
    return str(save_checkpoint(tmp_path / "run", model, step=40, args=args, tokenizer_hash=tokenizer.hash))


def test_script_exports_a_checkpoint(tokenizer, data_dir, tmp_path):
    ckpt = saved_checkpoint(tokenizer, tmp_path, rope=True)
    out = tmp_path / "hf"
    export_script.main([ckpt, str(out), "--data-dir", str(data_dir), "--ctx", "48", "--rope-scaling", "yarn"])
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md"} <= names
    readme = (out / "README.md").read_text()
    assert ckpt in readme and "Training context: 16 tokens" in readme and "step 40" in readme
    assert "max_steps=40" in readme and "GPTNeoXForCausalLM" in readme
    config = json.loads((out / "config.json").read_text())
    assert config["rope_parameters"]["factor"] == 3.0 and config["max_position_embeddings"] == 48


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--rope-scaling", "ntk", "--ctx", "64"], "'ntk' has no transformers equivalent"),
        (["--ctx", "64"], "--ctx and --rope-factor need --rope-scaling"),
        (["--rope-scaling", "yarn", "--ctx", "64", "--rope-factor", "2"], "--rope-factor is for linear and dynamic"),
    ],
)
def test_script_errors_in_one_line(tokenizer, data_dir, tmp_path, extra, message):
    ckpt = saved_checkpoint(tokenizer, tmp_path, rope=True)
    with pytest.raises(SystemExit, match=message) as e:
        export_script.main([ckpt, str(tmp_path / "hf"), "--data-dir", str(data_dir), *extra])
    assert str(e.value.code).startswith("error: ") and "\n" not in str(e.value.code)
