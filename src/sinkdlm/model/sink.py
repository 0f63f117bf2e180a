"""The extra sink token(s) of "One Token Is Enough" (docs/method.md §3, eq. 5-7) in one place.

Layout. With `n = num_sink_tokens`, the model's sequence is `[s_1..s_n; x_1..x_L]` (front, eq. 5)
or `[x_1..x_L; s_1..s_n]` (end, eq. 7). Front sinks take rotary positions 0..n-1 and content
n..n+L-1; end sinks follow the content (positions L..L+n-1, per row when rows are padded).

The eq. 6 rule: a sink query attends only to itself; every content query sees every key. Two facts
follow that the fast path uses:
  * a sink's attention output is exactly its own value vector, so its hidden states at every layer
    are constants of the model — they never depend on the content, the batch or the position
    (rotary phases cancel in q·k of a token with itself). Only their keys carry a position, and the
    rotation is applied when the content reads them. So in training the sinks ride in the batch as
    extra rows whose attention output is set to their value (`transformer.Block`), and at inference
    their keys/values are computed once (`DiffusionLM.sink_stream`) and kept in a `SinkCache`.
  * content queries need no mask at all: they attend to all L + n keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def join(sink: torch.Tensor, content: torch.Tensor, sink_position: str, dim: int) -> torch.Tensor:
    """Concatenate sink and content along `dim` in layout order (eq. 5 front, eq. 7 end)."""
    parts = (sink, content) if sink_position == "front" else (content, sink)
    return torch.cat(parts, dim=dim)


def split(x: torch.Tensor, num_sink_tokens: int, sink_position: str, dim: int):
    """Inverse of `join`: returns (sink, content)."""
    return sinks_of(x, num_sink_tokens, sink_position, dim), content_of(x, num_sink_tokens, sink_position, dim)


def sinks_of(x: torch.Tensor, num_sink_tokens: int, sink_position: str, dim: int) -> torch.Tensor:
    """The sink part of `x` along `dim` (a view): its first n entries (front) or last n (end)."""
    n = num_sink_tokens
    return x.narrow(dim, 0 if sink_position == "front" else x.shape[dim] - n, n)


def content_of(x: torch.Tensor, num_sink_tokens: int, sink_position: str, dim: int) -> torch.Tensor:
    """The content part of `x` along `dim` (a view): what `sinks_of` leaves."""
    n = num_sink_tokens
    return x.narrow(dim, n if sink_position == "front" else 0, x.shape[dim] - n)


def sink_indices(seq_len: int, num_sink_tokens: int, sink_position: str) -> list[int]:
    """Indices of the sink tokens in the layout of a sequence with `seq_len` content tokens."""
    n = num_sink_tokens
    return list(range(n)) if sink_position == "front" else list(range(seq_len, seq_len + n))


def positions(
    batch: int,
    seq_len: int,
    num_sink_tokens: int,
    sink_position: str,
    attention_mask: torch.Tensor | None,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary positions of the content `[B|1, L]` and of the sinks `[B|1, n]`.

    With a padding mask (True = real token), real tokens are numbered consecutively from the
    first real one, so a left-padded row gets exactly the positions it would have alone.
    """
    n = num_sink_tokens
    offset = n if sink_position == "front" else 0
    if attention_mask is None:
        content = torch.arange(offset, offset + seq_len, device=device)[None]  # [1, L]
        real = torch.full((1, 1), seq_len, device=device)
    else:
        mask = attention_mask.to(torch.long)
        content = offset + (mask.cumsum(-1) - 1).clamp(min=0)  # [B, L]
        real = mask.sum(-1, keepdim=True)  # [B, 1]
    ar = torch.arange(n, device=device)[None]  # [1, n]
    sink = ar if sink_position == "front" else real + ar
    return content, sink


@dataclass
class SinkCache:
    """The sink tokens' keys (before rotation) and values at every layer: constants of the model.

    k[l], v[l]: `[1, num_key_value_heads, n, head_dim]`. Built by `DiffusionLM.sink_cache()`,
    which rebuilds it when any parameter changed (tracked by tensor version counters).
    p_self[l] `[1, num_attention_heads, n]` (only with a virtual sink column, sink_logit/softmax_one):
    the probability each sink puts on itself; the rest, 1 - p_self, goes to the virtual column.
    """

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    key: tuple = ()
    p_self: list[torch.Tensor] | None = None
