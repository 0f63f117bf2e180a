"""Figures of the escape endpoint (docs/method.md §11), drawn from what was stored; nothing is estimated here:

* `plot_escape_km`: per arm, the Kaplan-Meier fraction of runs still on the unigram plateau against the training
  step (results.json's `escape.km`, computed by `escape.summary.kaplan_meier`), censored runs marked;
* `plot_escape_run`: one run: its probe loss with the plateau, the threshold, the escape step and the sink
  onset; the attention mass on detected sinks per layer (and on the sink token, for a sink arm) from its
  `probes.json`; and its pre-clip gradient norm from its `train/metrics.jsonl`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import StrMethodFormatter

from sinkdlm.analysis.figures import integer_ticks, plain_log_ticks, save_figure


def plot_escape_km(results: dict[str, Any], path, *, title: str | None = None) -> Path | None:
    """One step curve per arm: the Kaplan-Meier estimate of the fraction of runs still on the plateau after each
    training step, its pointwise 95 % band (Greenwood, log-log) shaded, a '+' at each censored run (still on the
    plateau at its last probe). None when no arm has escape records."""
    esc = results.get("escape") or {}
    km = {n: k for n, k in (esc.get("km") or {}).items() if k}
    if not km:
        return None
    last = max(results.get("train", {}).get("max_steps") or 0, *(max(k["steps"]) for k in km.values()))
    fig = Figure(figsize=(8.0, 4.6), layout="constrained")
    ax = fig.subplots()
    # arms often share a stretch of curve (two arms with one run left, both censored at the last step): each its
    # own dash pattern and a smaller '+' than the arm before, so a curve drawn over another still shows both
    styles = ("-", (0, (5, 3)), (0, (1, 2)), (0, (6, 2, 1, 2)))
    for i, (name, k) in enumerate(km.items()):
        label = results["variants"][name]["label"]
        x = [0, *k["steps"], last]
        y = [1.0, *k["survival"], k["survival"][-1]]
        line = ax.step(x, y, where="post", linewidth=1.8, linestyle=styles[i % len(styles)],
                       label=f"{label}: {k['escaped']} of {k['n']} runs escaped"
                             + (f", median step {k['median']:,}" if k["median"] is not None else ", median not reached"))[0]
        lo = [1.0, *[v if v is not None else s for v, s in zip(k["low"], k["survival"])]]
        hi = [1.0, *[v if v is not None else s for v, s in zip(k["high"], k["survival"])]]
        ax.fill_between(x[:-1], lo, hi, step="post", color=line.get_color(), alpha=0.12)
        if k["censored"]:  # a censored run: the curve's value at its last probe
            at = {s: p for s, p in zip(k["steps"], k["survival"])}
            ax.plot(k["censored"], [at[s] for s in k["censored"]], "+", color=line.get_color(),
                    markersize=max(13 - 3 * i, 5), markeredgewidth=1.8)
    ax.plot([], [], "+", color="black", markersize=9, label="censored: still on the plateau at its last probe")
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlim(0, last * 1.02)  # a run censored at the last step keeps its mark in view
    ax.set_xlabel("training step")
    ax.set_ylabel("fraction of runs still on the unigram plateau\n(lower: more runs have escaped)")
    integer_ticks(ax)  # steps are integers: no tick between two probes of a short run
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    seeds = f"{len(esc.get('seeds_in') or [])} of {len(esc.get('seeds_declared') or [])} declared seeds"
    fig.suptitle(title or f"Leaving the unigram plateau: Kaplan-Meier per arm, 95 % band shaded ({seeds}"
                          + ("" if esc.get("complete") else ", interim") + ")", fontsize=10)
    return save_figure(fig, path, palette=True)  # line plots: an indexed PNG, a third the size


def plot_escape_run(record: dict[str, Any], probes: dict[str, Any], metrics: list[dict[str, Any]], label: str,
                    path, *, onset_mass: float | None = None, onset_first_layer: int = 0) -> Path | None:
    """One run against the training step. `record`: its results.json `escape` record; `probes`: its probes.json;
    `metrics`: its `read_metrics` rows. Rows: the probe loss (plateau, threshold, escape step, sink onset); the
    attention mass on detected sinks per layer (the onset mark from `onset_first_layer` on); for a sink arm the
    mass on the sink token per layer; the pre-clip gradient norm per logged interval (its peak marked)."""
    points = sorted((int(s), p) for s, p in (probes.get("probes") or {}).items())
    if not points:
        return None
    steps = [s for s, _ in points]
    token = points[-1][1].get("sink_token_mass") is not None
    rows = 4 if token else 3
    fig = Figure(figsize=(8.0, 2.3 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, 1, sharex=True)
    esc, onset = record["escape"], record["onset"]
    ax = axes[0]
    ax.plot(steps, [p["loss"] for _, p in points], "o-", markersize=2.5, color="black", label="probe loss")
    ax.axhline(record["plateau"]["probe_cross_entropy"], color="tab:grey", linestyle=":",
               label=f"unigram plateau {record['plateau']['probe_cross_entropy']:.2f}")
    ax.axhline(record["threshold"], color="tab:red", linestyle="--", label=f"threshold {record['threshold']:.2f}")
    # colours apart from the layers' (C0-C3); dotted: censored at the last probe
    marks = [(esc, "black", "-", "escape"), (onset, "tab:brown", "-.", "sink onset")]
    for e, colour, style, what in marks:
        style = style if not e["censored"] else ":"
        for a in axes:
            a.axvline(e["step"], color=colour, linestyle=style, linewidth=1.1, alpha=0.8)
        ax.plot([], [], color=colour, linestyle=style,
                label=f"{what} step {e['step']:,}" if not e["censored"] else f"{what} censored (> {e['step']:,})")
    ax.set_ylabel("probe loss (nats / token;\nlower is better)")
    ax.legend(fontsize=7, loc="upper right")
    layers = len(points[-1][1]["detected_sink_mass"])
    colours = [f"C{i % 10}" for i in range(layers)]
    ax = axes[1]
    for i in range(layers):
        ax.plot(steps, [p["detected_sink_mass"][i] for _, p in points], color=colours[i], linewidth=1.2,
                linestyle="-" if i >= onset_first_layer else "--",
                label=f"layer {i}" + ("" if i >= onset_first_layer else " (not used for the onset)"))
    if onset_mass is not None:
        ax.axhline(onset_mass, color="black", linestyle=":", linewidth=1.0, label=f"onset mark {onset_mass:g}")
    ax.set_ylabel("attention on\ndetected sinks")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    if token:
        ax = axes[2]
        for i in range(layers):
            ax.plot(steps, [p["sink_token_mass"][i] for _, p in points], color=colours[i], linewidth=1.2,
                    label=f"layer {i}")
        ax.set_ylabel("attention on\nthe sink token")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7, ncol=2, loc="upper left")
    ax = axes[-1]
    grads = [(r["step"], r.get("grad_norm_max", r.get("grad_norm"))) for r in metrics if "loss" in r]
    grads = [(s, g) for s, g in grads if g is not None]
    if grads:
        ax.plot(*zip(*grads), color="tab:purple", linewidth=0.9, label="largest pre-clip gradient norm per logged interval")
        peak = record.get("grad_norm_peak")
        if peak:
            ax.plot([peak["step"]], [peak["value"]], "v", color="tab:purple", label=f"peak {peak['value']:.3g} at step {peak['step']:,}")
        plain_log_ticks(ax)  # 1-2-3-5 ticks as plain numbers, as the progress page's gradient norms
        ax.margins(y=0.15)  # the peak's marker inside the axes
        ax.legend(fontsize=7, loc="best")  # off the peak's marker
    else:
        ax.text(0.5, 0.5, "no gradient norm in train/metrics.jsonl", transform=ax.transAxes, ha="center")
    ax.set_ylabel("gradient norm")
    ax.set_xlabel("training step")
    integer_ticks(ax)  # steps are integers: no tick between two probes of a short run
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    for a in axes:
        a.grid(alpha=0.3)
    fig.suptitle(f"{label}: probe loss, attention on sinks and gradient norm against the training step", fontsize=10)
    return save_figure(fig, path, palette=True)  # one per run, committed by the dozen: kept small
