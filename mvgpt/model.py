"""mvGPT's model, read top to bottom: config, rotary helpers, attention, MLP, block, KV cache, GPT.

Two ways to tell the model where each token is:
- learned positions (GPT-2's way): a table with one row per place in the 256-token window, added
  to the token embeddings before the first block. It stops at the window, and once a story is past
  it every token's keys and values change as the window moves, so the whole window runs again.
- rotary position embeddings (RoFormer, Llama): each query and key is turned by an angle that
  grows with its position, so a score depends on how far apart two tokens are, not where they
  sit. A cached key stays valid as the window moves, so the KV cache can slide.

What episode 10 (RoPE) changed, in reading order:
- `GPTConfig.rope` picks the kind; `rope_theta` sets the speeds of the rotary pairs.
- `rotary()`: cos and sin of every position's angles, one angle per pair of channels.
- `rotate()`: turns pairs of channels of queries and keys by those angles.
- `RotaryTable` (`GPT.angles`): the angles as a table made once at set-up, sliced per forward.
- `CausalSelfAttention.forward`: one line rotates q and k, before the keys enter the cache.
- `KVCache.position` keeps counting past the window; `KVCache.slide(keep)` drops the oldest tokens.
- `GPT.forward`: learned positions add their table; rope reads the angles once for all blocks.
- `GPT.generate`: past the window, rope slides the cache; learned positions re-run the window.
Reading past the training context (scaled angles, attention sinks, dynamic NTK) is not here: it
lives in long_context.py (and rope_scaling.py), and enters through `GPT.angles` (a table it
swaps in) and `GPT.new_cache` (a cache subclass generate then uses). The one-token step written in C
(mvgpt/perf/one_token.c, which fast_decode.py builds) enters through `GPT.decode`, the step generate
takes for each new token.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

Angles = tuple[torch.Tensor, torch.Tensor]  # cos, sin: (T, head/2) each


@dataclass
class GPTConfig:
    vocab_size: int = 8192  # BPE tokens, <|endoftext|> included
    block_size: int = 256  # the training context: the window the model is trained to read
    n_layer: int = 6  # transformer blocks
    n_head: int = 6  # attention heads per block
    n_embd: int = 384  # channels; head size = n_embd // n_head
    rope: bool = False  # rotary position embeddings instead of a learned table of positions
    rope_theta: float = 10000.0  # rotary base: pair i turns by theta^(-2i/head_size) per token
    rope_linear_factor: float = 1.0  # positions divided by this (set by a linear long-context fine-tune)

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not a multiple of n_head={self.n_head}")
        if self.rope and self.head_size % 2:
            raise ValueError(f"rope needs an even head size, got {self.head_size}")


# ----------------------------------------------------------------------------------------------
# Rotary position embeddings


def rotary(
    start: int,
    T: int,
    head_size: int,
    device: torch.device | str | None = None,
    theta: float = 10000.0,
    linear_factor: float = 1.0,
) -> Angles:
    """Angles for positions start..start+T-1, one per pair of channels, as cos and sin (T, head/2).

    Pair i turns by theta^(-2i/head_size) radians per token: the first pairs turn fast (pair 0 by
    one radian a token), the last ones slowly (about 47k tokens a turn for a head of 64), so
    between them they tell near and far apart. A model fine-tuned with interpolated positions
    divides them by its linear_factor, always.
    """
    # in float64 on the CPU (exact far into a story; Apple's GPU has no float64), then to the device
    positions = torch.arange(start, start + T, device="cpu", dtype=torch.float64) / linear_factor
    speeds = theta ** (-torch.arange(0, head_size, 2, device="cpu", dtype=torch.float64) / head_size)
    angles = torch.outer(positions, speeds)  # (T, head/2)
    return angles.cos().float().to(device), angles.sin().float().to(device)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn each pair of channels (i, i + head/2) of x (B, H, T, head) by its position's angle.

    Llama's pairing of the two halves; the paper pairs neighbours, which is the same rotation with
    the channels in another order (and the projections are learned, so either works).
    """
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    turned = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # float32, as the table
    return turned.type_as(x)  # a bf16 model's queries and keys stay bf16


