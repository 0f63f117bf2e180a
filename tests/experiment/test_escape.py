"""The escape endpoint (issue 54): the rule on hand-computed curves, the censored sign test against scipy on
hand-ordered signs, the sign test's MDE against its power computed by enumeration, the unigram plateau against a
direct count, and the trainer's probe hook (called every K steps, leaving training bitwise unchanged)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch
from scipy import stats

from sinkdlm.experiment.endpoints.escape.probe import censored_sign_test, escape_step, sign_test_mde, sink_onset, unigram_plateau
from sinkdlm.experiment.presets import Escape


def test_escape_is_the_first_probe_from_which_the_loss_stays_below():
    curve = [(100, 6.0), (200, 5.6), (300, 5.8), (400, 5.5), (500, 5.4)]
    assert escape_step(curve, 5.7) == {"step": 400, "censored": False, "last_probe": 500}  # 200 came back above
    assert escape_step(list(reversed(curve)), 5.7)["step"] == 400  # order of the input does not matter
    assert escape_step([(100, 5.0), (200, 4.0)], 5.7)["step"] == 100  # below from the first probe
    # equal to the threshold is not below it; a curve ending above is censored at its last probe
    assert escape_step([(100, 5.0), (200, 5.7)], 5.7) == {"step": 200, "censored": True, "last_probe": 200}
    assert escape_step([(100, 6.1), (200, 5.9)], 5.7) == {"step": 200, "censored": True, "last_probe": 200}
    with pytest.raises(ValueError):
        escape_step([], 5.7)


def test_sink_onset_is_when_the_largest_layer_mass_stays_at_or_above_the_mark():
    probes = {"100": [0.1, 0.2], "200": [0.1, 0.35], "300": [0.29, 0.1], "400": [0.3, 0.2], "500": [0.5, 0.6]}
    record = {"probes": {s: {"detected_sink_mass": m} for s, m in probes.items()}}
    assert sink_onset(record, 0.3) == {"step": 400, "censored": False, "last_probe": 500}  # 0.3 itself counts
    assert sink_onset(record, 0.7)["censored"]
    assert sink_onset(record, 0.3, first_layer=1) == {"step": 500, "censored": False, "last_probe": 500}


def test_exploratory_onset_is_when_the_largest_layer_mass_first_reaches_the_mark():
    """`sink_reach` (exploratory): the first probe where the mass reaches the mark, even if it falls back after;
    the declared `sink_onset` needs it to stay, so it is later (or censored) on the same record."""
    from sinkdlm.experiment.endpoints.escape.probe import sink_reach

    probes = {"100": [0.1, 0.2], "200": [0.1, 0.35], "300": [0.29, 0.1], "400": [0.3, 0.2], "500": [0.5, 0.6]}
    record = {"probes": {s: {"detected_sink_mass": m} for s, m in probes.items()}}
    assert sink_reach(record, 0.3) == {"step": 200, "censored": False, "last_probe": 500}
    assert sink_reach(record, 0.3, first_layer=1) == {"step": 200, "censored": False, "last_probe": 500}
    assert sink_onset(record, 0.3, first_layer=1)["step"] == 500  # it fell back at 300-400: the declared onset waits
    assert sink_reach(record, 0.7) == {"step": 500, "censored": True, "last_probe": 500}
    with pytest.raises(ValueError):
        sink_reach({"probes": {}}, 0.3)


def esc(step, censored=False):
    return {"step": step, "censored": censored, "last_probe": step if censored else 1000}


def test_censored_sign_test_orders_censored_pairs_conservatively():
    arm = {"0": esc(200), "1": esc(300), "2": esc(1000, True), "3": esc(1000, True), "4": esc(800),
           "5": esc(500, True), "6": esc(100), "7": esc(400)}
    base = {"0": esc(400), "1": esc(600), "2": esc(500), "3": esc(1000, True), "4": esc(1000, True),
            "5": esc(800), "6": esc(400), "7": esc(400), "9": esc(100)}
    # by hand: 0, 1, 6 lower (observed); 2: arm > 1000 > 500, higher; 3: both censored, a tie; 4: arm 800 < base
    # > 1000, lower; 5: arm > 500 against 800, undetermined; 7: equal, a tie; seed 9 has no pair
    r = censored_sign_test(arm, base)
    assert (r["plus"], r["minus"], r["ties"], r["undetermined"], r["seeds"]) == (1, 4, 2, 1, 8)
    # the undetermined pair counted against the hypothesis: the larger p of its two orderings
    expected = max(stats.binomtest(1, 6, 0.5).pvalue, stats.binomtest(2, 6, 0.5).pvalue)
    assert r["p"] == pytest.approx(expected)
    assert r["p"] == pytest.approx(stats.binomtest(2, 6, 0.5).pvalue)
    assert r["per_seed"]["0"] == pytest.approx(-1.0) and r["per_seed"]["2"] == pytest.approx(1.0)
    assert r["estimate"] == pytest.approx(sorted(math.log2(arm[s]["step"] / base[s]["step"]) for s in arm)[3:5][0] / 2
                                          + sorted(math.log2(arm[s]["step"] / base[s]["step"]) for s in arm)[3:5][1] / 2)
    assert not r["rejects"]


def test_censored_interval_takes_the_order_statistics_of_the_bounds():
    # 9 pairs: the 95 % sign interval is [d_(2), d_(8)] (P(B <= 1) = 10/512 <= 0.025 < P(B <= 2))
    steps = [(100, 400), (200, 400), (300, 600), (400, 400), (800, 400), (250, 1000), (900, 300), (600, 1200), (1000, 250)]
    arm = {str(i): esc(a, censored=(i == 8)) for i, (a, _) in enumerate(steps)}
    base = {str(i): esc(b, censored=(i == 5)) for i, (_, b) in enumerate(steps)}
    d = [math.log2(a / b) for a, b in steps]
    lows = sorted(-math.inf if i == 5 else x for i, x in enumerate(d))  # base censored: no lower bound
    highs = sorted(math.inf if i == 8 else x for i, x in enumerate(d))  # arm censored: no upper bound
    r = censored_sign_test(arm, base)
    assert stats.binom.cdf(1, 9, 0.5) <= 0.025 < stats.binom.cdf(2, 9, 0.5)
    assert r["low"] == pytest.approx(lows[1]) and r["high"] == pytest.approx(highs[7])
    # the same pairs uncensored: the plain order-statistic interval, which the censored one contains
    plain = censored_sign_test({k: esc(v["step"]) for k, v in arm.items()}, {k: esc(v["step"]) for k, v in base.items()})
    assert plain["low"] == pytest.approx(sorted(d)[1]) and plain["high"] == pytest.approx(sorted(d)[7])
    assert r["low"] <= plain["low"] and r["high"] >= plain["high"]


def test_sign_test_mde_reaches_the_power_by_enumeration():
    def power(delta, sd, n, alpha=0.05):  # P(two-sided exact p < alpha), both tails, by enumerating k
        q = stats.norm.cdf(delta / sd)
        return sum(stats.binom.pmf(k, n, q) for k in range(n + 1) if stats.binomtest(k, n, 0.5).pvalue < alpha)

    for n in (6, 10, 16):
        m = sign_test_mde(1.3, n)
        assert power(m, 1.3, n) >= 0.8 - 1e-6
        assert power(m * 0.97, 1.3, n) < 0.8
    assert sign_test_mde(1.3, 5) is None  # 5 pairs: the smallest two-sided p is 1/16


def test_unigram_plateau_against_a_direct_count():
    train = torch.tensor([[1, 2, 2, 3], [3, 3, 3, 1]])
    probe = torch.tensor([[2, 3, 5]])  # 5 never occurs in training: half a count
    counts = Counter(train.flatten().tolist())
    total = sum(counts.values())
    entropy = -sum(c / total * math.log(c / total) for c in counts.values())
    cross = -(math.log(2 / total) + math.log(4 / total) + math.log(0.5 / total)) / 3
    r = unigram_plateau(train, probe)
    assert r["train_entropy"] == pytest.approx(entropy) and r["probe_cross_entropy"] == pytest.approx(cross)
    assert (r["train_tokens"], r["probe_tokens"]) == (8, 3)


def test_escape_declaration_is_checked():
    with pytest.raises(ValueError):
        Escape(pair=("a", "b"), draws=3)


def test_probe_hook_runs_every_k_steps_and_leaves_training_unchanged(tmp_path):
    from sinkdlm.config import TrainConfig
    from sinkdlm.experiment.presets import MICRO
    from sinkdlm.training import train
    from sinkdlm.training.rundir import read_metrics

    def cfg(out):
        return TrainConfig(preset="tiny", model_overrides=MICRO, data="shakespeare", max_steps=4, batch_size=4,
                           seq_len=32, max_tokens=20_000, eval_every=4, save_every=4, log_every=1, eval_batches=1,
                           lr=1e-3, num_sink_tokens=1, out=str(out))

    seen = []

    def probe(model, step):  # a probe that runs the model in eval mode, as the escape probe does
        model.eval()
        with torch.no_grad():
            model(torch.zeros(2, 8, dtype=torch.long))
        model.train()
        seen.append(step)

    train(cfg(tmp_path / "a"), probe=(2, probe))
    train(cfg(tmp_path / "b"))
    assert seen == [2, 4]
    a, b = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert [r["loss"] for r in a] == [r["loss"] for r in b] and [r.get("val_loss") for r in a] == [r.get("val_loss") for r in b]


# ----------------------------------------------------------------------------- the study-wide summary and report
def test_kaplan_meier_matches_a_hand_computed_estimate():
    from sinkdlm.experiment.endpoints.escape.summary import kaplan_meier

    # escapes at 100, 300, 300, 500; censored (still on the plateau) at 200 and 400. By hand, S(t) = prod (1 - d/n):
    # 100: 6 at risk, 1 escape -> 5/6; 200: censored; 300: 4 at risk, 2 escapes -> 5/6 * 2/4; 400: censored;
    # 500: 1 at risk, 1 escape -> 0
    recs = [esc(100), esc(200, True), esc(300), esc(300), esc(400, True), esc(500)]
    km = kaplan_meier(recs)
    assert km["steps"] == [100, 200, 300, 400, 500]
    assert km["survival"] == pytest.approx([5 / 6, 5 / 6, 5 / 12, 5 / 12, 0.0])
    assert km["censored"] == [200, 400] and (km["n"], km["escaped"], km["median"]) == (6, 4, 300)
    # Greenwood's variance, log-log band, by hand at 100: var(log S) = d / (n (n - d)) = 1 / 30
    s, v = 5 / 6, 1 / 30
    half = stats.norm.ppf(0.975) * math.sqrt(v) / abs(math.log(s))
    assert km["low"][0] == pytest.approx(s ** math.exp(half)) and km["high"][0] == pytest.approx(s ** math.exp(-half))
    assert km["low"][-1] is None  # undefined at S = 0: stored as None
    never = kaplan_meier([esc(6000, True), esc(6000, True)])
    assert never["survival"] == [1.0] and never["median"] is None


def test_kaplan_meier_median_is_exact_where_the_float_estimate_rounds_above_one_half():
    """The escape study's vanilla arm: 17 escapes, 3 runs censored at 6,000, after every escape. With no censoring
    before it the estimate is exactly the share still on the plateau, (#escaped later) / 20, so the median is the
    10th smallest escape step, 2,300; the float product stores S(2,300) = 0.5000000000000001 and read 2,400."""
    from sinkdlm.experiment.endpoints.escape.summary import kaplan_meier

    steps = [1300, 1300, 1500, 1700, 1800, 1900, 2100, 2200, 2300, 2300, 2400, 2500, 2600, 2900, 3000, 3900, 4800]
    km = kaplan_meier([esc(s) for s in steps] + [esc(6000, True)] * 3)
    assert km["median"] == sorted(steps)[9] == 2300
    assert km["survival"][km["steps"].index(2300)] == pytest.approx(0.5)  # the float one, a rounding away


def test_the_lag_counts_every_run_by_its_known_sign_and_names_the_selection():
    """A censored onset after an observed escape is a negative lag, a censored escape after an observed onset a
    positive one, both censored unknown; the sign test is the exact binomial over the nonzero signs; the runs with
    both observed escaped later than those left out (Mann-Whitney), so their mean is a selection."""
    from sinkdlm.experiment.endpoints.escape.report import escape_lag_table
    from sinkdlm.experiment.endpoints.escape.summary import escape_summary

    res = _escape_study(list(range(100, 112)), list(range(100, 112)))
    runs = res["variants"]["vanilla"]["seeds"]
    # seeds 100-105: onset 300 before a late escape (2,000-2,500); 106-110: escape early (500-900), onset censored;
    # 111: both censored
    for i, rec in enumerate(runs.values()):
        e = 2000 + 100 * i if i < 6 else 500 + 100 * (i - 6)
        rec["escape"] = (_record(e, False, e - 300, False) if i < 6 else _record(e, False, 6000, True) if i < 11
                         else _record(6000, True, 6000, True))
    lag = escape_summary(res)["onset_lag"]["vanilla"]
    assert lag["signs"] == {"positive": 6, "negative": 5, "zero": 0, "unknown": 1,
                            "p": pytest.approx(stats.binomtest(6, 11).pvalue)}
    sel = lag["selection"]
    chosen, left = [2000 + 100 * i for i in range(6)], [500 + 100 * i for i in range(5)]
    assert (sel["escape_median_observed_onset"], sel["escape_median_censored_onset"]) == (np.median(chosen), np.median(left))
    assert sel["p"] == pytest.approx(stats.mannwhitneyu(chosen, left).pvalue)
    # onset at or before the escape: 6 of the 11 runs that escaped, not 6 of the 6 with both observed
    row = next(r for r in escape_lag_table({**res, "escape": escape_summary(res)})[1] if r[0] == "VANILLA")
    assert row[-1] == "6 of 11" and "lag > 0 on 6, < 0 on 5, unknown 1 of 12 runs" in row[-3]


def test_a_test_that_detects_nothing_is_inconclusive_only_where_its_mde_exceeds_the_sized_effect():
    """The declared escape test sized for 1.13 log2: with an MDE below it, "no difference" bounded by the interval;
    with none declared (sized_for None), "inconclusive" as before."""
    from sinkdlm.experiment.endpoints.escape.report import escape_tests_table
    from sinkdlm.experiment.endpoints.escape.summary import escape_summary

    res = _escape_study(list(range(100, 112)), list(range(100, 112)))
    sized = escape_summary(res)["tests"][1]  # gated: +/- 100 steps alternate, no difference
    assert res["declared"]["escape"]["sized_for"] == 1.13 and sized["mde"] < 1.13 and not sized["inconclusive"]
    assert sized["bound"] == pytest.approx(max(abs(sized["low"]), abs(sized["high"])))
    words = escape_tests_table({**res, "escape": escape_summary(res)})[1][1][-1]
    assert words.startswith(f"no difference; the interval bounds the log2 ratio within ±{sized['bound']:.2f}")
    res["declared"]["escape"]["sized_for"] = None
    assert escape_summary(res)["tests"][1]["inconclusive"]


def _record(e, e_cens, o, o_cens):
    return {"escape": {"step": e, "censored": e_cens, "last_probe": 6000},
            "onset": {"step": o, "censored": o_cens, "last_probe": 6000},
            "plateau": {"probe_cross_entropy": 6.35}, "threshold": 5.95, "curve": [[100, 6.4], [6000, 5.0]],
            "lag": None if e_cens or o_cens else e - o, "grad_norm_peak": {"step": 50, "value": 3.0}}


def _escape_study(seeds: list[int], declared: list[int]) -> dict:
    """Vanilla escapes at 1,000-2,900; + 1 sink at about half that (one censored baseline); gated like vanilla."""
    from sinkdlm.experiment.presets import get_preset

    rng = np.random.default_rng(3)
    variants = {n: {"label": n.upper(), "switches": {}, "seeds": {}} for n in ("vanilla", "sink1-front", "gated")}
    for i, s in enumerate(seeds):
        base = 1000 + 100 * i
        onset = base - 300
        v = _record(6000, True, onset, False) if i == 0 else _record(base, False, onset, False)
        variants["vanilla"]["seeds"][str(s)] = {"val_loss": 5.0 + rng.normal(0, 0.01), "escape": v}
        variants["sink1-front"]["seeds"][str(s)] = {"val_loss": 5.0 + rng.normal(0, 0.01),
                                                    "escape": _record(base // 2, False, base // 2 - 100, False)}
        g = base + (100 if i % 2 else -100)
        variants["gated"]["seeds"][str(s)] = {"val_loss": 5.0 + rng.normal(0, 0.01),
                                              "escape": _record(g, False, g - 300, i == 1)}
    preset = get_preset("escape")
    return {"preset": "escape", "description": "hand-built", "seeds": seeds, "variants": variants,
            "machine": {"cpu_count": 2, "cuda": False, "processor": "x", "torch": "t"},
            "train": {"max_steps": 6000, "batch_size": 8, "seq_len": 128}, "declared": preset.declared(),
            "escape": {"seeds_declared": declared}}


def test_escape_summary_decides_only_with_every_declared_seed_and_adjusts_the_secondary():
    from sinkdlm.experiment.endpoints.escape.summary import escape_summary

    full = escape_summary(_escape_study(list(range(100, 112)), list(range(100, 112))))
    primary, secondary = full["tests"]
    assert primary["pair"] == ["sink1-front", "vanilla"] and primary["primary"] and full["complete"]
    # + 1 sink escapes at half the step on every seed (one baseline censored: still ordered): 12 of 12 earlier
    assert (primary["plus"], primary["minus"]) == (0, 12) and primary["decided"] and primary["estimate"] == pytest.approx(-1.0)
    assert primary["p"] == pytest.approx(stats.binomtest(0, 12, 0.5).pvalue) and primary["family"] == 1
    assert primary["ratio"]["estimate"] == pytest.approx(0.5)
    # the interval's exact coverage: 12 pairs, k = 3 (P(B <= 2) = 79/4096 <= 0.025 < P(B <= 3))
    assert primary["exact_confidence"] == pytest.approx(1 - 2 * stats.binom.cdf(2, 12, 0.5))
    # gated: one secondary, so Bonferroni over 1 leaves p as it is; +/- 100 steps alternate: no difference
    assert secondary["family"] == 1 and secondary["p_adjusted"] == pytest.approx(secondary["p"])
    assert not secondary["decided"]
    # the lag: escape - onset per run with both observed (vanilla's censored seed drops), t interval over seeds
    lag = full["onset_lag"]["vanilla"]
    assert lag["per_seed"] == [300] * 11 and lag["escape_censored"] == 1 and lag["onset_first"] == 11
    gated = full["onset_lag"]["gated"]
    assert gated["onset_censored"] == 1 and len(gated["per_seed"]) == 11
    d = next(x for x in full["lag_differences"] if x["pair"] == ["sink1-front", "vanilla"])
    assert d["per_seed"] == [100 - 300] * 11 and d["mean"] == pytest.approx(-200)
    # interim: 5 of the 12 declared seeds, no verdict however strong the pairs
    interim = escape_summary(_escape_study(list(range(100, 105)), list(range(100, 112))))
    assert not interim["complete"] and interim["seeds_in"] == list(range(100, 105))
    assert not any(t["decided"] for t in interim["tests"]) and not any("decided" in x for x in full["lag_differences"])


def test_exploratory_lag_from_the_first_reach_beside_the_declared_one(tmp_path):
    """Records that carry `onset_reached` (the mass first reaching the mark) get the exploratory lag per arm, with
    the declared lag unchanged; arms whose records lack it have none; the report prints it labelled exploratory."""
    from sinkdlm.experiment.endpoints.escape.summary import escape_summary
    from sinkdlm.experiment.report import write_report
    from sinkdlm.experiment.summary import summarise

    res = _escape_study(list(range(100, 112)), list(range(100, 112)))
    declared = escape_summary(res)["onset_lag"]
    for i, rec in enumerate(res["variants"]["vanilla"]["seeds"].values()):
        e = rec["escape"]
        # reached 500 steps before the escape on every run; seed 101's never reached (censored at its last probe)
        e["onset_reached"] = {"step": 6000, "censored": True, "last_probe": 6000} if i == 1 else \
            {"step": e["escape"]["step"] - 500 if not e["escape"]["censored"] else 400, "censored": False,
             "last_probe": 6000}
    full = escape_summary(res)
    assert full["onset_lag"] == declared  # the declared lag does not move
    reached = full["onset_lag_exploratory"]
    assert list(reached) == ["vanilla"]  # the other arms' records have no first-reach onset
    # seed 100 never escaped (no lag), seed 101 never reached (no lag): 10 runs, each escape - reach = 500
    assert reached["vanilla"]["per_seed"] == [500] * 10 and reached["vanilla"]["onset_censored"] == 1
    assert reached["vanilla"]["onset_first"] == 10 and reached["vanilla"]["escape_censored"] == 1
    summarise(res, [("sink1-front", "vanilla"), ("gated", "vanilla")])
    res["escape"], res["timing"] = full, {}
    write_report(res, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "*Exploratory, not declared:*" in text and "| VANILLA | 12 | 11 of 12 | 11 of 12 |" in text


def test_the_plain_words_answer_gives_every_declared_test_and_no_lag_verdict():
    """`escape_answer_line` (the results page's sentence): Kaplan-Meier medians and every declared test with its
    counts always; the lag by its known signs, described, never a verdict (no lag test was declared); an
    exploratory onset before the arm's first escape said to make its lag positive by construction; nothing
    directional in an interim."""
    from sinkdlm.experiment.endpoints.escape.report import escape_answer_line
    from sinkdlm.experiment.endpoints.escape.summary import escape_summary

    def study(seeds, declared):
        res = _escape_study(seeds, declared)
        for i, rec in enumerate(res["variants"]["gated"]["seeds"].values()):  # reached 1,000-1,400 steps before
            e = rec["escape"]
            e["onset_reached"] = {"step": max(100, e["escape"]["step"] - 1000 - 100 * (i % 5)), "censored": False,
                                  "last_probe": 6000}
        res["escape"] = escape_summary(res)
        return res

    full = escape_answer_line(study(list(range(100, 112)), list(range(100, 112))))
    assert full.startswith("**When does the DLM leave the unigram plateau, and do its sinks form first?** (12 seeds)")
    # Kaplan-Meier medians: vanilla escapes at 1,100-2,100 (seed 100 censored at 6,000): the 6th of 12 at 1,600;
    # + 1 sink at half the step, 500-1,050: the 6th at 750
    assert "VANILLA 1,600 (1 of 12 runs censored)" in full and "SINK1-FRONT 750 (0 of 12 runs censored)" in full
    assert "ratio of escape steps 0.50×" in full and "leaves the plateau earlier" in full
    assert "later on 0, earlier on 12 of 12 seeds" in full and "The declared secondary, Bonferroni-adjusted, GATED" in full
    # the declared lags: vanilla's censored escape after its onset is a positive lag too: 12 of 12
    assert f"VANILLA lag > 0 on 12, < 0 on 0 of 12 runs (exact sign test p = {stats.binomtest(12, 12).pvalue:.2g})" in full
    assert "the sinks form first" not in full and "no lag detected" not in full
    # the exploratory onset (100-1,400 steps before the escape) at a median before gated's first escape (900)
    assert "Exploratory (not declared)" in full and "GATED at median step" in full
    assert "before the arm's first escape (step 900): a positive lag almost by construction" in full
    interim = escape_answer_line(study(list(range(100, 105)), list(range(100, 112))))
    assert "(5 seeds; interim: 5 of 12 seeds, no verdict)" in interim
    assert "earlier" not in interim.replace("earlier on", "")


def test_the_report_renders_the_escape_endpoint_and_regenerates_from_results_alone(tmp_path):
    import json

    from sinkdlm.experiment.endpoints.escape.report import draw_escape_runs
    from sinkdlm.experiment.endpoints.escape.summary import escape_summary
    from sinkdlm.experiment.report import regenerate, summary_part, write_report
    from sinkdlm.experiment.summary import summarise

    res = _escape_study(list(range(100, 105)), list(range(100, 120)))
    summarise(res, [("sink1-front", "vanilla"), ("gated", "vanilla")])
    res["escape"] = escape_summary(res)
    res["timing"] = {}
    # one run's probes and metrics on disk: its figure is drawn, the others are named as not drawn
    run = tmp_path / "runs" / "sink1-front-s100"
    (run / "escape").mkdir(parents=True)
    (run / "train").mkdir()
    probes = {str(s): {"loss": 6.4 - 0.001 * s, "sink_token_mass": [0.1, 0.2, 0.3, 0.4],
                       "detected_sink_mass": [0.3, 0.1 + s / 2000, 0.2, 0.2]} for s in range(100, 1100, 100)}
    (run / "escape" / "probes.json").write_text(json.dumps({"probes": probes}))
    (run / "train" / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 6.0, "grad_norm_max": 1 + s / 100}) + "\n"
                                                         for s in range(50, 1050, 50)))
    write_report(res, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "## Escape from the unigram plateau" in text and "interim: 5 of 20 seeds" in text
    assert "**earlier**" not in text and "no verdict (interim: 5 of 20 seeds)" in text
    assert (tmp_path / "figures" / "escape_km.png").is_file()
    # the per-run figures are drawn on demand (`make reports`), not by the report, which links none of them
    assert not (tmp_path / "figures" / "escape_runs").exists() and "](figures/escape_runs" not in text
    (tmp_path / "results.json").write_text(json.dumps(res))
    drawn, missing = draw_escape_runs(tmp_path)
    assert drawn == [tmp_path / "figures" / "escape_runs" / "sink1-front-s100.png"] and missing == 14
    assert summary_part(res, "escape").startswith("**Escape from the unigram plateau** (interim: 5 of 20 seeds)")
    # regenerate: from results.json alone (the run directories gone), the same escape summary and section
    import shutil

    shutil.rmtree(tmp_path / "runs")
    (tmp_path / "report.md").unlink()
    (tmp_path / "results.json").write_text(json.dumps(res))
    again = regenerate(tmp_path)
    assert again["escape"]["tests"] == json.loads(json.dumps(res["escape"]["tests"]))
    assert "## Escape from the unigram plateau" in (tmp_path / "report.md").read_text()
