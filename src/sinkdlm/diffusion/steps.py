"""The pieces of `generate`'s diffusion loop (docs/method.md §2), shared by its eager and compiled paths.

  * `plan_decoding`: before the loop, every block's columns and how many positions each of its steps
    commits (the schedule alone fixes them, so the loop asks the device nothing; threshold decoding
    and Dream's `origin` are adaptive and ask once a step whether the block is done);
  * `forward_step`: one forward through the call's static KV cache (`model/cache.py`), eager or
    through `compiled_step` (one graph per generation);
  * `origin_reveal`: Dream's `origin` positions of a step, drawn before its noise;
  * `choose`: the predictions and the positions committed (`remasking.py`);
  * `commit`: written into the sequence in place, by slices (no host sync);
  * `choose_next`: an autoregressive step's next token (the same filters and Gumbel noise).
`sampling.generate` plans a call (`plan_generation`, which calls `plan_decoding`), then loops over
these pieces.

The cache (`SampleConfig.cache`): Fast-dLLM's KV caching (their `generate_with_prefix_cache` / `_dual_cache`).
Every block starts with a full forward (its logits make that step's commits) that writes each layer's content
keys/values into the call's static cache (`DiffusionLM.allocate_cache`, allocated once for prompt + gen_length
and written in place, so no shape ever changes); the other steps of the block run only the block and what
follows it ("prefix": the keys/values before the block are reused) or only the block ("dual": those before and
after it are reused). Keys are cached after rotation, at their absolute positions (which never change during a
call); each row keeps its own padding mask and positions, so a left-padded row gets what it gets alone. The
sinks' keys/values are the exact, global sink cache's, written into it once. With shift_logits the column
before the block is run too (it predicts the block's first token). Cached steps see stale keys/values outside
the block, so the tokens may differ from `cache=None` (Fast-dLLM's approximation); with one step per block they
are identical. Under a cache only the block's queries run, so a probe (whose maps and key masks cover the
whole sequence) is refused: analyse with cache=None.

`compile`: the cached steps' forward through `torch.compile` (`compile_backend`; CUDA graphs on a GPU): one graph
per generation (`compiled_step`), and the tokens are the eager cached loop's (tested with aot_eager). The first
calls' seconds (the compile time) are logged and returned as `compile_seconds`.

Logits. The LM head runs on the current block's columns (a slice: which of them are still masked would be a
question to the device), except that a callback without a cache receives every column's logits, as the
analysis expects.

Host syncs. With a fixed step count the loop never waits for the device: every step's count comes from the
schedule, planned before the loop (`plan_decoding`), and the commits write slices. Threshold decoding and
Dream's `origin` ask the device once a step whether the block is done (docs/guide.md).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch

from sinkdlm.config.commands import SampleConfig
from sinkdlm.diffusion.remasking import (
    add_gumbel_noise, dream_counts, dream_timesteps, filter_logits, predict, reveal_probability, select,
    steps_per_block, transfer_schedule, uniform,
)
from sinkdlm.model.probe import Probe


@dataclass(frozen=True)
class BlockPlan:
    """One semi-autoregressive block: its columns `lo .. hi` and how many positions each step commits."""

    index: int
    lo: int
    hi: int
    # per step, the count each row commits, known before the loop (LLaDA's even split without its
    # zero-commit steps; Dream's int(n (1 - s/t)) chain); None: adaptive (threshold, origin), the loop
    # then asks the device once a step whether the block is done
    counts: tuple[int, ...] | None
    steps: int | None  # forwards at most (None: until the block is done, threshold decoding)
    timesteps: torch.Tensor | None = None  # Dream's linspace(1, eps, steps + 1), for origin


@dataclass(frozen=True)
class DecodePlan:
    """What a generation fixes before its loop: the blocks, each step's counts, the head's columns."""

    blocks: tuple[BlockPlan, ...]
    total: int  # L = prompt + gen_length
    shift: int  # 1 with shift_logits: the logits at column c - 1 predict column c
    cache: str | None
    full_logits: bool  # the head on every column (a callback without a cache: the analysis' [B, L, V])

    def window_end(self, blk: BlockPlan) -> int:
        """Where a cached step's columns end: the sequence's end ("prefix") or the block's ("dual")."""
        return self.total if self.cache == "prefix" else blk.hi


