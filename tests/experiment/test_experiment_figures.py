"""The experiment's question figures (experiment/figures.py and experiment/endpoints/trajectory.py) draw what
summarise stored: the forest of paired differences, the learning curves with each variant's paired gap beside them,
and the primary's gap trajectory; and the escape endpoint's (experiment/endpoints/escape/figures.py): the Kaplan-Meier curves and one run's probes."""

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
    import sinkdlm.analysis.figures as analysis_figures
    from sinkdlm.experiment.endpoints import trajectory

    res = _study()
    seen = []
    monkeypatch.setattr(analysis_figures, "save_figure", lambda fig, path, **kw: seen.append(fig) or Path(path))
    trajectory.plot_val_curves(res, tmp_path / "c.png", "vanilla")
    left, right = seen[0].axes
    assert len(left.get_lines()) == 3  # every variant's curve
    gaps = [ln for ln in right.get_lines() if ln.get_label().endswith("− VANILLA")]
    assert sorted(ln.get_label() for ln in gaps) == ["END − VANILLA", "SINK − VANILLA"]
    sink = next(ln for ln in gaps if ln.get_label() == "SINK − VANILLA")
    assert list(sink.get_xdata()) == list(STEPS)
    assert np.allclose(sink.get_ydata(), [p["mean"] for p in res["trajectories"][0]["points"]])
    trajectory.plot_val_curves(res, tmp_path / "c1.png")  # no baseline: the curves alone
    assert len(seen[1].axes) == 1


def test_forest_names_the_declared_primarys_own_test_not_bh(tmp_path, monkeypatch):
    from sinkdlm.experiment import figures

    res = _study()
    assert res["primary"]["rejects"]  # -0.1 on every seed
    seen = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path, **kw: seen.append(fig) or Path(path))
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

    from sinkdlm.experiment.endpoints.trajectory import plot_val_curves
    from sinkdlm.experiment.figures import plot_forest

    res = _study()
    for path in (plot_forest(res, tmp_path / "f.png", "vanilla"), plot_val_curves(res, tmp_path / "c.png", "vanilla")):
        assert mpimg.imread(path).shape[2] in (3, 4)


def test_the_kaplan_meier_figure_draws_the_stored_estimate_and_marks_censored_runs(tmp_path, monkeypatch):
    """plot_escape_km draws results.json's `escape.km` as stored (from 1 at step 0), a '+' at every censored run
    on its arm's curve, and says in its title how many declared seeds are in."""
    from sinkdlm.experiment.endpoints.escape import figures as escape_figures
    from sinkdlm.experiment.endpoints.escape.summary import kaplan_meier

    def rec(step, censored=False):
        return {"step": step, "censored": censored, "last_probe": 6000}

    km = {"vanilla": kaplan_meier([rec(1000), rec(6000, True), rec(3000), rec(2000)]),
          "sink": kaplan_meier([rec(500), rec(800), rec(700), rec(900)])}
    res = {"train": {"max_steps": 6000}, "variants": {"vanilla": {"label": "DLM"}, "sink": {"label": "DLM + 1 sink"}},
           "escape": {"km": km, "seeds_in": [0, 1, 2, 3], "seeds_declared": list(range(20)), "complete": False}}
    seen = []
    monkeypatch.setattr(escape_figures, "save_figure", lambda fig, path, **kw: seen.append(fig) or Path(path))
    escape_figures.plot_escape_km(res, tmp_path / "km.png")
    ax = seen[0].axes[0]
    curves = {ln.get_label().split(":")[0]: ln for ln in ax.get_lines() if ln.get_label().startswith("DLM")}
    van = curves["DLM"]
    assert list(van.get_xdata()) == [0, 1000, 2000, 3000, 6000, 6000]
    assert list(van.get_ydata()) == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.25, 0.25])  # by hand: 3/4, 2/4, 1/4
    assert "3 of 4 runs escaped, median step 2,000" in van.get_label()
    marks = [ln for ln in ax.get_lines() if ln.get_marker() == "+" and len(ln.get_xdata())]
    assert [(list(m.get_xdata()), list(m.get_ydata())) for m in marks] == [([6000], [pytest.approx(0.25)])]
    assert "4 of 20 declared seeds, interim" in seen[0]._suptitle.get_text()
    assert ax.get_ylabel() == "fraction of runs still on the unigram plateau\n(lower: more runs have escaped)"
    assert ax.get_xlabel() == "training step"


