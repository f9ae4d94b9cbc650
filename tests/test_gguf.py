"""GGUF export for llama.cpp: the file read back with gguf's reader holds our weights, the metadata
llama.cpp needs and our tokenizer; where llama.cpp itself is installed (llama-cpp-python), it
computes our logits, greedy stories and token ids.

Tiny models on the CPU, perturbed away from their init (as in test_export.py) so that a bias or a
norm in the wrong place cannot go unnoticed.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import regex
import torch
import torch.nn.functional as F
from conftest import tiny_model

pytestmark = pytest.mark.extra("export")  # gguf (tests/conftest.py)
gguf = pytest.importorskip("gguf", reason="needs the export extra: pip install -e '.[export]'")

import export as export_script  # noqa: E402  (scripts/export.py, on the path from conftest)
from gguf import GGUFReader  # noqa: E402

from mvgpt.checkpoint import save_checkpoint  # noqa: E402
from mvgpt.export.gguf import (  # noqa: E402
    export_gguf,
    ggml_activation,
    ggml_gelu,
    gguf_rope,
    llama_cpp_greedy,
    llama_cpp_logits,
    llama_cpp_missing,
    llama_cpp_model,
)
from mvgpt.export.hf import bytes_to_unicode  # noqa: E402
from mvgpt.extension.long_context import set_context  # noqa: E402
from mvgpt.extension.rope_scaling import RopeScaling  # noqa: E402
from mvgpt.model import GPT  # noqa: E402
from mvgpt.tokenizer import Tokenizer, train_tokenizer  # noqa: E402

TEXTS = [
    'Zoë and José went to the café. "Look, a kite 🪁!" said Mia.\n\nThe end.<|endoftext|>Once upon a time',
    "naïve façade — 日本語, emoji 👨‍👩‍👧 and 🙂🙂\r\n\ttabs,   spaces    and\n\n\nnewlines  ",
    "<|endoftext|><|endoftext|>Lily's dog didn't bark!!!... 12345 67 I'M HE'LL",
]


@pytest.fixture(scope="module")
def tokenizer(data_dir) -> Tokenizer:
    return Tokenizer.load(data_dir / "tokenizer.json")


@pytest.fixture(scope="module")
def rich_tokenizer(corpus_dir) -> Tokenizer:
    text = (corpus_dir / "train.txt").read_text(encoding="utf-8")
    return train_tokenizer(text.split("<|endoftext|>"), vocab_size=400)


def model_for(tokenizer: Tokenizer, rope: bool, seed: int = 0, scale: float = 0.05, **overrides) -> GPT:
    model = tiny_model(seed, rope=rope, vocab_size=tokenizer.vocab_size, **overrides)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return model


def fields(reader: GGUFReader) -> dict:
    return {name: field.contents() for name, field in reader.fields.items()}


# ----------------------------------------------------------------------------------------------
# The file, read back


@pytest.mark.parametrize("rope", [False, True], ids=["gpt2", "gptneox"])
@pytest.mark.parametrize("f16", [False, True], ids=["f32", "f16"])
def test_every_tensor_is_ours(tokenizer, tmp_path, rope, f16):
    model = model_for(tokenizer, rope)
    reader = GGUFReader(export_gguf(model, tokenizer, tmp_path / "m.gguf", f16=f16))
    got = {t.name: t for t in reader.tensors}
    expected = {
        "token_embd.weight": model.wte.weight,
        "output.weight": model.lm_head.weight,
        "output_norm.weight": model.ln_f.weight,
        "output_norm.bias": model.ln_f.bias,
    }
    if not rope:
        expected["position_embd.weight"] = model.wpe.weight
    for i, block in enumerate(model.blocks):
        for name, module in (("attn_norm", block.ln_1), ("attn_qkv", block.attn.qkv), ("attn_output", block.attn.proj),
                             ("ffn_norm", block.ln_2), ("ffn_up", block.mlp.fc), ("ffn_down", block.mlp.proj)):
            expected[f"blk.{i}.{name}.weight"] = module.weight
            expected[f"blk.{i}.{name}.bias"] = module.bias
    assert set(got) == set(expected)
    for name, param in expected.items():
        want = param.detach().numpy()
        t = got[name]
        assert list(t.shape) == list(reversed(want.shape)), name  # GGUF lists dimensions innermost first
        if f16 and want.ndim == 2:
            assert t.tensor_type == gguf.GGMLQuantizationType.F16, name
            want = want.astype(np.float16)
        else:
            assert t.tensor_type == gguf.GGMLQuantizationType.F32, name
        np.testing.assert_array_equal(np.asarray(t.data).reshape(want.shape), want, err_msg=name)


@pytest.mark.parametrize("rope", [False, True], ids=["gpt2", "gptneox"])
def test_metadata_llama_cpp_needs(tokenizer, tmp_path, rope):
    model = model_for(tokenizer, rope, block_size=24, n_head=4)
    f = fields(GGUFReader(export_gguf(model, tokenizer, tmp_path / "m.gguf")))
    arch = "gptneox" if rope else "gpt2"
    assert f["general.architecture"] == arch
    assert f["general.file_type"] == int(gguf.LlamaFileType.ALL_F32)
    assert f[f"{arch}.context_length"] == 24
    assert f[f"{arch}.embedding_length"] == 32
    assert f[f"{arch}.block_count"] == 2
    assert f[f"{arch}.feed_forward_length"] == 128
    assert f[f"{arch}.attention.head_count"] == 4
    assert f[f"{arch}.attention.layer_norm_epsilon"] == pytest.approx(1e-5)
    if rope:
        assert f["gptneox.rope.dimension_count"] == 8  # the whole head of 32 / 4
        assert f["gptneox.use_parallel_residual"] is False
        assert f["gptneox.rope.freq_base"] == 10000.0
        assert f["gptneox.rope.scaling.type"] == "none"
    else:
        assert not any(k.startswith("gpt2.rope") for k in f)
    assert f["tokenizer.ggml.model"] == "gpt2" and f["tokenizer.ggml.pre"] == "llama-bpe"
    assert f["tokenizer.ggml.bos_token_id"] == f["tokenizer.ggml.eos_token_id"] == tokenizer.eot
    assert f["tokenizer.ggml.add_bos_token"] is False
    assert f["mvgpt.tokenizer_hash"] == tokenizer.hash


def bpe_encode(tokens: list[str], merges: list[str], pattern: str, text: str) -> list[int]:
    """A GPT-2-style BPE from a GGUF's token list and merges alone: split by the pattern; a piece
    that is a token is taken whole (llama-bpe's ignore_merges); else the lowest-ranked merge first."""
    char = bytes_to_unicode()
    ids = {t: i for i, t in enumerate(tokens)}
    rank = {tuple(m.split(" ")): r for r, m in enumerate(merges)}
    out = []
    for piece in regex.findall(pattern, text):
        word = "".join(char[b] for b in piece.encode("utf-8"))
        if word in ids:
            out.append(ids[word])
            continue
        parts = list(word)
        while len(parts) > 1:
            best = min(range(len(parts) - 1), key=lambda i: rank.get((parts[i], parts[i + 1]), math.inf))
            if (parts[best], parts[best + 1]) not in rank:
                break
            parts[best : best + 2] = [parts[best] + parts[best + 1]]
        out += [ids[p] for p in parts]
    return out


@pytest.mark.parametrize("which", ["data", "rich"])
def test_vocabulary_and_merges_round_trip(tokenizer, rich_tokenizer, tmp_path, which):
    tok = tokenizer if which == "data" else rich_tokenizer
    model = model_for(tok, rope=True)
    f = fields(GGUFReader(export_gguf(model, tok, tmp_path / "m.gguf")))
    tokens, types, merges = f["tokenizer.ggml.tokens"], f["tokenizer.ggml.token_type"], f["tokenizer.ggml.merges"]
    assert len(tokens) == len(types) == tok.vocab_size
    byte = {c: b for b, c in bytes_to_unicode().items()}
    assert {bytes(byte[c] for c in t): i for i, t in enumerate(tokens[: tok.eot])} == tok.ranks  # every token
    assert tokens[tok.eot] == "<|endoftext|>"
    assert types[tok.eot] == int(gguf.TokenType.CONTROL)
    assert set(types[: tok.eot]) == {int(gguf.TokenType.NORMAL)}
    for text in TEXTS:  # the merges, applied in their order, encode as tiktoken does
        assert bpe_encode(tokens, merges, tok.pattern, text) == tok.encoding.encode_ordinary(text), text


# llama.cpp's split for the `llama-bpe` pre-tokenizer (src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_LLAMA3)
LLAMA_BPE_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                   r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def test_llama_bpe_splits_text_as_our_pattern(tokenizer):
    for text in [*TEXTS, "a\n\n\n  b \r\n\r\n c  \n", "DON'T it's THEY'RE we'VE 1234567 x\u00a0y"]:
        assert regex.findall(LLAMA_BPE_SPLIT, text) == regex.findall(tokenizer.pattern, text), repr(text)


def test_ggml_gelu_is_the_tanh_table():
    x = torch.linspace(-12, 12, 200001)
    y = ggml_gelu(x)
    assert (y[x <= -10] == 0).all() and torch.equal(y[x >= 10], x[x >= 10])
    inside = (x > -10) & (x < 10)
    x16 = x[inside].half().float()  # the table's index: x rounded to float16
    # ggml's formula, in float32 as its C code (below about -5, 1 + tanh is 0 in float32: so is GELU)
    tanh = 0.5 * x16 * (1 + torch.tanh(0.7978845608 * x16 * (1 + 0.044715 * x16 * x16)))
    # each entry is that, rounded to float16: within one float16 ulp (tanh and tanhf may differ in the last bit)
    assert ((y[inside] - tanh).abs() <= tanh.abs() * 2**-10 + 2**-24).all()
    assert torch.equal(y[inside], y[inside].half().float())  # every value a float16
    # and it is not ours: tanh vs erf differ by up to ~5e-4 (the largest near |x| = 2)
    gap = (F.gelu(x, approximate="tanh") - F.gelu(x)).abs().max().item()
    assert 1e-4 < gap < 1e-3


def test_ggml_activation_swaps_the_mlp_and_puts_it_back(tokenizer):
    model = model_for(tokenizer, rope=True)
    idx = torch.randint(0, tokenizer.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        exact = model(idx)[0]
        with ggml_activation(model):
            tanh = model(idx)[0]
            block = model.blocks[0]
            h = block.ln_2(torch.randn(1, 4, 32))
            torch.testing.assert_close(block.mlp(h), block.mlp.proj(ggml_gelu(block.mlp.fc(h))), atol=0, rtol=0)
        after = model(idx)[0]
    assert not torch.equal(exact, tanh)
    assert torch.equal(exact, after)


# ----------------------------------------------------------------------------------------------
# Rotary scaling: written where llama.cpp computes the same, refused where it does not


@pytest.mark.parametrize(
    "overrides, scaling, expected",
    [
        ({}, None, {"type": "none", "factor": None, "freq_base": 10000.0, "original_context": None}),
        ({}, ("linear", 64, None), {"type": "linear", "factor": 4.0}),
        ({}, ("linear", 64, 2.5), {"type": "linear", "factor": 2.5}),
        ({"rope_linear_factor": 2.0}, None, {"type": "linear", "factor": 2.0}),
        ({"rope_linear_factor": 2.0}, ("linear", 48, None), {"type": "linear", "factor": 6.0}),
        ({}, ("yarn", 64, None), {"type": "yarn", "factor": 4.0, "original_context": 16}),
        # head of 16: base * 4^(16/14)
        ({}, ("ntk", 64, None), {"type": "none", "freq_base": 10000.0 * 4 ** (16 / 14)}),
        ({"rope_linear_factor": 2.0}, ("ntk", 32, None), {"type": "linear", "factor": 2.0,
                                                         "freq_base": 10000.0 * 2 ** (16 / 14)}),
    ],
)
def test_rope_scaling_written(tokenizer, tmp_path, overrides, scaling, expected):
    model = model_for(tokenizer, True, **overrides)
    if scaling is not None:
        model.rope_scaling = RopeScaling(scaling[0], 16, scaling[1], scaling[2])
    rope = gguf_rope(model.config, getattr(model, "rope_scaling", None))
    for key, value in expected.items():
        assert rope[key] == pytest.approx(value) if isinstance(value, float) else rope[key] == value, key
    f = fields(GGUFReader(export_gguf(model, tokenizer, tmp_path / "m.gguf")))
    assert f["gptneox.rope.scaling.type"] == rope["type"]
    assert f["gptneox.rope.freq_base"] == pytest.approx(rope["freq_base"])
    assert f.get("gptneox.rope.scaling.factor") == (None if rope["factor"] is None else pytest.approx(rope["factor"]))
    assert f.get("gptneox.rope.scaling.original_context_length") == rope["original_context"]
    assert f["gptneox.context_length"] == 16  # the training context, whatever the scaling


@pytest.mark.parametrize(
    "rope, overrides, scaling, message",
    [
        (True, {}, ("dynamic-ntk", 64), "'dynamic-ntk' changes with the length read, which llama.cpp cannot do"),
        (True, {}, ("linear-when-needed", 64), "'linear-when-needed' .* or linear with the same --ctx"),
        (True, {}, ("pr-nonlinear", 64), "'pr-nonlinear' changes with the length read"),
        (True, {}, ("yarn", 16), "yarn at --ctx 16 .* leaves mvGPT's rotary angles unchanged"),
        (True, {}, ("ntk", 8), "ntk at --ctx 8 .* leaves mvGPT's rotary angles unchanged"),
        (True, {"rope_linear_factor": 2.0}, ("yarn", 64), "llama.cpp cannot combine with yarn"),
        (False, {}, ("linear", 64), "--rope-scaling needs a rope model"),
    ],
)
def test_what_llama_cpp_cannot_compute_is_refused(tokenizer, tmp_path, rope, overrides, scaling, message):
    model = model_for(tokenizer, rope, **overrides)
    model.rope_scaling = RopeScaling(scaling[0], train_ctx=16, ctx=scaling[1])
    with pytest.raises(SystemExit, match=message) as e:
        export_gguf(model, tokenizer, tmp_path / "m.gguf")
    assert str(e.value.code).startswith("error: ") and "\n" not in str(e.value.code)
    assert list(tmp_path.iterdir()) == []  # refused before anything is written


# ----------------------------------------------------------------------------------------------
# The script


def saved_checkpoint(tokenizer, tmp_path, rope: bool) -> str:
    model = model_for(tokenizer, rope, seed=6)
    args = {"rope": rope, "max_steps": 40, "batch_size": 4, "lr": 0.002, "init_from": None, "rope_scaling": "none"}
    return str(save_checkpoint(tmp_path / "run", model, step=40, args=args, tokenizer_hash=tokenizer.hash))


def test_script_writes_a_gguf_and_overwrites_it(tokenizer, data_dir, tmp_path, capsys):
    ckpt = saved_checkpoint(tokenizer, tmp_path, rope=True)
    out = tmp_path / "out" / "model.gguf"
    base = [ckpt, str(out), "--data-dir", str(data_dir), "--format", "gguf"]
    export_script.main([*base, "--rope-scaling", "linear", "--ctx", "48"])
    assert "llama.cpp gptneox" in capsys.readouterr().out
    f = fields(GGUFReader(out))
    assert f["gptneox.rope.scaling.factor"] == 3.0 and f["mvgpt.step"] == "40"
    with pytest.raises(SystemExit):  # an existing file is kept unless the user asks to replace it
        export_script.main([*base, "--f16"])
    assert fields(GGUFReader(out))["gptneox.rope.scaling.factor"] == 3.0
    export_script.main([*base, "--f16", "--overwrite"])  # then the second export replaces the file whole
    f = fields(GGUFReader(out))
    assert "gptneox.rope.scaling.factor" not in f and f["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_F16)
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.gguf"]  # no temporary file left


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--format", "gguf", "--rope-scaling", "dynamic-ntk", "--ctx", "64"], "llama.cpp cannot do"),
        (["--format", "gguf", "--rope-scaling", "yarn", "--ctx", "8"], "leaves mvGPT's rotary angles unchanged"),
        (["--f16"], "--f16 is for --format gguf"),
        (["--format", "gguf", "--ctx", "64"], "--ctx and --rope-factor need --rope-scaling"),
    ],
)
def test_script_errors_in_one_line(tokenizer, data_dir, tmp_path, extra, message):
    ckpt = saved_checkpoint(tokenizer, tmp_path, rope=True)
    out = tmp_path / "m.gguf"
    with pytest.raises(SystemExit, match=message) as e:
        export_script.main([ckpt, str(out), "--data-dir", str(data_dir), *extra])
    assert str(e.value.code).startswith("error: ") and "\n" not in str(e.value.code)
    assert not out.exists()


def test_script_refuses_a_folder_as_the_file(tokenizer, data_dir, tmp_path):
    ckpt = saved_checkpoint(tokenizer, tmp_path, rope=False)
    (tmp_path / "exports").mkdir()
    with pytest.raises(SystemExit, match="is a folder: give the .gguf file to write"):
        export_script.main([ckpt, str(tmp_path / "exports"), "--data-dir", str(data_dir), "--format", "gguf"])
    assert list((tmp_path / "exports").iterdir()) == []


# ----------------------------------------------------------------------------------------------
# llama.cpp itself (llama-cpp-python), where it is installed

needs_llama_cpp = pytest.mark.skipif(llama_cpp_missing() is not None, reason=str(llama_cpp_missing()))
NOISE = 5e-5  # mean float32 noise between two implementations of one computation, on logits of a few units


def random_ids(tokenizer: Tokenizer, T: int, seed: int) -> list[int]:
    return torch.randint(0, tokenizer.vocab_size, (T,), generator=torch.Generator().manual_seed(seed)).tolist()


def assert_llama_cpp_matches(theirs: torch.Tensor, model: GPT, ids: list[int]) -> None:
    """llama.cpp's logits against ours, exact and with llama.cpp's GELU swapped in.

    Against our forward with ggml's GELU, the computation is the same: the mean difference is
    float32 noise, ten times below what the GELU itself moves. Against ours as it is, the tolerance
    comes from the GELU: gap = how far swapping the GELU moves our own logits (measured on this
    input). The rest is float32 noise and the float16 table's rounding (an input near a float16
    boundary can round the other way in llama.cpp), which stays below the gap: 2 x gap in all.
    """
    with torch.no_grad():
        ours = model(torch.tensor([ids]))[0][0]
        with ggml_activation(model):
            ours_ggml = model(torch.tensor([ids]))[0][0]
    assert theirs.shape == ours.shape
    to_ggml, to_exact = (theirs - ours_ggml).abs(), (theirs - ours).abs()
    assert to_ggml.mean().item() < NOISE
    assert 10 * to_ggml.mean().item() < to_exact.mean().item()
    gap = (ours - ours_ggml).abs().max().item()
    assert to_exact.max().item() <= 2 * gap


@needs_llama_cpp
@pytest.mark.parametrize("rope", [False, True], ids=["gpt2", "gptneox"])
def test_llama_cpp_logits_equal_ours(tokenizer, tmp_path, rope):
    model = model_for(tokenizer, rope, scale=0.2)
    llm = llama_cpp_model(export_gguf(model, tokenizer, tmp_path / "m.gguf"), n_ctx=16)
    ids = random_ids(tokenizer, 16, seed=1)
    assert_llama_cpp_matches(llama_cpp_logits(llm, ids), model, ids)


@needs_llama_cpp
@pytest.mark.parametrize("method", ["linear", "yarn", "ntk", "fine-tuned linear", "fine-tuned ntk"])
def test_llama_cpp_rope_scaling_in_the_file_equal_ours(tokenizer, tmp_path, method):
    # head 32: YaRN's ramp bounds fall inside the pairs
    fine_tuned = {"rope_linear_factor": 2.0} if method.startswith("fine-tuned") else {}
    model = model_for(tokenizer, True, seed=3, scale=0.2, n_embd=64, **fine_tuned)
    if method != "fine-tuned linear":
        set_context(model, 64, method.split()[-1])
    llm = llama_cpp_model(export_gguf(model, tokenizer, tmp_path / "m.gguf"), n_ctx=64)
    ids = random_ids(tokenizer, 64, seed=2)
    assert_llama_cpp_matches(llama_cpp_logits(llm, ids), model, ids)
    plain = model_for(tokenizer, True, seed=3, scale=0.2, n_embd=64)  # the same weights, unscaled
    with torch.no_grad():  # and the scaling is what llama.cpp computes: without it, ours is far off
        assert (llama_cpp_logits(llm, ids) - plain(torch.tensor([ids]))[0][0]).abs().max() > 0.05


@needs_llama_cpp
@pytest.mark.parametrize("rope", [False, True], ids=["gpt2", "gptneox"])
def test_llama_cpp_greedy_story_equals_ours(tokenizer, tmp_path, rope):
    model = model_for(tokenizer, rope, seed=1, scale=0.3)
    llm = llama_cpp_model(export_gguf(model, tokenizer, tmp_path / "m.gguf"), n_ctx=16)
    prompt = tokenizer.encode("Lily saw")
    n = model.config.block_size - len(prompt)  # prompt and story fill the window
    ours = torch.cat(list(model.generate(torch.tensor([prompt]), n, temperature=0)), dim=1)[0].tolist()
    assert llama_cpp_greedy(llm, prompt, n) == ours


@needs_llama_cpp
@pytest.mark.parametrize("which", ["data", "rich"])
def test_llama_cpp_tokenizes_as_ours(tokenizer, rich_tokenizer, tmp_path, which):
    tok = tokenizer if which == "data" else rich_tokenizer
    llm = llama_cpp_model(export_gguf(model_for(tok, True), tok, tmp_path / "m.gguf"), n_ctx=16)
    for text in TEXTS:
        ids = tok.encode(text)
        assert llm.tokenize(text.encode("utf-8"), add_bos=False, special=True) == ids, text
        assert llm.detokenize(ids, special=True).decode("utf-8") == text


@pytest.mark.skipif(llama_cpp_missing() is None, reason="llama.cpp is installed: the check runs below instead")
def test_check_without_llama_cpp_is_a_one_line_error(tokenizer, data_dir, tmp_path):
    import export_check

    ckpt = saved_checkpoint(tokenizer, tmp_path, rope=True)
    with pytest.raises(SystemExit, match="llama.cpp is not available .*pip install llama-cpp-python") as e:
        export_check.main([ckpt, "--gguf", "--data-dir", str(data_dir), "--out", str(tmp_path / "x")])
    assert str(e.value.code).startswith("error: ") and "\n" not in str(e.value.code)


@needs_llama_cpp
def test_check_puts_llama_cpp_perplexity_beside_ours(tokenizer, data_dir, tmp_path):
    import json

    import export_check

    ckpts = [saved_checkpoint(tokenizer, tmp_path / kind, rope=kind == "rope") for kind in ("learned", "rope")]
    out = tmp_path / "llama_cpp.json"
    export_check.main([*ckpts, "--gguf", "--data-dir", str(data_dir), "--out", str(tmp_path / "x"), "--ctx", "16",
                       "32", "--sweep-tokens", "64", "--max-new-tokens", "6", "--held-out-tokens", "400",
                       "--json", str(out)])
    result = json.loads(out.read_text())
    learned, rope = result["models"]
    assert [(r["ctx"], r["method"]) for r in learned["sweep"]] == [(16, "none")]  # its table stops at 16
    assert [(r["ctx"], r["method"]) for r in rope["sweep"]] == [(c, m) for c in (16, 32)
                                                                for m in ("none", "linear", "yarn", "ntk")]
    for model in result["models"]:
        assert model["match"] and model["held_out_tokens_match"]
        for row in model["sweep"]:
            assert row["tokens"] == (64 // row["ctx"]) * (row["ctx"] // 2 - 1)  # the sweep's chunks, second halves
            assert row["loss_llama_cpp"] == pytest.approx(row["loss_mvgpt_ggml_gelu"], abs=1e-5)
    linear32 = rope["sweep"][5]
    assert linear32["llama_cpp_options"]["type"] == "linear" and linear32["llama_cpp_options"]["factor"] == 2.0


def test_each_checkpoint_exports_to_a_place_of_its_own_name(tmp_path, monkeypatch):
    """A run folder gives its name; a loose checkpoint file its stem (before: '', the OUT folder itself)."""
    import export_check

    for run in ("checkpoints/pretrain-rope", "other/pretrain-rope"):
        (tmp_path / run).mkdir(parents=True)
        (tmp_path / run / "ckpt.pt").write_bytes(b"weights")
    (tmp_path / "my.pt").write_bytes(b"weights")
    monkeypatch.chdir(tmp_path)
    ckpts = ["checkpoints/pretrain-rope", "my.pt", "other/pretrain-rope/ckpt.pt"]
    assert export_check.export_targets(Path("exports"), ckpts, gguf=False) == {
        "checkpoints/pretrain-rope": Path("exports/pretrain-rope"), "my.pt": Path("exports/my"),
        "other/pretrain-rope/ckpt.pt": Path("exports/pretrain-rope-2")}
    assert export_check.export_targets(Path("exports"), ["my.pt"], gguf=True) == {"my.pt": Path("exports/my.gguf")}
