import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model

from mvgpt.device import autocast
from mvgpt.model import causal_attention
from mvgpt.perf.cpu_attention import (
    batch_attention_where_it_pays,
    batched_attention_pays,
    batched_causal_attention,
    causal_mask,
    use_batched_attention,
)


def qkv(dtype=torch.float32, seed: int = 0, shape=(2, 3, 16, 8)) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(dtype).requires_grad_() for _ in range(3)]


def forward_backward(fn, tensors, grad):
    out = fn(*tensors)
    out.backward(grad)
    return out, [t.grad for t in tensors]


def test_float32_output_and_gradients_are_sdpa_causal():
    grad = torch.randn(2, 3, 16, 8, generator=torch.Generator().manual_seed(1))
    out, grads = forward_backward(batched_causal_attention, qkv(), grad)
    ref, ref_grads = forward_backward(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                      qkv(), grad)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)


def test_a_place_never_sees_a_later_one():
    q, k, v = (t.detach() for t in qkv())
    later_k, later_v = k.clone(), v.clone()
    later_k[..., 10:, :] += 5.0
    later_v[..., 10:, :] -= 3.0
    a, b = batched_causal_attention(q, k, v), batched_causal_attention(q, later_k, later_v)
    assert torch.equal(a[..., :10, :], b[..., :10, :])
    assert not torch.allclose(a[..., 10:, :], b[..., 10:, :])


def test_under_bf16_autocast_it_computes_in_bf16_and_hands_float32_inputs_float32_gradients():
    grad = torch.randn(2, 3, 16, 8, generator=torch.Generator().manual_seed(1))
    with autocast("cpu", torch.bfloat16):
        out, grads = forward_backward(batched_causal_attention, qkv(), grad.bfloat16())
    assert out.dtype == torch.bfloat16 and all(g.dtype == torch.float32 for g in grads)
    # the same as the whole computation on bf16 copies, and float32's to bf16's precision
    out16, grads16 = forward_backward(batched_causal_attention, [t.detach().bfloat16().requires_grad_()
                                                                 for t in qkv()], grad.bfloat16())
    assert torch.equal(out, out16) and all(torch.equal(g, g16.float()) for g, g16 in zip(grads, grads16, strict=True))
    ref, ref_grads = forward_backward(causal_attention, qkv(), grad)
    torch.testing.assert_close(out.float(), ref, rtol=3e-2, atol=3e-2)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("rope", [False, True])
def test_swapped_into_a_model_it_trains_as_the_model_did_and_leaves_the_weights_alone(rope):
    model, swapped = tiny_model(rope=rope), tiny_model(rope=rope)
    use_batched_attention(swapped)
    assert all(block.attn.attend is batched_causal_attention for block in swapped.blocks)
    assert all(block.attn.attend is causal_attention for block in model.blocks)  # the class's default, untouched
    state, swapped_state = model.state_dict(), swapped.state_dict()
    assert state.keys() == swapped_state.keys() and all(torch.equal(state[k], swapped_state[k]) for k in state)
    x = torch.randint(0, model.config.vocab_size, (2, model.config.block_size),
                      generator=torch.Generator().manual_seed(0))
    y = x.roll(-1, dims=1)
    (_, loss), (_, swapped_loss) = model(x, y), swapped(x, y)
    loss.backward()
    swapped_loss.backward()
    torch.testing.assert_close(swapped_loss, loss, rtol=1e-6, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), swapped.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_it_pays_for_bf16_on_a_cpu_only():
    assert batched_attention_pays("cpu", torch.bfloat16)
    assert not batched_attention_pays("cpu", torch.float32)
    assert not batched_attention_pays("cuda", torch.bfloat16)


def test_the_causal_mask_hides_the_future_and_is_made_once_per_shape():
    mask = causal_mask(4, torch.bfloat16, torch.device("cpu"))
    assert mask.dtype == torch.bfloat16 and mask.shape == (4, 4)
    assert torch.equal(mask == float("-inf"), torch.ones(4, 4, dtype=torch.bool).triu(1))
    assert torch.equal(mask.tril(), torch.zeros(4, 4, dtype=torch.bfloat16))
    assert causal_mask(4, torch.bfloat16, torch.device("cpu")) is mask
    assert causal_mask(4, torch.float32, torch.device("cpu")) is not mask


def test_a_trainer_batches_attention_in_bf16_on_a_cpu_and_reading_stays_the_models_own():
    model, other = tiny_model(seed=2).train(), tiny_model(seed=2).train()
    assert batch_attention_where_it_pays(model, "cpu", torch.bfloat16) is True
    assert batch_attention_where_it_pays(other, "cpu", torch.float32) is False
    assert all(b.attn.attend is batched_causal_attention for b in model.blocks)
    assert all("attend" not in vars(b.attn) for b in other.blocks)  # float32: PyTorch's kernel, untouched
    x = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # reading (an evaluation, a measurement): exactly what a model loaded later computes
        assert torch.equal(model.eval()(x)[0], tiny_model(seed=2)(x)[0])
