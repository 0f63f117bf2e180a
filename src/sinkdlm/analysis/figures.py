"""Figures of the attention-sink analysis (docs/method.md §6 "Pictures").

Each function takes plain tensors / arrays / lists (computed by
:mod:`sinkdlm.analysis.metrics`), writes one PNG to ``path`` (parent folders are
created; written to a temp file and renamed, so a crash never leaves half a PNG) and
returns the path. Figures are built on ``matplotlib.figure.Figure`` with the Agg
canvas, never through ``pyplot``: no global backend switch, no open-figure registry
to close, safe in threads. Where several models make sense, pass a dict
``label -> data`` and they are drawn side by side (or one row per model) on a shared
y-scale, so panels compare at a glance. Every figure takes ``title=`` (shown on top; the
report passes one naming the model), layer axes have integer ticks only, and a panel
with nothing to show says so ("no sinks detected") instead of staying blank.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import PowerNorm
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter, PercentFormatter

from sinkdlm.io.atomic import atomic_write
from sinkdlm.config.commands import AnalyzeConfig  # the one home of the default (its field docstring)

DPI = 120


def _np(x, name: str) -> np.ndarray:
    """Float numpy array from a tensor (any device/dtype), an array or a list."""
    if hasattr(x, "detach"):  # torch.Tensor, without importing torch here
        x = x.detach().float().cpu().numpy()
    try:
        return np.asarray(x, dtype=float)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be numeric (tensor, array or list)") from err


def _models(data, name: str) -> dict[str, object]:
    """``label -> data``; a bare value is one unlabelled model."""
    if isinstance(data, Mapping):
        if not data:
            raise ValueError(f"{name} is an empty dict; pass at least one model")
        return {str(k): v for k, v in data.items()}
    return {"": data}


def _same_models(name_a: str, a: dict, name_b: str, b: dict) -> None:
    if a.keys() != b.keys():
        raise ValueError(f"{name_a} and {name_b} must hold the same models, got {list(a)} vs {list(b)}")


def integer_ticks(ax, axis: str = "x") -> None:
    """Integer ticks only (layers, steps, positions): never a tick at layer 2.5; thousands separated (1,600), as
    the text around a figure writes its steps."""
    scale = getattr(ax, f"{axis}axis")
    scale.set_major_locator(MaxNLocator(integer=True))
    scale.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))


def plain_log_ticks(ax, axis: str = "y") -> None:
    """A log scale whose ticks sit at 1-2-3-5 of every decade, labelled as plain numbers (2, 30, 500): a
    quantity that spans decades (gradient norms) read without decoding 3x10^0."""
    getattr(ax, f"set_{axis}scale")("log")
    scale = getattr(ax, f"{axis}axis")
    scale.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
    scale.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    scale.set_minor_formatter(NullFormatter())


def say_empty(ax, text: str = "no sinks detected") -> None:
    """Write `text` in the middle of a panel that has nothing to draw."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=11, color="0.35")


def _title(fig: Figure, title: str | None) -> None:
    if title:  # wrapped: a long run name in it would run past the figure's edge
        fig.suptitle(textwrap.fill(title, 110), fontsize=12)


def save_figure(fig: Figure, path, *, palette: bool = False) -> Path:
    """Render `fig` (Agg, no pyplot) to a PNG at `path`, atomically; returns the path.

    `palette`: store it with at most 256 colours (an indexed PNG), for line plots a study commits by the dozen:
    a run's escape figure goes from about 200 kB to 65 kB, and lines, text and shaded bands read the same (no
    colour map to band). Pillow does the quantising: it is matplotlib's own required dependency."""
    FigureCanvasAgg(fig)  # attach the Agg canvas explicitly (no pyplot, no global backend)
    if not palette:
        return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=DPI), suffix=".png")
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    buf.seek(0)
    image = Image.open(buf).convert("RGB").quantize(colors=256)  # median cut: every Pillow matplotlib accepts
    return atomic_write(path, lambda tmp: image.save(tmp, format="png", optimize=True), suffix=".png")


# The attention maps' power-law colour scale: a sink column takes most of each row, so a linear scale would
# leave every other key black; power 0.4 keeps the thin columns visible beside the bright ones.
MAP_GAMMA = 0.4


