"""The quantization endpoint (docs/method.md §16): does a sink make a DLM quantizable?

Three files, the endpoint's steps in order: `measure.py` refuses at plan time without torchao and scores each run's
final checkpoint quantized on the study's fixed validation (`runs/<run>/quant.json`), reading the run's record back;
`summary.py` computes results.json's `quant` from those records alone; `report.py` writes its section, its
one-sentence answer and its figure. The measuring imports torch and torchao, so it is imported where used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sinkdlm.experiment.endpoints.base import Endpoint, Study
from sinkdlm.experiment.endpoints.quant.report import quant_answer_line, quant_section
from sinkdlm.reporting import Document


class Quant(Endpoint):
    """Declared by a preset's `quantization` (`presets.Quantization`): each run scored quantized after training."""

    name = "quant"
    slot = "lead"
    parts = {"quant": quant_answer_line}

    def check(self, preset: Any, device: str | None) -> None:
        if preset.quantization is not None:
            from sinkdlm.experiment.endpoints.quant.measure import check_torchao

            check_torchao(preset.quantization.schemes, device)

    def measure(self, preset: Any, run: Path, ckpt: str, train_kwargs: dict[str, Any], device: str | None) -> None:
        if preset.quantization is not None:
            from sinkdlm.experiment.endpoints.quant.measure import measure_quant

            measure_quant(run, ckpt, train_kwargs, preset, device)

    def products(self, preset: Any, run: Path) -> list[Path]:
        if preset.quantization is None:
            return []
        from sinkdlm.experiment.endpoints.quant.measure import QUANT

        return [run / QUANT]

    def record(self, preset: Any, run: Path) -> dict[str, Any] | None:
        if preset.quantization is None:
            return None
        from sinkdlm.experiment.endpoints.quant.measure import QUANT, quant_record

        return quant_record(run / QUANT)

    def conclude(self, study: Study) -> None:
        if (study.results.get("declared") or {}).get("quantization"):
            from sinkdlm.experiment.endpoints.quant.summary import quant_summary

            study.results["quant"] = quant_summary(study.results, study.confidence, study.seeds_declared)

    def section(self, doc: Document, results: dict[str, Any], out: Path) -> None:
        quant_section(doc, results, out)

    def markdown(self, results: dict[str, Any]) -> list[str]:
        line = quant_answer_line(results)
        return ["", line] if line else []
