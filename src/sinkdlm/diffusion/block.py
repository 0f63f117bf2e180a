"""Block diffusion training (BD3-LM, Arriola et al. 2025; docs/method.md §13): the x_t ⊕ x_0 pass and its loss.

A block model (`ModelConfig.block_size = b`) attends bidirectionally within blocks of b tokens and causally
across them (`model/attention.block_causal_mask`). BD3-LM trains every block at once in one pass over the
noisy and the clean sequence side by side, x_t ⊕ x_0 (2L tokens; x_0 repeats x_t's positions), under a mask
of three parts (`block_diffusion_mask`):
  * block-diagonal: each block of either half sees its own block of that half;
  * cross: block k of x_t sees the clean blocks of x_0 before k;
  * block-causal: block k of x_0 sees the clean blocks before it.
So the x_t half's logits of block k are those of a pass over the clean blocks before k and the noisy block
k, for every k at once. The loss is eq. 3-4 on the masked tokens of x_t, each weighted by 1/t of its block:
one t per block (BD3-LM) or per sequence, chosen by the noise's shape. Sequences are padded to a multiple
of the block with EOS. With sinks (eq. 6) every query of both halves sees the one set of sinks and a sink
attends only to itself: the model adds them to the content mask built here, as in every pass.
Shifted logits (`config.shift_logits`, a Fast-dLLM v2 checkpoint) are read as the decoding and the block NELBO
read them (`read_columns`, one rule for the loss and the bound): a block's first token is never masked and is
scored exactly, weight 1, at the clean previous block's last column of the x_0 half (column 0 is not scored); the
block's other masked tokens, each / t, at the x_t column before each, in their own noisy block.
Complementary masks (`TrainConfig.complementary_masks`, Fast-dLLM v2's recipe): each sequence is a second row with
the complement of its masks, so every maskable token is a target in exactly one of the two; the complement, a draw
at masking probability 1 - t, weighs its tokens 1 / max(1 - t, eps).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from sinkdlm.config.model import SINK_POSITIONS
from sinkdlm.diffusion.loss import LossOutput, to_device
from sinkdlm.diffusion.noise import MaskNoise, sample_t
from sinkdlm.model import sink as sinklib


def block_diffusion_mask(seq_len: int, block_size: int, num_sink_tokens: int = 0,
                         sink_position: str = "front") -> torch.Tensor:
    """BD3-LM's attention mask over [sinks;] x_t ⊕ x_0 [; sinks]: bool `[T, T]`, True = may attend,
    T = 2·seq_len + num_sink_tokens. Front sinks come first (before x_t), end sinks last (after x_0);
    a sink attends only to itself and every content query sees every sink (eq. 6)."""
    for name, value, least in (("seq_len", seq_len, 1), ("block_size", block_size, 1),
                               ("num_sink_tokens", num_sink_tokens, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    if sink_position not in SINK_POSITIONS:
        raise ValueError(f"sink_position must be one of {SINK_POSITIONS}, got {sink_position!r}")
    i = torch.arange(2 * seq_len)
    clean, block = i >= seq_len, (i % seq_len) // block_size  # [2L]: which half, which block
    cq, ck, bq, bk = clean[:, None], clean[None, :], block[:, None], block[None, :]
    diagonal = (cq == ck) & (bq == bk)
    cross = ~cq & ck & (bk < bq)  # x_t's block k sees x_0's blocks before k
    causal = cq & ck & (bk < bq)  # x_0 is block-causal
    content = diagonal | cross | causal  # [2L, 2L]
    n = num_sink_tokens
    mask = torch.eye(2 * seq_len + n, dtype=torch.bool)  # a sink sees only itself
    c = slice(n, None) if sink_position == "front" else slice(0, 2 * seq_len)
    s = slice(0, n) if sink_position == "front" else slice(2 * seq_len, None)
    mask[c, c] = content
    mask[c, s] = True  # every content query sees the sinks
    return mask


def xt_forward(model, xt: torch.Tensor, x0: torch.Tensor, logits_index=None, probe=None):
    """The model's output over x_t ⊕ x_0 (`[B, 2L]`, positions repeated) under `block_diffusion_mask`; its
    logits are `[B, 2L, V]` (the x_t half first), or those of `logits_index` (as `DiffusionLM.forward`).
    `probe`: the forward's `Probe` (its maps cover both halves and the sinks)."""
    cfg = getattr(model, "config", None) or model.module.config  # DDP wraps the model
    l = xt.shape[1]
    start = cfg.num_sink_tokens if cfg.sink_position == "front" else 0  # the content's first rotary position
    positions = (start + torch.arange(l, device=xt.device)).repeat(2)[None]  # [1, 2L]
    mask = block_diffusion_mask(l, cfg.block_size).to(xt.device)[None, None]  # [1, 1, 2L, 2L], the content part
    return model(torch.cat([xt, x0], dim=1), attention_mask=mask, position_ids=positions, logits_index=logits_index,
                 probe=probe)


