"""mvgpt/fast_decode.py: the compiled one-token step computes what the eager step does (float32 to
float rounding, the sums added in another order; bf16 to bf16's rounding), sample.py and context.py
get the same tokens and losses with it, and it is put in place only where it pays.

The checks that compile run in a process of their own (inductor is hundreds of MB, and stays), as
tests/test_bench.py does."""

import contextlib
import io
import os
import subprocess
import sys

import context
import pytest
import torch
from conftest import ROOT, tiny_model

import mvgpt.fast_decode as fd
from mvgpt.checkpoint import save_checkpoint
from mvgpt.data import data_tokenizer_hash
from mvgpt.gguf import ggml_activation
from mvgpt.long_context import SinkCache, set_context
from mvgpt.lora import apply_lora
from mvgpt.model import KVCache

# float32: the compiled sums are added in another order (and with FMA), a few units of the last place
# of logits near 1; bf16: a few units of bf16's last place (1/256 near 1), as the eager bf16 step rounds
# its activations between operations and the compiled one at other places
FLOAT32_ATOL, BF16_ATOL = 1e-5, 2e-2


def run(code: str) -> None:
    """Python code in a process of its own, with the tests' and the scripts' folders importable."""
    path = os.pathsep.join(str(p) for p in (ROOT / "tests", ROOT / "scripts", ROOT))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=path),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


# ----------------------------------------------------------------------------------------------
# Where it pays: the choice, with injected measurements (nothing compiles here)


def test_break_even_is_the_compile_time_over_the_time_saved_per_token():
    assert fd.break_even_tokens(eager_ms=5.0, fast_ms=2.0, warmup_s=6.0) == pytest.approx(2000.0)
    assert fd.break_even_tokens(eager_ms=2.0, fast_ms=2.0, warmup_s=6.0) is None  # saves nothing: never pays
    assert fd.break_even_tokens(eager_ms=2.0, fast_ms=3.0, warmup_s=0.0) is None  # slower: never pays


def test_fast_decode_pays_from_the_measured_figures_of_its_dtype(monkeypatch):
    monkeypatch.setattr(fd, "inductor_builds_here", lambda device: True)
    measured = {"float32": (5.0, 2.0, 6.0), "bfloat16": (4.0, 4.5, 1.0)}
    assert fd.fast_decode_pays("cpu", torch.float32, 2000, measured)
    assert not fd.fast_decode_pays("cpu", torch.float32, 1999, measured)
    assert not fd.fast_decode_pays("cpu", torch.bfloat16, 10**9, measured)  # slower there: never
    assert not fd.fast_decode_pays("cpu", torch.float16, 10**9, measured)  # not measured: no
    monkeypatch.setattr(fd, "inductor_builds_here", lambda device: False)
    assert not fd.fast_decode_pays("cpu", torch.float32, 10**9, measured)  # no C++ toolchain: no


def test_only_a_cpu_with_a_toolchain_compiles_the_step():
    assert not fd.inductor_builds_here("meta")


def test_use_fast_decode_leaves_the_models_step_where_it_does_not_pay(monkeypatch):
    model = tiny_model(rope=True)
    monkeypatch.setattr(fd, "MEASURED", {"float32": (5.0, 2.0, 6.0)})
    assert fd.use_fast_decode(model, 100) is None and "decode" not in vars(model)  # nothing compiled


def test_compilable_knows_the_episodes_modules_only():
    model = tiny_model(rope=True)
    assert fd.compilable(model) is None
    set_context(model, 32, "linear")  # another table of angles: read in Python, so any will do
    assert fd.compilable(model) is None
    with ggml_activation(model):
        assert "has a forward of its own" in fd.compilable(model)
    apply_lora(model)
    assert "LoRALinear" in fd.compilable(model)
    assert fd.use_fast_decode(model, 10**9) is None  # never for a model it does not cover


def test_a_model_kept_eager_where_compiling_would_pay_says_why(monkeypatch):
    monkeypatch.setattr(fd, "fast_decode_pays", lambda device, dtype, tokens: tokens >= 1000)
    model = tiny_model(rope=True)
    assert fd.eager_because(model, 10**6) is None  # one it covers: nothing to say
    apply_lora(model)
    assert fd.eager_because(model, 999) is None  # eager anyway: nothing to say
    assert fd.eager_because(model, 1000) == "blocks.0.attn.qkv is a LoRALinear"


# ----------------------------------------------------------------------------------------------
# The same logits, tokens and losses (compiled, in a process of their own)


def test_the_compiled_step_gives_the_eager_steps_logits():
    run("import test_fast_decode; test_fast_decode.compiled_step_gives_the_eager_logits()")


