"""The reverse process (docs/method.md §2): LLaDA's and Dream's samplers, semi-autoregressive blocks,
Fast-dLLM threshold decoding and a per-step callback.

Start from `prompt + [MASK] * gen_length`; at every step predict the masked positions of the
current block and commit some of them (the rules are in `diffusion/remasking.py`):
  * `remasking="low_confidence"`: the k masked positions whose predicted token has the highest
    probability (LLaDA); `"random"`: k random masked positions; Dream's `maskgit_plus`,
    `topk_margin`, `entropy` (ranked by their confidence) and `origin` (each mask revealed with
    probability 1 - s/t);
  * k follows the schedule: LLaDA's spreads a block's masked count evenly over its steps
    (`transfer_schedule`), Dream's commits int(n (1 - s/t)) at the step t -> s of
    linspace(1, eps, steps + 1); with `threshold`, every masked position whose confidence exceeds
    it, at least one (Fast-dLLM), and the step count adapts;
  * `temperature > 0` samples the prediction with LLaDA's float64 Gumbel trick
    (`argmax exp(logits) / (-log u)^T`, `add_gumbel_noise`), after Dream's top-p/top-k filters.

What differs from LLaDA's loop, with identical tokens at temperature 0 (tests/test_sampling.py):
  * probabilities, noise and selection are computed for the current block only (the later
    blocks' predictions are never used), and top-k is batched instead of a loop over rows;
  * every pass reads and writes one static key/value cache (`model/cache.py`), also without
    `cache=` (each step then writes every column): the sinks' keys and the rotary tables are
    computed once per call, not per step;
  * "masked" is tracked as a boolean state, so a prompt that contains the `[MASK]` id is never
    changed; the `[MASK]` id is never predicted, so no mask is left at the end;
  * the even split's steps that would commit nothing (steps per block > block_length) are not run
    (Dream's zero-commit steps are, as Dream runs them); both are known from the schedule alone;
  * the sinks' keys/values come from the model's sink cache (`use_sink_cache`, docs/method.md §3).
Mixed-length prompts are left-padded with an attention mask; padding is invisible to the model
and rotary positions restart at each row's first real token, so every row gets the tokens it
gets alone (temperature 0).

Callback. `callback(StepState)` after each step; `key_masks_fn(step, previous_state)` before it
(sink-masking ablation, Rulli et al. Table 1). Only the current step's tensors are alive (plus the
previous state when `key_masks_fn` is given), so memory stays flat across steps.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from sinkdlm.config.commands import SampleConfig
from sinkdlm.config.fields import with_overrides
from sinkdlm.diffusion.remasking import add_gumbel_noise, check_rule, filter_logits, resolve_rule, reveal_probability
from sinkdlm.diffusion.steps import choose, commit, compiled_columns, forward_step, plan_decoding
from sinkdlm.model.compile import check_compile
from sinkdlm.model.probe import Probe
from sinkdlm.config.checks import check_sample_settings

log = logging.getLogger(__name__)


@dataclass
class StepState:
    """What one denoising step saw and did. Shapes: B rows, L = prompt_length + gen_length."""

    step: int  # global step index (one model forward each), from 0
    block: int  # index of the block being decoded
    x: torch.Tensor  # [B, L] tokens after this step's commits
    masked: torch.Tensor  # [B, L] bool, masked *before* this step's commits (the model input had [MASK] here)
    committed: torch.Tensor  # [B, L] bool, positions committed this step
    # [B, K, V] the logits the step computed, row j predicting column `logit_columns[j]` (shifted
    # when shift_logits): all L columns when a callback is given without a cache, else the block's.
    logits: torch.Tensor | None = None
    attentions: tuple[torch.Tensor, ...] | None = None  # per layer [B, H, S, S], S = L + sinks, layout order
    values: tuple[torch.Tensor, ...] | None = None  # per layer [B, KVH, S, hd]
    attention_mask: torch.Tensor | None = None  # [B, L_in] of the model input, True = real; None when unpadded
    prompt_length: int = 0  # generation starts at this column
    mask_id: int = 0
    logit_columns: torch.Tensor | None = None  # [K] long, the columns of x that `logits` predicts
    # sink_logit / softmax_one models: per layer [B, H, S], each query row's mass on the virtual column
    virtual_sink_attentions: tuple[torch.Tensor, ...] | None = None
    # Autoregressive models: the model saw only the first `input_length` columns of x (the step
    # appended column `input_length`); None for a DLM, whose input spans every column.
    input_length: int | None = None

    @property
    def input_ids(self) -> torch.Tensor:
        """`[B, L_in]` the tokens the model saw at this step (x before the commits)."""
        x = self.x.masked_fill(self.masked, self.mask_id) if self.mask_id is not None else self.x
        return x if self.input_length is None else x[:, :self.input_length]


@dataclass
class GenerationOutput:
    sequences: torch.Tensor  # [B, P + gen_length], prompt columns unchanged
    attention_mask: torch.Tensor | None  # [B, P + gen_length]; None when no row is padded
    prompt_length: int  # P, the padded prompt width
    steps_taken: int  # model forward passes
    # compile=True: wall seconds of the compiled step's first calls per shape (its compile time; 0: reused)
    compile_seconds: float | None = None


StepCallback = Callable[[StepState], None]
# `StepProbe.hook(step, input_ids [B, L_in], attention_mask | None)` -> a per-layer hook for that
# step's forward (`Probe.hook`, model/probe.py): one layer's maps alive at a time.
AttentionHookFn = Callable[[int, torch.Tensor, "torch.Tensor | None"], Callable]
KeyMasksFn = Callable[[int, "StepState | None"], "list[torch.Tensor | None] | None"]


@dataclass(frozen=True)
class StepProbe:
    """Everything an analysis asks of a generation, as the one object it hands to `generate(probe=)`.

    At every step `generate` builds that forward's `Probe` (model/probe.py) from it:
    key_masks  `fn(step, previous StepState | None)` -> per-layer key masks (`Probe.key_masks`) or
               None (the sink-masking ablation, Rulli et al. Table 1).
    hook       `fn(step, input_ids [B, L_in], attention_mask | None)` -> that step's per-layer hook
               (`Probe.hook`): one layer's maps alive at a time.
    attentions / values: put the per-layer attention probabilities / values into each StepState (for a
               callback, or a key_masks fn reading the previous step). Attentions force the eager
               backend, whose rounding differs from sdpa's: near-tied confidences may commit differently.
    Combine two with `a | b` (a masker's key masks with a recorder's hook).
    """

    key_masks: KeyMasksFn | None = None
    hook: AttentionHookFn | None = None
    attentions: bool = False
    values: bool = False

    def forward_probe(self, key_masks, hook) -> Probe | None:
        """One step's `Probe` (this step's key masks and hook); None, the fast path, when it asks nothing."""
        if key_masks is None and hook is None and not self.attentions and not self.values:
            return None
        return Probe(key_masks=key_masks, attentions=self.attentions, values=self.values, hook=hook)

    def __or__(self, other: "StepProbe") -> "StepProbe":
        for name in ("key_masks", "hook"):
            if getattr(self, name) is not None and getattr(other, name) is not None:
                raise ValueError(f"both probes set {name}; combine them into one function first")
        return StepProbe(key_masks=self.key_masks or other.key_masks, hook=self.hook or other.hook,
                         attentions=self.attentions or other.attentions, values=self.values or other.values)


# ----------------------------------------------------------------------------- input checks
def _is_int_sequence(x) -> bool:
    return isinstance(x, Sequence) and not isinstance(x, (str, bytes)) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in x
    )


def prepare_prompts(
    prompt_ids, attention_mask=None, pad_token_id: int = 0, device=None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Prompts -> (`[B, P]` ids, `[B, P]` bool attention mask or None when nothing is padded).

    Accepts a `[P]` or `[B, P]` integer tensor (with an optional left-padding `attention_mask`),
    a list of ints (one prompt) or a list of 1-D prompts of any lengths (left-padded here).
    """
    if isinstance(prompt_ids, torch.Tensor):
        ids = prompt_ids
        if ids.dim() == 1:
            ids = ids[None]
            if attention_mask is not None:
                attention_mask = torch.as_tensor(attention_mask)[None]
    elif _is_int_sequence(prompt_ids):
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
    elif isinstance(prompt_ids, Sequence) and not isinstance(prompt_ids, (str, bytes)):
        if attention_mask is not None:
            raise ValueError("attention_mask is only accepted with a [batch, length] tensor prompt, not a list")
        rows = []
        for r in prompt_ids:
            row = torch.as_tensor(r)
            if row.dim() != 1:
                raise ValueError(f"each prompt in a list must be 1-D token ids, got shape {tuple(row.shape)}")
            rows.append(row)
        if not rows:
            raise ValueError("prompt_ids is an empty list; pass at least one prompt")
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros(len(rows), width, dtype=torch.bool)
        for i, r in enumerate(rows):
            if len(r):
                ids[i, width - len(r):] = r
                attention_mask[i, width - len(r):] = True
    else:
        raise ValueError(f"prompt_ids must be a tensor or a list of token ids, got {type(prompt_ids).__name__}")
    if ids.dim() != 2:
        raise ValueError(f"prompt_ids must be [length] or [batch, length], got shape {tuple(ids.shape)}")
    if ids.is_floating_point() or ids.dtype == torch.bool or ids.is_complex():
        raise ValueError(f"prompt_ids must hold integer token ids, got dtype {ids.dtype}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(
            f"empty prompt (shape {tuple(ids.shape)}): give at least one token per row; "
            "for unconditional generation use a BOS/EOS token as the prompt"
        )
    ids = ids.long()
    if attention_mask is not None:
        am = torch.as_tensor(attention_mask).bool()
        if am.shape != ids.shape:
            raise ValueError(f"attention_mask shape {tuple(am.shape)} must equal prompt_ids shape {tuple(ids.shape)}")
        if not am.any(-1).all():
            raise ValueError("a prompt row has no real token (empty prompt); give at least one token per row")
        if (am[:, 1:].long() < am[:, :-1].long()).any():
            raise ValueError("prompts must be left-padded: attention_mask must be False..False True..True per row")
        attention_mask = None if am.all() else am
    if device is not None:
        ids = ids.to(device)
        attention_mask = attention_mask.to(device) if attention_mask is not None else None
    return ids, attention_mask


