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
and rotary positions restart at each row's first real token, and with `seed` (or a list of per-row
generators) every row draws from its own random stream (`remasking.RowGenerators`), a row whose
adaptive block is done drawing nothing: every row gets the tokens it gets alone, greedy or sampled,
for every remasking rule and cache (tested in float64; in float32 a near-tie may round differently
in a batch's other matmul shapes, docs/guide.md).

Callback. `callback(StepState)` after each step; `key_masks_fn(step, previous_state)` before it
(sink-masking ablation, Rulli et al. Table 1). Only the current step's tensors are alive (plus the
previous state when `key_masks_fn` is given), so memory stays flat across steps.

Shape. `generate` is a plan, then its loop: `plan_generation` (every check, the path, the prompts, the rule, the
randomness, the schedule) once, into a `GenerationPlan`, then the loop of its path (`LOOPS`): `_generate_diffusion`
over a whole sequence's blocks and steps, calling the named pieces of `diffusion/steps.py` (which also says how
the cache, compile, the logits and host syncs work); `_generate_blocks`, a block model's (`block_sampling.py`:
`plan_blocks` is its plan, `decode_blocks` its loop); or `_generate_autoregressive`. The whole-sequence and
autoregressive loops report through one `_Observer`.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from sinkdlm.config.commands import SampleConfig
from sinkdlm.config.fields import with_overrides
from sinkdlm.diffusion.block_sampling import BlockDecodePlan, check_block_call, decode_blocks, plan_blocks
from sinkdlm.diffusion.remasking import RowGenerators, check_rule, resolve_rule
from sinkdlm.diffusion.steps import (
    BlockPlan, Canvas, DecodePlan, choose, choose_next, commit, compiled_columns, forward_step, origin_reveal,
    plan_decoding,
)
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
@dataclass(frozen=True)
class InputOptions:
    """How a `generate` call reads its prompts and its model, beside the decoding settings (`SampleConfig`):
    given as keywords of `generate`, as the settings are (`generate(model, ids, attention_mask=m,
    use_sink_cache=False)`)."""

    attention_mask: torch.Tensor | None = None
    """`[B, P]` the left padding of a tensor prompt, True = real (a list of prompts is padded by `generate`)."""
    pad_token_id: int | None = None
    """The id a list of prompts of different lengths is left-padded with (default: the mask id)."""
    use_sink_cache: bool = True
    """Reuse the sinks' constant keys/values (docs/method.md §3); False recomputes them per step (with a cache:
    once per call, into the static KV cache)."""
    shift_logits: bool | None = None
    """Position i-1 predicts token i (AR-initialised head, docs/method.md §5); None: the model's own
    `config.shift_logits` (True for Dream), a bool overrides it."""


