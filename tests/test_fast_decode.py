"""mvgpt/perf/fast_decode.py and mvgpt/perf/one_token.c: the C one-token step computes what the eager step does
(float32 to float rounding, the sums added in another order; bf16 to bf16's rounding), sample.py and
context.py get the same tokens and losses with it, and it is put in place only where it pays.

`run` runs Python in a process of its own: tests/test_decode_vs_llama.py and test_decode_parts.py use it
for their scripts (llama.cpp's library, once loaded, stays)."""

import argparse
import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import context
import pytest
import torch
from conftest import ROOT, tiny_model

import mvgpt.perf.fast_decode as fd
from mvgpt.checkpoint import save_checkpoint
from mvgpt.data import data_tokenizer_hash
from mvgpt.export.gguf import ggml_activation
from mvgpt.extension.long_context import SinkCache, set_context
from mvgpt.lora import apply_lora
from mvgpt.model import KVCache

# float32: the C step's sums are added in another order (and with FMA), a few units of the last place
# of logits near 1; bf16: a few units of bf16's last place (1/256 near 1), as both round to bf16 where
# the eager step stores a value, but from sums added in another order
FLOAT32_ATOL, BF16_ATOL = 1e-5, 2e-2


def run(code: str) -> None:
    """Python code in a process of its own, with the tests' and the scripts' folders importable."""
    path = os.pathsep.join(str(p) for p in (ROOT / "tests", ROOT / "scripts", ROOT))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=path),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


C_STEP_LINE = re.compile(r"decoding with the C step \(mvgpt/perf/one_token\.c(, built in \d+\.\d s)?\)")


# ----------------------------------------------------------------------------------------------
# Where it pays: the choice, with injected measurements (nothing is built here)


def test_break_even_is_the_build_time_over_the_time_saved_per_token():
    assert fd.break_even_tokens(eager_ms=5.0, fast_ms=2.0, build_s=6.0) == pytest.approx(2000.0)
    assert fd.break_even_tokens(eager_ms=2.0, fast_ms=2.0, build_s=6.0) is None  # saves nothing: never pays
    assert fd.break_even_tokens(eager_ms=2.0, fast_ms=3.0, build_s=0.0) is None  # slower: never pays


def test_fast_decode_pays_from_the_measured_figures_of_its_dtype(monkeypatch):
    monkeypatch.setattr(fd, "c_builds_here", lambda device: True)
    measured = {"float32": (5.0, 2.0, 6.0), "bfloat16": (4.0, 4.5, 1.0)}
    assert fd.fast_decode_pays("cpu", torch.float32, 2000, measured)
    assert not fd.fast_decode_pays("cpu", torch.float32, 1999, measured)
    assert not fd.fast_decode_pays("cpu", torch.bfloat16, 10**9, measured)  # slower there: never
    assert not fd.fast_decode_pays("cpu", torch.float16, 10**9, measured)  # not measured: no
    monkeypatch.setattr(fd, "c_builds_here", lambda device: False)
    assert not fd.fast_decode_pays("cpu", torch.float32, 10**9, measured)  # no C compiler: no


def test_cc_is_run_as_the_shell_splits_it(monkeypatch):
    """$CC with a wrapper or flags is the command the user meant, not a name looked up and missed; without
    $CC, the first compiler on the PATH; with none there, none (and the C step is not built here)."""
    for given, command in [("ccache gcc", ["ccache", "gcc"]), ("gcc -O2", ["gcc", "-O2"]),
                           ("  '/opt/my cc/bin/gcc' -g ", ["/opt/my cc/bin/gcc", "-g"]),
                           ("no-such-compiler", ["no-such-compiler"])]:  # building with it then says why
        monkeypatch.setenv("CC", given)
        assert fd.compiler() == command and fd.c_builds_here("cpu")
    assert not fd.c_builds_here("meta")
    monkeypatch.setenv("CC", " ")
    monkeypatch.setenv("PATH", "")
    assert fd.compiler() is None and not fd.c_builds_here("cpu")


@pytest.fixture
def fresh_build():
    """Nothing built yet in this process, and nothing kept after: the next test builds the real step again."""
    fd.library.cache_clear(), fd.build_error.cache_clear()
    yield
    fd.library.cache_clear(), fd.build_error.cache_clear()


