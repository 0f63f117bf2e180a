"""Aggregate an experiment over seeds, compare variants with paired intervals, write the report.

results.json -> `summarise` adds, per variant, `summary` (mean and 95 % interval over seeds of
every metric) and, for the experiment, `comparisons`: one entry per (pair of variants, metric)
with the mean difference, its interval and the verdict — all from `sinkdlm.stats`:

* `val_loss` and the analysis metrics (one number per seed): paired Student t over seeds;
* task accuracies: paired over seeds *and* items (`paired_accuracy_difference` on the per-item
  outcomes that eval.json keeps; the item sets are checked to be the same).

A verdict names a direction only when the interval excludes zero; otherwise it says
"inconclusive with n seeds". `markdown_summary` renders the tables that the README shows, from a
results.json alone (a test regenerates the README's tables from the committed file).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from sinkdlm.reporting import Document
from sinkdlm.stats import accuracy_interval, mean_interval, paired_accuracy_difference, paired_difference, verdict

# Metrics where lower is better; everything else (accuracies, Jaccard, non-sink fraction) is higher-is-better
# for the purpose of the words "better"/"worse" (sink metrics have no better: see NEUTRAL).
LOWER_IS_BETTER = {"val_loss"}
# Per-seed analysis scalars compared between variants: key -> (path into the analysis summary, label).
ANALYSIS_METRICS = {
    "non_sink_fraction": (("non_sink_fraction",), "non-sink fraction"),
    "sink_set_change_rate": (("moving", "sink_set_change_rate"), "sink-set change rate between steps"),
    "sink_set_jaccard": (("moving", "sink_set_jaccard"), "Jaccard of consecutive sink sets"),
    "value_norm_sink": (("value_norm", "sink_mean"), "value norm of sinks"),
    "value_norm_normal": (("value_norm", "normal_mean"), "value norm of normal tokens"),
}
NEUTRAL = set(ANALYSIS_METRICS)  # descriptive: a difference is reported without "better"/"worse"


def analysis_record(a: dict[str, Any]) -> dict[str, Any]:
    """The per-seed analysis numbers results.json keeps (self-contained: no need to open analysis.json)."""
    moving = a.get("moving", {}).get("mean", {})
    vn = a.get("value_norm", {})
    extra = a.get("extra_sink")
    abl = a.get("ablation")
    return {
        "non_sink_fraction": a.get("non_sink_fraction"),
        "non_sink_fraction_by_epsilon": a.get("non_sink_fraction_by_epsilon"),
        "moving": dict(moving),
        "value_norm": {k: vn.get(k) for k in ("sink_mean", "normal_mean", "sink_count", "normal_count")},
        "extra_sink": None if not extra else {k: extra.get(k) for k in ("mean_attention_mass", "attention_mass")},
        "sink_token_types": (a.get("sink_token_types") or {}).get("shares"),
        "ablation": None if not abl else {k: abl.get(k) for k in ("metric", "protocol", "scores", "delta", "stderr")},
    }


def _get(d: Any, path: tuple[str, ...]) -> float | None:
    for key in path:
        if not isinstance(d, dict) or d.get(key) is None:
            return None
        d = d[key]
    return float(d) if isinstance(d, (int, float)) and math.isfinite(d) else None


def _seed_scalars(variant: dict[str, Any], metric: str) -> dict[str, float]:
    """{seed: value} of one per-seed scalar metric (val_loss or an analysis metric)."""
    out = {}
    for seed, rec in variant["seeds"].items():
        value = rec.get("val_loss") if metric == "val_loss" else _get(rec.get("analysis"), ANALYSIS_METRICS[metric][0])
        if value is not None and math.isfinite(value):
            out[seed] = float(value)
    return out


def _task_metrics(results: dict[str, Any]) -> list[str]:
    names = set()
    for v in results["variants"].values():
        for rec in v["seeds"].values():
            names |= {f"{task}/{m}" for task, ms in rec.get("eval", {}).items() for m in ms}
    return sorted(names)


def task_chance(metric: str) -> float | None:
    """The accuracy of a uniform random guess for a `task/metric` name (None: not a choice metric)."""
    from sinkdlm.evaluation.tasks import TASKS

    task, m = metric.split("/", 1)
    return TASKS[task].chance.get(m) if task in TASKS else None


def _per_item(variant: dict[str, Any], metric: str) -> dict[str, dict]:
    task, m = metric.split("/", 1)
    return {seed: rec["eval"][task][m] for seed, rec in variant["seeds"].items() if m in rec.get("eval", {}).get(task, {})}


def compare_variants(a: dict[str, Any], b: dict[str, Any], metric: str, confidence: float = 0.95) -> dict[str, Any] | None:
    """Paired comparison of variant `a` against `b` on `metric` (a results.json variant entry each).

    None when either variant lacks the metric. A ValueError when they were run on different seeds
    or scored on different items (a paired comparison would be meaningless).
    """
    if "/" in metric:
        sa, sb = _per_item(a, metric), _per_item(b, metric)
        if not sa or not sb:
            return None
        if set(sa) != set(sb):
            raise ValueError(f"{a['label']} and {b['label']} were evaluated on different seeds for {metric} "
                             f"({sorted(sa)} vs {sorted(sb)}); rerun `sinkdlm experiment` so both have every seed")
        for seed in sa:
            if sa[seed].get("items") != sb[seed].get("items") or len(sa[seed].get("per_item", [])) != len(sb[seed].get("per_item", [])):
                raise ValueError(f"{a['label']} and {b['label']} were scored on different items for {metric} (seed {seed}); "
                                 "evaluate both with the same task, --limit and evaluation seed")
        if any("per_item" not in s for s in (*sa.values(), *sb.values())):
            return None  # an eval.json from before per-item outcomes were kept
        iv = paired_accuracy_difference({s: sa[s]["per_item"] for s in sa}, {s: sb[s]["per_item"] for s in sa}, confidence)
        scale, unit = 100.0, " points"
    else:
        sa, sb = _seed_scalars(a, metric), _seed_scalars(b, metric)
        if not sa or not sb:
            return None
        iv = paired_difference(sa, sb, confidence)
        scale, unit = 1.0, ""
    lower = metric in LOWER_IS_BETTER
    text = verdict(iv, lower_is_better=None if metric in NEUTRAL else lower, scale=scale, unit=unit)
    return {"variant": a["label"], "baseline": b["label"], "metric": metric, **iv.to_dict(),
            "scale": scale, "lower_is_better": lower, "verdict": text}


def summarise(results: dict[str, Any], pairs: list[tuple[str, str]] | None = None) -> None:
    """Add `summary` to every variant and `comparisons` (each pair in `pairs`, default: every
    variant against the first) to `results`."""
    variants = results["variants"]
    names = list(variants)
    scalar_metrics = ["val_loss"] + [m for m in ANALYSIS_METRICS if any(_seed_scalars(v, m) for v in variants.values())]
    task_metrics = _task_metrics(results)
    for v in variants.values():
        summary = {}
        for m in scalar_metrics:
            vals = list(_seed_scalars(v, m).values())
            if vals:
                summary[m] = {**mean_interval(vals).to_dict(), "std": statistics.stdev(vals) if len(vals) > 1 else 0.0}
        for m in task_metrics:
            scores = _per_item(v, m)
            vals = [s["value"] for s in scores.values()]
            if not vals:
                continue
            std = statistics.stdev(vals) if len(vals) > 1 else 0.0
            if all("per_item" in s for s in scores.values()):  # over seeds and items (stats.accuracy_interval)
                summary[m] = {**accuracy_interval({k: s["per_item"] for k, s in scores.items()}).to_dict(), "std": std}
            else:  # an eval.json without per-item outcomes: the spread over seeds only
                summary[m] = {**mean_interval(vals).to_dict(), "std": std}
            chance = task_chance(m)
            if chance is not None:
                low = summary[m]["low"]
                summary[m]["chance"] = chance
                summary[m]["above_chance"] = low is not None and low > chance
        # Do sinks carry smaller values than normal tokens (One-Token Fig. 3)? Paired within each seed's model.
        sink_vn, normal_vn = _seed_scalars(v, "value_norm_sink"), _seed_scalars(v, "value_norm_normal")
        if sink_vn and set(sink_vn) == set(normal_vn):
            iv = paired_difference(sink_vn, normal_vn)
            summary["value_norm_sink_minus_normal"] = {**iv.to_dict(), "verdict": verdict(iv, lower_is_better=None)}
        v["summary"] = summary
    pairs = pairs or [(n, names[0]) for n in names[1:]]
    comparisons = []
    for a, b in pairs:
        if a not in variants or b not in variants:
            continue
        for m in scalar_metrics + task_metrics:
            c = compare_variants(variants[a], variants[b], m)
            if c is not None:
                comparisons.append({"pair": [a, b], **c})
    results["comparisons"] = comparisons


# ----------------------------------------------------------------------------- formatting
def _fmt_interval(s: dict | None, scale: float = 1.0, digits: int = 3) -> str:
    if not s or s.get("mean") is None:
        return "–"
    text = f"{scale * s['mean']:.{digits}f}"
    if s.get("low") is not None and s.get("high") is not None:
        text += f" [{scale * s['low']:.{digits}f}, {scale * s['high']:.{digits}f}]"
    return text


def _is_pct(metric: str) -> bool:
    return "/" in metric


def results_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    variants = results["variants"]
    metrics = ["val_loss"] + _task_metrics(results)
    def head(m):
        chance = task_chance(m) if _is_pct(m) else None
        return f"`{m}`" + ((" %" + (f" (chance {100 * chance:.0f})" if chance else "")) if _is_pct(m) else " (↓)")

    header = ["variant"] + [head(m) for m in metrics]
    rows = [[v["label"]] + [_fmt_interval(v["summary"].get(m), 100.0 if _is_pct(m) else 1.0, 1 if _is_pct(m) else 3)
                            for m in metrics] for v in variants.values()]
    return header, rows


def comparisons_table(results: dict[str, Any], metrics: set[str] | None = None) -> tuple[list[str], list[list[str]]]:
    rows = []
    for c in results["comparisons"]:
        if metrics is not None and c["metric"] not in metrics:
            continue
        scale = c.get("scale", 1.0)
        digits = 1 if scale != 1.0 else 3
        ci = "–" if c["low"] is None else f"[{scale * c['low']:+.{digits}f}, {scale * c['high']:+.{digits}f}]"
        rows.append([f"{c['variant']} − {c['baseline']}", f"`{c['metric']}`", f"{scale * c['mean']:+.{digits}f}", ci,
                     c["verdict"].split(" (")[0] if c["excludes_zero"] else f"inconclusive ({c['n']} seeds)"])
    return ["difference", "metric", "Δ", "95 % CI", "verdict"], rows


def sinks_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    rows = []
    for v in results["variants"].values():
        s = v["summary"]
        if "non_sink_fraction" not in s:
            continue
        extra = [rec.get("analysis", {}).get("extra_sink") for rec in v["seeds"].values()]
        masses = [e["mean_attention_mass"] for e in extra if e and e.get("mean_attention_mass") is not None]
        rows.append([
            v["label"], _fmt_interval(s.get("non_sink_fraction"), 100.0, 1),
            _fmt_interval(s.get("sink_set_change_rate")), _fmt_interval(s.get("sink_set_jaccard")),
            f"{_fmt_interval(s.get('value_norm_sink'), 1.0, 1)} / {_fmt_interval(s.get('value_norm_normal'), 1.0, 1)}",
            _fmt_interval(_interval_of(masses), 100.0, 1),
        ])
    if not rows:
        return None
    return (["variant", "non-sink fraction %", "sink-set change rate", "consecutive Jaccard",
             "value norm sink / normal", "attention on the extra sink %"], rows)


def epsilon_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """Rulli et al. Fig. 10: non-sink fraction vs ϵ, mean [95 % CI] over seeds."""
    eps_keys: list[str] = []
    rows = []
    for v in results["variants"].values():
        curves = [rec["analysis"]["non_sink_fraction_by_epsilon"] for rec in v["seeds"].values()
                  if rec.get("analysis") and rec["analysis"].get("non_sink_fraction_by_epsilon")]
        if not curves:
            continue
        eps_keys = eps_keys or sorted(curves[0], key=float)
        rows.append([v["label"]] + [_fmt_interval(_interval_of([c.get(e) for c in curves]), 100.0, 1)
                                    for e in eps_keys])
    return (["variant"] + [f"ϵ = {e}" for e in eps_keys], rows) if rows else None


def token_type_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """Rulli et al. Table 2: what tokens the sinks sit on, share mean [95 % CI] over seeds."""
    types = ("mask", "whitespace", "punctuation", "other", "sink")
    rows = []
    for v in results["variants"].values():
        shares = [rec["analysis"]["sink_token_types"] for rec in v["seeds"].values()
                  if rec.get("analysis") and rec["analysis"].get("sink_token_types")]
        if not shares:
            continue
        rows.append([v["label"]] + [_fmt_interval(_interval_of([s.get(t, 0.0) for s in shares]), 100.0, 1)
                                    for t in types])
    return (["variant"] + [f"{t} %" for t in types], rows) if rows else None


def _interval_of(values: list) -> dict | None:
    """mean [95 % CI] over seeds of the finite values (None when there are none)."""
    vals = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return mean_interval(vals).to_dict() if vals else None


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def pivot_comparisons(results: dict[str, Any], metrics: list[str]) -> tuple[list[str], list[list[str]]] | None:
    """One row per compared pair, one column per metric: "Δ [CI]", with the verdict's direction in
    bold when the interval excludes zero (compact enough for the README)."""
    by_pair: dict[tuple[str, str], dict[str, dict]] = {}
    labels: dict[tuple[str, str], str] = {}
    for c in results["comparisons"]:
        key = tuple(c.get("pair") or (c["variant"], c["baseline"]))
        by_pair.setdefault(key, {})[c["metric"]] = c
        labels[key] = f"{c['variant']} − {c['baseline']}"
    metrics = [m for m in metrics if any(m in per for per in by_pair.values())]
    if not by_pair or not metrics:
        return None
    rows = []
    for key, per in by_pair.items():
        row = [labels[key]]
        for m in metrics:
            c = per.get(m)
            if c is None:
                row.append("–")
                continue
            scale = c.get("scale", 1.0)
            digits = 1 if scale != 1.0 else 3
            cell = f"{scale * c['mean']:+.{digits}f}"
            if c["low"] is not None:
                cell += f" [{scale * c['low']:+.{digits}f}, {scale * c['high']:+.{digits}f}]"
            if c["excludes_zero"]:
                cell += f" **{c['verdict'].split(' ')[0]}**"
            row.append(cell)
        rows.append(row)
    header = ["difference"] + [f"`{m}`" + (" (points)" if _is_pct(m) else "") for m in metrics]
    return header, rows


QUESTION_METRICS = ("val_loss", "shakespeare_word_order/acc", "shakespeare_next_line/acc_norm", "shakespeare_cloze/acc",
                    "non_sink_fraction", "sink_set_change_rate")


def questions_list(results: dict[str, Any]) -> list[str]:
    """One line per compared pair: the question it asks and every headline metric's verdict."""
    from sinkdlm.experiment.presets import PAIR_QUESTIONS

    by_pair: dict[tuple[str, str], list[dict]] = {}
    for c in results["comparisons"]:
        by_pair.setdefault(tuple(c["pair"]), []).append(c)
    lines = []
    for pair, cs in by_pair.items():
        per = {c["metric"]: c for c in cs}
        said = [f"`{m}` {per[m]['verdict']}" for m in QUESTION_METRICS if m in per]
        if said:
            q = PAIR_QUESTIONS.get(pair, f"{cs[0]['variant']} vs {cs[0]['baseline']}?")
            lines.append(f"- **{q}** ({cs[0]['variant']} − {cs[0]['baseline']}) " + "; ".join(said) + ".")
    vn = [(v["label"], v["summary"]["value_norm_sink_minus_normal"]) for v in results["variants"].values()
          if "value_norm_sink_minus_normal" in v["summary"]]
    if vn:
        lines.append("- **Do sinks carry smaller value vectors than normal tokens?** (value norm of sinks − of "
                     "normal tokens, paired within each seed's model) " + "; ".join(f"{label}: {s['verdict']}" for label, s in vn) + ".")
    return lines


