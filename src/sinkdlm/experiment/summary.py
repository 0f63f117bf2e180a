"""The statistics every endpoint shares: aggregates over seeds, paired comparisons of variants, multiplicity.

results.json -> `summarise` adds, per variant, `summary` (mean and 95 % interval over seeds of every metric)
and, for the experiment, `comparisons`: one entry per (pair of variants, metric) with the mean difference, its
interval, its p-value and the verdict — all from `sinkdlm.stats`:

* `val_loss` and the analysis metrics (one number per seed): paired Student t over seeds;
* task accuracies: paired over seeds *and* items (`paired_accuracy_difference` on the per-item
  outcomes that eval.json keeps; the item sets are checked to be the same).

Multiplicity (docs/method.md §7): every paired comparison whose verdict the report prints forms one
family; Benjamini-Hochberg at q = 1 - confidence adjusts its p-values, and a direction (and bold) is
stated only for comparisons that survive. Comparisons without a variance estimate (a metric that
cannot vary, such as a cloze exact match that is 0 for every model, or identical per-seed
differences) and comparisons with one seed are not tests and stay out of the family; so does the validation
bound of two arms of different block sizes (`endpoints.block_sizes.not_compared`: a block model's val_loss is
its block NELBO, a different bound per block size, docs/method.md §15), kept with its raw numbers.

Each endpoint (`experiment.endpoints.ENDPOINTS`) adds its own numbers through the hooks of
`endpoints.base.Endpoint`, which `summarise` calls in the registry's order: a variant's own summaries (the sink
analysis), its tests that join the family or leave it (equivalence, the declared primary), what it decides once
the family is adjusted, and last what it judges from its per-run records alone (escape). Beside them: the
minimum detectable effect of each comparison and the study's sizing, the experiment's timing, and the training
curves and paired differences the report draws.

A per-seed value that is missing (None) marks the metric missing for that pair; it is reported, not
compared. Nothing here formats a number for display; the verdicts (`stats.verdict`) are stored data, as
results.json keeps them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from sinkdlm.experiment.endpoints import ENDPOINTS
from sinkdlm.experiment.endpoints.base import Study
from sinkdlm.experiment.endpoints.block_sizes import not_compared
from sinkdlm.experiment.metrics import (ALTERNATIVES, ANALYSIS_METRICS, LOWER_IS_BETTER, METHOD_ITEMS, METHOD_SEEDS,
                                        NEUTRAL, SHARES, TRAINING_METRICS, seed_scalars, seed_values, unconverted)
from sinkdlm.stats import (
    MDE_POWER, Interval, accuracy_interval, benjamini_hochberg, mean_interval, minimum_detectable_effect,
    paired_accuracy_difference, paired_difference, verdict,
)


def task_metrics(results: dict[str, Any]) -> list[str]:
    """Every `task/metric` name that some run of the experiment was scored on, sorted."""
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
        sa, sb = seed_values(a, metric), seed_values(b, metric)
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
    bounds = not_compared(a, b, metric)
    if bounds:  # two different bounds (block sizes): the raw numbers stay, no test
        entry.update(in_family=False, different_bounds=True, verdict=bounds)
    return entry


# The val_loss difference a study should be able to detect (nats): the paper-sized effect of one sink token
# is about 0.1, so a study that cannot detect half of it cannot decide the claim (docs/method.md §7).
TARGET_MDE = 0.05


def seeds_for_mde(sd: float, target: float, power: float = MDE_POWER, alpha: float = 0.05) -> int | None:
    """The fewest seeds whose paired t test over seeds (df = n - 1) has `minimum_detectable_effect` <= `target`
    when the per-seed differences spread with standard deviation `sd` (None for no finite spread)."""
    if not (sd > 0 and math.isfinite(sd) and target > 0):
        return None
    z = statistics.NormalDist()
    n = max(2, math.ceil(((z.inv_cdf(1 - alpha / 2) + z.inv_cdf(power)) * sd / target) ** 2))  # large-n start
    while minimum_detectable_effect(sd / math.sqrt(n), n - 1, power, alpha) > target:
        n += max(1, n // 50)  # the t correction adds a few seeds; step coarsely where n is large
    while n > 2 and minimum_detectable_effect(sd / math.sqrt(n - 1), n - 2, power, alpha) <= target:
        n -= 1
    return n


# Pitman's asymptotic relative efficiency of the exact rank tests against the paired t test when the
# differences are normal (Lehmann, Nonparametrics, ch. 2 and 3): a rank test needs about 1 / ARE times the
# t test's seeds for the same power (docs/method.md §7).
RANK_TEST_ARE = {"wilcoxon": 3 / math.pi, "sign": 2 / math.pi}


def rank_test_seeds(t_seeds: int | None, test: str, alpha: float = 0.05) -> dict[str, Any] | None:
    """What a declared exact rank test (`wilcoxon` or `sign`) needs where the paired t test needs `t_seeds`:
    about t_seeds / ARE seeds, and never fewer than the smallest n whose most extreme outcome (every seed one
    sign) reaches `alpha`, 2 / 2^n <= alpha, below which the exact test cannot reject at all."""
    if t_seeds is None or test not in RANK_TEST_ARE:
        return None
    floor = math.ceil(math.log2(2 / alpha) - 1e-12)
    return {"test": test, "are": RANK_TEST_ARE[test], "min_seeds": floor,
            "seeds": max(floor, math.ceil(t_seeds / RANK_TEST_ARE[test]))}


def bh_threshold(others: Sequence[float], family_size: int, q: float = 0.05) -> float:
    """The largest raw p-value at which one more test in a Benjamini-Hochberg family of `family_size` is
    rejected, given the other tests' raw p-values `others`: BH rejects it at rank i when at least i - 1 others
    are at or below i q / m, so the threshold is the largest such i q / m (q / m when it would be the only
    discovery, q when every other test is one)."""
    m = int(family_size)
    return max(i * q / m for i in range(1, m + 1) if sum(p <= i * q / m for p in others) >= i - 1)


def study_sizing(results: dict[str, Any], target: float = TARGET_MDE,
                 family: Sequence[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """What detecting a val_loss difference of `target` would take at the observed spread: per compared pair,
    the seeds per variant (`seeds_for_mde`) and their compute on the machine that ran the study (two runs per
    seed, at the measured mean compute per run). None without a val_loss comparison that has an interval.

    `family`: the report's multiplicity family (entries with `p`). A difference is stated only when it survives
    the family's Benjamini-Hochberg adjustment, which asks a smaller raw p-value than 5 %: each row then also
    sizes the test at the level it must clear given the other members' p-values now (`bh_threshold`) and at
    the worst case, q / m, where it would be the family's only discovery (Bonferroni's level)."""
    timing = experiment_timing(results)
    runs = timing.get("runs_timed") or timing.get("runs") or 0
    per_run = timing["compute_s"] / runs if runs and timing.get("compute_s") else None

    def compute_h(seeds: int | None) -> float | None:  # two runs per seed at the measured compute per run
        return None if seeds is None or per_run is None else 2 * seeds * per_run / 3600

    # The fixed validation's variance split (experiment/variance.py), where the runs kept their values:
    # sizing then uses the spread projected to the whole validation set and states both components.
    splits = {tuple(sp["pair"]): sp for sp in results.get("val_loss_splits") or [] if sp.get("var_total") is not None}
    rows = []
    for c in results.get("comparisons", []):
        se = comparison_se(c) if c.get("metric") == "val_loss" and not c.get("different_bounds") else None
        if se is None:
            continue
        n = int(c["df"]) + 1  # paired over seeds
        sd = se * math.sqrt(n)
        split = splits.get(tuple(c["pair"]))
        alpha = 1 - c.get("confidence", 0.95)
        spread = split["sd_full"] if split else sd
        seeds = seeds_for_mde(spread, target, alpha=alpha)
        row = {"pair": c["pair"], "seeds_run": n, "sd": sd, "mde": c.get("mde"), "seeds": seeds,
               "compute_h": compute_h(seeds)}
        members = [e for e in family or () if is_family_test(e)]
        if len(members) > 1 and any(e is c for e in members):
            others = [e["p"] for e in members if e is not c]
            levels = {"adjusted_now": bh_threshold(others, len(members), alpha), "adjusted_worst": alpha / len(members)}
            row["adjusted"] = {"family": len(members), **{
                k: {"alpha": a, "seeds": (ns := seeds_for_mde(spread, target, alpha=a)), "compute_h": compute_h(ns)}
                for k, a in levels.items()}}
        declared = (results.get("declared") or {}).get("primary") or {}
        if list(declared.get("pair") or ()) == c["pair"] and declared.get("metric", "val_loss") == "val_loss":
            rank = rank_test_seeds(seeds, declared.get("test", "wilcoxon"), alpha)  # the test that decides
            if rank:
                row["declared_test"] = {**rank, "compute_h": compute_h(rank["seeds"])}
        if split:
            upper = split.get("seeds_for_target_upper")
            row["split"] = {"sd_train": math.sqrt(split["var_train"]), "sd_train_interval": split["sd_train_interval"],
                            "validation_se_diff": split["validation_se_diff"], "seeds_upper": upper,
                            "compute_h_upper": compute_h(upper)}
        rows.append(row)
    if not rows:
        return None
    return {"target": target, "power": MDE_POWER, "per_run_compute_s": per_run,
            "compute_parts": timing.get("compute_parts"), "machine": results.get("machine"), "pairs": rows}


def comparison_se(entry: dict[str, Any]) -> float | None:
    """The standard error of a stored comparison's mean difference, read back from its interval and df
    (None without an interval: one seed, a degenerate variance, or missing values)."""
    from scipy import stats as st

    low, high, df, conf = entry.get("low"), entry.get("high"), entry.get("df"), entry.get("confidence", 0.95)
    if low is None or high is None or not df:
        return None
    return (high - low) / (2 * float(st.t.ppf(0.5 + conf / 2, df)))


def comparison_mde(entry: dict[str, Any]) -> float | None:
    """`mde` of a stored comparison, from its read-back standard error (`comparison_se`) and df."""
    se = comparison_se(entry)
    if se is None:
        return None
    mde = minimum_detectable_effect(se, entry["df"], alpha=1 - entry.get("confidence", 0.95))
    return mde if math.isfinite(mde) else None


def _interval(d: dict[str, Any]) -> Interval:
    """The Interval back from its `to_dict` form (None bounds: unbounded, or degenerate)."""
    nan = math.nan if d.get("degenerate") else math.inf
    return Interval(d["mean"], -nan if d.get("low") is None else d["low"], nan if d.get("high") is None else d["high"],
                    d["n"], d["confidence"], d["method"], d.get("df"), d.get("items"), d.get("p"), d.get("degenerate", False))


def constant_metrics(results: dict[str, Any]) -> list[str]:
    """Metrics that take one value for every variant, seed and item (e.g. a cloze exact match that no
    model ever gets): they cannot vary, so no comparison of them is a test."""
    out = []
    for m in task_metrics(results):
        seen = {x for v in results["variants"].values() for s in _per_item(v, m).values() for x in s.get("per_item", [s.get("value")])}
        if len(seen) == 1:
            out.append(m)
    return out


def is_family_test(entry: dict[str, Any]) -> bool:
    """Whether a comparison is a test of the report's multiplicity family: a p-value (two or more seeds and a
    variance estimate) and not an alternative definition shown for reference."""
    return entry.get("p") is not None and entry.get("in_family", True) and entry.get("n", 0) >= 2


def adjust_family(entries: list[dict[str, Any]], confidence: float = 0.95,
                  equivalences: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Benjamini-Hochberg over the entries that are tests (a p-value: two or more seeds and a variance
    estimate); sets `p_adjusted`, `survives` and the final `verdict` of every entry in place and
    returns what the report says about the family. `equivalences`: TOST results ({margin, p}) that are
    members of the family too; each gets its `p_adjusted`."""
    # One seed is no test, whatever its items say (stats.verdict prints "inconclusive with 1 seed"): an
    # accuracy compared over the items of one seed has a p-value but stays out of the family.
    family = [e for e in entries if is_family_test(e)]
    tosts = [e for e in equivalences if e.get("p") is not None]
    adjusted = benjamini_hochberg([e["p"] for e in family] + [e["p"] for e in tosts])
    for e, q in zip(family, adjusted):
        e["p_adjusted"], e["survives"] = q, bool(q < 1 - confidence and e["excludes_zero"])
    for e, q in zip(tosts, adjusted[len(family):]):
        e["p_adjusted"] = q
    for e in entries:
        if e.get("missing") or e.get("mean") is None or not e.get("in_family", True):
            continue
        e.setdefault("p_adjusted", None)
        e.setdefault("survives", False)
        e["verdict"] = verdict(_interval(e), lower_is_better=e.get("lower_is_better"), scale=e.get("scale", 1.0),
                               unit=e.get("unit", ""), p_adjusted=e["p_adjusted"])
    bounds = sum(bool(e.get("different_bounds")) for e in entries)
    return {
        "method": "Benjamini-Hochberg", "q": round(1 - confidence, 10), "size": len(family) + len(tosts),
        "equivalence_tests": len(tosts),
        "raw_excluding_zero": sum(bool(e["excludes_zero"]) for e in family),
        "expected_by_chance": (1 - confidence) * len(family),
        "survivors": sum(e["survives"] for e in family),
        "min_p_adjusted": min((e["p_adjusted"] for e in family), default=None),
        "left_out": {"alternative definitions": sum(not e.get("in_family", True) and not e.get("declared_primary")
                                                    and not e.get("different_bounds") for e in entries),
                     "declared primary": sum(bool(e.get("declared_primary")) for e in entries),
                     "no variance estimate": sum(bool(e.get("degenerate")) and e.get("in_family", True) for e in entries),
                     "one seed": sum(e.get("n", 0) < 2 and e.get("mean") is not None and e.get("in_family", True)
                                     for e in entries),
                     "missing": sum(bool(e.get("missing")) for e in entries),
                     **({"different bounds": bounds} if bounds else {})},  # a study with block arms only
    }


