"""sinkdlm.stats: paired intervals checked against scipy's t-test and by simulation (false-positive
rate under a null, power under an alternative), plus the refusals of unpaired input."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from sinkdlm.stats import (
    accuracy_interval, benjamini_hochberg, mean_interval, paired_accuracy_difference, paired_difference, signed, verdict,
)

RNG = np.random.default_rng


def test_paired_difference_matches_textbook_t_interval():
    a = [5.61, 5.55, 5.70, 5.58]
    b = [5.49, 5.51, 5.60, 5.47]
    iv = paired_difference(a, b)
    d = np.subtract(a, b)
    half = sps.t.ppf(0.975, 3) * d.std(ddof=1) / math.sqrt(4)
    assert iv.mean == pytest.approx(d.mean())
    assert (iv.low, iv.high) == pytest.approx((d.mean() - half, d.mean() + half))
    assert iv.n == 4 and iv.df == 3
    # the same as scipy's paired t-test: the interval excludes 0 iff p < 0.05
    assert iv.excludes_zero == (sps.ttest_rel(a, b).pvalue < 0.05)


def test_paired_difference_one_seed_is_unbounded_and_never_a_verdict():
    iv = paired_difference([1.0], [0.5])
    assert iv.n == 1 and math.isinf(iv.low) and math.isinf(iv.high) and not iv.excludes_zero
    assert verdict(iv).startswith("inconclusive with 1 seed")


@pytest.mark.slow  # ~5 s of simulation; the interval's formula: test_paired_difference_matches_textbook_t_interval
def test_paired_difference_false_positive_rate_and_power():
    rng = RNG(0)
    reps = 4000
    for n in (2, 3, 5):
        # null: a and b share a seed effect (pairing) and differ only by noise
        shared = rng.normal(0, 1.0, size=(reps, 1))
        a = shared + rng.normal(0, 0.3, size=(reps, n))
        b = shared + rng.normal(0, 0.3, size=(reps, n))
        fpr = np.mean([paired_difference(x, y).excludes_zero for x, y in zip(a, b)])
        assert fpr <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps), (n, fpr)
    # power: a true difference of 2.4 SDs of the paired difference, 5 seeds -> >= 80 % detected
    sd = 0.3 * math.sqrt(2)
    shared = rng.normal(0, 1.0, size=(reps, 1))
    a = shared + rng.normal(0, 0.3, size=(reps, 5)) + 2.4 * sd
    b = shared + rng.normal(0, 0.3, size=(reps, 5))
    power = np.mean([paired_difference(x, y).excludes_zero for x, y in zip(a, b)])
    assert power >= 0.80, power


def _accuracy_runs(rng, seeds, items, tau, shift=0.0):
    """Binary outcomes of two variants: item difficulty shared, a per-(variant, seed) skill offset
    (training noise, sd tau, part of it shared by the seed), and a logit shift for variant a."""
    logit_p = rng.normal(0.0, 1.5, size=items)
    w = rng.normal(0.0, 0.3, size=seeds)
    ua = w + rng.normal(0.0, tau, size=seeds) + shift
    ub = w + rng.normal(0.0, tau, size=seeds)
    pa = 1 / (1 + np.exp(-(logit_p[None] + ua[:, None])))
    pb = 1 / (1 + np.exp(-(logit_p[None] + ub[:, None])))
    return (rng.random((seeds, items)) < pa).astype(float), (rng.random((seeds, items)) < pb).astype(float)


@pytest.mark.parametrize("seeds", [2, 3, 5])
def test_accuracy_difference_false_positive_rate_under_null(seeds):
    rng = RNG(seeds)
    reps = 600
    for tau in (0.0, 0.3):  # items-only noise, and strong training noise
        fpr = np.mean([paired_accuracy_difference(*_accuracy_runs(rng, seeds, 150, tau)).excludes_zero
                       for _ in range(reps)])
        assert fpr <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps), (seeds, tau, fpr)


def test_accuracy_difference_power_at_five_seeds():
    rng = RNG(7)
    # the SD of the per-seed accuracy difference of this design, measured under the null
    diffs = [np.subtract(*(x.mean(1) for x in _accuracy_runs(rng, 5, 150, 0.3))) for _ in range(400)]
    sd = float(np.concatenate(diffs).std())
    # a logit shift whose accuracy gain is about 2.4 SDs (slope of the mean accuracy ~ 0.16 / logit here)
    shift = 0.0
    for _ in range(30):
        gain = np.mean([np.subtract(*(x.mean() for x in _accuracy_runs(rng, 5, 150, 0.0, shift))) for _ in range(50)])
        if gain >= 2.4 * sd:
            break
        shift += 0.05
    power = np.mean([paired_accuracy_difference(*_accuracy_runs(rng, 5, 150, 0.3, shift)).excludes_zero
                     for _ in range(400)])
    assert power >= 0.80, (power, shift, sd)


def test_accuracy_difference_one_seed_is_the_paired_t_over_items():
    rng = RNG(3)
    a = (rng.random(300) < 0.6).astype(float)
    b = (rng.random(300) < 0.5).astype(float)
    iv = paired_accuracy_difference([a], [b])
    d = a - b
    half = sps.t.ppf(0.975, 299) * d.std(ddof=1) / math.sqrt(300)
    assert (iv.low, iv.high) == pytest.approx((d.mean() - half, d.mean() + half))
    assert "inconclusive with 1 seed" in verdict(iv)  # training noise unknown: no verdict


def test_accuracy_difference_reduces_to_seed_t_when_items_agree_within_seed():
    # every item of a seed has the same difference: the item terms vanish, the seed t-test remains
    a = np.array([[1.0] * 10, [1.0] * 10, [0.0] * 10])
    b = np.zeros((3, 10))
    iv = paired_accuracy_difference(a, b)
    ref = paired_difference(a.mean(1), b.mean(1))
    assert (iv.low, iv.high, iv.df) == pytest.approx((ref.low, ref.high, ref.df))


def test_refuses_unpaired_input():
    with pytest.raises(ValueError, match="different seeds"):
        paired_difference({0: 1.0, 1: 2.0}, {0: 1.0, 2: 2.0})
    with pytest.raises(ValueError, match="different shapes"):
        paired_difference([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="different shapes"):
        paired_accuracy_difference([[1, 0, 1]], [[1, 0]])  # different items
    with pytest.raises(ValueError, match="finite"):
        paired_difference([1.0, float("nan")], [1.0, 2.0])
    with pytest.raises(ValueError, match="confidence"):
        paired_difference([1.0, 2.0], [1.0, 2.0], confidence=95)


def test_verdict_sentences():
    lower = paired_difference([1.0, 1.1, 0.9, 1.0, 1.05], [2.0, 2.1, 1.95, 2.05, 2.0])
    assert verdict(lower, lower_is_better=True).startswith("lower (better) by 1")
    same = paired_difference([1.0, 2.0, 3.0], [1.5, 1.5, 2.9])
    assert verdict(same).startswith("inconclusive with 3 seeds")
    assert mean_interval([1.0, 2.0, 3.0]).mean == pytest.approx(2.0)


def test_accuracy_interval_one_seed_is_the_t_interval_over_items():
    outcomes = RNG(3).integers(0, 2, size=(1, 120)).astype(float)
    iv = accuracy_interval(outcomes)
    half = sps.t.ppf(0.975, 119) * outcomes[0].std(ddof=1) / math.sqrt(120)
    assert (iv.mean, iv.low, iv.high) == pytest.approx((outcomes.mean(), outcomes.mean() - half, outcomes.mean() + half))
    assert accuracy_interval({0: outcomes[0].tolist()}).mean == pytest.approx(outcomes.mean())


@pytest.mark.parametrize("seeds", [2, 5])
def test_accuracy_interval_says_above_chance_at_most_5_percent_of_the_time_at_chance(seeds):
    """Items of varying difficulty (Beta, mean = chance), models that differ a little by seed: a
    model at chance is called 'above chance' (CI low end > chance) at most ~5 % of the time, while
    the seed-only interval (what a mean over seeds gives) is fooled far more often: the items are
    shared by every seed, so their noise does not average away."""
    rng, reps, items, chance = RNG(7), 600, 150, 0.25
    above = above_seed_only = 0
    for _ in range(reps):
        p_item = rng.beta(0.5, 1.5, size=items)  # mean 0.25; items mostly known or unknown
        shift = rng.normal(0, 0.005, size=(seeds, 1))  # seeds barely differ
        outcomes = (rng.random((seeds, items)) < np.clip(p_item + shift, 0, 1)).astype(float)
        above += accuracy_interval(outcomes).low > chance
        above_seed_only += mean_interval(outcomes.mean(1).tolist()).low > chance
    assert above / reps <= 0.05 + 0.02
    if seeds == 5:
        assert above_seed_only / reps > 0.07  # (10.7 % measured) the seed-only interval misses the shared item noise


def test_zero_variance_is_no_evidence_accuracy_case():
    """Issue 22's example: 2 seeds whose mean differences tie, item mean square <= error mean square:
    the two-way variance is 0. That used to give [m, m] and the verdict "higher"."""
    a, b = np.zeros((2, 300)), np.zeros((2, 300))
    a[0, 0] = a[1, 1] = 1
    d = a - b
    row, col = d.mean(1), d.mean(0)
    ms_s = 300 * ((row - d.mean()) ** 2).sum() / 1
    ms_i = 2 * ((col - d.mean()) ** 2).sum() / 299
    ms_e = ((d - row[:, None] - col[None] + d.mean()) ** 2).sum() / 299
    assert ms_s == 0 and ms_i <= ms_e  # the reference: the variance estimate (ms_s + max(ms_i - ms_e, 0)) is 0
    iv = paired_accuracy_difference(a, b)
    assert iv.degenerate and not iv.excludes_zero and iv.p is None
    assert iv.to_dict()["low"] is None and iv.to_dict()["high"] is None
    assert verdict(iv, scale=100, unit=" points").startswith("inconclusive (no variance estimate)")


def test_zero_variance_is_no_evidence_scalar_case():
    iv = paired_difference([1.5, 2.5, 3.5], [1.0, 2.0, 3.0])  # every per-seed difference is 0.5
    assert iv.mean == pytest.approx(0.5) and iv.degenerate and not iv.excludes_zero
    assert verdict(iv).startswith("inconclusive (no variance estimate)")
    assert mean_interval([0.0, 0.0, 0.0]).degenerate  # a metric that cannot vary (cloze exact match = 0)


def test_p_value_is_the_t_test_of_the_interval():
    a, b = [5.61, 5.55, 5.70, 5.58], [5.49, 5.51, 5.60, 5.47]
    iv = paired_difference(a, b)
    assert iv.p == pytest.approx(sps.ttest_rel(a, b).pvalue)
    # the interval at confidence 1 - p just touches zero
    assert paired_difference(a, b, confidence=1 - iv.p).low == pytest.approx(0.0, abs=1e-12)
    rng = RNG(1)
    x, y = (rng.random((3, 80)) < 0.6).astype(float), (rng.random((3, 80)) < 0.5).astype(float)
    acc = paired_accuracy_difference(x, y)
    assert paired_accuracy_difference(x, y, confidence=1 - acc.p).low == pytest.approx(0.0, abs=1e-12) or \
        paired_accuracy_difference(x, y, confidence=1 - acc.p).high == pytest.approx(0.0, abs=1e-12)


def test_benjamini_hochberg_matches_the_step_up_rule():
    rng = RNG(2)
    for m in (1, 5, 40):
        ps = rng.random(m) ** 3
        adj = benjamini_hochberg(ps)
        # reference: p_(k) * m / k, then the running minimum from the largest p down, capped at 1
        order = np.argsort(ps)
        ref = np.minimum.accumulate((ps[order] * m / np.arange(1, m + 1))[::-1])[::-1].clip(max=1)
        expected = np.empty(m)
        expected[order] = ref
        assert adj == pytest.approx(expected.tolist())
    assert benjamini_hochberg([]) == []
    with pytest.raises(ValueError):
        benjamini_hochberg([0.5, float("nan")])


def test_verdict_needs_the_adjusted_p_when_given():
    iv = paired_difference([1.0, 1.1, 0.9, 1.0, 1.05], [2.0, 2.1, 1.95, 2.05, 2.0])
    assert verdict(iv, lower_is_better=None, p_adjusted=0.01).startswith("lower by 1.01")
    assert "BH-adjusted p = 0.01" in verdict(iv, p_adjusted=0.01)
    assert verdict(iv, p_adjusted=0.2).startswith("inconclusive after the multiplicity adjustment")


def test_signed_never_prints_minus_zero():
    assert signed(-0.0004, 1) == "-0.0004"  # widened until the bound is visibly below zero
    assert signed(-0.0, 1) == "+0.0" and signed(0.0) == "+0"
    assert signed(-0.083, 1) == "-0.1" and signed(-0.00001, 1) == "+0.0000"  # beyond 3 more digits: 0, not -0


@pytest.mark.parametrize("centre", [0.003, pytest.param(0.997, marks=pytest.mark.slow)])  # 0.997: the mirror
def test_share_intervals_stay_in_bounds_near_0_and_1(centre):
    rng = RNG(5)
    reps, inside_plain, covered, covered_plain = 2000, 0, 0, 0
    true = float(np.clip(rng.normal(centre, 0.004, size=1_000_000), 0, 1).mean())  # the shares' true mean
    for _ in range(reps):
        vals = np.clip(rng.normal(centre, 0.004, size=5), 0, 1).tolist()
        iv, plain = mean_interval(vals, bounds=(0, 1)), mean_interval(vals)
        if len(set(vals)) == 1:  # every seed at the bound: no variance estimate, no bounds at all
            assert iv.degenerate and plain.degenerate
            continue
        assert 0.0 <= iv.low <= iv.mean <= iv.high <= 1.0
        inside_plain += 0 <= plain.low and plain.high <= 1
        covered += iv.low <= true <= iv.high
        covered_plain += plain.low <= true <= plain.high
    assert inside_plain < reps  # the plain t interval does leave [0, 1] here
    assert covered == covered_plain  # intersecting with [0, 1] never loses coverage
    with pytest.raises(ValueError, match="outside the bounds"):
        mean_interval([0.5, 1.2], bounds=(0, 1))


def test_equal_differences_with_rounding_noise_are_degenerate():
    """[0.1, 0.1, 0.1] - 0 has a float variance of ~1e-33, not 0: still no variance estimate."""
    iv = paired_difference([0.1, 0.1, 0.1], [0.0, 0.0, 0.0])
    assert iv.degenerate and not iv.excludes_zero
    iv = paired_difference([0.3, 0.7, 0.2], [0.2, 0.6, 0.1])  # 0.3-0.2 != 0.7-0.6 in the last bits
    assert iv.degenerate
    assert not paired_difference([0.1, 0.1, 0.1 + 1e-9], [0.0, 0.0, 0.0]).degenerate


def test_accuracy_interval_stays_in_0_1():
    """Few seeds and items near 100 % give a t interval past 1; an accuracy's interval is clipped to [0, 1]."""
    from sinkdlm.stats import accuracy_interval

    hi = accuracy_interval([[1] * 19 + [0], [1] * 20, [1] * 18 + [0, 0]])
    lo = accuracy_interval([[0] * 19 + [1], [0] * 20, [0] * 18 + [1, 1]])
    assert 0.0 <= hi.low <= hi.mean <= hi.high <= 1.0 and hi.high == 1.0
    assert 0.0 == lo.low <= lo.mean <= lo.high <= 1.0


