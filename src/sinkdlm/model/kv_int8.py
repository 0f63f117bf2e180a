"""`--kv-cache-dtype int8`: the prefix/dual cache's content keys and values stored in int8, the sinks' kept whole.

Each content column's key (after rotation) and value is stored per head as int8 with one symmetric scale:
    s = max_i |x_i| / 127 over the head's hd channels,   q = round(x / s) in [-127, 127],   x̂ = q s,
so |x̂ - x| <= s / 2 per entry (half an int8 step). The scales are kept in float32 (float64 for a float64
model), 4 bytes per token and head beside its hd bytes: with hd = 64 the cache is 68 / 256 of float32's
and 68 / 128 of bfloat16's. The sink tokens' keys and values are never quantized (IntactKV, Liu et al.
2024: the pivot tokens' cache kept in full precision): they are constants of the model, written once at
allocation in the activation dtype, as the float cache holds them.

A pass writes its fresh columns (quantized) and attends to the whole cache with its own fresh keys and
values exact, the cached ones dequantized: a block's first step (every column fresh) computes what the
float cache does, and the later steps of a prefix or dual cache read the other columns through int8. The
buffers and the start/write_from protocol are `KVCache`'s (model/cache.py), so `DiffusionLM.forward` and the
compiled step take either.
"""

from __future__ import annotations

import torch

from sinkdlm.model import sink as sinklib
from sinkdlm.model.cache import KVCache

QMAX = 127  # symmetric: -127 .. 127, so that -q is representable for every q


def quantize_per_head(x: torch.Tensor, scale_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """`x [..., hd]` -> (int8 q `[..., hd]`, scale `[..., 1]`), one symmetric scale per row (token and head)."""
    x = x.to(scale_dtype)
    scale = x.abs().amax(-1, keepdim=True) / QMAX
    scale = scale.clamp_min(torch.finfo(scale_dtype).tiny)  # an all-zero row: q = 0, any scale
    return torch.round(x / scale).clamp_(-QMAX, QMAX).to(torch.int8), scale


class Int8KVCache(KVCache):
    """A `KVCache` whose content columns are int8 with a scale per token and head; the sinks' in full precision.

    k{i}, v{i}    `[B, KVH, L, hd]` int8, content column c at index c (no sink columns).
    ks{i}, vs{i}  `[B, KVH, L, 1]` their scales (float32; float64 for a float64 model).
    sk{i}, sv{i}  `[B, KVH, n, hd]` the sinks' rotated keys and values in the activation dtype (n = 0: none).
    """

    def __init__(self, sink_keys: list[torch.Tensor], sink_values: list[torch.Tensor], cos: torch.Tensor,
                 sin: torch.Tensor, mask: torch.Tensor | None, sink_position: str):
        b, kvh, n, hd = sink_keys[0].shape
        length = cos.shape[1]
        scale_dtype = torch.promote_types(sink_keys[0].dtype, torch.float32)
        dev = cos.device

        def int8() -> list[torch.Tensor]:
            return [torch.zeros(b, kvh, length, hd, dtype=torch.int8, device=dev) for _ in sink_keys]

        super().__init__(int8(), int8(), cos, sin, mask, offset=0)
        for i, (k, v) in enumerate(zip(sink_keys, sink_values)):
            self.register_buffer(f"ks{i}", torch.zeros(b, kvh, length, 1, dtype=scale_dtype, device=dev), persistent=False)
            self.register_buffer(f"vs{i}", torch.zeros(b, kvh, length, 1, dtype=scale_dtype, device=dev), persistent=False)
            self.register_buffer(f"sk{i}", k, persistent=False)
            self.register_buffer(f"sv{i}", v, persistent=False)
        self.num_sinks, self.sink_position = n, sink_position

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the pass's fresh `k, v [B, KVH, l, hd]` in int8 at its columns; the whole key and value
        sequences `[B, KVH, S, hd]` in layout order: the sinks' and the fresh columns exact, the rest dequantized."""
        return (self._write(k, *(getattr(self, f"{p}{layer}") for p in ("k", "ks", "sk"))),
                self._write(v, *(getattr(self, f"{p}{layer}") for p in ("v", "vs", "sv"))))

    def _write(self, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
        l = x.shape[2]
        xq, xs = quantize_per_head(x, scale.dtype)
        b, heads, length, hd = q.shape
        out = torch.empty(b, heads, self.num_sinks + length, hd, dtype=x.dtype, device=x.device)  # [B, KVH, S, hd]
        sinklib.sinks_of(out, self.num_sinks, self.sink_position, dim=2).copy_(sinks)
        content = sinklib.content_of(out, self.num_sinks, self.sink_position, dim=2)  # [B, KVH, L, hd] view
        if isinstance(self.start, int):
            a = self.start
            q[:, :, a:a + l].copy_(xq)
            scale[:, :, a:a + l].copy_(xs)
            content.copy_(q * scale)
            content[:, :, a:a + l].copy_(x)  # the pass's own keys/values, exact
            return out
        cols = self.start + torch.arange(l, device=x.device)  # [l]
        if self.write_from is not None:  # the window's cached columns keep their int8 keys/values
            fresh = (cols >= self.write_from)[:, None]  # [l, 1]
            xq = torch.where(fresh, xq, q.index_select(2, cols))
            xs = torch.where(fresh[:, :1], xs, scale.index_select(2, cols))
        q.index_copy_(2, cols, xq)
        scale.index_copy_(2, cols, xs)
        content.copy_(q * scale)
        if self.write_from is not None:
            x = torch.where(fresh, x, content.index_select(2, cols))
        content.index_copy_(2, cols, x)
        return out


def cache_bytes(cache: KVCache) -> int:
    """Bytes of a cache's keys and values (with an `Int8KVCache`'s scales and sink columns), the rotary tables
    and the padding mask left out: what `--kv-cache-dtype` changes."""
    return sum(buf.numel() * buf.element_size() for name, buf in cache.named_buffers()
               if name not in ("cos", "sin", "mask"))
