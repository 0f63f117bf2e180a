"""Attention backends, rotary embedding and content mask builders — small named pieces.

A backend maps `q [B, H, Lq, hd]`, `k, v [B, KVH, Lk, hd]` and an optional boolean mask
(True = may attend, broadcastable to `[B, H, Lq, Lk]`) to `(out [B, H, Lq, hd], probs | None)`.
Only `eager` returns the probabilities (the analysis needs them); `sdpa` is the fast path.

`sink_logit [H]` (optional) adds one virtual column to every softmax row: a per-head score that
does not depend on the query, with a zero value vector (gpt-oss attention sinks; a logit of 0 is
Miller's softmax-off-by-one). Its probability is dropped from the output:
    p = softmax([q k^T / sqrt(d) + M, b_h]),  out = p[..., :Lk] v.
The eager backend then returns probabilities `[B, H, Lq, Lk + 1]` with the virtual column last.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

AttentionFn = Callable[..., tuple[torch.Tensor, "torch.Tensor | None"]]


def sdpa_attention(q, k, v, mask=None, need_probs=False, sink_logit=None):
    assert not need_probs, "sdpa does not return probabilities; use the eager backend"
    gqa = k.shape[1] != q.shape[1]
    if sink_logit is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa), None
    return _sdpa_with_sink_key(q, k, v, mask, sink_logit, gqa), None


def _sdpa_with_sink_key(q, k, v, mask, sink_logit, gqa):
    """The virtual sink column as one extra key through SDPA's fused kernel, exact in value and gradient.

    Every head grows by P channels (hd + P a multiple of 8, as fused GPU kernels want; P >= 1) and
    the scale stays explicit, 1/sqrt(hd). With c_h = b_h * sqrt(hd):
        q'_h = [q_h, c_h, 0..],  k'_j = [k_j, 0, 0..] (real keys),  k'_sink = [0.., 1, 0..],  v'_sink = 0,
    so q'·k'_j / sqrt(hd) = q·k_j / sqrt(hd) and q'·k'_sink / sqrt(hd) = b_h: softmax over the L + 1
    keys is the column's row, and its zero value drops it from the output (out = p[..., :Lk] v).
    The per-head logit rides in q (not in the shared key), so GQA needs nothing more; b's gradient
    flows through that channel by autograd. No float mask and equal q/k/v head dims: the fused kernel.
    """
    b, kvh, lk, hd = k.shape
    h, lq = q.shape[1], q.shape[2]
    pad = 8 - hd % 8  # >= 1 channel for c_h
    c = _Finite.apply(sink_logit.to(q.dtype) * hd**0.5).view(1, h, 1, 1).expand(b, h, lq, 1)
    q = torch.cat([q, c, q.new_zeros(1, 1, 1, 1).expand(b, h, lq, pad - 1)], dim=-1)  # [B, H, Lq, hd+P]
    unit = k.new_zeros(1, 1, lk + 1, hd + pad)
    unit[0, 0, lk, hd] = 1.0  # the extra key, a constant (no gradient)
    k = F.pad(k, (0, pad, 0, 1)) + unit  # [B, KVH, Lk+1, hd+P]
    v = F.pad(v, (0, pad, 0, 1))  # zero value for the extra key, zero extra channels
    if mask is not None:  # every query sees the column
        mask = F.pad(mask, (0, 1), value=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=hd**-0.5, enable_gqa=gqa)
    return out[..., :hd]


class _Finite(torch.autograd.Function):
    """Clamp to ± half the dtype's largest value, gradient passed straight through.

    Finite, so that the real keys' zero in the logit's channel gives 0 (inf x 0 is NaN). A logit of
    -inf still gives the column exactly 0 (exp underflows); beyond the clamp the column's probability
    is 0 or 1, where the true gradient is 0, and so is the one passed through (a clamp's own backward
    would cost five kernels per layer for nothing)."""

    @staticmethod
    def forward(ctx, x):
        big = torch.finfo(x.dtype).max / 2
        return x.clamp(-big, big)

    @staticmethod
    def backward(ctx, grad):
        return grad


def eager_attention(q, k, v, mask=None, need_probs=True, sink_logit=None):
    """softmax(q k^T / sqrt(d) + M) v, computed explicitly (docs/method.md §6 needs A[l, h, i, j]).

    With `sink_logit [H]` the virtual column is appended (last) before the softmax and dropped
    from the output; the returned probabilities keep it: `[B, H, Lq, Lk + 1]`.
    """
    groups = q.shape[1] // k.shape[1]
    if groups > 1:  # GQA: every query head reads its key/value head
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # [B, H, Lq, Lk]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if sink_logit is not None:
        column = sink_logit.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:3], 1)
        scores = torch.cat([scores, column], dim=-1)  # [B, H, Lq, Lk+1]
    # softmax in at least fp32 (bf16 maps would not sum to 1), in fp64 for fp64 models
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(q.dtype, torch.float32)).to(q.dtype)
    real = probs[..., : v.shape[2]] if sink_logit is not None else probs
    return torch.matmul(real, v), (probs if need_probs else None)


BACKENDS: dict[str, AttentionFn] = {"sdpa": sdpa_attention, "eager": eager_attention}
# Backends that take `sink_logit` (the virtual column of sink_logit / softmax_one models).
SINK_COLUMN_BACKENDS = frozenset({"sdpa", "eager"})


def get_backend(name: str) -> AttentionFn:
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {sorted(BACKENDS)}")
    return BACKENDS[name]


# ----------------------------------------------------------------------------- rotary embedding
def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin `[B|1, L, hd]` for integer positions `[B|1, L]` (computed in fp32, as HF does), the sine's
    first half negated: rotate-half's sign folded into the table, so `apply_rope` launches no `neg`."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim))
    freqs = positions.float()[..., None] * inv_freq  # [B, L, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    sin = emb.sin()
    return emb.cos().to(dtype), torch.cat((-sin[..., : head_dim // 2], sin[..., head_dim // 2:]), -1).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x [B, H, L, hd]` (the LLaMA/Qwen2 rotate-half convention) with `rope_cos_sin`'s tables:
    `x cos + [-x2, x1] sin = x cos + [x2, x1] [-sin1, sin2]`, bit for bit (negation is exact)."""
    cos, sin = cos[:, None], sin[:, None]
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return x * cos + swapped * sin


# ----------------------------------------------------------------------------- content masks
def padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """`[B, L]` (True = real token) -> key mask `[B, 1, 1, L]`: nobody attends to padding."""
    return attention_mask.bool()[:, None, None, :]


def causal_mask(seq_len: int, device=None) -> torch.Tensor:
    """`[1, 1, L, L]` lower-triangular: the AR layout, for parity with causal LMs."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()[None, None]


def block_causal_mask(positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """`[B|1, 1, L, L]` from content positions `[B|1, L]` (0 = the first token): query i may attend to key j
    when j's block is not after i's, blocks being `position // block_size` (block diffusion, BD3-LM)."""
    blocks = torch.div(positions, block_size, rounding_mode="floor")
    return (blocks[:, None, :, None] >= blocks[:, None, None, :])


def annealed_mask(seq_len: int, progress: float, device=None) -> torch.Tensor:
    """Causal -> full attention as `progress` goes 0 -> 1 (DiffuLLaMA's attention annealing, docs/method.md §5).

    Query i may attend to keys j <= i + round(progress * (L - 1)): at 0 the causal mask, at 1 full.
    """
    if not 0.0 <= progress <= 1.0:
        raise ValueError(f"annealing progress must lie in [0, 1], got {progress}")
    window = round(progress * (seq_len - 1))
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril(window)[None, None]
