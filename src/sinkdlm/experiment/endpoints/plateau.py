"""The declared plateau (docs/method.md §7): did each run's fixed val_loss stop falling before the end of training?

A preset declares a criterion in nats (`ExperimentPreset.plateau_nats`); results.json's `plateau` holds, per run,
how much the last fifth of training lowered its fixed val_loss (from the run's `val_curve`), against it. In the
report: one paragraph (`plateau_note`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sinkdlm.experiment.endpoints.base import Endpoint, Study
from sinkdlm.reporting import Document
from sinkdlm.stats import mean_interval


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


def plateau_note(results: dict[str, Any]) -> str | None:
    pl = results.get("plateau")
    if not pl or not pl["runs"]:
        return None
    held = sum(r["drop"] < pl["nats"] for r in pl["runs"].values())
    return (f"Plateau (declared: the last fifth of training lowers the fixed val_loss by less than {pl['nats']:g} nats): "
            f"{held} of {len(pl['runs'])} runs; the largest drop over the last fifth was {pl['max_drop']:.3f} nats.")


class Plateau(Endpoint):
    """The declared plateau criterion, run by run."""

    name = "plateau"
    parts = {"plateau": plateau_note}

    def judge(self, study: Study) -> None:
        value = plateau(study.results)
        if value is not None:
            study.results["plateau"] = value

    def section(self, doc: Document, results: dict[str, Any], out: Path) -> None:
        note = plateau_note(results)
        if note:
            doc.paragraph(note)

    def markdown(self, results: dict[str, Any]) -> list[str]:
        note = plateau_note(results)
        return ["", note] if note else []