def plan_decoding(settings: SampleConfig, schedule_name: str, remasking: str, p: int, *, shift: int,
                  full_logits: bool) -> DecodePlan:
    """The schedule of every block, before any forward (docs/method.md §2): the counts come from the
    schedule alone, since every row commits exactly its step's count under a confidence rule. The blocks
    are `settings.block_length`'s (default: one), after a prompt of `p` columns."""
    block_length = settings.gen_length if settings.block_length is None else settings.block_length
    num_blocks, steps = settings.gen_length // block_length, settings.steps
    blocks = []
    for blk, block_steps in enumerate(steps_per_block(steps or num_blocks, num_blocks)):
        lo = p + blk * block_length
        counts, timesteps = None, None
        if settings.threshold is None and schedule_name == "dream":
            timesteps = dream_timesteps(block_steps, settings.eps)
            if remasking != "origin":  # Dream runs its zero-commit steps: `block_steps` forwards
                counts = tuple(dream_counts(block_length, timesteps))
        elif settings.threshold is None:  # LLaDA's zero-commit steps come last: not run
            counts = tuple(k for k in transfer_schedule(block_length, block_steps) if k)
        bounded = settings.threshold is None
        blocks.append(BlockPlan(blk, lo, lo + block_length, counts,
                                (len(counts) if counts is not None else block_steps) if bounded else None, timesteps))
    return DecodePlan(tuple(blocks), p + num_blocks * block_length, shift, settings.cache, full_logits)


def compiled_columns(plan: DecodePlan, device) -> torch.Tensor:
    """`[blocks, 1 + n]` long, on the device in one copy per call: each block's first cached column
    (`blk.lo - shift`) and the columns its head reads in "prefix"'s fixed window. A compiled step
    takes them as tensors (so it does not specialise on a block) without a host-to-device copy per step."""
    first = plan.blocks[0].lo - plan.shift
    return torch.tensor([[b.lo - plan.shift] + list(range(b.lo - plan.shift - first, b.hi - plan.shift - first))
                         for b in plan.blocks], device=device)


@dataclass
class Canvas:
    """The diffusion loop's state: the sequence, what is still masked, and the call's static cache."""

    x: torch.Tensor  # [B, L] prompt + gen_length, [MASK] where not yet committed
    attn: torch.Tensor | None  # [B, L] bool of a padded batch, else None
    masked: torch.Tensor  # [B, L] bool, True where still masked (the prompt never is)
    kv: object | None  # the static KV cache (model/cache.py); None for the plain forward
    columns: torch.Tensor | None  # compiled: `compiled_columns`


def forward_step(model, plan: DecodePlan, blk: BlockPlan, canvas: Canvas, cached: bool, settings: SampleConfig,
                 step_probe: Probe | None):
    """One step's forward over `canvas.x`: (logits `[B, n, V]` of the block's columns (or `[B, L, V]` for a
    callback without a cache, shifted as predictions of their columns), the model output, compile seconds).

    Without a cache, or at a block's first step, every column runs (written into `canvas.kv` from column 0);
    a cached step runs the block and what follows it ("prefix") or the block alone ("dual"), from
    the column before it with shift_logits. Compiled, the shapes never depend on the block: "prefix" then
    runs a fixed window from the first block's start and writes only the columns from the block's;
    `canvas.columns` (`compiled_columns`) hold what moves with the block."""
    x, attn, kv, columns = canvas.x, canvas.attn, canvas.kv, canvas.columns
    start = blk.lo - plan.shift if cached else 0
    ids = x[:, start:(plan.window_end(blk) if cached else plan.total)]
    head = None if plan.full_logits else slice(blk.lo - plan.shift - start, blk.hi - plan.shift - start)
    seconds = 0.0
    if kv is None:  # a probe: the plain forward over the whole sequence
        out = model(ids, attention_mask=attn, logits_index=head, probe=step_probe)
    elif settings.compile and cached:  # tensors for what moves with the block: one graph for every block
        kv.start = columns[blk.index, 0]
        if plan.cache == "prefix":  # the window's first columns are computed but keep their cached keys
            ids, kv.write_from, kv.start = x[:, plan.blocks[0].lo - plan.shift:], kv.start, columns[0, 0]
            head = columns[blk.index, 1:]
        key = (settings.compile_backend, x.device, tuple(ids.shape), tuple(kv.k0.shape), kv.k0.dtype,
               kv.mask is None, plan.cache)
        torch.compiler.cudagraph_mark_step_begin()  # each step is a new CUDA-graph iteration
        out, seconds = timed_first_call(*compiled_step(settings.compile_backend, x.device), key, model, ids, kv, head)
        kv.write_from = None
    else:
        kv.start = start
        out = model(ids, logits_index=head, cache=kv)
    logits = out.logits
    if plan.full_logits and plan.shift:  # logits[:, i-1] predicts x[:, i]
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)[:, blk.lo:blk.hi]
    elif plan.full_logits:
        logits = logits[:, blk.lo:blk.hi]
    return logits, out, seconds


