"""The declared endpoints on hand-built results: the primary comparison with its rank test, the step-0 gap and
the training effect (each against a direct computation), the gap's trajectory and slope, TOST equivalence
inside the multiplicity family, and the plateau criterion; and the interface every endpoint implements
(`experiment/endpoints/base.py`), called by the summary and the report in their order."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from sinkdlm.experiment.summary import summarise
from sinkdlm.stats import rank_test

SEEDS = [str(s) for s in range(6)]
STEPS = (0, 300, 600)


def _variant(label, start, end, mid=None, *, start_per_seed=True):
    seeds = {}
    for i, s in enumerate(SEEDS):
        v0 = start[i] if start_per_seed else start[0]
        vm = (v0 + end[i]) / 2 if mid is None else mid[i]
        seeds[s] = {"val_loss": end[i], "val_loss_se": 0.01, "step0": {"val_loss": v0, "val_loss_se": 0.01},
                    "val_loss_change": end[i] - v0,
                    "val_curve": [{"step": st, "val_loss": v, "val_loss_se": 0.01} for st, v in zip(STEPS, (v0, vm, end[i]))]}
    return {"label": label, "switches": {}, "seeds": seeds,
            "step0": {"val_loss": start[0], "val_loss_se": 0.01, "per_seed": start_per_seed}}


def _results(variants, declared):
    return {"preset": "t", "description": "hand-built", "seeds": list(range(6)), "variants": variants,
            "machine": {"cpu_count": 2}, "train": {"max_steps": 600, "batch_size": 4, "seq_len": 128},
            "declared": declared}


def test_primary_separates_the_head_start_from_the_training_effect():
    rng = np.random.default_rng(1)
    van0 = [8.39] * 6  # a deterministic conversion: one shared control
    sink0 = list(8.02 + rng.normal(0, 0.01, 6))  # each seed its own sink draw
    van = list(5.45 + rng.normal(0, 0.05, 6))
    sink = list(np.array(van) - 0.15 + rng.normal(0, 0.02, 6))
    res = _results({"sink": _variant("S", sink0, sink), "vanilla": _variant("V", van0, van, start_per_seed=False)},
                   {"primary": {"pair": ["sink", "vanilla"], "metric": "val_loss", "test": "wilcoxon"}})
    summarise(res, [("sink", "vanilla")])
    p = res["primary"]
    d = np.array(sink) - np.array(van)
    assert p["t"]["mean"] == pytest.approx(d.mean())
    assert p["rank"] == rank_test(d, "wilcoxon")
    assert p["rank"]["p"] == pytest.approx(sps.wilcoxon(d, method="exact").pvalue)
    d0 = np.array(sink0) - np.array(van0)
    assert p["step0_gap"]["mean"] == pytest.approx(d0.mean()) and p["step0_gap"]["per_seed_controls"]
    dt = (np.array(sink) - np.array(sink0)) - (np.array(van) - np.array(van0))  # Δ_train, paired per seed
    assert p["training_effect"]["mean"] == pytest.approx(dt.mean())
    half = sps.t.ppf(0.975, 5) * dt.std(ddof=1) / np.sqrt(6)
    assert (p["training_effect"]["low"], p["training_effect"]["high"]) == (pytest.approx(dt.mean() - half), pytest.approx(dt.mean() + half))
    assert p["training_effect"]["mean"] > 0  # the lead shrank: 0.37 at step 0, 0.15 at the end
    # the change is compared like val_loss, and so reaches the comparisons
    change = next(c for c in res["comparisons"] if c["metric"] == "val_loss_change")
    # no "better"/"worse": the sink model started ahead, so its smaller drop says nothing of its training alone
    assert change["lower_is_better"] is None and "worse" not in change["verdict"] and "better" not in change["verdict"]
    traj = p["trajectory"]
    assert [pt["step"] for pt in traj["points"]] == list(STEPS)
    assert traj["points"][0]["mean"] == pytest.approx(d0.mean()) and traj["points"][-1]["mean"] == pytest.approx(d.mean())
    assert traj["points"][-1]["per_seed"] == {s: pytest.approx(d[i]) for i, s in enumerate(SEEDS)}  # each seed's own gap
    # two scored steps after step 0: no trend per 10x tokens (a line through two points), the changes instead
    assert traj["slope_per_decade"] is None and traj["scored_steps"] == 2
    mid = (np.array(d0) + d) / 2  # _variant puts the middle step halfway
    steps = [(c["from_step"], c["to_step"]) for c in traj["step_changes"]]
    assert steps == [(0, 300), (300, 600)] and (traj["scored_change"]["from_step"], traj["scored_change"]["to_step"]) == (300, 600)
    assert traj["step_changes"][0]["mean"] == pytest.approx(np.mean(mid - d0))
    ch = d - mid
    half = sps.t.ppf(0.975, 5) * ch.std(ddof=1) / np.sqrt(6)
    assert (traj["scored_change"]["mean"], traj["scored_change"]["low"]) == (pytest.approx(ch.mean()), pytest.approx(ch.mean() - half))
    assert traj["points"][-1]["tokens"] == 600 * 4 * 128


def test_a_primary_declared_as_t_is_decided_by_the_t_test_with_the_wilcoxon_beside_it():
    """4 seeds: no exact test can reject at 5 % (smallest two-sided p 1/8), so a study that small declares `t`."""
    from sinkdlm.experiment.presets import Primary
    from sinkdlm.experiment.endpoints.primary import primary_lines

    van = [5.40, 5.52, 5.47, 5.44]
    sink = [v - 0.20 + e for v, e in zip(van, [0.01, -0.012, 0.004, -0.003])]
    pad = [0.0] * (len(SEEDS) - 4)  # _variant builds every seed of SEEDS; the study keeps the first 4
    variants = {"sink": _variant("S", [8.0] * len(SEEDS), sink + pad),
                "vanilla": _variant("V", [8.4], van + pad, start_per_seed=False)}
    for rec in variants.values():
        rec["seeds"] = {k: r for k, r in rec["seeds"].items() if int(k) < 4}
    res = _results(variants, {"primary": {"pair": ["sink", "vanilla"], "metric": "val_loss", "test": "t"}})
    summarise(res, [("sink", "vanilla")])
    p = res["primary"]
    d = np.array(sink) - np.array(van)
    assert p["t"]["p"] == pytest.approx(sps.ttest_1samp(d, 0).pvalue)
    assert p["rank"] == rank_test(d, "wilcoxon") and p["rank"]["p"] == pytest.approx(0.125)
    assert p["rejects"] and p["t_rejects"] and not p["rank_rejects"] and not p["agree"]
    text = "\n".join(primary_lines(res))
    assert "paired t test over 4 seeds: the declared test says **lower** with S than with V" in text
    assert "beside it the exact Wilcoxon signed-rank test" in text and "a rank test cannot reject with this few seeds" in text
    with pytest.raises(ValueError, match="Primary.test"):
        Primary(("a", "b"), test="welch")


@pytest.mark.parametrize("test", ["t", "wilcoxon"])
def test_a_primary_over_one_seed_is_reported_without_a_test(test):
    """A study's first finished pair (or a one-seed shard) has no interval: the report says so, it does not crash."""
    from sinkdlm.experiment.endpoints.primary import primary_lines

    pad = [0.0] * (len(SEEDS) - 1)
    variants = {"sink": _variant("S", [8.0] * len(SEEDS), [5.3] + pad), "vanilla": _variant("V", [8.4], [5.4] + pad, start_per_seed=False)}
    for rec in variants.values():
        rec["seeds"] = {k: r for k, r in rec["seeds"].items() if k == "0"}
    res = _results(variants, {"primary": {"pair": ["sink", "vanilla"], "metric": "val_loss", "test": test}})
    summarise(res, [("sink", "vanilla")])
    text = "\n".join(primary_lines(res))
    assert "over 1 seed: no difference detected" in text and "one seed: no test" in text
    assert "agree" not in text  # no test ran, so nothing agreed