# ----------------------------------------------------------------------------- rank tests and TOST
def test_wilcoxon_against_sign_flip_enumeration_and_the_walsh_median():
    import itertools

    from sinkdlm.stats import rank_test

    d = np.array([0.31, -0.12, 0.45, 0.08, 0.27, -0.05, 0.6])
    r = rank_test(d, "wilcoxon")
    ranks = np.argsort(np.argsort(np.abs(d))) + 1
    t_obs = ranks[d > 0].sum()
    flips = [sum(r_ for r_, s in zip(ranks, signs) if s) for signs in itertools.product([0, 1], repeat=len(d))]
    p_ref = min(1.0, 2 * min(np.mean([f >= t_obs for f in flips]), np.mean([f <= t_obs for f in flips])))
    assert r["p"] == pytest.approx(p_ref)
    walsh = sorted((d[i] + d[j]) / 2 for i in range(len(d)) for j in range(i, len(d)))
    assert r["estimate"] == pytest.approx(float(np.median(walsh)))
    assert r["min_p"] == pytest.approx(2 / 2**7)


def test_hodges_lehmann_interval_uses_the_tabled_critical_values():
    from sinkdlm.stats import rank_test

    d = np.random.default_rng(3).normal(0.2, 1.0, size=10)
    walsh = sorted((d[i] + d[j]) / 2 for i in range(10) for j in range(i, 10))
    r = rank_test(d, "wilcoxon")  # n = 10, two-sided 5 %: critical T = 8 (tables), so [W_(9), W_(47)]
    assert (r["low"], r["high"]) == (pytest.approx(walsh[8]), pytest.approx(walsh[46]))
    s = rank_test(d, "sign")  # P(B <= 1) = 11/1024 <= 0.025 < P(B <= 2): [x_(2), x_(9)]
    assert (s["low"], s["high"]) == (pytest.approx(sorted(d)[1]), pytest.approx(sorted(d)[8]))
    five = rank_test([0.1, 0.2, 0.3, 0.4, 0.5], "wilcoxon")  # 5 seeds cannot reach 95 %: no interval, said so
    assert five["low"] is None and five["min_p"] == pytest.approx(1 / 16) and five["p"] == pytest.approx(1 / 16)


