"""Sinks as the block shrinks (docs/method.md §15): the moving-sink rate of each arm against its block size.

A study whose arms differ in `block_size` (block diffusion, §13) gets, per arm, the content sink-set change rate
(§6, mean over layers, from each seed's analysis) as a mean over seeds with its Student t interval, and one figure:
the rate against the block size (the whole sequence at its length), one line per arm family (vanilla, + sinks).
The paired tests of the arms are the declared primary's and the comparisons' (`primary`, `summary`); this endpoint
describes, it decides nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from sinkdlm.analysis.figures import save_figure
from sinkdlm.config.train import TrainConfig
from sinkdlm.experiment.endpoints.base import Endpoint, Study
from sinkdlm.experiment.metrics import ANALYSIS_METRICS, seed_scalars
from sinkdlm.reporting import Document
from sinkdlm.stats import mean_interval

METRIC = "content_sink_set_change_rate"


def block_sizes(results: dict[str, Any]) -> dict[str, Any] | None:
    """Per arm: its block size (None: the whole sequence), whether it has sink tokens, and the rate's mean
    [95 % CI] over its analysed seeds. None unless some arm is a block model."""
    variants = results["variants"]
    if not any(v.get("switches", {}).get("block_size") for v in variants.values()):
        return None
    arms = []
    for name, v in variants.items():
        values = list(seed_scalars(v, METRIC).values())
        iv = mean_interval(values, bounds=(0.0, 1.0)).to_dict() if values else None
        arms.append({"variant": name, "label": v["label"], "block_size": v.get("switches", {}).get("block_size"),
                     "sinks": int(v.get("switches", {}).get("num_sink_tokens", 0)), "seeds": len(values),
                     "rate": iv})
    # results.json's `train` keeps the preset's non-default fields: the default sequence is TrainConfig's
    return {"metric": METRIC, "seq_len": results.get("train", {}).get("seq_len", TrainConfig.seq_len), "arms": arms}


def _x(arm: dict[str, Any], seq_len: int) -> int:
    return arm["block_size"] or seq_len


def plot_block_sizes(summary: dict[str, Any], path: Path) -> Path | None:
    """The rate against the block size, log2 axis, one line per number of sink tokens, 95 % intervals as bars."""
    seq_len = summary["seq_len"]
    families: dict[int, list[dict[str, Any]]] = {}
    for arm in summary["arms"]:
        if arm["rate"] is not None:
            families.setdefault(arm["sinks"], []).append(arm)
    if not families:
        return None
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.subplots()
    for k, (sinks, arms) in enumerate(sorted(families.items())):
        arms = sorted(arms, key=lambda a: _x(a, seq_len))
        xs = [_x(a, seq_len) * (1.04 if k else 1.0) for a in arms]  # side by side where two families share a size
        ys = [a["rate"]["mean"] for a in arms]
        err = [[y - (a["rate"]["low"] if a["rate"]["low"] is not None else y) for y, a in zip(ys, arms)],
               [(a["rate"]["high"] if a["rate"]["high"] is not None else y) - y for y, a in zip(ys, arms)]]
        n = min(a["seeds"] for a in arms)
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=4, linewidth=1.6,
                    label=(f"+ {sinks} sink token{'s' if sinks > 1 else ''}" if sinks else "vanilla") + f" (n ≥ {n})")
    sizes = sorted({_x(a, seq_len) for a in summary["arms"]})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [f"whole ({s})" if s == seq_len else str(s) for s in sizes])
    ax.minorticks_off()
    ax.set_xlabel("block size (tokens; whole = the training sequence)")
    ax.set_ylabel("moving-sink rate\n(content sink set changes between steps)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle("Where sinks move as the block shrinks: mean over seeds, 95 % CI (Student t)", fontsize=10)
    return save_figure(fig, path)


def block_sizes_line(results: dict[str, Any]) -> str | None:
    summary = results.get("block_sizes")
    if not summary:
        return None
    seq_len = summary["seq_len"]
    parts = []
    for arm in sorted(summary["arms"], key=lambda a: (a["sinks"], -_x(a, seq_len or 0))):
        r = arm["rate"]
        if r is None:
            continue
        ci = (f" [{r['low']:.3f}, {r['high']:.3f}]" if r.get("low") is not None and r.get("high") is not None
              else " (one seed: no interval)")
        parts.append(f"{arm['label']} {r['mean']:.3f}{ci}")
    if not parts:
        return None
    return (f"Moving-sink rate ({ANALYSIS_METRICS[METRIC][1]}; mean [95 % CI] over the analysed seeds, described, "
            f"not tested here): " + "; ".join(parts) + ".")


class BlockSizes(Endpoint):
    """The moving-sink rate per arm against its block size (a study with block-model arms)."""

    name = "block_sizes"
    slot = "analysis"
    parts = {"block_sizes": block_sizes_line}

    def conclude(self, study: Study) -> None:
        value = block_sizes(study.results)
        if value is not None:
            study.results["block_sizes"] = value

    def section(self, doc: Document, results: dict[str, Any], out: Path) -> None:
        summary = results.get("block_sizes")
        if not summary:
            return
        doc.heading("Sinks as the block shrinks")
        line = block_sizes_line(results)
        if line:
            doc.paragraph(line)
        path = plot_block_sizes(summary, Path(out) / "figures" / "block_sizes.png")
        if path is not None:
            doc.image(path, "the moving-sink rate against the block size, one line per arm family")

    def markdown(self, results: dict[str, Any]) -> list[str]:
        line = block_sizes_line(results)
        return ["", line] if line else []
