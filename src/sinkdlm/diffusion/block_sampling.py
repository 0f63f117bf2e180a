"""Decoding a block model (docs/method.md §13): block by block, with an exact key/value cache of the finished
blocks, each row stopping at its end-of-text. `sampling.generate`'s plan of a block model is `plan_blocks`'s, its
loop `decode_blocks`.

A plan, then its loop:
  * `plan_blocks` fixes everything before any forward: the canvas, in which each row's prompt is left-padded by
    whole blocks, so that every row's prompt ends inside the same block and a column's block is its position's
    block in every row (a row gets the tokens it gets alone); the columns each row generates (`max_new_tokens`,
    an upper bound; default `gen_length`); the blocks and their steps (`steps` in all over the bound's blocks);
  * `decode_blocks`, its loop, prefills the prompts' whole blocks once into the static cache
    (`DiffusionLM.allocate_cache`: the sinks' columns written once, each row's rotary positions and its end sinks'
    positions), then denoises each later block with the whole-sequence rules (`steps.choose`: LLaDA's
    low-confidence / random, Dream's, Fast-dLLM's threshold), one pass over the block alone a step: its queries
    see the finished blocks' cached keys, the sinks and the block itself (a key mask per pass). One more pass over
    the block's final tokens writes its exact keys and values: attention is block-causal, so no later block
    changes them;
  * after each block, a row that has produced a stop id (`stop_token_ids`, set by `generate_text`) or reached its
    bound is finished: what follows its stop id is the first stop id, and it leaves the batch (its cache rows are
    dropped), so it is not computed further while the others go on.
Shifted logits (Fast-dLLM v2, `config.shift_logits`): column c is read from the logits of column c - 1. A block's
first column is then read from the previous block's last column, final already: the pass that writes the previous
block's keys/values (or the prefill, when a prompt ends on a block boundary) reads it, and it is committed at once
(the settings' token draw: greedy, the argmax, as Fast-dLLM v2's `batch_sample`), before `_finish`, so a stop id
read there ends its row without another block; the block's steps then read their pass shifted by one column
(`_shifted`).
Sub-blocks (`settings.block_length`, Fast-dLLM v2's `small_block_size`; default the whole block): each block is
denoised sub-block by sub-block, left to right (`plan.subs`, `_denoise`): a step's pass still runs the whole block
(its forward recomputed each step, as Fast-dLLM v2's), but only the current sub-block's masked columns are
candidates; the block's steps are split over its sub-blocks as `steps_per_block` splits a whole-sequence model's
steps over LLaDA's blocks (the remainder to the first), each sub-block's own masked count evenly over its share.
A callback hears of each finished block (what a server streams). A probe (the analysis of a block model) runs
each step over the whole canvas under the block-causal mask instead (`_probe_pass`), and no cache-writing pass
(the prefill, a block's final pass) is run or recorded; with shifted logits a block's first column is then read
by an unrecorded pass of its own (`_probe_first_column`), no denoising step of the block. With `compile` each
denoising step runs through `torch.compile` (CUDA graphs on a GPU), one graph per shape (`_compiled_pass`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable

import torch

from sinkdlm.config.checks import check_sample_settings
from sinkdlm.config.commands import SampleConfig
from sinkdlm.diffusion.remasking import (
    RowGenerators, check_rule, dream_counts, dream_timesteps, predict, resolve_rule, steps_per_block,
    transfer_schedule,
)
from sinkdlm.diffusion.steps import BlockPlan, choose, compiled_step, origin_reveal, timed_first_call
from sinkdlm.model import sink as sinklib
from sinkdlm.model.cache import KVCache
from sinkdlm.model.probe import Probe


@dataclass
class BlockOutput:
    """What `decode_blocks` returns: `sampling.GenerationOutput`'s fields."""

    sequences: torch.Tensor  # [B, P + max_new_tokens], the prompt columns as given, a stopped row's tail its stop id
    attention_mask: torch.Tensor | None  # [B, P + max_new_tokens]; None when no prompt row is padded
    prompt_length: int  # P
    steps_taken: int  # model forward passes (the prefill, the denoising steps and each block's final pass)
    compile_seconds: float | None = None  # settings.compile: the compiled step's first calls per shape (compiling)


