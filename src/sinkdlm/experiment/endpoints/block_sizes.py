"""Sinks as the block shrinks (docs/method.md §15): the moving-sink rate of each arm against its block size.

A study whose arms differ in `block_size` (block diffusion, §13) gets, per arm, the content sink-set change rate
(§6, mean over layers, from each seed's analysis) as a mean over seeds with its Student t interval, and one figure:
the rate against the block size (the whole sequence at its length), one line per arm family (vanilla, + sinks).
The paired tests of the arms are the declared primary's and the comparisons' (`primary`, `summary`); this endpoint
describes, it decides nothing.

It also holds the one rule on what a block model's validation can be compared with (`not_compared`): its fixed
val_loss is the block NELBO, a different bound for each block size (§15), so a pair of arms of different block sizes
(the whole sequence its own size) is not compared on `BOUND_METRICS`; the summary keeps such a row with its raw
numbers, out of the multiplicity family, and the report's figures, sizing and trajectories leave it out.
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
# The metrics that are a bound of the model's own factorisation: the fixed val_loss (a block model's block NELBO) and
# its change over training (Δ_train). Every other metric (sink metrics, accuracies, gradient norms) is comparable.
BOUND_METRICS = frozenset({"val_loss", "val_loss_change"})


def block_size(variant: dict[str, Any]) -> int | None:
    """A results.json variant's block size (its `switches`; None: the whole sequence)."""
    return variant.get("switches", {}).get("block_size") or None


def has_block_arms(results: dict[str, Any]) -> bool:
    """Whether some arm of the study is a block model."""
    return any(block_size(v) for v in results["variants"].values())


def _bound_words(size: int | None) -> str:
    return "the whole sequence" if size is None else f"blocks of {size}"


def not_compared(a: dict[str, Any], b: dict[str, Any], metric: str = "val_loss") -> str | None:
    """Why variants `a` and `b` (results.json entries) are not compared on `metric`: a metric of `BOUND_METRICS`
    between different block sizes is a difference of two different bounds (docs/method.md §15), not a test. None
    where they are comparable (one block size, or any other metric)."""
    sa, sb = block_size(a), block_size(b)
    if metric not in BOUND_METRICS or sa == sb:
        return None
    return f"not compared: different bounds ({_bound_words(sa)} vs {_bound_words(sb)})"


def block_sizes(results: dict[str, Any]) -> dict[str, Any] | None:
    """Per arm: its block size (None: the whole sequence), whether it has sink tokens, and the rate's mean
    [95 % CI] over its analysed seeds. None unless some arm is a block model."""
    variants = results["variants"]
    if not has_block_arms(results):
        return None
    arms = []
    for name, v in variants.items():
        values = list(seed_scalars(v, METRIC).values())
        iv = mean_interval(values, bounds=(0.0, 1.0)).to_dict() if values else None
        arms.append({"variant": name, "label": v["label"], "block_size": block_size(v),
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