# ----------------------------------------------------------------------------- the sampler
@torch.no_grad()
def generate(
    model,
    prompt_ids,
    config: SampleConfig | None = None,
    *,
    probe: StepProbe | None = None,
    callback: StepCallback | None = None,
    generator: torch.Generator | None = None,
    attention_mask: torch.Tensor | None = None,
    pad_token_id: int | None = None,
    use_sink_cache: bool = True,
    shift_logits: bool | None = None,
    return_dict: bool = False,
    **overrides,
) -> torch.Tensor | GenerationOutput:
    """Sample `gen_length` tokens after each prompt (docs/method.md §2). Returns `[B, P + gen_length]` ids.

    The decoding settings are a `SampleConfig` (`sinkdlm.config`, the one home of their defaults),
    given whole as `config`, as keyword overrides of its fields (`generate(model, ids, gen_length=32,
    steps=32)`), or both (the overrides replace the config's values), as transformers'
    `generate(generation_config=..., **kwargs)`. An unknown keyword is a TypeError naming the fields.

    prompt_ids     `[P]`/`[B, P]` tensor, a list of ints, or a list of prompts of different lengths
                   (left-padded with `pad_token_id`, default the mask id; see `attention_mask`
                   of the `return_dict` output).
    gen_length     tokens to generate (required).
    steps          denoising steps in all, split evenly over the blocks (>= number of blocks);
                   not used with `threshold` (then the step count adapts, at most gen_length).
    block_length   semi-autoregressive blocks (default: one block); each is finished before the
                   next may commit. Must divide gen_length.
    temperature    0 = argmax; > 0 samples with float64 Gumbel noise (LLaDA).
    remasking      "low_confidence" | "random" (LLaDA) | "maskgit_plus" | "topk_margin" | "entropy" |
                   "origin" (Dream's alg); None: the model family's (`ModelConfig.family`).
    schedule       "llada" (even split per block) | "dream" (Dream's timesteps, `eps`); None: the family's.
    alg_temp, top_p, top_k: Dream's sampling controls (`sinkdlm.diffusion.remasking`).
    threshold      Fast-dLLM parallel decoding: commit every masked position of the block whose
                   confidence exceeds it, at least one per step (low_confidence / maskgit_plus).
    generator/seed the randomness (Gumbel noise, random remasking): a `generator`, else one seeded
                   with `seed` (SampleConfig's default 0; None: torch's global generator); a fixed
                   seed repeats the output. Passing both `generator` and a `seed=` keyword is refused.
    callback       `callback(StepState)` after every step.
    probe          a `StepProbe`: what the analysis asks of every step (key masks, a per-layer hook,
                   maps and values in the StepState); None is the fast path.
    use_sink_cache reuse the sinks' constant keys/values (docs/method.md §3); False recomputes them per step
                   (with a cache: once per call, into the static KV cache).
    shift_logits   position i-1 predicts token i (AR-initialised head, docs/method.md §5); None (default):
                   the model's own `config.shift_logits` (True for Dream), a bool overrides it.
    return_dict    return a `GenerationOutput` (sequences, attention_mask, steps_taken).
    cache          Fast-dLLM KV caching (their `generate_with_prefix_cache` / `_dual_cache`):
                   every block starts with a full forward (its logits make that step's commits)
                   that writes each layer's content keys/values into the call's static cache
                   (`DiffusionLM.allocate_cache`, allocated once for prompt + gen_length and written
                   in place, so no shape ever changes); the other steps of the block run
                   only the block and what follows it ("prefix": the keys/values before the block
                   are reused) or only the block ("dual": those before and after it are reused).
                   Keys are cached after rotation, at their absolute positions (which never change
                   during a call); each row keeps its own padding mask and positions, so a
                   left-padded row gets what it gets alone. The sinks' keys/values are the exact,
                   global sink cache's, written into it once. With shift_logits the column before the block is run too
                   (it predicts the block's first token). Cached steps see stale keys/values
                   outside the block, so the tokens may differ from `cache=None` (Fast-dLLM's
                   approximation); with one step per block they are identical. Under a cache only
                   the block's queries run, so a `probe` (whose maps and key masks cover the whole
                   sequence) is refused: analyse with cache=None.
    compile        run the cached steps' forward through `torch.compile` (`compile_backend`; CUDA graphs
                   on a GPU): one graph per generation (`steps.compiled_step`), and the tokens are
                   the eager cached loop's (tested with aot_eager). The first calls' seconds (the
                   compile time) are logged and returned as `compile_seconds`.

    Autoregressive models (`config.causal`, a Qwen2/LLaMA checkpoint opened as is): greedy (or, with
    temperature, sampled) left-to-right decoding, one token per step and `gen_length` steps; `steps`,
    `block_length` and `remasking` do not apply; callbacks, hooks and key masks see the causal maps
    of each step's input (the prompt and the tokens so far), docs/method.md §10.

    Logits. The LM head runs on the current block's columns (a slice: which of them are still masked
    would be a question to the device), except that a callback without a cache receives every
    column's logits, as the analysis expects.

    Host syncs. With a fixed step count the loop never waits for the device: every step's count comes
    from the schedule, planned before the loop (`plan_decoding`), and the commits write slices. Threshold
    decoding and Dream's `origin` ask the device once a step whether the block is done (docs/guide.md).
    The loop's pieces, shared by the eager and compiled paths: `plan_decoding` (the schedule, before the
    loop), `forward_step` (one forward), `choose` (predictions and picks) and `commit` (`diffusion/steps.py`).
    """
    if generator is not None and "seed" in overrides:
        raise ValueError("pass either generator or seed, not both")
    settings = with_overrides(SampleConfig, config, overrides, "generate")
    gen_length, steps, block_length = settings.gen_length, settings.steps, settings.block_length
    temperature, remasking, threshold, cache = settings.temperature, settings.remasking, settings.threshold, settings.cache
    compiled = settings.compile
    cfg = model.config
    mask_id = cfg.mask_token_id
    if probe is not None and not isinstance(probe, StepProbe):
        raise ValueError(f"probe must be a StepProbe (sinkdlm.diffusion.sampling), got {type(probe).__name__}")
    probe = probe or StepProbe()
    key_masks_fn, attention_hook_fn = probe.key_masks, probe.hook
    # ---- every user error before any work: the settings' own checks have one home (config/checks.py), which
    # the command line runs before any weight is read; an AR model refuses every diffusion-only setting given
    check_sample_settings(settings, autoregressive=bool(cfg.causal))
    block_length = gen_length if block_length is None else block_length
    num_blocks = gen_length // block_length
    schedule_name, remasking = resolve_rule(cfg.family, settings.schedule, remasking, threshold)
    alg_temp, top_p, top_k = settings.alg_temp, settings.top_p, settings.top_k
    check_rule(schedule_name, remasking, threshold=threshold, temperature=temperature, alg_temp=alg_temp,
               top_p=top_p, top_k=top_k, eps=settings.eps)
    if cache is not None:
        if probe != StepProbe():
            raise ValueError(
                f"cache={cache!r} runs only the current block's queries, but a probe's maps, values, hook and "
                "key masks cover the whole sequence at every step; use cache=None for attention analysis and "
                "sink ablation"
            )
    device = model.device
    if compiled:
        check_compile(settings.compile_backend, device)
    prompt, prompt_mask = prepare_prompts(
        prompt_ids, attention_mask, (mask_id or 0) if pad_token_id is None else pad_token_id, device
    )
    b, p = prompt.shape
    total = p + gen_length
    if total > cfg.max_content_length:
        raise ValueError(
            f"prompt ({p} tokens) + gen_length ({gen_length}) = {total} tokens is longer than the "
            f"model's {cfg.content_length_note()} positions; shorten the prompt or gen_length"
        )
    if prompt_mask is None:
        real = prompt
    else:
        real = prompt[prompt_mask]
    if real.numel() and (real.min() < 0 or real.max() >= cfg.vocab_size):
        raise ValueError(f"prompt token ids must lie in [0, vocab_size={cfg.vocab_size})")
    if generator is None and settings.seed is not None:  # seed=None: torch's global generator, as before
        generator = torch.Generator(device=device).manual_seed(settings.seed)
    shift_logits = cfg.shift_logits if shift_logits is None else bool(shift_logits)
    if cfg.causal:
        with model.sink_cache_mode(use_sink_cache):
            return _generate_autoregressive(model, prompt, prompt_mask, settings, generator, callback, probe, return_dict)

    plan = plan_decoding(settings, schedule_name, remasking, p, steps, num_blocks, block_length,
                         shift=1 if shift_logits else 0, full_logits=callback is not None and cache is None)
    # ---- state: the sequence, what is still masked, and (without a probe) the generation's static cache
    x = torch.cat([prompt, prompt.new_full((b, gen_length), mask_id)], dim=1)  # [B, L]
    attn = None
    if prompt_mask is not None:
        attn = torch.cat([prompt_mask, prompt_mask.new_ones(b, gen_length)], dim=1)  # [B, L]
    masked = torch.zeros(b, total, dtype=torch.bool, device=device)
    masked[:, p:] = True
    model.fuse_projections()  # one matmul for q/k/v and one for gate/up per layer (the same parameters)
    # One static KV cache for every pass of the call, except where the plain forward is asked for: a
    # probe's maps and key masks, and use_sink_cache=False without a cache (the sinks at every step).
    kv = None
    if probe == StepProbe() and (use_sink_cache or cache is not None):
        with model.sink_cache_mode(use_sink_cache):
            kv = model.allocate_cache(b, total, attn)
    columns = compiled_columns(plan, device) if compiled else None
    want_state = callback is not None or probe.key_masks is not None
    step, prev_state, compile_seconds = 0, None, 0.0

    for blk in plan.blocks:
        for i in range(blk.steps) if blk.steps is not None else itertools.count():
            k = blk.counts[i] if blk.counts is not None else None
            if blk.counts is None and not masked[:, blk.lo:blk.hi].any():  # adaptive: one host sync a step
                break
            reveal = None  # origin's revealed positions, drawn before the step's noise (Dream's order)
            if remasking == "origin":
                u = torch.rand((b, blk.hi - blk.lo), generator=generator, device=device, dtype=torch.float64)
                reveal = masked[:, blk.lo:blk.hi] & (u < reveal_probability(blk.timesteps, i))  # [B, n]
            key_masks = probe.key_masks(step, prev_state) if probe.key_masks is not None else None
            hook = probe.hook(step, x.masked_fill(masked, mask_id), attn) if probe.hook else None
            cached = cache is not None and i > 0  # a block's first step is a full forward
            with model.sink_cache_mode(use_sink_cache):
                logits, out, seconds = forward_step(model, plan, blk, x, attn, kv, cached, settings,
                                                    probe.forward_probe(key_masks, hook), columns)
            compile_seconds += seconds
            x0, pick = choose(logits, masked[:, blk.lo:blk.hi], k, reveal, settings, remasking, mask_id,
                              model.dtype, generator)
            masked_before = masked.clone() if want_state else None
            commit(x, masked, blk, x0, pick)
            if want_state:
                committed = torch.zeros_like(masked)
                committed[:, blk.lo:blk.hi] = pick
                state = StepState(
                    step=step, block=blk.index, x=x.clone(), masked=masked_before, committed=committed,
                    # a CUDA graph's output is overwritten by its next replay: the state keeps a copy
                    logits=out.logits.clone() if compiled else out.logits, attentions=out.attentions,
                    values=out.values, attention_mask=attn, prompt_length=p, mask_id=mask_id,
                    logit_columns=torch.arange(total, device=device) if plan.full_logits else
                    torch.arange(blk.lo, blk.hi, device=device),
                    virtual_sink_attentions=out.virtual_sink_attentions,
                )
                if callback is not None:
                    callback(state)
                prev_state = state if probe.key_masks is not None else None
                del state
            del out, logits, x0, pick
            step += 1

    if compile_seconds:
        log.info("generate(compile=True): %.1f s in first calls of the compiled step (compiling)", compile_seconds)
    if return_dict:
        return GenerationOutput(sequences=x, attention_mask=attn, prompt_length=p, steps_taken=step,
                                compile_seconds=compile_seconds if compiled else None)
    return x


