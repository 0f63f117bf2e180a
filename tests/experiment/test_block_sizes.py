"""The block-sizes endpoint (docs/method.md §15): each arm's moving-sink rate over seeds with its Student t interval,
against a direct computation, and its figure and sentence; and the rule that a block model's val_loss (its block
NELBO, one bound per block size) is not compared across block sizes: such a row stays out of the multiplicity family,
the figures, the sizing and the trajectories, on planted results."""

from __future__ import annotations

import statistics

import pytest
from scipy import stats as st

from sinkdlm.experiment.endpoints.base import Study
from sinkdlm.experiment.endpoints.block_sizes import BlockSizes, block_sizes_line, not_compared, plot_block_sizes
from sinkdlm.experiment.endpoints.primary import primary_seed_table
from sinkdlm.experiment.figures import plot_forest
from sinkdlm.experiment.formatting import comparisons_table, pivot_comparisons
from sinkdlm.experiment.report import multiplicity_note, validation_note
from sinkdlm.experiment.summary import paired_val_loss_differences, summarise

RATES = {"vanilla": [0.30, 0.25, 0.35], "block4": [0.10, 0.12, 0.08], "block4-sink1": [0.05, 0.07, 0.06]}
SWITCHES = {"vanilla": {"num_sink_tokens": 0}, "block4": {"num_sink_tokens": 0, "block_size": 4},
            "block4-sink1": {"num_sink_tokens": 1, "block_size": 4}}


def _results() -> dict:
    return {"train": {}, "variants": {  # the default sequence (128): results.json keeps non-defaults only
        name: {"label": name, "switches": dict(SWITCHES[name]),
               "seeds": {str(400 + i): {"analysis": {"moving": {"content_sink_set_change_rate": r}}}
                         for i, r in enumerate(rates)}}
        for name, rates in RATES.items()}}


def test_each_arms_rate_is_its_mean_over_seeds_with_the_t_interval(tmp_path):
    results = _results()
    BlockSizes().conclude(Study(results, [], []))
    arms = {a["variant"]: a for a in results["block_sizes"]["arms"]}
    for name, rates in RATES.items():
        m, se = statistics.mean(rates), statistics.stdev(rates) / len(rates) ** 0.5
        half = st.t.ppf(0.975, len(rates) - 1) * se
        rate = arms[name]["rate"]
        assert rate["mean"] == pytest.approx(m)
        assert (rate["low"], rate["high"]) == (pytest.approx(max(0.0, m - half)), pytest.approx(m + half))
    assert arms["vanilla"]["block_size"] is None and arms["block4-sink1"]["sinks"] == 1
    assert results["block_sizes"]["seq_len"] == 128
    line = block_sizes_line(results)
    assert "block4 0.100 [" in line and "described, not tested" in line
    path = plot_block_sizes(results["block_sizes"], tmp_path / "block_sizes.png")
    assert path.is_file() and path.stat().st_size > 10_000


def test_a_study_without_block_models_has_no_such_section():
    results = _results()
    for v in results["variants"].values():
        v["switches"].pop("block_size", None)
    BlockSizes().conclude(Study(results, [], []))
    assert "block_sizes" not in results and block_sizes_line(results) is None


def test_only_the_validation_bound_of_different_block_sizes_is_not_compared():
    whole, b4, b16 = ({"switches": sw} for sw in ({}, {"block_size": 4}, {"block_size": 16}))
    assert not_compared(b4, whole) == "not compared: different bounds (blocks of 4 vs the whole sequence)"
    assert not_compared(b16, b4, "val_loss_change") == "not compared: different bounds (blocks of 16 vs blocks of 4)"
    assert not_compared(b4, {"switches": {"block_size": 4, "num_sink_tokens": 1}}) is None  # one block size
    assert not_compared(whole, {"switches": {"num_sink_tokens": 1}}) is None
    for metric in ("content_sink_set_change_rate", "log10_peak_grad_norm", "shakespeare_word_order/acc"):
        assert not_compared(b4, whole, metric) is None  # every other metric compares across block sizes


# Per seed (400-403): each arm's fixed val_loss and moving-sink rate, planted.
VAL = {"vanilla": [5.60, 5.20, 5.90, 5.40], "block4": [5.10, 5.05, 5.12, 5.02], "block4-sink1": [5.00, 5.01, 4.99, 4.95]}
RATE = {"vanilla": [0.36, 0.25, 0.52, 0.31], "block4": [0.18, 0.16, 0.20, 0.17], "block4-sink1": [0.11, 0.15, 0.12, 0.10]}
PAIRS = [("block4", "vanilla"), ("block4-sink1", "block4")]


