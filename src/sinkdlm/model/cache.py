"""Fast-dLLM's key/value cache for `DiffusionLM.forward(cache=...)` (their prefix and dual caches).

A `KVCache` holds, per layer, the content keys (after rotation, at their absolute positions) and
values `[B, KVH, Lc, hd]`, the column `start` where a pass's `input_ids` begin, and `record`: whether
the pass stores its keys/values over the whole key sequence for the passes after it. It is litgpt's
`KVCache` / nanochat's `engine.KVCache` for a diffusion model, which runs a block of columns anywhere
in the sequence rather than appending: the fresh keys/values of columns `start .. start+L` replace
the cached ones there,
    keys = cached[:start] + fresh + cached[start+L:],
so Lc = start is a prefix cache and Lc = the whole sequence a dual cache. The sinks are not in it:
they stay the model's exact, global sink cache (docs/method.md §3).
"""

from __future__ import annotations

import torch

KV = tuple[torch.Tensor, torch.Tensor]  # (k rotated, v), each [B, KVH, Lc, hd]


class KVCache:
    """Per-layer content keys/values, the start column of the next pass, and whether it records.

    `KVCache(record=True)` on a full forward fills `layers`; then `crop(end)` keeps a prefix, and
    `start = c` with `record = False` makes the next forward run only the columns from `c`.
    """

    def __init__(self, layers: list[KV] | None = None, *, start: int = 0, record: bool = False):
        self.layers = None if layers is None else list(layers)
        self.start = start
        self.record = record

    @property
    def length(self) -> int:
        """Cached key columns Lc (0 while nothing is cached)."""
        return 0 if not self.layers else self.layers[0][0].shape[2]

    def get(self, layer: int) -> KV | None:
        return None if self.layers is None else self.layers[layer]

    def crop(self, end: int) -> None:
        """Keep the columns before `end` in every layer (what a prefix cache reuses)."""
        self.layers = [(k[:, :, :end], v[:, :, :end]) for k, v in self.layers]

    def key_length(self, num_layers: int, run_length: int) -> int:
        """Validate against a pass over `run_length` columns; the key sequence length it sees."""
        if self.layers is None:
            if self.start:
                raise ValueError(f"KVCache.start={self.start} needs cached keys/values (record them first)")
            return run_length
        if len(self.layers) != num_layers:
            raise ValueError(f"the KV cache has {len(self.layers)} layers, the model {num_layers}")
        if not 0 <= self.start <= self.length:
            raise ValueError(f"KVCache.start={self.start} must lie in [0, cached length {self.length}]")
        return max(self.length, self.start + run_length)
