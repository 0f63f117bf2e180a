"""The declared endpoints of a study: its primary comparison, its equivalence claims and its plateau.

A preset declares them before the run (`ExperimentPreset.primary`, `.equivalence`, `.plateau_nats`); the
runner copies the declaration into results.json's `declared`, and `summarise` fills in what was measured:

* `primary` (results.json top level): the declared pair, metric and test: an exact Wilcoxon signed-rank or
  sign test with the Hodges-Lehmann / median estimate (`stats.rank_test`) beside the paired t interval, or
  (`t`, for fewer seeds than an exact test can reject with) the paired t test with the Wilcoxon beside it;
  `rejects` is what the declared test says, `agree` whether the two agree. From an AR initialisation it carries the two numbers a head start cannot hide behind:
  the step-0 gap (the converted models before training, paired per seed) and the training effect
  Δ_train = (a(T) - a(0)) - (b(T) - b(0)), the `val_loss_change` comparison; and the gap's trajectory over
  the runs' `val_curve` steps: its change between consecutive scored steps and, from `TREND_MIN_STEPS` scored
  steps on, its slope against log10 training tokens (per seed, then a t interval).
  One declared primary is tested at the report's level without adjustment (docs/method.md §7).
* `equivalence` on each declared pair's val_loss comparison: TOST (`stats.equivalence_test`) at the declared
  margin, inside the report's multiplicity family: "equivalent within ±m", "different" or "inconclusive".
* `plateau`: per run, how much the last fifth of training lowered its fixed val_loss, against the criterion.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sinkdlm.experiment.formatting import train_setting
from sinkdlm.experiment.metrics import seed_scalars, unconverted
from sinkdlm.stats import equivalence_test, mean_interval, rank_test


def _iv(d: list[float], confidence: float) -> dict[str, Any]:
    return mean_interval(d, confidence).to_dict() if d else {}


def paired_seed_differences(a: dict[str, Any], b: dict[str, Any], key: str) -> dict[str, float]:
    """{seed: a - b} of a per-seed scalar (`val_loss`, `val_loss_change`, `step0`) over the seeds both have."""
    sa, sb = seed_scalars(a, key), seed_scalars(b, key)
    return {s: sa[s] - sb[s] for s in sa if s in sb}


# A trend per decade of training tokens is fitted only on this many scored steps after step 0, spanning at
# least this many decades (log-spaced steps, e.g. 375 ... 6,000): through 2 or 3 points, or over a fraction of a
# decade, a slope "per 10x tokens" is a line through the points or an extrapolation, not a trend.
TREND_MIN_STEPS = 4
TREND_MIN_DECADES = 1.0


def trajectory(a: dict[str, Any], b: dict[str, Any], tokens_per_step: int | None,
               confidence: float = 0.95) -> dict[str, Any] | None:
    """The paired gap a - b at every step both runs of a seed scored (`val_curve`), with its t interval; the
    change of the gap between consecutive scored steps and from the first scored step after 0 to the last (per
    seed, then a t interval: `step_changes`, `scored_change`); and, from `TREND_MIN_STEPS` scored steps after
    step 0 spanning `TREND_MIN_DECADES` on, the gap's slope per decade of training tokens (least squares per seed
    over those steps, then a t interval over seeds; `slope_per_decade`, None otherwise). Raw intervals, none in
    the report's multiplicity family: described, not tested."""
    curves: dict[int, dict[str, float]] = {}
    for seed, rec in a["seeds"].items():
        other = b["seeds"].get(seed) or {}
        pa = {p["step"]: p["val_loss"] for p in rec.get("val_curve") or []}
        pb = {p["step"]: p["val_loss"] for p in other.get("val_curve") or []}
        for step in set(pa) & set(pb):
            curves.setdefault(step, {})[seed] = pa[step] - pb[step]
    if len(curves) < 2:
        return None
    points = []
    for step in sorted(curves):
        d = list(curves[step].values())
        points.append({"step": step, "tokens": None if tokens_per_step is None else step * tokens_per_step,
                       "seeds": len(d), **{k: v for k, v in _iv(d, confidence).items() if k in ("mean", "low", "high", "p")},
                       "per_seed": dict(curves[step])})  # each seed's gap: which seed lags is visible, not only the spread
    def change(s0: int, s1: int) -> dict[str, Any]:  # the gap at s1 - the gap at s0, per seed
        d = [curves[s1][seed] - curves[s0][seed] for seed in curves[s1] if seed in curves[s0]]
        iv = _iv(d, confidence) if len(d) >= 2 else {"mean": d[0] if d else None}
        return {"from_step": s0, "to_step": s1, "seeds": len(d), **{k: iv.get(k) for k in ("mean", "low", "high", "p")}}

    steps = sorted(curves)
    scored = [s for s in steps if s > 0]
    decades = math.log10(scored[-1] / scored[0]) if len(scored) >= 2 else None
    slope = None
    if len(scored) >= TREND_MIN_STEPS and decades >= TREND_MIN_DECADES:
        slopes = []
        for seed in a["seeds"]:
            xs = [(math.log10(s), curves[s][seed]) for s in scored if seed in curves[s]]
            if len(xs) >= TREND_MIN_STEPS:
                x, y = np.array(xs).T
                slopes.append(float(np.polyfit(x, y, 1)[0]))  # nats per 10x tokens (tokens = steps x a constant)
        slope = _iv(slopes, confidence) if len(slopes) >= 2 else None
    return {"points": points, "step_changes": [change(s0, s1) for s0, s1 in zip(steps, steps[1:])],
            # from the first scored step after 0 to the last (the step-0 gap's change is Δ_train)
            "scored_change": change(scored[0], scored[-1]) if len(scored) >= 2 else None,
            "slope_per_decade": slope and {k: slope[k] for k in ("mean", "low", "high", "p", "n")},
            "decades": decades, "scored_steps": len(scored), "trend_min_steps": TREND_MIN_STEPS,
            "trend_min_decades": TREND_MIN_DECADES, "tokens_per_step": tokens_per_step}


