"""The declared equivalence claims (docs/method.md §7): the paper's "≈", tested with two one-sided t tests (TOST).

A preset declares a margin and the pairs it claims equal (`ExperimentPreset.equivalence`). Each declared pair's
val_loss comparison gets its `equivalence` {margin, p} (`stats.equivalence_test`), whose p-value joins the report's
multiplicity family (`claim`); once the family is adjusted each reads "equivalent within ±m", "different" (the
difference itself survives) or "inconclusive" (`judge`). In the report: the table of claims
(`equivalence_rows`) and the one sentence (`equivalence_line`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sinkdlm.experiment.endpoints.base import Endpoint, Study
from sinkdlm.experiment.formatting import fmt_diff, fmt_p, md_table
from sinkdlm.experiment.metrics import paired_seed_differences
from sinkdlm.reporting import Document
from sinkdlm.stats import equivalence_test


def attach_equivalence(results: dict[str, Any], comparisons: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give each declared equivalence pair's val_loss comparison its `equivalence` {margin, p} (TOST); returns
    those dicts, whose p-values join the report's multiplicity family (`finish_equivalence` sets the verdicts)."""
    declared = (results.get("declared") or {}).get("equivalence") or {}
    margin, pairs = declared.get("margin"), [list(p) for p in declared.get("pairs") or []]
    if not margin:
        return []
    out = []
    for c in comparisons:
        if c["pair"] in pairs and c["metric"] == "val_loss" and not c.get("missing") and not c.get("different_bounds"):
            a, b = (results["variants"][n] for n in c["pair"])
            c["equivalence"] = equivalence_test(list(paired_seed_differences(a, b, "val_loss").values()), margin)
            out.append(c)
    return out


def finish_equivalence(entries: list[dict[str, Any]], confidence: float = 0.95) -> None:
    """The verdict of each equivalence test once the family's adjusted p-values are set."""
    for c in entries:
        eq = c["equivalence"]
        q, m = eq.get("p_adjusted"), eq["margin"]
        if q is not None and q < 1 - confidence:
            eq["verdict"] = f"equivalent within ±{m:g}"
        elif c.get("survives"):
            eq["verdict"] = "different"
        else:
            eq["verdict"] = "inconclusive"


def equivalence_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """The declared equivalence claims: Δ [CI], the TOST p (raw and BH-adjusted) and the verdict."""
    rows = []
    for c in results.get("comparisons", []):
        eq = c.get("equivalence")
        if not eq:
            continue
        q = eq.get("p_adjusted")
        rows.append([f"{c['variant']} − {c['baseline']}", fmt_diff(c, bold=False), f"±{eq['margin']:g}",
                     "–" if eq.get("p") is None else f"{eq['p']:.3g}", "–" if q is None else f"{q:.3g}", eq.get("verdict", "–")])
    if not rows:
        return None
    return ["claim (val_loss)", "Δ [95 % CI]", "margin", "TOST p", "BH-adjusted p", "verdict"], rows


def equivalence_line(results: dict[str, Any]) -> str | None:
    """The declared equivalence claims in one sentence: each claim's verdict at its margin."""
    rows = [(f"{c['variant']} − {c['baseline']}", c["equivalence"]) for c in results.get("comparisons", [])
            if c.get("equivalence")]
    if not rows:
        return None
    said = [f"{pair}: {eq.get('verdict', '–')} (TOST adjusted p = {fmt_p(eq.get('p_adjusted'))})" for pair, eq in rows]
    return f"**Equivalence** (declared margin ±{rows[0][1]['margin']:g} nats, `val_loss`): " + "; ".join(said) + "."


class Equivalence(Endpoint):
    """The declared claims of "≈": TOST at the declared margin, inside the report's multiplicity family."""

    name = "equivalence"
    parts = {"equivalence": equivalence_line}

    def claim(self, study: Study) -> list[dict[str, Any]]:
        return [c["equivalence"] for c in attach_equivalence(study.results, study.comparisons)]

    def judge(self, study: Study) -> None:
        # after the adjustment: a "different" reads each row's final decision
        finish_equivalence([c for c in study.comparisons if c.get("equivalence")], study.confidence)

    def section(self, doc: Document, results: dict[str, Any], out: Path) -> None:
        equivalence = equivalence_rows(results)
        if equivalence:
            doc.heading("Equivalence claims")
            doc.paragraph("Each claim of the paper's \"≈\" is tested with two one-sided t tests (TOST) at the margin "
                          "declared before the run, inside the report's multiplicity family: \"equivalent within ±m\" "
                          "when the adjusted p < 0.05, \"different\" when the difference itself survives, otherwise "
                          "\"inconclusive\".")
            doc.table(*equivalence)

    def markdown(self, results: dict[str, Any]) -> list[str]:
        equivalence = equivalence_rows(results)
        if not equivalence:
            return []
        return ["", "Equivalence claims (TOST at the declared margin, inside the multiplicity family; \"≈\" only "
                "where it holds):", "", md_table(*equivalence)]