# ----------------------------------------------------------------------------- reading the x_t ⊕ x_0 pass's maps
def xt_queries(attn: torch.Tensor, n: int, sink_position: str) -> torch.Tensor:
    """An x_t ⊕ x_0 map `[B, H, 2L+n, 2L+n]` -> `[B, H, L+n, L+n]` in a sequence's layout: the sinks' rows and the
    x_t half's query rows (each block's queries, beside the clean blocks before it), the noisy and the clean key
    column of each position added (a query sees at most one of them), the sinks' columns kept as their own. The
    block analyses read a block model's pass so (docs/method.md §15): the sink-masking ablation and the escape
    probe. Each kept row still sums to the row's mass over the real keys."""
    sink_rows, content = sinklib.split(attn, n, sink_position, dim=-2)
    rows = sinklib.join(sink_rows, content[..., :content.shape[-2] // 2, :], sink_position, dim=-2)
    sink_cols, cols = sinklib.split(rows, n, sink_position, dim=-1)
    half = cols.shape[-1] // 2
    return sinklib.join(sink_cols, cols[..., :half] + cols[..., half:], sink_position, dim=-1)


def both_copies(keep: torch.Tensor, n: int, sink_position: str) -> torch.Tensor:
    """A key mask over a sequence's layout `[B, H, L+n]` -> over x_t ⊕ x_0's `[B, H, 2L+n]` (each position's two
    keys), the inverse reading of `xt_queries`'s key columns."""
    sinks, content = sinklib.split(keep, n, sink_position, dim=-1)
    return sinklib.join(sinks, torch.cat([content, content], dim=-1), sink_position, dim=-1)


@dataclass
class BlockMaskPlan:
    """One batch's BD3-LM noise, with the scored positions as index tensors (as `loss.MaskPlan`): x_t's masked
    tokens, then (shifted logits) each block's exact first token."""

    x0: torch.Tensor  # [B, L'] padded to a multiple of the block
    xt: torch.Tensor  # [B, L']
    t: torch.Tensor  # [B, K] each block's masking probability (a per-sequence draw repeated)
    rows: torch.Tensor  # [N]
    cols: torch.Tensor  # [N]
    read: torch.Tensor  # [N] the column of x_t ⊕ x_0 whose logits score it (`read_columns`)
    target: torch.Tensor  # [N] x0 there
    weight: torch.Tensor  # [N] 1/t of the position's block (eq. 3-4); 1 for an exact first token
    norm: torch.Tensor  # [B] L', or the response length (SFT)
    num_masked: torch.Tensor  # 0-dim int64

    def to(self, device) -> "BlockMaskPlan":
        return BlockMaskPlan(**{f.name: to_device(getattr(self, f.name), device) for f in fields(self)})


def padded_length(seq_len: int, block_size: int) -> int:
    """`seq_len` rounded up to a multiple of `block_size` (the EOS padding of a training sequence)."""
    return -(-seq_len // block_size) * block_size


def plan_block_masks(x0: torch.Tensor, noise: MaskNoise | None, *, block_size: int, mask_id: int,
                     pad_id: int | None, prompt_mask: torch.Tensor | None = None, shift: bool = False) -> BlockMaskPlan:
    """q(x_t | x_0) per block: `noise.t` `[B, K]` (one t per block, BD3-LM) or `[B]` (one per sequence); drawn
    per block when not given. `noise.u`: `[B, L']` uniforms over the padded length. `shift` (shifted logits): a
    block's first column is never masked; its token, unless a prompt's or column 0, is scored exactly
    (`first_columns`, weight 1), as the block NELBO scores it. `noise.complementary` (Fast-dLLM v2's recipe,
    `TrainConfig.complementary_masks`): 2B rows, row B + b the sequence b again with the complement of its masks
    (the maskable positions with u >= t, masking probability 1 - t, `plan.t`'s rows B..), each of its masked
    tokens weighted 1 / max(1 - t, noise.eps); every maskable token is masked in exactly one row of the pair."""
    b, l = x0.shape
    if block_size > l:
        raise ValueError(f"block_size={block_size} is larger than the training sequence ({l} tokens); use a "
                         "block size <= --seq-len")
    length = padded_length(l, block_size)
    if length > l:  # padded to a multiple of the block with EOS, which is then a target like any token
        if pad_id is None:
            raise ValueError(f"a {l}-token sequence needs EOS padding to a multiple of block_size={block_size}; "
                             "give pad_id (the tokenizer's EOS)")
        x0 = torch.cat([x0, x0.new_full((b, length - l), pad_id)], dim=1)
        if prompt_mask is not None:
            prompt_mask = torch.cat([prompt_mask.bool(), prompt_mask.new_zeros(b, length - l, dtype=torch.bool)], 1)
    k = length // block_size
    noise = MaskNoise() if noise is None else noise
    t = noise.t if noise.t is not None else sample_t(
        b * k, noise.eps, noise.low_discrepancy, generator=noise.generator, device=x0.device).view(b, k)
    t = t[:, None].expand(b, k) if t.dim() == 1 else t  # [B, K]
    if tuple(t.shape) != (b, k):
        raise ValueError(f"noise.t must be [batch] or [batch, blocks] = [{b}, {k}], got {tuple(t.shape)}")
    u = noise.u if noise.u is not None else torch.rand(x0.shape, generator=noise.generator, device=x0.device)
    if tuple(u.shape) != (b, length):
        raise ValueError(f"noise.u must cover the padded sequence [{b}, {length}], got {tuple(u.shape)}")
    t_pos = t.repeat_interleave(block_size, dim=1)  # [B, L'] each position's t
    scored = torch.ones_like(x0, dtype=torch.bool) if prompt_mask is None else ~prompt_mask.bool()
    exact = torch.zeros_like(scored)  # shifted: each block's first token, scored exactly at the column before it
    if shift:
        exact[:, first_columns(0, length, block_size).to(x0.device)] = True
        exact &= scored
    starts = torch.arange(length, device=x0.device) % block_size == 0  # [L'] never masked when shifted
    maskable = scored & ~starts if shift else scored
    masked = (u < t_pos) & maskable
    rate = t_pos  # [B, L'] what a masked token's CE is divided by
    if noise.complementary:  # each sequence again, masked where it was not (docs/method.md §13)
        masked = torch.cat([masked, ~masked & maskable])
        rate = torch.cat([t_pos, (1 - t_pos).clamp(min=noise.eps)])
        x0, scored, exact = (torch.cat([a, a]) for a in (x0, scored, exact))
        t, b = torch.cat([t, 1 - t]), 2 * b  # the complement's masking probability: 1 - t
    xt = torch.where(masked, torch.full_like(x0, mask_id), x0)
    rows, cols = masked.nonzero(as_tuple=True)
    first_rows, first_cols = exact.nonzero(as_tuple=True)
    weight = 1.0 / rate[rows, cols]
    rows, read = torch.cat([rows, first_rows]), read_columns(cols, first_cols, length, shift)
    cols, weight = torch.cat([cols, first_cols]), torch.cat([weight, weight.new_ones(len(first_cols))])
    norm = scored.sum(-1).clamp(min=1) if prompt_mask is not None else torch.full((b,), length, device=x0.device)
    return BlockMaskPlan(x0=x0, xt=xt, t=t, rows=rows, cols=cols, read=read, target=x0[rows, cols], weight=weight,
                         norm=norm, num_masked=masked.sum())


def block_diffusion_loss(model, x0: torch.Tensor, noise: MaskNoise | None = None, *, mask_id: int | None = None,
                         prompt_mask: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                         shift_logits: bool | None = None, pad_id: int | None = None) -> LossOutput:
    """BD3-LM's loss on `x0 [B, L]` (the same keywords as `loss.diffusion_loss`, plus `pad_id`, the EOS that
    pads a sequence to a multiple of the block): eq. 3-4 on x_t's masked tokens, each / t of its block,
    summed and divided by L' (or the response length, SFT), averaged over the batch. `LossOutput.t`: `[B, K]`.
    `noise.complementary` (Fast-dLLM v2's recipe): the average over 2B rows, each sequence also with the complement of
    its masks, each of those tokens / max(1 - t, eps) (`plan_block_masks`); `LossOutput.t` `[2B, K]`.
    Shifted logits are the model's own (`config.shift_logits`; a `shift_logits` given must agree): the training
    counterpart of its block NELBO (`block_loglikelihood`), each block's first token scored exactly at the clean
    previous block's last column, the others masked, each at the x_t column before it (`read_columns`)."""
    config = getattr(model, "config", None) or model.module.config
    if config.block_size is None:
        raise ValueError("block_diffusion_loss needs a block model (ModelConfig.block_size); use diffusion_loss")
    shift = bool(config.shift_logits)
    if attention_mask is not None or (shift_logits is not None and bool(shift_logits) != shift):
        raise ValueError(f"a block model's loss takes no attention_mask (annealing, padding) and reads its own "
                         f"shift_logits ({shift}): its attention is block-causal by construction")
    plan = plan_block_masks(x0, noise, block_size=config.block_size,
                            mask_id=config.mask_token_id if mask_id is None else mask_id,
                            pad_id=pad_id, prompt_mask=prompt_mask, shift=shift)
    device = next((p.device for p in model.parameters()), x0.device)
    plan = plan.to(device) if device != x0.device else plan
    logits = xt_forward(model, plan.xt, plan.x0, logits_index=(plan.rows, plan.read)).logits  # [N, V]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    ce = F.cross_entropy(logits, plan.target, reduction="none") * plan.weight  # [N]
    per_seq = torch.zeros(plan.x0.shape[0], dtype=ce.dtype, device=ce.device).index_add_(0, plan.rows, ce)
    return LossOutput(loss=(per_seq / plan.norm).mean(), num_masked=plan.num_masked, t=plan.t)


# ----------------------------------------------------------------------------- the block NELBO (likelihood)
def block_draws(seq: torch.Tensor, prefix_length: int, block_size: int, samples: int, generator=None,
                shift: bool = False):
    """`samples` draws of LLaDA's masked-count form of eq. 3-4, block by block, over the continuation
    `seq[prefix_length:]` (`seq [L]`): in each block with M scored positions, l ~ U{1..M} of them masked (a
    uniform l-subset), each weighted M / l. Returns (masked `[S, L]` bool, weight `[S, L]` float64). `shift`
    (shifted logits): a block's first column is never masked, it is scored exactly (`first_columns`)."""
    length = len(seq)
    blocks = torch.arange(length) // block_size  # [L]
    scored = torch.arange(length) >= prefix_length
    if shift:
        scored &= torch.arange(length) % block_size != 0
    num = torch.zeros(blocks[-1] + 1, dtype=torch.long).index_add_(0, blocks, scored.long())  # [K] M per block
    count = (torch.rand(samples, len(num), generator=generator) * num).long() + 1  # [S, K] l in 1..M
    # one sort for every block: block k's keys lie in [4k, 4k + 3), a scored position's before an unscored one's
    keys = torch.rand(samples, length, generator=generator).masked_fill(~scored, 2.0) + 4 * blocks  # [S, L]
    rank = keys.argsort(dim=-1).argsort(dim=-1) - blocks * block_size  # each position's rank within its block
    masked = scored & (rank < count[:, blocks])
    weight = (num.double() / count.double())[:, blocks] * masked  # [S, L]
    return masked, weight


def first_columns(prefix_length: int, length: int, block_size: int) -> torch.Tensor:
    """Shifted logits (Fast-dLLM v2): the continuation's block-start columns `[F]`, each read from the column before
    it, the clean previous block's last, and committed at once by the decoding: scored exactly, not masked."""
    cols = torch.arange(max(prefix_length, 1), length)
    return cols[cols % block_size == 0]


def read_columns(cols: torch.Tensor, first: torch.Tensor, length: int, shift: bool) -> torch.Tensor:
    """Where a block model's targets are read in the x_t ⊕ x_0 pass over `length`-token sequences, the one rule of
    its loss and its block NELBO: `[N + F]` columns, a masked token at column c (`cols [N]`) at x_t's column c, or
    c - 1 with `shift` (shifted logits: its own noisy block's column before it, c never starting a block), then each
    block's first token (`first [F]`, shifted only, `first_columns`) at x_0's column L + c - 1, the clean previous
    block's last."""
    return torch.cat([cols - int(shift), length + first - 1])


def block_nelbo_terms(model, xt: torch.Tensor, x0: torch.Tensor, masked: torch.Tensor, weight: torch.Tensor,
                      probe=None, first: torch.Tensor | None = None) -> torch.Tensor:
    """Each draw's block NELBO term `Σ_i 1[masked_i] weight_i CE_i`, `[S]` float64 on the CPU, from one x_t ⊕ x_0
    pass over `xt, x0 [S, L]` (on the model's device); `masked, weight [S, L]` (CPU) are `block_draws`'s. `probe`:
    the pass's `Probe` (the sink-masking ablation's maps and key masks, `analysis/ablation.py`). `first`: shifted
    logits (`first_columns`): each masked token is read at the x_t column before it (its own block's), and each
    column of `first` at the x_0 half's column before it, whose exact cross-entropy is added to every draw: read
    from draw 0's pass (the x_0 half is the same in every draw), or from each draw's own pass when the probe masks
    keys (the sink-masking ablation's masks differ from draw to draw)."""
    rows, cols = masked.nonzero(as_tuple=True)
    shift, length = first is not None, xt.shape[1]
    first = torch.zeros(0, dtype=torch.long) if first is None else first
    per_draw = probe is not None and probe.key_masks is not None
    if per_draw:  # each draw's exact terms under its own key masks
        first_rows, first = torch.arange(len(xt)).repeat_interleave(len(first)), first.repeat(len(xt))
    else:  # the exact terms: from draw 0's pass
        first_rows = torch.zeros_like(first)
    read_rows = torch.cat([rows, first_rows]).to(x0.device)
    read_cols = read_columns(cols, first, length, shift).to(x0.device)
    targets = torch.cat([x0[rows.to(x0.device), cols.to(x0.device)], x0[first_rows.to(x0.device), first.to(x0.device)]])
    logits = xt_forward(model, xt, x0, logits_index=(read_rows, read_cols), probe=probe).logits  # [N + F, V]
    ce = F.cross_entropy(logits.double(), targets, reduction="none").cpu()  # [N + F]
    n = len(rows)
    values = torch.zeros(len(xt), dtype=torch.float64).index_add_(0, rows, ce[:n] * weight[rows, cols])
    if per_draw:
        return values.index_add_(0, first_rows, ce[n:])
    return values + ce[n:].sum()


def block_request_draws(config, seq: torch.Tensor, prefix_length: int, samples: int, generator=None):
    """One request's block NELBO draws (`seq [L]`, the continuation after `prefix_length`), as `block_loglikelihood`
    and the sink-masking ablation score them with `block_nelbo_terms`: (xt, x0 `[S, L]`, masked, weight `[S, L]`,
    first `[F]` | None), on the CPU; `first` (shifted logits) are the columns scored exactly (`first_columns`)."""
    shift = bool(config.shift_logits)
    masked, weight = block_draws(seq, prefix_length, config.block_size, samples, generator, shift=shift)
    x0 = seq[None].expand(samples, -1)
    xt = x0.masked_fill(masked, config.mask_token_id)
    first = first_columns(prefix_length, len(seq), config.block_size) if shift else None
    return xt, x0, masked, weight, first


@torch.no_grad()
def block_loglikelihood(model, prefixes: list[torch.Tensor], continuations: list[torch.Tensor], samples: int,
                        generators: list) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(continuation | prefix) of a block model, the block NELBO (docs/method.md §13): the sum over blocks of
    each block's eq. 3-4 bound given the clean blocks before it, all blocks in one x_t ⊕ x_0 pass per draw.
    Shifted logits (Fast-dLLM v2): a block's first token is scored exactly at the clean previous block's last column
    (its decoding commits it at once from there), the block's other masked tokens at the x_t column before each.
    Returns (log-probability bound `[N]`, its Monte-Carlo standard error `[N]`), float64, per request."""
    config = model.config
    logprob, stderr = [], []
    for pre, cont, generator in zip(prefixes, continuations, generators):
        xt, x0, masked, weight, first = block_request_draws(config, torch.cat([pre, cont]), len(pre), samples,
                                                            generator)
        values = block_nelbo_terms(model, xt.to(model.device), x0.to(model.device), masked, weight, first=first)  # [S]
        logprob.append(-values.mean())
        stderr.append(values.std() / samples**0.5 if samples > 1 else torch.tensor(float("nan"), dtype=torch.float64))
    return torch.stack(logprob), torch.stack(stderr)
