import pytest
import torch

from mvgpt.perf import COMPILE_PAYS_AFTER_S, compile_pays


@pytest.mark.parametrize("device, dtype, seconds, compiler, pays", [
    ("cpu", torch.bfloat16, 600.0, True, True),  # the episode's ten minutes, in bf16 on a CPU
    ("cpu", torch.bfloat16, COMPILE_PAYS_AFTER_S, True, True),
    ("cpu", torch.bfloat16, COMPILE_PAYS_AFTER_S - 1, True, False),  # too short to earn it back
    ("cpu", torch.float32, 600.0, True, False),  # float32 on a CPU: the compiled step is barely faster
    ("cpu", torch.bfloat16, 600.0, False, False),  # no C++ compiler for inductor's loops
    ("cpu", torch.bfloat16, 600.0, "no headers", False),  # a compiler, but no Python.h to build against
    ("cuda", torch.bfloat16, 600.0, True, False),  # not measured here: --compile asks for it
])
def test_compile_pays_for_long_bf16_runs_on_a_cpu_with_a_compiler(
    monkeypatch, tmp_path, device, dtype, seconds, compiler, pays
):
    monkeypatch.setattr("mvgpt.perf.shutil.which", lambda name: f"/usr/bin/{name}" if compiler else None)
    (tmp_path / "include").mkdir()
    if compiler != "no headers":
        (tmp_path / "include" / "Python.h").write_text("")
    monkeypatch.setattr("mvgpt.perf.sysconfig.get_paths", lambda: {"include": str(tmp_path / "include")})
    assert compile_pays(device, dtype, seconds) is pays


def test_compile_does_not_pay_where_inductor_wants_another_toolchain(monkeypatch):
    monkeypatch.setattr("mvgpt.perf.shutil.which", lambda name: f"C:/mingw/bin/{name}.exe")
    monkeypatch.setattr("mvgpt.perf.platform.system", lambda: "Windows")
    assert compile_pays("cpu", torch.bfloat16, 600.0) is False