@torch.no_grad()
def generate(
    model,
    prompt_ids,
    config: SampleConfig | None = None,
    *,
    probe: StepProbe | None = None,
    callback: StepCallback | None = None,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    return_dict: bool = False,
    **overrides,
) -> torch.Tensor | GenerationOutput:
    """Sample `gen_length` tokens after each prompt (docs/method.md §2). Returns `[B, P + gen_length]` ids.

    The decoding settings are a `SampleConfig` (`sinkdlm.config`, the one home of their defaults),
    given whole as `config`, as keyword overrides of its fields (`generate(model, ids, gen_length=32,
    steps=32)`), or both (the overrides replace the config's values), as transformers'
    `generate(generation_config=..., **kwargs)`; how the prompts and the model are read are keywords too,
    the fields of `InputOptions` (`attention_mask`, `pad_token_id`, `use_sink_cache`, `shift_logits`).
    An unknown keyword is a TypeError naming the fields. The settings (SampleConfig's docstrings say more):

    prompt_ids     `[P]`/`[B, P]` tensor, a list of ints, or a list of prompts of different lengths
                   (left-padded with `pad_token_id`; see `attention_mask` of the `return_dict` output).
    gen_length     tokens to generate (required); steps: denoising steps in all, split evenly over the
                   blocks (not used with `threshold`); block_length: semi-autoregressive blocks (default one;
                   a block model's: the sub-blocks of each of its blocks, Fast-dLLM v2's small_block_size).
    temperature, remasking, schedule, alg_temp, top_p, top_k, threshold: the rule of a step (the module
                   docstring); remasking/schedule None: the model family's (`ModelConfig.family`).
    generator/seed the randomness: with `seed` (default 0) every row gets its own generator seeded with it,
                   so a row's tokens are those it gets alone; `generator` a list of one generator per row
                   (a server's requests) likewise; one `generator` is one stream for the whole batch (a
                   row's draws then depend on the rows before it); seed=None: torch's global generator.
                   Passing both `generator` and `seed=` is refused.
    callback       `callback(StepState)` after every step. Without a cache it receives every column's
                   logits, unless it has an attribute `full_logits = False` (a server's streaming:
                   then only the block's are computed, as without a callback, so the tokens are the same).
    probe          a `StepProbe`: what the analysis asks of every step (key masks, a per-layer hook,
                   maps and values in the StepState); None is the fast path.
    return_dict    return a `GenerationOutput` (sequences, attention_mask, steps_taken).
    cache, kv_cache_dtype, compile: Fast-dLLM's KV caching and its compiled step (`diffusion/steps.py`):
                   only the block's queries run, so a `probe` is refused (analyse with cache=None).
    max_new_tokens a block model (`block_size`, docs/method.md §13): its bound (default gen_length), each
                   row ending at its end-of-text (`diffusion/block_sampling.py`).

    Autoregressive models (`config.causal`, a Qwen2/LLaMA checkpoint opened as is): greedy (or, with
    temperature, sampled) left-to-right decoding, one token per step and `gen_length` steps; `steps`,
    `block_length` and `remasking` do not apply; callbacks, hooks and key masks see the causal maps
    of each step's input (the prompt and the tokens so far), docs/method.md §10.

    The call is a plan, then its loop: `plan_generation` checks everything and fixes the path (a whole
    sequence, a block model's blocks, or left to right), the prompts, the rule, the randomness and the
    schedule before any forward; `LOOPS[plan.path]` runs it.
    """
    settings, inputs = _call_settings(config, overrides, generator)
    full_logits = callback is not None and getattr(callback, "full_logits", True)
    plan = plan_generation(model, prompt_ids, settings, inputs, probe=probe, generator=generator,
                           full_logits=full_logits)
    out = LOOPS[plan.path](model, plan, callback)
    return out if return_dict else out.sequences


def _call_settings(config: SampleConfig | None, overrides: dict, generator) -> tuple[SampleConfig, InputOptions]:
    """`generate`'s keywords: the `SampleConfig` (`config` with the overrides of its fields) and the `InputOptions`."""
    if generator is not None and "seed" in overrides:
        raise ValueError("pass either generator or seed, not both")
    inputs = InputOptions(**{f.name: overrides.pop(f.name) for f in dataclasses.fields(InputOptions)
                             if f.name in overrides})
    if config is None and "gen_length" not in overrides and overrides.get("max_new_tokens") is not None:
        overrides["gen_length"] = overrides["max_new_tokens"]  # a block model's bound is its only length
    return with_overrides(SampleConfig, config, overrides, "generate"), inputs


# ----------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class GenerationPlan:
    """What one `generate` call fixes before any forward: the path, the checked settings, the prompts, the
    rule, the randomness, the probe, and the path's schedule (`steps.DecodePlan` for a whole sequence,
    `block_sampling.BlockDecodePlan` for a block model)."""

    path: str  # "sequence": a whole-sequence DLM | "blocks": a block model (§13) | "autoregressive"
    settings: SampleConfig
    prompt: torch.Tensor  # [B, P] ids, on the model's device
    prompt_mask: torch.Tensor | None  # [B, P] bool, True = real; None when no row is padded
    remasking: str  # the resolved rule (`remasking.resolve_rule`)
    generator: torch.Generator | RowGenerators | None  # None: torch's global generator
    probe: StepProbe
    use_sink_cache: bool
    schedule: DecodePlan | BlockDecodePlan | None  # None for an autoregressive model