def test_tost_equivalence_is_in_the_family_and_never_printed_without_a_margin():
    rng = np.random.default_rng(2)
    base = list(5.6 + rng.normal(0, 0.1, 6))
    same = list(np.array(base) + rng.normal(0, 0.005, 6))  # within ±0.05 for sure
    far = list(np.array(base) + 0.3 + rng.normal(0, 0.005, 6))
    variants = {"a": _variant("A", base, base), "b": _variant("B", same, same), "c": _variant("C", far, far)}
    pairs = [("b", "a"), ("c", "a")]
    res = _results(variants, {"equivalence": {"margin": 0.05, "pairs": [["b", "a"], ["c", "a"]]}})
    summarise(res, pairs)
    eq = {tuple(c["pair"]): c["equivalence"] for c in res["comparisons"] if "equivalence" in c}
    assert eq[("b", "a")]["verdict"] == "equivalent within ±0.05"
    assert eq[("c", "a")]["verdict"] == "different"
    assert res["multiplicity"]["equivalence_tests"] == 2
    assert all("p_adjusted" in e for e in eq.values())
    res2 = _results(variants, {})
    summarise(res2, pairs)
    assert not any("equivalence" in c for c in res2["comparisons"])


def test_plateau_is_measured_over_the_last_fifth():
    variants = {"a": _variant("A", [6.0] * 6, [5.0] * 6, mid=[5.01] * 6)}
    for rec in variants["a"]["seeds"].values():  # points at 4/5 and 5/5 of training
        rec["val_curve"] = [{"step": 400, "val_loss": 5.01, "val_loss_se": 0.01}, {"step": 500, "val_loss": 5.0, "val_loss_se": 0.01}]
    res = _results(variants, {"plateau_nats": 0.02})
    summarise(res, [])
    assert res["plateau"]["all_plateaued"] and res["plateau"]["max_drop"] == pytest.approx(0.01)


