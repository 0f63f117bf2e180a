"""The experiment's question figures (experiment/figures.py) draw what summarise stored: the forest of paired
differences, the learning curves with each variant's paired gap beside them, and the primary's gap trajectory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sinkdlm.experiment.summary import summarise

STEPS = (2400, 4800, 12000)


def _study(n_seeds: int = 5) -> dict:
    rng = np.random.default_rng(0)
    base = rng.normal(4.6, 0.05, n_seeds)
    effect = {"vanilla": 0.0, "sink": -0.1, "end": 0.0}
    variants = {}
    for name, e in effect.items():
        seeds = {}
        for s in range(n_seeds):
            curve = [base[s] + e + 0.3 * (12000 / st - 1) + rng.normal(0, 0.005) for st in STEPS]
            seeds[str(s)] = {"val_loss": curve[-1], "val_loss_se": 0.01,
                             "val_curve": [{"step": st, "val_loss": v, "val_loss_se": 0.01} for st, v in zip(STEPS, curve)]}
        variants[name] = {"label": name.upper(), "switches": {}, "seeds": seeds}
    res = {"preset": "t", "description": "hand-built", "seeds": list(range(n_seeds)), "variants": variants,
           "machine": {"cpu_count": 2}, "train": {"max_steps": 12000, "batch_size": 8, "seq_len": 128},
           "declared": {"primary": {"pair": ["sink", "vanilla"], "metric": "val_loss", "test": "t"}}}
    summarise(res, [("sink", "vanilla"), ("end", "vanilla")])
    return res


def test_every_compared_pair_stores_its_paired_gap_at_each_scored_step():
    res = _study()
    by_pair = {tuple(t["pair"]): t for t in res["trajectories"]}
    assert set(by_pair) == {("sink", "vanilla"), ("end", "vanilla")}
    v = res["variants"]
    for (a, b), t in by_pair.items():
        assert [p["step"] for p in t["points"]] == list(STEPS)
        for i, p in enumerate(t["points"]):
            d = [v[a]["seeds"][s]["val_curve"][i]["val_loss"] - v[b]["seeds"][s]["val_curve"][i]["val_loss"] for s in v[a]["seeds"]]
            assert p["mean"] == pytest.approx(np.mean(d)) and p["seeds"] == 5
            assert p["tokens"] == p["step"] * 8 * 128
    assert res["primary"]["trajectory"]["points"] == by_pair[("sink", "vanilla")]["points"]  # one computation


def test_curves_draw_each_variants_paired_gap_beside_the_learning_curves(tmp_path, monkeypatch):
    from sinkdlm.experiment import figures

    res = _study()
    seen = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: seen.append(fig) or Path(path))
    figures.plot_val_curves(res, tmp_path / "c.png", "vanilla")
    left, right = seen[0].axes
    assert len(left.get_lines()) == 3  # every variant's curve
    gaps = [ln for ln in right.get_lines() if ln.get_label().endswith("− VANILLA")]
    assert sorted(ln.get_label() for ln in gaps) == ["END − VANILLA", "SINK − VANILLA"]
    sink = next(ln for ln in gaps if ln.get_label() == "SINK − VANILLA")
    assert list(sink.get_xdata()) == list(STEPS)
    assert np.allclose(sink.get_ydata(), [p["mean"] for p in res["trajectories"][0]["points"]])
    figures.plot_val_curves(res, tmp_path / "c1.png")  # no baseline: the curves alone
    assert len(seen[1].axes) == 1


def test_forest_names_the_declared_primarys_own_test_not_bh(tmp_path, monkeypatch):
    from sinkdlm.experiment import figures

    res = _study()
    assert res["primary"]["rejects"]  # -0.1 on every seed
    seen = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: seen.append(fig) or Path(path))
    figures.plot_forest(res, tmp_path / "f.png", "vanilla")
    notes = [t.get_text() for t in seen[0].axes[0].texts]
    assert notes == ["no difference detected", "declared test rejects"]  # drawn bottom-up: END − VANILLA, then SINK


def test_forest_says_when_a_raw_interval_clear_of_zero_does_not_survive_the_adjustment():
    from sinkdlm.experiment.figures import _forest_note

    row = {"mean": -0.28, "low": -0.51, "high": -0.05, "excludes_zero": True, "survives": False, "p_adjusted": 0.56}
    assert _forest_note(row) == "raw CI excludes 0; not after BH (adjusted p = 0.56)"
    assert _forest_note({**row, "declared_primary": True}) == "raw CI excludes 0; the declared test does not reject"
    assert _forest_note({**row, "survives": True}) == "survives BH"
    assert _forest_note({**row, "excludes_zero": False, "degenerate": True}) == "inconclusive (no variance)"
    assert _forest_note({**row, "equivalence": {"margin": 0.05, "p": 0.7, "verdict": "inconclusive"}}) == "inconclusive"


def test_the_question_figures_write_pngs(tmp_path):
    import matplotlib.image as mpimg

    from sinkdlm.experiment.figures import plot_forest, plot_val_curves

    res = _study()
    for path in (plot_forest(res, tmp_path / "f.png", "vanilla"), plot_val_curves(res, tmp_path / "c.png", "vanilla")):
        assert mpimg.imread(path).shape[2] in (3, 4)