def plot_attention_maps(
    maps, titles, path, *, row_labels: Sequence[str] | None = None,
    sink_positions: Sequence[int] | Sequence[Sequence[int]] = (), prompt_end: int | Sequence[int | None] | None = None,
    title: str | None = None, note: str | None = None,
) -> Path:
    """Attention maps side by side (One-Token Fig. 1 left), one shared colour scale.

    ``maps``: a sequence of ``[S, S]`` maps (one row), or a sequence of rows, each a
    sequence of maps or ``[N, S, S]`` (e.g. one row per model, one column per step).
    ``titles``: one per map (flat or nested like ``maps``). Rows are queries, columns
    keys; a power-law colour scale (`MAP_GAMMA` < 1) keeps thin sink columns visible next
    to the bright ones. ``sink_positions`` (the extra sink tokens, per row when nested) are
    outlined in cyan; ``prompt_end`` (the first generated position, per row when a list)
    is drawn as a white dashed line on both axes. ``note`` goes under the figure (e.g. how
    the head was chosen).
    """
    arrays = [_np(m, "maps") for m in maps]
    if not arrays:
        raise ValueError("maps is empty; pass at least one [S, S] attention map")
    if all(a.ndim == 2 for a in arrays):
        rows = [arrays]
    elif all(a.ndim == 3 for a in arrays):
        rows = [list(a) for a in arrays]
    else:
        raise ValueError("maps must be a list of [S, S] maps or a list of rows of [S, S] maps")
    if any(m.ndim != 2 or m.shape[0] != m.shape[1] for row in rows for m in row):
        raise ValueError("every attention map must be square [S, S] (queries x keys)")
    flat_titles = [t for ts in titles for t in ts] if titles and not isinstance(titles[0], str) else list(titles)
    n_maps = sum(len(r) for r in rows)
    if len(flat_titles) != n_maps:
        raise ValueError(f"got {len(flat_titles)} titles for {n_maps} maps")
    if row_labels is not None and len(row_labels) != len(rows):
        raise ValueError(f"got {len(row_labels)} row_labels for {len(rows)} rows")
    n_cols = max(len(r) for r in rows)
    sinks_per_row = (
        [list(p) for p in sink_positions] if sink_positions and not isinstance(sink_positions[0], (int, np.integer))
        else [list(sink_positions)] * len(rows)
    )
    ends = list(prompt_end) if isinstance(prompt_end, (list, tuple)) else [prompt_end] * len(rows)
    if len(sinks_per_row) != len(rows) or len(ends) != len(rows):
        raise ValueError(f"sink_positions and prompt_end need one entry per row ({len(rows)} rows)")
    vmax = max(float(m.max()) for row in rows for m in row) or 1.0
    norm = PowerNorm(gamma=MAP_GAMMA, vmin=0.0, vmax=vmax)  # shared by every panel

    fig = Figure(figsize=(3.6 * n_cols + 1.0, 3.4 * len(rows)), layout="constrained")
    axes = fig.subplots(len(rows), n_cols, squeeze=False)
    titles_iter = iter(flat_titles)
    image = None
    for r, row in enumerate(rows):
        for c in range(n_cols):
            ax = axes[r][c]
            if c >= len(row):
                ax.set_visible(False)
                continue
            image = ax.imshow(row[c], cmap="viridis", norm=norm, interpolation="nearest", aspect="equal")
            ax.set_title(next(titles_iter), fontsize=10)
            ax.set_xlabel("key j")
            ax.set_ylabel("query i" if row_labels is None else f"{row_labels[r]}\nquery i")
            size = row[c].shape[0]
            for j in sinks_per_row[r]:  # the extra sink's key column (eq. 6: every query may attend to it)
                ax.axvspan(j - 0.5, j + 0.5, fill=False, edgecolor="cyan", linewidth=2.5)
            if ends[r] is not None and 0 < ends[r] < size:
                for line in (ax.axvline, ax.axhline):
                    line(ends[r] - 0.5, color="white", linestyle="--", linewidth=0.9)
            integer_ticks(ax, "x")
            integer_ticks(ax, "y")
    fig.colorbar(image, ax=axes.ravel().tolist(), label=f"attention probability (power {MAP_GAMMA})")
    legend = []
    if any(sinks_per_row):
        legend.append("cyan frame: the extra sink token's key column")
    if any(e is not None for e in ends):
        legend.append("dashed: prompt | generated boundary")
    _title(fig, title)
    if note or legend:
        fig.supxlabel("\n".join([*([note] if note else []), "; ".join(legend)]).strip(), fontsize=9)
    return save_figure(fig, path)