def plan_generation(model, prompt_ids, settings: SampleConfig, inputs: InputOptions = InputOptions(), *,
                    probe: StepProbe | None = None, generator=None, full_logits: bool = False) -> GenerationPlan:
    """Every user error of a `generate` call, before any work, and what the call fixes before its loop.

    The settings' own checks have one home (config/checks.py), which the command line runs before any
    weight is read; an AR model refuses every diffusion-only setting given. `full_logits`: a callback is
    given (without a cache it receives every column's logits)."""
    cfg = model.config
    if probe is not None and not isinstance(probe, StepProbe):
        raise ValueError(f"probe must be a StepProbe (sinkdlm.diffusion.sampling), got {type(probe).__name__}")
    if cfg.block_size is not None or settings.max_new_tokens is not None:  # block diffusion, §13
        check_block_call(cfg, settings, probe=probe, shift_logits=inputs.shift_logits)
        if settings.compile:
            check_compile(settings.compile_backend, model.device)
        prompt, prompt_mask = _checked_prompts(model, prompt_ids, inputs, 0)
        generator = _row_generators(generator, settings.seed, prompt.shape[0], model.device)  # a stream a row
        blocks = plan_blocks(model, prompt, prompt_mask, settings)
        return GenerationPlan("blocks", settings, prompt, prompt_mask, blocks.remasking, generator,
                              probe or StepProbe(), inputs.use_sink_cache, blocks)
    probe = probe or StepProbe()
    check_sample_settings(settings, autoregressive=bool(cfg.causal))
    schedule_name, remasking = resolve_rule(cfg.family, settings.schedule, settings.remasking, settings.threshold)
    check_rule(schedule_name, remasking, threshold=settings.threshold, temperature=settings.temperature,
               alg_temp=settings.alg_temp, top_p=settings.top_p, top_k=settings.top_k, eps=settings.eps)
    if settings.cache is not None and probe != StepProbe():
        raise ValueError(
            f"cache={settings.cache!r} runs only the current block's queries, but a probe's maps, values, hook and "
            "key masks cover the whole sequence at every step; use cache=None for attention analysis and "
            "sink ablation"
        )
    if settings.compile:
        check_compile(settings.compile_backend, model.device)
    prompt, prompt_mask = _checked_prompts(model, prompt_ids, inputs, settings.gen_length)
    generator = _row_generators(generator, settings.seed, prompt.shape[0], model.device)
    shift = cfg.shift_logits if inputs.shift_logits is None else bool(inputs.shift_logits)
    schedule = None if cfg.causal else plan_decoding(
        settings, schedule_name, remasking, prompt.shape[1], shift=1 if shift else 0,
        full_logits=full_logits and settings.cache is None)
    return GenerationPlan("autoregressive" if cfg.causal else "sequence", settings, prompt, prompt_mask, remasking,
                          generator, probe, inputs.use_sink_cache, schedule)


def _checked_prompts(model, prompt_ids, inputs: InputOptions, gen_length: int):
    """`prepare_prompts` on the model's device (padded with the mask id unless `inputs.pad_token_id`), checked
    against the model: prompt + gen_length within its positions, every real id within its vocabulary."""
    cfg = model.config
    pad = (cfg.mask_token_id or 0) if inputs.pad_token_id is None else inputs.pad_token_id
    prompt, prompt_mask = prepare_prompts(prompt_ids, inputs.attention_mask, pad, model.device)
    p = prompt.shape[1]
    total = p + gen_length
    if total > cfg.max_content_length:
        raise ValueError(
            f"prompt ({p} tokens) + gen_length ({gen_length}) = {total} tokens is longer than the "
            f"model's {cfg.content_length_note()} positions; shorten the prompt or gen_length"
        )
    real = prompt if prompt_mask is None else prompt[prompt_mask]
    if real.numel() and (real.min() < 0 or real.max() >= cfg.vocab_size):
        raise ValueError(f"prompt token ids must lie in [0, vocab_size={cfg.vocab_size})")
    return prompt, prompt_mask


