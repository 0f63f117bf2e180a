"""The escape endpoint over a study (docs/method.md §11): results.json's `escape`, from the per-run records.

`escape/probe.py` measures each run (its probes, escape step, sink onset: the runner stores them per run as
`escape`); this module computes everything the report says about the study from those records alone, so
`regenerate` rebuilds it from results.json:

* `tests`: the declared primary pair's censored exact sign test of the log2 ratio of escape steps (tested once at
  5 %), then the secondary pairs' (Bonferroni over the secondaries: their interval at 1 - α/m, p times m), each
  with the exact coverage of its order-statistic interval, the sign test's MDE at the observed spread and a
  `decided` flag (a direction only when the adjusted test rejects and the interval excludes 0, and only once
  the declared seeds are in);
* `km`: per arm, the Kaplan-Meier estimate of the fraction of runs still on the plateau against the training step
  (`scipy.stats.ecdf` on right-censored data; a run that never escaped is censored at its last probe);
* `onset_lag`: per arm, the lag escape - sink onset over every run by its known sign (`signs`: a run whose onset
  is censored after its escape has a negative lag, one whose escape is censored after its onset a positive one;
  the exact sign test over them, described, not declared), beside the mean over the runs with both observed,
  which are a selection (`selection`: their escape steps against the escaped runs left out, Mann-Whitney), so
  no verdict is read from it; `lag_differences`: per declared pair, the paired difference of lags on the seeds
  with both lags, described only. `onset_lag_exploratory`: the same with the onset as the first probe where the
  sink mass *reaches* the mark (`escape.sink_reach`), not declared, with the arm's first escape step beside it
  (an onset before every escape makes a positive lag nearly automatic);
* `seeds_declared` / `seeds_in` / `complete`: an interim results.json (fewer seeds) is rendered as interim.
"""

from __future__ import annotations

import warnings
from fractions import Fraction
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from sinkdlm.experiment.endpoints.detection import inconclusive
from sinkdlm.experiment.endpoints.escape.probe import censored_sign_test, sign_test_mde
from sinkdlm.stats import mean_interval, sign_interval_rank


def kaplan_meier(records: list[dict[str, Any]], confidence: float = 0.95) -> dict[str, Any] | None:
    """The Kaplan-Meier estimate of P(escape step > t) from `escape_step` records ({step, censored}):
    `steps` (the distinct recorded steps, escapes and censorings) and `survival` (the estimate just after each),
    with its pointwise `low`/`high` (Greenwood, log-log; None where undefined), the `censored` steps, `n`,
    `escaped` and the `median` escape step (the first step where the estimate is <= 1/2, `exact_median`; None if
    never)."""
    if not records:
        return None
    escaped = [float(r["step"]) for r in records if not r["censored"]]
    censored = [float(r["step"]) for r in records if r["censored"]]
    sf = scipy_stats.ecdf(scipy_stats.CensoredData(uncensored=escaped, right=censored)).sf
    with warnings.catch_warnings():  # undefined at S = 0 or 1: stored as None, said in the figure
        warnings.simplefilter("ignore", RuntimeWarning)
        ci = sf.confidence_interval(confidence, method="log-log")
    finite = lambda xs: [float(x) if np.isfinite(x) else None for x in xs]  # noqa: E731
    survival = [float(p) for p in sf.probabilities]
    median = exact_median(escaped, censored)
    return {"steps": [int(s) for s in sf.quantiles], "survival": survival, "low": finite(ci.low.probabilities),
            "high": finite(ci.high.probabilities), "censored": sorted(int(s) for s in censored), "n": len(records),
            "escaped": len(escaped), "median": median, "confidence": confidence}


def exact_median(escaped: list[float], censored: list[float]) -> int | None:
    """The first step where the Kaplan-Meier estimate prod (1 - d_i / n_i) is <= 1/2, computed in fractions: the
    float product can land a rounding above 1/2 where the estimate is exactly 1/2 (20 runs: 10/20 at risk
    after ten escapes), which moved a median one probe later. A run censored at a step is at risk at it."""
    survival = Fraction(1)
    for t in sorted(set(escaped)):
        at_risk = sum(x >= t for x in escaped) + sum(c >= t for c in censored)
        survival *= 1 - Fraction(escaped.count(t), at_risk)
        if survival <= Fraction(1, 2):
            return int(t)
    return None


