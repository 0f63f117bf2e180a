"""Sink-masking ablation (Rulli et al. Table 1, docs/method.md §6): mask the top-K sink keys, measure a score.

Masks. From an attention map `[B, H, S, S]` of every layer, the sinks at ϵ (eq. 3) per (row, head);
the K sinks with the largest received attention get key mask False, so their pre-softmax logits
are -inf at every query of that head (`DiffusionLM.forward(probe=Probe(key_masks=...))`). Fewer than K sinks:
only the sinks are masked (a non-sink key is never masked). The extra sink token(s) are neither
masked nor counted among the K unless `include_extra_sink=True`. K = 0 masks nothing. A model with
extra sink tokens is scored both ways (`run_ablation`: the other setting under `alternative`): in the
heads where the extra sink is the largest sink, sparing it makes masking look cheap (docs/method.md §6).

Two ways to score, both paired (the same prompts / noise for every K, K = 0 included):

* generation, exactly as the paper: `SinkMasker` gives `generate` its key masks (`SinkMasker.probe`, a
  `StepProbe`); at step t it
  masks the sinks found in the attention of step t-1 (step 0 runs unmasked: there is no t-1).
  A task (e.g. GSM8K accuracy from the evaluation code) runs its generations with the masker.
  The protocol, `AblationTask`: a callable `task(model, generate_kwargs) -> float` (higher =
  better) that calls `sinkdlm.generate(model, prompt, <its own gen_length/steps/...>,
  **generate_kwargs)` for every generation it scores; `generate_kwargs` holds `probe`, the masker's
  `StepProbe` (with the previous step's maps when its protocol reads them), and must be passed on
  unchanged. An optional `name` attribute names the metric.
* continuation ELBO when no task is given: for held-out (prefix, continuation) pairs, the
  Monte-Carlo ELBO of docs/method.md §1 (same noise draws as `loglikelihood(method="mc")`), per
  continuation token. "Step t-1" is the unablated forward on the same noised input: the sinks
  are detected on its attention and the same input is run again with them masked. A block model's
  score is its block NELBO (docs/method.md §15: `block_loglikelihood`'s draws, one x_t ⊕ x_0 pass each):
  its sinks come from the x_t half's queries of the unablated pass, and a masked position's noisy
  and clean keys are both hidden. Shifted logits (Fast-dLLM v2) are read as `loglikelihood` reads them:
  each block's first token exactly, at the clean previous block's last column, under each draw's own
  masks. A block model's generation takes no key masks yet: no task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from sinkdlm.analysis.metrics import exclusive_mean, received_attention
from sinkdlm.config.checks import check_epsilon, check_int, check_scale
from sinkdlm.analysis.recorder import row_groups
from sinkdlm.diffusion.loss import weighted_masked_ce
from sinkdlm.diffusion.block import block_nelbo_terms, block_request_draws, both_copies, xt_queries
from sinkdlm.diffusion.likelihood import mc_draw
from sinkdlm.config.commands import AnalyzeConfig  # the one home of the defaults (their field docstrings)
from sinkdlm.config.fields import with_overrides
from sinkdlm.config.train import TrainConfig  # the one home of eps
from sinkdlm.model.probe import Probe
from sinkdlm.diffusion.sampling import StepProbe


class AblationTask(Protocol):
    """`task(model, generate_kwargs) -> score` (higher = better); see the module docstring."""

    def __call__(self, model, generate_kwargs: dict) -> float: ...


def check_ks(ks) -> list[int]:
    """Sorted distinct K values with 0 (the unablated baseline) first."""
    if isinstance(ks, int) and not isinstance(ks, bool):
        ks = [ks]
    try:
        ks = list(ks)
    except TypeError as err:
        raise ValueError(f"ablation_k must be a list of integers >= 0, got {ks!r}") from err
    if not ks or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in ks):
        raise ValueError(f"ablation_k must be a non-empty list of integers >= 0 (e.g. [1, 5, 10]), got {ks!r}")
    return sorted(set(ks) | {0})


# ----------------------------------------------------------------------------- the masks
@torch.no_grad()
def sink_key_masks(
    attentions: Sequence[torch.Tensor],
    k: int,
    *,
    epsilon: float = AnalyzeConfig.epsilon,
    scale: str = AnalyzeConfig.scale,
    num_sink_tokens: int = 0,
    sink_position: str = "front",
    include_extra_sink: bool = False,
    attention_mask: torch.Tensor | None = None,
) -> list[torch.Tensor] | None:
    """Per layer `[B, H, S]` key masks (True = may attend) hiding the top-K sinks of each head.

    attentions     per layer `[B, H, S, S]` maps in layout order (the source step's attention).
    attention_mask `[B, L]` content padding (True = real): sinks are found on the real positions.
    Returns None for K = 0 (nothing to mask: the forward is the unablated one).
    """
    eps = check_epsilon(epsilon)
    check_scale(scale)
    check_int("k", k, 0)
    if k == 0:
        return None
    seq_len = attentions[0].shape[-1] - num_sink_tokens
    groups = row_groups(attention_mask, seq_len, num_sink_tokens, sink_position)
    masks = []
    for attn in attentions:
        b, h, s, _ = attn.shape
        keep = torch.ones(b, h, s, dtype=torch.bool, device=attn.device)
        for g in groups:
            c = received_attention(g.sub_attention(attn), scale, query_mask=g.content_sub)  # [b', H, S'] eq. 3
            is_sink = c > exclusive_mean(c) + eps
            if g.sink_sub and not include_extra_sink:
                is_sink[..., g.sink_sub] = False  # the extra sink is never a candidate
            score = c.masked_fill(~is_sink, float("-inf"))
            top = score.topk(min(k, g.size), dim=-1)
            hide = torch.zeros_like(is_sink).scatter_(-1, top.indices, top.values > float("-inf"))  # [b', H, S']
            if g.rows is None:
                keep &= ~hide
            else:
                rows, pos = g.rows.to(attn.device), g.positions.to(attn.device)
                full = torch.zeros(len(rows), h, s, dtype=torch.bool, device=attn.device)
                full[:, :, pos] = hide
                keep[rows] &= ~full
        masks.append(keep)
    return masks


PROTOCOLS = {
    "clean": "sinks from the un-ablated attention of step t-1 (one extra clean forward of step t-1's input), "
             "their keys masked at step t (step 0 unmasked)",
    "ablated": "sinks from the ablated attention of step t-1 (the maps the masked model produced), "
               "their keys masked at step t (step 0 unmasked)",
}


def check_protocol(protocol: str) -> str:
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown ablation protocol {protocol!r}; choose one of {sorted(PROTOCOLS)}")
    return protocol


class SinkMasker:
    """`StepProbe.key_masks` for `generate`: at step t hide the top-K sinks of step t-1 (Rulli et al.).

    protocol "clean" (default): the sinks are found on the model's own, un-ablated attention at
    step t-1's input (one extra eager forward per step). A key masked at t-1 receives no attention
    in the ablated maps, so detecting on those ("ablated", the earlier behaviour) unmasks every
    masked sink at the next step and masks the dominant sinks only every other step.
    With "ablated" the generation must keep the maps (`StepProbe(attentions=True)`); "clean" needs only the
    model (the generation can use the fast backend). Counters: `masked_keys` (keys hidden, summed
    over steps, rows, layers and heads) and `head_slots` ((step, row, layer, head) slots masked).
    """

    def __init__(self, model, k: int, *, epsilon: float = AnalyzeConfig.epsilon, scale: str = AnalyzeConfig.scale, include_extra_sink: bool = False,
                 protocol: str = "clean"):
        check_epsilon(epsilon)
        check_scale(scale)
        check_protocol(protocol)
        check_int("k", k, 0)
        config = getattr(model, "config", model)
        if protocol == "clean" and not callable(model):
            raise ValueError("the clean protocol runs the model on step t-1's input: pass the model, not its config")
        self.model = model if protocol == "clean" else None
        self.k, self.epsilon, self.scale, self.include_extra_sink = k, epsilon, scale, include_extra_sink
        self.protocol = protocol
        self.num_sink_tokens, self.sink_position = config.num_sink_tokens, config.sink_position
        self.masked_keys, self.head_slots = 0, 0

    @property
    def probe(self) -> StepProbe:
        """What `generate` needs for this masker: its key masks (and, "ablated", the maps they read)."""
        return StepProbe(key_masks=self, attentions=self.protocol == "ablated")

    @property
    def generate_kwargs(self) -> dict:
        """The keyword arguments an `AblationTask` passes on to `generate`."""
        return {"probe": self.probe}

    @torch.no_grad()
    def __call__(self, step: int, prev_state) -> list[torch.Tensor] | None:
        if self.k == 0 or prev_state is None:  # K = 0, or step 0 (no step t-1): unablated
            return None
        def masks_of(attentions):
            return sink_key_masks(
                attentions, self.k, epsilon=self.epsilon, scale=self.scale,
                num_sink_tokens=self.num_sink_tokens, sink_position=self.sink_position,
                include_extra_sink=self.include_extra_sink, attention_mask=prev_state.attention_mask,
            )

        if self.protocol == "clean":  # one layer's maps alive at a time (Probe.hook)
            masks = []
            probe = Probe(hook=lambda i, attn, v, col: masks.extend(masks_of([attn])))
            self.model(prev_state.input_ids, attention_mask=prev_state.attention_mask, logits_index=slice(0, 0),
                       probe=probe)
        else:
            if prev_state.attentions is None:
                raise ValueError("the 'ablated' protocol reads the previous step's maps: generate with probe=StepProbe(key_masks=masker, attentions=True)")
            masks = masks_of(prev_state.attentions)
        self.masked_keys += int(sum((~m).sum() for m in masks))
        self.head_slots += sum(m.shape[0] * m.shape[1] for m in masks)
        return masks


# ----------------------------------------------------------------------------- ELBO scoring
def split_continuation(ids: Sequence[int], max_continuation: int) -> tuple[list[int], list[int]] | None:
    """Held-out split of one tokenised text: the last `min(max_continuation, len // 2)` tokens
    are the continuation, the rest the prefix. None when the text has fewer than 2 tokens."""
    ids = list(ids)
    n = min(max_continuation, len(ids) // 2)
    if n < 1:
        return None
    return ids[:-n], ids[-n:]


@torch.no_grad()
def continuation_elbo(
    model,
    prefixes: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    ks: Sequence[int],
    settings: AnalyzeConfig | None = None,
    *,
    batch_size: int = 16,
    progress: Callable[[int], None] | None = None,
    **overrides,
) -> dict:
    """Per-token continuation ELBO of every request under top-K sink masking, for every K.

    The noise follows `loglikelihood(method="mc", seed=seed)` draw for draw (so K = 0 equals its
    `logprob / len(continuation)`), and is shared by every K. Per noised row: one unablated
    forward (with attention; it gives the K = 0 term and the sinks), then one forward per K > 0
    with `sink_key_masks` of that attention. Rows that mask nothing contribute 0 and are skipped.
    Returns `{"elbo": {K: [N] per-token ELBO}, "masked_keys": {K: int}, "head_slots": int}`.
    An autoregressive model (`config.causal`) is scored by its exact log-likelihood (one clean row per
    request, no noise). A block model (`config.block_size`) is scored by its block NELBO (`block_loglikelihood`'s
    draws, so K = 0 equals `loglikelihood(..., seed=seed)` of it), each draw one x_t ⊕ x_0 pass: the sinks are
    found on the x_t half's queries (each block's queries beside the clean blocks before it), the noisy and the
    clean copy of a position one key, and both copies are masked (docs/method.md §15); with shifted logits (Fast-dLLM
    v2) each block's first token is scored exactly at the clean previous block's last column (of the x_0 half, under
    that draw's masks), the others one x_t column back, as `loglikelihood` scores it. The settings (ϵ, scale,
    include_extra_sink, mc_num, seed) are `AnalyzeConfig`'s, and keyword overrides are its fields
    (`continuation_elbo(model, p, c, ks, epsilon=0.0)`); `batch_size` counts noised rows per forward. The head's
    shift is the model's `config.shift_logits`.
    """
    settings = with_overrides(AnalyzeConfig, settings, overrides, "continuation_elbo")
    ks = check_ks(ks)
    cfg = model.config
    if len(prefixes) != len(continuations) or not continuations:
        raise ValueError("give one prefix per continuation, and at least one pair")
    if cfg.block_size is not None and cfg.shift_logits and not all(len(p) for p in prefixes):
        raise ValueError("a prefix is empty; a block model with shifted logits needs a prefix token to predict the "
                         "first one")
    generator = torch.Generator().manual_seed(settings.seed)
    elbo = {k: [] for k in ks}
    masked_keys = {k: 0 for k in ks}
    head_slots = 0
    for pre, cont in zip(prefixes, continuations):
        if not len(cont):
            raise ValueError("a continuation is empty; every request needs at least one continuation token")
        rows, score = _request_draws(model, pre, cont, settings.mc_num, generator)
        totals = {k: torch.zeros(_num_draws(cfg, settings.mc_num), dtype=torch.float64) for k in ks}
        for start in range(0, len(rows), batch_size):
            r = rows[start:start + batch_size]
            # the masks of every K from the un-ablated forward, one layer's maps alive at a time
            layer_masks = {k: [] for k in ks if k > 0}

            def hook(i, attn, values, column):
                if cfg.block_size is not None:  # x_t ⊕ x_0: the x_t half's queries, a position's two keys as one
                    attn = xt_queries(attn, cfg.num_sink_tokens, cfg.sink_position)
                for k, acc in layer_masks.items():
                    acc.extend(sink_key_masks([attn], k, epsilon=settings.epsilon, scale=settings.scale,
                                              num_sink_tokens=cfg.num_sink_tokens, sink_position=cfg.sink_position,
                                              include_extra_sink=settings.include_extra_sink))

            totals[0][r] = score(r, Probe(hook=hook) if layer_masks else None)
            for k, km in layer_masks.items():
                masked_keys[k] += int(sum((~m).sum() for m in km))
                if cfg.block_size is not None:  # hide both copies of a masked position
                    km = [both_copies(m, cfg.num_sink_tokens, cfg.sink_position) for m in km]
                totals[k][r] = score(r, Probe(key_masks=km, backend="eager"))
            head_slots += len(r) * cfg.num_hidden_layers * cfg.num_attention_heads
            if progress is not None:
                progress(len(r))
        for k in ks:
            elbo[k].append(float(totals[k].mean()) / len(cont))
    return {"elbo": {k: torch.tensor(v, dtype=torch.float64) for k, v in elbo.items()},
            "masked_keys": masked_keys, "head_slots": head_slots}


def _num_draws(cfg, mc_num: int) -> int:
    """Rows scored per request: one clean row for an AR model, else `mc_num` noise draws."""
    return 1 if cfg.causal else mc_num


def _request_draws(model, pre: Sequence[int], cont: Sequence[int], mc_num: int, generator: torch.Generator):
    """One request's noise and its scorer: (the draws to run `[R]`, `score(rows, probe) -> [len(rows)]` float64,
    each draw's log-probability term under that forward's probe). The draws: an AR model's one clean row; a block
    model's `block_request_draws` (`block_loglikelihood`'s); else `mc_draw` (`loglikelihood(method="mc")`'s)."""
    cfg, device, mask_id = model.config, model.device, model.config.mask_token_id
    seq = torch.tensor(list(pre) + list(cont), dtype=torch.long)
    lp = len(pre)
    if cfg.block_size is not None:  # the block NELBO (docs/method.md §13), one x_t ⊕ x_0 pass a batch of draws
        # shifted logits (Fast-dLLM v2): each block's first token exact, at the clean previous block's last column
        xt, x0, masked, weight, first = block_request_draws(cfg, seq, lp, mc_num, generator)

        def score(r, probe):
            return -block_nelbo_terms(model, xt[r].to(device), x0[r].to(device), masked[r], weight[r], probe=probe,
                                      first=first)
        return torch.arange(mc_num), score
    if cfg.causal:  # an AR model: its exact log-likelihood, one clean row (docs/method.md §10)
        xt, x0, t = seq[None], seq[None], torch.ones(1)
        masked = torch.zeros(1, len(seq), dtype=torch.bool)
        masked[:, lp:] = True
    else:
        xt, x0, masked, t = mc_draw(seq, lp, mc_num, TrainConfig.eps, mask_id, generator)  # loglikelihood's "mc" draw

    def score(r, probe):
        logits = model(xt[r].to(device), probe=probe).logits
        if cfg.shift_logits:  # logits[:, i-1] predicts x0[:, i]
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        return -weighted_masked_ce(logits, x0[r].to(device), masked[r].to(device), t[r].double().to(device)).double().cpu()
    return masked.any(-1).nonzero().squeeze(-1), score


def _mean_se(x: torch.Tensor) -> tuple[float, float | None]:
    se = float(x.std() / len(x) ** 0.5) if len(x) > 1 else None
    return float(x.mean()), se


def run_ablation(
    model,
    ks: Sequence[int],
    settings: AnalyzeConfig | None = None,
    *,
    ablation_task: AblationTask | None = None,
    prefixes: Sequence[Sequence[int]] | None = None,
    continuations: Sequence[Sequence[int]] | None = None,
    batch_size: int = 16,
    progress: Callable[[int], None] | None = None,
    **overrides,
) -> dict:
    """Score per K (the `ablation` entry of analysis.json): with `ablation_task` its score
    through `SinkMasker` generations, else the mean per-token continuation ELBO.

    A model with extra sink tokens is scored with both settings of `include_extra_sink`: the one asked
    for at the top level, the other under `alternative` (the same keys: `include_extra_sink`, `scores`,
    `delta`, `masked_keys_per_head`, and for the ELBO `stderr`, `delta_stderr`, `per_request`). Both use
    the same noise draws, so K = 0 is the same number in both. The settings (ϵ, scale, include_extra_sink,
    mc_num, seed, ablation_protocol) are `AnalyzeConfig`'s; keyword overrides are its fields."""
    settings = with_overrides(AnalyzeConfig, settings, overrides, "run_ablation")
    epsilon, scale, protocol = settings.epsilon, settings.scale, settings.ablation_protocol
    ks = check_ks(ks)
    check_protocol(protocol)
    cfg = model.config
    if ablation_task is None and (not prefixes or continuations is None):
        raise ValueError("the ELBO ablation needs held-out (prefix, continuation) pairs; none was given")
    include = [settings.include_extra_sink] + ([not settings.include_extra_sink] if cfg.num_sink_tokens else [])
    scored = [_ablation_scores(model, ks, dataclasses.replace(settings, include_extra_sink=i), ablation_task, prefixes,
                               continuations, batch_size, progress)
              for i in include]
    common = {"k": ks, "epsilon": float(epsilon), "scale": scale, "higher_is_better": True}
    if ablation_task is not None:
        out = {**common, "source": "task", "metric": getattr(ablation_task, "name", type(ablation_task).__name__),
               "protocol": protocol, "protocol_description": PROTOCOLS[protocol], "stderr": None, **scored[0]}
    else:
        block = cfg.block_size is not None
        out = {
            **common, "source": "elbo",
            "metric": ("continuation_logprob_per_token" if cfg.causal else
                       "continuation_block_elbo_per_token" if block else "continuation_elbo_per_token"),
            "protocol": "clean",
            "protocol_description": ("sinks from the un-ablated x_t ⊕ x_0 pass of the same draw (the x_t half's queries, "
                                     "a position's noisy and clean key as one), then both copies masked" if block else
                                     "sinks from the un-ablated forward of the same noised input, then masked"),
            **scored[0],
            "num_requests": len(continuations), "mc_num": _num_draws(cfg, settings.mc_num),
            "mean_continuation_tokens": sum(len(c) for c in continuations) / len(continuations),
        }
    if len(scored) > 1:
        out["alternative"] = scored[1]
    return out


def _ablation_scores(model, ks: list[int], settings: AnalyzeConfig, ablation_task, prefixes, continuations,
                     batch_size: int, progress) -> dict:
    """One setting of `include_extra_sink`: the per-K scores, their deltas to K = 0 and the keys masked
    per (row, layer, head) slot (for the ELBO also the standard errors and every request's score)."""
    include_extra_sink = settings.include_extra_sink
    if ablation_task is not None:
        scores, masked = {}, {}
        for k in ks:
            masker = SinkMasker(model, k, epsilon=settings.epsilon, scale=settings.scale,
                                include_extra_sink=include_extra_sink, protocol=settings.ablation_protocol)
            scores[k] = float(ablation_task(model, masker.generate_kwargs))
            masked[k] = masker.masked_keys / masker.head_slots if masker.head_slots else 0.0
            if progress is not None:
                progress(1)
        return {"include_extra_sink": include_extra_sink, "scores": {str(k): v for k, v in scores.items()},
                "delta": {str(k): scores[k] - scores[0] for k in ks},
                "masked_keys_per_head": {str(k): v for k, v in masked.items()}}
    res = continuation_elbo(model, prefixes, continuations, ks, settings, batch_size=batch_size, progress=progress)
    stats = {k: _mean_se(v) for k, v in res["elbo"].items()}
    base = res["elbo"][0]
    return {
        "include_extra_sink": include_extra_sink,
        "scores": {str(k): s[0] for k, s in stats.items()},
        "delta": {str(k): float((res["elbo"][k] - base).mean()) for k in ks},
        "stderr": {str(k): s[1] for k, s in stats.items()},
        "delta_stderr": {str(k): (float((res["elbo"][k] - base).std() / len(base) ** 0.5) if len(base) > 1 else None)
                         for k in ks},
        "masked_keys_per_head": {str(k): (res["masked_keys"][k] / res["head_slots"] if res["head_slots"] else 0.0)
                                 for k in ks},
        "per_request": {str(k): [float(x) for x in v] for k, v in res["elbo"].items()},
    }
