"""Every figure function writes a PNG that matplotlib reads back."""

from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest
import torch

from sinkdlm.analysis import largest_sink_positions, non_sink_fraction
from sinkdlm.analysis.figures import (
    plot_attention_maps,
    plot_largest_sink_positions,
    plot_layer_bars,
    plot_non_sink_fraction,
    plot_paired_differences,
    plot_training_curves,
    plot_value_norm_scatter,
)


def maps(n, size=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.softmax(3 * torch.randn(n, size, size, generator=gen), dim=-1)  # [n, S, S]


def check_png(path, written):
    assert written == path
    assert path.stat().st_size > 0
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[0] > 50 and image.shape[1] > 50 and image.shape[2] in (3, 4)
    assert not list(path.parent.glob(".*.tmp"))  # the temp file was renamed away


def test_attention_maps_row_and_grid(tmp_path):
    path = tmp_path / "maps.png"
    check_png(path, plot_attention_maps(list(maps(2)), ["step 0", "step 64"], path))
    grid = tmp_path / "sub" / "grid.png"  # parent folder is created
    written = plot_attention_maps([maps(2, seed=1), maps(2, seed=2).numpy()],
                                  [["A t0", "A t1"], ["B t0", "B t1"]], grid, row_labels=["A", "B"])
    check_png(grid, written)


def test_value_norm_scatter(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "norms.png"
    check_png(path, plot_value_norm_scatter(torch.rand(50) * 2, rng.normal(7, 1, 20_000), path))
    many = tmp_path / "norms2.png"
    data = {"dlm": torch.rand(30), "dlm+sink": torch.rand(0)}  # a model with no sink found
    check_png(many, plot_value_norm_scatter(data, {"dlm": [7.0, 8.0], "dlm+sink": [6.5]}, many))


def test_layer_bars(tmp_path):
    path = tmp_path / "bars.png"
    check_png(path, plot_layer_bars(torch.rand(6), torch.rand(6) + 5, torch.rand(6), path))
    two = tmp_path / "bars2.png"
    norms = {"0.5B": np.ones(4), "1.5B": np.ones(5)}
    check_png(two, plot_layer_bars(norms, {k: 3 * v for k, v in norms.items()},
                                   {k: v / 2 for k, v in norms.items()}, two))


def test_non_sink_fraction(tmp_path):
    path = tmp_path / "frac.png"
    curves = {"a": non_sink_fraction(maps(4)), "b": non_sink_fraction(maps(4, seed=3))}
    check_png(path, plot_non_sink_fraction(curves, path, scale="sum"))


def test_largest_sink_positions(tmp_path):
    steps = maps(8 * 2 * 3, size=12).reshape(8, 2, 3, 12, 12)  # [T, L, H, S, S]
    pos = largest_sink_positions(steps, epsilon=1.0)  # may hold -1 (no sink)
    path = tmp_path / "pos.png"
    check_png(path, plot_largest_sink_positions(pos, path, num_positions=12, extra_sink_positions=[0]))
    two = tmp_path / "pos2.png"
    check_png(two, plot_largest_sink_positions({"dlm": pos, "dlm+sink": torch.zeros(8, 2, 3, dtype=torch.long)}, two))


def test_figure_bad_input(tmp_path):
    with pytest.raises(ValueError, match="titles"):
        plot_attention_maps(list(maps(2)), ["only one"], tmp_path / "x.png")
    with pytest.raises(ValueError, match="square"):
        plot_attention_maps([torch.rand(3, 4)], ["t"], tmp_path / "x.png")
    with pytest.raises(ValueError, match="same models"):
        plot_value_norm_scatter({"a": [1.0]}, {"b": [2.0]}, tmp_path / "x.png")
    with pytest.raises(ValueError, match="lengths"):
        plot_layer_bars([1.0, 2.0], [1.0], [0.5, 0.5], tmp_path / "x.png")
    with pytest.raises(ValueError, match="num_positions"):
        plot_largest_sink_positions(torch.tensor([[3, 4]]), tmp_path / "x.png", num_positions=4)
    with pytest.raises(ValueError, match="non-empty"):
        plot_non_sink_fraction({}, tmp_path / "x.png")
    assert not list(tmp_path.iterdir())


# ----------------------------------------------------------------------------- what the figures say
@pytest.fixture
def captured(monkeypatch):
    """The Figure objects the plot functions build (saving still happens)."""
    import sinkdlm.analysis.figures as F

    figs = []
    real = F.save_figure

    def keep(fig, path, **kw):
        figs.append(fig)
        return real(fig, path, **kw)

    monkeypatch.setattr(F, "save_figure", keep)
    return figs


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_layer_ticks_are_integers_titles_name_the_model_and_rows_share_a_scale(tmp_path, captured):
    norms = {"base": [1.0, 2.0, 3.0], "sink": [10.0, 20.0, 30.0]}
    mass = {"base": [0.1, 0.2, 0.3], "sink": [0.5, 0.6, 0.7]}
    plot_layer_bars(norms, norms, mass, tmp_path / "bars.png", title="base vs sink: per layer")
    fig = captured[-1]
    assert fig._suptitle.get_text() == "base vs sink: per layer"
    fig.canvas.draw()
    for ax in fig.axes:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks  # never layer 0.5
    left = [ax for ax in fig.axes if ax.get_ylabel() == "mean value L2 norm"]
    assert len(left) == 2 and left[0].get_ylim() == left[1].get_ylim()  # "base" drawn on the sink row's scale


def test_empty_panels_say_no_sinks(tmp_path, captured):
    plot_value_norm_scatter({"a": [], "b": [1.0, 2.0]}, {"a": [1.0, 2.0], "b": [3.0]}, tmp_path / "v.png")
    assert any("no sinks detected" in t for t in _texts(captured[-1]))
    plot_largest_sink_positions(np.full((4, 2, 2), -1), tmp_path / "l.png", num_positions=8)
    assert any("no sinks detected" in t for t in _texts(captured[-1]))


def test_no_sink_share_does_not_set_the_colour_scale(tmp_path, captured):
    pos = np.full((5, 10), -1)  # [T, L*H]: 90 % of entries have no sink
    pos[:, 0] = 3
    plot_largest_sink_positions(pos, tmp_path / "l.png", num_positions=6, title="m: largest sink")
    fig = captured[-1]
    image = fig.axes[0].images[0]
    assert image.get_array().shape == (6, 5)  # real positions only, no "no sink" row
    assert image.norm.vmax == pytest.approx(0.1)  # the largest real share, not the 90 % of "no sink"
    twin_lines = [ln.get_ydata() for ax in fig.axes for ln in ax.lines if len(ln.get_ydata()) == 5]
    assert any(np.allclose(y, 0.9) for y in twin_lines)  # the "no sink" share, drawn as a line


def test_attention_map_marks_sink_and_prompt(tmp_path, captured):
    plot_attention_maps(list(maps(2)), ["s0", "s7"], tmp_path / "m.png", sink_positions=[0], prompt_end=5,
                        note="head shown: strongest sink", title="model: attention maps")
    fig = captured[-1]
    assert fig._suptitle.get_text() == "model: attention maps"
    assert "head shown: strongest sink" in fig._supxlabel.get_text()
    ax = fig.axes[0]
    assert any(np.allclose(ln.get_xdata(), 4.5) for ln in ax.lines)  # the prompt | answer boundary
    assert len(ax.patches) == 1  # the box around the sink's key column


def test_run_label_names_the_run(tmp_path):
    from sinkdlm.training.checkpointing import run_label

    assert run_label(tmp_path / "base" / "checkpoints" / "step-30") == "base (step 30)"
    assert run_label(tmp_path / "runs" / "vanilla-s0" / "train" / "checkpoints" / "step-3") == "vanilla-s0/train (step 3)"
    assert run_label(tmp_path / "converted") == "converted"


def test_score_bars_draw_an_asymmetric_interval_as_given(tmp_path, monkeypatch):
    """(mean, low, high) draws whiskers to low and high: a clipped accuracy interval [0.5, 1.0] around
    0.8 must not be drawn as ±0.2 (which would reach 0.6 below, not 0.5); (mean, err) stays ±err."""
    from matplotlib.axes import Axes

    from sinkdlm.analysis.figures import plot_score_bars

    seen = []
    real_bar = Axes.bar
    monkeypatch.setattr(Axes, "bar", lambda self, *a, **k: (seen.append(k["yerr"]), real_bar(self, *a, **k))[1])
    path = plot_score_bars({"acc": {"m": (0.8, 0.5, 1.0)}, "other": {"m": (0.3, 0.1)}}, tmp_path / "s.png")
    assert path.is_file()
    below, above = seen[0]
    assert list(below) == pytest.approx([0.3, 0.1]) and list(above) == pytest.approx([0.2, 0.1])


def test_training_curves_name_every_model_even_without_a_step_common_to_its_seeds(tmp_path, monkeypatch):
    """Each model's mean line carries its label; a model whose seeds logged no common step has no mean line,
    so its first seed's line carries the label instead (the legend is never empty and names every model)."""
    from sinkdlm.analysis import figures

    seen = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path, **kw: seen.append(fig) or Path(path))
    curves = {"dlm": {"0": ([10, 15], [6.0, 5.5]), "1": ([20, 30], [5.7, 5.4])},
              "sink": {"0": ([10, 20], [5.9, 5.6]), "1": ([10, 20], [5.8, 5.5])}}
    plot_training_curves(curves, tmp_path / "c.png")
    labels = [t.get_text() for t in seen[0].axes[0].get_legend().get_texts()]
    assert len(labels) == 2 and labels[1].startswith("sink (mean of 2 seeds") and labels[0].startswith("dlm (each seed")


def test_training_curves_leave_a_run_still_training_out_of_the_mean(tmp_path, monkeypatch):
    """A progress page draws runs still training: a seed whose log stops short of the others' last step is drawn
    but not averaged, so the mean line runs to the end over the seeds that reached it, and its label says so."""
    from sinkdlm.analysis import figures

    seen = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path, **kw: seen.append(fig) or Path(path))
    curves = {"dlm": {"0": ([10, 20, 30], [6.0, 5.0, 4.0]), "1": ([10, 20, 30], [5.0, 4.0, 2.0]),
                      "2": ([10], [9.0])}}
    plot_training_curves(curves, tmp_path / "c.png")
    ax = seen[0].axes[0]
    mean = next(line for line in ax.get_lines() if line.get_label().startswith("dlm (mean"))
    assert list(mean.get_xdata()) == [10, 20, 30] and list(mean.get_ydata()) == [5.5, 4.5, 3.0]
    assert mean.get_label() == "dlm (mean of 2 seeds that reached step 30, 1 still short of it; thin: each seed)"
    assert len(ax.get_lines()) == 4  # the three seeds, each drawn, and the mean