def check_block_call(config, settings: SampleConfig, *, probe, shift_logits) -> None:
    """What `generate` refuses of a block model (and `max_new_tokens` of any other model), before any work."""
    check_sample_settings(settings, autoregressive=bool(config.causal), block_model=config.block_size is not None,
                          block_size=config.block_size)
    asked = {"a probe's key masks (sink masking while generating)": probe and probe.key_masks,
             "shift_logits": shift_logits or None}
    given = [name for name, value in asked.items() if value is not None]
    if given:
        raise ValueError(f"a block model's decoding takes no {' or '.join(given)} yet: leave "
                         f"{'it' if len(given) == 1 else 'them'} out")


@dataclass(frozen=True)
class BlockDecodePlan:
    """What a block model's generation fixes before its first forward."""

    settings: SampleConfig
    remasking: str  # the resolved rule
    schedule: str  # llada | dream
    prompt: torch.Tensor  # [B, P] left-padded ids, as `sampling.prepare_prompts` gives them
    prompt_mask: torch.Tensor | None  # [B, P] bool, True = real; None when no row is padded
    x: torch.Tensor  # [B, W] the canvas: whole blocks of left padding, the prompt, [MASK] to the end
    real: torch.Tensor  # [B, W] bool: the row's prompt and the columns it may generate (False: padding, past its bound)
    todo: torch.Tensor  # [B, W] bool: the columns it generates
    starts: torch.Tensor  # [B] long, each row's first generated column
    prefill: int  # the prompts' whole blocks: columns 0 .. prefill, run once
    blocks: tuple[BlockPlan, ...]  # the generated blocks, `steps` each (None: until done, threshold decoding)
    # the sub-blocks of every block, columns relative to it, left to right, each its share of the block's steps
    # (`settings.block_length`; default one, the whole block)
    subs: tuple[BlockPlan, ...]
    max_new: int
    shift: bool = False  # shifted logits (Fast-dLLM v2): column c is read from column c - 1 (`_first_column`)