def _lag_interval(d: list[float], confidence: float) -> dict[str, Any]:
    if len(d) >= 2:
        return mean_interval(d, confidence).to_dict()
    return {"mean": float(d[0]) if d else None, "n": len(d)}


def _test(arm: dict, base: dict, confidence: float, family: int, sized_for: float | None) -> dict[str, Any]:
    """One pair's censored sign test at `confidence` (already adjusted for its `family`), with the exact coverage
    of its interval, the Bonferroni-adjusted p and the MDE of the exact sign test at the observed spread of d
    (censored values at their bounds) over the pairs it counts."""
    r = censored_sign_test(arm, base, confidence)
    k, exact = sign_interval_rank(r["seeds"], confidence) if r["seeds"] else (0, None)
    r["exact_confidence"] = exact if k else None
    r["p_adjusted"] = None if r["p"] is None else min(1.0, family * r["p"])
    r["family"] = family
    alpha = 1 - confidence  # the adjusted level
    r["rejects"] = r["p"] is not None and r["p"] < alpha
    d = list(r["per_seed"].values())
    sd = float(np.std(d, ddof=1)) if len(d) >= 2 else None
    n = r["plus"] + r["minus"] + r["undetermined"]
    r["spread"] = sd
    r["mde"] = sign_test_mde(sd, n, alpha) if sd and n else None
    r["excludes_zero"] = (r["low"] is not None and r["low"] > 0) or (r["high"] is not None and r["high"] < 0)
    # a test that detects nothing: bounded (both ends finite), and inconclusive only where its MDE exceeds the
    # log2 ratio the seeds were sized for (docs/method.md §7)
    bounded = r["low"] is not None and r["high"] is not None and not r["rejects"]
    r["bound"] = max(abs(r["low"]), abs(r["high"])) if bounded else None
    r["sized_for"] = sized_for
    r["inconclusive"] = inconclusive(r["mde"], sized_for, rejects=r["rejects"])  # endpoints.detection's rule
    # the log2 ratio read back as a ratio of escape steps (arm / baseline)
    r["ratio"] = {k: None if r[k] is None else 2.0 ** r[k] for k in ("estimate", "low", "high")}
    return r


def escape_summary(results: dict[str, Any], confidence: float = 0.95,
                   seeds_declared: list[int] | None = None) -> dict[str, Any] | None:
    """results.json's `escape` (see the module docstring); None when the preset declared no escape endpoint.
    `seeds_declared`: the study's declared seeds (the preset's); kept from an earlier summary, else read from the
    preset of that name, else the seeds in results.json."""
    declared = (results.get("declared") or {}).get("escape")
    if not declared:
        return None
    variants = results["variants"]
    if seeds_declared is None:
        seeds_declared = (results.get("escape") or {}).get("seeds_declared")
    if seeds_declared is None:
        from sinkdlm.experiment.presets import PRESETS

        preset = PRESETS.get(results.get("preset", ""))
        seeds_declared = list(preset().seeds) if preset else list(results.get("seeds") or [])

    def runs(name: str, key: str) -> dict[str, dict[str, Any]]:
        return {s: r["escape"][key] for s, r in variants.get(name, {}).get("seeds", {}).items()
                if key in (r.get("escape") or {})}  # a record without `key` (onset_reached is newer): not counted

    seeds_in = sorted({int(s) for v in variants.values() for s, r in v.get("seeds", {}).items() if r.get("escape")})
    every_arm = [n for n in variants if runs(n, "escape")]
    # a seed is in when every arm has it: the paired tests need both sides
    paired_in = sorted(set.intersection(*(set(map(int, runs(n, "escape"))) for n in every_arm))) if every_arm else []
    complete = set(map(int, seeds_declared)) <= set(paired_in)
    alpha = 1 - confidence
    pairs = [declared["pair"], *declared.get("secondary", [])]
    secondaries = max(1, len(pairs) - 1)
    tests = []
    for i, p in enumerate(pairs):
        if p[0] in variants and p[1] in variants:
            family = 1 if i == 0 else secondaries  # the declared primary is tested once, unadjusted
            r = _test(runs(p[0], "escape"), runs(p[1], "escape"), 1 - alpha / family, family, declared.get("sized_for"))
            r["decided"] = bool(complete and r["rejects"] and r["excludes_zero"])
            tests.append({"pair": list(p), "primary": i == 0, **r})
    km = {n: kaplan_meier(list(runs(n, "escape").values()), confidence) for n in every_arm}
    lags = {name: _lags(runs(name, "escape"), runs(name, "onset"), confidence) for name in every_arm}
    # exploratory (not declared): the onset as the first probe where the mass *reaches* the mark (records that
    # have it: written by escape_record since it was added; the declared rule needs the mass to stay)
    reached = {name: _lags(runs(name, "escape"), runs(name, "onset_reached"), confidence)
               for name in every_arm if runs(name, "onset_reached")}
    lag_pairs = [p for p in pairs if p[0] in lags and p[1] in lags]
    differences = []
    for p in lag_pairs:
        a, b = (dict(zip(lags[n]["seeds"], lags[n]["per_seed"])) for n in p)
        d = [a[s] - b[s] for s in a if s in b]
        level = 1 - alpha / len(lag_pairs)
        # the seeds with both lags observed are a selection (see `_lags`): described, never decided
        differences.append({"pair": list(p), "seeds": len(d), "per_seed": d, "confidence": level,
                            "family": len(lag_pairs), **_lag_interval(d, level)})
    return {"tests": tests, "onset_lag": lags, "lag_differences": differences, "km": km,
            "onset_lag_exploratory": reached,
            "seeds_declared": list(map(int, seeds_declared)), "seeds_in": paired_in, "seeds_any": seeds_in,
            "complete": complete, "confidence": confidence,
            "adjustment": {"primary": "none (declared, tested once at 5 %)",
                           "secondary": f"Bonferroni over {secondaries} secondary pair{'s' if secondaries > 1 else ''}",
                           "lags": f"Bonferroni over {len(lag_pairs)} pair{'s' if len(lag_pairs) != 1 else ''}"}}