def plot_value_norm_scatter(sink_norms, normal_norms, path, *, title: str | None = None) -> Path:
    """Value-space norms of sink vs normal tokens (One-Token Fig. 1 right), means in the legend.

    ``sink_norms`` / ``normal_norms``: 1-D values (any shape is flattened), or dicts
    ``label -> values`` with the same labels for one panel per model. Drawn as the distribution of
    the norm (x: the norm, y: the share of each population per bin, one set of bins per panel), so
    the x-axis says something: a scatter against the sample index would not. Every value is
    counted (the recorder's samples are bounded).
    """
    sinks, normals = _models(sink_norms, "sink_norms"), _models(normal_norms, "normal_norms")
    _same_models("sink_norms", sinks, "normal_norms", normals)
    fig = Figure(figsize=(max(7.0, 4.8 * len(sinks)), 3.8), layout="constrained")  # room for the model's title
    axes = fig.subplots(1, len(sinks), squeeze=False, sharey=True)[0]
    for ax, label in zip(axes, sinks):
        pops = [("normal tokens", _np(normals[label], "normal_norms").ravel(), "tab:blue"),
                ("sink tokens", _np(sinks[label], "sink_norms").ravel(), "tab:red")]
        if pops[1][1].size == 0:
            say_empty(ax, "no sinks detected\n(only normal tokens shown)")
        every = np.concatenate([v for _, v, _ in pops])
        bins = np.histogram_bin_edges(every, bins=40) if every.size else np.linspace(0, 1, 41)
        for name, values, colour in pops:
            mean = f"mean {values.mean():.2f}" if values.size else "none"
            if values.size:  # the share of the population in each bin (sums to 1 per population)
                ax.hist(values, bins=bins, weights=np.full(values.size, 1.0 / values.size), histtype="stepfilled",
                        alpha=0.35, color=colour, edgecolor=colour, label=f"{name} ({mean}, n={values.size})")
                ax.axvline(values.mean(), color=colour, linestyle="--", linewidth=1)
            else:
                ax.plot([], [], color=colour, label=f"{name} ({mean}, n=0)")
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_xlabel("value-space L2 norm, mean over heads (eq. 16)")
        ax.set_ylabel("share of the population per bin")
        if label:
            ax.set_title(label)
        ax.legend(fontsize=8)
    _title(fig, title)
    return save_figure(fig, path)


def plot_layer_bars(extra_sink_norm, others_norm, sink_mass, path, *, title: str | None = None) -> Path:
    """Per-layer bars (One-Token Fig. 3): left the mean value norm of the extra sink vs
    all other tokens, right the share of attention mass on the sink.

    Each argument is ``[L]`` or a dict ``label -> [L]`` (same labels): one row per model.
    """
    sinks = _models(extra_sink_norm, "extra_sink_norm")
    others, masses = _models(others_norm, "others_norm"), _models(sink_mass, "sink_mass")
    _same_models("extra_sink_norm", sinks, "others_norm", others)
    _same_models("extra_sink_norm", sinks, "sink_mass", masses)
    fig = Figure(figsize=(11, 3.2 * len(sinks)), layout="constrained")
    axes = fig.subplots(len(sinks), 2, squeeze=False, sharey="col")  # rows compare on one scale
    for (ax_norm, ax_mass), label in zip(axes, sinks):
        s, o, m = (_np(d[label], n).ravel() for d, n in ((sinks, "extra_sink_norm"),
                                                         (others, "others_norm"), (masses, "sink_mass")))
        if not (s.size == o.size == m.size) or s.size == 0:
            raise ValueError(
                f"model {label!r}: per-layer lengths differ or are empty ({s.size}, {o.size}, {m.size})"
            )
        layers = np.arange(s.size)
        ax_norm.bar(layers - 0.2, s, width=0.4, color="tab:red", label="extra sink")
        ax_norm.bar(layers + 0.2, o, width=0.4, color="tab:blue", label="others (mean)")
        ax_norm.set_xlabel("layer")
        ax_norm.set_ylabel("mean value L2 norm")
        name = f"{label}: " if label and len(sinks) > 1 else ""  # one model: named in the figure's title
        ax_norm.set_title(textwrap.fill(f"{name}value norm per layer", 60), fontsize=10)
        ax_norm.legend(fontsize=8)
        ax_mass.bar(layers, m, width=0.7, color="tab:purple")
        ax_mass.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax_mass.set_xlabel("layer")
        ax_mass.set_ylabel("attention mass on sink")
        ax_mass.set_title(textwrap.fill(f"{name}attention mass on the sink per layer", 60), fontsize=10)
        integer_ticks(ax_norm)
        integer_ticks(ax_mass)
    _title(fig, title)
    return save_figure(fig, path)