def multiplicity_note(results: dict[str, Any]) -> str:
    """How many of the reported intervals exclude zero, against how many would by chance alone."""
    cs = [c for c in results["comparisons"] if c.get("low") is not None]
    hits = sum(bool(c.get("excludes_zero")) for c in cs)
    conf = cs[0]["confidence"] if cs else 0.95
    return (f"Multiplicity: {hits} of the {len(cs)} paired intervals in results.json exclude zero; with nothing different at "
            f"all, about {(1 - conf) * len(cs):.1f} would by chance ({100 * (1 - conf):g} % each, no correction "
            "applied), so a single verdict here is a lead to re-test with more seeds, not a finding.")


def markdown_summary(results: dict[str, Any]) -> str:
    """The README's tables for one experiment, generated from its results.json only."""
    t = results["train"]
    n = len(results["seeds"])
    tasks = _task_metrics(results)
    headline = ["val_loss"] + [m for m in tasks if m.endswith(("word_order/acc", "cloze/acc", "next_line/acc_norm", "/exact_match"))
                               and "cloze/exact" not in m]
    recs = [rec for v in results["variants"].values() for rec in v["seeds"].values()]
    runs, train_s = len(recs), sum(rec.get("train_seconds") or 0.0 for rec in recs)
    parts = [
        f"Preset `{results['preset']}`: {results['description']}. {t.get('max_steps')} steps × {t.get('batch_size')} × "
        f"{t.get('seq_len')} tokens per run, seeds {results['seeds']}; training took {train_s / 60:.0f} min of compute "
        f"summed over the {runs} runs ({results['machine'].get('cpu_count')} CPU cores"
        f"{' + CUDA' if results['machine'].get('cuda') else ''}). "
        f"Mean [95 % CI]: validation loss over the {n} seeds (Student t); accuracies over seeds and items "
        "(two-way random effects, so the CI says whether an accuracy is above chance).",
        "",
        _md_table(*results_table(results)),
    ]
    chance_lines = []
    for m in tasks:
        chance = task_chance(m)
        if chance is None:
            continue
        above = [v["label"] for v in results["variants"].values() if v["summary"].get(m, {}).get("above_chance")]
        chance_lines.append(f"`{m}`: {len(above)} of {len(results['variants'])} variants above chance "
                            f"({100 * chance:.0f} %)" + (f" ({', '.join(above)})" if above else ""))
    if chance_lines:
        parts += ["", "Above chance (the 95 % CI's lower end above the chance accuracy): " + "; ".join(chance_lines) + "."]
    pivot = pivot_comparisons(results, headline)
    if pivot:
        parts += ["", "Paired differences, Δ [95 % CI] (validation loss: t over seeds; accuracies: over seeds and "
                  "items; a direction in bold only where the interval excludes zero):", "", _md_table(*pivot)]
    questions = questions_list(results)
    if questions:
        parts += ["", "What held and what did not (a direction only where the 95 % interval excludes zero):", "",
                  *questions, "", multiplicity_note(results)]
    sinks = sinks_table(results)
    if sinks:
        parts += ["", "Attention sinks (ϵ = 3, every seed's model, mean [95 % CI] over seeds):", "", _md_table(*sinks)]
        pivot = pivot_comparisons(results, ["non_sink_fraction", "sink_set_change_rate", "sink_set_jaccard"])
        if pivot:
            parts += ["", _md_table(*pivot)]
    return "\n".join(parts) + "\n"


