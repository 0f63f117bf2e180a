"""The numbers of the attention-sink analysis over a study (docs/method.md §6): a run's analysis record, and over
seeds the value norms per layer (One-Token Fig. 3), the extra sink per layer, the sink-masking curve (Rulli et al.
Table 1) and the intervals the tables show beside the stored summary (extra-sink mass, non-sink fraction per ϵ,
sink token types).

`analysis_record` is what results.json keeps of each run's analysis.json; `variant_summary` adds the per-layer
comparisons and the masking curve to a variant's `summary` (results.json) and returns the ones that join the
report's multiplicity family. The interval functions below it recompute, from the per-seed records on demand,
quantities results.json does not store, so a regenerated report shows them for older results too. Nothing here
formats a number for display (`endpoints.sinks.tables` does); the verdicts (`stats.verdict`) are stored data.
"""

from __future__ import annotations

import math
import re
import statistics
from typing import Any

from sinkdlm.experiment.metrics import METHOD_SEEDS, has_extra_sinks, seed_scalars
from sinkdlm.stats import benjamini_hochberg, mean_interval, paired_accuracy_difference, paired_difference, verdict

# What results.json keeps of each scored setting of the masking ablation: the per-request scores give
# the interval over seeds × prompts, the masked-key counts say how many keys "top-K" really hid.
ABLATION_KEYS = ("include_extra_sink", "scores", "delta", "stderr", "delta_stderr", "masked_keys_per_head", "per_request")
METHOD_SEEDS_PROMPTS = "seeds × prompts (two-way random effects, t with n − 1 df)"


_PIECE = re.compile(r"\w+|[^\w ]")  # words, and every other character but the space (newlines, commas) alone


def repetition_rate(text: str) -> float | None:
    """Share of a generation's pieces (words, punctuation, newlines) that repeat an earlier piece:
    1 - distinct / total (None for an empty text). "\n\n\nThe\n\n..." and ",,,,," score near 1."""
    pieces = _PIECE.findall(text)
    return 1.0 - len(set(pieces)) / len(pieces) if pieces else None


def analysis_record(a: dict[str, Any]) -> dict[str, Any]:
    """The per-seed analysis numbers results.json keeps (self-contained: no need to open analysis.json)."""
    moving = a.get("moving", {}).get("mean", {})
    vn = a.get("value_norm", {})
    extra = a.get("extra_sink")
    abl = a.get("ablation")
    samples = [x for x in a.get("samples") or [] if isinstance(x, str)]
    rates = [r for r in map(repetition_rate, samples) if r is not None]
    setup = a.get("setup") or {}
    prompt = (setup.get("prompt_tokens") or {}).get("mean")
    return {
        # the keys a query attends to (prompt + generation + extra sinks): 1/keys is a uniformly attended key's
        # share, the yardstick of every attention share (docs/method.md §6)
        "keys_per_sequence": None if prompt is None or setup.get("gen_length") is None
        else prompt + setup["gen_length"] + (extra or {}).get("num_sink_tokens", 0),
        "non_sink_fraction": a.get("non_sink_fraction"),
        "non_sink_fraction_by_epsilon": a.get("non_sink_fraction_by_epsilon"),
        "moving": dict(moving),
        # the moving-sink rates layer by layer (does a sink added late take over in some layers only?)
        "moving_per_layer": {k: list(v) for k, v in (a.get("moving") or {}).items() if isinstance(v, list)},
        # per layer too: pooling over layers weights each layer by its sink count and can flip the sign
        "value_norm": {k: vn.get(k) for k in ("sink_mean", "normal_mean", "sink_count", "normal_count", "per_layer")},
        "extra_sink": None if not extra else {k: extra.get(k) for k in (
            "mean_attention_mass", "attention_mass", "value_norm", "others_value_norm")},
        "sink_token_types": (a.get("sink_token_types") or {}).get("shares"),
        "ablation": None if not abl else {**{k: abl.get(k) for k in ABLATION_KEYS + ("metric", "protocol", "num_requests")},
                                          "alternative": None if not abl.get("alternative") else {
                                              k: abl["alternative"].get(k) for k in ABLATION_KEYS}},
        # the generations themselves (the report shows them) and how degenerate they are
        "samples": list(samples),
        "repetition_rate": statistics.fmean(rates) if rates else None,
    }


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
    # Per layer, a direction only where the layer's paired interval survives Benjamini-Hochberg over the
    # layers compared (its own family, as the analysis over prompts does; docs/method.md §6-7).
    tested = [lay for lay in shown if lay["diff"].get("p") is not None and lay["seeds"] >= 2]
    for lay, q in zip(tested, benjamini_hochberg([lay["diff"]["p"] for lay in tested])):
        lay["diff"]["p_adjusted"] = q
        lay["diff"]["survives"] = bool(q < 0.05 and lay["diff"]["excludes_zero"])
    return {"from_layer": from_layer, "seeds": seeds, "layers": layers, "layer_mean": summary,
            "positive_layers": sum(lay["diff"]["mean"] > 0 for lay in shown),
            "negative_layers": sum(lay["diff"]["mean"] < 0 for lay in shown), "compared_layers": len(shown),
            "per_layer_tests": {
                "tested": len(tested), "family": "the layers compared (Benjamini-Hochberg, q = 0.05)",
                "lower": [lay["layer"] for lay in tested if lay["diff"]["survives"] and lay["diff"]["mean"] < 0],
                "higher": [lay["layer"] for lay in tested if lay["diff"]["survives"] and lay["diff"]["mean"] > 0]}}


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


