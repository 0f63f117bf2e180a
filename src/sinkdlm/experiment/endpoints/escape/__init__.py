"""The escape endpoint (docs/method.md §11): when each run leaves the unigram plateau, and the paired test of it.

Four files, the endpoint's steps in order (together over the ~600 lines a file keeps to): `probe.py` measures each
run as it trains (the probe set's loss and attention every `Escape.every` steps, `probes.json`) and reads its
escape step and sink onset into the run's record; `summary.py` computes results.json's `escape` from those records
alone; `report.py` writes its section and sentences; `figures.py` draws the Kaplan-Meier curves and each run's
figure. The measuring and the statistics import torch and scipy, so they are imported where used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from sinkdlm.experiment.endpoints.base import Endpoint, Study
from sinkdlm.experiment.endpoints.escape.report import escape_answer_line, escape_section, escape_verdict_line
from sinkdlm.reporting import Document


class Escape(Endpoint):
    """Declared by a preset's `escape` (`presets.Escape`): probed as each run trains, tested over seeds."""

    name = "escape"
    slot = "lead"
    parts = {"escape": escape_verdict_line, "escape_answer": escape_answer_line}

    def probe(self, preset: Any, run: Path, train_kwargs: dict[str, Any]) -> tuple[int, Callable] | None:
        if preset.escape is None:
            return None
        from sinkdlm.experiment.endpoints.escape.probe import PROBES, make_prober

        return preset.escape.every, make_prober(run / "escape" / PROBES, train_kwargs, preset.escape)

    def products(self, preset: Any, run: Path) -> list[Path]:
        if preset.escape is None:
            return []
        from sinkdlm.experiment.endpoints.escape.probe import PROBES

        return [run / "escape" / PROBES]

    def record(self, preset: Any, run: Path) -> dict[str, Any] | None:
        if preset.escape is None:
            return None
        from sinkdlm.experiment.endpoints.escape.probe import PROBES, escape_record
        from sinkdlm.training.rundir import read_metrics

        return escape_record(run / "escape" / PROBES, read_metrics(run / "train"), preset.escape)

    def conclude(self, study: Study) -> None:
        if (study.results.get("declared") or {}).get("escape"):  # from the per-run escape records alone
            from sinkdlm.experiment.endpoints.escape.summary import escape_summary

            study.results["escape"] = escape_summary(study.results, study.confidence, study.seeds_declared)

    def section(self, doc: Document, results: dict[str, Any], out: Path) -> None:
        escape_section(doc, results, out)
