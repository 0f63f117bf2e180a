"""sinkdlm.experiment.summary and .report on hand-built results: the multiplicity adjustment through the report path
(simulated null), per-layer value norms on a planted two-layer map, missing and constant metrics, and
the numbers a report prints (no -0.0, shares in [0, 1])."""

from __future__ import annotations

import copy
import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats as sps

from sinkdlm.analysis.recorder import SinkRecorder
from sinkdlm.config import AnalyzeConfig
from sinkdlm.experiment.report import markdown_summary
from sinkdlm.experiment.endpoints.sinks.stats import analysis_record, extra_sink_layers, value_norm_layers
from sinkdlm.experiment.summary import compare_variants, summarise

TASKS = ("shakespeare_word_order/acc", "shakespeare_next_line/acc_norm")
BOLD_VERDICT = re.compile(r"\*\*(higher|lower)")


def _results(variants: dict[str, dict], seeds: list[int]) -> dict:
    return {"preset": "test", "description": "hand-built", "seeds": seeds, "variants": variants,
            "machine": {"cpu_count": 2, "cuda": False}, "train": {"max_steps": 1, "batch_size": 1, "seq_len": 8}}


def _null_results(rng, n_variants=4, seeds=3, items=120) -> dict:
    """Variants that differ in nothing: a shared seed effect, per-run noise, shared item difficulty."""
    seed_effect = rng.normal(0, 0.2, size=seeds)
    logit_item = rng.normal(0.5, 1.5, size=(len(TASKS), items))
    variants = {}
    for v in range(n_variants):
        per_seed = {}
        for s in range(seeds):
            ev: dict = {}
            for t, name in enumerate(TASKS):
                task, metric = name.split("/")
                p = 1 / (1 + np.exp(-(logit_item[t] + seed_effect[s] + rng.normal(0, 0.2))))
                outcomes = (rng.random(items) < p).astype(float).tolist()
                ev.setdefault(task, {})[metric] = {"value": float(np.mean(outcomes)), "per_item": outcomes,
                                                   "items": f"digest-{task}", "n": items}
            ev["shakespeare_cloze"] = {"exact_match": {"value": 0.0, "per_item": [0.0] * items, "items": "c", "n": items}}
            per_seed[str(s)] = {"val_loss": 5.8 + seed_effect[s] + rng.normal(0, 0.1), "eval": ev,
                                "analysis": {"non_sink_fraction": float(np.clip(0.97 + rng.normal(0, 0.01), 0, 1)),
                                             "moving": {"sink_set_change_rate": float(rng.uniform(0.1, 0.4))}}}
        variants[f"v{v}"] = {"label": f"V{v}", "switches": {}, "seeds": per_seed}
    return _results(variants, list(range(seeds)))


@pytest.mark.slow  # ~25 s of simulated reports; make test-slow
def test_simulated_null_gives_a_bold_verdict_in_at_most_5_percent_of_reports():
    """Four identical variants, every pair compared on 5 varying metrics (30 paired comparisons per
    report) plus a metric that cannot vary: the raw intervals put a direction in most reports, the
    BH-adjusted verdicts in at most 5 % of them. Counted on the markdown the README shows."""
    rng = np.random.default_rng(22)
    reps, bold, raw = 300, 0, 0
    pairs = [(f"v{a}", f"v{b}") for a in range(4) for b in range(a)]
    for _ in range(reps):
        results = _null_results(rng)
        summarise(results, pairs)
        bold += bool(BOLD_VERDICT.search(markdown_summary(results)))
        raw += any(c["excludes_zero"] for c in results["comparisons"] if c.get("in_family", True))
        m = results["multiplicity"]
        # 6 pairs x 5 varying metrics; exact match (constant: 6 comparisons without a variance estimate) and
        # the all-keys change rate (an alternative) are left out, and so, rarely, is a comparison whose
        # seeds happen to tie exactly (also no variance estimate)
        assert m["left_out"]["alternative definitions"] == 6 and m["left_out"]["no variance estimate"] >= 6
        assert m["size"] + m["left_out"]["no variance estimate"] - 6 == 6 * 5
        assert m["expected_by_chance"] == pytest.approx(0.05 * m["size"])
    assert raw / reps > 0.3  # without the adjustment most reports would state some direction
    assert bold / reps <= 0.05, bold / reps


def test_a_real_difference_survives_the_adjustment():
    rng = np.random.default_rng(3)
    results = _null_results(rng, n_variants=2, seeds=5)
    for rec in results["variants"]["v1"]["seeds"].values():
        rec["val_loss"] -= 0.5
    summarise(results)
    c = next(c for c in results["comparisons"] if c["metric"] == "val_loss")
    assert c["survives"] and c["verdict"].startswith("lower (better)") and "BH-adjusted p" in c["verdict"]
    assert "**lower" in markdown_summary(results)


