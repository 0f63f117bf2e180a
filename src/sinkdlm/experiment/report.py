"""Aggregate an experiment over seeds, compare variants with paired intervals, write the report.

results.json -> `summarise` adds, per variant, `summary` (mean and 95 % interval over seeds of
every metric, and the per-layer value norms of sinks, normal tokens and the extra sink) and, for the
experiment, `comparisons`: one entry per (pair of variants, metric) with the mean difference, its
interval, its p-value and the verdict — all from `sinkdlm.stats`:

* `val_loss` and the analysis metrics (one number per seed): paired Student t over seeds;
* task accuracies: paired over seeds *and* items (`paired_accuracy_difference` on the per-item
  outcomes that eval.json keeps; the item sets are checked to be the same).

Multiplicity (docs/method.md §7): every paired comparison whose verdict the report prints forms one
family; Benjamini-Hochberg at q = 1 - confidence adjusts its p-values, and a direction (and bold) is
stated only for comparisons that survive. Comparisons without a variance estimate (a metric that
cannot vary, such as a cloze exact match that is 0 for every model, or identical per-seed
differences) and comparisons with one seed are not tests and stay out of the family.

A per-seed value that is missing (None) marks the metric missing for that pair; it is reported, not
compared. `markdown_summary` renders the tables that the README shows, from a results.json alone (a
test regenerates the README's tables from the committed file); `regenerate` rebuilds a committed
experiment's results.json and report from its stored records.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from sinkdlm.reporting import Document
from sinkdlm.stats import (
    Interval, accuracy_interval, benjamini_hochberg, mean_interval, paired_accuracy_difference, paired_difference,
    signed, verdict,
)

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
}
# Without extra sink tokens the content keys are every key: a record from before the content-key
# metrics existed holds them under the all-keys name.
CONTENT_FALLBACK = {"content_sink_set_change_rate": "sink_set_change_rate", "content_sink_set_jaccard": "sink_set_jaccard"}
NEUTRAL = set(ANALYSIS_METRICS)  # descriptive: a difference is reported without "better"/"worse"
# Alternative definitions, shown for reference beside the compared ones: no verdict, outside the family
# (the all-keys moving-sink metrics repeat the content-key ones for models without extra sinks; the
# pooled value norms weight layers by their sink counts, docs/method.md §6).
ALTERNATIVES = {"sink_set_change_rate", "sink_set_jaccard", "value_norm_sink", "value_norm_normal"}
# Quantities in [0, 1]: their intervals are kept inside it (stats.mean_interval bounds).
SHARES = {"non_sink_fraction", "content_sink_set_change_rate", "content_sink_set_jaccard", "sink_set_change_rate",
          "sink_set_jaccard"}
# The method of each kind of interval, as the reports label it.
METHOD_SEEDS = "Student t over seeds (n − 1 df)"
METHOD_ITEMS = "seeds × items (two-way random effects, t with n − 1 df)"


def analysis_record(a: dict[str, Any]) -> dict[str, Any]:
    """The per-seed analysis numbers results.json keeps (self-contained: no need to open analysis.json)."""
    moving = a.get("moving", {}).get("mean", {})
    vn = a.get("value_norm", {})
    extra = a.get("extra_sink")
    abl = a.get("ablation")
    return {
        "non_sink_fraction": a.get("non_sink_fraction"),
        "non_sink_fraction_by_epsilon": a.get("non_sink_fraction_by_epsilon"),
        "moving": dict(moving),
        # per layer too: pooling over layers weights each layer by its sink count and can flip the sign
        "value_norm": {k: vn.get(k) for k in ("sink_mean", "normal_mean", "sink_count", "normal_count", "per_layer")},
        "extra_sink": None if not extra else {k: extra.get(k) for k in (
            "mean_attention_mass", "attention_mass", "value_norm", "others_value_norm")},
        "sink_token_types": (a.get("sink_token_types") or {}).get("shares"),
        "ablation": None if not abl else {k: abl.get(k) for k in ("metric", "protocol", "scores", "delta", "stderr")},
    }


def _get(d: Any, path: tuple[str, ...]) -> float | None:
    for key in path:
        if not isinstance(d, dict) or d.get(key) is None:
            return None
        d = d[key]
    return float(d) if isinstance(d, (int, float)) and math.isfinite(d) else None


def _has_extra_sinks(variant: dict[str, Any]) -> bool:
    return bool(variant.get("switches", {}).get("num_sink_tokens", 0))


def _seed_values(variant: dict[str, Any], metric: str) -> dict[str, float | None]:
    """{seed: value or None (not recorded)} of one per-seed scalar metric, for every seed of the variant."""
    out: dict[str, float | None] = {}
    for seed, rec in variant["seeds"].items():
        if metric == "val_loss":
            value = rec.get("val_loss")
            value = float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None
        else:
            value = _get(rec.get("analysis"), ANALYSIS_METRICS[metric][0])
            if value is None and metric in CONTENT_FALLBACK and not _has_extra_sinks(variant):
                value = _get(rec.get("analysis"), ANALYSIS_METRICS[CONTENT_FALLBACK[metric]][0])
        out[seed] = value
    return out


def _seed_scalars(variant: dict[str, Any], metric: str) -> dict[str, float]:
    """{seed: value} of the seeds that recorded the metric."""
    return {k: v for k, v in _seed_values(variant, metric).items() if v is not None}


def _task_metrics(results: dict[str, Any]) -> list[str]:
    names = set()
    for v in results["variants"].values():
        for rec in v["seeds"].values():
            names |= {f"{task}/{m}" for task, ms in rec.get("eval", {}).items() for m in ms}
    return sorted(names)


def task_chance(metric: str) -> float | None:
    """The accuracy of a uniform random guess for a `task/metric` name (None: not a choice metric)."""
    from sinkdlm.evaluation.tasks import TASKS

    task, m = metric.split("/", 1)
    return TASKS[task].chance.get(m) if task in TASKS else None


def _per_item(variant: dict[str, Any], metric: str) -> dict[str, dict]:
    task, m = metric.split("/", 1)
    return {seed: rec["eval"][task][m] for seed, rec in variant["seeds"].items() if m in rec.get("eval", {}).get(task, {})}


def _missing(a: dict[str, Any], b: dict[str, Any], metric: str, seeds: list[str]) -> dict[str, Any]:
    which = "these runs" if len(seeds) == len(a["seeds"]) else f"seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)}"
    return {"variant": a["label"], "baseline": b["label"], "metric": metric, "mean": None, "low": None, "high": None,
            "n": len(a["seeds"]), "p": None, "degenerate": False, "excludes_zero": False, "missing": seeds,
            "verdict": f"missing: not recorded for {which}"}


def compare_variants(a: dict[str, Any], b: dict[str, Any], metric: str, confidence: float = 0.95) -> dict[str, Any] | None:
    """Paired comparison of variant `a` against `b` on `metric` (a results.json variant entry each).

    An entry with `missing` (the seeds without a value) when the metric is missing for some seed of
    either (None for a task metric neither variant was scored on). A ValueError when they were run on different
    seeds or scored on different items (a paired comparison would be meaningless). The verdict here
    is the unadjusted one; `summarise` replaces it once the family's p-values are adjusted.
    """
    if set(a["seeds"]) != set(b["seeds"]):
        raise ValueError(f"{a['label']} and {b['label']} were run on different seeds ({sorted(a['seeds'])} vs "
                         f"{sorted(b['seeds'])}); rerun `sinkdlm experiment` so both have every seed")
    if "/" in metric:
        sa, sb = _per_item(a, metric), _per_item(b, metric)
        if not sa and not sb:
            return None
        gone = sorted(set(a["seeds"]) - (set(sa) & set(sb)), key=str)
        if gone:
            return _missing(a, b, metric, gone)
        for seed in sa:
            if sa[seed].get("items") != sb[seed].get("items") or len(sa[seed].get("per_item", [])) != len(sb[seed].get("per_item", [])):
                raise ValueError(f"{a['label']} and {b['label']} were scored on different items for {metric} (seed {seed}); "
                                 "evaluate both with the same task, --limit and evaluation seed")
        if any("per_item" not in s for s in (*sa.values(), *sb.values())):
            return None  # an eval.json from before per-item outcomes were kept
        iv = paired_accuracy_difference({s: sa[s]["per_item"] for s in sa}, {s: sb[s]["per_item"] for s in sa}, confidence)
        scale, unit, label = 100.0, " points", METHOD_ITEMS
    else:
        sa, sb = _seed_values(a, metric), _seed_values(b, metric)
        gone = sorted((k for k in sa if sa[k] is None or sb[k] is None), key=str)
        if gone:
            return _missing(a, b, metric, gone)
        iv = paired_difference(sa, sb, confidence)
        scale, unit, label = 1.0, "", METHOD_SEEDS
    lower = metric in LOWER_IS_BETTER
    text = verdict(iv, lower_is_better=None if metric in NEUTRAL else lower, scale=scale, unit=unit)
    entry = {"variant": a["label"], "baseline": b["label"], "metric": metric, **iv.to_dict(), "method_label": label,
             "scale": scale, "unit": unit, "lower_is_better": None if metric in NEUTRAL else lower, "verdict": text}
    if metric in ALTERNATIVES:
        entry.update(in_family=False, verdict="not tested: an alternative definition, shown for reference")
    return entry


def _interval(d: dict[str, Any]) -> Interval:
    """The Interval back from its `to_dict` form (None bounds: unbounded, or degenerate)."""
    nan = math.nan if d.get("degenerate") else math.inf
    return Interval(d["mean"], -nan if d.get("low") is None else d["low"], nan if d.get("high") is None else d["high"],
                    d["n"], d["confidence"], d["method"], d.get("df"), d.get("items"), d.get("p"), d.get("degenerate", False))


def _mean_or_none(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def _layer_lists(variant: dict[str, Any], path: tuple[str, ...]) -> dict[str, list[float | None]]:
    """{seed: per-layer list} of the seeds whose analysis record holds `path` (a list per layer)."""
    out = {}
    for seed, rec in variant["seeds"].items():
        d: Any = rec.get("analysis")
        for key in path:
            d = d.get(key) if isinstance(d, dict) else None
        if isinstance(d, list) and d:
            out[seed] = [float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None for x in d]
    return out


def _paired_lists(a: dict[str, list], b: dict[str, list], from_layer: int = 0) -> dict[str, Any] | None:
    """Per layer and seed `a - b` (only where both exist), summarised without pooling counts:
    per layer the paired interval over seeds, and per seed the unweighted mean over its layers from
    `from_layer` on, with the interval of that over seeds (docs/method.md §6)."""
    seeds = sorted(set(a) & set(b), key=str)
    if not seeds:
        return None
    n_layers = max(len(a[s]) for s in seeds)
    diff = {s: [(x - y) if x is not None and y is not None else None
                for x, y in zip(a[s] + [None] * (n_layers - len(a[s])), b[s] + [None] * (n_layers - len(b[s])))]
            for s in seeds}
    layers = []
    for li in range(n_layers):
        pairs = {s: (a[s][li], b[s][li]) for s in seeds if li < len(a[s]) and diff[s][li] is not None}
        iv = paired_difference([x for x, _ in pairs.values()], [y for _, y in pairs.values()]) if pairs else None
        layers.append({"layer": li, "seeds": len(pairs), "a": _mean_or_none([x for x, _ in pairs.values()]),
                       "b": _mean_or_none([y for _, y in pairs.values()]), "diff": None if iv is None else iv.to_dict()})
    per_seed = {s: _mean_or_none(diff[s][from_layer:]) for s in seeds}
    per_seed = {s: v for s, v in per_seed.items() if v is not None}
    summary = None
    if per_seed:
        iv = mean_interval(list(per_seed.values()))
        summary = {**iv.to_dict(), "method_label": METHOD_SEEDS,
                   "verdict": verdict(iv, lower_is_better=None), "seeds": sorted(per_seed, key=str)}
    shown = [lay for lay in layers[from_layer:] if lay["diff"] is not None]
    return {"from_layer": from_layer, "seeds": seeds, "layers": layers, "layer_mean": summary,
            "positive_layers": sum(lay["diff"]["mean"] > 0 for lay in shown),
            "negative_layers": sum(lay["diff"]["mean"] < 0 for lay in shown), "compared_layers": len(shown)}


def value_norm_layers(variant: dict[str, Any]) -> dict[str, Any] | None:
    """Sinks vs normal tokens per layer, paired within layer and seed (layers without sinks drop out)."""
    return _paired_lists(_layer_lists(variant, ("value_norm", "per_layer", "sink_mean")),
                         _layer_lists(variant, ("value_norm", "per_layer", "normal_mean")))


def extra_sink_layers(variant: dict[str, Any]) -> dict[str, Any] | None:
    """The extra sink per layer (One-Token Fig. 3): its share of attention (interval over seeds, in
    [0, 1]) and its value norm against the other tokens', paired within layer and seed; the claim
    "below the other tokens from the second layer on" is summarised over layers 1.. per seed."""
    mass = _layer_lists(variant, ("extra_sink", "attention_mass"))
    if not mass:
        return None
    n_layers = max(len(m) for m in mass.values())
    per_layer_mass = []
    for li in range(n_layers):
        vals = [m[li] for m in mass.values() if li < len(m) and m[li] is not None]
        per_layer_mass.append(mean_interval(vals, bounds=(0.0, 1.0)).to_dict() if vals else None)
    out = {"attention_mass": per_layer_mass, "attention_mass_seeds": sorted(mass, key=str)}
    out["value_norm_vs_others"] = _paired_lists(_layer_lists(variant, ("extra_sink", "value_norm")),
                                                _layer_lists(variant, ("extra_sink", "others_value_norm")), from_layer=1)
    return out


def constant_metrics(results: dict[str, Any]) -> list[str]:
    """Metrics that take one value for every variant, seed and item (e.g. a cloze exact match that no
    model ever gets): they cannot vary, so no comparison of them is a test."""
    out = []
    for m in _task_metrics(results):
        seen = {x for v in results["variants"].values() for s in _per_item(v, m).values() for x in s.get("per_item", [s.get("value")])}
        if len(seen) == 1:
            out.append(m)
    return out


def adjust_family(entries: list[dict[str, Any]], confidence: float = 0.95) -> dict[str, Any]:
    """Benjamini-Hochberg over the entries that are tests (a p-value: two or more seeds and a variance
    estimate); sets `p_adjusted`, `survives` and the final `verdict` of every entry in place and
    returns what the report says about the family."""
    family = [e for e in entries if e.get("p") is not None and e.get("in_family", True)]
    for e, q in zip(family, benjamini_hochberg([e["p"] for e in family])):
        e["p_adjusted"], e["survives"] = q, bool(q < 1 - confidence and e["excludes_zero"])
    for e in entries:
        if e.get("missing") or e.get("mean") is None or not e.get("in_family", True):
            continue
        e.setdefault("p_adjusted", None)
        e.setdefault("survives", False)
        e["verdict"] = verdict(_interval(e), lower_is_better=e.get("lower_is_better"), scale=e.get("scale", 1.0),
                               unit=e.get("unit", ""), p_adjusted=e["p_adjusted"])
    return {
        "method": "Benjamini-Hochberg", "q": round(1 - confidence, 10), "size": len(family),
        "raw_excluding_zero": sum(bool(e["excludes_zero"]) for e in family),
        "expected_by_chance": (1 - confidence) * len(family),
        "survivors": sum(e["survives"] for e in family),
        "min_p_adjusted": min((e["p_adjusted"] for e in family), default=None),
        "left_out": {"alternative definitions": sum(not e.get("in_family", True) for e in entries),
                     "no variance estimate": sum(bool(e.get("degenerate")) and e.get("in_family", True) for e in entries),
                     "one seed": sum(e.get("n", 0) < 2 and e.get("mean") is not None and e.get("in_family", True)
                                     for e in entries),
                     "missing": sum(bool(e.get("missing")) for e in entries)},
    }


def summarise(results: dict[str, Any], pairs: list[tuple[str, str]] | None = None, confidence: float = 0.95) -> None:
    """Add `summary` to every variant, `comparisons` (each pair in `pairs`, default: every variant
    against the first) and `multiplicity` (the family's adjustment) to `results`."""
    variants = results["variants"]
    names = list(variants)
    scalar_metrics = ["val_loss"] + [m for m in ANALYSIS_METRICS if any(_seed_scalars(v, m) for v in variants.values())]
    task_metrics = _task_metrics(results)
    family: list[dict[str, Any]] = []  # every paired comparison whose verdict the report prints
    for v in variants.values():
        summary = {}
        for m in scalar_metrics:
            vals = list(_seed_scalars(v, m).values())
            if vals:
                iv = mean_interval(vals, confidence, bounds=(0.0, 1.0) if m in SHARES else None)
                summary[m] = {**iv.to_dict(), "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                              "method_label": METHOD_SEEDS}
        for m in task_metrics:
            scores = _per_item(v, m)
            vals = [s["value"] for s in scores.values()]
            if not vals:
                continue
            std = statistics.stdev(vals) if len(vals) > 1 else 0.0
            if all("per_item" in s for s in scores.values()):  # over seeds and items (stats.accuracy_interval)
                summary[m] = {**accuracy_interval({k: s["per_item"] for k, s in scores.items()}, confidence).to_dict(),
                              "std": std, "method_label": METHOD_ITEMS}
            else:  # an eval.json without per-item outcomes: the spread over seeds only
                summary[m] = {**mean_interval(vals, confidence).to_dict(), "std": std, "method_label": METHOD_SEEDS}
            chance = task_chance(m)
            if chance is not None:
                low = summary[m]["low"]
                summary[m]["chance"] = chance
                summary[m]["above_chance"] = low is not None and low > chance
        # Do sinks carry smaller values than normal tokens (One-Token Fig. 3)? Paired within layer and seed.
        layers = value_norm_layers(v)
        if layers:
            summary["value_norm_layers"] = layers
            if layers["layer_mean"]:
                family.append(layers["layer_mean"])
        # The pooled difference, kept for contrast: it weights each layer by its number of sinks.
        sink_vn, normal_vn = _seed_scalars(v, "value_norm_sink"), _seed_scalars(v, "value_norm_normal")
        if sink_vn and set(sink_vn) == set(normal_vn):
            iv = paired_difference(sink_vn, normal_vn, confidence)
            summary["value_norm_sink_minus_normal_pooled"] = {**iv.to_dict(), "method_label": METHOD_SEEDS,
                                                              "verdict": verdict(iv, lower_is_better=None)}
        extra = extra_sink_layers(v)
        if extra:
            summary["extra_sink_layers"] = extra
            if extra["value_norm_vs_others"] and extra["value_norm_vs_others"]["layer_mean"]:
                family.append(extra["value_norm_vs_others"]["layer_mean"])
        v["summary"] = summary
    pairs = pairs or [(n, names[0]) for n in names[1:]]
    comparisons = []
    for a, b in pairs:
        if a not in variants or b not in variants:
            continue
        for m in scalar_metrics + task_metrics:
            c = compare_variants(variants[a], variants[b], m, confidence)
            if c is not None:
                comparisons.append({"pair": [a, b], **c})
    results["comparisons"] = comparisons
    results["constant_metrics"] = constant_metrics(results)
    results["multiplicity"] = {
        **adjust_family(comparisons + family, confidence),
        "family": ("every paired comparison the report gives a verdict for: each compared pair of variants × metric "
                   "(validation loss, accuracies, sink metrics), and per variant the per-layer value norm of sinks − "
                   "normal tokens and of the extra sink − the other tokens"),
    }


def experiment_timing(results: dict[str, Any]) -> dict[str, Any]:
    """What the experiment cost, from what results.json holds: the runner's `timing`, or, for a results
    file from before it was recorded, the per-run training seconds summed (and saying so)."""
    if results.get("timing"):
        return results["timing"]
    recs = [rec for v in results["variants"].values() for rec in v["seeds"].values()]
    train = [rec["train_seconds"] for rec in recs if isinstance(rec.get("train_seconds"), (int, float))]
    out = {"compute_s": sum(train), "compute_parts": ["train"], "runs": len(recs), "runs_timed": len(train),
           "run_train_s": {"min": min(train, default=None), "median": statistics.median(train) if train else None,
                           "max": max(train, default=None)},
           "elapsed_s": None, "last_invocation_s": results.get("elapsed_s"),
           "note": ("this run predates the runner's timing record: compute is the per-run training seconds "
                    "summed; evaluation and analysis time and the real elapsed time were not recorded (the last "
                    "invocation only merged finished runs)")}
    stages = results.get("stage_seconds") or {}
    if train and math.isclose(stages.get("train", 0.0), sum(train), rel_tol=0.01):
        # the last invocation trained every run itself: its stage seconds and wall time are the whole experiment's
        out.update(compute_s=sum(stages.values()), compute_parts=[k for k, v in stages.items() if v],
                   elapsed_s=results.get("elapsed_s"),
                   note="this run predates the runner's timing record: one invocation ran every stage, so its stage "
                        "seconds and wall time are the experiment's")
    return out


# ----------------------------------------------------------------------------- formatting
def _fmt_interval(s: dict | None, scale: float = 1.0, digits: int = 3) -> str:
    if not s or s.get("mean") is None:
        return "–"
    text = f"{scale * s['mean']:.{digits}f}"
    text = text[1:] if text.startswith("-") and float(text) == 0 else text  # never "-0.0"
    if s.get("degenerate"):
        return text + " (no spread)"
    if s.get("low") is not None and s.get("high") is not None:
        low, high = (signed(scale * s[k], digits).lstrip("+") for k in ("low", "high"))
        text += f" [{low}, {high}]"
    return text


def _fmt_diff(c: dict, bold: bool = True) -> str:
    """"Δ [low, high]" of a comparison, and its direction in bold when it survives the adjustment."""
    if c.get("missing"):
        return c["verdict"].removeprefix("missing: ")
    scale = c.get("scale", 1.0)
    digits = 1 if scale != 1.0 else 3
    cell = signed(scale * c["mean"], digits)
    if c.get("degenerate"):
        return cell + " (no variance)"
    if c["low"] is not None:
        cell += f" [{signed(scale * c['low'], digits)}, {signed(scale * c['high'], digits)}]"
    if bold and c.get("survives"):
        cell += f" **{c['verdict'].split(' ')[0]}**"
    return cell


def _is_pct(metric: str) -> bool:
    return "/" in metric


def results_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    variants = results["variants"]
    metrics = ["val_loss"] + _task_metrics(results)
    def head(m):
        chance = task_chance(m) if _is_pct(m) else None
        return f"`{m}`" + ((" %" + (f" (chance {100 * chance:.0f})" if chance else "")) if _is_pct(m) else " (↓)")

    header = ["variant"] + [head(m) for m in metrics]
    rows = [[v["label"]] + [_fmt_interval(v["summary"].get(m), 100.0 if _is_pct(m) else 1.0, 1 if _is_pct(m) else 3)
                            for m in metrics] for v in variants.values()]
    return header, rows


def _short_verdict(c: dict) -> str:
    if c.get("missing"):
        return "missing"
    if not c.get("in_family", True):
        return "not tested (alternative)"
    if c.get("degenerate"):
        return "no variance estimate"
    if c.get("survives"):
        return c["verdict"].split(" (")[0].split(" by ")[0]
    if c.get("excludes_zero"):
        return f"inconclusive after BH (adjusted p = {c['p_adjusted']:.2g})" if c.get("p_adjusted") is not None else "inconclusive"
    return f"no difference detected ({c['n']} seeds)"


def comparisons_table(results: dict[str, Any], metrics: set[str] | None = None) -> tuple[list[str], list[list[str]]]:
    rows = []
    for c in results["comparisons"]:
        if metrics is not None and c["metric"] not in metrics:
            continue
        scale = c.get("scale", 1.0)
        digits = 1 if scale != 1.0 else 3
        ci = "–" if c.get("low") is None else f"[{signed(scale * c['low'], digits)}, {signed(scale * c['high'], digits)}]"
        mean = "–" if c.get("mean") is None else signed(scale * c["mean"], digits)
        adj = "–" if c.get("p_adjusted") is None else f"{c['p_adjusted']:.2g}"
        rows.append([f"{c['variant']} − {c['baseline']}", f"`{c['metric']}`", mean, ci, adj,
                     c.get("method_label", "–"), _short_verdict(c)])
    return ["difference", "metric", "Δ", "95 % CI (raw)", "BH-adjusted p", "interval", "verdict"], rows


def sinks_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    rows = []
    for v in results["variants"].values():
        s = v["summary"]
        if "non_sink_fraction" not in s:
            continue
        extra = [rec.get("analysis", {}).get("extra_sink") for rec in v["seeds"].values()]
        masses = [e["mean_attention_mass"] for e in extra if e and e.get("mean_attention_mass") is not None]
        rows.append([
            v["label"], _fmt_interval(s.get("non_sink_fraction"), 100.0, 1),
            _fmt_interval(s.get("content_sink_set_change_rate")), _fmt_interval(s.get("content_sink_set_jaccard")),
            f"{_fmt_interval(s.get('sink_set_change_rate'))} / {_fmt_interval(s.get('sink_set_jaccard'))}",
            _fmt_interval(_interval_of(masses, share=True), 100.0, 1),
        ])
    if not rows:
        return None
    return (["variant", "non-sink fraction %", "sink-set change rate (content keys)", "consecutive Jaccard (content keys)",
             "change rate / Jaccard over every key", "attention on the extra sink %"], rows)


def epsilon_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """Rulli et al. Fig. 10: non-sink fraction vs ϵ, mean [95 % CI] over seeds."""
    eps_keys: list[str] = []
    rows = []
    for v in results["variants"].values():
        curves = [rec["analysis"]["non_sink_fraction_by_epsilon"] for rec in v["seeds"].values()
                  if rec.get("analysis") and rec["analysis"].get("non_sink_fraction_by_epsilon")]
        if not curves:
            continue
        eps_keys = eps_keys or sorted(curves[0], key=float)
        rows.append([v["label"]] + [_fmt_interval(_interval_of([c.get(e) for c in curves], share=True), 100.0, 1)
                                    for e in eps_keys])
    return (["variant"] + [f"ϵ = {e}" for e in eps_keys], rows) if rows else None


def token_type_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """Rulli et al. Table 2: what tokens the sinks sit on, share mean [95 % CI] over seeds."""
    types = ("mask", "whitespace", "punctuation", "other", "sink")
    rows = []
    for v in results["variants"].values():
        shares = [rec["analysis"]["sink_token_types"] for rec in v["seeds"].values()
                  if rec.get("analysis") and rec["analysis"].get("sink_token_types")]
        if not shares:
            continue
        rows.append([v["label"]] + [_fmt_interval(_interval_of([s.get(t, 0.0) for s in shares], share=True), 100.0, 1)
                                    for t in types])
    return (["variant"] + [f"{t} %" for t in types], rows) if rows else None


def _interval_of(values: list, share: bool = False) -> dict | None:
    """mean [95 % CI] over seeds of the finite values (None when there are none); a share's stays in [0, 1]."""
    vals = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return mean_interval(vals, bounds=(0.0, 1.0) if share else None).to_dict() if vals else None


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def pivot_comparisons(results: dict[str, Any], metrics: list[str]) -> tuple[list[str], list[list[str]]] | None:
    """One row per compared pair, one column per metric: "Δ [raw CI]", with the verdict's direction in
    bold only when the comparison survives the multiplicity adjustment (compact enough for the README)."""
    by_pair: dict[tuple[str, str], dict[str, dict]] = {}
    labels: dict[tuple[str, str], str] = {}
    for c in results["comparisons"]:
        key = tuple(c.get("pair") or (c["variant"], c["baseline"]))
        by_pair.setdefault(key, {})[c["metric"]] = c
        labels[key] = f"{c['variant']} − {c['baseline']}"
    metrics = [m for m in metrics if any(m in per for per in by_pair.values())]
    if not by_pair or not metrics:
        return None
    rows = [[labels[key]] + [_fmt_diff(per[m]) if m in per else "–" for m in metrics] for key, per in by_pair.items()]
    header = ["difference"] + [f"`{m}`" + (" (points)" if _is_pct(m) else "") for m in metrics]
    return header, rows


QUESTION_METRICS = ("val_loss", "shakespeare_word_order/acc", "shakespeare_next_line/acc_norm", "shakespeare_cloze/acc",
                    "non_sink_fraction", "content_sink_set_change_rate")


def _layer_values(layers: list[dict], key: str, digits: int = 1) -> str:
    return "/".join("–" if lay.get(key) is None else f"{lay[key]:.{digits}f}" for lay in layers)


def value_norm_lines(results: dict[str, Any]) -> list[str]:
    """The value-norm findings, per layer (One-Token Fig. 3): sinks vs normal tokens in every model,
    and the extra sink vs the other tokens from the second layer on."""
    lines = []
    vn = [(v, v["summary"]["value_norm_layers"]) for v in results["variants"].values() if v["summary"].get("value_norm_layers")]
    if vn:
        parts = []
        for v, lay in vn:
            label, seeds = v["label"], lay["seeds"]
            # the pooled difference over the same seeds, for contrast
            sink_vn, normal_vn = _seed_scalars(v, "value_norm_sink"), _seed_scalars(v, "value_norm_normal")
            pooled = _mean_or_none([sink_vn[s] - normal_vn[s] for s in seeds if s in sink_vn and s in normal_vn])
            text = (f"{label}: per layer {_layer_values(lay['layers'], 'a')} vs {_layer_values(lay['layers'], 'b')} "
                    f"(sink above normal in {lay['positive_layers']} of {lay['compared_layers']} layers with sinks")
            if len(seeds) < len(results["seeds"]):
                text += f"; per-layer norms recorded for seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)} only"
            text += f"), mean over layers {lay['layer_mean']['verdict']}" if lay.get("layer_mean") else ")"
            if pooled is not None:
                text += f"; pooled over layers (weighted by sink counts), the same seeds: {signed(pooled)}"
            parts.append(text)
        lines.append("- **Do sinks carry smaller value vectors than normal tokens?** (value norm of sinks vs of "
                     "normal tokens, paired within layer and seed, mean over seeds per layer; then the unweighted mean "
                     "over layers of sink − normal, interval over seeds) " + "; ".join(parts) + ".")
    extra = [(v["label"], v["summary"]["extra_sink_layers"]) for v in results["variants"].values()
             if v["summary"].get("extra_sink_layers")]
    if extra:
        parts = []
        for label, e in extra:
            mass = "/".join("–" if m is None else _fmt_interval(m, 100.0, 1) for m in e["attention_mass"])
            text = f"{label}: attention on it per layer {mass} % (over seeds {', '.join(e['attention_mass_seeds'])})"
            vo = e.get("value_norm_vs_others")
            if vo:
                later = vo["layers"][vo["from_layer"]:]
                text += (f"; its value norm per layer from the second on {_layer_values(later, 'a')} vs the other "
                         f"tokens' {_layer_values(later, 'b')} (below in {vo['negative_layers']} of {vo['compared_layers']} "
                         f"layers; seed{'s' if len(vo['seeds']) > 1 else ''} {', '.join(vo['seeds'])})")
                if vo.get("layer_mean"):
                    text += f", mean over those layers {vo['layer_mean']['verdict']}"
            else:
                text += "; its value norm per layer was not recorded for these runs"
            parts.append(text)
        lines.append("- **Is the extra sink's value norm below the other tokens' from the second layer on "
                     "(One-Token Fig. 3)?** " + "; ".join(parts) + ".")
    return lines


def questions_list(results: dict[str, Any]) -> list[str]:
    """One line per compared pair: the question it asks and every headline metric's verdict."""
    from sinkdlm.experiment.presets import PAIR_QUESTIONS

    by_pair: dict[tuple[str, str], list[dict]] = {}
    for c in results["comparisons"]:
        by_pair.setdefault(tuple(c["pair"]), []).append(c)
    lines = []
    for pair, cs in by_pair.items():
        per = {c["metric"]: c for c in cs}
        said = [f"`{m}` {per[m]['verdict']}" for m in QUESTION_METRICS if m in per]
        if said:
            q = PAIR_QUESTIONS.get(pair, f"{cs[0]['variant']} vs {cs[0]['baseline']}?")
            lines.append(f"- **{q}** ({cs[0]['variant']} − {cs[0]['baseline']}) " + "; ".join(said) + ".")
    return lines + value_norm_lines(results)


def multiplicity_note(results: dict[str, Any]) -> str:
    """Which adjustment, over which family, and what survived it."""
    mult = results.get("multiplicity")
    if not mult:
        return ""
    left = mult["left_out"]
    const = results.get("constant_metrics") or []
    out = (f"Multiplicity: {mult['method']} at q = {100 * mult['q']:g} % over the family of {mult['size']} paired "
           f"comparisons in this report ({mult['family']}). Left out, because they are no tests: "
           f"{left['alternative definitions']} comparisons of alternative definitions (shown for reference), "
           f"{left['no variance estimate']} without a variance estimate"
           + (f" (metrics that cannot vary: {', '.join(f'`{m}`' for m in const)})" if const else "")
           + f", {left['one seed']} with one seed, {left['missing']} missing. "
           f"{mult['raw_excluding_zero']} of the {mult['size']} raw 95 % intervals exclude zero, where "
           f"{mult['expected_by_chance']:.1f} would by chance alone; {mult['survivors']} survive the adjustment")
    if mult.get("min_p_adjusted") is not None:
        out += f" (smallest adjusted p = {mult['min_p_adjusted']:.2g})"
    return out + (". A direction, and bold, only for those; the raw interval stays in every table. Without an "
                  "equivalence test (none was declared), an interval that includes zero means no difference "
                  "detected, not the same.")


def cost_line(results: dict[str, Any]) -> str:
    """What the experiment took, from results.json (`experiment_timing`)."""
    t = experiment_timing(results)
    parts = "+".join(t.get("compute_parts", ["train", "eval", "analysis"]))
    minutes = lambda sec: f"{sec / 60:.0f}" if sec >= 6000 else f"{sec / 60:.1f}"  # noqa: E731
    text = f"Compute: {minutes(t['compute_s'])} min ({parts}) summed over the {t['runs']} runs"
    rs = t.get("run_train_s") or {}
    if rs.get("median") is not None:
        text += f" (training {rs['min']:.0f}-{rs['max']:.0f} s per run, median {rs['median']:.0f} s)"
    if t.get("elapsed_s") is not None:
        text += f"; elapsed since the first start {minutes(t['elapsed_s'])} min"
    return text + (f". {t['note'][0].upper()}{t['note'][1:]}" if t.get("note") else "") + "."


def markdown_summary(results: dict[str, Any]) -> str:
    """The README's tables for one experiment, generated from its results.json only."""
    t = results["train"]
    n = len(results["seeds"])
    tasks = _task_metrics(results)
    headline = ["val_loss"] + [m for m in tasks if m.endswith(("word_order/acc", "cloze/acc", "next_line/acc_norm", "/exact_match"))
                               and "cloze/exact" not in m]
    parts = [
        f"Preset `{results['preset']}`: {results['description']}. {t.get('max_steps')} steps × {t.get('batch_size')} × "
        f"{t.get('seq_len')} tokens per run, seeds {results['seeds']} ({results['machine'].get('cpu_count')} CPU cores"
        f"{' + CUDA' if results['machine'].get('cuda') else ''}). {cost_line(results)} "
        f"Mean [95 % CI]: validation loss over the {n} seeds (Student t); accuracies over seeds and items "
        "(two-way random effects, so the CI says whether an accuracy is above chance).",
        "",
        _md_table(*results_table(results)),
    ]
    chance_lines = []
    for m in tasks:
        chance = task_chance(m)
        if chance is None:
            continue
        above = [v["label"] for v in results["variants"].values() if v["summary"].get(m, {}).get("above_chance")]
        chance_lines.append(f"`{m}`: {len(above)} of {len(results['variants'])} variants above chance "
                            f"({100 * chance:.0f} %)" + (f" ({', '.join(above)})" if above else ""))
    if chance_lines:
        parts += ["", "Above chance (the 95 % CI's lower end above the chance accuracy; one test per variant and task, "
                  "not adjusted): " + "; ".join(chance_lines) + "."]
    pivot = pivot_comparisons(results, headline)
    if pivot:
        parts += ["", "Paired differences, Δ [raw 95 % CI] (validation loss: t over seeds; accuracies: over seeds and "
                  "items; a direction in bold only where the comparison survives the Benjamini-Hochberg adjustment "
                  "below):", "", _md_table(*pivot)]
    questions = questions_list(results)
    if questions:
        parts += ["", "What held and what did not (a direction only where the comparison survives the adjustment):",
                  "", *questions, "", multiplicity_note(results)]
    sinks = sinks_table(results)
    if sinks:
        parts += ["", "Attention sinks (ϵ = 3, every seed's model, mean [95 % CI] over seeds; shares kept in [0, 1]):",
                  "", _md_table(*sinks)]
        pivot = pivot_comparisons(results, ["non_sink_fraction", "content_sink_set_change_rate", "content_sink_set_jaccard"])
        if pivot:
            parts += ["", _md_table(*pivot)]
    return "\n".join(parts) + "\n"


# ----------------------------------------------------------------------------- the report
def write_report(results: dict[str, Any], out: Path) -> tuple[Path, Path]:
    from sinkdlm.analysis.figures import plot_score_bars, plot_training_curves

    out = Path(out)
    fig_dir = out / "figures"
    variants = results["variants"]
    doc = Document(f"sinkdlm experiment `{results['preset']}`")
    m = results["machine"]
    doc.paragraph(
        f"{results['description']}. Seeds {results['seeds']}; every variant trained with the same budget "
        f"({results['train'].get('max_steps')} steps × {results['train'].get('batch_size')} sequences × "
        f"{results['train'].get('seq_len')} tokens on `{results['train'].get('data', 'shakespeare')}`) and the same "
        f"seeds, so the comparisons are paired. Machine: {m['processor']}, {m['cpu_count']} cores, torch {m['torch']}, "
        f"CUDA {'yes' if m['cuda'] else 'no'}. {cost_line(results)}"
    )
    doc.heading("Results (mean [95 % CI])")
    doc.table(*results_table(results))
    doc.paragraph(f"`val_loss` is the validation ELBO bound per token (lower is better), its interval {METHOD_SEEDS}; "
                  f"task metrics are accuracies in %, their intervals over {METHOD_ITEMS}, so they count which items "
                  "were drawn as well as which models training produced. \"(no spread)\": every seed and item alike, no "
                  "interval.")

    doc.heading("Paired comparisons")
    doc.paragraph(
        f"Each difference is paired: over seeds (validation loss, sink metrics: {METHOD_SEEDS}) or over seeds and "
        f"items (accuracies: {METHOD_ITEMS}). A direction is stated only when the comparison survives the "
        "Benjamini-Hochberg adjustment over the report's family of paired comparisons; the raw 95 % interval is "
        "shown either way. No equivalence margin was declared, so an interval that includes zero says no difference "
        "was detected, not that there is none."
    )
    header, rows = comparisons_table(results)
    doc.table(header, rows) if rows else doc.paragraph("Only one variant: nothing to compare.")
    note = multiplicity_note(results)
    if note:
        doc.paragraph(note)

    curves = {}
    for v in variants.values():
        per_seed = [dict(map(tuple, s["curve"])) for s in v["seeds"].values() if s.get("curve")]
        steps = sorted(set.intersection(*(set(c) for c in per_seed))) if per_seed else []
        if steps:
            means = [statistics.fmean(c[s] for c in per_seed) for s in steps]
            stds = [statistics.stdev([c[s] for c in per_seed]) if len(per_seed) > 1 else 0.0 for s in steps]
            curves[v["label"]] = (steps, means, stds)
    if curves:
        doc.heading("Training")
        doc.image(plot_training_curves(curves, fig_dir / "val_loss.png"), "Validation loss vs step (mean ± std over seeds)")
    task_metrics = _task_metrics(results)
    bars = {}
    for k in task_metrics:
        per = {}
        for v in variants.values():
            s = v["summary"].get(k)
            if s and s.get("mean") is not None:  # the interval as reported (clipped to [0, 1]: asymmetric)
                has = s.get("low") is not None and s.get("high") is not None
                per[v["label"]] = (s["mean"], s["low"], s["high"]) if has else (s["mean"], 0.0)
        if per:
            bars[k] = per
    if bars:
        doc.image(plot_score_bars(bars, fig_dir / "scores.png", ylabel="accuracy"), "Task scores (mean and 95 % CI over seeds and items, clipped to [0, 1])")

    _analysis_section(doc, results)
    doc.heading("Files")
    doc.bullets([
        "`results.json`: every number above, per seed (analysis summaries and per-item outcomes included)",
        "`runs/<variant>-s<seed>/train/metrics.jsonl`: training curves",
        "`runs/<variant>-s<seed>/eval.json`: task scores with per-item outcomes",
        "`runs/<variant>-s<seed>/analysis/`: per-model sink analysis", "`compare/report.html`: analyses side by side",
    ])
    return doc.write(out)


def _analysis_section(doc: Document, results: dict[str, Any]) -> None:
    sinks = sinks_table(results)
    if sinks is None:
        return
    eps = results.get("analysis_settings", {}).get("epsilon", 3.0)
    doc.heading(f"Attention sinks (ϵ = {eps}; mean [95 % CI] over the analysed seeds, shares kept in [0, 1])")
    doc.table(*sinks)
    doc.paragraph("Moving sinks are compared over the content keys: the extra sink's key is a sink at nearly every "
                  "step and would count as overlap for the sink models only (docs/method.md §6). The definition "
                  "over every key is kept beside it as the alternative.")
    header, rows = comparisons_table(results, set(ANALYSIS_METRICS))
    if rows:
        doc.table(header, rows)
    lines = value_norm_lines(results)
    if lines:
        doc.heading("Value norms per layer (One-Token Fig. 3)", 3)
        doc.paragraph("Pooling over layers weights each layer by its number of sinks and can flip the sign, so sinks "
                      "and normal tokens are compared within each layer and seed, and summarised by the unweighted "
                      "mean over layers.")
        doc.bullets([line.removeprefix("- ") for line in lines])
    eps_t = epsilon_table(results)
    if eps_t:
        doc.heading("Non-sink fraction vs ϵ (Rulli et al. Fig. 10)", 3)
        doc.table(*eps_t)
    types = token_type_table(results)
    if types:
        doc.heading("What the sinks sit on (Rulli et al. Table 2)", 3)
        doc.table(*types)
    abl_rows = []
    for v in results["variants"].values():
        first = next(iter(v["seeds"].values()))
        abl = (first.get("analysis") or {}).get("ablation")
        if abl and abl.get("scores"):
            abl_rows.append([v["label"], f"`{abl.get('metric')}` ({abl.get('protocol')})",
                             ", ".join(f"K={k}: {s:.3f}" for k, s in abl["scores"].items() if isinstance(s, (int, float)))])
    if abl_rows:
        doc.heading("Sink-masking ablation (first seed)", 3)
        doc.table(["variant", "score (protocol)", "score by K"], abl_rows)
    for v in results["variants"].values():
        first = next(iter(v["seeds"].values()))
        adir = first.get("analysis_dir")
        if not adir or not (Path(adir) / "analysis.json").is_file():
            continue
        figures = json.loads((Path(adir) / "analysis.json").read_text()).get("figures", {})
        names = figures.values() if isinstance(figures, dict) else figures
        for name in names:
            doc.image(Path(adir) / name, f"{v['label']}: {Path(name).stem.replace('_', ' ')}")


def regenerate(experiment_dir: str | Path, pairs: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """Rebuild a finished experiment's results.json, report.md and report.html from its stored records,
    with the current statistics: the per-seed records in results.json, refreshed from every
    `runs/<variant>-s<seed>/analysis/analysis.json` that is still there (so fields added to
    `analysis_record` since, such as the per-layer value norms, are filled where the stored analysis
    holds them). Nothing is re-run. The preset's pairs are kept unless `pairs` is given."""
    out = Path(experiment_dir)
    results = json.loads((out / "results.json").read_text())
    refreshed = 0
    for name, v in results["variants"].items():
        for seed, rec in v["seeds"].items():
            stored = out / "runs" / f"{name}-s{seed}" / "analysis" / "analysis.json"
            if stored.is_file():
                rec["analysis"] = analysis_record(json.loads(stored.read_text()))
                refreshed += 1
    results["timing"] = experiment_timing(results)
    results["regenerated"] = {"analysis_records_refreshed": refreshed,
                              "note": "statistics recomputed from the stored per-seed records; no model was re-run"}
    summarise(results, pairs or [tuple(p) for p in results.get("comparison_pairs", [])] or None)
    from sinkdlm.atomic import atomic_write_json

    atomic_write_json(out / "results.json", results)
    write_report(results, out)
    return results