def lag_sign(esc: dict[str, Any], onset: dict[str, Any]) -> int | None:
    """The sign of escape - onset where it is known: both observed; or one censored after the other was seen
    (censored at its last probe: it comes later than any observed step); None where both are censored."""
    if esc["censored"] and onset["censored"]:
        return None
    if onset["censored"]:
        return -1
    if esc["censored"]:
        return 1
    return int(np.sign(esc["step"] - onset["step"]))


def _lags(esc: dict[str, dict[str, Any]], onset: dict[str, dict[str, Any]], confidence: float) -> dict[str, Any]:
    """One arm's lag escape - onset: `signs` over every run with a known sign (`lag_sign`) and the exact two-sided
    sign test over the nonzero ones (described: no lag test was declared); the mean with a t interval over the runs
    with both observed, which are a selection, and `selection`: those runs' escape steps against the escaped runs
    whose onset was censored (medians, two-sided Mann-Whitney p); how many runs were censored on each side, how
    many escaped runs saw the onset at or before their escape, the median steps and the arm's first escape."""
    d = {s: esc[s]["step"] - onset[s]["step"] for s in esc if s in onset
         and not esc[s]["censored"] and not onset[s]["censored"]}
    signs = [lag_sign(esc[s], onset[s]) for s in esc if s in onset]
    plus, minus = signs.count(1), signs.count(-1)
    escaped = [s for s in esc if not esc[s]["censored"]]
    chosen = [esc[s]["step"] for s in d]
    left_out = [esc[s]["step"] for s in escaped if s in onset and onset[s]["censored"]]
    selection = None
    if chosen and left_out:
        selection = {"observed_onset": len(chosen), "censored_onset": len(left_out),
                     "escape_median_observed_onset": _median(chosen), "escape_median_censored_onset": _median(left_out),
                     "p": float(scipy_stats.mannwhitneyu(chosen, left_out, alternative="two-sided").pvalue)}
    return {"per_seed": list(d.values()), "seeds": list(d), **_lag_interval(list(d.values()), confidence),
            "signs": {"positive": plus, "negative": minus, "zero": signs.count(0), "unknown": signs.count(None),
                      "p": float(scipy_stats.binomtest(plus, plus + minus).pvalue) if plus + minus else None},
            "selection": selection,
            "runs": len(esc), "escaped": len(escaped), "escape_censored": sum(e["censored"] for e in esc.values()),
            "onset_censored": sum(o["censored"] for o in onset.values()),
            "onset_first": sum(esc[s]["step"] >= onset[s]["step"] for s in d),
            "onset_median": _median([o["step"] for o in onset.values() if not o["censored"]]),
            "escape_median": _median([e["step"] for e in esc.values() if not e["censored"]]),
            "first_escape": min((esc[s]["step"] for s in escaped), default=None)}


def _median(xs: list[float]) -> float | None:
    return float(np.median(xs)) if xs else None