def plan_blocks(model, prompt: torch.Tensor, prompt_mask: torch.Tensor | None, settings: SampleConfig) -> BlockDecodePlan:
    """The canvas of a block model's generation (the module docstring) and the checks that need the prompts, before
    any forward; the settings' own checks are `check_block_call`'s."""
    cfg = model.config
    bs, mask_id = cfg.block_size, cfg.mask_token_id
    schedule, remasking = resolve_rule(cfg.family, settings.schedule, settings.remasking, settings.threshold)
    check_rule(schedule, remasking, threshold=settings.threshold, temperature=settings.temperature,
               alg_temp=settings.alg_temp, top_p=settings.top_p, top_k=settings.top_k, eps=settings.eps)
    max_new = settings.gen_length if settings.max_new_tokens is None else settings.max_new_tokens
    b, p = prompt.shape
    lengths = (prompt_mask.sum(-1) if prompt_mask is not None else torch.full((b,), p)).tolist()
    if cfg.shift_logits and min(lengths) == 0:
        raise ValueError("a block model with shifted logits reads each token from the position before it: every "
                         "prompt needs at least one token")
    whole = max(n // bs for n in lengths)  # the prompt blocks every row is padded to
    tails = [n % bs for n in lengths]  # each row's prompt tokens inside the first generated block
    width = (whole + math.ceil((max(tails) + max_new) / bs)) * bs
    if max(lengths) + max_new > cfg.max_content_length or width > cfg.max_content_length:
        raise ValueError(f"a prompt of {max(lengths)} tokens + max_new_tokens={max_new}, laid out in blocks of {bs} "
                         f"({width} columns), does not fit the model's {cfg.content_length_note()} positions; "
                         "shorten the prompt or max_new_tokens")
    x = prompt.new_full((b, width), mask_id)
    real = torch.zeros(b, width, dtype=torch.bool, device=prompt.device)
    todo = torch.zeros_like(real)
    starts = torch.tensor([whole * bs + r for r in tails], device=prompt.device)
    for i, n in enumerate(lengths):
        pad = (whole - n // bs) * bs
        x[i, pad:pad + n] = prompt[i, p - n:]  # left-padded: the real tokens are the last n
        real[i, pad:starts[i] + max_new] = True
        todo[i, starts[i]:starts[i] + max_new] = True
    num_blocks = (width - whole * bs) // bs
    steps = None if settings.threshold is not None else math.ceil(settings.steps / math.ceil(max_new / bs))
    blocks = tuple(BlockPlan(j, (whole + j) * bs, (whole + j + 1) * bs, None, steps) for j in range(num_blocks))
    length = settings.block_length or bs  # checked by `check_block_call`: it divides bs, no share is 0
    shares = [None] * (bs // length) if steps is None else steps_per_block(steps, bs // length)
    subs = tuple(BlockPlan(k, k * length, (k + 1) * length, None, n,
                           dream_timesteps(n, settings.eps) if n is not None and schedule == "dream" else None)
                 for k, n in enumerate(shares))
    return BlockDecodePlan(settings, remasking, schedule, prompt, prompt_mask, x, real, todo, starts, whole * bs,
                           blocks, subs, max_new, bool(cfg.shift_logits))


@dataclass
class _Canvas:
    """The loop's state over the rows still decoding (a finished row leaves every tensor here)."""

    x: torch.Tensor  # [b, W]
    real: torch.Tensor  # [b, W]
    todo: torch.Tensor  # [b, W]
    starts: torch.Tensor  # [b]
    rows: torch.Tensor  # [b] each row's index in the batch
    kv: KVCache
    generator: RowGenerators | torch.Generator | None  # a stream per row: a finished row's leaves with it

    def keep(self, keep: torch.Tensor) -> None:
        """Only the rows `keep [b]` go on: every tensor, the cache's buffers included, loses the others."""
        idx = keep.nonzero().squeeze(-1)
        for name in ("x", "real", "todo", "starts", "rows"):
            setattr(self, name, getattr(self, name)[idx])
        if isinstance(self.generator, RowGenerators):
            self.generator = RowGenerators([self.generator.generators[i] for i in idx.tolist()])
        self.kv = self.kv.select_rows(idx)


def _visible(model, canvas: _Canvas, lo: int, hi: int, causal: bool) -> torch.Tensor:
    """The content part of `_key_mask`: `[b, 1, 1|l, W]` True where a query of columns `lo .. hi` may attend."""
    cols = torch.arange(canvas.x.shape[1], device=canvas.x.device)
    keys = canvas.real & (cols < hi)  # [b, W]
    if not causal:
        return keys[:, None, None, :]
    q, bs = cols[lo:hi, None], model.config.block_size  # [l, 1]
    return ((keys[:, None, :] & (cols // bs <= q // bs)) | (cols == q))[:, None]  # [b, 1, l, W]


def _key_mask(model, canvas: _Canvas, lo: int, hi: int, causal: bool) -> torch.Tensor:
    """The pass over columns `lo .. hi`: `[b, 1, 1|l, S]` True where a query may attend. Every query sees the
    sinks (eq. 6) and the row's real columns before `hi`; `causal` (the prefill, several blocks at once): only
    those of its own block and before, and a padding query itself (so that no softmax row is empty)."""
    cfg, mask = model.config, _visible(model, canvas, lo, hi, causal)
    n = cfg.num_sink_tokens
    return sinklib.join(mask.new_ones(*mask.shape[:3], n), mask, cfg.sink_position, dim=-1) if n else mask


def _pass(model, canvas: _Canvas, lo: int, hi: int, *, causal: bool = False, head: slice | None = None) -> torch.Tensor:
    """One forward over the columns `lo .. hi` through the cache (their keys/values written there): the logits
    `[b, l, V]`, or those of `head` (relative columns; `slice(0, 0)`: none, the pass only writes the cache)."""
    canvas.kv.start, canvas.kv.mask = lo, _key_mask(model, canvas, lo, hi, causal)
    return model(canvas.x[:, lo:hi], cache=canvas.kv, logits_index=head).logits


def _shifted(logits: torch.Tensor) -> torch.Tensor:
    """A shifted block pass's logits `[b, bs, V]` as predictions of the block's columns: column c reads c - 1's.
    The block's first column reads its own, never used: it is committed before the block (`_first_column`)."""
    return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


def _final_pass(model, canvas: _Canvas, lo: int, hi: int, plan: BlockDecodePlan, *, causal: bool = False) -> None:
    """The pass over the finished columns `lo .. hi` that writes their exact keys/values (the prefill, or a
    block's final tokens); with shifted logits its last column's logits give the next block's first column."""
    if not plan.shift:
        _pass(model, canvas, lo, hi, causal=causal, head=slice(0, 0))
        return
    logits = _pass(model, canvas, lo, hi, causal=causal, head=slice(hi - lo - 1, hi - lo))  # [b, 1, V]
    _first_column(canvas, logits, hi, plan, model.config.mask_token_id)


def _first_column(canvas: _Canvas, logits: torch.Tensor, col: int, plan: BlockDecodePlan, mask_id: int) -> None:
    """Shifted logits (Fast-dLLM v2): a block's first column `col` is read from the column before it, the
    previous block's last (or the prefill's), final already, so it is committed at once, before the block's
    steps, in the rows that generate it: the settings' token draw (greedy: the argmax, Fast-dLLM v2's rule)."""
    if col >= canvas.x.shape[1]:
        return
    rows = canvas.todo[:, col]  # [b]
    if isinstance(canvas.generator, RowGenerators):  # only the rows that, alone, draw this token
        canvas.generator.active = rows.nonzero().squeeze(-1).tolist()
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32), copy=True)
    logits[..., mask_id] = float("-inf")  # [MASK] is never a prediction
    s = plan.settings
    x0, _ = predict(logits, plan.remasking, s.temperature, s.top_p, s.top_k, canvas.generator)  # [b, 1]
    canvas.x[:, col] = torch.where(rows, x0[:, 0], canvas.x[:, col])


def _compiled_pass(model, canvas: _Canvas, blk: BlockPlan, settings: SampleConfig) -> tuple[torch.Tensor, float]:
    """A denoising step's pass (`_pass` over the block) through `torch.compile` (`steps.compiled_step`, CUDA
    graphs on a GPU): the block's first column is a tensor, so one graph serves every block of a shape (a batch
    that loses a finished row is a new shape). Returns (logits `[b, bs, V]`, seconds of a first call)."""
    x, kv = canvas.x, canvas.kv
    kv.mask = _key_mask(model, canvas, blk.lo, blk.hi, causal=False)
    kv.start = torch.tensor(blk.lo, device=x.device)
    ids = x[:, blk.lo:blk.hi]
    key = ("blocks", settings.compile_backend, x.device, tuple(ids.shape), tuple(kv.k0.shape), kv.k0.dtype)
    torch.compiler.cudagraph_mark_step_begin()  # each step is a new CUDA-graph iteration
    out, seconds = timed_first_call(*compiled_step(settings.compile_backend, x.device), key, model, ids, kv, None)
    kv.start = blk.lo
    return out.logits, seconds


def _probe_pass(model, canvas: _Canvas, blk: BlockPlan, probe: Probe | None) -> torch.Tensor:
    """The analysis's pass (docs/method.md §13): the whole canvas at once, without the cache, under the
    block-causal mask, so that the probe sees square maps over every column (a later block's queries see the
    blocks before theirs and their own [MASK]s, as the whole-sequence analysis sees every masked query). The
    block's logits are the cached pass's: its queries see the same keys at the same positions."""
    return _canvas_pass(model, canvas, slice(blk.lo, blk.hi), probe)


def _canvas_pass(model, canvas: _Canvas, head: slice, probe: Probe | None = None) -> torch.Tensor:
    """One forward over the whole canvas, without the cache, under the block-causal mask (`_visible`), its
    positions those the cached passes give each column: the logits of the columns `head` `[b, len(head), V]`."""
    cfg = model.config
    b, width = canvas.x.shape
    pos, _ = sinklib.positions(b, width, cfg.num_sink_tokens, cfg.sink_position, canvas.real, canvas.x.device)
    mask = _visible(model, canvas, 0, width, causal=True)  # [b, 1, W, W]
    return model(canvas.x, attention_mask=mask, position_ids=pos, probe=probe, logits_index=head).logits


def _probe_first_column(model, canvas: _Canvas, col: int, plan: BlockDecodePlan) -> int:
    """Shifted logits under a probe (the analysis keeps no cache, so no final pass reads the previous block's
    last column): the block starting at `col` gets its first column (`_first_column`) from a pass of its own over
    the whole canvas under the block-causal mask (`_probe_pass`'s: the column before `col` sees the same keys at
    the same positions as in the cached final pass or the prefill), the head only on that column. It stands for
    the cache-writing pass the analysis skips (the prefill, a block's final pass), which the unshifted analysis
    neither runs nor records: no denoising step of either block, so it takes no probe, is not recorded, and the
    probe's step count goes on unchanged. Returns the passes run (0: no row generates `col`)."""
    if col >= canvas.x.shape[1] or not canvas.todo[:, col].any():
        return 0
    _first_column(canvas, _canvas_pass(model, canvas, slice(col - 1, col)), col, plan, model.config.mask_token_id)
    return 1


def _counts(plan: BlockDecodePlan, blk: BlockPlan, masked: torch.Tensor) -> torch.Tensor | None:
    """Each row's commits at each step of `blk` (a block's sub-block), `[b, steps]` (LLaDA's even split of the
    row's own masked count without the steps that commit nothing in every row; Dream's chain), or None: adaptive
    (threshold, origin)."""
    if blk.steps is None or plan.remasking == "origin":
        return None
    per_row = masked.sum(-1).tolist()
    if plan.schedule == "dream":
        counts = [dream_counts(m, blk.timesteps) for m in per_row]
    else:
        counts = [transfer_schedule(m, blk.steps) for m in per_row]
        run = max((max((i + 1 for i, k in enumerate(c) if k), default=0) for c in counts), default=0)
        counts = [c[:run] for c in counts]
    return torch.tensor(counts, dtype=torch.long, device=masked.device).view(len(per_row), -1)


def _drawing(plan: BlockDecodePlan, masked: torch.Tensor, counts: torch.Tensor | None, i: int) -> torch.Tensor:
    """`[b]` the rows that run step `i` of the block alone: those with masks left (adaptive), those whose own
    even split has a commit at `i` (LLaDA's zero-commit steps are not run), or all (Dream runs every step)."""
    if counts is None:
        return masked.any(-1)
    return (counts[:, i] > 0) | (plan.schedule == "dream")


@dataclass
class _Tally:
    """What `decode_blocks` counts across its blocks."""

    passes: int = 0  # model forward passes
    steps: int = 0  # denoising steps (a probe's step index)
    compile_seconds: float = 0.0  # settings.compile: the compiled step's first calls


def _denoise(model, canvas: _Canvas, plan: BlockDecodePlan, blk: BlockPlan, sub: BlockPlan,
             probe: Callable | None, tally: _Tally) -> None:
    """Denoise the sub-block `sub` (its columns relative to `blk`'s) of the block `blk`: each step one pass over
    the whole block (the block's forward recomputed, Fast-dLLM v2's), whose logits of the sub-block's columns
    commit among its masked ones by the settings' rule (the positions outside it are no candidates)."""
    settings, mask_id = plan.settings, model.config.mask_token_id
    lo, hi = blk.lo + sub.lo, blk.lo + sub.hi
    # [b, l] every generated column of the sub-block (shifted: but the block's first, committed already)
    masked = canvas.todo[:, lo:hi] & (canvas.x[:, lo:hi] == mask_id)
    counts = _counts(plan, sub, masked)
    steps = counts.shape[1] if counts is not None else sub.steps
    local = BlockPlan(blk.index, 0, hi - lo, None, sub.steps, sub.timesteps)  # the sub-block's own columns
    for i in range(steps) if steps is not None else itertools.count():
        if counts is None and not masked.any():
            break
        if isinstance(canvas.generator, RowGenerators):  # only the rows that, alone, would run this step draw
            canvas.generator.active = _drawing(plan, masked, counts, i).nonzero().squeeze(-1).tolist()
        if probe is None and settings.compile:
            logits, seconds = _compiled_pass(model, canvas, blk, settings)
            tally.compile_seconds += seconds
        elif probe is None:
            logits = _pass(model, canvas, blk.lo, blk.hi)  # [b, bs, V]
        else:
            logits = _probe_pass(model, canvas, blk, probe(tally.steps, canvas.x, canvas.real))
        tally.steps += 1
        logits = (_shifted(logits) if plan.shift else logits)[:, sub.lo:sub.hi]  # [b, l, V]
        reveal = origin_reveal(masked, local, i, canvas.generator) if plan.remasking == "origin" else None
        x0, pick = choose(logits, masked, None if counts is None else counts[:, i], reveal, settings,
                          plan.remasking, mask_id, canvas.generator)
        canvas.x[:, lo:hi] = torch.where(pick, x0, canvas.x[:, lo:hi])
        masked &= ~pick
        tally.passes += 1


def _finish(canvas: _Canvas, hi: int, stops: torch.Tensor, out: torch.Tensor, max_new: int) -> torch.Tensor:
    """After a block ending at `hi`: each row that produced a stop id gets the first stop id after it; the
    finished rows (stopped, or at their bound) are written into `out [B, P + max_new]`. Returns `[b]` the rows
    that go on."""
    cols = torch.arange(canvas.x.shape[1], device=canvas.x.device)
    stopped = torch.zeros_like(canvas.rows, dtype=torch.bool)
    if stops.numel():
        hit = torch.isin(canvas.x, stops) & canvas.todo  # [b, W]
        stopped = hit.any(-1)
        first = torch.where(hit, cols, cols.numel()).amin(-1, keepdim=True)  # [b, 1]
        canvas.x = torch.where(canvas.todo & (cols > first), stops[0], canvas.x)
    done = stopped | ~(canvas.todo & (cols >= hi)).any(-1)
    p = out.shape[1] - max_new
    for i in done.nonzero().squeeze(-1).tolist():
        start = int(canvas.starts[i])
        out[canvas.rows[i], p:] = canvas.x[i, start:start + max_new]
    return ~done


def _report_block(on_block: Callable, canvas: _Canvas, going: torch.Tensor, out: torch.Tensor, before: torch.Tensor,
                  passes: int, blk: BlockPlan, max_new: int) -> torch.Tensor:
    """Tell `on_block` what block `blk` made final (before the finished rows leave the canvas); returns the
    columns final now."""
    p, hi = out.shape[1] - max_new, blk.hi
    x, now = out.clone(), before.clone()  # a row that left in an earlier block is final in both already
    for i, row in enumerate(canvas.rows.tolist()):
        if not going[i]:  # finished: `_finish` wrote its whole answer
            now[row, p:] = True
            continue
        start = int(canvas.starts[i])
        n = max(0, min(hi - start, max_new))
        x[row, p:p + n] = canvas.x[i, start:start + n]
        now[row, p:p + n] = True
    on_block(passes, blk.index, x, ~before, now & ~before)
    return now


@torch.no_grad()
def decode_blocks(model, plan: BlockDecodePlan, generator: RowGenerators | torch.Generator | None,
                  use_sink_cache: bool = True,
                  on_block: Callable[[int, int, torch.Tensor, torch.Tensor, torch.Tensor], None] | None = None,
                  probe: Callable[[int, torch.Tensor, torch.Tensor], Probe | None] | None = None) -> BlockOutput:
    """Generate after each of `plan.prompt`'s rows block by block (`plan_blocks`' plan, the module docstring):
    `[B, P + max_new_tokens]` in a `BlockOutput`. `generator`: a stream
    per row (`RowGenerators`, what `generate` makes of `seed`: every row then gets the tokens it gets alone,
    sampled too), one stream for the batch, or None (torch's global generator). `on_block(passes, block, x,
    masked, committed)` after each finished block: `x [B, P + N]` every row's final tokens so far (the rest
    [MASK]), `masked` the columns not final before this block, `committed` those this block made final (a
    server streams the finished prefix; the tokens are the same with or without it). `probe(step, x [b, W], real
    [b, W])` -> that denoising step's `Probe` (the analysis): every step is then `_probe_pass`, over the whole
    canvas without the cache, and every row stays in the batch to the end (a finished row commits nothing);
    only the denoising steps are probed (shifted logits: each block's first column is read by an unrecorded
    pass, `_probe_first_column`, a forward pass in `steps_taken` but no probe step)."""
    prompt, prompt_mask, settings, mask_id = plan.prompt, plan.prompt_mask, plan.settings, model.config.mask_token_id
    stops = torch.tensor(settings.stop_token_ids or (), dtype=torch.long, device=prompt.device)
    b, p = prompt.shape
    out = torch.cat([prompt, prompt.new_full((b, plan.max_new), mask_id)], dim=1)  # [B, P + N]
    model.fuse_projections()
    with model.sink_cache_mode(use_sink_cache):
        kv = model.allocate_cache(b, plan.x.shape[1], plan.real, kv_cache_dtype=settings.kv_cache_dtype)
    canvas = _Canvas(plan.x.clone(), plan.real, plan.todo, plan.starts, torch.arange(b, device=prompt.device), kv,
                     generator)
    tally = _Tally()
    final = torch.zeros_like(out, dtype=torch.bool)  # [B, P + N] the columns final so far (`on_block`)
    final[:, :p] = True
    if plan.prefill and probe is None:  # the prompts' whole blocks, once
        _final_pass(model, canvas, 0, plan.prefill, plan, causal=True)
        tally.passes += 1
    elif plan.prefill and plan.shift:  # a probe: what the prefill reads (the first block's first column),
        tally.passes += _probe_first_column(model, canvas, plan.prefill, plan)  # unrecorded
    for blk in plan.blocks:
        for sub in plan.subs:
            _denoise(model, canvas, plan, blk, sub, probe, tally)
        if plan.shift and canvas.todo[:, blk.hi:].any():  # before `_finish`: a stop id read as the next block's
            if probe is None:  # first token ends its row now
                _final_pass(model, canvas, blk.lo, blk.hi, plan)
                tally.passes += 1
            else:  # the analysis keeps no cache: the next block's first column alone, unrecorded
                tally.passes += _probe_first_column(model, canvas, blk.hi, plan)
        going = _finish(canvas, blk.hi, stops, out, plan.max_new)
        if on_block is not None:
            final = _report_block(on_block, canvas, going, out, final, tally.passes, blk, plan.max_new)
        if not going.any():
            break
        if probe is not None:  # the analysis keeps its batch whole (the recorder's rows): a finished row waits
            canvas.todo = canvas.todo & going[:, None]
            continue
        if not going.all():
            canvas.keep(going)
        if not plan.shift:  # the block's final keys/values, exact from now on
            _final_pass(model, canvas, blk.lo, blk.hi, plan)
            tally.passes += 1
    attention_mask = None
    if prompt_mask is not None:
        attention_mask = torch.cat([prompt_mask, prompt_mask.new_ones(b, plan.max_new)], dim=1)
    return BlockOutput(sequences=out, attention_mask=attention_mask, prompt_length=p, steps_taken=tally.passes,
                       compile_seconds=tally.compile_seconds if settings.compile else None)
