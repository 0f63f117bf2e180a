"""The gap's trajectory and the training effect Δ_train (docs/method.md §7): how a compared pair's paired gap moved
over training, measured on the fixed validation at the scored steps (`val_curve`).

* `trajectory`: the paired gap a - b at every step both runs of a seed scored, with its t interval; its change
  between consecutive scored steps and, from `TREND_MIN_STEPS` scored steps on, its slope against log10 training
  tokens (per seed, then a t interval). Every compared pair's goes into results.json's `trajectories`, the declared
  primary's into `primary.trajectory` (`endpoints.primary`).
* `head_start`: from an AR initialisation, the two numbers a head start cannot hide behind: the step-0 gap (the
  converted models before training, paired per seed) and Δ_train = (a(T) - a(0)) - (b(T) - b(0)), per seed.
* `gap_movement`: how the gap moved, in words (a trend only where enough scored steps exist); `plot_val_curves`
  and `plot_gap_trajectory` draw the curves and the primary's gap. Raw intervals, none in the report's
  multiplicity family: described, not tested.

A trajectory measured at fewer than `LINE_MIN_STEPS` steps is drawn as points with intervals: a line through two
points looks like a measured curve. Every axis that carries a loss or a gap says which direction is better
(matplotlib is imported where a figure is drawn: the statistics import this module).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from sinkdlm.experiment.endpoints.base import Endpoint, Study, compared_baseline
from sinkdlm.experiment.endpoints.block_sizes import not_compared
from sinkdlm.experiment.formatting import fmt_ci, train_setting
from sinkdlm.experiment.metrics import paired_seed_differences, unconverted
from sinkdlm.reporting import Document
from sinkdlm.stats import mean_interval, rank_test


def _iv(d: list[float], confidence: float) -> dict[str, Any]:
    return mean_interval(d, confidence).to_dict() if d else {}


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


def tokens_per_step(results: dict[str, Any]) -> int:
    """Training tokens per optimizer step: results.json keeps only what the preset set, the rest are TrainConfig's
    defaults."""
    return train_setting(results, "batch_size") * train_setting(results, "seq_len")


def head_start(results: dict[str, Any], a_name: str, b_name: str, rank_name: str, confidence: float = 0.95) -> dict[str, Any]:
    """The step-0 gap of a pair (its converted models before training, paired per seed, with the validation's
    Monte-Carlo error) and the training effect Δ_train (`val_loss_change` paired per seed, its t interval and the
    `rank_name` rank test), for a pair whose runs start from step-0 controls."""
    a, b = results["variants"][a_name], results["variants"][b_name]
    out: dict[str, Any] = {}
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
    return out


def _at(step: int, traj: dict[str, Any]) -> str:
    tokens = traj.get("tokens_per_step")
    return f"step {step:,}" + (f" ({step * tokens:,} tokens)" if tokens and step else "")


def gap_movement(p: dict[str, Any], short: bool = False) -> str | None:
    """How the gap moved over the scored steps: the trend per 10× tokens where the trajectory has one, else the
    change between the scored steps, named as such; raw intervals, outside the multiplicity family, so no
    direction word."""
    traj = p.get("trajectory") or {}
    slope = traj.get("slope_per_decade")
    if slope:
        return (f"its trend {fmt_ci(slope)} nats per 10× training tokens (a slope per seed over {traj.get('scored_steps')} "
                f"scored steps spanning {traj.get('decades', 0):.1f} decades, t over seeds; raw interval, outside the "
                "multiplicity family: described, not tested)")
    changes = traj.get("step_changes") or []
    if not changes:
        return None
    why = (f"{traj.get('scored_steps')} scored step{'s' if traj.get('scored_steps') != 1 else ''} after step 0, "
           f"fewer than the {traj.get('trend_min_steps', 4)} log-spaced over a decade that a trend per 10× tokens needs"
           if (traj.get("scored_steps") or 0) < traj.get("trend_min_steps", 4)
           else f"{traj.get('scored_steps')} scored steps spanning {traj.get('decades') or 0:.1f} decades, less than "
                f"the {traj.get('trend_min_decades', 1):g} a trend per 10× tokens needs")
    if short:
        c = traj.get("scored_change") or changes[-1]
        return (f"the gap's change between the scored steps {c['from_step']:,} and {c['to_step']:,}: {fmt_ci(c)} "
                f"(paired per seed, raw interval outside the multiplicity family; no trend: {why})")
    said = "; ".join(f"{c['from_step']:,} → {c['to_step']:,}: {fmt_ci(c)}" for c in changes)
    return (f"the change of the gap between the scored steps (paired per seed, t over seeds; raw intervals, outside "
            f"the multiplicity family: described, not tested; no trend: {why}): {said}")


def _unconverted_words(results: dict[str, Any], te: dict[str, Any]) -> str:
    """Where an arm had no conversion (`metrics.unconverted`), what Δ_train is there instead."""
    names = [results["variants"][n]["label"] for n in te.get("unconverted") or []]
    if not names:
        return ""
    return (f"; but {' and '.join(names)} had no conversion (its step 0 is the starting checkpoint, the same model "
            "on every seed), so here Δ_train is the gap at the end minus the step-0 gap: how much of the "
            "conversion's step-0 gap training closed, not a gain from the sink")


LINE_MIN_STEPS = 3  # fewer measured steps: points with intervals, no line between them


def _series(ax, x: list, pts: list[dict[str, Any]], colour, label: str | None, dodge: float = 0.0, **line) -> None:
    """Means with their 95 % CI at the measured steps `x`: a line and a band from `LINE_MIN_STEPS` steps on,
    else points with error bars (no line: two points are not a curve), moved `dodge` along x so that arms measured
    at the same steps do not hide each other."""
    mean = [q["mean"] for q in pts]
    lo = [q["low"] if q.get("low") is not None else q["mean"] for q in pts]
    hi = [q["high"] if q.get("high") is not None else q["mean"] for q in pts]
    if len(pts) >= LINE_MIN_STEPS:
        ax.plot(x, mean, "o-", color=colour, label=label, **line)
        ax.fill_between(x, lo, hi, color=colour, alpha=0.12)
    else:
        ax.errorbar([xi + dodge for xi in x], mean, yerr=[[m - a for m, a in zip(mean, lo)], [b - m for m, b in zip(mean, hi)]], fmt="o",
                    color=colour, capsize=4, label=label, **line)


def plot_val_curves(results: dict[str, Any], path, baseline: str | None = None, *, title: str | None = None) -> Path | None:
    """Left: each variant's fixed val_loss against training steps (mean over seeds, shaded 95 % CI). Right, given a
    `baseline` with stored `trajectories`: each variant's paired gap to it at every scored step (mean and 95 % CI
    over seeds): the left panel's bands are the seeds' spread, which pairing removes, so only the right one says
    when a difference appears and whether it holds."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import StrMethodFormatter

    from sinkdlm.analysis.figures import save_figure

    gaps = [t for t in results.get("trajectories") or [] if baseline is not None and t["pair"][1] == baseline]
    fig = Figure(figsize=(13.0 if gaps else 7.5, 4.5), layout="constrained")
    axes = fig.subplots(1, 2 if gaps else 1, squeeze=False)[0]
    ax = axes[0]
    colour, drawn = {}, 0
    steps_all = [p["step"] for v in results["variants"].values() for rec in v["seeds"].values()
                 for p in rec.get("val_curve") or []]
    # points side by side (a line needs LINE_MIN_STEPS): 1.5 % of the step range apart per arm
    dodge = 0.015 * (max(steps_all) - min(steps_all)) if steps_all else 0.0
    centre = (len(results["variants"]) - 1) / 2
    for name, v in results["variants"].items():
        by_step: dict[int, list[float]] = {}
        for rec in v["seeds"].values():
            for p in rec.get("val_curve") or []:
                by_step.setdefault(p["step"], []).append(p["val_loss"])
        steps = sorted(s for s in by_step if len(by_step[s]) >= 2)
        if len(steps) < 2:
            continue
        ivs = [mean_interval(by_step[s]).to_dict() for s in steps]
        colour[name] = f"C{drawn % 10}"
        _series(ax, steps, ivs, colour[name], f"{v['label']} ({len(by_step[steps[-1]])} seeds)",
                dodge * (list(results["variants"]).index(name) - centre), markersize=3)
        drawn += 1
    if not drawn:
        return None
    ax.set_ylabel("fixed validation loss (nats / token; lower is better)")
    ax.legend(fontsize=7, ncol=2)
    if gaps:
        gx = axes[1]
        for i, t in enumerate(gaps):  # the same colour as the variant's curve on the left
            pts = [q for q in t["points"] if q.get("mean") is not None]  # step 0 too: a head start shows
            _series(gx, [q["step"] for q in pts], pts, colour.get(t["pair"][0]),
                    f"{results['variants'][t['pair'][0]]['label']} − {results['variants'][baseline]['label']}",
                    dodge * (i - (len(gaps) - 1) / 2), markersize=3)
        gx.axhline(0.0, color="grey", linewidth=0.8)
        gx.set_ylabel("paired gap in fixed val_loss (nats / token)\n< 0: the variant is better")
        gx.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the curves, never on them
    for a in axes:
        a.set_xlabel("training step")
        a.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
        a.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=11)
    return save_figure(fig, path, palette=True)