def test_the_report_states_the_three_numbers_and_the_equivalence_verdicts():
    from sinkdlm.experiment.report import markdown_summary

    rng = np.random.default_rng(4)
    van = list(5.45 + rng.normal(0, 0.05, 6))
    sink = list(np.array(van) - 0.15 + rng.normal(0, 0.02, 6))
    res = _results({"sink": _variant("S", list(8.02 + rng.normal(0, 0.01, 6)), sink),
                    "vanilla": _variant("V", [8.39] * 6, van, start_per_seed=False)},
                   {"primary": {"pair": ["sink", "vanilla"], "metric": "val_loss", "test": "wilcoxon"},
                    "equivalence": {"margin": 0.05, "pairs": [["sink", "vanilla"]]}})
    summarise(res, [("sink", "vanilla")])
    text = markdown_summary(res)
    assert "**Primary endpoint**" in text and "**lower** with S than with V after 307,200 training tokens" in text
    assert "Before training (step 0, each seed's own conversion) the gap was -0.36" in text
    assert "The paired t test and the exact Wilcoxon signed-rank test agree: both reject at 5 %." in text
    # three scored steps: the change between them, named as such, and no direction from its raw interval
    assert "training changed it by +0.2" in text and "shrinks" not in text and "300 → 600: " in text
    assert "| S − V |" in text and "| different |" in text
    assert "includes the 1 declared equivalence tests" in text
    from sinkdlm.experiment.report import summary_part

    eq = summary_part(res, "equivalence")
    assert eq.startswith("**Equivalence** (declared margin ±0.05 nats, `val_loss`): S − V: different (TOST adjusted p = ")
    from sinkdlm.experiment.endpoints.primary import primary_seed_table

    header, rows = primary_seed_table(res)
    assert header[:4] == ["seed", "S val_loss", "V val_loss", "difference"] and "Δ_train" in header and len(rows) == 6
    rec_s, rec_v = res["variants"]["sink"]["seeds"]["0"], res["variants"]["vanilla"]["seeds"]["0"]
    assert rows[0][3] == f"{rec_s['val_loss'] - rec_v['val_loss']:+.3f}".replace("-", "-")


