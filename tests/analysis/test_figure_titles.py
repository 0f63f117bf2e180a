"""The per-layer bars (layer_bars.png): every title inside the figure (none clipped at a panel's or the figure's
edge, whatever the model's name), and the figure's title names what both panels show."""

from __future__ import annotations

import numpy as np
import pytest

LAYERS = 30
LABEL = "SmolLM2-135M-Instruct.Q4_1.gguf, a long run name (step 200)"


@pytest.fixture
def captured(monkeypatch):
    """The matplotlib Figure each plot saves (drawn, so text extents are known)."""
    import sinkdlm.analysis.figures as F

    figures = []
    original = F.save_figure

    def keep(fig, path, **kw):
        figures.append(fig)
        return original(fig, path, **kw)

    monkeypatch.setattr(F, "save_figure", keep)
    return figures


def inside(fig) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    box = fig.bbox
    texts = [ax.title for ax in fig.axes] + ([fig._suptitle] if fig._suptitle is not None else [])
    for text in texts:
        extent = text.get_window_extent(renderer)
        assert extent.x0 >= box.x0 - 1 and extent.x1 <= box.x1 + 1, f"clipped: {text.get_text()!r}"
    # no two panels' titles overlap (a long title wider than its panel would run into its neighbour's)
    spans = sorted((ax.title.get_window_extent(renderer).x0, ax.title.get_window_extent(renderer).x1)
                   for ax in fig.axes if ax.title.get_text())
    rows = {}
    for ax in fig.axes:
        rows.setdefault(round(ax.get_position().y0, 3), []).append(ax.title.get_window_extent(renderer))
    for extents in rows.values():
        extents.sort(key=lambda e: e.x0)
        assert all(a.x1 <= b.x0 for a, b in zip(extents, extents[1:])), spans


def test_detected_sink_bars_titles_fit_and_the_title_names_both_panels(tmp_path, captured):
    """On an analysed model (no extra sink: the detected sinks' bars), with a long label."""
    from helpers import tiny_model, word_tokenizer

    from sinkdlm.analysis import analyze
    from sinkdlm.config import AnalyzeConfig, SampleConfig

    model = tiny_model(vocab_size=47, mask_token_id=46).float()
    analyze(model, word_tokenizer(), ["w1 w2 w3 w4", "w5 w6 w7"],
            AnalyzeConfig(sample=SampleConfig(gen_length=4, steps=4), out=tmp_path / "a", label=LABEL, quiet=True))
    bars = [f for f in captured if f._suptitle is not None and "per layer" in f._suptitle.get_text()
            and len(f.axes) == 2 and "value norm" in f.axes[0].get_title()]
    assert len(bars) == 1
    title = bars[0]._suptitle.get_text().replace("\n", " ")
    assert title.startswith(LABEL) and "value norm" in title and "attention" in title  # both panels
    inside(bars[0])


def test_extra_sink_bars_titles_fit(tmp_path, captured):
    from sinkdlm.analysis.figures import plot_layer_bars

    rng = np.random.default_rng(1)
    rows = {LABEL: rng.random(LAYERS), "vanilla, a second long run name (step 200)": rng.random(LAYERS)}
    plot_layer_bars(rows, {k: rng.random(LAYERS) for k in rows}, {k: rng.random(LAYERS) for k in rows},
                    tmp_path / "bars.png", title=f"{LABEL}: the extra sink token's value norm and share of attention")
    inside(captured[-1])


@pytest.mark.slow  # ~20 s (two analyses): make test-slow
def test_comparison_extra_sink_panel_says_why_a_model_is_missing(tmp_path, captured):
    """Issue 53: compared with a model without an extra sink token, the extra-sink bars show one model; the
    title says the other has none and names the side-by-side figure (sink_mass_layers.png)."""
    from helpers import tiny_model, word_tokenizer

    from sinkdlm.analysis import analyze, compare
    from sinkdlm.config import AnalyzeConfig, SampleConfig

    for name, sinks in (("vanilla", 0), ("sink", 1)):
        model = tiny_model(vocab_size=47, mask_token_id=46, num_sink_tokens=sinks).float()
        analyze(model, word_tokenizer(), ["w1 w2 w3 w4", "w5 w6 w7"],
                AnalyzeConfig(sample=SampleConfig(gen_length=4, steps=4), out=tmp_path / name, label=name, quiet=True))
    captured.clear()
    result = compare([tmp_path / "vanilla", tmp_path / "sink"], tmp_path / "c")
    assert "sink_mass_layers" in result["figures"] and (tmp_path / "c" / "sink_mass_layers.png").is_file()
    bars = [f for f in captured if f._suptitle is not None and "extra sink token" in f._suptitle.get_text()]
    assert len(bars) == 1
    title = bars[0]._suptitle.get_text().replace("\n", " ")
    assert title.startswith("sink (with an extra sink token)")
    assert "(vanilla has no extra sink token: the detected sinks of every model are side by side in " \
           "sink_mass_layers.png)" in title
    inside(bars[0])
