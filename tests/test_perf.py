import pytest
import torch
import torch.nn.functional as F

from mvgpt.perf.measure import COMPILE_PAYS_AFTER_S, compile_pays, kernel_names, profile, step_part, time_by_part


@pytest.mark.parametrize("device, dtype, seconds, compiler, pays", [
    ("cpu", torch.bfloat16, 600.0, True, True),  # the episode's ten minutes, in bf16 on a CPU
    ("cpu", torch.bfloat16, COMPILE_PAYS_AFTER_S, True, True),
    ("cpu", torch.bfloat16, COMPILE_PAYS_AFTER_S - 1, True, False),  # too short to earn it back
    ("cpu", torch.float32, 600.0, True, False),  # float32 on a CPU: the compiled step is barely faster
    ("cpu", torch.bfloat16, 600.0, False, False),  # no C++ compiler for inductor's loops
    ("cpu", torch.bfloat16, 600.0, "no headers", False),  # a compiler, but no Python.h to build against
    ("cuda", torch.bfloat16, 600.0, True, False),  # not measured here: --compile asks for it
    ("mps", torch.float32, 3600.0, True, False),  # Apple's GPU: inductor's Metal backend, not measured
    ("mps", torch.bfloat16, 3600.0, True, False),
])
def test_compile_pays_for_long_bf16_runs_on_a_cpu_with_a_compiler(
    monkeypatch, tmp_path, device, dtype, seconds, compiler, pays
):
    monkeypatch.setattr("mvgpt.perf.measure.shutil.which", lambda name: f"/usr/bin/{name}" if compiler else None)
    (tmp_path / "include").mkdir()
    if compiler != "no headers":
        (tmp_path / "include" / "Python.h").write_text("")
    monkeypatch.setattr("mvgpt.perf.measure.sysconfig.get_paths", lambda: {"include": str(tmp_path / "include")})
    assert compile_pays(device, dtype, seconds) is pays


def test_compile_does_not_pay_where_inductor_wants_another_toolchain(monkeypatch):
    monkeypatch.setattr("mvgpt.perf.measure.shutil.which", lambda name: f"C:/mingw/bin/{name}.exe")
    monkeypatch.setattr("mvgpt.perf.measure.platform.system", lambda: "Windows")
    assert compile_pays("cpu", torch.bfloat16, 600.0) is False


@pytest.mark.parametrize("name, part", [
    ("aten::mm", "matrix products"),
    ("aten::addmm", "matrix products"),
    ("aten::bmm", "matrix products"),
    # kernels inductor generated, named after what they fuse (from a profile of the rope model's step)
    ("graph_1_cpp_fused__to_copy_gelu_gelu_backward_sum_view_2", "GELU"),
    ("graph_1_cpp_fused__to_copy_add_gelu_gelu_backward_native_layer_norm_backward_5", "GELU"),
    ("graph_1_cpp_fused__log_softmax__log_softmax_backward_data__to_copy_add_arange_eq_0", "the loss"),
    ("graph_1_cpp_fused__softmax_add_clone_split_transpose_view_2", "attention's softmax"),
    ("graph_1_cpp_fused__softmax_backward_data_5", "attention's softmax"),
    ("graph_1_cpp_fused__to_copy_add_native_layer_norm_backward_sum_view_3", "norms"),
    ("aten::_fused_adamw_", "optimizer and clipping"),
    ("Optimizer.zero_grad#AdamW.zero_grad", "optimizer and clipping"),
    ("aten::linalg_vector_norm", "optimizer and clipping"),
    ("triton_per_fused_native_layer_norm_0", "norms"),  # a GPU's kernels are named alike
    ("graph_1_cpp_fused__to_copy_embedding_dense_backward_3", "everything else"),
    ("## Call CompiledFxGraph fpa3vyykunhbkui7z6upgi5hpk3z", "everything else"),
])
def test_each_operation_and_fused_kernel_counts_under_its_part_of_the_step(name, part):
    assert step_part(name) == part


def test_the_parts_of_a_profiled_step_add_up_to_its_time():
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    events = profile(lambda: F.layer_norm(F.gelu(a @ b), (256,)), "cpu")
    parts = time_by_part(events, "cpu")
    assert {"matrix products", "GELU", "norms"} <= set(parts)
    assert sum(parts.values()) == pytest.approx(sum(e.self_cpu_time_total for e in events) / 1e6, rel=1e-12)
    assert list(parts.values()) == sorted(parts.values(), reverse=True)


def test_a_compiled_function_profiled_with_kernel_names_shows_its_fused_loops():
    w = torch.randn(64, 64)

    def f(x):
        return F.layer_norm(F.gelu(x @ w), (64,))

    def fused_kernels(events) -> list[str]:
        return [e.key for e in events if "cpp_fused" in e.key]

    def profiled(fast):
        return profile(lambda: fast(torch.randn(32, 64)), "cpu")

    assert fused_kernels(profiled(torch.compile(f))) == []  # compiled as usual: inside the graph's row, unnamed
    with kernel_names():  # the same function again: compiled anew, not taken from dynamo's cache
        events = profiled(torch.compile(f))
    fused = fused_kernels(events)
    assert fused and all("gelu" in k or "layer_norm" in k for k in fused)
    assert time_by_part(events, "cpu")["GELU"] > 0
    assert fused_kernels(profiled(torch.compile(f))) == []  # and compiled after, unnamed again