def fake_compiler(folder: Path, body: str, name: str = "cc") -> Path:
    """A shell script standing in for the C compiler: `body` runs with the compiler's arguments; $out is
    the library it is asked for (the argument after -o)."""
    fake = folder / name
    fake.write_text('#!/bin/sh\nfor a in "$@"; do [ "$prev" = -o ] && out=$a; prev=$a; done\n' + body + "\n")
    fake.chmod(0o755)
    return fake


def eager_tokens(model) -> torch.Tensor:
    prompt = torch.tensor([[1, 2, 3]])
    return torch.cat(list(model.generate(prompt, 24, temperature=0)), dim=1)


REAL_CC = next(shutil.which(name) for name in ("cc", "gcc", "clang") if shutil.which(name))  # this machine's
CC_FAILURES = {  # the fake compiler's body, and the one line the C step's absence is said in
    "fails": ("echo 'cc: fatal error: no space left on device' >&2; exit 1",
              "cc could not build one_token.c: cc: fatal error: no space left on device"),
    "makes nothing": ("exit 0", "cc said it built one_token.c but made no one_token.so: set CC to a C compiler"),
    "makes no library": ('echo "not a library" > "$out"',
                         "cc made a one_token.so that does not load (file too short): set CC to a C compiler for "
                         "this machine"),
    "makes another library": ('echo "int other(void) { return 0; }" > "$out.c" && '
                              f'exec {REAL_CC} -shared -fPIC -o "$out" "$out.c"',
                              "cc made a one_token.so without one_token in it: set CC to a C compiler"),
}


@pytest.mark.parametrize("failure", list(CC_FAILURES))
def test_a_compiler_that_fails_leaves_the_models_step_and_says_why_in_one_line(monkeypatch, tmp_path, fresh_build,
                                                                                failure):
    body, said = CC_FAILURES[failure]
    monkeypatch.setenv("CC", str(fake_compiler(tmp_path, body)))
    model = tiny_model(rope=True)
    eager = eager_tokens(model)
    before = set(Path(tempfile.gettempdir()).glob("mvgpt-*"))
    with pytest.raises(RuntimeError) as error:
        fd.library()
    assert str(error.value) == said and fd.build_error() == said
    assert set(Path(tempfile.gettempdir()).glob("mvgpt-*")) == before  # nothing left behind either
    for choice in ("c", "auto"):  # auto: where it would pay
        monkeypatch.setattr(fd, "fast_decode_pays", lambda device, dtype, tokens: True)
        assert fd.use_decode_step(model, choice, 10**6) == f"decoding with model.py's step, not the C step: {said}"
        assert "decode" not in vars(model) and eager_tokens(model).equal(eager)


def test_a_compiler_that_cannot_be_run_leaves_the_models_step(monkeypatch, tmp_path, fresh_build):
    """Not there, or not executable: the OSError of launching it, in one line."""
    model = tiny_model(rope=True)
    eager = eager_tokens(model)
    (tmp_path / "cc").write_text("#!/bin/sh\nexit 0\n")  # not executable
    for cc, why in [(tmp_path / "cc", "Permission denied"), (tmp_path / "none" / "gcc", "No such file or directory")]:
        fd.library.cache_clear(), fd.build_error.cache_clear()
        monkeypatch.setenv("CC", f"{cc} -O2")
        said = f"{cc} could not be run ({why}): set CC to a C compiler, or install one (cc, gcc or clang)"
        assert fd.build_error() == said
        assert fd.use_decode_step(model, "c", 100) == f"decoding with model.py's step, not the C step: {said}"
        assert "decode" not in vars(model) and eager_tokens(model).equal(eager)


