"""The quantization endpoint in the report (docs/method.md §16): formats results.json's `quant` (`quant.summary`
computed every number) and draws its figure; nothing is estimated here.

`quant_answer_line` is the one-sentence answer (a direction only where the declared test decided: its interval
excludes 0, every declared seed is in and the differences vary; else, with its MDE, "no difference detected" where
the MDE is at or below the effect the seeds were sized for and "inconclusive" otherwise, by
`endpoints.detection`'s rule; where no run showed an FFN outlier channel it says so, with the measured ∞-norms);
`quant_section` adds the primary's MDE, the table of Δ_quant per arm and scheme, the secondary tests with their
MDEs and the figure (`plot_quant`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from sinkdlm.analysis.figures import integer_ticks, save_figure
from sinkdlm.experiment.endpoints.detection import null_words
from sinkdlm.experiment.formatting import fmt_ci, fmt_p
from sinkdlm.reporting import Document
from sinkdlm.stats import signed


def _label(results: dict[str, Any], name: str) -> str:
    return results["variants"][name]["label"]


def _norm(d: dict[str, Any]) -> str:
    """"15.28 [13.10, 17.46]" of an ∞-norm's interval (a norm has no sign); the mean alone without bounds."""
    if d.get("mean") is None:
        return "–"
    bounds = f" [{d['low']:.2f}, {d['high']:.2f}]" if d.get("low") is not None and d.get("high") is not None else ""
    return f"{d['mean']:.2f}{bounds}"


def _metric_words(metric: str) -> str:
    return f"Δ_quant under {metric.split(':', 1)[1]}" if metric.startswith("delta:") else "largest FFN ∞-norm"


def _no_outliers(results: dict[str, Any], q: dict[str, Any]) -> str:
    """The fallback (§16): no run has an FFN outlier channel; the measured ∞-norms per arm."""
    norms = ", ".join(f"{_label(results, n)} {_norm(a['ffn_inf_norm_max'])}" for n, a in q["arms"].items())
    return (f"; no run shows an FFN outlier channel (> 6 σ), so these tiny models have no outliers for a sink to "
            f"remove (largest FFN ∞-norm, mean over seeds: {norms})")


def _mde(p: dict[str, Any]) -> str:
    """"MDE 0.0123 nats" of the primary (the paired t test's, 80 % power, two-sided 5 %), or why there is none."""
    if p.get("mde") is not None:
        return f"MDE {p['mde']:.3g} nats"
    return "no MDE: no variance" if p.get("degenerate") else "no MDE"


def primary_words(p: dict[str, Any], q: dict[str, Any], a: str, b: str) -> str:
    """What the declared primary says: a direction only where `decided` (the summary's rule); an interim study
    nothing; a rank test that rejects without a decision "inconclusive"; else `endpoints.detection.null_words`
    ("no difference detected (MDE .., sized for ..)" where the MDE is at or below the effect the seeds were sized
    for, else "inconclusive")."""
    sized = "" if p.get("sized_for") is None else f", sized for {p['sized_for']:g}"
    if p["decided"]:
        word = "smaller" if p["rank"]["estimate"] < 0 else "larger"
        return f"quantization costs {a} **{word}** a loss than {b} ({_mde(p)}{sized})"
    if not q["complete"]:
        return (f"inconclusive, interim: {len(q['seeds_in'])} of {len(q['seeds_declared'])} seeds "
                f"({_mde(p)}{sized})")
    if p.get("rejects"):
        why = "no variance" if p.get("degenerate") else "its interval does not exclude 0"
        return f"inconclusive (the Wilcoxon test rejects, but {why}; {_mde(p)}{sized})"
    return null_words(p.get("mde"), p.get("sized_for"), "nats", degenerate=bool(p.get("degenerate")),
                      seeds=p.get("seeds"))


def quant_answer_line(results: dict[str, Any]) -> str | None:
    """"Does a sink make a DLM quantizable?" in one sentence, from the declared primary's numbers."""
    q = results.get("quant")
    if not q:
        return None
    p = q["primary"]
    head = "**Does a sink make a DLM quantizable?** "
    if p.get("missing"):
        text = head + f"not measured ({p['missing']})"
    else:
        a, b = (_label(results, n) for n in p["pair"])
        rank = p["rank"]
        ci = f" [{signed(rank['low'], 3)}, {signed(rank['high'], 3)}]" if rank.get("low") is not None else ""
        numbers = (f"{a}'s Δ_quant − {b}'s under {p['scheme']}: {signed(rank['estimate'], 3)}{ci} (Hodges-Lehmann, "
                   f"exact Wilcoxon p = {fmt_p(rank.get('p'))}; paired t {fmt_ci(p['t'])}; {p['seeds']} seeds)")
        text = head + f"{numbers}: {primary_words(p, q, a, b)}"
    if q["outliers"]["runs"] and not q["outliers"]["with_ffn_outlier_channels"]:
        text += _no_outliers(results, q)
    return text + "."