def _ablation_setting(rec: dict[str, Any], include_extra_sink: bool | None) -> dict[str, Any] | None:
    """One seed's scored setting of the masking ablation (the headline or its `alternative`), or None;
    `include_extra_sink` None: the headline (a model without extra sinks has one setting only)."""
    abl = (rec.get("analysis") or {}).get("ablation")
    if not abl:
        return None
    for block in (abl, abl.get("alternative")):
        if block and block.get("delta") and (include_extra_sink is None
                                             or bool(block.get("include_extra_sink")) == include_extra_sink):
            return block
    return None


def masking_intervals(variant: dict[str, Any], confidence: float = 0.95) -> dict[str, Any] | None:
    """The sink-masking curve of a variant (Rulli et al. Table 1) with intervals: per scored setting of
    the extra sink (kept; and masked, for a variant with extra sink tokens) and per K > 0, Δ = score(K) −
    score(0) paired over seeds × prompts (every seed scores the same held-out requests: two-way random
    effects, `paired_accuracy_difference`), and the keys masked per (row, layer, head) with their
    interval over seeds. A setting no seed scored is `measured: False` ("not measured in this run");
    seeds without per-request scores leave the interval `missing`. None when no seed ran the ablation."""
    recs = [rec for rec in variant["seeds"].values() if (rec.get("analysis") or {}).get("ablation")]
    if not recs:
        return None
    first = recs[0]["analysis"]["ablation"]
    settings = [False, True] if has_extra_sinks(variant) else [None]
    out = {"metric": first.get("metric"), "settings": []}
    # the analysed seeds (a preset may analyse the first seed only): the others have no curve to pair
    seeds = sorted((s for s, rec in variant["seeds"].items() if (rec.get("analysis") or {}).get("ablation")), key=str)
    for include in settings:
        blocks = {seed: _ablation_setting(variant["seeds"][seed], include) for seed in seeds}
        entry: dict[str, Any] = {"include_extra_sink": bool(include), "measured": any(blocks.values()), "k": {}}
        if entry["measured"]:
            ks = sorted({int(k) for b in blocks.values() if b for k in b["delta"]} - {0})
            for k in ks:
                key = str(k)
                masked = [b["masked_keys_per_head"][key] for b in blocks.values()
                          if b and (b.get("masked_keys_per_head") or {}).get(key) is not None]
                row: dict[str, Any] = {"masked_keys_per_head": interval_of(masked), "seeds": len(masked)}
                per = {s: (b or {}).get("per_request") for s, b in blocks.items()}
                if all(p and key in p and "0" in p for p in per.values()) and len({len(p[key]) for p in per.values()}) == 1:
                    iv = paired_accuracy_difference({s: p[key] for s, p in per.items()}, {s: p["0"] for s, p in per.items()},
                                                    confidence)
                    row["delta"] = {**iv.to_dict(), "method_label": METHOD_SEEDS_PROMPTS, "lower_is_better": False,
                                    "scale": 1.0, "unit": "",
                                    "verdict": verdict(iv, lower_is_better=False)}
                else:
                    gone = [s for s, p in per.items() if not (p and key in p)]
                    means = [b["delta"][key] for b in blocks.values() if b and b["delta"].get(key) is not None]
                    row["delta"] = {"mean": _mean_or_none(means), "seeds": len(means),
                                    "missing": gone or seeds, "verdict": "missing: per-request scores not recorded "
                                    "for these runs (no interval over seeds × prompts)"}
                entry["k"][key] = row
        out["settings"].append(entry)
    return out


