"""Attention probing for `DiffusionLM.forward(probe=...)`: what the analysis asks of one forward pass.

Training and sampling pass no probe and take the fast path. A `Probe` gathers the rest:
  * `key_masks`: per layer `[B, H, S]` bool (True = the key may be attended to, S in layout order),
    the sink-masking ablation of Rulli et al. Table 1 (docs/method.md §6);
  * `attentions` / `values`: return every layer's probabilities `[B, H, S, S]` over the whole layout
    sequence (sinks included; sink rows are one-hot, eq. 6) / values `[B, KVH, S, hd]`;
  * `hook(layer, attention [B, H, S, S], values [B, KVH, S, hd], virtual [B, H, S] | None)`: called
    inside the layer loop with that layer's maps, which are then dropped: the analysis of an 8B
    model holds one layer's `[B, H, S, S]` at a time, not all of them;
  * `backend`: the attention backend of a pass without maps (e.g. "eager", to round as the maps do).
Maps need the explicit softmax, so a probe that wants them runs the eager backend.
With a virtual sink column (`sink_logit` / `softmax_one`) every row's mass on it is returned
separately, `[B, H, S]`: the rows of the maps sum to 1 minus it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from sinkdlm.model import sink as sinklib

AttentionHook = Callable[[int, torch.Tensor, torch.Tensor, "torch.Tensor | None"], None]


@dataclass
class Probe:
    key_masks: Sequence[torch.Tensor | None] | None = None  # per layer [B, H, S] or None
    attentions: bool = False  # return per-layer maps (and the virtual column's mass)
    values: bool = False  # return per-layer values
    hook: AttentionHook | None = None
    backend: str | None = None  # a pass without maps: this backend instead of the model's

    @property
    def needs_maps(self) -> bool:
        return self.attentions or self.hook is not None

    def mask(self, layer: int, mask: torch.Tensor | None, seq_len: int, n: int, sink_position: str):
        """The content queries' mask `[B|1, 1|H, L, S]` of `layer` with its key mask applied."""
        if self.key_masks is None or self.key_masks[layer] is None:
            return mask
        km = self.key_masks[layer].bool()[:, :, None, :]  # [B, H, 1, S]
        mask = km if mask is None else mask & km
        # Masking a causal model's top sink (often token 0) leaves the first queries no key at all:
        # softmax over nothing is NaN, and 0 x NaN reaches every later row. A query whose visible
        # keys are all masked keeps its own key — it is then unaffected, as the masked sink is
        # hidden from the others (docs/method.md §6). Bidirectional rows never get here.
        empty = ~mask.any(-1, keepdim=True)  # [B, H, L, 1]
        if bool(empty.any()):
            device = mask.device
            own = torch.arange(seq_len, device=device) + (n if sink_position == "front" else 0)
            self_key = torch.zeros(seq_len, mask.shape[-1], dtype=torch.bool, device=device)
            self_key[torch.arange(seq_len, device=device), own] = True
            mask = mask | (empty & self_key)
        return mask


class ProbePass:
    """What one forward pass collects for its probe; lives as long as the pass."""

    def __init__(self, probe: Probe, config, seq_len: int, batch: int, sinks: sinklib.SinkCache | None):
        self.probe, self.seq_len, self.batch, self.sinks = probe, seq_len, batch, sinks
        self.n, self.sink_position = config.num_sink_tokens, config.sink_position
        self.has_column = config.has_sink_column
        self.attentions, self.values, self.virtual = [], [], []

    def maps(self, layer: int, probs: torch.Tensor):
        """Content rows `[B, H, L, S(+1)]` of `layer` -> (whole map `[B, H, S, S]`, virtual column
        `[B, H, S]` | None); the virtual column comes last in `probs` (attention.py)."""
        p_self = self.sinks.p_self[layer] if self.sinks is not None and self.sinks.p_self is not None else None
        column = None
        if self.has_column:
            probs, column = probs[..., :-1], probs[..., -1]  # [B, H, L, S], [B, H, L]
            if self.n > 0:  # the sinks' own rows: 1 - p_self on the column
                column = sinklib.join((1 - p_self).expand(self.batch, -1, -1), column, self.sink_position, dim=2)
        return full_attention_map(probs, self.seq_len, self.n, self.sink_position, p_self), column

    def layer(self, layer: int, maps, values: torch.Tensor) -> None:
        """Hand one layer to the hook and keep what the probe returns."""
        if maps is not None:
            full, column = maps
            if self.probe.hook is not None:
                self.probe.hook(layer, full, values, column)
            if self.probe.attentions:
                if column is not None:
                    self.virtual.append(column)
                self.attentions.append(full)
        if self.probe.values:
            self.values.append(values)

    def output(self) -> dict:
        """The `DiffusionLMOutput` fields this probe asked for."""
        keep = self.probe.attentions
        return {
            "attentions": tuple(self.attentions) if keep else None,
            "values": tuple(self.values) if self.probe.values else None,
            "virtual_sink_attentions": tuple(self.virtual) if keep and self.has_column else None,
        }


def full_attention_map(probs: torch.Tensor, seq_len: int, n: int, sink_position: str,
                       p_self: torch.Tensor | None = None) -> torch.Tensor:
    """Content rows `[B, H, L, S]` -> the whole map `[B, H, S, S]`: sink rows are one-hot (eq. 6),
    or `p_self [1, H, n]` on the diagonal when a virtual sink column takes the rest."""
    if n == 0:
        return probs
    b, h, _, s = probs.shape
    rows = probs.new_zeros(b, h, n, s)
    for r, j in enumerate(sinklib.sink_indices(seq_len, n, sink_position)):
        rows[:, :, r, j] = 1.0 if p_self is None else p_self[:, :, r]
    return sinklib.join(rows, probs, sink_position, dim=2)
