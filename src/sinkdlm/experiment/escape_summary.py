"""The escape endpoint over a study (issue 54, docs/method.md §11): results.json's `escape`, from the per-run records.

`experiment/escape.py` measures each run (its probes, escape step, sink onset: the runner stores them per run as
`escape`); this module computes everything the report says about the study from those records alone, so
`regenerate` rebuilds it from results.json:

* `tests`: the declared primary pair's censored exact sign test of the log2 ratio of escape steps (tested once at
  5 %), then the secondary pairs' (Bonferroni over the secondaries: their interval at 1 - α/m, p times m), each
  with the exact coverage of its order-statistic interval, the sign test's MDE at the observed spread and a
  `decided` flag (a direction only when the adjusted test rejects and the interval excludes 0, and only once
  the declared seeds are in);
* `km`: per arm, the Kaplan-Meier estimate of the fraction of runs still on the plateau against the training step
  (`scipy.stats.ecdf` on right-censored data; a run that never escaped is censored at its last probe);
* `onset_lag`: per arm, the lag escape - sink onset (runs with both observed) with its t interval over seeds;
  `lag_differences`: per declared pair, the paired difference of lags (Bonferroni over the pairs): does the
  plateau end when sinks form, and does a dedicated sink token move that moment? `onset_lag_exploratory`: the
  same lag with the onset as the first probe where the sink mass *reaches* the mark (`escape.sink_reach`), not
  declared: the declared onset (the mass *stays*) is censored on most runs that escaped;
* `seeds_declared` / `seeds_in` / `complete`: an interim results.json (fewer seeds) is rendered as interim.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from sinkdlm.experiment.escape import censored_sign_test, sign_test_mde
from sinkdlm.stats import mean_interval, sign_interval_rank


def kaplan_meier(records: list[dict[str, Any]], confidence: float = 0.95) -> dict[str, Any] | None:
    """The Kaplan-Meier estimate of P(escape step > t) from `escape_step` records ({step, censored}):
    `steps` (the distinct recorded steps, escapes and censorings) and `survival` (the estimate just after each),
    with its pointwise `low`/`high` (Greenwood, log-log; None where undefined), the `censored` steps, `n`,
    `escaped` and the `median` escape step (the first step where the estimate is <= 1/2; None if never)."""
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
    median = next((int(s) for s, p in zip(sf.quantiles, survival) if p <= 0.5), None)
    return {"steps": [int(s) for s in sf.quantiles], "survival": survival, "low": finite(ci.low.probabilities),
            "high": finite(ci.high.probabilities), "censored": sorted(int(s) for s in censored), "n": len(records),
            "escaped": len(escaped), "median": median, "confidence": confidence}


def _lag_interval(d: list[float], confidence: float) -> dict[str, Any]:
    if len(d) >= 2:
        return mean_interval(d, confidence).to_dict()
    return {"mean": float(d[0]) if d else None, "n": len(d)}


def _test(arm: dict, base: dict, confidence: float, family: int) -> dict[str, Any]:
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
            r = _test(runs(p[0], "escape"), runs(p[1], "escape"), 1 - alpha / family, family)
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
        iv = _lag_interval(d, level)
        excludes = iv.get("low") is not None and (iv["low"] > 0 or iv["high"] < 0)
        differences.append({"pair": list(p), "seeds": len(d), "per_seed": d, "confidence": level,
                            "family": len(lag_pairs), **iv, "excludes_zero": bool(excludes),
                            "decided": bool(complete and excludes)})
    return {"tests": tests, "onset_lag": lags, "lag_differences": differences, "km": km,
            "onset_lag_exploratory": reached,
            "seeds_declared": list(map(int, seeds_declared)), "seeds_in": paired_in, "seeds_any": seeds_in,
            "complete": complete, "confidence": confidence,
            "adjustment": {"primary": "none (declared, tested once at 5 %)",
                           "secondary": f"Bonferroni over {secondaries} secondary pair{'s' if secondaries > 1 else ''}",
                           "lags": f"Bonferroni over {len(lag_pairs)} pair{'s' if len(lag_pairs) != 1 else ''}"}}


def _lags(esc: dict[str, dict[str, Any]], onset: dict[str, dict[str, Any]], confidence: float) -> dict[str, Any]:
    """One arm's lag escape - onset over its runs with both observed (a t interval over seeds), with how many runs
    were censored on each side, how many saw the onset at or before the escape, and the median steps."""
    d = {s: esc[s]["step"] - onset[s]["step"] for s in esc if s in onset
         and not esc[s]["censored"] and not onset[s]["censored"]}
    return {"per_seed": list(d.values()), "seeds": list(d), **_lag_interval(list(d.values()), confidence),
            "runs": len(esc), "escape_censored": sum(e["censored"] for e in esc.values()),
            "onset_censored": sum(o["censored"] for o in onset.values()),
            "onset_first": sum(esc[s]["step"] >= onset[s]["step"] for s in d),
            "onset_median": _median([o["step"] for o in onset.values() if not o["censored"]]),
            "escape_median": _median([e["step"] for e in esc.values() if not e["censored"]])}


def _median(xs: list[float]) -> float | None:
    return float(np.median(xs)) if xs else None

