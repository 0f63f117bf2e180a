"""`mde` (docs/method.md §7): the minimum detectable effect at 80 % power, checked by simulating the paired t test."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from sinkdlm.experiment.summary import comparison_mde
from sinkdlm.stats import minimum_detectable_effect
from sinkdlm.stats import paired_difference


@pytest.mark.parametrize("n", [3, 8])
def test_mde_has_80_percent_power_by_simulation(n):
    sigma = 0.7
    mde = minimum_detectable_effect(sigma / math.sqrt(n), n - 1)
    rng = np.random.default_rng(0)
    d = rng.normal(mde, sigma, size=(40_000, n))  # true effect = mde
    t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
    power = float((np.abs(t) > st.t.ppf(0.975, n - 1)).mean())
    assert power == pytest.approx(0.8, abs=0.01)  # binomial SE at 40,000 draws: 0.002


def test_mde_tends_to_the_normal_formula_and_reads_back_from_an_interval():
    assert minimum_detectable_effect(1.0, 1e7) == pytest.approx(st.norm.ppf(0.975) + st.norm.ppf(0.8), rel=1e-4)
    a, b = [5.1, 4.9, 5.3, 5.0], [5.0, 5.0, 5.1, 4.7]
    iv = paired_difference(a, b).to_dict()
    d = np.subtract(a, b)
    want = minimum_detectable_effect(d.std(ddof=1) / 2, 3)
    assert comparison_mde(iv) == pytest.approx(want, rel=1e-9)
    assert comparison_mde(paired_difference([1.0], [0.5]).to_dict()) is None  # one seed: no spread, no mde


@pytest.mark.parametrize("sd,target", [(0.116, 0.05), (0.418, 0.05), (0.03, 0.05)])
def test_seeds_for_mde_is_the_fewest_seeds_whose_t_test_reaches_the_target(sd, target):
    """By the definition: n seeds detect `target` with 80 % power (noncentral t), n - 1 do not; and for many
    seeds the count approaches the normal formula ((z_0.975 + z_0.8) sd / target)^2."""
    from sinkdlm.experiment.summary import seeds_for_mde

    n = seeds_for_mde(sd, target)
    assert minimum_detectable_effect(sd / math.sqrt(n), n - 1) <= target
    assert n == 2 or minimum_detectable_effect(sd / math.sqrt(n - 1), n - 2) > target
    normal = ((st.norm.ppf(0.975) + st.norm.ppf(0.8)) * sd / target) ** 2
    assert normal <= n <= normal + 4  # the t correction adds a few seeds at most
    assert seeds_for_mde(0.0, target) is None


def test_the_report_says_what_the_target_would_take():
    """The sizing reads each val_loss comparison's interval back to the spread of its per-seed differences
    and prices the seeds with the study's measured compute per run."""
    from sinkdlm.experiment.report import sizing_note
    from sinkdlm.experiment.summary import TARGET_MDE, seeds_for_mde, study_sizing

    diffs = [-0.30, 0.05, -0.12]
    vanilla = {str(s): {"val_loss": 5.0, "seconds": {"train": 600.0}} for s in range(3)}
    sink = {str(s): {"val_loss": 5.0 + d, "seconds": {"train": 600.0}} for s, d in enumerate(diffs)}
    iv = paired_difference([5.0 + d for d in diffs], [5.0] * 3).to_dict()
    results = {"variants": {"vanilla": {"seeds": vanilla}, "sink1-front": {"seeds": sink}},
               "timing": {"compute_s": 3600.0, "compute_parts": ["train"], "runs": 6, "runs_timed": 6},
               "comparisons": [{"pair": ["sink1-front", "vanilla"], "metric": "val_loss", **iv, "mde": None}]}
    sizing = study_sizing(results)
    row = sizing["pairs"][0]
    assert row["sd"] == pytest.approx(float(np.std(diffs, ddof=1)), rel=1e-9)
    assert row["seeds"] == seeds_for_mde(row["sd"], TARGET_MDE)
    assert row["compute_h"] == pytest.approx(2 * row["seeds"] * 600.0 / 3600)  # two runs per seed, 10 min each
    results["sizing"] = sizing
    note = sizing_note(results)
    assert f"needs {row['seeds']:,} seeds per variant" in note and "this study ran 3" in note