def _planted_layers(norms: tuple[float, float, float, float]) -> dict:
    """Recorder summary of a 2-layer model on a planted map (one step, 40 keys, 1 head).

    Layer 0: every query attends to key 0, the one sink. Layer 1: every query spreads over keys 0-4,
    five sinks. Value norms (sink_0, normal_0, sink_1, normal_1): per layer the sinks are larger, but
    layer 1 has five sinks with small norms and layer 0 most of the normal tokens with large ones,
    so the pooled means say the opposite."""
    size = 40
    cfg = SimpleNamespace(num_hidden_layers=2, num_attention_heads=1, num_sink_tokens=0, sink_position="front",
                          mask_token_id=None)
    a0 = np.zeros((size, size))
    a0[:, 0] = 1.0
    a1 = np.zeros((size, size))
    a1[:, :5] = 0.2
    s0, n0, s1, n1 = norms
    v0 = np.full(size, n0)
    v0[0] = s0
    v1 = np.full(size, n1)
    v1[:5] = s1
    import torch

    rec = SinkRecorder(cfg, AnalyzeConfig(figure_layer=0))
    state = SimpleNamespace(step=0, input_ids=torch.zeros(1, size, dtype=torch.long), attention_mask=None,
                            attentions=tuple(torch.tensor(a, dtype=torch.float32)[None, None] for a in (a0, a1)),
                            values=tuple(torch.tensor(v, dtype=torch.float32)[None, None, :, None] for v in (v0, v1)))
    rec(state)
    return {**rec.summary(), "sink_token_types": {"shares": {}}, "ablation": None}