def compiled_step_gives_the_eager_logits() -> None:
    """Through a prompt, the cache filling up, sliding and compacting its storage: rope and learned
    positions in float32, rope in bf16; the keys and values it writes too; greedy tokens the same."""
    for rope, dtype, atol in ((True, torch.float32, FLOAT32_ATOL), (False, torch.float32, FLOAT32_ATOL),
                              (True, torch.bfloat16, BF16_ATOL)):
        model = tiny_model(rope=rope).to(dtype)
        fast = fd.FastDecode(model)
        assert fast.why_not is None and fast.warmup_s > 0
        stream = torch.randint(0, 64, (1, 60 if rope else 16), generator=torch.Generator().manual_seed(8))
        caches = [KVCache(model.config, 1, dtype=dtype) for _ in range(2)]
        offsets = []
        with torch.no_grad():
            for cache in caches:
                model(stream[:, :1], cache=cache)  # one held: the next step is the eager one's, exactly
            for t in range(1, stream.shape[1]):
                logits = []
                for step, cache in zip((model.decode, fast), caches, strict=True):
                    if cache.length == 16:
                        cache.slide(15)
                    logits.append(step(stream[:, t : t + 1], cache))
                if t == 1:
                    assert logits[1].equal(logits[0])  # fewer than 2 held: the model's own step
                torch.testing.assert_close(logits[1], logits[0], atol=atol, rtol=0)
                offsets.append(caches[1].offset)
        eager, compiled = caches
        assert (compiled.position, compiled.length, compiled.offset) == (eager.position, eager.length, eager.offset)
        held = slice(eager.offset, eager.offset + eager.length)
        torch.testing.assert_close(compiled.k[:, :, :, held], eager.k[:, :, :, held], atol=atol, rtol=0)
        torch.testing.assert_close(compiled.v[:, :, :, held], eager.v[:, :, :, held], atol=atol, rtol=0)
        if rope:
            assert any(b < a for a, b in zip(offsets[:-1], offsets[1:], strict=True)), offsets  # it compacted
        if dtype == torch.float32:
            prompt = stream[:, :3]
            greedy = torch.cat(list(model.generate(prompt, 40, temperature=0)), dim=1)
            model.decode = fast
            assert torch.cat(list(model.generate(prompt, 40, temperature=0)), dim=1).equal(greedy)


def test_context_losses_with_the_compiled_step_equal_the_eager_ones():
    run("import test_fast_decode; test_fast_decode.context_losses_equal()")


def context_losses_equal() -> None:
    """cache_losses sliding, growing (no slide) and through a SinkCache, eager and compiled."""
    model = tiny_model(rope=True)
    stream = torch.randint(0, 64, (1, 48), generator=torch.Generator().manual_seed(3))
    ways = {"sliding": lambda m: context.cache_losses(m, stream),
            "growing": lambda m: context.cache_losses(m, stream, slide=False),
            "sinks": lambda m: context.cache_losses(m, stream, cache=SinkCache(m.config, sinks=2, angles=m.angles))}
    eager = {name: way(model) for name, way in ways.items()}
    model.decode = fd.FastDecode(model)
    for name, way in ways.items():
        torch.testing.assert_close(way(model), eager[name], atol=FLOAT32_ATOL, rtol=0, msg=name)


def test_sample_writes_the_same_story_with_the_compiled_step(data_dir, tmp_path):
    save_checkpoint(tmp_path / "r", tiny_model(vocab_size=300, rope=True), tokenizer_hash=data_tokenizer_hash(data_dir))
    run(f"import test_fast_decode; test_fast_decode.sample_stories_equal({str(tmp_path / 'r')!r}, {str(data_dir)!r})")


def sample_stories_equal(checkpoint: str, data: str) -> None:
    """sample.py's story, greedy and sampled (seeded), eager (40 tokens do not pay) and compiled (made
    to pay): the same tokens, past the window (16)."""
    import sample

    for temperature in ("0", "0.8"):
        argv = [checkpoint, "--prompt", "Lily saw", "--max-new-tokens", "40", "--temperature", temperature,
                "--data-dir", data, "--device", "cpu"]
        stderr = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
            eager = sample.main(argv)
            assert "compiled" not in stderr.getvalue()
            fd.MEASURED["float32"] = (10.0, 1.0, 0.0)  # pays at once
            compiled = sample.main(argv)
            del fd.MEASURED["float32"]
        assert "compiled the one-token step" in stderr.getvalue(), stderr.getvalue()
        assert compiled == eager and len(eager) > 0, (compiled, eager)
        print(temperature, repr(eager), file=sys.stderr)
