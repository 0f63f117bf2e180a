"""The one interface every endpoint implements: what the runner, `summarise` and the report call on each.

An endpoint is a question a study answers (the declared primary, the escape step, ...). Its module owns the whole
path: plan (`check`), measure (per run, as it trains or after: `probe`, `measure`, `products`, `record`),
summarise (results.json: `variant`, `claim`, `judge`, `conclude`), report line (`parts`, `markdown`, `questions`) and figure (drawn by its `section`). Every
hook does nothing by default, so an endpoint implements only the steps it has. The registry is
`experiment.endpoints.ENDPOINTS`; the shared statistics (`summary.summarise`) and the shared page
(`report.write_report`, `report.markdown_summary`) call the hooks in the registry's order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sinkdlm.reporting import Document

Results = dict[str, Any]


@dataclasses.dataclass
class Study:
    """What `summary.summarise` hands each endpoint's `claim`, `judge` and `conclude`: the results it fills in,
    the compared pairs, their paired comparisons (entries of results.json's `comparisons`), the confidence and the
    study's declared seeds (None: read from the results or the preset)."""

    results: Results
    pairs: list[tuple[str, str]]
    comparisons: list[dict[str, Any]]
    confidence: float = 0.95
    seeds_declared: list[int] | None = None


class Endpoint:
    """The hooks of one endpoint (see the module docstring). `name`: its key in results.json; `slot`: where its
    `section` stands in report.md: `lead` (before the results table), `body` (after the results table and the
    forest of paired differences) or `analysis` (after the paired comparisons and the training figures);
    `parts`: the paragraphs a results page can place on their own (`report.summary_part`), name -> function."""

    name: str = ""
    slot: str = "body"
    parts: dict[str, Callable[[Results], str | None]] = {}

    # -- plan: what it needs, checked before --out is touched (`runner.run_experiment`, after `plan.make_plan`)
    def check(self, preset: Any, device: str | None) -> None:
        """Raise a one-line ValueError where this machine cannot measure what the preset declares of it."""

    # -- measure: a run's own products, as it trains (`stages.train_run`, `stages.run_products`, `records.run_record`)
    def probe(self, preset: Any, run: Path, train_kwargs: dict[str, Any]) -> tuple[int, Callable] | None:
        """(every, fn): called by the trainer every `every` optimizer steps of a run in directory `run`."""
        return None

    def measure(self, preset: Any, run: Path, ckpt: str, train_kwargs: dict[str, Any], device: str | None) -> None:
        """After the run's training and fixed validation (`stages.measure_runs`): measure its final checkpoint
        `ckpt` into its `products` (nothing to do where they are on disk)."""

    def products(self, preset: Any, run: Path) -> list[Path]:
        """The files it leaves in a run's directory: the run is measured once they are all there."""
        return []

    def record(self, preset: Any, run: Path) -> dict[str, Any] | None:
        """Its part of the run's record in results.json (under `name`), read back from `products`."""
        return None

    # -- summarise (`summary.summarise`, in this order)
    def variant(self, variant: dict[str, Any], summary: dict[str, Any], confidence: float) -> list[dict[str, Any]]:
        """Add to one variant's `summary`; returns the comparisons that join the report's multiplicity family."""
        return []

    def claim(self, study: Study) -> list[dict[str, Any]]:
        """Before the family is adjusted: mark its comparisons; returns its tests ({p}) that join the family."""
        return []

    def judge(self, study: Study) -> None:
        """After the family's adjustment: store what it decides in `study.results`."""

    def conclude(self, study: Study) -> None:
        """Last, after the shared statistics and the study's sizing: an endpoint judged from its own per-run
        records alone."""

    # -- report (`report.write_report`, `report.markdown_summary`, `report.questions_list`)
    def section(self, doc: Document, results: Results, out: Path) -> None:
        """Its part of report.md / report.html (figures drawn into `out`/figures), at its `slot`."""

    def markdown(self, results: Results) -> list[str]:
        """Its lines of the README's Markdown summary (`report.markdown_summary`)."""
        return []

    def questions(self, results: Results) -> list[str]:
        """Its lines of "what held and what did not" (`report.questions_list`)."""
        return []


def compared_baseline(results: Results) -> str:
    """The variant the report's figures compare against: the declared primary's baseline, else the first variant."""
    return (results.get("primary") or {}).get("pair", [None, next(iter(results["variants"]))])[1]
