"""Aggregate an experiment over seeds and write its report (results.json -> report.md / report.html).

Noise model for a difference Δ = mean(variant) - mean(baseline) over n seeds each:
    σ_Δ² = (s_v² + s_b²) / n  +  (se_v² + se_b²)
with s the standard deviation over seeds (training noise: init, data order, masks) and se the
evaluation's own sampling error (binomial over the n items of the task, averaged over seeds —
the seeds share the items, so seed-to-seed spread does not contain it). A difference is called
"larger than its noise" only when |Δ| > 2 σ_Δ; everything else is reported as within noise.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from sinkdlm.reporting import Document

# Metrics where lower is better; everything else (accuracies) is higher-is-better.
LOWER_IS_BETTER = {"val_loss"}


def _mean_std(values: list[float]) -> dict[str, float]:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not values:
        return {"mean": float("nan"), "std": float("nan"), "n": 0}
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "std": std, "n": len(values)}


def summarise(results: dict[str, Any]) -> None:
    """Add `summary` to every variant and `comparisons` (each variant vs the first) to results."""
    for v in results["variants"].values():
        seeds = list(v["seeds"].values())
        summary = {"val_loss": {**_mean_std([s["val_loss"] for s in seeds]), "stderr": 0.0}}
        metrics = sorted({(task, m) for s in seeds for task, ms in s["eval"].items() for m in ms})
        for task, m in metrics:
            vals = [s["eval"][task][m]["value"] for s in seeds if m in s["eval"].get(task, {})]
            errs = [s["eval"][task][m].get("stderr", 0.0) for s in seeds if m in s["eval"].get(task, {})]
            summary[f"{task}/{m}"] = {**_mean_std(vals), "stderr": statistics.fmean(errs) if errs else 0.0}
        v["summary"] = summary
    names = list(results["variants"])
    base = results["variants"][names[0]]
    comparisons = []
    for name in names[1:]:
        v = results["variants"][name]
        for metric, s in v["summary"].items():
            b = base["summary"].get(metric)
            if b is None or s["n"] == 0 or b["n"] == 0:
                continue
            delta = s["mean"] - b["mean"]
            sigma = math.sqrt((s["std"] ** 2 + b["std"] ** 2) / max(min(s["n"], b["n"]), 1) + s["stderr"] ** 2 + b["stderr"] ** 2)
            better = delta < 0 if metric in LOWER_IS_BETTER else delta > 0
            significant = sigma > 0 and abs(delta) > 2 * sigma
            comparisons.append({
                "variant": v["label"], "baseline": base["label"], "metric": metric, "delta": delta, "sigma": sigma,
                "significant": significant, "better": better,
            })
    results["comparisons"] = comparisons


def _fmt(s: dict[str, float], pct: bool) -> str:
    if s["n"] == 0:
        return "–"
    scale = 100.0 if pct else 1.0
    text = f"{scale * s['mean']:.2f} ± {scale * s['std']:.2f}"
    if s.get("stderr"):
        text += f" (se {scale * s['stderr']:.2f})"
    return text


def sentence(c: dict[str, Any]) -> str:
    pct = c["metric"] != "val_loss"
    scale, unit = (100.0, " points") if pct else (1.0, "")
    direction = "better" if c["better"] else "worse"
    if c["significant"]:
        return (f"**{c['variant']}** is {direction} than {c['baseline']} on `{c['metric']}` by {abs(scale * c['delta']):.2f}{unit} "
                f"(2σ = {2 * scale * c['sigma']:.2f}): larger than its noise.")
    return (f"{c['variant']} vs {c['baseline']} on `{c['metric']}`: Δ = {scale * c['delta']:+.2f}{unit}, within noise "
            f"(2σ = {2 * scale * c['sigma']:.2f}); no conclusion.")


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
        f"{results['train'].get('seq_len')} tokens on `{results['train'].get('data', 'shakespeare')}`). "
        f"Machine: {m['processor']}, {m['cpu_count']} cores, torch {m['torch']}, CUDA {'yes' if m['cuda'] else 'no'}. "
        f"Wall time {results['elapsed_s'] / 60:.1f} min "
        f"({', '.join(f'{k} {v / 60:.1f}' for k, v in results['stage_seconds'].items() if v)} min)."
    )

    metrics = list(next(iter(variants.values()))["summary"])
    doc.heading("Results (mean ± std over seeds; se = evaluation sampling error)")
    header = ["variant"] + [f"`{k}`" + (" %" if k != "val_loss" else "") for k in metrics]
    rows = [[v["label"]] + [_fmt(v["summary"][k], k != "val_loss") for k in metrics] for v in variants.values()]
    doc.table(header, rows)
    doc.paragraph("`val_loss` is the validation ELBO bound per token (eq. 4, lower is better); task metrics are accuracies.")

    doc.heading("Is each difference larger than its noise?")
    doc.bullets([sentence(c) for c in results["comparisons"]] or ["Only one variant: nothing to compare."])
    if len(results["seeds"]) < 5:
        doc.paragraph(
            f"With {len(results['seeds'])} seed(s) the seed-to-seed spread is itself poorly estimated: read a "
            "'larger than its noise' as a lead to check with more seeds (`--seeds`), not as a result."
        )

    curves = {}
    for v in variants.values():
        per_seed = [dict(s["curve"]) for s in v["seeds"].values() if s["curve"]]
        steps = sorted(set.intersection(*(set(c) for c in per_seed))) if per_seed else []
        if steps:
            means = [statistics.fmean(c[s] for c in per_seed) for s in steps]
            stds = [statistics.stdev([c[s] for c in per_seed]) if len(per_seed) > 1 else 0.0 for s in steps]
            curves[v["label"]] = (steps, means, stds)
    if curves:
        doc.heading("Training")
        doc.image(plot_training_curves(curves, fig_dir / "val_loss.png"), "Validation loss vs step (mean ± std over seeds)")
    bars = {k: {v["label"]: (v["summary"][k]["mean"], v["summary"][k]["std"]) for v in variants.values()} for k in metrics if k != "val_loss"}
    if bars:
        doc.image(plot_score_bars(bars, fig_dir / "scores.png", ylabel="accuracy"), "Task scores (mean ± std over seeds)")

    _analysis_section(doc, results)
    doc.heading("Files")
    doc.bullets([
        "`results.json`: every number above, per seed", "`runs/<variant>-s<seed>/train/metrics.jsonl`: training curves",
        "`runs/<variant>-s<seed>/eval.json`: task scores", "`runs/<variant>-s0/analysis/`: per-model sink analysis",
        "`compare/report.html`: analyses side by side",
    ])
    return doc.write(out)


def _analysis_section(doc: Document, results: dict[str, Any]) -> None:
    rows, figures = [], []
    for v in results["variants"].values():
        first = next(iter(v["seeds"].values()))
        adir = first.get("analysis_dir")
        if not adir or not (Path(adir) / "analysis.json").is_file():
            continue
        a = json.loads((Path(adir) / "analysis.json").read_text())
        moving = a.get("moving", {}).get("mean", {})
        extra = a.get("extra_sink") or {}
        vn = a.get("value_norm", {})
        rows.append([
            v["label"],
            f"{100 * a['non_sink_fraction']:.1f} %",
            f"{_num(vn.get('sink_mean'))} / {_num(vn.get('normal_mean'))}",
            _num(moving.get("sink_set_change_rate"), 3),
            _num(moving.get("sink_set_jaccard"), 3),
            f"{100 * extra['mean_attention_mass']:.1f} %" if extra.get("mean_attention_mass") is not None else "–",
            _ablation_text(a.get("ablation")),
        ])
        for name in a.get("figures", {}).values() if isinstance(a.get("figures"), dict) else a.get("figures", []):
            figures.append((Path(adir) / name, f"{v['label']}: {Path(name).stem.replace('_', ' ')}"))
    if not rows:
        return
    doc.heading(f"Attention sinks (first seed; ϵ = {results['analysis_settings'].get('epsilon', 3.0)})")
    doc.table(
        ["variant", "non-sink fraction", "value norm sink / normal", "sink-set change rate", "consecutive Jaccard",
         "attention mass on extra sink (mean over layers)", "sink-masking ablation"],
        rows,
    )
    for path, caption in figures:
        doc.image(path, caption)


def _num(x, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) else "–"


def _ablation_text(ablation) -> str:
    if not isinstance(ablation, dict):
        return "–"
    scores = ablation.get("scores", {})
    parts = [f"K={k}: {v:.3f}" for k, v in scores.items() if isinstance(v, (int, float))]
    if parts and ablation.get("metric"):
        parts.insert(0, f"`{ablation['metric']}`")
    return ", ".join(parts) or "–"