def test_rank_intervals_state_their_exact_coverage():
    """A discrete test's interval covers with more than its nominal level: 6 differences, Wilcoxon, the 95 %
    interval is [W_(1), W_(21)] = the range of the differences, whose exact coverage is 1 - 2 P(T+ = 0) = 1 - 2/64;
    the sign test's [x_(k), x_(n+1-k)] covers 1 - 2 P(B <= k - 1), counted here by enumerating sign patterns."""
    import itertools

    from sinkdlm.stats import rank_test, sign_interval_rank

    d = [-0.075, -0.114, -0.069, -0.073, -0.074, -0.106]
    r = rank_test(d, "wilcoxon")
    assert (r["low"], r["high"]) == (pytest.approx(min(d)), pytest.approx(max(d)))
    assert r["exact_confidence"] == pytest.approx(1 - 2 / 64)
    for n in (6, 9, 12, 20):
        k, exact = sign_interval_rank(n)
        # P(at most k - 1 of n fair signs are +), by enumeration
        tail = sum(sum(s) <= k - 1 for s in itertools.product([0, 1], repeat=n)) / 2**n if n <= 12 else None
        if tail is not None:
            assert exact == pytest.approx(1 - 2 * tail)
        assert exact >= 0.95 and rank_test(np.arange(1, n + 1) - 0.5 * n - 0.25, "sign")["exact_confidence"] == pytest.approx(exact)
    assert sign_interval_rank(5) == (0, 0.0) and rank_test([0.1] * 5, "sign")["exact_confidence"] is None


def test_tost_matches_the_formula_and_holds_its_level_at_the_margin():
    from scipy import stats as st

    from sinkdlm.stats import equivalence_test

    d = np.array([0.01, -0.02, 0.015, 0.0, 0.03])
    m, se = d.mean(), d.std(ddof=1) / np.sqrt(5)
    want = max(st.t.sf((m + 0.05) / se, 4), st.t.cdf((m - 0.05) / se, 4))
    assert equivalence_test(d, 0.05)["p"] == pytest.approx(want)
    assert equivalence_test([0.02, 0.02, 0.02], 0.05)["p"] is None  # no variance estimate: no test
    rng = np.random.default_rng(0)  # true difference exactly at the margin: "equivalent" at most 5 % of the time
    hits = [equivalence_test(rng.normal(0.05, 0.03, size=6), 0.05)["p"] < 0.05 for _ in range(4000)]
    assert np.mean(hits) < 0.05 + 3 * np.sqrt(0.05 * 0.95 / 4000)
