"""The quantization endpoint over a study (docs/method.md §16): results.json's `quant`, from the per-run records alone.

* `arms`: per arm and scheme, the mean Δ_quant over seeds with its Student t interval (each run's Δ is already
  paired: the quantized and unquantized model on the same masked inputs), and per layer the mean FFN ∞-norm with
  its interval (and of its largest layer);
* `primary`: the declared pair's paired difference of Δ_quant under the declared scheme, by seed: the exact
  Wilcoxon signed-rank test with its Hodges-Lehmann estimate and interval (`stats.rank_test`, as the declared
  primary endpoint tests it), the paired t interval beside it (`stats.paired_difference`), tested once at 5 %;
  `decided` (a direction may be said) only where the Wilcoxon test rejects, its interval excludes 0, every
  declared seed is in and the differences have a spread (a zero variance is no evidence); `mde`, the paired t
  test's minimum detectable effect from the study's own spread (80 % power, two-sided 5 %), beside `sized_for`
  (the effect the seeds were sized for, declared with the study); `inconclusive` where nothing was decided and
  `endpoints.detection.inconclusive` says so (the MDE above `sized_for`, either unknown, or a zero variance),
  where the rank test rejected without a decision, or where the study is interim; else "no difference detected";
* `secondary`: one Benjamini-Hochberg family: the secondary pairs' Δ_quant under the declared scheme, every
  pair's Δ_quant under each other scheme, and every pair's difference of the largest FFN ∞-norm; each a paired
  t test over seeds, its interval at the false-coverage-adjusted level 1 − R α / m (Benjamini & Yekutieli 2005:
  R of the m tests rejected), and `survives` only where the adjusted p is below α and that interval excludes 0;
  its `mde` at that adjusted level, and a test that does not survive worded by the same rule (an ∞-norm
  difference was sized for nothing, so it is inconclusive);
* `outliers`: whether any run has an FFN outlier channel (> 6 σ), the fallback answer's premise (§16).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sinkdlm.experiment.endpoints.detection import differences_mde, inconclusive, null_words
from sinkdlm.stats import MDE_POWER, Interval, benjamini_hochberg, mean_interval, paired_difference, rank_test, verdict


def _runs(results: dict[str, Any], name: str) -> dict[str, dict[str, Any]]:
    """{seed: the run's quant record} of arm `name` (the runs that have one)."""
    return {s: r["quant"] for s, r in results["variants"].get(name, {}).get("seeds", {}).items() if r.get("quant")}


def _metric(runs: dict[str, dict[str, Any]], metric: str) -> dict[str, float]:
    """{seed: value}: `delta:<scheme>` (Δ_quant) or `ffn_inf_norm_max`, over the runs that recorded it."""
    if metric.startswith("delta:"):
        scheme = metric.split(":", 1)[1]
        return {s: r["schemes"][scheme]["delta"] for s, r in runs.items() if scheme in r["schemes"]}
    return {s: r[metric] for s, r in runs.items() if r.get(metric) is not None}


def _interval(values: list[float], confidence: float) -> dict[str, Any]:
    if len(values) >= 2:
        return mean_interval(values, confidence).to_dict()
    return {"mean": float(values[0]) if values else None, "low": None, "high": None, "n": len(values)}


def _arm(runs: dict[str, dict[str, Any]], schemes: list[str], confidence: float) -> dict[str, Any]:
    """One arm: per scheme its Δ_quant over seeds; its FFN ∞-norm per layer and at its largest layer."""
    out: dict[str, Any] = {"seeds": sorted(runs, key=int), "schemes": {}}
    for scheme in schemes:
        d = _metric(runs, f"delta:{scheme}")
        out["schemes"][scheme] = {**_interval(list(d.values()), confidence), "per_seed": d}
    for key in ("ffn_inf_norm", "ffn_inf_norm_content", "ffn_inf_norm_sink"):  # every position; content; sink rows
        layers = [r[key] for r in runs.values() if r.get(key) is not None]
        out[key] = [_interval([x[i] for x in layers], confidence) for i in range(len(layers[0]))] if layers else []
    out["ffn_inf_norm_max"] = _interval(list(_metric(runs, "ffn_inf_norm_max").values()), confidence)
    content = {s: max(r["ffn_inf_norm_content"]) for s, r in runs.items() if r.get("ffn_inf_norm_content")}
    out["ffn_inf_norm_content_max"] = _interval(list(content.values()), confidence)
    out["ffn_outlier_channels"] = {s: r.get("ffn_outlier_channels", 0) for s, r in runs.items()}
    return out


def _paired(a: dict[str, float], b: dict[str, float], confidence: float) -> tuple[dict[str, float], Interval | None]:
    """The per-seed differences a − b over the seeds both have, and their paired t interval (None: no seed)."""
    common = sorted(set(a) & set(b), key=int)
    d = {s: a[s] - b[s] for s in common}
    return d, (paired_difference([a[s] for s in common], [b[s] for s in common], confidence) if common else None)


def _primary(results: dict[str, Any], declared: dict[str, Any], confidence: float, complete: bool) -> dict[str, Any]:

    a_name, b_name = declared["pair"]
    scheme = declared["primary_scheme"]
    out: dict[str, Any] = {"pair": [a_name, b_name], "scheme": scheme, "test": "wilcoxon",
                           "sized_for": declared.get("sized_for")}
    if a_name not in results["variants"] or b_name not in results["variants"]:
        return {**out, "missing": "a variant of the declared pair was not run"}
    metric = f"delta:{scheme}"
    d, t = _paired(_metric(_runs(results, a_name), metric), _metric(_runs(results, b_name), metric), confidence)
    if not d:
        return {**out, "missing": "no seed has both runs scored quantized"}
    rank = rank_test(list(d.values()), "wilcoxon", confidence)
    alpha = 1 - confidence
    rejects = rank["p"] is not None and rank["p"] < alpha
    excludes = rank["low"] is not None and (rank["low"] > 0 or rank["high"] < 0)
    values = list(d.values())
    # a zero spread (every seed's difference alike) is no evidence, whatever the rank test says (docs/method.md §7)
    decided = bool(rejects and excludes and complete and not t.degenerate)
    mde = differences_mde(values, alpha, t.degenerate)
    return {**out, "seeds": len(d), "per_seed": d, "rank": rank, "t": t.to_dict(), "rejects": bool(rejects),
            "t_rejects": bool(t.p is not None and t.p < alpha and not t.degenerate),
            "decided": decided, "degenerate": bool(t.degenerate),
            "spread": float(np.std(values, ddof=1)) if len(values) >= 2 else None,
            "mde": mde, "mde_power": MDE_POWER, "mde_alpha": alpha,
            # not decided: "no difference detected" only where the MDE is at or below the effect the seeds were
            # sized for (endpoints.detection), every declared seed is in and the rank test rejected nothing
            "inconclusive": not decided and (not complete or rejects
                                             or inconclusive(mde, out["sized_for"], degenerate=t.degenerate))}


def _family_words(e: dict[str, Any], adj: Interval, complete: bool, sized_for: float | None) -> str:
    """A secondary test's sentence: a direction only where it survives (`stats.verdict` at the adjusted level); an
    interim study none; else `endpoints.detection.null_words` with the MDE at the adjusted level (sized for the
    declared difference of Δ_quant in nats; an ∞-norm difference was sized for nothing)."""
    if e["survives"]:
        return verdict(adj, lower_is_better=None, p_adjusted=e["p_adjusted"])
    if not complete:
        return "inconclusive (interim)"
    unit = "nats" if e["metric"].startswith("delta:") else ""  # an ∞-norm in the activations' own units
    level = f"at the adjusted level {100 * e['adjusted']['confidence']:.3g} %"
    return null_words(e["mde"], sized_for if e["metric"].startswith("delta:") else None, unit,
                      degenerate=adj.degenerate, seeds=adj.n, level=level)


def _family(results: dict[str, Any], declared: dict[str, Any], confidence: float, complete: bool) -> list[dict[str, Any]]:
    """The secondary family (module docstring), each test's adjusted p, interval, MDE and verdict."""
    primary_pair, scheme = list(declared["pair"]), declared["primary_scheme"]
    pairs = [list(p) for p in (primary_pair, *declared.get("secondary", []))
             if p[0] in results["variants"] and p[1] in results["variants"]]
    wanted = [(p, f"delta:{scheme}") for p in pairs if p != primary_pair]
    wanted += [(p, f"delta:{s}") for s in declared["schemes"] if s != scheme for p in pairs]
    wanted += [(p, "ffn_inf_norm_max") for p in pairs]
    tests = []
    for pair, metric in wanted:
        a, b = (_metric(_runs(results, n), metric) for n in pair)
        d, t = _paired(a, b, confidence)
        if t is not None:
            tests.append({"pair": pair, "metric": metric, "per_seed": d, "_t": t, **t.to_dict()})
    family = [e for e in tests if e["p"] is not None and e["n"] >= 2]
    alpha = 1 - confidence
    adjusted = benjamini_hochberg([e["p"] for e in family])
    rejected = sum(q < alpha for q in adjusted)
    level = 1 - alpha * max(rejected, 1) / max(len(family), 1)  # the false-coverage-adjusted level (BY 2005)
    for e, q in zip(family, adjusted):
        e["p_adjusted"] = q
    in_family = {id(e) for e in family}
    for e in tests:
        a, b = (_metric(_runs(results, n), e["metric"]) for n in e["pair"])
        at = level if id(e) in in_family else confidence
        _, adj = _paired(a, b, at)
        e["adjusted"] = {**adj.to_dict(), "confidence": at}
        e.setdefault("p_adjusted", None)
        e["survives"] = bool(complete and e["p_adjusted"] is not None and e["p_adjusted"] < alpha
                             and adj.excludes_zero)
        # the paired t test's MDE at the level its interval is given at (80 % power)
        e["mde"] = differences_mde(list(e["per_seed"].values()), 1 - at, adj.degenerate)
        e["inconclusive"] = not e["survives"] and (not complete or inconclusive(
            e["mde"], declared.get("sized_for") if e["metric"].startswith("delta:") else None,
            degenerate=adj.degenerate))
        e["verdict"] = _family_words(e, adj, complete, declared.get("sized_for"))
        del e["_t"]
    return tests


def quant_summary(results: dict[str, Any], confidence: float = 0.95,
                  seeds_declared: list[int] | None = None) -> dict[str, Any] | None:
    """results.json's `quant` (see the module docstring); None where the preset declared no quantization endpoint.
    `seeds_declared`: the study's declared seeds (kept from an earlier summary, else the preset's, else the seeds in
    results.json)."""
    declared = (results.get("declared") or {}).get("quantization")
    if not declared:
        return None
    if seeds_declared is None:
        seeds_declared = (results.get("quant") or {}).get("seeds_declared")
    if seeds_declared is None:
        from sinkdlm.experiment.presets import PRESETS

        preset = PRESETS.get(results.get("preset", ""))
        seeds_declared = list(preset().seeds) if preset else list(results.get("seeds") or [])
    arms = {n: _arm(_runs(results, n), list(declared["schemes"]), confidence)
            for n in results["variants"] if _runs(results, n)}
    seeds_in = sorted(set.intersection(*(set(map(int, a["seeds"])) for a in arms.values()))) if arms else []
    complete = set(map(int, seeds_declared)) <= set(seeds_in) and all(
        p in arms for pair in (declared["pair"], *declared.get("secondary", [])) for p in pair)
    runs = [r for n in arms for r in _runs(results, n).values()]
    return {"arms": arms, "primary": _primary(results, declared, confidence, complete),
            "secondary": _family(results, declared, confidence, complete),
            "outliers": {"runs": len(runs), "with_ffn_outlier_channels": sum(r["ffn_outlier_channels"] > 0 for r in runs)},
            "schemes": list(declared["schemes"]), "seeds_declared": list(map(int, seeds_declared)),
            "seeds_in": seeds_in, "complete": complete, "confidence": confidence,
            "adjustment": {"primary": "none (declared, tested once at 5 %)",
                           "secondary": "Benjamini-Hochberg; intervals at the false-coverage-adjusted level"}}
