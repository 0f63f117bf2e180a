"""The escape endpoint (issue 54): the rule on hand-computed curves, the censored sign test against scipy on
hand-ordered signs, the sign test's MDE against its power computed by enumeration, the unigram plateau against a
direct count, and the trainer's probe hook (called every K steps, leaving training bitwise unchanged)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from scipy import stats

from sinkdlm.experiment.escape import censored_sign_test, escape_step, sign_test_mde, sink_onset, unigram_plateau
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