def _generate_autoregressive(model, prompt, prompt_mask, settings: SampleConfig, generator, callback,
                             probe: StepProbe, return_dict):
    """Left-to-right decoding of a causal model, one token per step (no KV cache: every step runs the
    whole prefix, so the analysis sees each step's complete causal maps). `settings` is the call's
    resolved `SampleConfig` (gen_length, temperature, top_p, top_k, stop_token_ids); the caller sets the
    sink-cache mode. With `stop_token_ids`, decoding stops once every row has produced one of them and the
    remaining positions get the first, so the output keeps its `[B, P + gen_length]` shape."""
    gen_length, temperature, top_p, top_k = settings.gen_length, settings.temperature, settings.top_p, settings.top_k
    stops = torch.tensor(settings.stop_token_ids or (), dtype=torch.long, device=prompt.device)
    ended = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)  # [B]
    b, p = prompt.shape
    x, attn = prompt, prompt_mask
    work_dtype = torch.promote_types(model.dtype, torch.float32)
    key_masks_fn = probe.key_masks
    want_state = callback is not None or key_masks_fn is not None
    prev_state = None
    for step in range(gen_length):
        width = x.shape[1]
        key_masks = key_masks_fn(step, prev_state) if key_masks_fn is not None else None
        if key_masks is not None:  # masks of step t-1 cover one key fewer: the new token is never masked
            key_masks = [None if m is None else torch.cat([m, m.new_ones(*m.shape[:2], width - m.shape[-1])], -1)
                         for m in key_masks]
        hook = probe.hook(step, x, attn) if probe.hook else None
        out = model(x, attention_mask=attn, logits_index=slice(width - 1, width), probe=probe.forward_probe(key_masks, hook))
        logits = out.logits[:, -1].to(work_dtype)  # [B, V]: the last position predicts the next token
        if top_p is not None or top_k is not None:  # Dream's filters, on the tempered distribution
            keep = filter_logits(logits / temperature if temperature else logits, top_p, top_k) > float("-inf")
            logits = logits.masked_fill(~keep, float("-inf"))
        nxt = add_gumbel_noise(logits, temperature, generator).argmax(-1)  # [B]
        if stops.numel():  # a row that has ended keeps padding with the first stop id
            nxt = torch.where(ended, stops[0], nxt)
            ended |= torch.isin(nxt, stops)
        x = torch.cat([x, nxt[:, None]], dim=1)
        if attn is not None:
            attn = torch.cat([attn, attn.new_ones(b, 1)], dim=1)
        if want_state:
            committed = torch.zeros_like(x, dtype=torch.bool)
            committed[:, -1] = True
            state = StepState(
                step=step, block=0, x=x.clone(), masked=torch.zeros_like(committed), committed=committed,
                logits=out.logits, attentions=out.attentions, values=out.values,
                attention_mask=None if attn is None else attn[:, :width], prompt_length=p, mask_id=None,
                logit_columns=torch.tensor([width], device=x.device),
                virtual_sink_attentions=out.virtual_sink_attentions, input_length=width,
            )
            if callback is not None:
                callback(state)
            prev_state = state if key_masks_fn is not None else None
            del state
        del out, logits
        if stops.numel() and bool(ended.all()):
            break
    taken = x.shape[1] - p
    if taken < gen_length:  # stopped early: the rest is the stop id (and real tokens for the mask)
        x = torch.cat([x, x.new_full((b, gen_length - taken), int(stops[0]))], dim=1)
        if attn is not None:
            attn = torch.cat([attn, attn.new_ones(b, gen_length - taken)], dim=1)
    if return_dict:
        return GenerationOutput(sequences=x, attention_mask=attn, prompt_length=p, steps_taken=taken)
    return x