def test_sizing_uses_the_variance_split_when_the_runs_kept_their_values():
    """With `val_loss_splits` the sizing uses the spread projected to the whole validation set (training part
    plus the noise of the set) and states the training part with its interval and the validation noise."""
    from sinkdlm.experiment.report import sizing_note
    from sinkdlm.experiment.summary import TARGET_MDE, seeds_for_mde, study_sizing

    diffs = [-0.30, 0.05, -0.12]
    iv = paired_difference([5.0 + d for d in diffs], [5.0] * 3).to_dict()
    split = {"pair": ["sink1-front", "vanilla"], "var_total": float(np.var(diffs, ddof=1)), "var_train": 0.02,
             "sd_train_interval": [0.07, 0.9], "validation_se_diff": 0.004, "sd_full": 0.15,
             "seeds_for_target_upper": 4000}
    results = {"variants": {"vanilla": {"seeds": {}}, "sink1-front": {"seeds": {}}},
               "timing": {"compute_s": 3600.0, "compute_parts": ["train"], "runs": 6, "runs_timed": 6},
               "comparisons": [{"pair": ["sink1-front", "vanilla"], "metric": "val_loss", **iv, "mde": None}],
               "val_loss_splits": [split]}
    results["sizing"] = study_sizing(results)
    row = results["sizing"]["pairs"][0]
    assert row["seeds"] == seeds_for_mde(0.15, TARGET_MDE)  # the projected spread, not the raw one
    assert row["split"]["sd_train"] == pytest.approx(0.02**0.5)
    note = sizing_note(results)
    assert "training seeds 0.141 [95 % CI 0.070, 0.900]" in note and "validation noise of the difference 0.0040" in note
    assert "at the interval's upper end 4,000 seeds" in note


def _bh_rejects(p: list[float], i: int, q: float = 0.05) -> bool:
    """Benjamini-Hochberg's step-up rule, written out: reject every p at or below k q / m, k the largest rank
    whose sorted p is at most its rank times q / m."""
    m, order = len(p), sorted(p)
    k = max((r for r in range(1, m + 1) if order[r - 1] <= r * q / m), default=0)
    return k > 0 and p[i] <= k * q / m


def test_bh_threshold_is_the_largest_raw_p_that_the_step_up_rule_still_rejects():
    from sinkdlm.experiment.summary import bh_threshold

    rng = np.random.default_rng(1)
    for _ in range(200):
        m = int(rng.integers(2, 30))
        others = list(np.where(rng.random(m - 1) < 0.3, rng.random(m - 1) * 0.01, rng.random(m - 1)))
        t = bh_threshold(others, m)
        assert _bh_rejects(others + [t * (1 - 1e-9)], m - 1)
        assert t == 0.05 or not _bh_rejects(others + [t * (1 + 1e-6)], m - 1)
    assert bh_threshold([0.9] * 22, 23) == pytest.approx(0.05 / 23)  # the only discovery: Bonferroni's level
    assert bh_threshold([1e-6] * 22, 23) == pytest.approx(0.05)  # every other test a discovery: q itself


