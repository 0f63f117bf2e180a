"""Rendering of the outlier measurement (`sinkdlm.analysis.outliers`): its per-layer figure and report tables,
for one `analyze` run and for `compare`. Computes nothing: it draws and tabulates analysis.json's `outliers`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from sinkdlm.analysis.outliers import KINDS
from sinkdlm.reporting import Document

FIGURE = "outliers.png"
CAPTION = ("Per layer (Bondarenko et al. 2023): the ∞-norm (top, log scale) and the mean per-position kurtosis "
           "(bottom; 3 = Gaussian) of the residual stream, the attention output and the FFN output, on the content "
           "positions (solid, dots) and on the extra sink token(s) (dashed, open squares), one colour per model.")
TITLES = {"residual": "residual stream", "attention": "attention output", "ffn": "FFN output"}


def plot_outliers(runs: Mapping[str, dict], path, *, title: str | None = None) -> Path:
    """Two rows (∞-norm, kurtosis) by three tensors, x = layer; `runs`: {label: analysis.json's `outliers`}."""
    from matplotlib.figure import Figure

    from sinkdlm.analysis.figures import _title, integer_ticks, plain_log_ticks, save_figure

    fig = Figure(figsize=(13, 6.2), layout="constrained")
    axes = fig.subplots(2, len(KINDS), sharex=True)
    colours = [f"C{i}" for i in range(len(runs))]
    for col, kind in enumerate(KINDS):
        top, bottom = axes[0][col], axes[1][col]
        for colour, (label, o) in zip(colours, runs.items()):
            for group, style in (("content", dict(linestyle="-", marker="o", markersize=3)),
                                 ("sink", dict(linestyle=(0, (4, 2)), marker="s", markersize=5, markerfacecolor="none",
                                               linewidth=1.8))):
                per = o["per_layer"][kind][group]
                if per is None:
                    continue
                layers = range(len(per["inf_norm"]))
                name = f"{label} {group}".strip()
                top.plot(layers, per["inf_norm"], color=colour, label=name, **style)
                bottom.plot(layers, [float("nan") if k is None else k for k in per["kurtosis"]], color=colour,
                            label=name, **style)
        top.set_title(TITLES[kind])
        plain_log_ticks(top)
        top.set_ylabel("∞-norm max |x|" if col == 0 else "")
        bottom.set_ylabel("kurtosis (mean over positions)" if col == 0 else "")
        bottom.set_xlabel("layer")
        integer_ticks(bottom)
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    _title(fig, title)
    return save_figure(fig, path)


def _channels(channels: list[int], most: int = 6) -> str:
    if not channels:
        return "–"
    shown = ", ".join(str(c) for c in channels[:most])
    return shown + (f" (+{len(channels) - most})" if len(channels) > most else "")


def _norm(x) -> str:
    return "–" if x is None else f"{x:.3g}"


def outlier_section(doc: Document, runs: Mapping[str, dict]) -> None:
    """The report's outlier tables: per model, per layer, the ∞-norm of each tensor (content | sink) and the
    outlier channels (|x| > 6 σ) of the residual stream and the FFN output; `runs`: {label: `outliers`}."""
    doc.heading("Activation outliers (Bondarenko et al. 2023)")
    first = next(iter(runs.values()))
    doc.paragraph(f"Per layer, on the prompts' tokens (content) and the extra sink token(s) (sink): ‖x‖∞ of the "
                  f"residual stream, the attention output and the FFN output, and the channels where some position "
                  f"has |x| > {first['threshold_sigmas']} σ (σ: the layer tensor's standard deviation over every "
                  "measured position and channel). Each cell: content / sink (– where the model has no sink token).")
    for label, o in runs.items():
        if len(runs) > 1:
            doc.paragraph(f"**{label}** ({o['positions']['content']} content positions, {o['positions']['sink']} "
                          "sink)")
        per = o["per_layer"]
        rows = []
        for i in range(len(per["residual"]["content"]["inf_norm"])):
            def both(kind: str, key: str, fmt):
                sink = per[kind]["sink"]
                return f"{fmt(per[kind]['content'][key][i])} / {fmt(sink[key][i]) if sink else '–'}"
            rows.append([i, *(both(kind, "inf_norm", _norm) for kind in KINDS),
                         both("residual", "kurtosis", _norm), both("residual", "outlier_channels", _channels),
                         both("ffn", "outlier_channels", _channels)])
        doc.table(["layer", *(f"‖{TITLES[k]}‖∞" for k in KINDS), "kurtosis, residual", "> 6σ channels, residual",
                   "> 6σ channels, FFN"], rows)


def max_over_layers(o: dict, kind: str, group: str) -> float | None:
    """The largest ∞-norm of a tensor over the layers (the paper's headline number); None without that group."""
    per = o["per_layer"][kind][group]
    return None if per is None else max(per["inf_norm"])
