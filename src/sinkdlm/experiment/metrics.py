"""The per-seed metrics an experiment compares, in one place: what each is, where a run's record keeps it,
which way is better, and how to read it per seed (`seed_values`, `paired_seed_differences`). `summary` compares
them and the endpoints (`experiment.endpoints`) read theirs through the same readers, so a metric is read one way
everywhere.
"""

from __future__ import annotations

import math
from typing import Any

# Metrics where lower is better; everything else (accuracies, Jaccard, non-sink fraction) is higher-is-better
# for the purpose of the words "better"/"worse" (sink metrics have no better: see NEUTRAL).
LOWER_IS_BETTER = {"val_loss"}
# Per-seed analysis scalars compared between variants: key -> (path into the analysis summary, label).
# Moving sinks are compared over the content keys (docs/method.md §6): the extra sink's key is a sink
# at nearly every step and would count as overlap for sink models only. The all-keys definition is
# kept under its own name as the alternative.
ANALYSIS_METRICS = {
    "non_sink_fraction": (("non_sink_fraction",), "non-sink fraction"),
    "content_sink_set_change_rate": (("moving", "content_sink_set_change_rate"),
                                     "sink-set change rate between steps (content keys)"),
    "content_sink_set_jaccard": (("moving", "content_sink_set_jaccard"), "Jaccard of consecutive sink sets (content keys)"),
    "sink_set_change_rate": (("moving", "sink_set_change_rate"), "sink-set change rate between steps (every key)"),
    "sink_set_jaccard": (("moving", "sink_set_jaccard"), "Jaccard of consecutive sink sets (every key)"),
    "value_norm_sink": (("value_norm", "sink_mean"), "value norm of sinks (pooled over layers)"),
    "value_norm_normal": (("value_norm", "normal_mean"), "value norm of normal tokens (pooled over layers)"),
    "repetition_rate": (("repetition_rate",), "repetition rate of the analysed generations"),
}
# Without extra sink tokens the content keys are every key: a record from before the content-key
# metrics existed holds them under the all-keys name.
CONTENT_FALLBACK = {"content_sink_set_change_rate": "sink_set_change_rate", "content_sink_set_jaccard": "sink_set_jaccard"}
# Per-seed training scalars compared between variants: key -> (field of the per-seed record, label). The
# largest pre-clip gradient norm of a run, on a log10 scale so that a difference is a ratio: the moving
# sink's loss spikes (docs/method.md §5), which a stable sink should remove.
TRAINING_METRICS = {"log10_peak_grad_norm": ("train_grad_norm_peak", "log10 largest pre-clip gradient norm in training")}
# descriptive: a difference without "better"/"worse". The change from step 0 too: a model that starts
# better has less to gain, so a smaller drop is not by itself a worse training (docs/method.md §7).
NEUTRAL = set(ANALYSIS_METRICS) | set(TRAINING_METRICS) | {"val_loss_change"}
# Alternative definitions, shown for reference beside the compared ones: no verdict, outside the family
# (the all-keys moving-sink metrics repeat the content-key ones for models without extra sinks; the
# pooled value norms weight layers by their sink counts, docs/method.md §6).
ALTERNATIVES = {"sink_set_change_rate", "sink_set_jaccard", "value_norm_sink", "value_norm_normal"}
# Quantities in [0, 1]: their intervals are kept inside it (stats.mean_interval bounds).
SHARES = {"repetition_rate", "non_sink_fraction", "content_sink_set_change_rate", "content_sink_set_jaccard", "sink_set_change_rate",
          "sink_set_jaccard"}
# The method of each kind of interval, as the reports label it.
METHOD_SEEDS = "Student t over seeds (n − 1 df)"
METHOD_ITEMS = "seeds × items (two-way random effects, t with n − 1 df)"


def get_path(d: Any, path: tuple[str, ...]) -> float | None:
    """The finite number at `path` in nested dicts, or None."""
    for key in path:
        if not isinstance(d, dict) or d.get(key) is None:
            return None
        d = d[key]
    return float(d) if isinstance(d, (int, float)) and math.isfinite(d) else None


def has_extra_sinks(variant: dict[str, Any]) -> bool:
    """Whether a variant has extra sink tokens (its `switches`)."""
    return bool(variant.get("switches", {}).get("num_sink_tokens", 0))


def unconverted(results: dict[str, Any], variant: dict[str, Any]) -> bool:
    """Whether an arm's step-0 control is the study's starting checkpoint itself (`base`): no conversion, the same
    model on every seed. Then Δ_train against it is the gap at the end minus the step-0 gap: how much of the other
    arm's conversion gap training closed, not what training with the change bought (docs/method.md §7)."""
    start = (results.get("base") or {}).get("checkpoint")
    return bool(start) and (variant.get("step0") or {}).get("checkpoint") == start


def seed_values(variant: dict[str, Any], metric: str) -> dict[str, float | None]:
    """{seed: value or None (not recorded)} of one per-seed scalar metric, for every seed of the variant;
    `step0` is the run's step-0 control's val_loss (the converted model before training)."""
    out: dict[str, float | None] = {}
    for seed, rec in variant["seeds"].items():
        if metric in ("val_loss", "val_loss_change"):  # the change: from the run's own step-0 control
            value = get_path(rec, (metric,))
        elif metric == "step0":
            value = get_path(rec, ("step0", "val_loss"))
        elif metric in TRAINING_METRICS:
            raw = rec.get(TRAINING_METRICS[metric][0])
            value = math.log10(raw) if isinstance(raw, (int, float)) and math.isfinite(raw) and raw > 0 else None
        else:
            value = get_path(rec.get("analysis"), ANALYSIS_METRICS[metric][0])
            if value is None and metric in CONTENT_FALLBACK and not has_extra_sinks(variant):
                value = get_path(rec.get("analysis"), ANALYSIS_METRICS[CONTENT_FALLBACK[metric]][0])
        out[seed] = value
    return out


def seed_scalars(variant: dict[str, Any], metric: str) -> dict[str, float]:
    """{seed: value} of the seeds that recorded the metric."""
    return {k: v for k, v in seed_values(variant, metric).items() if v is not None}


def paired_seed_differences(a: dict[str, Any], b: dict[str, Any], key: str) -> dict[str, float]:
    """{seed: a - b} of a per-seed scalar (`val_loss`, `val_loss_change`, `step0`) over the seeds both have."""
    sa, sb = seed_scalars(a, key), seed_scalars(b, key)
    return {s: sa[s] - sb[s] for s in sa if s in sb}