def origin_reveal(masked, blk: BlockPlan, i: int, generator) -> torch.Tensor:
    """Dream's `origin` at step `i` of `blk`: which of the block's masked positions it reveals `[B, n]` bool,
    each with probability 1 - s/t; drawn before the step's noise (Dream's order)."""
    u = uniform((masked.shape[0], blk.hi - blk.lo), generator, masked.device)
    return masked[:, blk.lo:blk.hi] & (u < reveal_probability(blk.timesteps, i))


def choose(logits, masked, k: int | None, reveal, settings: SampleConfig, remasking: str, mask_id: int, generator):
    """The step's predictions `x0 [B, n]` and which masked positions it commits `pick [B, n]` bool
    (remasking.py): k by confidence, or every one above the threshold, or origin's revealed ones."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32), copy=True)  # [B, n, V]; fp64 stays
    logits[..., mask_id] = float("-inf")  # [MASK] is never a prediction
    x0, conf = predict(logits, remasking, settings.temperature, settings.top_p, settings.top_k, generator)
    if reveal is not None:
        return x0, reveal
    return x0, select(conf, masked, k, settings.threshold, settings.alg_temp, generator)


def choose_next(logits, settings: SampleConfig, model_dtype, generator) -> torch.Tensor:
    """An autoregressive step's next token `[B]` from the last position's logits `[B, V]`: Dream's top-p/top-k
    filters on the tempered distribution, then argmax (temperature 0) or LLaDA's Gumbel sample."""
    temperature, top_p, top_k = settings.temperature, settings.top_p, settings.top_k
    logits = logits.to(torch.promote_types(model_dtype, torch.float32))
    if top_p is not None or top_k is not None:
        keep = filter_logits(logits / temperature if temperature else logits, top_p, top_k) > float("-inf")
        logits = logits.masked_fill(~keep, float("-inf"))
    return add_gumbel_noise(logits, temperature, generator).argmax(-1)


def commit(x, masked, blk: BlockPlan, x0, pick) -> None:
    """Write the picked predictions into `x [B, L]` and unmask them, in place (slices: no host sync)."""
    x[:, blk.lo:blk.hi] = torch.where(pick, x0, x[:, blk.lo:blk.hi])
    masked[:, blk.lo:blk.hi] &= ~pick


def timed_first_call(fn, seen: set, key: tuple, *args):
    """`fn(*args)` and its wall seconds when it is `fn`'s first call with this `key` (shapes, the
    call that compiles; 0 otherwise, `seen` holds the keys): the compile time a generation pays,
    reported rather than hidden."""
    if key in seen:
        return fn(*args), 0.0
    seen.add(key)
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


@functools.cache
def compiled_step(backend: str, device: torch.device):
    """The cached decoding step's forward through `torch.compile`, one per (backend, device), and the set
    of the call keys it has seen (`timed_first_call`).

    A cached step at batch 1 runs a block of columns through every layer: a few GFLOPs but hundreds of
    kernel launches, so on a GPU it is launch-bound; `mode="reduce-overhead"` replays the step as a
    CUDA graph (the static cache's tensors are module buffers: static inputs, updated in place). Its
    shapes never change: the cache spans the whole sequence, the start column is a tensor, and
    "prefix" runs a fixed window (`forward_step`), so one graph serves every block of a generation,
    and every later generation of the same shapes. Eager stays the path of every block's first (full)
    step, and of CPU analysis.
    """
    mode = "reduce-overhead" if device.type == "cuda" and backend == "inductor" else None

    def step(model, ids, cache, logits_index):
        return model(ids, logits_index=logits_index, cache=cache)

    return torch.compile(step, backend=backend, mode=mode), set()
