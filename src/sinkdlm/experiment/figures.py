"""Figures of an experiment's declared questions, drawn from its results.json only (no statistic is computed
here but a learning curve's mean and interval over seeds; `experiment.summary` and `experiment.endpoints` made
every other number):

* `plot_forest`: the paired val_loss difference of every compared pair, each with its 95 % CI, its MDE
  (the smallest true difference the study would detect with 80 % power) and, where a claim of "≈" was
  declared, the equivalence margin;
* `plot_val_curves`: each variant's fixed val_loss at the scored steps (`val_curve`), mean and 95 % CI over seeds,
  and beside it each variant's paired gap to the baseline at those steps (`trajectories`);
* `plot_gap_trajectory`: the primary pair's paired gap against training tokens, from step 0, with its CI.

A trajectory measured at fewer than `LINE_MIN_STEPS` steps is drawn as points with intervals: a line through two
points looks like a measured curve. Every axis that carries a loss or a gap says which direction is better.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, StrMethodFormatter

from sinkdlm.analysis.figures import save_figure
from sinkdlm.stats import mean_interval

LINE_MIN_STEPS = 3  # fewer measured steps: points with intervals, no line between them
# The forest's footnote: what its status words mean, in words (the report's caption says the same).
FOREST_NOTE = ("\"survives BH\": the difference stays significant after the Benjamini-Hochberg adjustment over the "
               "report's family of paired comparisons (false discovery rate 5 %), so its direction is stated; \"not "
               "after BH\": the raw 95 % CI excludes 0 but the adjusted p does not stay below 5 %")


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


def _forest_note(c: dict[str, Any]) -> str:
    """The status written beside a forest row, so the picture cannot be read as more than the report says: a raw
    interval clear of zero that the multiplicity adjustment (or the declared test) does not confirm says so."""
    eq = c.get("equivalence")
    if eq:
        return eq["verdict"]
    primary = c.get("declared_primary")  # tested once by its declared test, outside the BH family
    if c.get("survives"):
        return "declared test rejects" if primary else "survives BH"
    if c.get("degenerate"):
        return "inconclusive (no variance)"
    if c.get("excludes_zero"):
        if primary:
            return "raw CI excludes 0; the declared test does not reject"
        adjusted = c.get("p_adjusted")
        return "raw CI excludes 0; not after BH" + (f" (adjusted p = {adjusted:.2g})" if adjusted is not None else "")
    return "no difference detected"


def plot_forest(results: dict[str, Any], path, baseline: str, *, title: str | None = None) -> Path | None:
    """One row per compared pair on val_loss (the pairs against `baseline` first): Δ with its 95 % CI (black), ± the
    MDE around 0 (blue) and ± a declared equivalence margin (green, dashed); beside each row its status
    (`_forest_note`: the TOST verdict, or whether a direction survives), and under the axes what "survives BH"
    means (`FOREST_NOTE`). None when nothing was compared."""
    rows = [c for c in results.get("comparisons", []) if c["metric"] == "val_loss" and c.get("mean") is not None]
    rows.sort(key=lambda c: c["pair"][1] != baseline)  # stable: the study's own order within each group
    if not rows:
        return None
    fig = Figure(figsize=(9.5, 2.0 + 0.5 * len(rows)), layout="constrained")
    ax = fig.subplots()
    for y, c in enumerate(reversed(rows)):
        if c.get("low") is not None:
            ax.errorbar([c["mean"]], [y], xerr=[[c["mean"] - c["low"]], [c["high"] - c["mean"]]], fmt="s", color="black",
                        capsize=4, markersize=5, label="Δ, 95 % CI over seeds")
        else:
            ax.plot([c["mean"]], [y], "s", color="black")
        if c.get("mde"):
            ax.plot([-c["mde"], c["mde"]], [y - 0.28] * 2, "|-", color="tab:blue", alpha=0.7, linewidth=1.2,
                    label="± MDE around 0 (80 % power)")
        eq = c.get("equivalence")
        if eq:
            ax.plot([-eq["margin"], eq["margin"]], [y + 0.28] * 2, "|--", color="tab:green", linewidth=1.2,
                    label="± declared equivalence margin")
        ax.annotate(_forest_note(c), (c["high"] if c.get("high") is not None else c["mean"], y),
                    textcoords="offset points", xytext=(6, -3), fontsize=7)
    ax.axvline(0.0, color="grey", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [f"{c['variant']} − {c['baseline']}" for c in reversed(rows)], fontsize=8)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xlabel("Δ fixed validation loss, variant − baseline (nats / token; < 0: the variant is better)")
    fig.supxlabel(textwrap.fill(FOREST_NOTE, 150), fontsize=6.5, x=0.01, ha="left")  # the layout keeps room for it
    ax.grid(axis="x", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    seen = dict(zip(labels, handles))
    ax.legend(seen.values(), seen.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside, never on a row
    if title:
        fig.suptitle(title, fontsize=11)
    return save_figure(fig, path, palette=True)


def plot_val_curves(results: dict[str, Any], path, baseline: str | None = None, *, title: str | None = None) -> Path | None:
    """Left: each variant's fixed val_loss against training steps (mean over seeds, shaded 95 % CI). Right, given a
    `baseline` with stored `trajectories`: each variant's paired gap to it at every scored step (mean and 95 % CI
    over seeds): the left panel's bands are the seeds' spread, which pairing removes, so only the right one says
    when a difference appears and whether it holds."""
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
