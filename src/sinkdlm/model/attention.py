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
    return _sdpa_with_sink_column(q, k, v, mask, sink_logit, gqa), None


def _sdpa_with_sink_column(q, k, v, mask, sink_logit, gqa):
    """The virtual sink column through SDPA's fused kernel, exact in value and gradient.

    A float mask that requires grad sends SDPA to its slow unfused path, so the mask carries
    `b.detach()` and b's gradient is added by hand. With out = sum_j p_j v_j over the real keys,
    d out / d b_h = -p_sink * out (only the denominator depends on b_h), so
        out - p_sink * zero(b) * out.detach(),   zero(b) = 0 with d zero / d b = 1,
    has the right value (the added term is 0, even for b = -inf) and the right gradient. p_sink comes from the same
    kernel call: every real key gets an extra value channel of 1 and the sink a 0, so that channel
    of the output is sum_j p_j = 1 - p_sink.
    """
    b, kvh, lk, hd = k.shape
    h, lq = q.shape[1], q.shape[2]
    k = torch.cat([k, k.new_zeros(b, kvh, 1, hd)], dim=2)  # [B, KVH, Lk+1, hd]; its score is set by the mask
    v = torch.cat([v, v.new_ones(b, kvh, lk, 1)], dim=-1)  # [B, KVH, Lk, hd+1]: the "real key" channel
    v = torch.cat([v, v.new_zeros(b, kvh, 1, hd + 1)], dim=2)  # zero value for the sink column
    bias = sink_logit.detach().to(q.dtype).view(1, h, 1, 1)
    if mask is None:
        float_mask = torch.cat([q.new_zeros(1, h, 1, lk), bias], dim=-1)  # [1, H, 1, Lk+1]
    else:
        real = q.new_zeros(mask.shape).masked_fill(~mask, float("-inf"))  # [B|1, H|1, Lq|1, Lk]
        shape = (real.shape[0], h, real.shape[2])
        float_mask = torch.cat([real.expand(*shape, lk), bias.expand(*shape, 1)], dim=-1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask, enable_gqa=gqa)  # [B, H, Lq, hd+1]
    y = out[..., :hd]
    if sink_logit.requires_grad and torch.is_grad_enabled():
        p_sink = (1.0 - out[..., hd:]).detach()  # [B, H, Lq, 1]
        zero = _ZeroWithUnitGrad.apply(sink_logit).to(q.dtype).view(1, h, 1, 1)
        y = y - (p_sink * zero) * y.detach()
    return y


class _ZeroWithUnitGrad(torch.autograd.Function):
    """Forward: zeros like the input; backward: the incoming gradient unchanged."""

    @staticmethod
    def forward(ctx, x):
        return torch.zeros_like(x)

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
    """Causal -> full attention as `progress` goes 0 -> 1 (DiffuLLaMA's attention annealing, docs/method.md §5).

    Query i may attend to keys j <= i + round(progress * (L - 1)): at 0 the causal mask, at 1 full.
    """
    if not 0.0 <= progress <= 1.0:
        raise ValueError(f"annealing progress must lie in [0, 1], got {progress}")
    window = round(progress * (seq_len - 1))
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril(window)[None, None]