def test_the_report_draws_the_forest_the_curves_and_the_gap_trajectory(tmp_path):
    from sinkdlm.experiment.report import write_report

    rng = np.random.default_rng(5)
    van = list(5.45 + rng.normal(0, 0.05, 6))
    variants = {"vanilla": _variant("V", [8.39] * 6, van, start_per_seed=False)}
    for name, shift in (("sink", -0.15), ("end", -0.14)):
        variants[name] = _variant(name.upper(), list(8.02 + rng.normal(0, 0.01, 6)),
                                  list(np.array(van) + shift + rng.normal(0, 0.02, 6)))
    res = _results(variants, {"primary": {"pair": ["sink", "vanilla"], "metric": "val_loss", "test": "wilcoxon"},
                              "equivalence": {"margin": 0.05, "pairs": [["end", "sink"]]}})
    res["machine"].update(processor="cpu", torch="2", cuda=False)
    summarise(res, [("sink", "vanilla"), ("end", "vanilla"), ("end", "sink")])
    write_report(res, tmp_path)
    for name in ("gap_trajectory", "forest", "val_curves"):
        assert (tmp_path / "figures" / f"{name}.png").stat().st_size > 10_000
    text = (tmp_path / "report.md").read_text()
    assert "figures/gap_trajectory.png" in text and "figures/forest.png" in text


def test_the_verdict_line_leads_with_the_three_numbers_and_a_direction_only_where_the_declared_test_rejects():
    from sinkdlm.experiment.endpoints.primary import verdict_line
    from sinkdlm.stats import signed

    rng = np.random.default_rng(4)
    van = list(5.45 + rng.normal(0, 0.05, 6))
    sink = list(np.array(van) - 0.15 + rng.normal(0, 0.02, 6))
    sink0, van0 = list(8.02 + rng.normal(0, 0.01, 6)), [8.39] * 6
    res = _results({"sink": _variant("S", sink0, sink), "vanilla": _variant("V", van0, van, start_per_seed=False)},
                   {"primary": {"pair": ["sink", "vanilla"], "metric": "val_loss", "test": "wilcoxon"}})
    summarise(res, [("sink", "vanilla")])
    line = verdict_line(res)
    d, d0 = np.array(sink) - np.array(van), np.array(sink0) - np.array(van0)
    dt = d - d0
    hl = np.median([(d[i] + d[j]) / 2 for i in range(6) for j in range(i, 6)])  # Hodges-Lehmann: Walsh averages
    assert line.startswith(f"**Verdict of the declared test**: S − V `val_loss` after 307,200 training tokens per run: "
                           f"{signed(hl, 3)} [")
    # the bold direction is named as the declared test's answer at that checkpoint, with its exact level (1 - 2/64)
    assert ("exact 96.9 % interval, exact Wilcoxon signed-rank test over 6 seeds, p = 0.0312): the declared test says "
            "**lower** with S at this checkpoint") in line  # p = 2 / 2^6
    assert f"before training (step 0) the gap was {signed(d0.mean(), 3)} [" in line
    assert f"training changed it by {signed(dt.mean(), 3)} [" in line and "the gap's change between the scored steps 300 and 600" in line
    from sinkdlm.experiment.report import summary_part

    assert summary_part(res, "verdict") == line + "\n"  # a results page's `<!-- results:NAME#verdict -->` block
    assert summary_part(res, "equivalence") is None  # none declared: no "≈" line at all
    with pytest.raises(ValueError, match="unknown summary part"):
        summary_part(res, "verdicts")
    # one seed of the other sign: the exact test cannot reject, so no direction, whatever the t interval says
    van[0], sink[0] = 5.40, 5.60
    res = _results({"sink": _variant("S", sink0, sink), "vanilla": _variant("V", van0, van, start_per_seed=False)},
                   {"primary": {"pair": ["sink", "vanilla"], "metric": "val_loss", "test": "wilcoxon"}})
    summarise(res, [("sink", "vanilla")])
    line = verdict_line(res)
    assert "no difference detected" in line and "**lower**" not in line