def variant_summary(v: dict[str, Any], summary: dict[str, Any], confidence: float = 0.95) -> list[dict[str, Any]]:
    """Add the sink analysis to one variant's `summary`: the value norms per layer, pooled and of the step-0
    control, the masking curve and the extra sink per layer; returns the comparisons that join the report's
    multiplicity family (the means over layers and each K of the masking curve against K = 0)."""
    family: list[dict[str, Any]] = []
    # Do sinks carry smaller values than normal tokens (One-Token Fig. 3)? Paired within layer and seed.
    layers = value_norm_layers(v)
    if layers:
        summary["value_norm_layers"] = layers
        if layers["layer_mean"]:
            family.append(layers["layer_mean"])
    # The pooled difference, kept for contrast: it weights each layer by its number of sinks.
    sink_vn, normal_vn = seed_scalars(v, "value_norm_sink"), seed_scalars(v, "value_norm_normal")
    if sink_vn and set(sink_vn) == set(normal_vn):
        iv = paired_difference(sink_vn, normal_vn, confidence)
        summary["value_norm_sink_minus_normal_pooled"] = {**iv.to_dict(), "method_label": METHOD_SEEDS,
                                                          "verdict": verdict(iv, lower_is_better=None)}
    if (v.get("step0") or {}).get("analysis"):  # the converted model before training: one model, no interval
        step0 = {"seeds": {"step0": v["step0"]}}
        summary["step0_value_norm_layers"] = value_norm_layers(step0)
        summary["step0_extra_sink_layers"] = extra_sink_layers(step0)
    masking = masking_intervals(v, confidence)
    if masking:
        summary["masking"] = masking
        family += [row["delta"] for setting in masking["settings"] for row in setting["k"].values()
                   if not row["delta"].get("missing")]
    extra = extra_sink_layers(v)
    if extra:
        summary["extra_sink_layers"] = extra
        if extra["value_norm_vs_others"] and extra["value_norm_vs_others"]["layer_mean"]:
            family.append(extra["value_norm_vs_others"]["layer_mean"])
    return family


SINK_TOKEN_TYPES = ("mask", "whitespace", "punctuation", "other", "sink")  # Rulli et al. Table 2's columns


def interval_of(values: list, share: bool = False) -> dict | None:
    """mean [95 % CI] over seeds of the finite values (None when there are none); a share's stays in [0, 1]."""
    vals = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return mean_interval(vals, bounds=(0.0, 1.0) if share else None).to_dict() if vals else None


def seed_interval(variant: dict[str, Any], get, share: bool = False) -> dict | None:
    """mean [95 % CI] over seeds of `get(analysis record)` (the seeds that have a value; None with fewer
    than 2): a per-seed analysis number the stored summary does not hold."""
    values = [get(rec["analysis"]) for rec in variant["seeds"].values() if rec.get("analysis")]
    values = [v for v in values if v is not None]
    return interval_of(values, share) if len(values) >= 2 else None


def extra_sink_mass(variant: dict[str, Any]) -> dict | None:
    """The share of attention on the extra sink (all layers), mean [95 % CI] over the seeds that recorded it."""
    extra = [rec.get("analysis", {}).get("extra_sink") for rec in variant["seeds"].values()]
    return interval_of([e["mean_attention_mass"] for e in extra if e and e.get("mean_attention_mass") is not None],
                       share=True)


def uniform_share(variant: dict[str, Any]) -> float | None:
    """1/keys, the attention share of one key under uniform attention, averaged over the analysed seeds (their
    mean keys per sequence): what an attention share of a single token is read against."""
    keys = [rec["analysis"]["keys_per_sequence"] for rec in variant["seeds"].values()
            if (rec.get("analysis") or {}).get("keys_per_sequence")]
    return statistics.fmean(1 / k for k in keys) if keys else None


def step0_analysis(variant: dict[str, Any]) -> dict[str, Any] | None:
    """The step-0 control's analysis where it stands for every seed: a control shared by all seeds, or a study of
    one seed. Per-seed controls keep one analysis in results.json, so one seed's would stand for all: None."""
    step0 = variant.get("step0") or {}
    if not step0.get("analysis") or (step0.get("per_seed") and len(variant["seeds"]) > 1):
        return None
    return step0["analysis"]


def _recorded(variant: dict[str, Any], key: str) -> list:
    """`key` of each seed's analysis record, for the seeds that recorded it."""
    return [rec["analysis"][key] for rec in variant["seeds"].values() if rec.get("analysis") and rec["analysis"].get(key)]


def epsilon_intervals(variant: dict[str, Any], keys: list[str] | None = None) -> dict[str, dict | None] | None:
    """Rulli et al. Fig. 10: the non-sink fraction at each ϵ (`keys`, default: the first seed's, ascending),
    mean [95 % CI] over seeds; None when no seed recorded the curve."""
    curves = _recorded(variant, "non_sink_fraction_by_epsilon")
    if not curves:
        return None
    keys = keys or sorted(curves[0], key=float)
    return {e: interval_of([c.get(e) for c in curves], share=True) for e in keys}


def token_type_intervals(variant: dict[str, Any]) -> dict[str, dict | None] | None:
    """Rulli et al. Table 2: the share of sinks on each of `SINK_TOKEN_TYPES`, mean [95 % CI] over seeds."""
    shares = _recorded(variant, "sink_token_types")
    if not shares:
        return None
    return {t: interval_of([s.get(t, 0.0) for s in shares], share=True) for t in SINK_TOKEN_TYPES}


def pooled_value_norm_difference(variant: dict[str, Any], seeds: list[str]) -> float | None:
    """Sink − normal value norm pooled over layers (weighted by sink counts), mean over `seeds`: the
    contrast to the per-layer comparison (docs/method.md §6)."""
    sink_vn, normal_vn = seed_scalars(variant, "value_norm_sink"), seed_scalars(variant, "value_norm_normal")
    return _mean_or_none([sink_vn[s] - normal_vn[s] for s in seeds if s in sink_vn and s in normal_vn])