def test_sizing_states_the_seeds_the_adjusted_test_needs():
    """A difference is stated only after the report's adjustment: the sizing also asks, at the level it must
    clear given the family's other p-values and at Bonferroni's q / m, how many seeds the target needs."""
    from sinkdlm.experiment.report import sizing_note
    from sinkdlm.experiment.summary import TARGET_MDE, seeds_for_mde, study_sizing

    diffs = [-0.30, 0.05, -0.12]
    iv = paired_difference([5.0 + d for d in diffs], [5.0] * 3).to_dict()
    c = {"pair": ["sink1-front", "vanilla"], "metric": "val_loss", **iv, "mde": None}
    others = [{"p": p, "n": 3} for p in (0.0001, 0.0002, 0.3, 0.6)]  # two discoveries: rank 3 of 5 at best
    results = {"variants": {"vanilla": {"seeds": {}}, "sink1-front": {"seeds": {}}},
               "timing": {"compute_s": 3600.0, "compute_parts": ["train"], "runs": 6, "runs_timed": 6},
               "comparisons": [c]}
    results["sizing"] = study_sizing(results, family=[c, *others])
    row = results["sizing"]["pairs"][0]
    sd = float(np.std(diffs, ddof=1))
    assert row["seeds"] == seeds_for_mde(sd, TARGET_MDE)
    adj = row["adjusted"]
    assert adj["family"] == 5
    assert adj["adjusted_now"]["alpha"] == pytest.approx(3 * 0.05 / 5)
    assert adj["adjusted_worst"]["alpha"] == pytest.approx(0.05 / 5)
    assert adj["adjusted_now"]["seeds"] == seeds_for_mde(sd, TARGET_MDE, alpha=0.03)
    assert adj["adjusted_worst"]["seeds"] == seeds_for_mde(sd, TARGET_MDE, alpha=0.01) > row["seeds"]
    note = sizing_note(results)
    assert f"{adj['adjusted_worst']['seeds']:,} seeds" in note and "adjustment over 5 comparisons" in note
    assert study_sizing(results)["pairs"][0].get("adjusted") is None  # no family given: the unadjusted sizing only


def test_sizing_prices_the_declared_rank_test_and_its_power_holds_by_simulation():
    """A preset that declares an exact Wilcoxon primary is decided by that test, not the t test the seeds are
    priced by: the sizing adds its own count (t seeds / ARE, at least the 6 seeds below which an exact test
    cannot reach 5 %), and a simulation of normal differences at the target shows that count has the power."""
    from scipy import stats as st

    from sinkdlm.experiment.report import sizing_note
    from sinkdlm.stats import MDE_POWER
    from sinkdlm.experiment.summary import TARGET_MDE, rank_test_seeds, seeds_for_mde, study_sizing

    assert rank_test_seeds(3, "wilcoxon")["seeds"] == 6  # 2 / 2^5 = 0.0625 > 5 %: 6 seeds at least
    assert rank_test_seeds(3, "wilcoxon", alpha=0.01)["min_seeds"] == 8  # 2 / 2^8 <= 1 % < 2 / 2^7
    assert rank_test_seeds(20, "sign")["seeds"] == math.ceil(20 * math.pi / 2)
    diffs = [-0.09, -0.02, -0.05, -0.08]
    iv = paired_difference([5.0 + d for d in diffs], [5.0] * 4).to_dict()
    results = {"variants": {"vanilla": {"seeds": {}}, "sink1-front": {"seeds": {}}},
               "declared": {"primary": {"pair": ["sink1-front", "vanilla"], "metric": "val_loss", "test": "wilcoxon"}},
               "timing": {"compute_s": 3600.0, "compute_parts": ["train"], "runs": 6, "runs_timed": 6},
               "comparisons": [{"pair": ["sink1-front", "vanilla"], "metric": "val_loss", **iv, "mde": None}]}
    results["sizing"] = study_sizing(results)
    row = results["sizing"]["pairs"][0]
    sd = float(np.std(diffs, ddof=1))
    t_seeds = seeds_for_mde(sd, TARGET_MDE)
    assert row["declared_test"]["seeds"] == max(6, math.ceil(t_seeds * math.pi / 3))
    assert f"the declared exact Wilcoxon signed-rank test needs about {row['declared_test']['seeds']} seeds" in sizing_note(results)
    rng = np.random.default_rng(0)
    n = row["declared_test"]["seeds"]
    d = rng.normal(TARGET_MDE, sd, size=(2000, n))
    power = np.mean([st.wilcoxon(x, method="exact").pvalue < 0.05 for x in d])
    assert power >= MDE_POWER - 0.03  # 2,000 draws: SE of the power about 0.009