def test_a_runs_escape_figure_draws_its_probes_and_its_gradient_norm(tmp_path, monkeypatch):
    """plot_escape_run: the probe loss as stored, the plateau and threshold, one line per layer of the detected
    sink mass, a sink-token row only for a sink arm, and the logged pre-clip gradient norms."""
    from sinkdlm.experiment.endpoints.escape import figures as escape_figures

    probes = {"probes": {str(s): {"loss": 6.4 - s / 1000, "sink_token_mass": None,
                                  "detected_sink_mass": [0.1 * i + s / 1000 for i in range(3)]} for s in (100, 200, 300)}}
    record = {"plateau": {"probe_cross_entropy": 6.35}, "threshold": 5.95, "grad_norm_peak": {"step": 20, "value": 9.0},
              "escape": {"step": 300, "censored": True, "last_probe": 300},
              "onset": {"step": 200, "censored": False, "last_probe": 300}}
    metrics = [{"step": 10, "loss": 6.0, "grad_norm_max": 2.0}, {"step": 20, "loss": 6.0, "grad_norm_max": 9.0},
               {"step": 20, "val_loss": 6.1}]
    seen = []
    monkeypatch.setattr(escape_figures, "save_figure", lambda fig, path, **kw: seen.append(fig) or Path(path))
    escape_figures.plot_escape_run(record, probes, metrics, "V, seed 1", tmp_path / "r.png", onset_mass=0.3, onset_first_layer=1)
    loss_ax, sink_ax, grad_ax = seen[0].axes  # no sink token: three rows
    loss = next(ln for ln in loss_ax.get_lines() if ln.get_label() == "probe loss")
    assert list(loss.get_xdata()) == [100, 200, 300] and list(loss.get_ydata()) == pytest.approx([6.3, 6.2, 6.1])
    labels = [ln.get_label() for ln in loss_ax.get_lines()]
    assert "escape censored (> 300)" in labels and "sink onset step 200" in labels and "threshold 5.95" in labels
    assert loss_ax.get_ylabel().endswith("lower is better)")  # the trajectory's axis says which way is better
    layer2 = next(ln for ln in sink_ax.get_lines() if ln.get_label() == "layer 2")
    assert list(layer2.get_ydata()) == pytest.approx([0.3, 0.4, 0.5])
    grad = next(ln for ln in grad_ax.get_lines() if ln.get_label().startswith("largest pre-clip"))
    assert list(grad.get_xdata()) == [10, 20] and list(grad.get_ydata()) == [2.0, 9.0]
    for p in probes["probes"].values():
        p["sink_token_mass"] = [0.5, 0.4, 0.3]
    escape_figures.plot_escape_run(record, probes, metrics, "S, seed 1", tmp_path / "s.png")
    assert len(seen[1].axes) == 4 and seen[1].axes[2].get_ylabel() == "attention on\nthe sink token"


def test_a_trajectory_of_fewer_than_three_steps_is_points_with_intervals_and_every_axis_says_which_way_is_better(tmp_path):
    """Two measured steps are drawn as error bars without a line (a line through two points looks measured);
    from three on, a line with its band. The loss and gap axes say which direction is better; the forest shows
    every compared pair, not only those against the baseline, and explains "survives BH" under its axes."""
    from matplotlib.collections import PolyCollection
    from matplotlib.container import ErrorbarContainer

    import sinkdlm.analysis.figures as analysis_figures
    import sinkdlm.experiment.figures as figures
    from sinkdlm.experiment.endpoints import trajectory

    drawn = {}

    def keep(fig, path, palette=False):
        drawn[Path(path).name] = fig
        return Path(path)

    def axes_of(name):
        return drawn[name].axes

    pts = lambda steps: [{"step": s, "tokens": s * 10, "mean": 0.01 / (1 + s), "low": -0.01, "high": 0.02,  # noqa: E731
                          "per_seed": {"0": 0.0, "1": 0.02}} for s in steps]
    comparisons = [{"pair": ["a", "b"], "variant": "A", "baseline": "B", "metric": "val_loss", "mean": 0.1, "low": 0.0,
                    "high": 0.2, "mde": 0.05, "survives": True},
                   {"pair": ["c", "a"], "variant": "C", "baseline": "A", "metric": "val_loss", "mean": -0.1, "low": -0.2,
                    "high": 0.05, "mde": 0.05}]
    for steps, line in (((0, 1500), False), ((0, 500, 1500), True)):
        res = {"primary": {"pair": ["a", "b"], "trajectory": {"points": pts(steps), "tokens_per_step": 10}},
               "variants": {n: {"label": n.upper(), "seeds": {}} for n in "abc"}, "comparisons": comparisons}
        import unittest.mock as mock

        with mock.patch.object(figures, "save_figure", keep), mock.patch.object(analysis_figures, "save_figure", keep):
            trajectory.plot_gap_trajectory(res, tmp_path / "gap.png")
            figures.plot_forest(res, tmp_path / "forest.png", "b")
        ax = axes_of("gap.png")[0]
        assert any(isinstance(c, ErrorbarContainer) for c in ax.containers) is not line
        assert any(isinstance(c, PolyCollection) for c in ax.collections) is line
        assert "< 0: A is better" in ax.get_ylabel()
    forest = axes_of("forest.png")[0]
    assert [t.get_text() for t in forest.get_yticklabels()] == ["C − A", "A − B"]  # every pair, the baseline's first
    assert "< 0: the variant is better" in forest.get_xlabel()
    assert "survives BH" in drawn["forest.png"].get_supxlabel()