def test_the_mde_line_splits_the_val_loss_contrasts_at_the_target():
    from sinkdlm.experiment.report import summary_part

    res = {"sizing": {"target": 0.05}, "comparisons": [
        {"metric": "val_loss", "variant": "A", "baseline": "V", "mde": 0.041},
        {"metric": "val_loss", "variant": "B", "baseline": "V", "mde": 0.05},
        {"metric": "val_loss", "variant": "C", "baseline": "A", "mde": 0.083},
        {"metric": "shakespeare_cloze/acc", "variant": "A", "baseline": "V", "mde": 0.01}]}
    line = summary_part(res, "mde")
    assert "reached by 2 of 3 contrasts (A − V (0.041); B − V (0.050)); not by C − A (0.083)." in line
    assert summary_part({"comparisons": res["comparisons"]}, "mde") is None  # no declared target: no line


def test_the_declared_primary_is_tested_once_outside_the_family_and_its_row_says_so():
    from sinkdlm.experiment.report import multiplicity_note

    rng = np.random.default_rng(4)
    van = list(5.45 + rng.normal(0, 0.05, 6))
    sink = list(np.array(van) - 0.15 + rng.normal(0, 0.02, 6))
    variants = lambda: {"sink": _variant("S", list(8.02 + rng.normal(0, 0.01, 6)), sink),  # noqa: E731
                        "vanilla": _variant("V", [8.39] * 6, van, start_per_seed=False)}
    declared = _results(variants(), {"primary": {"pair": ["sink", "vanilla"], "metric": "val_loss", "test": "wilcoxon"}})
    plain = _results(variants(), {})
    summarise(declared, [("sink", "vanilla")])
    summarise(plain, [("sink", "vanilla")])
    row = next(c for c in declared["comparisons"] if c["metric"] == "val_loss")
    assert row["declared_primary"] and not row["in_family"] and row["p_adjusted"] is None
    # all 6 seeds lower: the exact Wilcoxon p is 2 / 2^6, and the row carries that decision, unadjusted
    assert row["survives"] and row["verdict"].startswith("lower (better) by ")
    assert "exact Wilcoxon signed-rank test, p = 0.0312, at 5 % outside the family" in row["verdict"]
    m, m0 = declared["multiplicity"], plain["multiplicity"]
    assert m["size"] == m0["size"] - 1 and m["left_out"]["declared primary"] == 1
    assert "the declared primary comparison (tested once at 5 % by its declared test, above)" in multiplicity_note(declared)
    from sinkdlm.experiment.formatting import short_verdict

    assert short_verdict(row) == "lower (better) (declared primary test)"
    row["survives"] = False
    assert short_verdict(row) == "no difference detected (declared primary test, 6 seeds)"


def test_the_time_part_says_how_long_the_experiment_took_from_its_timing():
    """`<!-- results:demo#time -->` under the README's set-up and docs/guide.md's preset table: the runner's
    elapsed time (the one figure), what the runs' measured stages add up to, the spread of one run's training
    and the machine's load where recorded."""
    from sinkdlm.experiment.report import summary_part

    timing = {"elapsed_s": 1114.3, "compute_s": 1109.1, "compute_parts": ["train", "validation", "eval", "analysis"],
              "runs": 6, "run_train_s": {"min": 102.5, "median": 110.0, "max": 177.1}}
    res = {"preset": "demo", "timing": timing, "machine": {"cpu_count": 2, "cuda": False}, "train": {"max_steps": 600}}
    # 1,114.3 s = 18.57 min -> 19; 1,109.1 s = 18.49 min -> 18.5
    assert summary_part(res, "time") == (
        "The `demo` experiment took 19 min here from its first start to its report, on 2 CPU cores (6 runs); its "
        "runs' measured stages (training, validation, evaluation, analysis) add up to 18.5 min, and training the same "
        "600 steps took 102-177 s per run. The machine's other load was not recorded: a busy CPU makes every stage "
        "slower.\n")
    res["machine"]["load_average_at_start"] = 1.04
    assert summary_part(res, "time").endswith("per run. Load average (1 min) 1.0 when it started.\n")
    assert summary_part({"preset": "demo", "timing": {}}, "time") is None  # not recorded: no sentence