def _row_generators(generator, seed: int | None, rows: int, device):
    """The call's randomness: a stream per row from `seed` or from a list of generators (`RowGenerators`),
    else the one `generator` given, else (seed=None) torch's global generator (None)."""
    if isinstance(generator, (list, tuple)):
        if len(generator) != rows or not all(isinstance(g, torch.Generator) for g in generator):
            raise ValueError(f"generator must be one torch.Generator or a list of one per prompt ({rows}), "
                             f"got {len(generator)} items")
        return RowGenerators(generator)
    if generator is None and seed is not None:
        return RowGenerators(torch.Generator(device=device).manual_seed(seed) for _ in range(rows))
    return generator


def _drawing_rows(canvas: Canvas, blk: BlockPlan, generator) -> bool:
    """An adaptive block's step (threshold, origin): whether a row is unfinished (one host sync). With a
    stream per row only the unfinished rows draw: alone, a finished row's loop would be at its next block."""
    rows = canvas.masked[:, blk.lo:blk.hi].any(-1).nonzero().squeeze(-1).tolist()
    if isinstance(generator, RowGenerators):
        generator.active = rows
    return bool(rows)


class _Observer:
    """The per-step asks of a callback and a probe, shared by the diffusion and autoregressive loops: before
    a step, its `Probe` (the key masks from the previous StepState, then the hook); after it, the StepState.
    Only the current step's tensors stay alive (and the previous state when key masks read it)."""

    def __init__(self, probe: StepProbe, callback: StepCallback | None):
        self.probe, self.callback = probe, callback
        self.wants_state = callback is not None or probe.key_masks is not None
        self.previous: StepState | None = None

    def step_probe(self, step: int, input_ids: Callable[[], torch.Tensor], attn, width: int | None = None):
        """This step's `Probe` (None: the fast path). `input_ids()`: the model's input, built only for a
        hook; `width`: an AR step's input width (the previous step's key masks cover one key fewer)."""
        key_masks = self.probe.key_masks(step, self.previous) if self.probe.key_masks is not None else None
        if key_masks is not None and width is not None:  # the new token is never masked
            key_masks = [None if m is None else torch.cat([m, m.new_ones(*m.shape[:2], width - m.shape[-1])], -1)
                         for m in key_masks]
        hook = self.probe.hook(step, input_ids(), attn) if self.probe.hook else None
        return self.probe.forward_probe(key_masks, hook)

    def after(self, state: StepState) -> None:
        if self.callback is not None:
            self.callback(state)
        self.previous = state if self.probe.key_masks is not None else None


# ----------------------------------------------------------------------------- the diffusion loop
def _canvas(model, plan: GenerationPlan) -> Canvas:
    """The start of the reverse process: `prompt + [MASK] * gen_length`, all of the generation masked."""
    (b, p), gen_length, mask_id = plan.prompt.shape, plan.settings.gen_length, model.config.mask_token_id
    total = p + gen_length
    x = torch.cat([plan.prompt, plan.prompt.new_full((b, gen_length), mask_id)], dim=1)  # [B, L]
    attn = None
    if plan.prompt_mask is not None:
        attn = torch.cat([plan.prompt_mask, plan.prompt_mask.new_ones(b, gen_length)], dim=1)  # [B, L]
    masked = torch.zeros(b, total, dtype=torch.bool, device=model.device)
    masked[:, p:] = True
    model.fuse_projections()  # one matmul for q/k/v and one for gate/up per layer (the same parameters)
    # One static KV cache for every pass of the call, except where the plain forward is asked for: a
    # probe's maps and key masks, and use_sink_cache=False without a cache (the sinks at every step).
    kv = None
    if plan.probe == StepProbe() and (plan.use_sink_cache or plan.settings.cache is not None):
        with model.sink_cache_mode(plan.use_sink_cache):
            kv = model.allocate_cache(b, total, attn, kv_cache_dtype=plan.settings.kv_cache_dtype)
    columns = compiled_columns(plan.schedule, model.device) if plan.settings.compile else None
    return Canvas(x, attn, masked, kv, columns)