def test_a_compiler_that_hangs_is_stopped_with_what_it_started(monkeypatch, tmp_path, fresh_build):
    """A build still going after BUILD_TIMEOUT_S is stopped, the compiler's own children too (as gcc's cc1),
    and the model's step decodes."""
    pid = tmp_path / "pid"
    monkeypatch.setenv("CC", str(fake_compiler(tmp_path, f"sleep 60 & echo $! > {pid}; wait")))
    monkeypatch.setattr(fd, "BUILD_TIMEOUT_S", 1.0)
    model = tiny_model(rope=True)
    t0 = time.monotonic()
    said = fd.use_decode_step(model, "c", 100)
    assert time.monotonic() - t0 < 10
    assert said == ("decoding with model.py's step, not the C step: cc was still building one_token.c after 1 s, "
                    "so it was stopped: set CC to a compiler that works")
    child = Path(f"/proc/{pid.read_text().strip()}/status")
    assert not child.exists() or "zombie" in child.read_text()  # the sleep it started is gone too
    assert "decode" not in vars(model)


def test_cc_with_a_wrapper_and_flags_builds_the_step(monkeypatch, tmp_path, fresh_build):
    """CC='wrapper gcc -DMVGPT_TEST': the wrapper is run, with the compiler and its flags first, as typed."""
    seen = tmp_path / "seen"
    wrapper = fake_compiler(tmp_path, f'echo "$@" > {seen}; exec "$@"', name="wrapper")
    monkeypatch.setenv("CC", f"{wrapper} {REAL_CC} -DMVGPT_TEST")
    model = tiny_model(rope=True)
    eager = eager_tokens(model)
    said = fd.use_decode_step(model, "c", 100)
    assert C_STEP_LINE.fullmatch(said) and isinstance(model.decode, fd.FastDecode)
    assert seen.read_text().startswith(f"{REAL_CC} -DMVGPT_TEST -O2 ")
    assert eager_tokens(model).equal(eager)


def test_the_built_library_leaves_no_file_behind(fresh_build):
    before = set(Path(tempfile.gettempdir()).glob("mvgpt-*"))
    fd.library()
    assert set(Path(tempfile.gettempdir()).glob("mvgpt-*")) == before


def test_not_covered_knows_the_episodes_modules_only():
    model = tiny_model(rope=True)
    assert fd.not_covered(model) is None
    assert fd.not_covered(tiny_model(rope=True).half()) == "its weights are float16, not float32 or bfloat16"
    assert fd.not_covered(tiny_model(rope=True).to("meta")) == "its weights are on meta, not the CPU"
    set_context(model, 32, "linear")  # another table of angles: read in Python, so any will do
    assert fd.not_covered(model) is None
    with ggml_activation(model):
        assert fd.not_covered(model) == "blocks.0.mlp has a forward of its own"
    apply_lora(model)
    assert fd.not_covered(model) == "blocks.0.attn.qkv is a LoRALinear"


# ----------------------------------------------------------------------------------------------
# --decode-step: the one flag, and what it puts in place


def test_decode_step_flag_is_one_choice_of_three_auto_by_default():
    p = argparse.ArgumentParser()
    fd.add_decode_step_arg(p)
    assert p.parse_args([]).decode_step == "auto" and p.parse_args(["--decode-step", "c"]).decode_step == "c"
    with pytest.raises(SystemExit):
        p.parse_args(["--decode-step", "compiled"])
    q = argparse.ArgumentParser()
    fd.add_decode_step_arg(q, default="model")
    assert q.parse_args([]).decode_step == "model"


def test_each_choice_puts_its_step_in_place_and_says_which(monkeypatch):
    monkeypatch.setattr(fd, "MEASURED", {"float32": (5.0, 2.0, 0.3)})  # pays after 100 tokens
    rope, learned, lora = tiny_model(rope=True), tiny_model(), tiny_model(rope=True)
    apply_lora(lora)
    assert fd.use_decode_step(rope, "model", 10**6) == "decoding with model.py's step (--decode-step model)"
    assert fd.use_decode_step(rope, "auto", 99) == ("decoding with model.py's step: building the C step would not "
                                                    "pay for 99 tokens (--decode-step c: build it anyway)")
    assert fd.use_decode_step(learned, "auto", 10**6) == (
        "decoding with model.py's step: auto takes the C step for rope models, whose cache slides (--decode-step c: "
        "here too)")
    assert fd.use_decode_step(lora, "auto", 10**6) == fd.use_decode_step(lora, "c", 1) == (
        "decoding with model.py's step, not the C step: blocks.0.attn.qkv is a LoRALinear")
    assert not any("decode" in vars(m) for m in (rope, learned, lora))
    assert C_STEP_LINE.fullmatch(fd.use_decode_step(rope, "auto", 100))
    assert isinstance(rope.decode, fd.FastDecode)
    assert C_STEP_LINE.fullmatch(fd.use_decode_step(learned, "c", 1))  # c: wherever it builds, learned positions too
    assert isinstance(learned.decode, fd.FastDecode)