def plot_non_sink_fraction(
    curves: Mapping[str, Mapping[float, float]], path, *, scale: str = AnalyzeConfig.scale, mark_epsilon: float | None = AnalyzeConfig.epsilon,
    title: str | None = None,
) -> Path:
    """Non-sink fraction vs ϵ, one line per model (Rulli et al. Fig. 10).

    ``curves``: ``label -> {ϵ: fraction}`` (as returned by ``non_sink_fraction``);
    ``scale`` names the received-attention scale in the axis label (docs/method.md §6 asks
    reports to say which one they used).
    """
    if not isinstance(curves, Mapping) or not curves:
        raise ValueError("curves must be a non-empty dict label -> {epsilon: fraction}")
    fig = Figure(figsize=(5.5, 3.8), layout="constrained")
    ax = fig.subplots()
    for label, curve in curves.items():
        if not curve:
            raise ValueError(f"curve {label!r} is empty")
        eps = sorted(curve)
        ax.plot(eps, [float(curve[e]) for e in eps], marker="o", label=str(label))
    if mark_epsilon is not None:
        ax.axvline(mark_epsilon, color="grey", linestyle=":", linewidth=1)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylim(top=1.005)  # a fraction: never show room above 100 %
    ax.set_xlabel(f"ϵ (column-{scale} scale)")
    ax.set_ylabel("non-sink tokens")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _title(fig, title)
    return save_figure(fig, path)


