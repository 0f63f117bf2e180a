"""Intervals over prompts (`sinkdlm.analysis.over_prompts`): the summary is the per-prompt numbers'
mean with the Student-t interval written out here, paired where it compares, on planted records."""

from __future__ import annotations

import math

import pytest
from scipy import stats as st

from sinkdlm.analysis.over_prompts import analyze_over_prompts, summarise_prompts
from sinkdlm.config import AnalyzeConfig, SampleConfig


def record(mass0, vs, vn, delta):
    return {"non_sink_fraction": 0.9, "non_sink_fraction_by_epsilon": {"3": 0.9},
            "sink_mass_per_layer": [mass0, 0.5], "sinks_per_head": [1.0, 2.0],
            "value_norm_sink": [vs, None], "value_norm_normal": [vn, None],
            "token_type_shares": {"other": 1.0}, "moving": {"sink_set_change_rate": 0.1},
            "ablation_score": {"0": -3.0, "1": -3.0 + delta}, "ablation_masked_keys_per_head": {"0": 0.0, "1": 1.0}}


def t_interval(xs):
    n = len(xs)
    m = sum(xs) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    h = st.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return m, m - h, m + h


def test_summary_is_a_t_interval_over_prompts_paired_within_prompt():
    recs = [record(0.2, 1.0, 3.0, -0.5), record(0.4, 2.0, 3.5, -0.7), record(0.3, 1.5, 2.5, -0.2)]
    s = summarise_prompts(recs)
    m, lo, hi = t_interval([0.2, 0.4, 0.3])
    assert s["sink_mass_per_layer"][0]["mean"] == pytest.approx(m)
    assert s["sink_mass_per_layer"][0]["low"] == pytest.approx(max(lo, 0.0))
    assert s["sink_mass_per_layer"][0]["high"] == pytest.approx(hi)
    d = s["value_norm_per_layer"][0]["difference"]
    m, lo, hi = t_interval([1.0 - 3.0, 2.0 - 3.5, 1.5 - 2.5])  # paired: per-prompt differences
    assert (d["mean"], d["low"], d["high"]) == pytest.approx((m, lo, hi))
    assert s["value_norm_per_layer"][1]["difference"] is None  # a layer without sinks is not tested
    assert s["value_norm_verdict"]["layers_tested"] == 1
    assert s["ablation"]["1"]["delta"]["mean"] == pytest.approx(-0.466666, rel=1e-4)
    assert s["moving"]["sink_set_change_rate"]["degenerate"]  # every prompt 0.1: no variance estimate


def test_shares_stay_in_bounds_near_zero():
    recs = [record(m, 1.0, 2.0, 0.0) for m in (0.0, 0.001, 0.0, 0.002)]
    iv = summarise_prompts(recs)["sink_mass_per_layer"][0]
    assert 0.0 <= iv["low"] <= iv["mean"] <= iv["high"] <= 1.0


def test_needs_two_prompts(tmp_path):
    with pytest.raises(ValueError, match="at least 2 prompts"):
        analyze_over_prompts(None, None, ["one"], AnalyzeConfig(sample=SampleConfig(gen_length=4), out=tmp_path))


def test_the_top_layer_is_tested_against_the_runner_up_before_the_headline_calls_it_the_most():
    """issue 30: "layer 23 (the most)" needs an interval. Layer 0 is the largest mean; the headline calls it
    the most only when its paired difference to the runner-up (t over prompts, written out here) excludes 0."""
    from sinkdlm.analysis.over_prompts_report import markdown_headline

    close = [record(m, 1.0, 2.0, 0.0) for m in (0.52, 0.47, 0.56, 0.51)]  # layer 1 is 0.5 in every prompt
    far = [record(m, 1.0, 2.0, 0.0) for m in (0.80, 0.85, 0.78, 0.83)]
    for recs, established in ((close, False), (far, True)):
        s = summarise_prompts(recs)
        top = s["sink_mass_argmax"]
        m, lo, hi = t_interval([r["sink_mass_per_layer"][0] - 0.5 for r in recs])
        assert (top["layer"], top["runner_up"]) == (0, 1)
        assert (top["difference"]["mean"], top["difference"]["low"], top["difference"]["high"]) == pytest.approx((m, lo, hi))
        assert top["established"] is established and established == bool(lo > 0)
        result = {"summary": s, "setup": {"num_prompts": len(recs)}, "model": {"label": "m", "causal": True}}
        text = markdown_headline(result)
        assert ("layer 0, the most (" in text) is established
        assert ("not established as the most" in text) is (not established)
        assert f"[{100 * lo:+.1f}, {100 * hi:+.1f}] points" in text