# ----------------------------------------------------------------------------------------------
# The same logits, tokens and losses


def logits_side_by_side(model, stream: torch.Tensor, window: int, atol: float) -> tuple[KVCache, KVCache]:
    """The eager step and the C step through `stream` (B, T), each with its own cache, sliding to keep
    window - 1 held once `window` are: their logits equal to `atol` at every step. Returns both caches."""
    fast = fd.FastDecode(model)
    assert fast.why_not is None
    dtype = model.wte.weight.dtype
    caches = [KVCache(model.config, stream.shape[0], dtype=dtype) for _ in range(2)]
    with torch.no_grad():
        for cache in caches:
            model(stream[:, :1], cache=cache)
        for t in range(1, stream.shape[1]):
            logits = []
            for step, cache in zip((model.decode, fast), caches, strict=True):
                if cache.length == window:
                    cache.slide(window - 1)
                logits.append(step(stream[:, t : t + 1], cache))
            assert logits[1].dtype == logits[0].dtype and logits[1].shape == logits[0].shape
            torch.testing.assert_close(logits[1], logits[0], atol=atol, rtol=0, msg=f"token {t}")
    eager, fast_cache = caches
    assert (fast_cache.position, fast_cache.length, fast_cache.offset) == (eager.position, eager.length, eager.offset)
    held = slice(eager.offset, eager.offset + eager.length)  # the keys and values it wrote into the cache
    torch.testing.assert_close(fast_cache.k[:, :, :, held], eager.k[:, :, :, held], atol=atol, rtol=0)
    torch.testing.assert_close(fast_cache.v[:, :, :, held], eager.v[:, :, :, held], atol=atol, rtol=0)
    return eager, fast_cache


@pytest.mark.parametrize("dtype, atol", [(torch.float32, FLOAT32_ATOL), (torch.bfloat16, BF16_ATOL)])
@pytest.mark.parametrize("rope", [True, False])
def test_the_c_step_gives_the_eager_steps_logits(rope, dtype, atol):
    """Through a prompt, the cache filling up, sliding and compacting its storage (rope; learned positions
    stop at the window): the tiny shape's rows fill the vectors (32 channels, heads of 16)."""
    model = tiny_model(rope=rope).to(dtype)
    stream = torch.randint(0, 64, (1, 60 if rope else 16), generator=torch.Generator().manual_seed(8))
    eager, fast = logits_side_by_side(model, stream, 16, atol)
    if rope:  # it compacted: the held rows were moved to the front of the storage at least once
        assert fast.position == 60 and fast.offset + fast.length < fast.position


@pytest.mark.parametrize("dtype, atol", [(torch.float32, FLOAT32_ATOL), (torch.bfloat16, BF16_ATOL)])
def test_rows_that_do_not_fill_a_vector_and_several_sequences(dtype, atol):
    """24 channels in heads of 12 and 61 tokens: the scalar loops after the vector ones, and a last block of
    fewer than 4 rows; 3 sequences at once, as context.py could batch them."""
    model = tiny_model(rope=True, n_embd=24, n_head=2, vocab_size=61).to(dtype)
    stream = torch.randint(0, 61, (3, 40), generator=torch.Generator().manual_seed(2))
    logits_side_by_side(model, stream, 16, atol)


def test_greedy_tokens_equal_the_eager_ones():
    model = tiny_model(rope=True)
    prompt = torch.randint(0, 64, (1, 3), generator=torch.Generator().manual_seed(8))
    greedy = torch.cat(list(model.generate(prompt, 40, temperature=0)), dim=1)
    model.decode = fd.FastDecode(model)
    assert torch.cat(list(model.generate(prompt, 40, temperature=0)), dim=1).equal(greedy)


