"""The reference baseline of the decode comparison (``benchmarks.retnet_decode``): a decoder-only Transformer as
LLaMA builds it (pre-norm attention with rotary positions, RMS norms, SwiGLU FFN) with a preallocated KV cache over
``scaled_dot_product_attention``, and its parameter-matched twin of a RetNet (same parameter count, depth and heads;
the width sized to match)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from zoo.models.retnet import GatedFFN, RetNet, RMSNorm
from zoo.models.retnet.ops import rotary_frequencies, rotary_tables, rotate


class CachedAttention(nn.Module):
    """Pre-norm residual causal self-attention with rotary positions (LLaMA's: rotate-half, theta 10^4), writing its
    keys and values into a preallocated cache. q and k are rotated together, in four operations."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm = RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor], pos: int,
                rotary: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        batch, length, dim = x.shape
        qkv = self.qkv(self.norm(x)).view(batch, length, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        q, k = rotate(qkv[:2], *rotary, "neox").unbind(0)
        v = qkv[2]
        k_cache, v_cache = cache
        k_cache[:, :, pos : pos + length] = k
        v_cache[:, :, pos : pos + length] = v
        end = pos + length
        if pos == 0:  # prefill: causal attention inside the prompt
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif length == 1:  # decode: the new token attends to everything cached
            out = F.scaled_dot_product_attention(q, k_cache[:, :, :end], v_cache[:, :, :end])
        else:  # a chunk after a prefix: causal inside the chunk, everything before it
            allowed = torch.ones(length, end, dtype=torch.bool, device=x.device).tril(diagonal=pos)
            out = F.scaled_dot_product_attention(q, k_cache[:, :, :end], v_cache[:, :, :end], attn_mask=allowed)
        return x + self.out_proj(out.transpose(1, 2).reshape(batch, length, dim))


class KVCacheTransformer(nn.Module):
    """Decoder-only Transformer as LLaMA builds it (pre-norm attention with rotary positions and SwiGLU FFN blocks,
    RMS norms) with a KV cache; the rotary tables are made once per cache, for every position it holds."""

    def __init__(self, vocab_size: int, dim: int, depth: int, heads: int, ffn_dim: int):
        super().__init__()
        self.dim, self.heads = dim, heads
        self.embed = nn.Embedding(vocab_size, dim)
        self.attn = nn.ModuleList(CachedAttention(dim, heads) for _ in range(depth))
        self.ffn = nn.ModuleList(GatedFFN(dim, ffn_dim, 1e-6) for _ in range(depth))
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)

    def new_cache(self, batch: int, capacity: int) -> list[Any]:
        """Per layer (keys, values) of `capacity` positions, then the rotary (cos, sin) of those positions."""
        like = self.embed.weight
        shape = (batch, self.heads, capacity, self.dim // self.heads)
        positions = torch.arange(capacity, dtype=torch.float64, device=like.device)
        frequencies = rotary_frequencies(self.dim // self.heads, rope="neox").to(like.device)
        return [(like.new_zeros(shape), like.new_zeros(shape)) for _ in self.attn] + [
            rotary_tables(positions, frequencies, like.dtype)]

    def forward(self, ids: torch.Tensor, cache: list[Any], pos: int) -> torch.Tensor:
        x, (cos, sin), end = self.embed(ids), cache[-1], pos + ids.shape[1]
        for attn, ffn, layer_cache in zip(self.attn, self.ffn, cache):
            x = ffn(attn(x, layer_cache, pos, (cos[pos:end], sin[pos:end])))
        return self.lm_head(self.norm(x))

    @torch.inference_mode()
    def generate(self, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """Greedy decoding with the KV cache: one prefill pass, then one step per token."""
        cache = self.new_cache(ids.shape[0], ids.shape[1] + new_tokens)
        logits, tokens = self(ids, cache, 0), [ids]
        for index in range(new_tokens):
            tokens.append(logits[:, -1].argmax(-1, keepdim=True))
            if index + 1 < new_tokens:
                logits = self(tokens[-1], cache, ids.shape[1] + index)
        return torch.cat(tokens, dim=1)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def transformer_params(vocab_size: int, dim: int, depth: int, ffn_dim: int) -> int:
    """Parameters of a :class:`KVCacheTransformer` (embedding, depth x (4 dim^2 + 3 dim ffn + 2 norms), norm, head)."""
    return 2 * vocab_size * dim + dim + depth * (4 * dim * dim + 3 * dim * ffn_dim + 2 * dim)


def parameter_matched_transformer(model: RetNet) -> KVCacheTransformer:
    """A KV-cache Transformer with the RetNet's parameter count, depth and heads: the width (a multiple of 2 x heads)
    and a SwiGLU FFN of 8/3 the width (rounded to 8), as LLaMA sizes it, chosen to come closest to the count."""
    target, step = count_params(model), 2 * model.heads

    def ffn(dim: int) -> int:
        return 8 * math.ceil(8 * dim / 3 / 8)

    widths = range(step, 4 * model.dim + step, step)
    dim = min(widths, key=lambda d: abs(transformer_params(model.vocab_size, d, model.depth, ffn(d)) - target))
    return KVCacheTransformer(model.vocab_size, dim, model.depth, model.heads, ffn(dim))