def update_readme(readme: str | Path, results: dict[str, Any], name: str) -> bool:
    """Replace the block between `<!-- results:NAME -->` and `<!-- /results:NAME -->` in the README
    with `markdown_summary(results)`; True if the file changed."""
    path = Path(readme)
    text = path.read_text()
    start, end = f"<!-- results:{name} -->", f"<!-- /results:{name} -->"
    if start not in text or end not in text:
        raise ValueError(f"{path} has no {start} ... {end} block; add the two marker lines where the tables go")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    new = f"{head}{start}\n{markdown_summary(results)}{end}{tail}"
    if new != text:
        path.write_text(new)
    return new != text


def readme_block(readme: str | Path, name: str) -> str:
    text = Path(readme).read_text()
    start, end = f"<!-- results:{name} -->", f"<!-- /results:{name} -->"
    return text.split(start, 1)[1].split(end, 1)[0].lstrip("\n")


# ----------------------------------------------------------------------------- the report
def write_report(results: dict[str, Any], out: Path) -> tuple[Path, Path]:
    from sinkdlm.analysis.figures import plot_score_bars, plot_training_curves

    out = Path(out)
    fig_dir = out / "figures"
    variants = results["variants"]
    doc = Document(f"sinkdlm experiment `{results['preset']}`")
    m = results["machine"]
    doc.paragraph(
        f"{results['description']}. Seeds {results['seeds']}; every variant trained with the same budget "
        f"({results['train'].get('max_steps')} steps × {results['train'].get('batch_size')} sequences × "
        f"{results['train'].get('seq_len')} tokens on `{results['train'].get('data', 'shakespeare')}`) and the same "
        f"seeds, so the comparisons are paired. Machine: {m['processor']}, {m['cpu_count']} cores, torch {m['torch']}, "
        f"CUDA {'yes' if m['cuda'] else 'no'}. Wall time {results['elapsed_s'] / 60:.1f} min "
        f"({', '.join(f'{k} {v / 60:.1f}' for k, v in results['stage_seconds'].items() if v)} min)."
    )
    doc.heading("Results (mean [95 % CI] over seeds)")
    doc.table(*results_table(results))
    doc.paragraph("`val_loss` is the validation ELBO bound per token (lower is better); task metrics are accuracies "
                  "in %. Intervals over seeds are Student t with n − 1 degrees of freedom.")

    doc.heading("Paired comparisons")
    doc.paragraph(
        "Each difference is paired: over seeds (validation loss, sink metrics: Student t, n − 1 df) or over seeds and "
        "items (accuracies: two-way seeds × items variance, t with n − 1 df). A direction is stated only when the "
        "95 % interval excludes zero; otherwise the difference is inconclusive with this many seeds."
    )
    header, rows = comparisons_table(results)
    doc.table(header, rows) if rows else doc.paragraph("Only one variant: nothing to compare.")

    curves = {}
    for v in variants.values():
        per_seed = [dict(map(tuple, s["curve"])) for s in v["seeds"].values() if s.get("curve")]
        steps = sorted(set.intersection(*(set(c) for c in per_seed))) if per_seed else []
        if steps:
            means = [statistics.fmean(c[s] for c in per_seed) for s in steps]
            stds = [statistics.stdev([c[s] for c in per_seed]) if len(per_seed) > 1 else 0.0 for s in steps]
            curves[v["label"]] = (steps, means, stds)
    if curves:
        doc.heading("Training")
        doc.image(plot_training_curves(curves, fig_dir / "val_loss.png"), "Validation loss vs step (mean ± std over seeds)")
    task_metrics = _task_metrics(results)
    bars = {}
    for k in task_metrics:
        per = {}
        for v in variants.values():
            s = v["summary"].get(k)
            if s and s.get("mean") is not None:
                half = (s["high"] - s["mean"]) if s.get("high") is not None else 0.0
                per[v["label"]] = (s["mean"], half)
        if per:
            bars[k] = per
    if bars:
        doc.image(plot_score_bars(bars, fig_dir / "scores.png", ylabel="accuracy"), "Task scores (mean and 95 % CI over seeds)")

    _analysis_section(doc, results)
    doc.heading("Files")
    doc.bullets([
        "`results.json`: every number above, per seed (analysis summaries and per-item outcomes included)",
        "`runs/<variant>-s<seed>/train/metrics.jsonl`: training curves",
        "`runs/<variant>-s<seed>/eval.json`: task scores with per-item outcomes",
        "`runs/<variant>-s<seed>/analysis/`: per-model sink analysis", "`compare/report.html`: analyses side by side",
    ])
    return doc.write(out)


