"""Attention backends, rotary embedding and content mask builders — small named pieces.

A backend maps `q [B, H, Lq, hd]`, `k, v [B, KVH, Lk, hd]` and an optional boolean mask
(True = may attend, broadcastable to `[B, H, Lq, Lk]`) to `(out [B, H, Lq, hd], probs | None)`.
Only `eager` returns the probabilities (the analysis needs them); `sdpa` is the fast path.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

AttentionFn = Callable[..., tuple[torch.Tensor, "torch.Tensor | None"]]


def sdpa_attention(q, k, v, mask=None, need_probs=False):
    assert not need_probs, "sdpa does not return probabilities; use the eager backend"
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])
    return out, None


def eager_attention(q, k, v, mask=None, need_probs=True):
    """softmax(q k^T / sqrt(d) + M) v, computed explicitly (SPEC §6 needs A[l, h, i, j])."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:  # GQA: every query head reads its key/value head
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # [B, H, Lq, Lk]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    # softmax in at least fp32 (bf16 maps would not sum to 1), in fp64 for fp64 models
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(q.dtype, torch.float32)).to(q.dtype)
    return torch.matmul(probs, v), (probs if need_probs else None)


BACKENDS: dict[str, AttentionFn] = {"sdpa": sdpa_attention, "eager": eager_attention}


def get_backend(name: str) -> AttentionFn:
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {sorted(BACKENDS)}")
    return BACKENDS[name]


# ----------------------------------------------------------------------------- rotary embedding
def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin `[B|1, L, hd]` for integer positions `[B|1, L]` (computed in fp32, as HF does)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim))
    freqs = positions.float()[..., None] * inv_freq  # [B, L, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x [B, H, L, hd]` (the LLaMA/Qwen2 rotate-half convention)."""
    cos, sin = cos[:, None], sin[:, None]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


# ----------------------------------------------------------------------------- content masks
def padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """`[B, L]` (True = real token) -> key mask `[B, 1, 1, L]`: nobody attends to padding."""
    return attention_mask.bool()[:, None, None, :]


def causal_mask(seq_len: int, device=None) -> torch.Tensor:
    """`[1, 1, L, L]` lower-triangular: the AR layout, for parity with causal LMs."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()[None, None]


def annealed_mask(seq_len: int, progress: float, device=None) -> torch.Tensor:
    """Causal -> full attention as `progress` goes 0 -> 1 (DiffuLLaMA's attention annealing, SPEC §5).

    Query i may attend to keys j <= i + round(progress * (L - 1)): at 0 the causal mask, at 1 full.
    """
    if not 0.0 <= progress <= 1.0:
        raise ValueError(f"annealing progress must lie in [0, 1], got {progress}")
    window = round(progress * (seq_len - 1))
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril(window)[None, None]
