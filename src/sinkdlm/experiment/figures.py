"""The figure every endpoint shares, drawn from results.json only (no statistic is computed here):
`plot_forest`, the paired val_loss difference of every compared pair, each with its 95 % CI, its MDE (the smallest
true difference the study would detect with 80 % power) and, where a claim of "≈" was declared, the equivalence
margin. Each endpoint draws its own figures (`experiment.endpoints`: the learning curves and the primary's gap in
`trajectory`, the escape curves in `escape.figures`).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from sinkdlm.analysis.figures import save_figure

# The forest's footnote: what its status words mean, in words (the report's caption says the same).
FOREST_NOTE = ("\"survives BH\": the difference stays significant after the Benjamini-Hochberg adjustment over the "
               "report's family of paired comparisons (false discovery rate 5 %), so its direction is stated; \"not "
               "after BH\": the raw 95 % CI excludes 0 but the adjusted p does not stay below 5 %")


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
    means (`FOREST_NOTE`). A pair of different block sizes is left out: its val_loss are two different bounds, not
    compared (`different_bounds`, docs/method.md §15). None when nothing was compared."""
    rows = [c for c in results.get("comparisons", []) if c["metric"] == "val_loss" and c.get("mean") is not None
            and not c.get("different_bounds")]
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