def plot_largest_sink_positions(
    positions, path, *, num_positions: int | None = None, extra_sink_positions: Sequence[int] = (),
    title: str | None = None, step_label: str | Mapping[str, str] = "denoising step",
) -> Path:
    """Largest-sink position vs step, as a heatmap.

    ``step_label`` names the x-axis, one for every panel or ``label -> name`` per model: a DLM's
    steps are denoising steps, an autoregressive model's are decoding steps (one token each).

    ``positions``: ``[T, ...]`` integer positions (e.g. ``[T, L, H]`` from
    ``largest_sink_positions``; -1 = no sink), or a dict ``label -> [T, ...]`` for one
    panel per model. The colour of (step, position) is the share of the trailing
    entries (layers x heads) whose largest sink sits there, so a stable sink is a
    horizontal line and a moving sink jumps. The colour scale spans the shares of real
    positions only: the "no sink" share (often the largest) is drawn as a line on its
    own right-hand axis (a red line) instead of as a heatmap row that would wash out the rest; a cell
    that no (layer, head) points at stays white.
    ``extra_sink_positions`` are marked; a panel without any sink says so.
    """
    models = _models(positions, "positions")
    arrays = {k: _np(v, "positions") for k, v in models.items()}
    for label, a in arrays.items():
        if a.ndim < 1 or a.shape[0] == 0 or (a.size and (a.min() < -1 or np.any(a != np.round(a)))):
            raise ValueError(f"positions {label!r} must be integer positions >= -1 with shape [T, ...]")
    top = max(int(a.max()) for a in arrays.values()) + 1
    size = num_positions if num_positions is not None else top
    if size < top:
        raise ValueError(f"num_positions={num_positions} but a position {top - 1} occurs")
    size = max(size, 1)

    shares, none_share = {}, {}
    for label, a in arrays.items():
        per_step = a.reshape(a.shape[0], -1).astype(int)  # [T, N]
        counts = np.stack([np.bincount(row + 1, minlength=size + 1) for row in per_step], axis=1)  # [1+S, T]
        n = max(per_step.shape[1], 1)
        shares[label] = counts[1:] / n  # [S, T] real positions
        none_share[label] = counts[0] / n  # [T]
    vmax = max(float(v.max()) for v in shares.values() if v.size) or 1.0  # shared by every panel

    fig = Figure(figsize=(5.4 * len(arrays) + 1.0, 4.0), layout="constrained")
    axes = fig.subplots(1, len(arrays), squeeze=False, sharey=True)[0]
    image = None
    for ax, (label, a) in zip(axes, arrays.items()):
        steps = a.shape[0]
        # a cell no (layer, head) points at stays white: the sinks stand out instead of a black field
        cmap = matplotlib.colormaps["viridis_r"].with_extremes(bad="white")
        image = ax.imshow(np.ma.masked_equal(shares[label], 0.0), origin="lower", aspect="auto", cmap=cmap,
                          vmin=0.0, vmax=vmax, interpolation="nearest", extent=(-0.5, steps - 0.5, -0.5, size - 0.5))
        for p in extra_sink_positions:
            ax.axhline(p, color="tab:cyan", linestyle="--", linewidth=0.8)
        if not shares[label].any():
            say_empty(ax)
        if none_share[label].any():
            twin = ax.twinx()
            twin.plot(np.arange(steps), none_share[label], color="tab:red", linewidth=1.2, marker=".", markersize=3)
            twin.set_ylim(0, 1.02)
            twin.yaxis.set_major_formatter(PercentFormatter(1.0))
            twin.set_ylabel("(layer, head)s with no sink (red line)", fontsize=9, color="tab:red")
        integer_ticks(ax, "x")
        integer_ticks(ax, "y")
        ax.set_xlabel(step_label.get(label, "step") if isinstance(step_label, Mapping) else step_label)
        ax.set_ylabel("largest-sink position")
        if label:
            ax.set_title(label)
    fig.colorbar(image, ax=axes.tolist(), label="share of (layer, head)", location="bottom", shrink=0.6)
    _title(fig, title)
    return save_figure(fig, path)


def plot_training_curves(
    curves: Mapping[str, Mapping[str, tuple]], path, *, ylabel: str = "validation loss (ELBO bound / token)",
    title: str | None = None, log_y: bool = False,
) -> Path:
    """A metric vs training step, every seed drawn: one colour per model, one thin line per seed, and
    the mean over the seeds (thick, at the steps every seed logged). A seed whose log stops short of the
    others' last step (a run still training) is drawn but left out of the mean, which would otherwise stop
    where it stops.

    ``curves``: ``label -> {seed: (steps [T], values [T])}``.
    """
    if not curves:
        raise ValueError("curves is empty; pass at least one model")
    fig = Figure(figsize=(6.4, 4.6), layout="constrained")  # room for the legend below the axes
    ax = fig.add_subplot()
    for i, (label, seeds) in enumerate(curves.items()):
        colour = f"C{i % 10}"
        series = {seed: dict(zip(_np(st, "steps").tolist(), _np(v, "values").tolist())) for seed, (st, v) in seeds.items()}
        last = max((max(c) for c in series.values() if c), default=None)
        full = [c for c in series.values() if c and max(c) == last]  # the seeds that reached the last step
        # a mean needs two seeds (or a model with one): one finished seed beside runs in progress is a seed, not a mean
        common = sorted(set.intersection(*(set(c) for c in full))) if len(full) >= min(2, len(series)) else []
        short = len(series) - len(full)
        for j, c in enumerate(series.values()):  # without a mean line the first seed's line names the model
            ax.plot(list(c), list(c.values()), color=colour, linewidth=0.8, alpha=0.45,
                    label=f"{label} (each seed; no step logged by all)" if j == 0 and not common else None)
        if common:
            ax.plot(common, [float(np.mean([c[st] for c in full])) for st in common], color=colour,
                    linewidth=2.0, marker="o", markersize=3,
                    label=f"{label} (mean of {len(full)} seed{'s' if len(full) != 1 else ''}"
                          + (f" that reached step {last:,.0f}, {short} still short of it" if short else "") + "; thin: each seed)")
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    if log_y:  # gradient norms span decades
        plain_log_ticks(ax)
    integer_ticks(ax)
    ax.grid(alpha=0.3)
    # below the axes: one line per model, whose label says what its mean covers, never over the curves
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), frameon=False)
    if title:
        ax.set_title(title)
    return save_figure(fig, path, palette=True)