def _analysis_section(doc: Document, results: dict[str, Any]) -> None:
    sinks = sinks_table(results)
    if sinks is None:
        return
    eps = results.get("analysis_settings", {}).get("epsilon", 3.0)
    doc.heading(f"Attention sinks (ϵ = {eps}; mean [95 % CI] over the analysed seeds)")
    doc.table(*sinks)
    header, rows = comparisons_table(results, set(ANALYSIS_METRICS))
    if rows:
        doc.table(header, rows)
    eps_t = epsilon_table(results)
    if eps_t:
        doc.heading("Non-sink fraction vs ϵ (Rulli et al. Fig. 10)", 3)
        doc.table(*eps_t)
    types = token_type_table(results)
    if types:
        doc.heading("What the sinks sit on (Rulli et al. Table 2)", 3)
        doc.table(*types)
    abl_rows = []
    for v in results["variants"].values():
        first = next(iter(v["seeds"].values()))
        abl = (first.get("analysis") or {}).get("ablation")
        if abl and abl.get("scores"):
            abl_rows.append([v["label"], f"`{abl.get('metric')}` ({abl.get('protocol')})",
                             ", ".join(f"K={k}: {s:.3f}" for k, s in abl["scores"].items() if isinstance(s, (int, float)))])
    if abl_rows:
        doc.heading("Sink-masking ablation (first seed)", 3)
        doc.table(["variant", "score (protocol)", "score by K"], abl_rows)
    for v in results["variants"].values():
        first = next(iter(v["seeds"].values()))
        adir = first.get("analysis_dir")
        if not adir or not (Path(adir) / "analysis.json").is_file():
            continue
        figures = json.loads((Path(adir) / "analysis.json").read_text()).get("figures", {})
        names = figures.values() if isinstance(figures, dict) else figures
        for name in names:
            doc.image(Path(adir) / name, f"{v['label']}: {Path(name).stem.replace('_', ' ')}")