def test_value_norms_per_layer_where_pooling_flips_the_sign():
    plants = {"0": (10.0, 8.0, 2.0, 1.0), "1": (11.0, 8.5, 2.5, 1.2), "2": (9.5, 7.5, 1.8, 0.9)}
    seeds = {s: {"analysis": analysis_record(_planted_layers(p))} for s, p in plants.items()}
    variant = {"label": "planted", "switches": {}, "seeds": seeds}
    for s, (s0, n0, s1, n1) in plants.items():  # the recorder measured what was planted
        vn = seeds[s]["analysis"]["value_norm"]
        assert vn["per_layer"]["sink_mean"] == pytest.approx([s0, s1])
        assert vn["per_layer"]["normal_mean"] == pytest.approx([n0, n1])
        pooled_sink, pooled_normal = (s0 + 5 * s1) / 6, (39 * n0 + 35 * n1) / 74  # counts: 1 + 5 sinks, 39 + 35 normal
        assert vn["sink_mean"] == pytest.approx(pooled_sink) and vn["normal_mean"] == pytest.approx(pooled_normal)
        assert pooled_sink < pooled_normal  # pooled: sinks look smaller
    layers = value_norm_layers(variant)
    assert layers["positive_layers"] == 2 and layers["compared_layers"] == 2  # per layer: sinks are larger
    # reference: per seed the unweighted mean over layers of sink - normal, then Student t over seeds
    d = np.array([((s0 - n0) + (s1 - n1)) / 2 for s0, n0, s1, n1 in plants.values()])
    half = sps.t.ppf(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
    lm = layers["layer_mean"]
    assert (lm["mean"], lm["low"], lm["high"]) == pytest.approx((d.mean(), d.mean() - half, d.mean() + half))
    assert lm["mean"] > 0 and lm["verdict"].startswith("higher")
    per_layer = layers["layers"][1]["diff"]
    d1 = np.array([s1 - n1 for _, _, s1, n1 in plants.values()])
    assert per_layer["mean"] == pytest.approx(d1.mean()) and per_layer["n"] == 3
    # the report's line states the per-layer finding, and the pooled sign beside it
    results = _results({"planted": variant}, [0, 1, 2])
    summarise(results)
    line = markdown_summary(results)
    # per layer: paired t over the 3 seeds, then Benjamini-Hochberg over the 2 layers (by hand: m = 2)
    p = [sps.ttest_1samp([pl[0] - pl[1] if i == 0 else pl[2] - pl[3] for pl in plants.values()], 0).pvalue for i in (0, 1)]
    q = sorted(p)
    adjusted = {q[1]: q[1], q[0]: min(2 * q[0], q[1])}
    higher = [i for i in (0, 1) if adjusted[p[i]] < 0.05]
    tests = layers["per_layer_tests"]
    assert tests["tested"] == 2 and tests["higher"] == higher and tests["lower"] == []
    assert [layers["layers"][i]["diff"]["p_adjusted"] for i in (0, 1)] == pytest.approx([adjusted[x] for x in p])
    assert f"per layer, sinks lower than normal tokens in 0, higher in {len(higher)}" in line
    assert f"no difference detected in {2 - len(higher)} of 2 layers tested" in line and "pooled over layers" in line
    assert variant["summary"]["value_norm_sink_minus_normal_pooled"]["mean"] < 0


def test_the_summary_names_a_few_layers_and_leaves_a_long_list_to_the_full_report():
    from sinkdlm.experiment.endpoints.sinks.tables import _per_layer_finding

    lay = {"compared_layers": 30, "seeds": ["0", "1", "2"],
           "per_layer_tests": {"tested": 30, "lower": list(range(2, 30)), "higher": [0]}}
    text = _per_layer_finding(lay, "sinks", "normal tokens")
    assert "lower than normal tokens in 28, higher in 1 (layer 0), no difference detected in 1 of 30" in text
    assert "2, 3, 4" not in text and "per layer in the full report" in text


def test_extra_sink_per_layer_intervals_stay_in_bounds():
    seeds = {str(s): {"analysis": {"extra_sink": {"attention_mass": [0.002 * s, 0.5 + 0.01 * s, 0.999 + 0.0005 * s],
                                                  "value_norm": [9.0, 3.0 + s, 2.0],
                                                  "others_value_norm": [8.0, 10.0, 12.0 + s]}}} for s in range(3)}
    e = extra_sink_layers({"label": "x", "switches": {"num_sink_tokens": 1}, "seeds": seeds})
    for iv in e["attention_mass"]:
        assert 0.0 <= iv["low"] <= iv["mean"] <= iv["high"] <= 1.0
    vo = e["value_norm_vs_others"]
    assert vo["from_layer"] == 1 and vo["negative_layers"] == 2 and vo["compared_layers"] == 2
    # per seed: mean over layers 1.. of extra - others
    d = [((3.0 + s - 10.0) + (2.0 - 12.0 - s)) / 2 for s in range(3)]
    assert vo["layer_mean"]["mean"] == pytest.approx(np.mean(d))


def test_a_missing_seed_value_marks_the_metric_missing_for_the_pair():
    rng = np.random.default_rng(1)
    results = _null_results(rng, n_variants=2)
    results["variants"]["v1"]["seeds"]["2"]["val_loss"] = None
    summarise(results)  # no crash, no message about different seeds
    c = next(c for c in results["comparisons"] if c["metric"] == "val_loss")
    assert c["missing"] == ["2"] and c["verdict"] == "missing: not recorded for seed 2" and c["p"] is None
    assert results["multiplicity"]["left_out"]["missing"] == 1
    broken = copy.deepcopy(results)
    del broken["variants"]["v1"]["seeds"]["2"]  # a variant run on other seeds is still refused
    with pytest.raises(ValueError, match="different seeds"):
        compare_variants(broken["variants"]["v1"], broken["variants"]["v0"], "val_loss")


def test_constant_metric_is_no_test_and_no_bound_prints_minus_zero():
    rng = np.random.default_rng(5)
    results = _null_results(rng, n_variants=2, seeds=5)
    for i, rec in enumerate(results["variants"]["v1"]["seeds"].values()):
        rec["val_loss"] = results["variants"]["v0"]["seeds"][str(i)]["val_loss"] - 0.02 - 0.0015 * (i % 2)
    summarise(results)
    assert results["constant_metrics"] == ["shakespeare_cloze/exact_match"]
    c = next(c for c in results["comparisons"] if c["metric"] == "shakespeare_cloze/exact_match")
    assert c["degenerate"] and c["verdict"].startswith("inconclusive (no variance estimate)") and "p_adjusted" in c
    text = markdown_summary(results)
    assert "0.0 (no spread)" in text
    assert not re.search(r"-0\.0+(?![0-9])", text)  # -0.0 is never a printed bound or mean
    vl = next(c for c in results["comparisons"] if c["metric"] == "val_loss")
    assert vl["high"] < 0 and vl["survives"]
    assert re.search(r"-0\.02[0-9]* \[-0\.02[0-9]*, -0\.0[0-9]*[1-9]", text)  # the upper bound is printed below 0


def test_one_seed_prints_no_interval_and_defaults_fill_the_budget_line():
    """A single seed's share prints "[–]", not [0.0, 100.0]; a setting the preset left at its default is
    printed from TrainConfig, not as "None"; every comparison prints its MDE."""
    from sinkdlm.config import TrainConfig

    rng = np.random.default_rng(0)
    one = _null_results(rng, n_variants=2, seeds=1)
    one["train"] = {"max_steps": 800}  # batch_size and seq_len left at TrainConfig's defaults
    summarise(one)
    text = markdown_summary(one)
    assert "None" not in text
    assert f"800 steps × {TrainConfig().batch_size} × {TrainConfig().seq_len} tokens" in text
    assert "[0.0, 100.0]" not in text and "[–]" in text
    nsf = one["variants"]["v0"]["summary"]["non_sink_fraction"]
    assert nsf["low"] is None and nsf["high"] is None  # one seed: no interval at all
    three = _null_results(rng, n_variants=2, seeds=3)
    summarise(three)
    from sinkdlm.experiment.report import comparisons_table

    header, rows = comparisons_table(three)
    col = header.index("MDE (80 % power)")
    val = next(c for c in three["comparisons"] if c["metric"] == "val_loss")
    row = next(r for r in rows if r[1] == "`val_loss`")
    assert float(row[col]) == pytest.approx(val["mde"], abs=5e-4) and val["mde"] > abs(val["high"] - val["mean"])


def test_repetition_rate_counts_repeated_pieces_and_reaches_the_report():
    from sinkdlm.experiment.endpoints.sinks.stats import repetition_rate

    assert repetition_rate("To be or not to be") == pytest.approx(1 - 5 / 6)  # "To" and "to" differ
    assert repetition_rate(",,,,") == pytest.approx(0.75)
    assert repetition_rate("\n\n\nThe\n") == pytest.approx(1 - 2 / 5)  # newlines are pieces, spaces are not
    assert repetition_rate("   ") is None
    rec = analysis_record({"samples": ["a a a a", "b c"]})
    assert rec["repetition_rate"] == pytest.approx((0.75 + 0.0) / 2) and rec["samples"] == ["a a a a", "b c"]


def test_one_seed_never_survives_the_adjustment():
    """With one seed an accuracy comparison over items has a p-value, but its verdict is "inconclusive
    with 1 seed": it is left out of the family, so the count of survivors agrees with the verdicts."""
    rng = np.random.default_rng(1)
    res = _null_results(rng, n_variants=2, seeds=1, items=400)
    # plant a large item-level difference so the raw interval over items excludes 0
    for rec in res["variants"]["v1"]["seeds"].values():
        acc = rec["eval"]["shakespeare_word_order"]["acc"]
        acc["per_item"] = [1.0] * len(acc["per_item"])
        acc["value"] = 1.0
    summarise(res)
    word = next(c for c in res["comparisons"] if c["metric"] == "shakespeare_word_order/acc")
    assert word["p"] is not None and word["p"] < 1e-6  # the items alone would call it
    assert word["verdict"].startswith("inconclusive with 1 seed") and not word.get("survives")
    assert res["multiplicity"]["survivors"] == 0 and res["multiplicity"]["size"] == 0
    assert res["multiplicity"]["left_out"]["one seed"] >= 1
    assert "0 survive the adjustment" in markdown_summary(res)


def test_step0_control_value_norms_are_stated_per_layer():
    rng = np.random.default_rng(2)
    res = _null_results(rng, n_variants=2, seeds=2)
    for v in res["variants"].values():
        for rec in v["seeds"].values():
            rec["analysis"]["value_norm"] = {"per_layer": {"sink_mean": [1.5, 0.5], "normal_mean": [1.0, 1.0]}}
        v["step0"] = {"val_loss": 8.0, "val_loss_se": 0.01,
                      "analysis": {"value_norm": {"per_layer": {"sink_mean": [1.0, 3.0], "normal_mean": [2.0, 1.0]}}}}
    summarise(res)
    s0 = res["variants"]["v0"]["summary"]["step0_value_norm_layers"]
    assert [lay["diff"]["mean"] for lay in s0["layers"]] == pytest.approx([-1.0, 2.0])  # sink − normal per layer
    text = markdown_summary(res)
    assert "step-0 control (one model, no interval): sink above normal in 1 of 2 layers" in text
    assert "1.0/3.0" not in text  # per-layer numbers go to the full report's table, not into a sentence
    from sinkdlm.experiment.endpoints.sinks.tables import value_norm_layer_table

    header, rows = value_norm_layer_table(res)
    assert header[:3] == ["layer", "V0: sinks / normal", "V0 step 0: sinks / normal"]
    assert rows[0][:3] == ["0", "1.5 / 1.0", "1.0 / 2.0"] and rows[1][:3] == ["1", "0.5 / 1.0", "3.0 / 1.0"]
    # every seed alike in both layers: no layer is a test, and the line says so rather than a direction
    assert "no difference detected in 0 of 0 layers tested" in text and "2 more without a variance estimate" in text
    assert "8.000 ± 0.010 (MC SE)" in text  # the step-0 table


def test_above_chance_for_one_variant_only_points_to_the_paired_test():
    res = _null_results(np.random.default_rng(3), n_variants=2, seeds=3)
    for name, every in (("v0", 2), ("v1", 10)):  # accuracy 1/2 (chance) and 9/10
        for rec in res["variants"][name]["seeds"].values():
            acc = rec["eval"]["shakespeare_word_order"]["acc"]
            acc["per_item"] = [0.0 if i % every == 0 else 1.0 for i in range(len(acc["per_item"]))]
            acc["value"] = float(np.mean(acc["per_item"]))
    summarise(res)
    assert [v["summary"]["shakespeare_word_order/acc"]["above_chance"] for v in res["variants"].values()] == [False, True]
    assert "(`shakespeare_word_order/acc`) is a difference in significance, not a significant difference" in \
        markdown_summary(res)


def _ablation(rng, n_requests: int, shift: float, include: bool, alternative: dict | None = None) -> dict:
    base = rng.normal(-4.0, 0.5, n_requests)
    k1 = base + shift + rng.normal(0, 0.2, n_requests)
    return {"metric": "continuation_elbo_per_token", "protocol": "clean", "include_extra_sink": include,
            "scores": {"0": float(base.mean()), "1": float(k1.mean())}, "delta": {"0": 0.0, "1": float((k1 - base).mean())},
            "masked_keys_per_head": {"0": 0.0, "1": float(rng.uniform(0.2, 1.2))},
            "per_request": {"0": base.tolist(), "1": k1.tolist()}, "alternative": alternative}


def test_the_masking_curve_is_paired_over_seeds_and_prompts_and_shows_both_extra_sink_settings():
    """issue 30: the masking Δ's interval is over seeds × prompts (two-way random effects, written out
    here), the keys actually masked are reported, and a sink variant whose extra sink was never masked
    says "not measured in this run" for that setting instead of a number."""
    rng = np.random.default_rng(5)
    res = _null_results(rng, n_variants=2, seeds=3)
    van, sink = res["variants"]["v0"], res["variants"]["v1"]
    sink["switches"] = {"num_sink_tokens": 1}
    for seed, rec in van["seeds"].items():
        rec["analysis"]["ablation"] = _ablation(rng, 6, -0.3 - 0.2 * int(seed), False)
    summarise(res)
    m = van["summary"]["masking"]
    assert [s["include_extra_sink"] for s in m["settings"]] == [False]
    row = m["settings"][0]["k"]["1"]
    d = np.array([np.subtract(van["seeds"][s]["analysis"]["ablation"]["per_request"]["1"],
                              van["seeds"][s]["analysis"]["ablation"]["per_request"]["0"]) for s in ("0", "1", "2")])
    S, I = d.shape
    mean, rows, cols = d.mean(), d.mean(1), d.mean(0)
    ms_s = I * ((rows - mean) ** 2).sum() / (S - 1)
    ms_i = S * ((cols - mean) ** 2).sum() / (I - 1)
    ms_e = ((d - rows[:, None] - cols[None, :] + mean) ** 2).sum() / ((S - 1) * (I - 1))
    half = sps.t.ppf(0.975, S - 1) * math.sqrt((ms_s + max(ms_i - ms_e, 0)) / (S * I))
    assert (row["delta"]["mean"], row["delta"]["low"], row["delta"]["high"]) == pytest.approx((mean, mean - half, mean + half))
    masked = [van["seeds"][s]["analysis"]["ablation"]["masked_keys_per_head"]["1"] for s in ("0", "1", "2")]
    assert row["masked_keys_per_head"]["mean"] == pytest.approx(np.mean(masked))
    assert "p_adjusted" in row["delta"]  # in the report's family
    # the sink variant: never-masked only (an older run) -> the other setting is "not measured in this run"
    for rec in sink["seeds"].values():
        rec["analysis"]["ablation"] = _ablation(rng, 6, -0.05, False)
    summarise(res)
    settings = sink["summary"]["masking"]["settings"]
    assert [(s["include_extra_sink"], s["measured"]) for s in settings] == [(False, True), (True, False)]
    text = markdown_summary(res)
    assert "| V1 | masked when among the top K | – | not measured in this run | not measured in this run | – |" in text
    assert f"| V0 | – | 1 | {mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}] | {np.mean(masked):.2f} [" in text
    # scored both ways (a new run): the masked setting has its own interval, in the family too
    for rec in sink["seeds"].values():
        alt = _ablation(rng, 6, -0.8, True)
        rec["analysis"]["ablation"] = _ablation(rng, 6, -0.05, False, alternative={k: alt[k] for k in (
            "include_extra_sink", "scores", "delta", "masked_keys_per_head", "per_request")})
    size_before = res["multiplicity"]["size"]
    summarise(res)
    settings = sink["summary"]["masking"]["settings"]
    assert settings[1]["measured"] and settings[1]["k"]["1"]["delta"]["mean"] < settings[0]["k"]["1"]["delta"]["mean"]
    assert res["multiplicity"]["size"] == size_before + 1
    kept = analysis_record({"ablation": {**rec["analysis"]["ablation"], "k": [0, 1], "epsilon": 3.0}})["ablation"]
    assert kept["per_request"] == rec["analysis"]["ablation"]["per_request"]  # results.json keeps what the interval needs
    assert kept["alternative"]["per_request"] == rec["analysis"]["ablation"]["alternative"]["per_request"]


def test_peak_gradient_norm_is_compared_as_a_paired_log_ratio():
    """`log10_peak_grad_norm`: each run's largest pre-clip gradient norm, compared between variants on the
    same seeds as the paired t interval of log10(a_s / b_s), written out here; descriptive (no better/worse);
    in the multiplicity family; left out where no run recorded it."""
    peaks_b = {"0": 14205.0, "1": 3126.0, "2": 430.0}
    peaks_a = {"0": 233.0, "1": 318.0, "2": 250.0}
    variants = {name: {"label": name.upper(), "switches": {},
                       "seeds": {s: {"val_loss": 5.0 + int(s) * 0.1 + (0.01 * int(s) ** 2 if name == "a" else 0.0),
                                     "train_grad_norm_peak": peaks[s]} for s in peaks}}
                for name, peaks in (("b", peaks_b), ("a", peaks_a))}
    results = _results(variants, [0, 1, 2])
    summarise(results, [("a", "b")])
    c = next(c for c in results["comparisons"] if c["metric"] == "log10_peak_grad_norm")
    d = np.log10([peaks_a[s] / peaks_b[s] for s in peaks_a])
    half = sps.t.ppf(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
    assert c["mean"] == pytest.approx(d.mean()) and c["low"] == pytest.approx(d.mean() - half)
    assert c["high"] == pytest.approx(d.mean() + half) and c["lower_is_better"] is None
    assert results["variants"]["a"]["summary"]["log10_peak_grad_norm"]["mean"] == pytest.approx(
        np.log10(list(peaks_a.values())).mean())
    assert results["multiplicity"]["size"] == 2  # val_loss and the peak gradient norm
    for v in variants.values():
        for rec in v["seeds"].values():
            del rec["train_grad_norm_peak"]
    summarise(results, [("a", "b")])
    assert [c["metric"] for c in results["comparisons"]] == ["val_loss"]


def test_ar_vs_dlm_states_the_training_steps_a_preset_left_at_its_default():
    """results.json keeps only the training settings a preset set; the AR-vs-DLM table then states
    TrainConfig's default, never "? training steps" (the committed table once did)."""
    import json
    from pathlib import Path

    from sinkdlm.config import TrainConfig
    from sinkdlm.experiment.endpoints.sinks.tables import ar_vs_dlm_markdown

    root = Path(__file__).resolve().parents[2] / "docs" / "results" / "smollm2"
    ar, dlm = json.loads((root / "ar" / "intervals.json").read_text()), json.loads((root / "dlm" / "results.json").read_text())
    dlm["train"].pop("max_steps", None)
    text = ar_vs_dlm_markdown(ar, dlm)
    assert f"{TrainConfig().max_steps} training steps" in text and "? training" not in text


def test_a_masking_curve_of_the_first_seed_only_is_one_seed_not_a_crash():
    """A preset that analyses only its first seed (analyse_every_seed=False): the other seeds have no
    analysis, and the masking curve is stated over the analysed seed (inconclusive with 1 seed)."""
    rng = np.random.default_rng(7)
    res = _null_results(rng, n_variants=2, seeds=3)
    for v in res["variants"].values():
        for seed, rec in v["seeds"].items():
            if seed == "0":
                rec["analysis"]["ablation"] = _ablation(rng, 6, 0.1, False)
            else:
                rec.pop("analysis")
    summarise(res)
    row = res["variants"]["v0"]["summary"]["masking"]["settings"][0]["k"]["1"]["delta"]
    assert row["n"] == 1 and row["verdict"].startswith("inconclusive with 1 seed")


def test_the_seed_table_puts_each_peak_gradient_norm_beside_the_interval_it_fell_in(tmp_path):
    """The trainer logs each interval's largest pre-clip norm at the interval's last step: the peak's steps are
    (previous logged step + 1)-(its logged step); a run whose metrics log was not kept says so."""
    import json

    from sinkdlm.experiment.endpoints.primary import primary_seed_table
    from sinkdlm.training.rundir import grad_norm_peak_steps

    rows = [{"step": 10, "loss": 9.0, "grad_norm_max": 623.6}, {"step": 20, "loss": 6.6, "grad_norm_max": 2252.3},
            {"step": 30, "loss": 6.5, "grad_norm_max": 321.9}, {"step": 30, "val_loss": 6.4}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert grad_norm_peak_steps(tmp_path) == (pytest.approx(2252.3), [11, 20])
    assert grad_norm_peak_steps(tmp_path / "absent") is None
    first = [{"step": 10, "loss": 9.0, "grad_norm_max": 900.0}, {"step": 20, "loss": 6.6, "grad_norm_max": 10.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in first))
    assert grad_norm_peak_steps(tmp_path) == (pytest.approx(900.0), [1, 10])
    res = {"primary": {"pair": ["a", "b"]}, "variants": {
        "a": {"label": "A", "seeds": {"0": {"val_loss": 5.0, "train_grad_norm_peak": 2252.3, "train_grad_norm_peak_steps": [11, 20]}}},
        "b": {"label": "B", "seeds": {"0": {"val_loss": 5.1, "train_grad_norm_peak": 650.0}}}}}
    header, table = primary_seed_table(res)
    assert header[-2:] == ["A peak grad norm (at steps)", "B peak grad norm (at steps)"]
    assert table[0][-2:] == ["2252 (11-20)", "650 (step not recorded)"]


def test_takeover_line_reports_the_sink_tokens_share_and_the_moving_sink_verdict():
    """`takeover` (the late-sink question, "does a sink added after pretraining take over the moving sinks?"): for each
    compared arm with an extra sink, its attention share over the seeds (t interval, kept in [0, 1]) beside its
    step-0 control's, and the moving-sink comparison's own verdict; an arm without a sink token says nothing."""
    from scipy import stats as sps

    from sinkdlm.experiment.report import summary_part

    masses = [0.40, 0.44, 0.48]
    sink = {"label": "S", "seeds": {str(i): {"analysis": {"extra_sink": {"mean_attention_mass": m}}}
                                    for i, m in enumerate(masses)},
            "step0": {"analysis": {"extra_sink": {"mean_attention_mass": 0.123}}}}
    plain = {"label": "V", "seeds": {str(i): {"analysis": {}} for i in range(3)}}
    verdict = "lower by 0.05 (95 % CI [-0.09, -0.01], BH-adjusted p = 0.03)"
    res = {"variants": {"sink": sink, "vanilla": plain, "lora": dict(plain, label="L")},
           "comparisons": [{"pair": ["sink", "vanilla"], "metric": "content_sink_set_change_rate", "verdict": verdict},
                           {"pair": ["lora", "vanilla"], "metric": "content_sink_set_change_rate", "verdict": "x"},
                           {"pair": ["sink", "vanilla"], "metric": "val_loss", "verdict": "y"}]}
    half = sps.t.ppf(0.975, 2) * np.std(masses, ddof=1) / np.sqrt(3)
    line = summary_part(res, "takeover")
    assert line == ("**Does the sink token take over the moving sinks?** S: the sink token holds "
                    f"44.0 [{100 * (0.44 - half):.1f}, {100 * (0.44 + half):.1f}] % of the attention (all layers; 12.3 % in "
                    f"its step-0 control); its moving-sink rate (sink-set change rate, content keys) against V: {verdict}.\n")
    assert summary_part({"variants": {"vanilla": plain}, "comparisons": []}, "takeover") is None


def test_the_sink_table_says_whose_models_it_describes():
    """Every seed analysed: "every seed's model"; a preset that analyses its first seed only (the others'
    records without `analysis`): the table says how many seeds' models it describes."""
    rng = np.random.default_rng(3)
    every = _null_results(rng, n_variants=2, seeds=4)
    summarise(every)
    assert "Attention sinks (ϵ = 3, every seed's model," in markdown_summary(every)
    first = _null_results(rng, n_variants=2, seeds=4)
    for v in first["variants"].values():
        for seed, rec in v["seeds"].items():
            if seed != "0":
                del rec["analysis"]
    summarise(first)
    text = markdown_summary(first)
    assert "every seed's model" not in text
    assert "Attention sinks (ϵ = 3, the analysed seeds' models, 1 of 4 seeds," in text


def test_cost_line_describes_each_arms_training_time_when_the_arms_train_different_parameters():
    """`arm_cost` (issue 52's "at equal compute"): per arm, what it trains and the median (range) of its runs' own
    training seconds, computed here from the records; nothing when every arm trains all weights."""
    from sinkdlm.experiment.report import summary_part

    def arm(label, secs, train=None):
        v = {"label": label, "switches": {}, "seeds": {str(i): {"train_seconds": s} for i, s in enumerate(secs)}}
        return dict(v, train=train) if train else v

    res = {"train": {"max_steps": 1500, "batch_size": 8, "seq_len": 128},
           "variants": {"all": arm("A", [250.0, 262.0, 240.0]), "sink": arm("S", [130.0], {"trainable": "sink"}),
                        "lora": arm("L", [201.0, 199.0], {"trainable": "lora", "merge": True})}}
    line = summary_part(res, "arm_cost")
    assert line.startswith("**What training one run took** (1,500 steps × 8 × 128 tokens for every arm; ")
    assert "A (`all`) 250 s (240-262); S (`sink`) 130 s; L (`lora`) 200 s (199-201). Equal steps" in line
    same = {"train": res["train"], "variants": {"a": arm("A", [1.0, 2.0]), "b": arm("B", [3.0, 4.0])}}
    assert summary_part(same, "arm_cost") is None


def test_takeover_layer_table_gives_each_arms_per_layer_rates_and_shares_and_each_control_once():
    """`takeover_layers` (issue 52, "the sink token's attention share and the moving-sink rate per layer"): per arm
    and layer, mean [t interval over seeds, kept in [0, 1]] computed here from the seeds' lists; a step-0 control
    (one model) prints its values without an interval, once however many arms share it; an arm without a sink token
    has no share row."""
    from scipy import stats as sps

    from sinkdlm.experiment.report import summary_part
    from sinkdlm.experiment.endpoints.sinks.tables import takeover_layer_table

    rates = [[0.20, 0.10], [0.30, 0.12], [0.25, 0.14]]
    masses = [[0.01, 0.50], [0.03, 0.60], [0.02, 0.70]]

    def rec(rate, mass=None):
        a = {"moving_per_layer": {"content_sink_set_change_rate": rate}}
        return {"analysis": dict(a, extra_sink={"attention_mass": mass}) if mass else a}

    control = {"analysis_dir": "step0/sink-s0/analysis", **rec([0.4, 0.3], [0.001, 0.002])}
    res = {"variants": {
        "all": {"label": "A", "seeds": {str(i): rec(r) for i, r in enumerate(rates)}},
        "sink": {"label": "S", "seeds": {str(i): rec(r, m) for i, (r, m) in enumerate(zip(rates, masses))}, "step0": control},
        "sink-all": {"label": "SA", "seeds": {"0": rec([0.5, 0.5], [0.1, 0.2])}, "step0": control}}}
    header, rows = takeover_layer_table(res)
    assert header == ["arm", "measure", "layer 0", "layer 1"]

    def ci(xs, scale, digits):
        m, h = np.mean(xs), sps.t.ppf(0.975, len(xs) - 1) * np.std(xs, ddof=1) / np.sqrt(len(xs))
        lo, hi = max(m - h, 0.0), min(m + h, 1.0)
        return f"{scale * m:.{digits}f} [{scale * lo:.{digits}f}, {scale * hi:.{digits}f}]"

    labels = [(r[0], r[1].split(" (")[0]) for r in rows]
    assert labels == [("A", "moving-sink rate"), ("S", "moving-sink rate"), ("S", "attention on the sink token %"),
                      ("S: its step-0 control", "moving-sink rate"), ("S: its step-0 control", "attention on the sink token %"),
                      ("SA", "moving-sink rate"), ("SA", "attention on the sink token %")]
    assert rows[1][2:] == [ci([r[0] for r in rates], 1.0, 3), ci([r[1] for r in rates], 1.0, 3)]
    assert rows[2][2:] == [ci([m[0] for m in masses], 100.0, 1), ci([m[1] for m in masses], 100.0, 1)]
    assert rows[4][2:] == ["0.1", "0.2"] and rows[6][2:] == ["10.0", "20.0"]  # one model: its values, no interval
    assert rows[1][1] == "moving-sink rate (sink-set change rate, content keys) (3 seeds)"
    assert summary_part(res, "takeover_layers").startswith("| arm | measure | layer 0 | layer 1 |\n|---|---|---|---|\n| A |")
    assert takeover_layer_table({"variants": {"v": {"label": "V", "seeds": {"0": {"analysis": {}}}}}}) is None


def test_a_sink_tokens_share_is_printed_beside_one_keys_uniform_share_and_a_per_seed_control_only_when_all_are():
    """The sink token's attention share beside 1/keys, a uniformly attended key's share (keys = the analysis's mean
    prompt tokens + generated tokens + sink tokens, from its `setup`); a step-0 control per seed stands for every seed
    only when every seed's was analysed, and results.json keeps one: not shown for a study of several seeds."""
    from sinkdlm.experiment.report import summary_part
    from sinkdlm.experiment.endpoints.sinks.stats import analysis_record

    def analysed(mass, prompt_mean):
        a = {"setup": {"prompt_tokens": {"min": 31, "mean": prompt_mean, "max": 32}, "gen_length": 32},
             "extra_sink": {"num_sink_tokens": 1, "mean_attention_mass": mass}}
        return {"analysis": analysis_record(a)}

    seeds = {"0": analysed(0.008, 31.875), "1": analysed(0.007, 31.875)}
    sink = {"label": "S", "switches": {"num_sink_tokens": 1}, "seeds": seeds,
            "step0": {"per_seed": True, "analysis": {"extra_sink": {"mean_attention_mass": 0.008}}}}
    res = {"variants": {"sink": sink, "all": {"label": "A", "switches": {}, "seeds": {"0": {"analysis": {}}}}},
           "comparisons": [{"pair": ["sink", "all"], "metric": "content_sink_set_change_rate", "verdict": "v"}]}
    line = summary_part(res, "takeover")
    assert f"a uniformly attended key would get 1/keys = {100 / (31.875 + 32 + 1):.2f} %" in line  # 1.54 %
    assert "not all analysed: not shown" in line and "in its step-0 control" not in line
    sink["seeds"] = {"0": seeds["0"]}  # one seed: its own control stands for it
    assert "0.8 % in its step-0 control" in summary_part(res, "takeover")


def test_the_report_names_every_machine_its_runs_trained_on(tmp_path):
    """A study resumed on another CPU: the first paragraph names each machine with its seeds (each run's own
    train/DONE.json) and says whether a seed's pair crossed machines; one machine keeps the one-machine line."""
    import json

    from sinkdlm.experiment.report import machines_words

    results = {"variants": {"a": {"seeds": {"1": {}, "2": {}}}, "b": {"seeds": {"1": {}, "2": {}}}},
               "machine": {"cpu": "Here", "cpu_capability": "AVX512", "cpu_count": 2, "torch": "2.13", "cuda": False}}
    where = {("a", "1"): "AVX2", ("b", "1"): "AVX2", ("a", "2"): "AVX512", ("b", "2"): "AVX512"}

    def write(where):
        for (v, s), cap in where.items():
            done = tmp_path / "runs" / f"{v}-s{s}" / "train" / "DONE.json"
            done.parent.mkdir(parents=True, exist_ok=True)
            done.write_text(json.dumps({"machine": {"cpu": "EPYC", "cpu_capability": cap}}))

    write({k: "AVX512" for k in where})
    assert machines_words(results, tmp_path) == "Machine: Here (AVX512 kernels), 2 cores, torch 2.13, CUDA no."
    write(where)
    said = machines_words(results, tmp_path)
    assert "2 machines (EPYC (AVX2 kernels): seeds 1; EPYC (AVX512 kernels): seeds 2)" in said, said
    assert "each pair is on one machine" in said and said.endswith("Report written on Here (AVX512 kernels), 2 cores, torch 2.13, CUDA no.")
    write({**where, ("b", "2"): "AVX2"})
    assert "seeds 2 trained on more than one, so their pairs cross machines" in machines_words(results, tmp_path)
