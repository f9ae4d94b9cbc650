"""Causal attention for training on a CPU: two batched matrix products and a softmax, by hand.

PyTorch's `scaled_dot_product_attention` runs a flash kernel on a CPU: it walks the scores in
small tiles, never holding the (T, T) matrix, and recomputes them in the backward pass. At the
training shape here (T = 256, 6 heads of 64, batch 16) the whole score matrix of a head is only
256 x 256, and in bf16 the tiles' many small products keep the CPU's matrix units mostly idle.
This one does each product over all B * H heads at once (`torch.bmm`) and keeps the softmax's
output for the backward pass (B * H * T * T numbers: 12.6 MB a layer in bf16); its forward and
backward took 0.59 of the flash kernel's time (`dev/attention_kernels.py`, results/attention.json).

The maths, for one head (scores S, probabilities P, output Y; d the head size):
    forward:  S = Q K^T / sqrt(d), masked above the diagonal;  P = softmax(S);  Y = P V
    backward: dV = P^T dY;  dP = dY V^T;  dS = P * (dP - rowsum(dP * P));  dQ = dS K / sqrt(d);
              dK = dS^T Q / sqrt(d)

The model does not know about it: `use_batched_attention(model)` swaps it in for each block's
causal attention (`CausalSelfAttention.attend`), and the training loop does that where it pays
(bf16 on a CPU). The checkpoint does not change.

Example:
    if batched_attention_pays(device, dtype):      # bf16 on a CPU: pretrain.py's choice
        use_batched_attention(model)
    with autocast(device, torch.bfloat16):
        logits, loss = model(x, y)
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from mvgpt.model import CausalSelfAttention, causal_attention

_MASKS: dict[tuple, torch.Tensor] = {}


def causal_mask(T: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(T, T): 0 on and below the diagonal, -inf above it (the future), made once per shape.

    Added to the scores rather than built inside the step: compiled, a mask made from indices in
    the step split the softmax into two passes, and the step was slower (dev/attention_mask.py)."""
    key = (T, dtype, device)
    if key not in _MASKS:
        _MASKS[key] = torch.full((T, T), float("-inf"), device=device).triu(1).to(dtype)
    return _MASKS[key]


class _BatchedCausalAttention(torch.autograd.Function):
    """(B, H, T, d) queries, keys and values -> (B, H, T, d), every head's products in one bmm."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, H, T, d = q.shape
        q = (q * (1.0 / math.sqrt(d))).reshape(B * H, T, d)  # the scale on q: T*d numbers, not T*T
        k, v = k.reshape(B * H, T, d), v.reshape(B * H, T, d)
        scores = torch.bmm(q, k.transpose(1, 2))  # (B*H, T, T)
        probs = torch.softmax(scores + mask, dim=-1)  # the future at -inf: probability 0
        ctx.save_for_backward(q, k, v, probs)
        ctx.shape = (B, H, T, d)
        return torch.bmm(probs, v).view(B, H, T, d)

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        q, k, v, probs = ctx.saved_tensors  # q already scaled
        BH, T, d = q.shape
        dy = dy.reshape(BH, T, d)
        dv = torch.bmm(probs.transpose(1, 2), dy)
        dprobs = torch.bmm(dy, v.transpose(1, 2))
        dscores = torch._softmax_backward_data(dprobs, probs, -1, probs.dtype)  # P * (dP - rowsum(dP * P))
        dq = torch.bmm(dscores, k) * (1.0 / math.sqrt(d))
        dk = torch.bmm(dscores.transpose(1, 2), q)
        return dq.view(ctx.shape), dk.view(ctx.shape), dv.view(ctx.shape), None  # the mask: no gradient


def batched_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention as `scaled_dot_product_attention(q, k, v, is_causal=True)` computes it,
    (B, H, T, d) each -> (B, H, T, d), in the dtype autocast asks for (else the inputs').

    Only where gradients are kept: what it buys is a faster backward pass. Without them (an
    evaluation, a measurement) it is the model's own attention, so a model trained with it reads
    exactly as one loaded later does."""
    if not torch.is_grad_enabled():
        return causal_attention(q, k, v)
    device = q.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else q.dtype
    with torch.autocast(device, enabled=False):  # the products and the softmax all in `dtype`
        mask = causal_mask(q.shape[2], dtype, q.device)
        return _BatchedCausalAttention.apply(q.to(dtype), k.to(dtype), v.to(dtype), mask)


def batched_attention_pays(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Where the training loop swaps it in: bf16 on a CPU. (In float32 the flash kernel was the
    faster of the two, and on a GPU the flash kernels are what to use.)"""
    return torch.device(device).type == "cpu" and dtype == torch.bfloat16


def use_batched_attention(model: nn.Module) -> None:
    """Swap `batched_causal_attention` in for every block's causal attention (the cache's paths,
    with a mask or one new token, keep PyTorch's kernel)."""
    for module in model.modules():
        if isinstance(module, CausalSelfAttention):
            module.attend = batched_causal_attention


def batch_attention_where_it_pays(model: nn.Module, device: torch.device | str, dtype: torch.dtype) -> bool:
    """What every trainer does before its first step: the batched products where they pay (returns whether)."""
    pays = batched_attention_pays(device, dtype)
    if pays:
        use_batched_attention(model)
    return pays