def test_seed_values_read_each_metric_one_way_and_skip_what_a_run_lacks():
    """metrics.seed_values: the record's own val_loss / change, its step-0 control's val_loss, log10 of the
    peak gradient norm; None where a run lacks the value or it is not finite."""
    from sinkdlm.experiment.metrics import seed_scalars, seed_values

    variant = {"seeds": {"0": {"val_loss": 5.0, "val_loss_change": -3.0, "step0": {"val_loss": 8.0},
                               "train_grad_norm_peak": 100.0},
                         "1": {"val_loss": float("nan"), "step0": {}, "train_grad_norm_peak": 0.0}}}
    assert seed_values(variant, "val_loss") == {"0": 5.0, "1": None}
    assert seed_values(variant, "step0") == {"0": 8.0, "1": None}
    assert seed_values(variant, "log10_peak_grad_norm") == {"0": pytest.approx(2.0), "1": None}
    assert seed_scalars(variant, "val_loss_change") == {"0": -3.0}


def test_a_trend_needs_four_scored_steps_over_a_decade_and_the_words_follow_the_rule():
    """Four log-spaced scored steps over a decade: the slope per seed by least squares on log10(step), a t interval
    over seeds. Three, or four inside a decade: no slope; the report names the change between scored steps and
    states no direction from those raw intervals (they are outside the multiplicity family)."""
    from sinkdlm.experiment.endpoints.trajectory import trajectory
    from sinkdlm.experiment.endpoints.primary import primary_lines
    from sinkdlm.experiment.report import summary_part

    def variants(steps, gaps):
        a = {"seeds": {s: {"val_curve": [{"step": st, "val_loss": 5 + g[i]} for st, g in zip(steps, gaps)]} for i, s in enumerate(SEEDS)}}
        b = {"seeds": {s: {"val_curve": [{"step": st, "val_loss": 5.0} for st in steps]} for s in SEEDS}}
        return a, b

    rng = np.random.default_rng(1)
    steps = [0, 375, 750, 1500, 3000, 6000]
    gaps = [-0.4 + 0.05 * np.log10(max(st, 1)) + rng.normal(0, 0.01, 6) for st in steps]
    traj = trajectory(*variants(steps, gaps), 512)
    slopes = [np.polyfit(np.log10(steps[1:]), [g[i] for g in gaps[1:]], 1)[0] for i in range(6)]
    assert traj["slope_per_decade"]["mean"] == pytest.approx(np.mean(slopes)) and traj["decades"] == pytest.approx(np.log10(16))
    inside = trajectory(*variants([0, 2400, 4800, 7200, 9600], gaps[:5]), 512)  # 4 scored steps, 0.6 decades
    assert inside["slope_per_decade"] is None and inside["scored_steps"] == 4
    # the primary's words: 3 scored steps (0, 300, 600) -> the change between them, and no "shrinks"
    rng = np.random.default_rng(2)
    van = list(5.45 + rng.normal(0, 0.05, 6))
    sink = list(np.array(van) - 0.09 + rng.normal(0, 0.02, 6))
    res = _results({"sink": _variant("S", list(8.02 + rng.normal(0, 0.01, 6)), sink),
                    "vanilla": _variant("V", [8.39] * 6, van, start_per_seed=False)},
                   {"primary": {"pair": ["sink", "vanilla"], "metric": "val_loss", "test": "wilcoxon"}})
    summarise(res, [("sink", "vanilla")])
    text = " ".join(primary_lines(res)) + summary_part(res, "verdict")
    assert "per 10× training tokens:" not in text and "shrinks" not in text and "grows" not in text
    assert "the change of the gap between the scored steps" in text and "0 → 300: " in text
    assert "exact 96.9 % interval" in text  # 6 seeds, Wilcoxon: the range of the differences, 1 - 2/64
    answer = summary_part(res, "answer")
    assert "started ahead from the conversion alone, a gap of" in answer and "Training narrowed that head start" in answer
    assert "Not known:" in answer and "2 scored steps after step 0 give no trend" in answer