class RotaryTable(nn.Module):
    """cos, sin for positions 0..size-1, made once, so a decoding step does no trigonometry.

    Not weights: the buffers are not saved in checkpoints (they follow the model to its device).
    A sliding cache keeps counting positions, so the table is made again, twice as long, when a
    story outgrows it. long_context.py subclasses it for scaled angles.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        cos, sin = self.table(2 * config.block_size, None)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def table(self, size: int, device: torch.device | str | None) -> Angles:
        c = self.config
        return rotary(0, size, c.head_size, device, c.rope_theta, c.rope_linear_factor)

    def forward(self, start: int, T: int) -> Angles:
        if start + T > self.cos.shape[0]:
            self.cos, self.sin = self.table(2 * (start + T), self.cos.device)
        return self.cos[start : start + T], self.sin[start : start + T]


# ----------------------------------------------------------------------------------------------
# The transformer


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """(B, H, T, head) each -> (B, H, T, head): place t attends to places 0..t."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class CausalSelfAttention(nn.Module):
    # the kernel for a pass with nothing cached (training): a faster one can be swapped in per
    # module without changing the weights (mvgpt/perf/cpu_attention.py does, for bf16 on a CPU)
    attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = staticmethod(causal_attention)

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)  # queries, keys, values at once
        self.proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(
        self, x: torch.Tensor, angles: Angles | None = None, cache: KVCache | None = None, layer: int = 0
    ) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if angles is not None:  # rope: turn before the cache stores the keys; values never turn
            q, k = rotate(q, *angles), rotate(k, *angles)
        held = 0
        if cache is not None:
            held = cache.length
            k, v = cache.update(layer, k, v)  # (B, H, held + T, head)
        if held == 0:
            y = self.attend(q, k, v)
        elif T == 1:  # one new token sees everything held: no mask needed
            y = F.scaled_dot_product_attention(q, k, v)
        else:  # new token i sees the held tokens and new tokens 0..i
            mask = torch.ones(T, held + T, dtype=torch.bool, device=x.device).tril(diagonal=held)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))  # exact GELU (GPT-2's export maps it to "gelu")


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x, angles=None, cache=None, layer=0):  # (B, T, C) -> (B, T, C)
        x = x + self.attn(self.ln_1(x), angles, cache, layer)
        return x + self.mlp(self.ln_2(x))


# ----------------------------------------------------------------------------------------------
# KV cache