def _generate_diffusion(model, plan: GenerationPlan, callback: StepCallback | None) -> GenerationOutput:
    """The loop over blocks and their steps (`plan.schedule`); each step is `_denoise_step`. A block with an
    adaptive count (threshold, origin) ends when none of its positions is masked: one host sync a step."""
    canvas, observer = _canvas(model, plan), _Observer(plan.probe, callback)
    step, compile_seconds = 0, 0.0
    for blk in plan.schedule.blocks:
        if isinstance(plan.generator, RowGenerators):
            plan.generator.active = None  # a block of fixed counts: every row runs its steps
        for i in range(blk.steps) if blk.steps is not None else itertools.count():
            if blk.counts is None and not _drawing_rows(canvas, blk, plan.generator):
                break
            compile_seconds += _denoise_step(model, plan, canvas, blk, i, step, observer)
            step += 1
    if compile_seconds:
        log.info("generate(compile=True): %.1f s in first calls of the compiled step (compiling)", compile_seconds)
    return GenerationOutput(sequences=canvas.x, attention_mask=canvas.attn, prompt_length=plan.prompt.shape[1],
                            steps_taken=step, compile_seconds=compile_seconds if plan.settings.compile else None)


def _denoise_step(model, plan: GenerationPlan, canvas: Canvas, blk: BlockPlan, i: int, step: int,
                  observer: _Observer) -> float:
    """Step `i` of block `blk` (global `step`): forward, choose, commit (`diffusion/steps.py`), then the
    StepState; returns the compile seconds of its forward."""
    settings, mask_id, x, masked = plan.settings, model.config.mask_token_id, canvas.x, canvas.masked
    k = blk.counts[i] if blk.counts is not None else None
    reveal = origin_reveal(masked, blk, i, plan.generator) if plan.remasking == "origin" else None
    step_probe = observer.step_probe(step, lambda: x.masked_fill(masked, mask_id), canvas.attn)
    cached = settings.cache is not None and i > 0  # a block's first step is a full forward
    with model.sink_cache_mode(plan.use_sink_cache):
        logits, out, seconds = forward_step(model, plan.schedule, blk, canvas, cached, settings, step_probe)
    x0, pick = choose(logits, masked[:, blk.lo:blk.hi], k, reveal, settings, plan.remasking, mask_id, plan.generator)
    masked_before = masked.clone() if observer.wants_state else None
    commit(x, masked, blk, x0, pick)
    if observer.wants_state:
        committed = torch.zeros_like(masked)
        committed[:, blk.lo:blk.hi] = pick
        total, device = plan.schedule.total, x.device
        observer.after(StepState(
            step=step, block=blk.index, x=x.clone(), masked=masked_before, committed=committed,
            # a CUDA graph's output is overwritten by its next replay: the state keeps a copy
            logits=out.logits.clone() if settings.compile else out.logits, attentions=out.attentions,
            values=out.values, attention_mask=canvas.attn, prompt_length=plan.prompt.shape[1], mask_id=mask_id,
            logit_columns=torch.arange(total, device=device) if plan.schedule.full_logits else
            torch.arange(blk.lo, blk.hi, device=device),
            virtual_sink_attentions=out.virtual_sink_attentions,
        ))
    return seconds


