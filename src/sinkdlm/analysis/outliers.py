"""Activation outliers per layer, as Bondarenko et al. (2023, "Quantizable Transformers") measure them.

For every layer ℓ and three tensors `[positions, d]`:
  residual   the residual stream after the block (its output h_ℓ);
  attention  the attention output, O = (Y ⊙ σ(X W_g)) W_O before it joins the residual (eq. 8-10);
  ffn        the SwiGLU MLP's output before it joins the residual;
and separately on the sink positions and the content positions:
  inf_norm          ‖x‖∞ = max |x| over the group's positions and channels (the paper's FFN ∞-norm);
  kurtosis          the mean over the group's positions of each position's Pearson kurtosis over its d channels,
                    E[(x - μ)⁴] / σ⁴ (3 for a Gaussian; the paper's "average kurtosis", scipy's fisher=False);
  outlier_channels  the channels c where some position of the group has |x_c| > 6 σ, σ the standard deviation
                    of the layer's tensor over every measured position (sink and content) and channel: one
                    threshold per layer and tensor, so a channel in the sink and in the content is judged alike.
The sink positions are the model's extra sink tokens (docs/method.md §3): their hidden states depend on the
weights only (eq. 6), so the sink stream (`DiffusionLM.sink_stream`, the same block code) gives them exactly;
a model without extra sink tokens has no sink group (None). The content positions are the prompts' real tokens
(padding left out) in one forward each, unmasked text, as the paper measures on validation text.
Everything is accumulated in float64 over batches (sums, maxima, per-channel maxima), nothing kept per position.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

KINDS = ("residual", "attention", "ffn")
GROUPS = ("sink", "content")
SIGMAS = 6  # |x| > 6 σ: an outlier


class _Moments:
    """Running float64 statistics of one (layer, tensor, group): ∞-norm, the per-position kurtosis' sum, the
    per-channel max |x|, and Σx, Σx², count for the layer's σ."""

    def __init__(self, d: int):
        self.inf = 0.0
        self.kurtosis_sum = 0.0
        self.positions = 0
        self.channel_max = torch.zeros(d, dtype=torch.float64)
        self.sum = self.sum_sq = 0.0
        self.count = 0

    def add(self, x: torch.Tensor) -> None:
        """`x [N, d]` the group's positions."""
        if not x.shape[0]:
            return
        x = x.detach().to("cpu", torch.float64)
        a = x.abs()
        self.inf = max(self.inf, float(a.max()))
        self.channel_max = torch.maximum(self.channel_max, a.amax(0))
        c = x - x.mean(-1, keepdim=True)
        var = c.pow(2).mean(-1)  # [N], population variance over the channels
        self.kurtosis_sum += float((c.pow(4).mean(-1) / var.pow(2)).nansum())  # a constant row: no kurtosis
        self.positions += x.shape[0]
        self.sum += float(x.sum())
        self.sum_sq += float(x.pow(2).sum())
        self.count += x.numel()


@torch.no_grad()
def measure_outliers(model, batches: Iterable[tuple[torch.Tensor, torch.Tensor | None]]) -> dict:
    """The outlier statistics (module docstring) of `model` over `batches` of (ids `[B, L]`, attention_mask
    `[B, L]` bool | None, True = real), as analysis.json's `outliers` dict."""
    cfg = model.config
    layers, d = cfg.num_hidden_layers, cfg.hidden_size
    stats = {(i, kind, g): _Moments(d) for i in range(layers) for kind in KINDS for g in GROUPS}
    state = {"group": None, "keep": None}  # which positions the hooks are seeing (None: none), which rows are real

    def record(i: int, kind: str):
        def hook(module, args, out):
            if state["group"] is None:
                return
            x = out[0] if isinstance(out, tuple) else out  # a block returns (h, probs, v, kv, p_self)
            x = x.reshape(-1, x.shape[-1]) if state["keep"] is None else x[state["keep"]]  # [N, d]
            stats[(i, kind, state["group"])].add(x)
        return hook

    handles = []
    for i, layer in enumerate(model.layers):
        for kind, module in zip(KINDS, (layer, layer.self_attn.o_proj, layer.mlp)):
            handles.append(module.register_forward_hook(record(i, kind)))
    try:
        with model.sink_cache_mode(True):
            if cfg.num_sink_tokens:
                model.sink_cache()  # filled first (not recorded), so the content passes below run no sink rows
                state["group"] = "sink"
                model.sink_stream()  # the sinks alone through every layer: their rows, exactly (eq. 6)
            state["group"] = "content"
            for ids, mask in batches:
                state["keep"] = None if mask is None else mask.to(ids.device).bool()
                model(ids, attention_mask=mask)
    finally:
        for h in handles:
            h.remove()
    return _summary(stats, layers, bool(cfg.num_sink_tokens))


def _summary(stats: dict, layers: int, has_sinks: bool) -> dict:
    """analysis.json's `outliers`: per tensor kind, per group, per layer lists (JSON numbers)."""
    sigma = {kind: [] for kind in KINDS}
    per_layer = {kind: {g: {"inf_norm": [], "kurtosis": [], "outlier_channels": []} for g in GROUPS} for kind in KINDS}
    for kind in KINDS:
        for i in range(layers):
            both = [stats[(i, kind, g)] for g in GROUPS]
            count = sum(m.count for m in both)
            mean = sum(m.sum for m in both) / count
            std = max(sum(m.sum_sq for m in both) / count - mean * mean, 0.0) ** 0.5
            sigma[kind].append(std)
            for g, m in zip(GROUPS, both):
                out = per_layer[kind][g]
                out["inf_norm"].append(m.inf)
                out["kurtosis"].append(m.kurtosis_sum / m.positions if m.positions else None)
                out["outlier_channels"].append(torch.nonzero(m.channel_max > SIGMAS * std).flatten().tolist())
    counts = {g: stats[(0, KINDS[0], g)].positions for g in GROUPS}
    if not has_sinks:
        for kind in KINDS:
            per_layer[kind]["sink"] = None
    return {"threshold_sigmas": SIGMAS, "positions": counts, "sigma": sigma, "per_layer": per_layer}


def prompt_batches(ids: list[list[int]], batch_size: int, pad_id: int, device) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """The prompts' token ids in batches of `batch_size`, left-padded with `pad_id` (mask: True = real; None
    when no row of the batch is padded)."""
    out = []
    for start in range(0, len(ids), batch_size):
        rows = ids[start:start + batch_size]
        width = max(len(r) for r in rows)
        x = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.bool)
        for j, r in enumerate(rows):
            x[j, width - len(r):] = torch.tensor(r)
            mask[j, width - len(r):] = True
        out.append((x.to(device), None if bool(mask.all()) else mask.to(device)))
    return out
