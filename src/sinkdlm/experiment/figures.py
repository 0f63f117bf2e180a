"""Figures of an experiment's declared questions, drawn from its results.json only (no statistic is computed
here but a learning curve's mean and interval over seeds; `experiment.summary` and `experiment.endpoints` made
every other number):

* `plot_forest`: the paired val_loss differences against a baseline, each with its 95 % CI, its MDE
  (the smallest true difference the study would detect with 80 % power) and, where a claim of "≈" was
  declared, the equivalence margin;
* `plot_val_curves`: each variant's fixed val_loss at the scored steps (`val_curve`), mean and 95 % CI over seeds,
  and beside it each variant's paired gap to the baseline at those steps (`trajectories`);
* `plot_gap_trajectory`: the primary pair's paired gap against training tokens, from step 0, with its CI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import StrMethodFormatter

from sinkdlm.analysis.figures import save_figure
from sinkdlm.stats import mean_interval


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
    """One row per variant compared with `baseline` on val_loss, and one per declared equivalence claim: Δ with its
    95 % CI (black), ± the MDE around 0 (blue) and ± a declared equivalence margin (green, dashed); beside each row
    its status (`_forest_note`: the TOST verdict, or whether a direction survives). None when nothing was compared."""
    rows = [c for c in results.get("comparisons", [])
            if c["metric"] == "val_loss" and (c["pair"][1] == baseline or c.get("equivalence")) and c.get("mean") is not None]
    if not rows:
        return None
    fig = Figure(figsize=(9.5, 1.6 + 0.5 * len(rows)), layout="constrained")
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
    ax.set_xlabel("Δ fixed validation loss (nats / token; < 0: the variant is better)")
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
    for name, v in results["variants"].items():
        by_step: dict[int, list[float]] = {}
        for rec in v["seeds"].values():
            for p in rec.get("val_curve") or []:
                by_step.setdefault(p["step"], []).append(p["val_loss"])
        steps = sorted(s for s in by_step if len(by_step[s]) >= 2)
        if len(steps) < 2:
            continue
        ivs = [mean_interval(by_step[s]) for s in steps]
        line = ax.plot(steps, [iv.mean for iv in ivs], "o-", markersize=3, label=f"{v['label']} ({len(by_step[steps[-1]])} seeds)")[0]
        ax.fill_between(steps, [iv.low for iv in ivs], [iv.high for iv in ivs], color=line.get_color(), alpha=0.15)
        colour[name] = line.get_color()
        drawn += 1
    if not drawn:
        return None
    ax.set_ylabel("fixed validation loss (nats / token)")
    ax.legend(fontsize=7, ncol=2)
    if gaps:
        gx = axes[1]
        for t in gaps:  # the same colour as the variant's curve on the left
            pts = [q for q in t["points"] if q.get("mean") is not None]  # step 0 too: a head start shows
            steps = [q["step"] for q in pts]
            c = colour.get(t["pair"][0])
            gx.plot(steps, [q["mean"] for q in pts], "o-", markersize=3, color=c,
                    label=f"{results['variants'][t['pair'][0]]['label']} − {results['variants'][baseline]['label']}")
            lo = [q["low"] if q.get("low") is not None else q["mean"] for q in pts]
            hi = [q["high"] if q.get("high") is not None else q["mean"] for q in pts]
            gx.fill_between(steps, lo, hi, color=c, alpha=0.12)
        gx.axhline(0.0, color="grey", linewidth=0.8)
        gx.set_ylabel("paired gap in fixed val_loss (nats / token)")
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
    for i, seed in enumerate(seeds):  # one thin line per seed: a lagging seed shows as itself, not only as a wide CI
        xy = [(xi, q["per_seed"][seed]) for xi, q in zip(x, pts) if seed in (q.get("per_seed") or {})]
        ax.plot(*zip(*xy), "-", color="tab:blue", alpha=0.35, linewidth=0.9, label="one seed" if i == 0 else None)
    ax.plot(x, [q["mean"] for q in pts], "o-", color="black", label=f"{a} − {b}, mean over seeds")
    lo = [q["low"] if q.get("low") is not None else q["mean"] for q in pts]
    hi = [q["high"] if q.get("high") is not None else q["mean"] for q in pts]
    ax.fill_between(x, lo, hi, color="black", alpha=0.12, label="95 % CI (t over seeds)")
    ax.axhline(0.0, color="grey", linewidth=0.8)
    slope, change = traj.get("slope_per_decade"), traj.get("scored_change")
    if slope and slope.get("low") is not None:
        ax.plot([], [], " ", label=f"slope {slope['mean']:+.3f} [{slope['low']:+.3f}, {slope['high']:+.3f}] nats per 10× tokens")
    elif change and change.get("low") is not None:  # too few scored steps for a trend: the change between them
        ax.plot([], [], " ", label=f"change step {change['from_step']:,} → {change['to_step']:,}: {change['mean']:+.3f} "
                                   f"[{change['low']:+.3f}, {change['high']:+.3f}] (no trend: "
                                   f"{traj.get('scored_steps')} scored steps over {traj.get('decades') or 0:.1f} decades)")
    ax.set_xlabel("training tokens per run" if traj.get("tokens_per_step") else "training step")
    ax.set_ylabel("paired gap in fixed val_loss (nats / token)")
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))  # 307,200 tokens, not 300000 in sci. notation
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14))  # below: never on the curves
    fig.suptitle(title or f"The paired gap {a} − {b} on the fixed validation over training", fontsize=11)
    return save_figure(fig, path, palette=True)
