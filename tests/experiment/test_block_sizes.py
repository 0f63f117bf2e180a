"""The block-sizes endpoint (docs/method.md §15): each arm's moving-sink rate over seeds with its Student t interval,
against a direct computation, and its figure and sentence."""

from __future__ import annotations

import statistics

import pytest
from scipy import stats as st

from sinkdlm.experiment.endpoints.base import Study
from sinkdlm.experiment.endpoints.block_sizes import BlockSizes, block_sizes_line, plot_block_sizes

RATES = {"vanilla": [0.30, 0.25, 0.35], "block4": [0.10, 0.12, 0.08], "block4-sink1": [0.05, 0.07, 0.06]}
SWITCHES = {"vanilla": {"num_sink_tokens": 0}, "block4": {"num_sink_tokens": 0, "block_size": 4},
            "block4-sink1": {"num_sink_tokens": 1, "block_size": 4}}


def _results() -> dict:
    return {"train": {}, "variants": {  # the default sequence (128): results.json keeps non-defaults only
        name: {"label": name, "switches": SWITCHES[name],
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