# ----------------------------------------------------------------------------- the autoregressive loop
def _generate_autoregressive(model, plan: GenerationPlan, callback: StepCallback | None) -> GenerationOutput:
    """Left-to-right decoding of a causal model, one token per step (no KV cache: every step runs the
    whole prefix, so the analysis sees each step's complete causal maps). With `stop_token_ids`, decoding
    stops once every row has produced one of them and the remaining positions get the first, so the output
    keeps its `[B, P + gen_length]` shape."""
    with model.sink_cache_mode(plan.use_sink_cache):
        return _autoregressive_loop(model, plan, _Observer(plan.probe, callback))


def _autoregressive_loop(model, plan: GenerationPlan, observer: _Observer) -> GenerationOutput:
    """`_generate_autoregressive`'s steps, under its sink-cache mode."""
    gen_length = plan.settings.gen_length
    stops = torch.tensor(plan.settings.stop_token_ids or (), dtype=torch.long, device=plan.prompt.device)
    ended = torch.zeros(plan.prompt.shape[0], dtype=torch.bool, device=plan.prompt.device)  # [B]
    b, p = plan.prompt.shape
    x, attn = plan.prompt, plan.prompt_mask
    for step in range(gen_length):
        width = x.shape[1]
        step_probe = observer.step_probe(step, lambda: x, attn, width=width)
        out = model(x, attention_mask=attn, logits_index=slice(width - 1, width), probe=step_probe)
        # the last position predicts the next token
        nxt = choose_next(out.logits[:, -1], plan.settings, model.dtype, plan.generator)  # [B]
        if stops.numel():  # a row that has ended keeps padding with the first stop id
            nxt = torch.where(ended, stops[0], nxt)
            ended |= torch.isin(nxt, stops)
        x = torch.cat([x, nxt[:, None]], dim=1)
        if attn is not None:
            attn = torch.cat([attn, attn.new_ones(b, 1)], dim=1)
        if observer.wants_state:
            committed = torch.zeros_like(x, dtype=torch.bool)
            committed[:, -1] = True
            observer.after(StepState(
                step=step, block=0, x=x.clone(), masked=torch.zeros_like(committed), committed=committed,
                logits=out.logits, attentions=out.attentions, values=out.values,
                attention_mask=None if attn is None else attn[:, :width], prompt_length=p, mask_id=None,
                logit_columns=torch.tensor([width], device=x.device),
                virtual_sink_attentions=out.virtual_sink_attentions, input_length=width,
            ))
        del out
        if stops.numel() and bool(ended.all()):
            break
    taken = x.shape[1] - p
    if taken < gen_length:  # stopped early: the rest is the stop id (and real tokens for the mask)
        x = torch.cat([x, x.new_full((b, gen_length - taken), int(stops[0]))], dim=1)
        if attn is not None:
            attn = torch.cat([attn, attn.new_ones(b, gen_length - taken)], dim=1)
    return GenerationOutput(sequences=x, attention_mask=attn, prompt_length=p, steps_taken=taken)


# ----------------------------------------------------------------------------- a block model's loop
def _generate_blocks(model, plan: GenerationPlan, callback: StepCallback | None) -> GenerationOutput:
    """A block model's blocks (`block_sampling.decode_blocks` over `plan.schedule`); a callback is told once per
    finished block (the tokens are the same without it)."""
    on_block = None
    if callback is not None:
        def on_block(step, index, x, masked, committed):
            callback(StepState(step=step, block=index, x=x, masked=masked, committed=committed,
                               prompt_length=plan.prompt.shape[1]))
    step_probe, probe = None, plan.probe
    if probe != StepProbe():  # the analysis: each step's hook (its maps are the whole canvas's, `_probe_pass`)
        def step_probe(step, x, real):
            return probe.forward_probe(None, probe.hook(step, x, real) if probe.hook else None)
    out = decode_blocks(model, plan.schedule, plan.generator, plan.use_sink_cache, on_block, step_probe)
    return GenerationOutput(**vars(out))


# The loop of each path of `GenerationPlan`: `(model, plan, callback) -> GenerationOutput`.
LOOPS = {"sequence": _generate_diffusion, "blocks": _generate_blocks, "autoregressive": _generate_autoregressive}
