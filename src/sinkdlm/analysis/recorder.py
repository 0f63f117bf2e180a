"""SinkRecorder: running attention-sink statistics of a generation, fed by the sampler's callback.

`generate(..., callback=recorder, probe=StepProbe(attentions=True, values=True))` hands the recorder
one `StepState` per denoising step; it reduces that step's per-layer attention maps `[B, H, S, S]`
and values `[B, KVH, S, hd]` to counters at once and keeps none of the maps (docs/method.md §6):

* sinks at ϵ (Rulli et al. eq. 3) per (step, layer, head), counted for every ϵ of the
  non-sink-fraction curve; the sink positions themselves as a sparse int32 list (a few per head);
* moving sinks per layer: the largest sink's position per step (`[T, B, L, H]`, int16), and running
  counts of consecutive steps whose largest sink / sink set changed, and their Jaccard overlap (sink
  sets over every key, and over the content keys only: `content_sink_set_*`);
* the token under every sink (mask / whitespace / punctuation / other / the extra sink),
  Rulli et al. Table 2;
* value-space norms (One-Token eq. 14-16) of sink vs normal tokens: per-layer sums, plus a fixed
  size reservoir sample for the scatter plot;
* for a model with extra sink tokens: the share of attention on them per layer, their value norm
  vs the other tokens (One-Token Fig. 3) and how often a head's largest sink is an extra token.
* for a model with a virtual sink column (sink_logit / softmax_one): the share of attention on it
  per layer, how often it passes the eq. 3 test as one more key, and the non-sink fraction of
  the real keys when the column takes part in the test.

Memory: O(B·L·H·S) for the previous step's sink sets, O(T·B·L·H) for the largest-sink positions and
O(#sinks) per step for the sparse positions (both tiny next to one step's maps); whole maps only
for the figure layer, at the two figure steps (`[H, S, S]` each).

Rows of a left-padded batch are analysed on their real positions only (padding never receives
attention, but padded *queries* would add to the column sums): rows with the same padding form a
group, and the metrics run on that group's `[b, H, S', S']` sub-map. Positions reported by the
recorder (largest sink, sparse sink positions, figure maps) are in that row's real layout.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from sinkdlm.analysis.metrics import (
    DEFAULT_EPSILONS,
    TOKEN_TYPES,
    exclusive_mean,
    received_attention,
    token_type,
    virtual_sink_received,
    value_norms,
)
from sinkdlm.model.sink import sink_indices
from sinkdlm.config.checks import check_epsilon, check_epsilons, check_scale
from sinkdlm.config.commands import AnalyzeConfig  # the one home of the default (its field docstring)

EXTRA_SINK_ID = -1  # token id used for the extra sink token(s) in token-type counts
# How figures and reports name the virtual sink column of each switch.
VIRTUAL_SINK_LABELS = {"sink_logit": "virtual sink (logit)", "softmax_one": "softmax₁"}


# ----------------------------------------------------------------------------- row groups
@dataclass
class RowGroup:
    """Rows of a batch that share their real layout positions (same padding)."""

    rows: torch.Tensor | None  # [b] row indices, None = every row (no padding)
    positions: torch.Tensor | None  # [S'] layout indices of the real positions, None = all
    size: int  # S'
    sink_sub: list[int]  # indices of the extra sink tokens inside the S' positions
    content_sub: torch.Tensor  # [S'] bool, True = a content token (not an extra sink)

    def sub_attention(self, attn: torch.Tensor) -> torch.Tensor:
        """`[B, H, S, S]` -> `[b, H, S', S']` (no copy without padding)."""
        if self.rows is None:
            return attn
        pos = self.positions.to(attn.device)
        return attn.index_select(0, self.rows.to(attn.device)).index_select(2, pos).index_select(3, pos)

    def sub_keys(self, x: torch.Tensor) -> torch.Tensor:
        """`[B, ..., S, d?]` values or `[B, S]` tokens -> rows and real positions (dim 2 or 1)."""
        if self.rows is None:
            return x
        x = x.index_select(0, self.rows.to(x.device))
        dim = 2 if x.dim() == 4 else 1
        return x.index_select(dim, self.positions.to(x.device))


def row_groups(
    attention_mask: torch.Tensor | None, seq_len: int, num_sink_tokens: int, sink_position: str
) -> list[RowGroup]:
    """Group the rows of a (left-)padded batch by their real positions in layout order.

    attention_mask `[B, L]` (True = real token) or None. Sinks are always real positions.
    """
    n = num_sink_tokens
    sinks = sink_indices(seq_len, n, sink_position)
    offset = n if sink_position == "front" else 0
    if attention_mask is None:
        size = seq_len + n
        content = torch.ones(size, dtype=torch.bool)
        content[sinks] = False
        return [RowGroup(None, None, size, list(sinks), content)]
    am = attention_mask.bool().cpu()
    groups: dict[bytes, list[int]] = {}
    for b in range(am.shape[0]):
        groups.setdefault(am[b].numpy().tobytes(), []).append(b)
    out = []
    for rows in groups.values():
        real = am[rows[0]].nonzero().squeeze(-1) + offset  # content layout indices
        pos = torch.cat([real, torch.tensor(sinks, dtype=torch.long)]).sort().values  # [S']
        is_sink = torch.isin(pos, torch.tensor(sinks, dtype=torch.long))
        out.append(RowGroup(torch.tensor(rows), pos, len(pos), is_sink.nonzero().squeeze(-1).tolist(), ~is_sink))
    return out


# ----------------------------------------------------------------------------- reservoir
class Reservoir:
    """A uniform sample of at most `capacity` values from a stream (algorithm R, seeded)."""

    def __init__(self, capacity: int, seed: int = 0):
        self.capacity, self.seen = capacity, 0
        self.values = torch.empty(0)
        self.generator = torch.Generator().manual_seed(seed)

    def add(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1).float().cpu()
        free = self.capacity - len(self.values)
        if free > 0:
            self.values = torch.cat([self.values, x[:free]])
            self.seen += min(free, len(x))
            x = x[free:]
        if not len(x):
            return
        # Item i (global index seen + i) replaces slot r ~ U{0..seen+i} when r < capacity.
        r = (torch.rand(len(x), generator=self.generator, dtype=torch.float64)
             * (self.seen + torch.arange(1, len(x) + 1, dtype=torch.float64))).long()
        self.seen += len(x)
        hit = (r < self.capacity).nonzero().squeeze(-1)
        if len(hit):  # the last item written to a slot wins, as in the sequential algorithm
            last = torch.full((self.capacity,), -1, dtype=torch.long).scatter_reduce(0, r[hit], hit, "amax")
            slots = (last >= 0).nonzero().squeeze(-1)
            self.values[slots] = x[last[slots]]


# ----------------------------------------------------------------------------- the recorder
def _nan_to_none(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _set_overlap(cur: torch.Tensor, prev: torch.Tensor) -> tuple[float, float]:
    """(number of heads whose sink set changed, sum of their Jaccard overlaps) of two steps' sets
    `[..., S]` (Jaccard 1 when both are empty), as metrics.sink_set_change_rate / sink_set_jaccard."""
    inter = (cur & prev).sum(-1).double()
    union = (cur | prev).sum(-1).double()
    jaccard = torch.where(union > 0, inter / union.clamp_min(1), torch.ones_like(union))
    return float((cur != prev).any(-1).sum()), float(jaccard.sum())


def _ratio(num: torch.Tensor, den: torch.Tensor) -> list[float | None]:
    return [_nan_to_none(float(a) / float(b)) if float(b) > 0 else None for a, b in zip(num, den)]


class SinkRecorder:
    """Callback for `generate` that keeps running sink statistics (see the module docstring).

    config         the model's `ModelConfig` (layers, heads, sinks, mask id).
    analyze        the analysis's `AnalyzeConfig` (default: its defaults); the recorder reads its `epsilon`,
                   the sink threshold ϵ (eq. 3), and `scale`, "sum" or "mean" (docs/method.md §6); its
                   `figure_layer`, the layer whose maps are kept for the attention-map figure (None: the
                   middle one), and `figure_steps`, the two steps of that figure (None: the first and the
                   last); and its `seed`, which seeds the value-norm samples. The non-sink-fraction curve is
                   read on the grid `DEFAULT_EPSILONS` (ϵ itself added); the figure shows the first prompt.
    decode         `id -> str` (e.g. `lambda i: tok.decode([i])`) to classify the tokens under
                   sinks; without it every non-mask token counts as "other".
    max_norm_samples     value norms kept (a uniform reservoir sample) per kind, sinks and normal tokens.
    keep_sink_positions  keep the sparse (step, row, layer, head, position) list of every sink.
    One recorder may watch several `generate` calls (prompt chunks): a call starts at step 0.
    """

    def __init__(
        self,
        config,
        analyze: AnalyzeConfig | None = None,
        *,
        decode: Callable[[int], str] | None = None,
        max_norm_samples: int = 10_000,
        keep_sink_positions: bool = True,
    ):
        analyze = AnalyzeConfig() if analyze is None else analyze
        epsilon, scale, figure_layer, seed = analyze.epsilon, analyze.scale, analyze.figure_layer, analyze.seed
        figure_steps = analyze.figure_step_pair() or (0, -1)
        self.epsilon = check_epsilon(epsilon)
        check_scale(scale)
        self.scale = scale
        self.epsilons = sorted(set(check_epsilons(DEFAULT_EPSILONS)) | {self.epsilon})
        num_layers = config.num_hidden_layers
        self.num_layers, self.num_heads = num_layers, config.num_attention_heads
        self.num_sink_tokens, self.sink_position = config.num_sink_tokens, config.sink_position
        self.mask_id = config.mask_token_id  # None for an autoregressive model: no token is "mask"
        self.decode = decode
        self.figure_layer = num_layers // 2 if figure_layer is None else figure_layer
        if not (isinstance(self.figure_layer, int) and 0 <= self.figure_layer < num_layers):
            raise ValueError(f"figure_layer must be in [0, {num_layers}), got {figure_layer!r}")
        a, b = figure_steps
        if not (isinstance(a, int) and isinstance(b, int) and a >= 0 and (b == -1 or b > a)):
            raise ValueError(f"figure_steps must be (a, b) with 0 <= a < b, or b = -1 for the last step; got {figure_steps!r}")
        self.figure_steps, self.figure_row = (a, b), 0  # the figure's batch row: the first prompt
        self.keep_sink_positions = keep_sink_positions

        layers, eps = num_layers, len(self.epsilons)
        z = lambda *shape: torch.zeros(*shape, dtype=torch.float64)  # noqa: E731
        self._sinks_by_eps, self._keys = z(eps, layers), z(layers)  # sink count per (ϵ, layer); keys
        self._heads = z(layers)  # (step, row, head) triples seen per layer
        self._pairs, self._set_changed, self._jaccard, self._largest_changed = z(layers), z(layers), z(layers), z(layers)
        # the same over the content keys only (the extra sinks' keys left out): like for like across models
        self._set_changed_content, self._jaccard_content = z(layers), z(layers)
        # a block model (docs/method.md §15): the pairs of steps in different blocks, and their content-set changes
        self.block_size = getattr(config, "block_size", None)
        self._pairs_across, self._changed_across = z(layers), z(layers)
        self._block: int | None = None  # the block being denoised at this step
        self._across = False  # this step's block differs from the step before's
        self._mass, self._rows = z(layers), z(layers)  # attention on detected sinks; content query rows
        self._vn = {k: z(layers) for k in ("sink_sum", "sink_n", "normal_sum", "normal_n")}
        self._extra = {k: z(layers) for k in ("mass", "vn_sum", "vn_n", "others_sum", "others_n", "largest")}
        # the virtual sink column: "sink_logit", "softmax_one" or None
        self.virtual_kind = next((k for k in ("sink_logit", "softmax_one") if getattr(config, k, False)), None)
        self._virtual = {k: z(layers) for k in ("mass", "is_sink", "sinks_with", "keys_with")}
        self._type_ids: Counter = Counter()  # token id -> number of (step, row, layer, head) sinks on it
        self.sink_norms, self.normal_norms = Reservoir(max_norm_samples, seed), Reservoir(max_norm_samples, seed + 1)
        self._largest_chunks: list[torch.Tensor] = []  # per generation [T, b, L, H] int16
        self._largest_steps: list[torch.Tensor] = []  # current generation, per step [B, L, H]
        self._sink_positions: list[torch.Tensor] = []  # [n, 5] int32 (step, row, layer, head, pos)
        self._figure: dict[str, object] = {}
        self._prev: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._groups: list[RowGroup] = []
        self._width, self._step = 0, None
        self.num_generations, self.num_rows, self.num_steps, self._row_offset, self._batch = 0, 0, 0, 0, 0
        self.max_positions = 0  # S' of the longest row seen (positions are < this)

    # ------------------------------------------------------------------ feeding
    def _start_generation(self, batch: int, attention_mask, seq_len: int) -> None:
        self._flush_generation()
        self._row_offset += self._batch
        self._batch = batch
        self.num_generations += 1
        self.num_rows += self._batch
        self._prev.clear()
        self._set_groups(attention_mask, seq_len)

    def _set_groups(self, attention_mask, seq_len: int) -> None:
        self._groups = row_groups(attention_mask, seq_len, self.num_sink_tokens, self.sink_position)
        self._width = seq_len
        self.max_positions = max(self.max_positions, max(g.size for g in self._groups))

    def _flush_generation(self) -> None:
        if self._largest_steps:
            self._largest_chunks.append(torch.stack(self._largest_steps))  # [T, B, L, H]
            self._largest_steps = []

    def _begin_step(self, step: int, input_ids: torch.Tensor, attention_mask) -> None:
        """Start one step: input_ids `[B, L_in]` are the tokens the model saw (layout without sinks)."""
        width = input_ids.shape[1]
        if step == 0 or not self._groups:
            self._start_generation(input_ids.shape[0], attention_mask, width)
        elif width != self._width:
            # an autoregressive step: one more key than the step before (docs/method.md §10)
            assert self.num_sink_tokens == 0 or self.sink_position == "front", "growing sequences need front sinks"
            self._set_groups(attention_mask, width)
        self.num_steps = max(self.num_steps, step + 1)
        if self.block_size is not None:  # the block denoised now: the first still masked real column's
            masked = (input_ids == self.mask_id) & (attention_mask.bool() if attention_mask is not None else True)
            cols = torch.arange(width, device=input_ids.device)
            block = int(torch.where(masked, cols, width).amin()) // self.block_size
            self._across = step > 0 and self._block is not None and block != self._block
            self._block = block
        tokens = input_ids.cpu()  # tokens in layout order; the extra sinks get EXTRA_SINK_ID
        n = self.num_sink_tokens
        if n:
            sink_col = tokens.new_full((tokens.shape[0], n), EXTRA_SINK_ID)
            tokens = torch.cat([sink_col, tokens] if self.sink_position == "front" else [tokens, sink_col], dim=1)
        self._step = (step, tokens, torch.full((self._batch, self.num_layers, self.num_heads), -1, dtype=torch.int16))

    def _layer(self, layer: int, attn, values, column=None) -> None:
        if self.virtual_kind is not None and column is None:
            raise ValueError(
                f"this model has {self.virtual_kind}=True: the recorder needs the virtual sink column's "
                "probabilities (StepState.virtual_sink_attentions, filled by generate(..., probe=StepProbe(attentions=True)))"
            )
        for gi, group in enumerate(self._groups):
            self._record(layer, gi, group, attn, values, column)
        if layer == self.num_layers - 1:
            self._largest_steps.append(self._step[2])
            self._step = None

    def step_hook(self, step: int, input_ids: torch.Tensor, attention_mask=None):
        """`generate(..., probe=StepProbe(hook=recorder.step_hook))`: the per-layer hook of one step, fed one
        layer's maps at a time inside the forward (nothing of the maps is kept but the statistics)."""
        self._begin_step(step, input_ids, attention_mask)

        def hook(layer: int, attn, values, column=None) -> None:
            self._layer(layer, attn, values, column)

        return hook

    @torch.no_grad()
    def __call__(self, state) -> None:
        """Record one denoising step (the sampler's `callback`)."""
        if state.attentions is None or state.values is None:
            raise ValueError(
                "SinkRecorder needs the attention maps and values of every step: call "
                "generate(..., callback=recorder, probe=StepProbe(attentions=True, values=True))"
            )
        if len(state.attentions) != self.num_layers:
            raise ValueError(f"got {len(state.attentions)} attention layers, the config has {self.num_layers}")
        virtual = getattr(state, "virtual_sink_attentions", None)
        self._begin_step(state.step, state.input_ids, state.attention_mask)
        for layer, (attn, values) in enumerate(zip(state.attentions, state.values)):
            self._layer(layer, attn, values, virtual[layer] if virtual is not None else None)

    def _record(self, layer, gi, group: RowGroup, attn, values, column=None) -> None:
        step, tokens, largest = self._step  # the step being recorded (`_begin_step`)
        a = group.sub_attention(attn)  # [b, H, S', S']
        b, h, size = a.shape[0], a.shape[1], a.shape[-1]
        # eq. 3 over the content queries only: the extra sinks' rows are forced one-hot (eq. 6)
        c = received_attention(a, self.scale, query_mask=group.content_sub)  # [b, H, S'] (float32+)
        threshold = exclusive_mean(c)  # mean_{k != j} c_k
        sinks_by_eps = torch.stack([(c > threshold + e).sum() for e in self.epsilons])  # [E]
        self._sinks_by_eps[:, layer] += sinks_by_eps.cpu().double()
        self._keys[layer] += c.numel()
        self._heads[layer] += b * h
        is_sink = (c > threshold + self.epsilon).cpu()  # [b, H, S']
        c = c.cpu()

        # largest sink per head (-1 when no key is a sink at ϵ), as metrics.largest_sink
        arg = c.argmax(-1)  # [b, H]
        pos = torch.where(is_sink.gather(-1, arg[..., None]).squeeze(-1), arg, torch.full_like(arg, -1))
        rows = group.rows if group.rows is not None else torch.arange(b)
        largest[rows, layer] = pos.to(torch.int16)

        # moving sinks: compare with the previous step of this generation
        prev = self._prev.get((gi, layer))
        if prev is not None:
            prev_set, prev_pos = prev
            if prev_set.shape[-1] < size:  # autoregressive: the new keys were no sinks before
                prev_set = torch.nn.functional.pad(prev_set, (0, size - prev_set.shape[-1]), value=False)
            self._pairs[layer] += b * h
            changed, jaccard = _set_overlap(is_sink, prev_set)
            self._set_changed[layer] += changed
            self._jaccard[layer] += jaccard
            content = group.content_sub  # [S']
            changed, jaccard = _set_overlap(is_sink & content, prev_set & content)
            self._set_changed_content[layer] += changed
            if self._across:  # a block model's first step of a new block against the last of the one before
                self._pairs_across[layer] += b * h
                self._changed_across[layer] += changed
            self._jaccard_content[layer] += jaccard
            self._largest_changed[layer] += float((pos != prev_pos).sum())
        self._prev[(gi, layer)] = (is_sink, pos)

        # tokens under the sinks (Rulli et al. Table 2), weighted by the number of heads
        heads_on = is_sink.sum(1)  # [b, S']
        tok = group.sub_keys(tokens)  # [b, S']
        hit = heads_on > 0
        if bool(hit.any()):
            ids, inverse = torch.unique(tok[hit], return_inverse=True)
            counts = torch.zeros(len(ids), dtype=torch.long).scatter_add_(0, inverse, heads_on[hit])
            self._type_ids.update(dict(zip(ids.tolist(), counts.tolist())))
        if self.keep_sink_positions:
            nz = is_sink.nonzero()  # [k, 3] (row in group, head, position)
            if len(nz):
                col = lambda v: torch.full((len(nz), 1), v, dtype=torch.int32)  # noqa: E731
                self._sink_positions.append(torch.cat([
                    col(step), (rows[nz[:, :1]] + self._row_offset).int(), col(layer), nz[:, 1:].int()], dim=1))

        # attention mass on the detected sinks, over content queries (c already leaves out the
        # sinks' own rows, which are one-hot on themselves, eq. 6)
        content_rows = size - len(group.sink_sub)
        c_sum = c if self.scale == "sum" else c * content_rows
        self._mass[layer] += float((c_sum * is_sink).sum())
        self._rows[layer] += b * h * content_rows

        # value-space norms (eq. 16): a token is a "sink token" of this layer if any head sinks on it
        r = value_norms(group.sub_keys(values)).cpu()  # [b, S']
        content = group.content_sub[None].expand(b, -1)
        any_head = is_sink.any(1)
        on_sink, normal = any_head & content, ~any_head & content
        self._vn["sink_sum"][layer] += float(r[on_sink].sum())
        self._vn["sink_n"][layer] += int(on_sink.sum())
        self._vn["normal_sum"][layer] += float(r[normal].sum())
        self._vn["normal_n"][layer] += int(normal.sum())
        self.sink_norms.add(r[on_sink])
        self.normal_norms.add(r[normal])

        if column is not None:  # the virtual sink column `[B, H, S]`
            col = column
            if group.rows is not None:
                col = col.index_select(0, group.rows.to(col.device)).index_select(2, group.positions.to(col.device))
            col = col.cpu().double()  # [b, H, S']
            # mass over content query rows, as for the detected sinks (the sinks' rows left out)
            self._virtual["mass"][layer] += float(col[:, :, group.content_sub].sum())
            # eq. 3 with the column as one more key of every head
            cv = virtual_sink_received(col, self.scale, query_mask=group.content_sub)  # [b, H], scale of c
            c_with = torch.cat([c.double(), cv[..., None]], dim=-1)  # [b, H, S'+1]
            sinks_with = c_with > exclusive_mean(c_with) + self.epsilon
            self._virtual["is_sink"][layer] += float(sinks_with[..., -1].sum())
            self._virtual["sinks_with"][layer] += float(sinks_with[..., :-1].sum())
            self._virtual["keys_with"][layer] += c.numel()

        if group.sink_sub:  # the extra sink token(s): One-Token Fig. 3
            self._extra["mass"][layer] += float(c_sum[..., group.sink_sub].sum())
            self._extra["vn_sum"][layer] += float(r[:, group.sink_sub].sum())
            self._extra["vn_n"][layer] += b * len(group.sink_sub)
            self._extra["others_sum"][layer] += float(r[content].sum())
            self._extra["others_n"][layer] += int(content.sum())
            self._extra["largest"][layer] += float(torch.isin(pos, torch.tensor(group.sink_sub)).sum())

        # whole maps of one layer, at the figure steps only
        if layer == self.figure_layer:
            hit = (rows + self._row_offset == self.figure_row).nonzero()
            if len(hit):
                self._keep_figure(step, a[int(hit[0, 0])])

    def _keep_figure(self, step: int, maps: torch.Tensor) -> None:
        """maps `[H, S', S']` of the figure row at the figure layer."""
        first, last = self.figure_steps
        if step == first:
            self._figure["first"] = (step, maps.detach().float().cpu().clone())
        elif step > first and (last == -1 or step <= last):
            # the latest step up to b: one rolling map, so memory does not grow with the steps
            self._figure["last"] = (step, maps.detach().float().cpu().clone())

    # ------------------------------------------------------------------ results
    def figure_maps(self) -> tuple[torch.Tensor, list[int], int] | None:
        """(`[2, S', S']` maps of the figure layer's most sink-heavy head at the two figure steps
        (`[1, S', S']` when the generation had one step), their steps, the head), or None."""
        kept = [self._figure[k] for k in ("first", "last") if k in self._figure]
        if not kept:
            return None
        size = max(m.shape[-1] for _, m in kept)  # an AR generation's first map is smaller: zero-padded
        kept = [(s, torch.nn.functional.pad(m, (0, size - m.shape[-1], 0, size - m.shape[-2]))) for s, m in kept]
        strength = sum(m.sum(-2).amax(-1) for _, m in kept)  # [H] largest column sum
        head = int(strength.argmax())
        return torch.stack([m[head] for _, m in kept]), [s for s, _ in kept], head

    def largest_sink_positions(self) -> torch.Tensor:
        """`[T, N, L, H]` int16 position of the largest sink per step (-1: none at ϵ; padded steps -1)."""
        self._flush_generation()
        if not self._largest_chunks:
            return torch.full((0, 0, self.num_layers, self.num_heads), -1, dtype=torch.int16)
        t = max(c.shape[0] for c in self._largest_chunks)
        pad = [torch.cat([c, c.new_full((t - c.shape[0], *c.shape[1:]), -1)]) for c in self._largest_chunks]
        return torch.cat(pad, dim=1)

    def sink_positions(self) -> torch.Tensor:
        """`[K, 5]` int32 rows (step, row, layer, head, position) of every sink at ϵ."""
        if not self._sink_positions:
            return torch.zeros(0, 5, dtype=torch.int32)
        return torch.cat(self._sink_positions)

    def token_type_counts(self) -> Counter:
        counts: Counter = Counter({t: 0 for t in TOKEN_TYPES})
        sink_ids = {EXTRA_SINK_ID} if self.num_sink_tokens else set()
        for i, k in self._type_ids.items():
            text = "" if i == EXTRA_SINK_ID or self.decode is None else self.decode(i)
            counts[token_type(i, text, self.mask_id, sink_ids=sink_ids)] += k
        return counts

    def top_sink_tokens(self, k: int = 10) -> list[dict]:
        out = []
        for i, count in self._type_ids.most_common(k):
            text = "[SINK]" if i == EXTRA_SINK_ID else (self.decode(i) if self.decode else str(i))
            out.append({"id": int(i), "text": text, "count": int(count)})
        return out

    def nbytes(self) -> int:
        """Bytes of tensors the recorder keeps (its memory grows only with the sparse lists)."""
        tensors = [*self._largest_chunks, *self._largest_steps, *self._sink_positions,
                   self.sink_norms.values, self.normal_norms.values]
        tensors += [t for pair in self._prev.values() for t in pair]
        tensors += [v[1] for k, v in self._figure.items() if k in ("first", "last")]
        return sum(t.numel() * t.element_size() for t in tensors)

    def summary(self) -> dict:
        """The JSON-ready statistics (the recorder's part of `analysis.json`)."""
        if not self.num_steps:
            raise ValueError("the recorder saw no step; pass it as generate(..., callback=recorder)")
        idx = self.epsilons.index(self.epsilon)
        keys = self._keys.sum()
        by_eps = {f"{e:g}": float(1 - self._sinks_by_eps[i].sum() / keys) for i, e in enumerate(self.epsilons)}
        types = self.token_type_counts()
        total = sum(types.values())
        vn = self._vn
        moving = {
            "largest_sink_change_rate": _ratio(self._largest_changed, self._pairs),
            "sink_set_change_rate": _ratio(self._set_changed, self._pairs),
            "sink_set_jaccard": _ratio(self._jaccard, self._pairs),
            # over the content keys only; the two above count every key (the extra sinks' included)
            "content_sink_set_change_rate": _ratio(self._set_changed_content, self._pairs),
            "content_sink_set_jaccard": _ratio(self._jaccard_content, self._pairs),
            "extra_sink_share": _ratio(self._extra["largest"], self._heads) if self.num_sink_tokens else None,
        }
        moving["mean"] = {k: _ratio(v.sum()[None], self._pairs.sum()[None])[0] for k, v in (
            ("largest_sink_change_rate", self._largest_changed), ("sink_set_change_rate", self._set_changed),
            ("sink_set_jaccard", self._jaccard), ("content_sink_set_change_rate", self._set_changed_content),
            ("content_sink_set_jaccard", self._jaccard_content))}
        if self.block_size is not None:  # docs/method.md §15: within a block's steps, and from one block to the next
            within_pairs, within = self._pairs - self._pairs_across, self._set_changed_content - self._changed_across
            moving["content_sink_set_change_rate_within_block"] = _ratio(within, within_pairs)
            moving["content_sink_set_change_rate_across_blocks"] = _ratio(self._changed_across, self._pairs_across)
            moving["mean"]["content_sink_set_change_rate_within_block"] = _ratio(within.sum()[None],
                                                                                 within_pairs.sum()[None])[0]
            moving["mean"]["content_sink_set_change_rate_across_blocks"] = _ratio(self._changed_across.sum()[None],
                                                                                  self._pairs_across.sum()[None])[0]
        if self.num_sink_tokens:
            moving["mean"]["extra_sink_share"] = _ratio(self._extra["largest"].sum()[None], self._heads.sum()[None])[0]
        extra = None
        if self.num_sink_tokens:
            e = self._extra
            extra = {
                "num_sink_tokens": self.num_sink_tokens,
                "sink_position": self.sink_position,
                "attention_mass": _ratio(e["mass"], self._rows),
                "value_norm": _ratio(e["vn_sum"], e["vn_n"]),
                "others_value_norm": _ratio(e["others_sum"], e["others_n"]),
                "largest_sink_share": _ratio(e["largest"], self._heads),
                "mean_attention_mass": _ratio(e["mass"].sum()[None], self._rows.sum()[None])[0],
            }
        virtual = None
        if self.virtual_kind is not None:
            v = self._virtual
            virtual = {
                "kind": self.virtual_kind,
                "label": VIRTUAL_SINK_LABELS[self.virtual_kind],
                "attention_mass": _ratio(v["mass"], self._rows),
                "mean_attention_mass": _ratio(v["mass"].sum()[None], self._rows.sum()[None])[0],
                "is_sink_share": _ratio(v["is_sink"], self._heads),
                "non_sink_fraction_with_virtual": _ratio(v["keys_with"] - v["sinks_with"], v["keys_with"]),
                "mean_non_sink_fraction_with_virtual": _ratio(
                    (v["keys_with"] - v["sinks_with"]).sum()[None], v["keys_with"].sum()[None])[0],
            }
        return {
            "epsilon": self.epsilon,
            "scale": self.scale,
            "non_sink_fraction": by_eps[f"{self.epsilon:g}"],
            "non_sink_fraction_by_epsilon": by_eps,
            "non_sink_fraction_per_layer": [float(1 - s / k) for s, k in zip(self._sinks_by_eps[idx], self._keys)],
            "sinks_per_head": _ratio(self._sinks_by_eps[idx], self._heads),
            "sink_attention_mass": _ratio(self._mass, self._rows),
            "sink_token_types": {
                "counts": dict(types),
                "shares": {k: (v / total if total else None) for k, v in types.items()},
                "total": total,
                "top_tokens": self.top_sink_tokens(),
            },
            "value_norm": {
                "sink_mean": _ratio(vn["sink_sum"].sum()[None], vn["sink_n"].sum()[None])[0],
                "normal_mean": _ratio(vn["normal_sum"].sum()[None], vn["normal_n"].sum()[None])[0],
                "sink_count": int(vn["sink_n"].sum()),
                "normal_count": int(vn["normal_n"].sum()),
                "per_layer": {"sink_mean": _ratio(vn["sink_sum"], vn["sink_n"]),
                              "normal_mean": _ratio(vn["normal_sum"], vn["normal_n"])},
            },
            "moving": moving,
            "extra_sink": extra,
            "virtual_sink": virtual,
            "counts": {"generations": self.num_generations, "rows": self.num_rows, "steps": self.num_steps,
                       "layers": self.num_layers, "heads": self.num_heads},
        }

    def arrays(self) -> dict[str, np.ndarray]:
        """The per-run arrays saved beside `analysis.json` (`analysis_arrays.npz`)."""
        out = {
            "epsilons": np.asarray(self.epsilons, dtype=np.float64),
            "sinks_by_epsilon_layer": self._sinks_by_eps.numpy(),
            "keys_per_layer": self._keys.numpy(),
            "largest_sink_positions": self.largest_sink_positions().numpy(),
            "sink_positions": self.sink_positions().numpy(),
            "sink_norm_sample": self.sink_norms.values.numpy(),
            "normal_norm_sample": self.normal_norms.values.numpy(),
        }
        maps = self.figure_maps()
        if maps is not None:
            out["attention_maps"] = maps[0].numpy()
            out["attention_map_steps"] = np.asarray(maps[1])
            out["attention_map_layer_head"] = np.asarray([self.figure_layer, maps[2]])
        return out
