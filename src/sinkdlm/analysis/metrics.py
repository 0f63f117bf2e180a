"""Attention-sink metrics as pure tensor functions (docs/method.md §6).

Everything here takes plain tensors — attention probabilities ``attn [..., S, S]``
(rows = queries i, columns = keys j, any leading dims such as batch, layer, head,
step) or value vectors ``[..., M, S, d]`` — and needs no model. Functions work on
CPU or CUDA alike and upcast half precision to float32 before summing.

- Received attention and sink detection: Rulli et al. eq. 3, with the ``"sum"``
  (default) or ``"mean"`` scale; docs/method.md §6 explains why ``"sum"`` is the default.
- Non-sink ("filtered") fraction over ϵ, also as counts for streaming accumulation.
- Attention mass on given key positions (One-Token Fig. 3 b, d).
- Value-space norms, One-Token appendix A.3 eq. 14-16.
- Moving-sink metrics over denoising steps: largest sink position, change rate and
  Jaccard overlap of consecutive sink sets (over every key, or over the content keys only),
  share of largest sinks on extra sinks.
- Token-type classification of sink positions (Rulli et al. Table 2).
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence

import torch

from sinkdlm.config.checks import check_epsilon, check_epsilons, check_scale
from sinkdlm.config.commands import AnalyzeConfig  # the one home of the default (its field docstring)

DEFAULT_EPSILONS = (0.0, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0)  # Rulli et al. Fig. 10
TOKEN_TYPES = ("mask", "whitespace", "punctuation", "other")  # + "sink" when asked

# ---------------------------------------------------------------------------
# input checks (run before any work; user errors are ValueError)
# ---------------------------------------------------------------------------


def _as_float(x, name: str) -> torch.Tensor:
    """Tensor of at least float32 precision (sums of bf16 probabilities drift)."""
    if not isinstance(x, torch.Tensor):
        try:
            x = torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(f"{name} must be a tensor or array, got {type(x).__name__}") from err
    if not x.is_floating_point() or x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    return x


def _check_attn(attn, name: str = "attn") -> torch.Tensor:
    attn = _as_float(attn, name)
    if attn.ndim < 2:
        raise ValueError(f"{name} must have shape [..., S, S] (queries x keys), got {tuple(attn.shape)}")
    if attn.shape[-1] != attn.shape[-2]:
        raise ValueError(
            f"{name} must be square in its last two dims (queries x keys over the same "
            f"sequence), got {tuple(attn.shape[-2:])}"
        )
    if attn.shape[-1] < 2:
        raise ValueError(
            f"{name} has {attn.shape[-1]} key(s); sink detection compares a key with the "
            "others, so at least 2 keys are needed"
        )
    return attn


def _check_keep(keep_leading: int, available: int) -> None:
    if not (isinstance(keep_leading, int) and 0 <= keep_leading <= available):
        raise ValueError(f"keep_leading must be an int in [0, {available}] for this input, got {keep_leading!r}")


def _check_steps(x, name: str, dtype: torch.dtype | None = None, min_ndim: int = 1) -> torch.Tensor:
    """A per-step tensor ``[T, ...]`` with T >= 2 (metrics over consecutive pairs)."""
    x = torch.as_tensor(x)
    if dtype is not None and x.dtype != dtype:
        raise ValueError(f"{name} must have dtype {dtype}, got {x.dtype}")
    if x.ndim < min_ndim or x.shape[0] < 2:
        raise ValueError(f"{name} must have a leading step dim T >= 2, got shape {tuple(x.shape)}")
    return x


def _position_mask(index, size: int, device, name: str, allow_empty: bool = False) -> torch.Tensor:
    """Bool ``[size]`` from an int, a list of ints (negative counts from the end) or a bool mask."""
    if isinstance(index, bool):
        raise ValueError(f"{name} must be an int, a list of ints or a bool mask [S], got a bool")
    if isinstance(index, (list, tuple)) and not index:
        index = torch.zeros(0, dtype=torch.long)  # torch.as_tensor([]) would be float
    idx = torch.as_tensor(index, device=device)
    if idx.dtype == torch.bool:
        if idx.shape != (size,):
            raise ValueError(f"{name} as a bool mask must have shape [{size}], got {tuple(idx.shape)}")
        mask = idx
    elif not idx.is_floating_point() and not idx.is_complex():
        idx = idx.reshape(-1).long()
        if idx.numel() and (idx.min() < -size or idx.max() >= size):
            raise ValueError(f"{name} {idx.tolist()} out of range for {size} positions")
        mask = torch.zeros(size, dtype=torch.bool, device=device)
        mask[idx % size] = True
    else:
        raise ValueError(f"{name} must be an int, a list of ints or a bool mask [S], got dtype {idx.dtype}")
    if not allow_empty and not bool(mask.any()):
        raise ValueError(f"{name} selects no position")
    return mask


def _reduce_mean(x: torch.Tensor, keep_leading: int) -> torch.Tensor:
    """Mean over all dims after the first ``keep_leading`` (0-d when keep_leading = 0)."""
    return x.float().flatten(keep_leading).mean(-1)


# ---------------------------------------------------------------------------
# received attention and sink detection (Rulli et al. eq. 3, docs/method.md §6)
# ---------------------------------------------------------------------------


def _query_rows(attn: torch.Tensor, query_mask) -> torch.Tensor:
    """``attn [..., S, S]`` restricted to the counted query rows ``[..., Q, S]``."""
    if query_mask is None:
        return attn
    size = attn.shape[-1]
    rows = _position_mask(query_mask, size, attn.device, "query_mask", allow_empty=True)
    if not bool(rows.any()):
        raise ValueError("query_mask selects no query row; pass True for the rows to count (the content tokens)")
    return attn[..., rows, :]


def received_attention(attn, scale: str = AnalyzeConfig.scale, *, query_mask=None) -> torch.Tensor:
    """Attention received by every key: ``attn [..., S, S]`` -> ``c [..., S]``.

    ``"sum"``: ``c_j = sum_{i in Q} A[i, j]``; ``"mean"``: ``c_j = (1/|Q|) sum_{i in Q} A[i, j]``
    (Rulli et al. eq. 3 with every row counted), where Q are the query rows counted:
    all of them by default, or those where ``query_mask [S]`` (bool, True = counted) is True.
    Pass the content rows for a model with extra sink tokens: a sink's own row is forced one-hot
    on itself (One-Token eq. 6) and would add exactly 1 to its own column.
    """
    check_scale(scale)
    attn = _query_rows(_check_attn(attn), query_mask)
    c = attn.sum(dim=-2)  # column sum over the counted queries, [..., S]
    return c / attn.shape[-2] if scale == "mean" else c


def virtual_sink_received(column, scale: str = AnalyzeConfig.scale, *, query_mask=None) -> torch.Tensor:
    """Attention received by the virtual sink column (sink_logit / softmax_one models).

    ``column [..., S]``: the probability each query row puts on the virtual column (the model's
    ``virtual_sink_attentions``) -> ``[...]``, on the same scale as `received_attention` with the
    same ``query_mask``, so it can be compared with the real keys' ``c_j`` as one more key (each
    row's mass over the real keys plus the column is 1).
    """
    check_scale(scale)
    column = _as_float(column, "column")
    if query_mask is not None:
        rows = _position_mask(query_mask, column.shape[-1], column.device, "query_mask", allow_empty=True)
        if not bool(rows.any()):
            raise ValueError("query_mask selects no query row; pass True for the rows to count (the content tokens)")
        column = column[..., rows]
    c = column.sum(dim=-1)
    return c / column.shape[-1] if scale == "mean" else c


def exclusive_mean(c: torch.Tensor) -> torch.Tensor:
    """``mean_{k != j} c_k`` for every j: ``c [..., S]`` -> ``[..., S]``."""
    return (c.sum(dim=-1, keepdim=True) - c) / (c.shape[-1] - 1)


def detect_sinks(attn, epsilon: float = AnalyzeConfig.epsilon, scale: str = AnalyzeConfig.scale, *, query_mask=None) -> torch.Tensor:
    """Bool ``[..., S]``: key j is a sink iff ``c_j > mean_{k != j} c_k + ϵ`` (Rulli et al. eq. 3).

    Strict inequality: a key exactly at the threshold is not a sink. For row-stochastic
    maps on the sum scale with every row counted this equals the closed form
    ``c_j > 1 + ϵ (S-1)/S``. ``query_mask`` as in :func:`received_attention`.
    """
    eps = check_epsilon(epsilon)
    c = received_attention(attn, scale, query_mask=query_mask)  # [..., S]
    return c > exclusive_mean(c) + eps


def sink_counts(attn, epsilons=DEFAULT_EPSILONS, scale: str = AnalyzeConfig.scale, *, query_mask=None) -> dict[float, tuple[int, int]]:
    """ϵ -> ``(non_sink, total)`` over all leading dims x keys of ``attn [..., S, S]``.

    Counts rather than a fraction so that a recorder can add them up over steps and
    layers and divide once at the end.
    """
    eps_list = check_epsilons(epsilons)
    c = received_attention(attn, scale, query_mask=query_mask)  # [..., S]
    threshold = exclusive_mean(c)  # computed once, shared by every ϵ
    total = c.numel()
    return {e: (total - int((c > threshold + e).sum()), total) for e in eps_list}


def non_sink_fraction(attn, epsilons=DEFAULT_EPSILONS, scale: str = AnalyzeConfig.scale, *, query_mask=None) -> dict[float, float]:
    """ϵ -> share of (leading dims x keys) that are *not* sinks (Rulli et al. Fig. 10)."""
    return {e: non / total for e, (non, total) in sink_counts(attn, epsilons, scale, query_mask=query_mask).items()}


# ---------------------------------------------------------------------------
# attention mass on given keys (One-Token Fig. 3 b, d) and value norms (eq. 14-16)
# ---------------------------------------------------------------------------


def sink_mass(attn, sink_index, *, exclude_query_index=None, keep_leading: int = 0) -> torch.Tensor:
    """Share of all attention probability that lands on the keys ``sink_index``.

    ``attn [..., S, S]``; the share is taken over queries and every leading dim except
    the first ``keep_leading`` (e.g. 1 for a stack ``[L, B, H, S, S]`` -> ``[L]``);
    0-d tensor by default. ``sink_index``: an int (negative counts from the end), a list
    of ints or a bool mask ``[S]``. ``exclude_query_index`` drops those query rows — pass
    the sink positions, whose own rows are one-hot on themselves and would inflate it.
    """
    attn = _check_attn(attn)
    _check_keep(keep_leading, attn.ndim - 2)
    size = attn.shape[-1]
    keys = _position_mask(sink_index, size, attn.device, "sink_index")  # [S]
    if exclude_query_index is not None:
        dropped = _position_mask(exclude_query_index, size, attn.device, "exclude_query_index", allow_empty=True)
        if bool(dropped.all()):
            raise ValueError("exclude_query_index drops every query row; nothing is left to measure")
        attn = attn[..., ~dropped, :]  # [..., S', S]
    on_keys = attn[..., keys].sum(dim=-1)  # [..., S']
    total = attn.sum(dim=-1)  # [..., S'], 1 per row for a softmax, summed not assumed
    return on_keys.flatten(keep_leading).sum(-1) / total.flatten(keep_leading).sum(-1)


def value_norms(values) -> torch.Tensor:
    """Per-token value-space norm ``values [..., M, S, d]`` -> ``r [..., S]``.

    eq. 15: ``||v_j^(l,m)||_2`` per head; eq. 16: ``r_j = (1/M) sum_m ||v_j^(l,m)||_2``.
    With grouped-query attention M is the number of key/value heads.
    """
    values = _as_float(values, "values")
    if values.ndim < 3 or values.shape[-3] == 0 or values.shape[-1] == 0:
        raise ValueError(f"values must have shape [..., M, S, d] with M, d >= 1, got {tuple(values.shape)}")
    return torch.linalg.vector_norm(values, dim=-1).mean(dim=-2)  # [..., M, S] -> [..., S]


# ---------------------------------------------------------------------------
# moving sinks over denoising steps (docs/method.md §6)
# ---------------------------------------------------------------------------


def largest_sink(attn, *, epsilon: float | None = None, scale: str = AnalyzeConfig.scale, query_mask=None) -> torch.Tensor:
    """Position of the key with the largest received attention, long ``[...]``.

    Ties go to the first position. With ``epsilon`` given, entries where no key is a
    sink at that ϵ are -1 (the test ``c_j > mean_{k != j} c_k + ϵ`` is monotone in c_j,
    so if any key is a sink, the argmax is one).
    """
    eps = None if epsilon is None else check_epsilon(epsilon)
    c = received_attention(attn, scale, query_mask=query_mask)  # [..., S]
    pos = c.argmax(dim=-1)  # [...]
    if eps is None:
        return pos
    is_sink = (c > exclusive_mean(c) + eps).gather(-1, pos.unsqueeze(-1)).squeeze(-1)
    return torch.where(is_sink, pos, torch.full_like(pos, -1))


def largest_sink_positions(attn_steps, *, epsilon: float | None = None, scale: str = AnalyzeConfig.scale) -> torch.Tensor:
    """Largest-sink position per step: ``[T, ..., S, S]`` or a list of T ``[..., S, S]`` -> ``[T, ...]``.

    A list is reduced step by step, so the T maps never need to be stacked.
    """
    if isinstance(attn_steps, torch.Tensor):
        if attn_steps.ndim < 3:
            raise ValueError(f"attn_steps must have shape [T, ..., S, S], got {tuple(attn_steps.shape)}")
        return largest_sink(attn_steps, epsilon=epsilon, scale=scale)
    steps = list(attn_steps)
    if not steps:
        raise ValueError("attn_steps is empty; pass one attention map per denoising step")
    return torch.stack([largest_sink(a, epsilon=epsilon, scale=scale) for a in steps])


def largest_sink_change_rate(positions, *, keep_leading: int = 0) -> torch.Tensor:
    """Share of consecutive step pairs whose largest-sink position differs; ``positions [T, ...]``.

    Reduced over pairs and all dims after T except the first ``keep_leading`` of them.
    """
    positions = _check_steps(positions, "positions")
    _check_keep(keep_leading, positions.ndim - 1)
    moved = positions[1:] != positions[:-1]  # [T-1, ...]
    return _reduce_mean(moved.movedim(0, keep_leading), keep_leading)


def _only_keys(sets: torch.Tensor, key_mask) -> torch.Tensor:
    """Sink sets restricted to the keys of ``key_mask`` (None: every key)."""
    if key_mask is None:
        return sets
    return sets & _position_mask(key_mask, sets.shape[-1], sets.device, "key_mask")


def sink_set_change_rate(sink_sets, *, keep_leading: int = 0, key_mask=None) -> torch.Tensor:
    """Share of consecutive step pairs whose sink set differs; ``sink_sets`` bool ``[T, ..., S]``.

    Reduced over pairs and all dims between T and S except the first ``keep_leading``
    (e.g. 1 for ``[T, L, H, S]`` -> per layer ``[L]``); 0-d tensor by default.
    ``key_mask`` (bool ``[S]`` or positions) keeps only those keys in the sets: pass the content
    keys to compare a model with extra sink tokens like for like with one without (the extra
    sink's key is a sink at nearly every step and would count as overlap; docs/method.md §6).
    """
    sets = _only_keys(_check_steps(sink_sets, "sink_sets", torch.bool, min_ndim=2), key_mask)
    _check_keep(keep_leading, sets.ndim - 2)
    changed = (sets[1:] != sets[:-1]).any(dim=-1)  # [T-1, ...]
    return _reduce_mean(changed.movedim(0, keep_leading), keep_leading)


def sink_set_jaccard(sink_sets, *, keep_leading: int = 0, key_mask=None) -> torch.Tensor:
    """Mean Jaccard overlap ``|A ∩ B| / |A ∪ B|`` of consecutive sink sets, bool ``[T, ..., S]``.

    Defined as 1.0 when both sets are empty (nothing moved). Reduced, and ``key_mask`` applied,
    like :func:`sink_set_change_rate`.
    """
    sets = _only_keys(_check_steps(sink_sets, "sink_sets", torch.bool, min_ndim=2), key_mask)
    _check_keep(keep_leading, sets.ndim - 2)
    a, b = sets[:-1], sets[1:]  # [T-1, ..., S]
    inter = (a & b).sum(dim=-1).float()  # [T-1, ...]
    union = (a | b).sum(dim=-1).float()
    jac = torch.where(union > 0, inter / union.clamp_min(1.0), torch.ones_like(union))
    return _reduce_mean(jac.movedim(0, keep_leading), keep_leading)


def extra_sink_share(positions, extra_positions, *, keep_leading: int = 0) -> torch.Tensor:
    """Share of entries of ``positions [...]`` (largest-sink positions, e.g. ``[L, H]`` or
    ``[T, L, H]``) that fall on one of the ``extra_positions`` (non-negative ints).

    -1 ("no sink") never counts as an extra sink.
    """
    positions = torch.as_tensor(positions)
    if positions.is_floating_point() or positions.dtype == torch.bool or positions.numel() == 0:
        raise ValueError(
            f"positions must be a non-empty integer tensor, got {positions.dtype} {tuple(positions.shape)}"
        )
    _check_keep(keep_leading, max(positions.ndim - 1, 0))
    extra = torch.as_tensor(extra_positions, device=positions.device).reshape(-1)
    if extra.numel() == 0 or extra.is_floating_point() or extra.dtype == torch.bool or bool((extra < 0).any()):
        raise ValueError(f"extra_positions must be one or more non-negative ints, got {extra_positions!r}")
    hit = torch.isin(positions, extra.to(positions.dtype))
    return _reduce_mean(hit, keep_leading)


# ---------------------------------------------------------------------------
# token types of sink positions (Rulli et al. Table 2)
# ---------------------------------------------------------------------------

# GPT-2 style byte-level BPE maps the whitespace bytes to printable stand-ins
# (256 + rank among unprintable bytes): Ġ space, Ċ newline, ĉ tab, č CR, ċ VT, Č FF.
# SentencePiece uses ▁ for a space. A decoded string never holds these in practice.
_BYTE_LEVEL_WHITESPACE = str.maketrans(
    {"Ġ": " ", "Ċ": "\n", "ĉ": "\t", "č": "\r", "ċ": "\v", "Č": "\f", "▁": " "}
)


def token_type(token_id: int, token_str: str, mask_id: int | None, *, sink_ids: Collection[int] = ()) -> str:
    """Classify one token: ``"mask"``, ``"whitespace"``, ``"punctuation"`` or ``"other"``.

    ``token_str`` should be the decoded string (``tokenizer.decode([token_id])``); raw
    byte-level BPE pieces (``Ġ``/``Ċ``/``▁``) are mapped back to whitespace too.
    Punctuation: non-empty after stripping whitespace and every character is Unicode
    punctuation or symbol (``", ."``, ``"+"``). Empty strings are ``"other"``. Tokens in
    ``sink_ids`` (e.g. the extra ``[SINK]``) are ``"sink"``, only when passed.
    """
    if mask_id is not None and int(token_id) == int(mask_id):  # an AR model has no mask token
        return "mask"
    if int(token_id) in sink_ids:
        return "sink"
    text = token_str.translate(_BYTE_LEVEL_WHITESPACE)
    if text and text.isspace():
        return "whitespace"
    core = text.strip()
    if core and all(unicodedata.category(ch)[0] in "PS" for ch in core):
        return "punctuation"
    return "other"


def count_token_types(
    token_ids: Iterable[int] | torch.Tensor,
    decode: Callable[[int], str] | Sequence[str],
    mask_id: int,
    *,
    sink_ids: Collection[int] = (),
) -> Counter:
    """Counter of :func:`token_type` over ``token_ids`` (any shape; flattened).

    ``decode``: ``id -> str`` (e.g. ``lambda i: tok.decode([i])``, called once per
    distinct id) or a list indexed by id. To count the tokens under sinks
    ``is_sink [L, H, S]`` of a sequence ``xt [S]``: ``count_token_types(xt.expand_as(is_sink)[is_sink], ...)``.
    """
    ids = token_ids.reshape(-1).tolist() if isinstance(token_ids, torch.Tensor) else list(token_ids)
    lookup = decode if callable(decode) else decode.__getitem__
    types: dict[int, str] = {}  # decode each distinct id once
    counts: Counter = Counter()
    for i in ids:
        if i not in types:
            types[i] = token_type(i, lookup(i), mask_id, sink_ids=sink_ids)
        counts[types[i]] += 1
    return counts