def plot_paired_differences(
    differences: Sequence[Mapping], path, *, xlabel: str = "Δ validation loss (variant − baseline, nats / token)",
    title: str | None = None,
) -> Path:
    """One row per compared pair: the per-seed paired differences (dots, labelled by seed) and the mean
    with its 95 % interval over seeds (bar; none when it has no bounds), against a line at 0.

    ``differences``: ``[{"label", "per_seed": {seed: d}, "interval": {"mean", "low", "high"}}]``.
    """
    if not differences:
        raise ValueError("differences is empty; pass at least one compared pair")
    fig = Figure(figsize=(7.0, 1.2 + 0.55 * len(differences)), layout="constrained")
    ax = fig.subplots()
    for row, entry in enumerate(reversed(list(differences))):
        iv = entry["interval"]
        if iv.get("low") is not None and iv.get("high") is not None:
            ax.errorbar([iv["mean"]], [row], xerr=[[iv["mean"] - iv["low"]], [iv["high"] - iv["mean"]]], fmt="s",
                        color="black", capsize=4, markersize=5, label="mean, 95 % CI over seeds" if row == 0 else None)
        else:
            ax.plot([iv["mean"]], [row], "s", color="black", label="mean (no interval)" if row == 0 else None)
        for seed, d in entry["per_seed"].items():
            ax.plot([d], [row + 0.18], "o", color="tab:orange", markersize=4, alpha=0.8)
            ax.annotate(str(seed), (d, row + 0.18), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
    ax.plot([], [], "o", color="tab:orange", label="one seed (labelled)")
    ax.axvline(0.0, color="grey", linewidth=0.8)
    ax.set_yticks(range(len(differences)), [e["label"] for e in reversed(list(differences))], fontsize=8)
    ax.set_ylim(-0.6, len(differences) - 0.3)
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    _title(fig, title)
    return save_figure(fig, path, palette=True)


def plot_score_bars(
    scores: Mapping[str, Mapping[str, tuple]], path, *, ylabel: str = "score", title: str | None = None
) -> Path:
    """Grouped bars with error bars, one group per metric: ``metric -> {model -> (mean, err)}`` for a
    symmetric ± err, or ``(mean, low, high)`` for an interval that is not (one clipped to [0, 1])."""
    if not scores:
        raise ValueError("scores is empty; pass at least one metric")
    metrics = list(scores)
    models = list(dict.fromkeys(m for per in scores.values() for m in per))
    width = 0.8 / max(len(models), 1)
    fig = Figure(figsize=(max(6.4, 1.6 * len(metrics)), 4.0))
    ax = fig.add_subplot()
    x = np.arange(len(metrics))
    def whiskers(entry):  # (below, above) the mean
        if len(entry) == 3:
            mean, low, high = entry
            return mean - low, high - mean
        return entry[1], entry[1]

    for i, model in enumerate(models):
        entries = [scores[m].get(model, (np.nan, 0.0)) for m in metrics]
        means = [e[0] for e in entries]
        errs = np.array([whiskers(e) for e in entries]).T  # [2, metrics]: matplotlib's asymmetric yerr
        ax.bar(x + (i - (len(models) - 1) / 2) * width, means, width, yerr=errs, capsize=3, label=model)
    ax.set_xticks(x, metrics, rotation=15, ha="right")
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return save_figure(fig, path, palette=True)