def test_training_curves_per_seed_and_paired_differences(tmp_path):
    curves = {"dlm": {"0": ([10, 20], [6.0, 5.5]), "1": ([10, 20, 30], [6.1, 5.7, 5.4])}, "sink": {"0": ([10], [5.9])}}
    path = tmp_path / "curves.png"
    check_png(path, plot_training_curves(curves, path))
    diffs = [{"label": "sink − dlm", "per_seed": {"0": -0.2, "1": 0.1}, "interval": {"mean": -0.05, "low": -1.9, "high": 1.8}},
             {"label": "one seed", "per_seed": {"0": 0.3}, "interval": {"mean": 0.3, "low": None, "high": None}}]
    path = tmp_path / "diffs.png"
    check_png(path, plot_paired_differences(diffs, path))
    with pytest.raises(ValueError, match="at least one"):
        plot_paired_differences([], tmp_path / "x.png")


def test_a_palette_png_is_the_same_picture_in_a_third_of_the_bytes(tmp_path):
    """save_figure(palette=True) stores at most 256 colours (an indexed PNG): against the full-colour render of
    the same figure (lines, markers, text, a translucent band) every pixel is within a few levels and the file
    is much smaller."""
    from matplotlib.figure import Figure
    from PIL import Image

    from sinkdlm.analysis.figures import save_figure

    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    x = np.linspace(0, 6000, 61)
    for i in range(4):
        y = 6 - i * 0.2 - 0.5 * np.tanh((x - 1500 * (i + 1)) / 400)
        line = ax.plot(x, y, "o-", markersize=2, label=f"layer {i}")[0]
        ax.fill_between(x, y - 0.1, y + 0.1, color=line.get_color(), alpha=0.15)
    ax.legend()
    ax.set_title("probe loss against the training step")
    full, small = save_figure(fig, tmp_path / "full.png"), save_figure(fig, tmp_path / "small.png", palette=True)
    a = np.asarray(Image.open(full).convert("RGB"), dtype=float)
    b_img = Image.open(small)
    assert b_img.mode == "P"
    b = np.asarray(b_img.convert("RGB"), dtype=float)
    assert a.shape == b.shape
    err = np.abs(a - b)
    assert err.mean() < 1.0 and np.quantile(err, 0.999) < 24  # edges' antialiasing shades merge, nothing more
    assert small.stat().st_size < 0.6 * full.stat().st_size