def plot_gap_trajectory(results: dict[str, Any], path, *, title: str | None = None) -> Path | None:
    """The primary pair's paired gap (a − b) against training tokens, mean and 95 % CI over seeds, with the
    slope per decade of tokens in the legend where the trajectory has one (else the change between the first and
    last scored steps after step 0): does the lead vanish, hold or grow?"""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator, StrMethodFormatter

    from sinkdlm.analysis.figures import save_figure

    p = results.get("primary") or {}
    traj = p.get("trajectory")
    if not traj:
        return None
    pts = [q for q in traj["points"] if q.get("mean") is not None]
    x = [q["tokens"] if q.get("tokens") is not None else q["step"] for q in pts]
    fig = Figure(figsize=(7.5, 5.8), layout="constrained")
    ax = fig.subplots()
    a, b = (results["variants"][n]["label"] for n in p["pair"])
    seeds = sorted({s for q in pts for s in q.get("per_seed") or {}}, key=lambda s: int(s) if str(s).isdigit() else s)
    style = "-" if len(pts) >= LINE_MIN_STEPS else "."  # fewer measured steps: each seed's points, no line
    for i, seed in enumerate(seeds):  # one thin line per seed: a lagging seed shows as itself, not only as a wide CI
        xy = [(xi, q["per_seed"][seed]) for xi, q in zip(x, pts) if seed in (q.get("per_seed") or {})]
        ax.plot(*zip(*xy), style, color="tab:blue", alpha=0.35, linewidth=0.9, label="one seed" if i == 0 else None)
    _series(ax, x, pts, "black", f"{a} − {b}, mean over seeds with its 95 % CI (t over seeds)")
    ax.axhline(0.0, color="grey", linewidth=0.8)
    slope, change = traj.get("slope_per_decade"), traj.get("scored_change")
    if slope and slope.get("low") is not None:
        ax.plot([], [], " ", label=f"slope {slope['mean']:+.3f} [{slope['low']:+.3f}, {slope['high']:+.3f}] nats per 10× tokens")
    elif change and change.get("low") is not None:  # too few scored steps for a trend: the change between them
        ax.plot([], [], " ", label=f"change step {change['from_step']:,} → {change['to_step']:,}: {change['mean']:+.3f} "
                                   f"[{change['low']:+.3f}, {change['high']:+.3f}] (no trend: "
                                   f"{traj.get('scored_steps')} scored steps over {traj.get('decades') or 0:.1f} decades)")
    ax.set_xlabel("training tokens per run" if traj.get("tokens_per_step") else "training step")
    ax.set_ylabel(f"paired gap in fixed val_loss (nats / token)\n< 0: {a} is better")
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))  # 307,200 tokens, not 300000 in sci. notation
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5))  # "1,000,000" labels need the room
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14))  # below: never on the curves
    fig.suptitle(title or f"The paired gap {a} − {b} on the fixed validation over training", fontsize=11)
    return save_figure(fig, path, palette=True)