def test_the_answer_says_where_the_conversion_left_the_sink_model_from_the_step0_gap():
    """A sink added to a trained DLM (issue 52's late-sink study) may start *behind*: the plain-words answer reads
    the step-0 gap's interval, "ahead" below 0, "behind" above it, and "no difference detected" where it covers 0,
    and keeps "the rest of the head start" for a model that started ahead and ended lower."""
    from sinkdlm.experiment.report import summary_part

    rng = np.random.default_rng(5)
    van = list(5.45 + rng.normal(0, 0.05, 6))

    def answer(sink0, sink, van0=(5.40,) * 6):
        res = _results({"sink": _variant("S", list(sink0), list(sink)),
                        "vanilla": _variant("V", list(van0), van, start_per_seed=False)},
                       {"primary": {"pair": ["sink", "vanilla"], "metric": "val_loss", "test": "wilcoxon"}})
        summarise(res, [("sink", "vanilla")])
        return summary_part(res, "answer")

    # behind at step 0 (+0.3, the sink's draw raised the loss), then lower than vanilla at the end
    behind = answer(5.70 + rng.normal(0, 0.01, 6), np.array(van) - 0.05 + rng.normal(0, 0.005, 6))
    assert "the sink model started behind from the conversion alone, a gap of +0.3" in behind
    assert "Training narrowed that deficit by" in behind and "ahead" not in behind
    assert "the rest of the head start" not in behind and "the declared test finds S lower" in behind
    # level at step 0 (a gap around 0 in both directions)
    level = answer(5.40 + rng.normal(0, 0.02, 6), np.array(van) + rng.normal(0, 0.02, 6))
    assert "at step 0, before any training, the conversion alone left a gap of" in level
    assert "(no difference detected)" in level and "started ahead" not in level and "started behind" not in level


def test_a_null_primary_with_a_small_mde_is_bounded_not_inconclusive():
    """The late-sink rule (docs/method.md §7): a declared test that rejects nothing is "inconclusive" only where the
    MDE exceeds the effect the study was sized for; below it the report bounds the difference by the declared
    interval and gives the equivalence margin TOST at 5 % would pass, the largest |end| of the 90 % t interval,
    labelled post hoc."""
    from sinkdlm.experiment.report import summary_part

    rng = np.random.default_rng(7)
    van = list(4.73 + rng.normal(0, 0.002, 6))
    sink = list(np.array(van) + rng.normal(0, 0.001, 6))

    def primary(sized_for):
        res = _results({"sink": _variant("S", [4.81] * 6, sink), "vanilla": _variant("V", [4.80] * 6, van)},
                       {"primary": {"pair": ["sink", "vanilla"], "metric": "val_loss", "test": "wilcoxon",
                                    "sized_for": sized_for}})
        summarise(res, [("sink", "vanilla")])
        return res

    res = primary(0.02)
    p, d = res["primary"], np.array(sink) - np.array(van)
    assert not p["rejects"] and p["t"]["mde"] < 0.02 and not p["inconclusive"]
    assert p["bound"] == pytest.approx(max(abs(p["rank"]["low"]), abs(p["rank"]["high"])))
    half = sps.t.ppf(0.95, 5) * d.std(ddof=1) / np.sqrt(6)  # the 90 % t interval: TOST at 5 % on each side
    assert p["posthoc_margin"] == pytest.approx(max(abs(d.mean() - half), abs(d.mean() + half)))
    verdict = summary_part(res, "verdict")
    assert "no difference; the interval bounds it within ±" in verdict and "post-hoc margin" in verdict
    assert "inconclusive" not in verdict and "not declared" in verdict
    tiny = primary(1e-6)  # sized for less than the seeds detect: inconclusive, as before
    assert tiny["primary"]["inconclusive"] and "no difference detected (inconclusive with 6 seeds)" in summary_part(tiny, "verdict")


