"""The escape endpoint (docs/method.md §11): when a run leaves the unigram plateau, and its paired test.

A tiny masked-diffusion LM first learns the unigram marginal (its loss sits at the corpus's unigram cross-entropy,
~6 nats for the tiny tokenizer on Shakespeare) and leaves that plateau at a step that varies from seed to seed;
that step, not the variant, carried the spread of every contrast of the committed study. So a study can measure it:

* `unigram_plateau`: the training split's unigram entropy and the probe set's cross-entropy under it (the probe
  loss of a model that predicts the unigram marginal: the plateau the escape threshold is declared against);
* `Prober`: called by the trainer every `Escape.every` steps; scores the fixed probe set with
  `validation_elbo` and, on the same forwards, reads per layer the attention mass on the extra sink tokens, on
  the keys detected as sinks at ϵ (Rulli et al. eq. 3) and the content sink sets' change rate between the
  probe's consecutive masking strata (a moving-sink rate). Each probe is kept in `probes.json` (atomic rewrite);
* `escape_step`: the first probe from which the loss stays below the threshold, right-censored at the last;
* `censored_sign_test`: the paired log2 ratio of escape steps over seeds, with an exact sign test whose
  censored pairs are ordered conservatively, and an order-statistic interval widened by the censoring;
* `sign_test_mde`: the smallest shift the exact sign test detects with the declared power, at a spread;
* `escape_record`: a run's results.json record. The study-wide summary is `escape/summary.py`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats as scipy_stats

from sinkdlm.experiment.packed import read_run_json
from sinkdlm.io.atomic import atomic_write_json

PROBES = "probes.json"


# ----------------------------------------------------------------------------- the plateau
def unigram_plateau(train_tokens: torch.Tensor, probe_tokens: torch.Tensor) -> dict[str, float]:
    """The unigram level of the masked-diffusion loss (docs/method.md §11).

    `train_entropy`: H(p) = -sum_v p_v ln p_v of the training tokens' unigram distribution p (nats);
    `probe_cross_entropy`: -mean_i ln p(x_i) over the probe tokens, the probe loss of a model that predicts p at
    every masked position. A probe token never seen in training is given half a count (p = 0.5 / total)."""
    vocab = int(max(train_tokens.max(), probe_tokens.max())) + 1
    counts = torch.bincount(train_tokens.flatten().long(), minlength=vocab).double()  # [V]
    total = float(counts.sum())
    p = counts / total
    nz = p[p > 0]
    logp = torch.where(counts > 0, p, torch.full_like(p, 0.5 / total)).log()
    return {"train_entropy": float(-(nz * nz.log()).sum()),
            "probe_cross_entropy": float(-logp[probe_tokens.flatten().long()].mean()),
            "train_tokens": int(total), "probe_tokens": int(probe_tokens.numel())}


# ----------------------------------------------------------------------------- probing a run as it trains
class Prober:
    """`prober(model, step)`: one probe of a training run, kept in `path` (`probes.json`: {"plateau", "probes"}).

    `x0 [N, L]` the probe set; `escape` the preset's `Escape`. A resumed run probes its steps past the checkpoint
    again (the same weights, the same numbers) and overwrites them. A block model (`config.block_size`) is scored
    by `validation_elbo`'s x_t ⊕ x_0 pass, whose maps `[B, H, 2L+n, 2L+n]` are read as the block analyses read
    them (`diffusion.block.xt_queries`, docs/method.md §15): the x_t half's queries (each block's, beside the clean
    blocks before it), the noisy and the clean copy of a position one key, the extra sinks their own keys; the
    probe's numbers are then over the sequence's layout `[L+n]`, as a whole-sequence model's."""

    def __init__(self, path: Path, x0: torch.Tensor, escape, plateau: dict[str, float]):
        self.path, self.x0, self.escape = path, x0, escape
        old = read_run_json(path) if path.is_file() else {}  # a packed study's probes too (experiment/packed.py)
        self.record = {"plateau": plateau, "threshold": plateau["probe_cross_entropy"] - escape.margin,
                       "probes": old.get("probes", {})}

    def __call__(self, model, step: int) -> None:
        from sinkdlm.analysis.metrics import detect_sinks, received_attention, sink_set_change_rate
        from sinkdlm.diffusion.block import xt_queries
        from sinkdlm.diffusion.likelihood import validation_elbo
        from sinkdlm.model.probe import Probe
        from sinkdlm.model.sink import sink_indices

        import time

        t0 = time.perf_counter()
        cfg, e = model.config, self.escape
        n, length = self.x0.shape
        layers = cfg.num_hidden_layers
        extra = sink_indices(length, cfg.num_sink_tokens, cfg.sink_position)
        size = length + cfg.num_sink_tokens
        content = torch.ones(size, dtype=torch.bool)
        content[extra] = False
        parts: dict[str, list[list[torch.Tensor]]] = {k: [[] for _ in range(layers)]
                                                      for k in ("token", "detected", "content", "sets")}

        def hook(layer: int, attn: torch.Tensor, values: torch.Tensor, virtual) -> None:  # attn [B, H, S, S]
            attn = attn.float()
            if cfg.block_size is not None:  # x_t ⊕ x_0 [B, H, 2L+n, 2L+n] -> the sequence's layout [B, H, S, S]
                attn = xt_queries(attn, cfg.num_sink_tokens, cfg.sink_position)
            c = received_attention(attn, "mean", query_mask=content)  # [B, H, S]: mass per key, content queries
            sinks = detect_sinks(attn, e.epsilon, query_mask=content)  # [B, H, S]
            parts["token"][layer].append(c[..., extra].sum(-1).cpu())  # [B, H]
            parts["detected"][layer].append((c * sinks).sum(-1).cpu())
            parts["content"][layer].append((c * (sinks & content)).sum(-1).cpu())
            parts["sets"][layer].append((sinks & content).cpu())

        # whole sequences per batch: rows n * draws + d, draw d in masking stratum d (fewest masks first)
        r = validation_elbo(model, self.x0, e.draws, e.noise_seed, batch_size=e.draws * max(1, 8 // e.draws),
                            probe=Probe(hook=hook))
        per_layer: dict[str, list[float]] = {}
        for key in ("token", "detected", "content"):
            per_layer[key] = [float(torch.cat(parts[key][i]).mean()) for i in range(layers)]
        moving = []
        for i in range(layers):
            sets = torch.cat(parts["sets"][i]).view(n, e.draws, -1, size)  # [N, D, H, S]
            moving.append(float(sink_set_change_rate(sets.movedim(1, 0))))  # consecutive strata, every seq/head
        self.record["probes"][str(step)] = {
            "loss": r.val_loss, "loss_se": r.val_loss_se,
            "sink_token_mass": per_layer["token"] if extra else None,  # per layer, on the extra sink token(s)
            "detected_sink_mass": per_layer["detected"],  # per layer, on every key detected at ϵ
            "content_sink_mass": per_layer["content"],  # per layer, on detected content keys only
            "content_sink_set_change_rate": moving,  # per layer, between consecutive masking strata
            "seconds": time.perf_counter() - t0,  # the probe's cost (left out of the run's training time)
        }
        atomic_write_json(self.path, self.record)


def make_prober(path: Path, cfg_kwargs: dict[str, Any], escape) -> Prober:
    """The `Prober` of a run trained with `TrainConfig(**cfg_kwargs)`: its probe set (the first `escape.sequences`
    rows of the packed validation split, under the run's tokenizer) and the unigram plateau of its training split."""
    from sinkdlm.config import ModelConfig, TrainConfig
    from sinkdlm.training.trainer import load_batches, prepare_tokenizer

    cfg = TrainConfig(**cfg_kwargs)
    vocab = None if cfg.init_from else cfg.model_overrides.get("vocab_size", ModelConfig.from_preset(cfg.preset).vocab_size)
    tok = prepare_tokenizer(cfg, vocab)  # cached: the tokenizer the trainer builds
    train_set, val = (load_batches(cfg, tok, cfg.seq_len, split) for split in ("train", "validation"))
    if len(val) < escape.sequences:
        raise ValueError(f"the escape probe takes {escape.sequences} validation rows; the split has {len(val)}")
    x0, _ = val.get(list(range(escape.sequences)))  # [N, L]
    train_tokens, _ = train_set.get(list(range(len(train_set))))  # [rows, L]
    return Prober(path, x0, escape, unigram_plateau(train_tokens, x0))


def probe_curve(record: dict[str, Any]) -> list[tuple[int, float]]:
    """(step, probe loss) of a `probes.json` record, by step."""
    return sorted((int(s), p["loss"]) for s, p in record["probes"].items())


# ----------------------------------------------------------------------------- the escape rule
def escape_step(curve: list[tuple[int, float]], threshold: float) -> dict[str, Any]:
    """The first probe step from which every later probe's loss is below `threshold` (strictly); a curve whose
    last probe is not below it never escaped: censored at its last probe (`step` is then that last step, a
    lower bound of the escape step)."""
    if not curve:
        raise ValueError("escape_step needs at least one probe")
    curve = sorted(curve)
    first = None
    for step, loss in reversed(curve):
        if not loss < threshold:
            break
        first = step
    last = curve[-1][0]
    return {"step": last if first is None else first, "censored": first is None, "last_probe": last}


def _largest_sink_mass(record: dict[str, Any], first_layer: int) -> list[tuple[int, float]]:
    """(step, the largest attention mass on detected sinks over the layers from `first_layer` on) per probe."""
    return sorted((int(s), max(p["detected_sink_mass"][first_layer:])) for s, p in record["probes"].items())


def sink_onset(record: dict[str, Any], mass: float, first_layer: int = 0) -> dict[str, Any]:
    """Sink onset: the first probe from which the largest attention mass on detected sinks over the layers from
    `first_layer` on stays >= `mass` (right-censored at the last probe like `escape_step`)."""
    return escape_step([(s, -m) for s, m in _largest_sink_mass(record, first_layer)], -mass + 1e-12)


def sink_reach(record: dict[str, Any], mass: float, first_layer: int = 0) -> dict[str, Any]:
    """The exploratory onset (docs/method.md §11, not declared): the first probe at which the largest attention
    mass on detected sinks over the layers from `first_layer` on *reaches* `mass`, whether or not it stays there
    (the declared `sink_onset` needs it to stay); censored at the last probe when it never does."""
    curve = _largest_sink_mass(record, first_layer)
    if not curve:
        raise ValueError("sink_reach needs at least one probe")
    hit = next((step for step, m in curve if m >= mass), None)
    last = curve[-1][0]
    return {"step": last if hit is None else hit, "censored": hit is None, "last_probe": last}


# ----------------------------------------------------------------------------- the paired test over seeds
def _pair_bounds(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, float]:
    """The interval [low, high] that must hold d = log2(a / b) given each side's escape (a censored step is a
    lower bound of the true one): both observed: the point; a censored: d >= log2(a/b); b censored:
    d <= log2(a/b); both censored: unbounded."""
    d = math.log2(a["step"] / b["step"])
    low = d if not b["censored"] else -math.inf
    high = d if not a["censored"] else math.inf
    return low, high


def censored_sign_test(arm: dict[str, dict[str, Any]], base: dict[str, dict[str, Any]],
                       confidence: float = 0.95) -> dict[str, Any]:
    """The paired log2 ratio of escape steps (arm / baseline) over the seeds both have (`escape_step` records).

    Signs: a pair with both escapes observed gives the sign of d (0: a tie); both censored is a tie; one censored
    orders the pair where its known inequality does (the bound excludes 0) and otherwise is undetermined.
    Ties are dropped (the sign test's rule); the undetermined pairs are given the signs that make the exact
    two-sided binomial p largest (counted against the hypothesis). The interval for the median of d is the
    sign test's order-statistic interval [d_(k), d_(n+1-k)] taken on the lower bounds for its low end and on the
    upper bounds for its high end: it covers the median whatever the censored values are (it may be unbounded,
    stored as None). `estimate`: the median of d with censored values at their bounds."""
    seeds = [s for s in arm if s in base]
    bounds = {s: _pair_bounds(arm[s], base[s]) for s in seeds}
    plus = minus = ties = undetermined = 0
    for low, high in bounds.values():
        if low > 0:
            plus += 1
        elif high < 0:
            minus += 1
        elif low == high == 0 or (math.isinf(low) and math.isinf(high)):
            ties += 1
        else:
            undetermined += 1
    n = plus + minus + undetermined
    p = None
    if n:
        p = max(float(scipy_stats.binomtest(plus + k, n, 0.5).pvalue) for k in range(undetermined + 1))
    alpha = 1 - confidence
    m = len(seeds)
    low = high = None
    if m:
        cdf = scipy_stats.binom.cdf(np.arange(m + 1), m, 0.5)
        ok = np.nonzero(cdf <= alpha / 2)[0]
        k = int(ok[-1]) + 1 if ok.size else 0
        if k:
            lows = np.sort([b[0] for b in bounds.values()])
            highs = np.sort([b[1] for b in bounds.values()])
            low, high = float(lows[k - 1]), float(highs[m - k])
    point = [math.log2(arm[s]["step"] / base[s]["step"]) for s in seeds]
    finite = lambda x: x if x is not None and math.isfinite(x) else None  # noqa: E731
    return {"seeds": m, "per_seed": {s: point[i] for i, s in enumerate(seeds)},
            "censored": {s: [arm[s]["censored"], base[s]["censored"]] for s in seeds},
            "plus": plus, "minus": minus, "ties": ties, "undetermined": undetermined,
            "estimate": float(np.median(point)) if point else None, "p": p,
            "low": finite(low), "high": finite(high), "confidence": confidence,
            "rejects": p is not None and p < alpha}


def sign_test_mde(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float | None:
    """The smallest mean shift δ of normal paired differences (spread `sd`) that the exact two-sided sign test
    over `n` pairs rejects with probability >= `power` at level `alpha` (P(d > 0) = Φ(δ / sd)); None when no
    shift can (too few pairs for an exact p below alpha)."""
    ks = np.arange(n + 1)
    pvals = np.array([scipy_stats.binomtest(int(k), n, 0.5).pvalue for k in ks])
    reject = ks[(pvals < alpha) & (ks > n / 2)]  # the upper rejection region
    if not reject.size:
        return None
    lo, hi = 0.0, 20.0 * sd
    for _ in range(60):
        mid = (lo + hi) / 2
        q = scipy_stats.norm.cdf(mid / sd)
        if scipy_stats.binom.sf(reject.min() - 1, n, q) >= power:
            hi = mid
        else:
            lo = mid
    return hi


# ----------------------------------------------------------------------------- a run's record
def escape_record(probes_path: Path, metrics: list[dict[str, Any]], escape) -> dict[str, Any]:
    """A run's results.json `escape` record: its plateau and threshold, the escape step (`escape_step`), the sink
    onset (`sink_onset`) and their lag, the probe-loss curve, and its largest pre-clip gradient norm with when
    (`metrics`: the run's `read_metrics` rows); the per-layer probe numbers stay in `probes.json`."""
    from sinkdlm.training.rundir import grad_norm_peaks

    record = read_run_json(probes_path)  # a packed study's probes too (experiment/packed.py)
    curve = probe_curve(record)
    esc = escape_step(curve, record["threshold"])
    onset = sink_onset(record, escape.onset_mass, escape.onset_first_layer)
    reached = sink_reach(record, escape.onset_mass, escape.onset_first_layer)  # exploratory, beside the declared
    peak = max(grad_norm_peaks(metrics), key=lambda sg: sg[1], default=None)
    return {"plateau": record["plateau"], "threshold": record["threshold"], "escape": esc, "onset": onset,
            "onset_reached": reached,
            "lag": None if esc["censored"] or onset["censored"] else esc["step"] - onset["step"],
            "curve": [[s, v] for s, v in curve], "probes": str(probes_path),
            "grad_norm_peak": peak and {"step": peak[0], "value": peak[1]}}