class Trajectory(Endpoint):
    """Every compared pair's gap over the scored steps (results.json's `trajectories`) and the learning curves."""

    name = "trajectories"

    def judge(self, study: Study) -> None:
        # every compared pair's paired gap at each scored step (`val_curve`): when its difference appears, and
        # whether it holds (the primary's own trajectory is also under `primary`); a pair of different block sizes
        # has none: its val_loss are two different bounds (docs/method.md §15)
        variants, per_step = study.results["variants"], tokens_per_step(study.results)
        curves = [{"pair": [a, b], **traj} for a, b in study.pairs if a in variants and b in variants
                  and not not_compared(variants[a], variants[b])
                  and (traj := trajectory(variants[a], variants[b], per_step, study.confidence))]
        if curves:
            study.results["trajectories"] = curves

    def section(self, doc: Document, results: dict[str, Any], out: Path) -> None:
        baseline = compared_baseline(results)
        curves_fig = plot_val_curves(results, Path(out) / "figures" / "val_curves.png", baseline)
        if curves_fig:
            doc.image(curves_fig, "The fixed validation loss at the scored steps (`val_curve`), mean and 95 % CI over seeds: "
                                  "learning curves on the same set and noise for every variant; right, each variant's "
                                  f"paired gap to {results['variants'][baseline]['label']} at those steps (95 % CI over seeds)")