def _study() -> dict:
    seeds = [400, 401, 402, 403]
    variants = {name: {"label": name, "switches": dict(SWITCHES[name]), "seeds": {
        str(s): {"val_loss": VAL[name][i], "analysis": {"moving": {"content_sink_set_change_rate": RATE[name][i]}},
                 # the fixed validation at two scored steps: a gap trajectory for each pair of one bound
                 "val_curve": [{"step": 1000, "val_loss": VAL[name][i] + 0.3}, {"step": 3000, "val_loss": VAL[name][i]}]}
        for i, s in enumerate(seeds)}} for name in VAL}
    return {"preset": "test", "description": "planted", "seeds": seeds, "variants": variants,
            "machine": {"cpu_count": 2, "cuda": False}, "train": {"max_steps": 3000, "batch_size": 8, "seq_len": 128},
            "validation": {"tokens": 32_768, "draws": 8, "noise_seed": 0, "estimator": "masked_count_stratified"}}


def _bh(ps: list[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values, from the formula: min over j >= i (in rank order) of m p_(j) / j."""
    m, order = len(ps), sorted(range(len(ps)), key=lambda i: ps[i])
    out = [0.0] * m
    for rank, i in enumerate(order, 1):
        out[i] = min(1.0, min(m * ps[j] / r for r, j in enumerate(order, 1) if r >= rank))
    return out


def test_val_loss_between_block_sizes_is_not_compared_and_leaves_the_family(tmp_path):
    results = _study()
    summarise(results, PAIRS)
    by = {(tuple(c["pair"]), c["metric"]): c for c in results["comparisons"]}
    across = by[("block4", "vanilla"), "val_loss"]
    # the row stays with its raw numbers, not tested: its own verdict, outside the family, no MDE, no adjusted p
    assert across["verdict"] == "not compared: different bounds (blocks of 4 vs the whole sequence)"
    assert across["in_family"] is False and across["different_bounds"] and across.get("p_adjusted") is None
    assert across["mean"] == pytest.approx(statistics.mean(a - b for a, b in zip(VAL["block4"], VAL["vanilla"])))
    assert across["mde"] is None and not across.get("survives")
    # the same block size on val_loss, and the sink metric across block sizes: tested as before, in the family
    family = [by[("block4-sink1", "block4"), "val_loss"], by[("block4", "vanilla"), "content_sink_set_change_rate"],
              by[("block4-sink1", "block4"), "content_sink_set_change_rate"]]
    raw = [st.ttest_rel(VAL["block4-sink1"], VAL["block4"]).pvalue, st.ttest_rel(RATE["block4"], RATE["vanilla"]).pvalue,
           st.ttest_rel(RATE["block4-sink1"], RATE["block4"]).pvalue]
    for c, p, q in zip(family, raw, _bh(raw)):
        assert c.get("in_family", True) and not c.get("different_bounds")
        assert c["p"] == pytest.approx(p) and c["p_adjusted"] == pytest.approx(q)
    mult = results["multiplicity"]
    assert mult["size"] == 3 and mult["left_out"]["different bounds"] == 1
    assert mult["left_out"]["alternative definitions"] == 0  # a comparison of different bounds is not counted there
    assert ("1 comparison of the validation bound between arms of different block sizes (not compared: different "
            "bounds, docs/method.md §15)") in multiplicity_note(results)
    # the tables say so; the paired figures, the sizing and the gap trajectories leave the pair out
    row = next(r for r in comparisons_table(results)[1] if r[:2] == ["block4 − vanilla", "`val_loss`"])
    assert row[4:6] == ["–", "–"] and row[-1] == across["verdict"]
    pivot = {r[0]: r[1] for r in pivot_comparisons(results, ["val_loss"])[1]}
    assert pivot["block4 − vanilla"] == "not compared (different bounds)" and pivot["block4-sink1 − block4"].startswith("-0.")
    assert [d["label"] for d in paired_val_loss_differences(results)] == ["block4-sink1 − block4"]
    assert [r["pair"] for r in results["sizing"]["pairs"]] == [["block4-sink1", "block4"]]
    assert [t["pair"] for t in results["trajectories"]] == [["block4-sink1", "block4"]]
    assert "a different bound for each block size" in validation_note(results)
    fig = plot_forest(results, tmp_path / "forest.png", "vanilla")
    assert fig is not None and fig.is_file()


def test_the_forest_and_the_primary_seed_table_of_a_pair_of_different_block_sizes(tmp_path):
    results = _study()
    summarise(results, PAIRS[:1])  # the pilot's one pair: nothing of one bound to draw
    assert plot_forest(results, tmp_path / "forest.png", "vanilla") is None and results["sizing"] is None
    results["primary"] = {"pair": ["block4", "vanilla"], "metric": "content_sink_set_change_rate", "test": "t"}
    header, rows = primary_seed_table(results)
    assert header[:3] == ["seed", "block4 val_loss", "vanilla val_loss"] and "difference" not in header
    assert rows[0][:3] == ["400", "5.100", "5.600"] and len(rows[0]) == len(header)
    results["variants"]["vanilla"]["switches"] = {"num_sink_tokens": 0, "block_size": 4}  # one block size: paired
    assert primary_seed_table(results)[0][3] == "difference"