class KVCache:
    """Keys and values of the tokens read so far, for every block, preallocated.

    `position` is the next token's place in the story; it keeps counting once `slide` drops old
    tokens, so it can be larger than `length`, the number of tokens held. Storage is
    (n_layer, B, H, capacity, head): the tokens held are rows offset..offset+length-1, so `slide`
    only moves `offset` on; when a new token would not fit at the end, the held rows are copied to
    the front once (with capacity = 2 windows, that is once per window of tokens, not per token).
    """

    def __init__(
        self,
        config: GPTConfig,
        batch_size: int = 1,
        capacity: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.capacity = capacity or 2 * config.block_size
        shape = (config.n_layer, batch_size, config.n_head, self.capacity, config.head_size)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.offset = 0  # first storage row held
        self.length = 0  # rows held
        self.position = 0  # the next token's place in the story

    def reserve(self, T: int) -> None:
        """Make room for T more tokens at the end (called once per forward, before the blocks)."""
        assert self.length + T <= self.capacity, f"the cache is full ({self.length} of {self.capacity}): slide first"
        if self.offset + self.length + T > self.capacity:  # compact: newest rows to the front
            held = slice(self.offset, self.offset + self.length)
            self.k[:, :, :, : self.length] = self.k[:, :, :, held].clone()
            self.v[:, :, :, : self.length] = self.v[:, :, :, held].clone()
            self.offset = 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store block `layer`'s new keys and values (B, H, T, head); return all held ones."""
        end = self.offset + self.length + k.shape[2]
        self.k[layer, :, :, self.offset + self.length : end] = k
        self.v[layer, :, :, self.offset + self.length : end] = v
        return self.k[layer, :, :, self.offset : end], self.v[layer, :, :, self.offset : end]

    def advance(self, T: int) -> None:
        """After all blocks have stored T tokens: they are held, and the story moves on by T."""
        self.length += T
        self.position += T

    def slide(self, keep: int) -> None:
        """Drop all but the newest `keep` tokens, in every block. `position` is unchanged: the kept
        keys were rotated at their places in the story, and those places have not moved."""
        assert keep >= 0, f"slide keeps {keep} tokens: keep at least 0"
        self.offset += max(0, self.length - keep)
        self.length = min(self.length, keep)


# ----------------------------------------------------------------------------------------------
# The model


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.context = config.block_size  # tokens generate reads at once (long_context.py may widen it)
        self.new_cache: Callable[..., KVCache] = KVCache  # the cache generate fills (a hook, as above)
        rng = torch.get_rng_state()  # so both kinds draw the same weights for the parts they share
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied embeddings, as GPT-2
        if config.rope:  # attention turns queries and keys: a table of angles, not of positions
            self.angles = RotaryTable(config)
        else:
            self.wpe = nn.Embedding(config.block_size, config.n_embd)
        torch.set_rng_state(rng)
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2's init: N(0, 0.02), residual projections scaled down by depth, biases zero.

        The table of positions is drawn last, so with the same seed a rope model and a learned
        one start with the same token embeddings and blocks.
        """
        for name, module in self.named_modules():
            if module is self.lm_head or name == "wpe":
                continue  # lm_head shares wte's weight; wpe comes last
            if isinstance(module, (nn.Linear, nn.Embedding)):
                std = 0.02 / math.sqrt(2 * self.config.n_layer) if name.endswith("proj") else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        if not self.config.rope:
            nn.init.normal_(self.wpe.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # tied weights counted once

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        cache: KVCache | None = None,
        last_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx (B, T) tokens -> logits (B, T, vocab) (or (B, 1, vocab) with last_only), loss.

        With a cache, the tokens continue the story at cache.position, and the cache moves on by T.
        """
        B, T = idx.shape
        start = cache.position if cache is not None else 0
        x = self.wte(idx)  # (B, T, C)
        angles = None
        if self.config.rope:  # angles once, for all the blocks
            angles = self.angles(start, T)
        else:
            assert start + T <= self.config.block_size, f"positions up to {start + T - 1} are past the learned table"
            x = x + self.wpe(torch.arange(start, start + T, device=idx.device))
        if cache is not None:
            cache.reserve(T)
        for layer, block in enumerate(self.blocks):
            x = block(x, angles, cache, layer)
        if cache is not None:
            cache.advance(T)
        if last_only:
            x = x[:, -1:]
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return logits, loss

    def decode(self, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One new token (B, 1) through the cache -> its logits (B, 1, vocab): generate's step (a hook:
        mvgpt/perf/fast_decode.py puts the C step in its place)."""
        return self(token, cache=cache, last_only=True)[0]

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        seed: int | None = None,
        use_cache: bool = True,
    ):
        """Continue idx (B, T) by max_new_tokens, yielding each new (B, 1) token as it comes.

        temperature 0 is greedy. Without the cache, the model reads the last window for each
        token. With it, the prompt goes in cut to the window, then one token at a time. Past the
        window, rope slides the cache (once it holds a whole window, the oldest token goes before
        the newest comes in), since a key's rotation stays valid as the window moves; learned
        positions re-run the last window for each token, as their positions are baked into every
        cached key and value.
        """
        window = self.context
        generator = None
        if seed is not None:
            generator = torch.Generator(device=idx.device).manual_seed(seed)
        cache = None
        if use_cache:
            cache = self.new_cache(self.config, idx.shape[0], 2 * window, idx.device, self.wte.weight.dtype)
            logits, _ = self(idx[:, -window:], cache=cache, last_only=True)
        for _ in range(max_new_tokens):
            if cache is None:
                logits, _ = self(idx[:, -window:], last_only=True)
            next_token = sample(logits[:, -1], temperature, top_k, generator)
            idx = torch.cat([idx, next_token], dim=1)
            yield next_token
            if cache is not None:
                if cache.length < window:
                    logits = self.decode(next_token, cache)
                elif self.config.rope:
                    cache.slide(window - 1)
                    logits = self.decode(next_token, cache)
                else:  # learned positions past the window: re-run it in full
                    logits, _ = self(idx[:, -window:], last_only=True)


def sample(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, generator=None
) -> torch.Tensor:
    """logits (B, vocab) -> next token (B, 1): greedy at temperature 0, else top-k sampling."""
    if temperature < torch.finfo(torch.float32).tiny:  # 0, or too small to divide by in float32: greedy
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float()
    # the largest first made 0: over a tiny temperature the others go to -inf, never inf - inf = nan
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
