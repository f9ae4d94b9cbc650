"""What the model must do: flops per trained token, flops and bytes per decoded token.

Model-level formulas, in the spirit of nanoGPT's estimate_mfu and nanochat's estimate_flops. The
measurements set against them are in mvgpt/perf/measure.py and scripts/bench.py; the main job's plan
(mvgpt/perf/plan.py) counts its stages' work with them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for the type hints only
    from mvgpt.model import GPT, GPTConfig


def matmul_weights(config: GPTConfig) -> int:
    """Weights that take part in a matrix product for every token: each block's four linear layers
    (queries/keys/values 3C x C, projection C x C, MLP 4C x C and C x 4C: 12 C^2) and the output
    layer (vocab x C, tied to the token embedding). Biases, norms and the table of positions only
    add or look up, so they are not counted."""
    return config.n_layer * 12 * config.n_embd**2 + config.vocab_size * config.n_embd


def training_flops_per_token(config: GPTConfig) -> float:
    """Flops of one trained token: 6 per matrix weight (2 forward, 4 backward), plus attention.

    Attention's two products, scores Q K^T and the weighted sum A V, cost 2 C flops per key each,
    forward; a query at place t sees t + 1 keys under the causal mask, (T + 1) / 2 on average, and
    the backward pass costs twice the forward: 6 L C (T + 1) per token. (nanoGPT and PaLM count the
    full T x T square, 12 L C T, about twice this; the CPU's flash attention skips the masked half,
    so counting it would flatter the figure.) Softmax, norms, GELU and the loss are not counted.
    """
    L, C, T = config.n_layer, config.n_embd, config.block_size
    return 6 * matmul_weights(config) + 6 * L * C * (T + 1)


def forward_flops(config: GPTConfig, tokens: int, logits_for: int = 1) -> float:
    """Flops of a forward pass over `tokens` tokens with output logits for `logits_for` of them:
    the work of re-running a window for one new token (a compute floor, against the matmul peak)."""
    L, C, V = config.n_layer, config.n_embd, config.vocab_size
    blocks = 2 * L * 12 * C**2 * tokens
    attention = 4 * L * C * tokens * (tokens + 1) / 2  # causal: query t sees t + 1 keys
    return blocks + attention + 2 * V * C * logits_for


def decode_flops_per_token(config: GPTConfig, held: int) -> float:
    """Flops of one cached decoding step, per sequence: 2 per matrix weight, and attention's two
    products over the `held` keys and values (2 C flops per key each, in every block)."""
    return 2 * matmul_weights(config) + 4 * config.n_layer * config.n_embd * held


def decode_bytes_per_token(model: GPT, held: int, batch_size: int = 1) -> int:
    """Bytes one cached decoding step must read, at least: each weight once (the batch shares
    them) and, for every sequence and block, the keys and values of the `held` tokens it attends to.

    The token embedding is read whole, by the output layer that shares it; a learned table of
    positions gives one row. Activations are a few kilobytes and are left out: this is a floor.
    """
    config = model.config
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if not config.rope:  # one row of the table of positions, not the table
        wpe = model.wpe.weight
        weights -= (wpe.shape[0] - 1) * wpe.shape[1] * wpe.element_size()
    element = next(model.parameters()).element_size()
    cache = 2 * config.n_layer * batch_size * held * config.n_embd * element  # keys and values
    return weights + cache
