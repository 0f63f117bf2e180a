"""The attention-sink analysis of a study (docs/method.md §6), its takeover question and its tables.

Each analysed run's `analysis.json` goes into its record (`stats.analysis_record`); over seeds this endpoint adds to
every variant's summary the value norms per layer, the extra sink per layer and the sink-masking curve, whose
summaries join the report's multiplicity family (`stats.variant_summary`); the analysis metrics themselves are
compared between variants with every other metric (`summary.summarise`, `metrics.ANALYSIS_METRICS`). The report's
"Attention sinks" section, the README's sink and masking tables, the value-norm findings among "what held" and the
takeover paragraphs are drawn by `tables`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sinkdlm.experiment.endpoints.base import Endpoint
from sinkdlm.experiment.endpoints.sinks.stats import variant_summary
from sinkdlm.experiment.endpoints.sinks.tables import (
    epsilon_table, masking_note, masking_table, sinks_table, takeover_layer_table, takeover_line, token_type_table,
    value_norm_layer_table, value_norm_lines,
)
from sinkdlm.experiment.formatting import comparisons_table, fmt_interval, md_table, pivot_comparisons
from sinkdlm.experiment.metrics import ANALYSIS_METRICS
from sinkdlm.reporting import Document


def takeover_layers_part(results: dict[str, Any]) -> str | None:
    """`takeover_layer_table` as a markdown table, for a results page."""
    table = takeover_layer_table(results)
    return None if table is None else md_table(*table)


def v_summary(results: dict[str, Any], label: str) -> dict[str, Any]:
    return next((v.get("summary") or {}) for v in results["variants"].values() if v["label"] == label)


class SinkAnalysis(Endpoint):
    """The attention sinks of the analysed models: per-layer value norms, the masking curve, the takeover."""

    name = "sinks"
    slot = "analysis"
    parts = {"takeover": takeover_line, "takeover_layers": takeover_layers_part}

    def variant(self, variant: dict[str, Any], summary: dict[str, Any], confidence: float) -> list[dict[str, Any]]:
        return variant_summary(variant, summary, confidence)

    def questions(self, results: dict[str, Any]) -> list[str]:
        return value_norm_lines(results)

    def markdown(self, results: dict[str, Any]) -> list[str]:
        parts: list[str] = []
        sinks = sinks_table(results)
        if sinks:
            # a preset may analyse only its first seed (`analyse_every_seed`): say whose models the table describes
            counts = [(v["summary"]["non_sink_fraction"]["n"], len(v["seeds"])) for v in results["variants"].values()
                      if "non_sink_fraction" in v["summary"]]
            whose = ("every seed's model" if all(n == k for n, k in counts)
                     else f"the analysed seeds' models, {min(n for n, _ in counts)} of {max(k for _, k in counts)} seeds")
            parts += ["", f"Attention sinks (ϵ = 3, {whose}, mean [95 % CI] over seeds; shares kept in [0, 1]):",
                      "", md_table(*sinks)]
            pivot = pivot_comparisons(results, ["non_sink_fraction", "content_sink_set_change_rate", "content_sink_set_jaccard"])
            if pivot:
                parts += ["", md_table(*pivot)]
        masking = masking_table(results)
        if masking:
            parts += ["", masking_note(results), "", md_table(*masking)]
        return parts

    def section(self, doc: Document, results: dict[str, Any], out: Path) -> None:
        sinks = sinks_table(results)
        if sinks is None:
            return
        eps = results.get("analysis_settings", {}).get("epsilon", 3.0)
        doc.heading(f"Attention sinks (ϵ = {eps}; mean [95 % CI] over the analysed seeds, shares kept in [0, 1])")
        doc.table(*sinks)
        doc.paragraph("Moving sinks are compared over the content keys: the extra sink's key is a sink at nearly every "
                      "step and would count as overlap for the sink models only (docs/method.md §6). The definition "
                      "over every key is kept beside it as the alternative.")
        header, rows = comparisons_table(results, set(ANALYSIS_METRICS))
        if rows:
            doc.table(header, rows)
        layers = takeover_layer_table(results)
        if layers:
            doc.heading("Per layer: the moving-sink rate and the sink token's share", 3)
            doc.paragraph("Mean [95 % CI, Student t over the analysed seeds]; a step-0 control is one model (no interval). "
                          "Described, not tested: the comparisons above are over all layers.")
            doc.table(*layers)
        lines = value_norm_lines(results)
        if lines:
            doc.heading("Value norms per layer (One-Token Fig. 3)", 3)
            doc.paragraph("Pooling over layers weights each layer by its number of sinks and can flip the sign, so sinks "
                          "and normal tokens are compared within each layer and seed, and summarised by the unweighted "
                          "mean over layers.")
            doc.bullets([line.removeprefix("- ") for line in lines])
            table = value_norm_layer_table(results)
            if table:
                doc.table(*table)
        eps_t = epsilon_table(results)
        if eps_t:
            doc.heading("Non-sink fraction vs ϵ (Rulli et al. Fig. 10)", 3)
            doc.table(*eps_t)
        types = token_type_table(results)
        if types:
            doc.heading("What the sinks sit on (Rulli et al. Table 2)", 3)
            doc.table(*types)
        masking = masking_table(results)
        if masking:
            doc.heading("Sink-masking ablation (Rulli et al. Table 1)", 3)
            doc.paragraph(masking_note(results))
            doc.table(*masking)
        samples = [(v["label"], seed, rec["analysis"]) for v in results["variants"].values()
                   for seed, rec in list(v["seeds"].items())[:1] if (rec.get("analysis") or {}).get("samples")]
        if samples:
            doc.heading("Generations (first seed; repetition rate = 1 − distinct / total pieces)", 3)
            for label, seed, a in samples:
                rate = "–" if a.get("repetition_rate") is None else f"{a['repetition_rate']:.2f}"
                doc.paragraph(f"{label}, seed {seed}: repetition rate {rate}; over seeds "
                              f"{fmt_interval(v_summary(results, label).get('repetition_rate'), 1.0, 2)}")
                doc.bullets([f"`{x[:160]!r}`" for x in a["samples"][:4]])
        doc.paragraph("Each analysed run's own figures (attention maps, sinks per layer, value norms, moving sinks) and "
                      "report are drawn on demand by `make reports` into `runs/<variant>-s<seed>/analysis/` (not committed) "
                      "from its committed `analysis/analysis.json` and its `analysis_arrays.npz`, which is committed for "
                      "each variant's first seed only (CONTRIBUTING.md, \"What a study commits\"); the analyses side "
                      "by side are in `compare/`.")