def test_a_token_outside_the_vocabulary_is_an_index_error_and_nothing_moves():
    model = tiny_model(rope=True)
    fast = fd.FastDecode(model)
    cache = KVCache(model.config, 2)
    model(torch.tensor([[1, 2], [3, 4]]), cache=cache)
    before = (cache.k.clone(), cache.position, cache.length)
    with pytest.raises(IndexError, match="token 64 is not in the vocabulary of 64"):
        fast(torch.tensor([[5], [64]]), cache)
    assert cache.k.equal(before[0]) and (cache.position, cache.length) == before[1:]


def test_what_it_does_not_cover_goes_to_the_models_own_step():
    """Two tokens at once: the model's logits. A cache of another dtype than the weights, a learned position
    past the table: the model's own error, not C reading memory as the wrong type or past a table's end."""
    model = tiny_model(rope=True)
    fast = fd.FastDecode(model)
    caches = [KVCache(model.config, 1) for _ in range(2)]
    for cache in caches:
        model(torch.tensor([[1]]), cache=cache)
    assert fast(torch.tensor([[2, 3]]), caches[0]).equal(model.decode(torch.tensor([[2, 3]]), caches[1]))
    bf16_cache = KVCache(model.config, 1, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="Expected query, key, and value to have the same dtype"):
        fast(torch.tensor([[2]]), bf16_cache)
    learned = tiny_model(rope=False)
    cache = KVCache(learned.config, 1)
    learned(torch.zeros(1, 16, dtype=torch.long), cache=cache)  # the table's 16 positions used
    with pytest.raises(AssertionError, match="past the learned table"):
        fd.FastDecode(learned)(torch.tensor([[1]]), cache)


def test_a_norm_without_bias_and_a_cache_laid_out_otherwise():
    """A LayerNorm whose bias was taken away reads as zeros in C; a cache whose rows are not contiguous (the
    same shape, strided otherwise) goes to the model's own step, which reads any layout."""
    model = tiny_model(rope=True)
    for block in model.blocks:
        block.ln_1.bias = None
    fast = fd.FastDecode(model)
    caches = [KVCache(model.config, 1) for _ in range(4)]
    for cache in caches[2:]:
        cache.k = cache.k.transpose(3, 4).contiguous().transpose(3, 4)
        cache.v = cache.v.transpose(3, 4).contiguous().transpose(3, 4)
    for cache in caches:
        model(torch.tensor([[1, 2]]), cache=cache)
    token = torch.tensor([[3]])
    torch.testing.assert_close(fast(token, caches[1]), model.decode(token, caches[0]), atol=FLOAT32_ATOL, rtol=0)
    assert fast(token, caches[3]).equal(model.decode(token, caches[2]))  # the model's own step, exactly


def test_what_the_model_became_since_or_a_cache_of_another_batch_goes_to_the_models_own_step():
    """Never C on memory it cannot read as it expects: a model moved to float16 or to another device after
    the step was made, tokens for more sequences than the cache holds. The model's own step answers."""
    model = tiny_model(rope=True)
    fast = fd.FastDecode(model)
    one = KVCache(model.config, 1)
    model(torch.tensor([[1]]), cache=one)
    with pytest.raises(RuntimeError, match="must match"):  # 2 tokens, a cache of 1 sequence: as the model says
        fast(torch.tensor([[2], [3]]), one)
    model.half()
    half = KVCache(model.config, 1, dtype=torch.float16)
    model(torch.tensor([[1]]), cache=half)
    assert fast(torch.tensor([[2]]), half).dtype == torch.float16
    model.to("meta")
    meta = KVCache(model.config, 1, device="meta", dtype=torch.float16)
    assert fast(torch.tensor([[2]], device="meta"), meta).device.type == "meta"


def test_a_later_model_to_is_seen():
    """step_weights are the model's own parameters: made on a float32 model, after model.to(bf16) the C step
    reads bf16 weights (the table of their addresses is made again)."""
    model = tiny_model(rope=True)
    fast = fd.FastDecode(model)
    model.to(torch.bfloat16)
    stream = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(1))
    caches = [KVCache(model.config, 1, dtype=torch.bfloat16) for _ in range(2)]
    for cache in caches:
        model(stream[:, :-1], cache=cache)
    logits = fast(stream[:, -1:], caches[0])
    assert logits.dtype == torch.bfloat16
    torch.testing.assert_close(logits, model.decode(stream[:, -1:], caches[1]), atol=BF16_ATOL, rtol=0)