def test_delta_train_against_an_unconverted_arm_says_it_is_the_step0_gap_closing():
    """An arm continued from the study's starting checkpoint has no conversion: its step 0 is the same model on every
    seed, so Δ_train against it equals (end gap) − (step-0 gap) per seed; the comparison and the primary say so."""
    from sinkdlm.experiment.report import comparisons_table, summary_part

    rng = np.random.default_rng(9)
    base0 = [4.804] * 6
    sink0 = list(4.814 + rng.normal(0, 0.005, 6))  # the conversion costs about 0.01
    van = list(4.73 + rng.normal(0, 0.002, 6))
    sink = list(np.array(van) + rng.normal(0, 0.0005, 6))
    vanilla = _variant("all", base0, van, start_per_seed=False)
    vanilla["step0"]["checkpoint"] = "runs/base/checkpoints/step-6000"
    res = _results({"sink": _variant("sink", sink0, sink), "all": vanilla},
                   {"primary": {"pair": ["sink", "all"], "metric": "val_loss", "test": "wilcoxon"}})
    res["base"] = {"checkpoint": "runs/base/checkpoints/step-6000"}
    summarise(res, [("sink", "all")])
    change = next(c for c in res["comparisons"] if c["metric"] == "val_loss_change")
    gaps = (np.array(sink) - np.array(van)) - (np.array(sink0) - np.array(base0))
    assert change["mean"] == pytest.approx(gaps.mean()) and change["unconverted"] == ["all"]
    row = next(r for r in comparisons_table(res)[1] if r[1] == "`val_loss_change`")
    assert "since all had no conversion" in row[-1] and "the end gap − the step-0 gap" in row[-1]
    assert res["primary"]["training_effect"]["unconverted"] == ["all"]
    assert "all had no conversion" in summary_part(res, "answer")
    # an arm whose step 0 is a conversion of its own: nothing said
    del res["base"]
    summarise(res, [("sink", "all")])
    assert next(c for c in res["comparisons"] if c["metric"] == "val_loss_change")["unconverted"] == []


def test_a_new_endpoint_is_one_class_that_the_summary_and_the_report_call_in_their_order(tmp_path, monkeypatch):
    """The pattern of docs/architecture.md ("Endpoints"): an `Endpoint` subclass added to the registry is judged
    after the family's adjustment (it reads the adjusted p-values), concluded after the sizing, and its section
    stands where its slot places it, with nothing else edited."""
    from sinkdlm.experiment import report, summary
    from sinkdlm.experiment.endpoints import ENDPOINTS
    from sinkdlm.experiment.endpoints.base import Endpoint

    class Count(Endpoint):
        name, slot = "count", "lead"

        def judge(self, study):  # the adjusted p-values are set; the sizing is not yet
            adjusted = [c for c in study.comparisons if c.get("p_adjusted") is not None]
            study.results["count"] = {"adjusted": len(adjusted), "sized": "sizing" in study.results}

        def conclude(self, study):
            study.results["count"]["concluded_after_sizing"] = "sizing" in study.results

        def section(self, doc, results, out):
            doc.heading("Counted endpoint")
            doc.paragraph(f"{results['count']['adjusted']} adjusted comparisons")

    registry = (*ENDPOINTS, Count())
    monkeypatch.setattr(summary, "ENDPOINTS", registry)
    monkeypatch.setattr(report, "ENDPOINTS", registry)
    rng = np.random.default_rng(3)
    van = list(5.45 + rng.normal(0, 0.05, 6))
    res = _results({"sink": _variant("S", [8.0] * 6, list(np.array(van) - 0.1 + rng.normal(0, 0.02, 6))),
                    "vanilla": _variant("V", [8.39] * 6, van)}, {})
    res["machine"].update(processor="cpu", torch="2", cuda=False)
    summary.summarise(res, [("sink", "vanilla")])
    family = [c for c in res["comparisons"] if c.get("p_adjusted") is not None]
    assert res["count"] == {"adjusted": len(family), "sized": False, "concluded_after_sizing": True} and family
    report.write_report(res, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert text.index("Counted endpoint") < text.index("Results (mean [95 % CI])")
    assert f"{len(family)} adjusted comparisons" in text