def plot_quant(results: dict[str, Any], path) -> Path | None:
    """Left: Δ_quant per arm and scheme, mean over seeds with its 95 % interval (a point without bars: one seed);
    right: the FFN ∞-norm per layer per arm, content positions and sink rows apart, mean over seeds with its
    interval. None without any quant record."""
    q = results.get("quant") or {}
    arms = q.get("arms") or {}
    if not arms:
        return None
    schemes = q["schemes"]
    fig = Figure(figsize=(10.0, 4.2), layout="constrained")
    left, right = fig.subplots(1, 2)
    width = 0.8 / len(schemes)
    for j, scheme in enumerate(schemes):
        xs, ys, err = [], [], [[], []]
        for i, name in enumerate(arms):
            s = arms[name]["schemes"][scheme]
            if s.get("mean") is None:
                continue
            xs.append(i + (j - (len(schemes) - 1) / 2) * width)
            ys.append(s["mean"])
            bounded = s.get("low") is not None and s.get("high") is not None
            err[0].append(s["mean"] - s["low"] if bounded else 0.0)
            err[1].append(s["high"] - s["mean"] if bounded else 0.0)
        left.errorbar(xs, ys, yerr=err, fmt="o", capsize=4, label=scheme)
    left.axhline(0, color="tab:grey", linewidth=0.8)
    left.set_xlim(-0.6, len(arms) - 0.4)
    left.set_xticks(range(len(arms)), [_label(results, n) for n in arms], fontsize=8)
    left.set_ylabel("Δ_quant = quantized − unquantized val_loss (nats)")
    left.legend(fontsize=8)
    left.grid(alpha=0.3, axis="y")
    means = [v["mean"] for arm in arms.values() for key in ("ffn_inf_norm_content", "ffn_inf_norm_sink", "ffn_inf_norm")
             for v in arm.get(key) or [] if v.get("mean")]
    floor = min((m for m in means if m > 0), default=1.0) / 10  # the log axis's bottom: a lower bound <= it runs off
    for name, arm in arms.items():  # content positions solid; an arm's sink rows dashed, in its colour
        color = None
        for key, style, where in (("ffn_inf_norm_content", "o-", "content"), ("ffn_inf_norm_sink", "s--", "sink rows")):
            layers = arm.get(key) or (arm["ffn_inf_norm"] if key == "ffn_inf_norm_content" else [])
            if not layers:
                continue
            x = list(range(len(layers)))
            line = right.plot(x, [v["mean"] for v in layers], style, color=color, markersize=4,
                              label=f"{_label(results, name)}, {where}")[0]
            color = line.get_color()
            if all(v.get("low") is not None for v in layers):
                right.fill_between(x, [max(v["low"], floor) for v in layers], [v["high"] for v in layers], color=color,
                                   alpha=0.1)
    right.set_yscale("log")  # outliers sit orders of magnitude above the rest
    right.set_ylim(bottom=floor)
    right.set_xlabel("layer")
    right.set_ylabel("FFN output ∞-norm (validation text, log)")
    integer_ticks(right)
    right.legend(fontsize=8)
    right.grid(alpha=0.3)
    seeds = f"{len(q.get('seeds_in') or [])} of {len(q.get('seeds_declared') or [])} declared seeds"
    fig.suptitle(f"Quantization: the loss it costs per arm and scheme, and the FFN outliers (mean, 95 % CI; {seeds})",
                 fontsize=10)
    return save_figure(fig, path, palette=True)


def quant_section(doc: Document, results: dict[str, Any], out: Path) -> None:
    """The report's section: the answer, the table per arm and scheme, the declared tests, the figure."""
    q = results.get("quant")
    if not q:
        return
    doc.heading("Quantization: does a sink make a DLM quantizable?")
    doc.paragraph(quant_answer_line(results))
    p = q["primary"]
    if not p.get("missing"):
        sized = ("not sized: no effect was declared before the runs, so a test that detects nothing is inconclusive"
                 if p.get("sized_for") is None else
                 f"the seeds were sized, from the pilot before the study's runs, to detect {p['sized_for']:g} nats")
        doc.paragraph(f"Minimum detectable effect of the primary: {_mde(p)} (the paired t test over these "
                      f"{p['seeds']} seeds, 80 % power, two-sided 5 %, from the study's own spread of the paired "
                      f"differences); {sized}. A test that detects nothing says \"no difference detected\" only where "
                      "the MDE is at or below that effect, else \"inconclusive\" (docs/method.md §7, §16).")
    rows = []
    for name, arm in q["arms"].items():
        for scheme in q["schemes"]:
            s = arm["schemes"][scheme]
            content = arm.get("ffn_inf_norm_content_max")
            rows.append([_label(results, name), scheme, fmt_ci(s, 4), str(s["n"]), _norm(arm["ffn_inf_norm_max"]),
                         _norm(content) if content and content.get("mean") is not None else "–",
                         str(sum(c > 0 for c in arm["ffn_outlier_channels"].values()))])
    doc.table(["arm", "scheme", "Δ_quant (nats), mean [95 % CI]", "seeds", "largest FFN ∞-norm [95 % CI]",
               "on content positions", "runs with FFN outlier channels"], rows)
    tests = [[f"{_label(results, t['pair'][0])} − {_label(results, t['pair'][1])}", _metric_words(t["metric"]),
              fmt_ci(t["adjusted"], 4), f"{100 * t['adjusted']['confidence']:.3g} %", fmt_p(t.get("p")),
              fmt_p(t.get("p_adjusted")), "–" if t.get("mde") is None else f"{t['mde']:.3g}", t["verdict"]]
             for t in q["secondary"]]
    if tests:
        doc.paragraph("Secondary comparisons (paired t over seeds, one Benjamini-Hochberg family; each interval, and "
                      "its MDE, at the false-coverage-adjusted level):")
        doc.table(["pair", "metric", "difference [adjusted CI]", "level", "p", "BH-adjusted p",
                   "MDE (80 % power, adjusted level)", "verdict"], tests)
    fig = plot_quant(results, Path(out) / "figures" / "quant.png")
    if fig:
        doc.image(fig, "Left: Δ_quant (quantized − unquantized fixed-validation loss, paired on the same masks) per "
                       "arm and scheme; right: the FFN output ∞-norm per layer per arm on the validation text (log "
                       "scale), over the content positions (solid) and, for an arm with sink tokens, over the sink "
                       "rows (dashed). Mean over seeds with its 95 % interval (one that reaches 0 runs off the axis's bottom).")