def test_context_losses_with_the_c_step_equal_the_eager_ones():
    """cache_losses sliding, growing (no slide) and through a SinkCache, eager and with the C step."""
    model = tiny_model(rope=True)
    stream = torch.randint(0, 64, (1, 48), generator=torch.Generator().manual_seed(3))
    ways = {"sliding": lambda m: context.cache_losses(m, stream),
            "growing": lambda m: context.cache_losses(m, stream, slide=False),
            "sinks": lambda m: context.cache_losses(m, stream, cache=SinkCache(m.config, sinks=2, angles=m.angles))}
    eager = {name: way(model) for name, way in ways.items()}
    model.decode = fd.FastDecode(model)
    for name, way in ways.items():
        torch.testing.assert_close(way(model), eager[name], atol=FLOAT32_ATOL, rtol=0, msg=name)


@pytest.mark.parametrize("temperature", ["0", "0.8"])
def test_sample_writes_the_same_story_with_each_decode_step(data_dir, tmp_path, monkeypatch, temperature):
    """sample.py's story, greedy and sampled (seeded), with each --decode-step, past the window (16): the same
    tokens on stdout (the story alone), and which step wrote them as the first line on stderr. The default,
    auto, takes the C step where its build pays (made to pay, then not), c wherever it builds, model never;
    --no-cache has no one-token step."""
    import sample

    checkpoint = tmp_path / "r"
    save_checkpoint(checkpoint, tiny_model(vocab_size=300, rope=True), tokenizer_hash=data_tokenizer_hash(data_dir))
    argv = [str(checkpoint), "--prompt", "Lily saw", "--max-new-tokens", "40", "--temperature", temperature,
            "--data-dir", str(data_dir), "--device", "cpu", "--threads", "2"]  # threads given: not looked at
    pays, never = (10.0, 1.0, 0.0), (1.0, 1.0, 0.0)  # saves 9 ms a token, built at once; saves nothing
    cases = [([], pays, C_STEP_LINE),
             ([], never, "decoding with model.py's step: building the C step would not pay for 40 tokens "
                         "(--decode-step c: build it anyway)"),
             (["--decode-step", "auto"], pays, C_STEP_LINE),
             (["--decode-step", "c"], never, C_STEP_LINE),
             (["--decode-step", "model"], pays, "decoding with model.py's step (--decode-step model)"),
             (["--no-cache", "--decode-step", "c"], pays,
              "decoding with model.py's forward over the last window for each token (--no-cache)")]
    stories = []
    for flags, figures, first_line in cases:
        monkeypatch.setitem(fd.MEASURED, "float32", figures)
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            stories.append(sample.main(argv + flags))
        said = stderr.getvalue().splitlines()
        assert len(said) == 1 and (re.fullmatch(first_line, said[0]) if isinstance(first_line, re.Pattern)
                                   else said[0] == first_line), (flags, said)
        assert stdout.getvalue() == "Lily saw" + stories[-1] + "\n"  # the story, and nothing else
    assert len(stories[0]) > 0 and all(story == stories[0] for story in stories), stories


def test_sample_with_a_compiler_that_fails_writes_with_the_models_step(data_dir, tmp_path, monkeypatch, fresh_build):
    """The C step is an optimisation, never a failure: sample.py says why in its first line and writes the
    story model.py's step writes."""
    import sample

    checkpoint = tmp_path / "r"
    save_checkpoint(checkpoint, tiny_model(vocab_size=300, rope=True), tokenizer_hash=data_tokenizer_hash(data_dir))
    argv = [str(checkpoint), "--prompt", "Lily saw", "--max-new-tokens", "40", "--temperature", "0",
            "--data-dir", str(data_dir), "--device", "cpu", "--threads", "2"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        eager = sample.main([*argv, "--decode-step", "model"])
    monkeypatch.setenv("CC", str(fake_compiler(tmp_path, CC_FAILURES["fails"][0])))
    stderr = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        story = sample.main([*argv, "--decode-step", "c"])
    assert stderr.getvalue() == f"decoding with model.py's step, not the C step: {CC_FAILURES['fails'][1]}\n"
    assert story == eager