def summarise(results: dict[str, Any], pairs: list[tuple[str, str]] | None = None, confidence: float = 0.95,
              seeds_declared: list[int] | None = None) -> None:
    """Add `summary` to every variant, `comparisons` (each pair in `pairs`, default: every variant
    against the first), `multiplicity` (the family's adjustment) and `sizing` to `results`, and each endpoint's
    own numbers (`ENDPOINTS`; `seeds_declared`: the study's seeds, None: read from the results or the preset)."""
    variants = results["variants"]
    names = list(variants)
    scalar_metrics = ["val_loss"] + [m for m in ("val_loss_change", *TRAINING_METRICS, *ANALYSIS_METRICS)
                                     if any(seed_scalars(v, m) for v in variants.values())]
    tasks = task_metrics(results)
    family: list[dict[str, Any]] = []  # every paired comparison whose verdict the report prints
    for v in variants.values():
        summary = {}
        for m in scalar_metrics:
            vals = list(seed_scalars(v, m).values())
            if vals:
                iv = mean_interval(vals, confidence, bounds=(0.0, 1.0) if m in SHARES else None)
                summary[m] = {**iv.to_dict(), "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                              "method_label": METHOD_SEEDS}
        for m in tasks:
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
        for endpoint in ENDPOINTS:  # a variant's own summaries (the sink analysis), some of them in the family
            family += endpoint.variant(v, summary, confidence)
        v["summary"] = summary
    pairs = pairs or [(n, names[0]) for n in names[1:]]
    comparisons = []
    for a, b in pairs:
        if a not in variants or b not in variants:
            continue
        for m in scalar_metrics + tasks:
            c = compare_variants(variants[a], variants[b], m, confidence)
            if c is not None:
                comparisons.append({"pair": [a, b], **c, "mde": None if c.get("different_bounds") else comparison_mde(c)})
    for c in comparisons:
        if c["metric"] == "val_loss_change":
            c["unconverted"] = [variants[n]["label"] for n in c["pair"] if unconverted(results, variants[n])]
    results["comparisons"] = comparisons
    results["constant_metrics"] = constant_metrics(results)
    study = Study(results, pairs, comparisons, confidence, seeds_declared)
    # the declared tests that join the family (the "≈" claims: TOST) or leave it (the primary, tested once at 5 %)
    claimed = [test for endpoint in ENDPOINTS for test in endpoint.claim(study)]
    results["multiplicity"] = {
        **adjust_family(comparisons + family, confidence, claimed),
        "family": ("every paired comparison the report gives a verdict for: each compared pair of variants × metric "
                   "(validation loss, the training's peak gradient norm, accuracies, sink metrics), per variant the mean over layers of the value norm of "
                   "sinks − normal tokens and of the extra sink − the other tokens, and each K of the masking curve "
                   "against K = 0"),
    }
    for endpoint in ENDPOINTS:  # what each endpoint decides, once the family's adjusted p-values are set
        endpoint.judge(study)
    # what the val_loss target would take at this spread, unadjusted and at the level the family asks
    results["sizing"] = study_sizing(results, family=comparisons + family)
    for endpoint in ENDPOINTS:  # last: an endpoint judged from its own per-run records alone
        endpoint.conclude(study)


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


def training_curves(results: dict[str, Any]) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    """{variant label: {seed: (steps, validation loss)}} of the training loop's curve, every seed drawn
    (with 2-3 seeds a ± SD band says little: the seeds themselves are shown)."""
    curves = {}
    for v in results["variants"].values():
        per_seed = {seed: [tuple(x) for x in rec["curve"]] for seed, rec in v["seeds"].items() if rec.get("curve")}
        if per_seed:
            curves[v["label"]] = {seed: ([int(st) for st, _ in c], [float(x) for _, x in c]) for seed, c in per_seed.items()}
    return curves


def paired_val_loss_differences(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every compared pair's `val_loss` difference: the per-seed differences (variant − baseline, the
    same seed) and the stored paired interval over seeds (`comparisons`), for the figure of paired
    differences. Pairs with a missing seed, and pairs of different bounds (block sizes), are left out."""
    out = []
    for c in results.get("comparisons", []):
        if c["metric"] != "val_loss" or c.get("missing") or c.get("mean") is None or c.get("different_bounds"):
            continue
        a, b = (results["variants"][name] for name in c["pair"])
        va, vb = seed_values(a, "val_loss"), seed_values(b, "val_loss")
        out.append({"label": f"{c['variant']} − {c['baseline']}", "per_seed": {s: va[s] - vb[s] for s in sorted(va, key=str)},
                    "interval": {k: c.get(k) for k in ("mean", "low", "high", "n", "degenerate", "survives")}})
    return out