def declared_test_name(test: str) -> str:
    """How the reports name a declared test (`t`, `wilcoxon` or `sign`)."""
    return {"t": "paired t", "sign": "exact sign"}.get(test, "exact Wilcoxon signed-rank")


def declared_decision(primary: dict[str, Any]) -> tuple[str, float | None, float | None, bool]:
    """(test name, estimate, p, rejects) of a measured primary by its declared test: the paired t test's mean,
    or the rank test's estimate (Hodges-Lehmann / median). A results.json from before `rejects` was stored
    reads the declared test's own flag."""
    test = primary.get("test", "wilcoxon")
    rank, t = primary.get("rank") or {}, primary.get("t") or {}
    name = declared_test_name(test)
    estimate, p = (t.get("mean"), t.get("p")) if test == "t" else (rank.get("estimate"), rank.get("p"))
    rejects = primary.get("rejects", primary.get("t_rejects" if test == "t" else "rank_rejects"))
    return name, estimate, p, bool(rejects)


def declared_primary_entry(results: dict[str, Any], comparisons: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The comparison (pair, metric) the preset declared primary, taken out of the multiplicity family: it is
    tested once, at 5 %, by its declared test (docs/method.md §7); the family adjusts every other comparison."""
    declared = (results.get("declared") or {}).get("primary")
    if not declared:
        return None
    metric = declared.get("metric", "val_loss")
    entry = next((c for c in comparisons if c["pair"] == list(declared["pair"]) and c["metric"] == metric), None)
    if entry is not None and not entry.get("missing"):
        entry.update(in_family=False, declared_primary=True)
        return entry
    return None


def primary_verdict(entry: dict[str, Any], primary: dict[str, Any]) -> None:
    """The declared primary's row in the comparisons: the declared test's decision, not a BH-adjusted one."""
    name, estimate, p, rejects = declared_decision(primary)
    where = f"the declared primary: {name} test, p = {'–' if p is None else f'{p:.3g}'}, at 5 % outside the family"
    entry["p_adjusted"], entry["survives"] = None, rejects
    if rejects and estimate is not None:
        better = entry.get("lower_is_better")
        quality = "" if better is None else (" (better)" if (estimate < 0) == better else " (worse)")
        entry["verdict"] = f"{'lower' if estimate < 0 else 'higher'}{quality} by {abs(estimate):.3g} ({where})"
    else:
        entry["verdict"] = f"no difference detected ({where})"


def null_reading(d: list[float], mde: float | None, interval: dict[str, Any], rejects: bool,
                 sized_for: float | None, confidence: float = 0.95) -> dict[str, Any]:
    """What a declared test that rejects nothing can still say (docs/method.md §7): `bound`, the largest |end| of
    its interval (the difference lies within ±bound); `posthoc_margin`, the largest |end| of the paired t interval
    at 1 - 2α, the smallest margin at which TOST at α would call the pair equivalent (post hoc: no margin was
    declared); and `inconclusive`, only where the MDE exceeds the effect the seeds were `sized_for` (or either
    is unknown)."""
    if rejects:
        return {"inconclusive": False}
    low, high = interval.get("low"), interval.get("high")
    out: dict[str, Any] = {"bound": None if low is None or high is None else max(abs(low), abs(high)),
                           "sized_for": sized_for,
                           "inconclusive": sized_for is None or mde is None or mde > sized_for}
    iv = mean_interval(d, 1 - 2 * (1 - confidence)) if len(d) >= 2 else None
    out["posthoc_margin"] = None if iv is None or iv.degenerate else max(abs(iv.low), abs(iv.high))
    return out


def primary_endpoint(results: dict[str, Any], comparisons: list[dict[str, Any]], confidence: float = 0.95) -> dict[str, Any] | None:
    """results.json's `primary`: the declared comparison measured (see the module docstring)."""
    declared = (results.get("declared") or {}).get("primary")
    if not declared:
        return None
    a_name, b_name = declared["pair"]
    metric, test = declared.get("metric", "val_loss"), declared.get("test", "wilcoxon")
    variants = results["variants"]
    if a_name not in variants or b_name not in variants:
        return {**declared, "missing": "a variant of the declared pair was not run"}
    a, b = variants[a_name], variants[b_name]
    entry = next((c for c in comparisons if c["pair"] == [a_name, b_name] and c["metric"] == metric), None)
    d = list(paired_seed_differences(a, b, metric).values())
    alpha = 1 - confidence
    out: dict[str, Any] = {**declared, "seeds": len(d)}
    if entry is not None:
        out["t"] = {k: entry.get(k) for k in ("mean", "low", "high", "p", "df", "degenerate", "mde")}
    # test "t": the paired t test decides (a study with fewer than 6 seeds, where no exact test can reach 5 %);
    # the exact Wilcoxon test is still computed and shown beside it, for the tails
    rank_name = "wilcoxon" if test == "t" else test
    rank = rank_test(d, rank_name, confidence) if d else None
    out["rank"] = rank
    t_says = entry is not None and entry.get("p") is not None and entry["p"] < alpha and not entry.get("degenerate")
    r_says = rank is not None and rank.get("p") is not None and rank["p"] < alpha
    out["t_rejects"], out["rank_rejects"] = bool(t_says), bool(r_says)
    out["rejects"] = bool(t_says if test == "t" else r_says)  # what the declared test says
    out["agree"] = t_says == r_says
    out.update(null_reading(d, out["t"].get("mde") if entry is not None else None,
                            out["t"] if test == "t" else (rank or {}), out["rejects"], declared.get("sized_for"),
                            confidence))
    if metric == "val_loss" and any((rec.get("step0") or {}) for rec in a["seeds"].values()):
        d0 = list(paired_seed_differences(a, b, "step0").values())
        gap0 = _iv(d0, confidence)
        out["step0_gap"] = {k: gap0.get(k) for k in ("mean", "low", "high", "p", "n", "degenerate")}
        se0 = [math.hypot((rec.get("step0") or {}).get("val_loss_se") or 0.0,
                          ((b["seeds"].get(s) or {}).get("step0") or {}).get("val_loss_se") or 0.0)
               for s, rec in a["seeds"].items()]
        out["step0_gap"]["validation_se"] = float(np.mean(se0)) if se0 else None  # unpaired bound on the MC noise
        # what the runner recorded (plan.draws_at_conversion), not guessed from the values
        out["step0_gap"]["per_seed_controls"] = any((v.get("step0") or {}).get("per_seed") for v in (a, b))
        dc = list(paired_seed_differences(a, b, "val_loss_change").values())
        change = _iv(dc, confidence)
        out["training_effect"] = {k: change.get(k) for k in ("mean", "low", "high", "p", "n", "degenerate")}
        out["training_effect"]["rank"] = rank_test(dc, rank_name, confidence) if dc else None
        out["training_effect"]["unconverted"] = [n for n, v in ((a_name, a), (b_name, b)) if unconverted(results, v)]
    # tokens per step: results.json keeps only what the preset set, the rest are TrainConfig's defaults
    traj = trajectory(a, b, train_setting(results, "batch_size") * train_setting(results, "seq_len"), confidence)
    if traj:
        out["trajectory"] = traj
    return out


def attach_equivalence(results: dict[str, Any], comparisons: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give each declared equivalence pair's val_loss comparison its `equivalence` {margin, p} (TOST); returns
    those dicts, whose p-values join the report's multiplicity family (`finish_equivalence` sets the verdicts)."""
    declared = (results.get("declared") or {}).get("equivalence") or {}
    margin, pairs = declared.get("margin"), [list(p) for p in declared.get("pairs") or []]
    if not margin:
        return []
    out = []
    for c in comparisons:
        if c["pair"] in pairs and c["metric"] == "val_loss" and not c.get("missing"):
            a, b = (results["variants"][n] for n in c["pair"])
            c["equivalence"] = equivalence_test(list(paired_seed_differences(a, b, "val_loss").values()), margin)
            out.append(c)
    return out


def finish_equivalence(entries: list[dict[str, Any]], confidence: float = 0.95) -> None:
    """The verdict of each equivalence test once the family's adjusted p-values are set."""
    for c in entries:
        eq = c["equivalence"]
        q, m = eq.get("p_adjusted"), eq["margin"]
        if q is not None and q < 1 - confidence:
            eq["verdict"] = f"equivalent within ±{m:g}"
        elif c.get("survives"):
            eq["verdict"] = "different"
        else:
            eq["verdict"] = "inconclusive"


def plateau(results: dict[str, Any]) -> dict[str, Any] | None:
    """Per run, val_loss(4/5 T) - val_loss(T) from its `val_curve`, against the declared `plateau_nats`."""
    nats = (results.get("declared") or {}).get("plateau_nats")
    if nats is None:
        return None
    runs = {}
    for name, v in results["variants"].items():
        for seed, rec in v["seeds"].items():
            curve = {p["step"]: p["val_loss"] for p in rec.get("val_curve") or []}
            if not curve:
                continue
            last = max(curve)
            at = [s for s in curve if s <= round(0.8 * last) and s > 0]
            if at:
                runs[f"{name}-s{seed}"] = {"from_step": max(at), "drop": curve[max(at)] - curve[last]}
    drops = [r["drop"] for r in runs.values()]
    return {"nats": nats, "runs": runs, "all_plateaued": bool(runs) and all(x < nats for x in drops),
            "max_drop": max(drops, default=None),
            "mean_drop": mean_interval(drops).to_dict() if len(drops) >= 2 else None}
