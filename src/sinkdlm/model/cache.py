"""A static key/value cache for `DiffusionLM.forward(cache=...)`: Fast-dLLM's prefix and dual caches.

`DiffusionLM.allocate_cache(batch, length, attention_mask)` makes one `KVCache` per generation: per
layer, keys (after rotation, at their absolute positions) and values `[B, KVH, S, hd]` over the whole
key sequence, S = n sinks + L content columns in layout order (eq. 5 front, eq. 7 end). The sinks'
columns are written once at allocation (their keys/values are constants of the model, docs/method.md
§3); the content's rotary tables and the padding's key mask are built once too. A pass over the
content columns `start .. start + l` then writes its fresh keys/values there, in place, and attends to
the whole buffer:
    keys = buffer with columns start .. start+l replaced by the fresh ones,
so a pass from the block's start to the end is a prefix cache, one over the block alone a dual cache,
and one over every column the plain, uncached forward. The shapes never change from the first step
to the last (what a CUDA graph and a single compiled graph need), and a cached pass dispatches the
same ops as an uncached one. It is litgpt's `KVCache` / nanochat's `engine.KVCache` for a diffusion
model, which writes a block anywhere in the sequence rather than appending.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


class KVCache(nn.Module):
    """Per-layer key/value buffers of one generation, and where the next pass writes.

    keys, values  per layer `[B, KVH, S, hd]`, rotated keys, the sinks' columns filled at allocation.
    cos, sin      `[B|1, L, hd]` the content columns' rotary tables (the activation dtype).
    mask          `[B, 1, 1, S]` bool key mask (False = padding), None when no row is padded.
    offset        the buffer column of content column 0 (n with front sinks, 0 with end sinks).
    start         the next pass's first content column: an int (eager), or a 0-d long tensor, so that a
                  compiled step does not specialise on it (one graph for every block).
    write_from    None: the pass writes all its columns; a 0-d long tensor (with a tensor `start`): only
                  those from this column on, the others keep the cached keys/values (a compiled prefix
                  step runs a fixed-width window whose first columns are the cached prefix).
    The tensors are the module's (non-persistent) buffers: a compiled step then treats them as static
    inputs, which a CUDA graph may update in place (`torch.compile(mode="reduce-overhead")`).
    """

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor,
                 mask: torch.Tensor | None, offset: int):
        super().__init__()
        for i, (k, v) in enumerate(zip(keys, values)):
            self.register_buffer(f"k{i}", k, persistent=False)
            self.register_buffer(f"v{i}", v, persistent=False)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.register_buffer("mask", mask, persistent=False)
        self.num_layers, self.offset = len(keys), offset
        self.start: int | torch.Tensor = 0
        self.write_from: torch.Tensor | None = None

    def select_rows(self, idx: torch.Tensor) -> "KVCache":
        """The same cache over the rows `idx` only (a block decoder's finished rows leave the batch): every buffer
        held per row is indexed, one shared by every row (`[1, ...]` rotary tables) is kept."""
        batch = self.k0.shape[0]
        new = copy.copy(self)
        new._buffers = {name: (buf[idx] if buf is not None and buf.shape[0] == batch else buf)
                        for name, buf in self._buffers.items()}
        return new

    @property
    def keys(self) -> list[torch.Tensor]:
        return [getattr(self, f"k{i}") for i in range(self.num_layers)]

    @property
    def values(self) -> list[torch.Tensor]:
        return [getattr(self, f"v{i}") for i in range(self.num_layers)]

    @property
    def length(self) -> int:
        """Content columns L."""
        return self.cos.shape[1]

    def rope(self, run_length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin `[B|1, l, hd]` of the pass's columns `start .. start + l`."""
        if isinstance(self.start, int):
            return self.cos[:, self.start:self.start + run_length], self.sin[:, self.start:self.start + run_length]
        cols = self.start + torch.arange(run_length, device=self.cos.device)  # [l]
        return self.cos.index_select(1, cols), self.sin.index_select(1, cols)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Put the pass's fresh `k, v [B, KVH, l, hd]` at its columns; the whole buffers `[B, KVH, S, hd]`."""
        kb, vb = getattr(self, f"k{layer}"), getattr(self, f"v{layer}")
        l = k.shape[2]
        if isinstance(self.start, int):
            a = self.offset + self.start
            kb[:, :, a:a + l].copy_(k)
            vb[:, :, a:a + l].copy_(v)
        else:
            cols = self.offset + self.start + torch.arange(l, device=k.device)  # [l]
            if self.write_from is not None:  # the window's cached columns keep their keys/values
                fresh = (cols >= self.offset + self.write_from)[:, None]  # [l, 1]
                k = torch.where(fresh, k, kb.index_select(2, cols))
                v = torch.where(fresh, v, vb.index_select(2, cols))
            kb.index_copy_(2, cols, k)
            vb.index_copy_(2, cols, v)
        return kb, vb

    def check(self, num_layers: int, batch: int, run_length: int) -> None:
        """Validate against a pass over `run_length` columns of `batch` rows, before any work."""
        if self.num_layers != num_layers:
            raise ValueError(f"the KV cache has {self.num_layers} layers, the model {num_layers}")
        if self.k0.shape[0] != batch:
            raise ValueError(f"the KV cache holds {self.k0.shape[0]} rows, the input {batch}")
        if isinstance(self.start, int) and not (0 <= self.start and self.start + run_length <= self.length):
            raise ValueError(f"a pass over {run_length} columns from KVCache.start={self.start} does not fit "
                             f"the cache's {self.length} columns")
