"""The variance split of a paired val_loss difference (experiment/variance.py) against its formula and by simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from sinkdlm.experiment.summary import seeds_for_mde
from sinkdlm.experiment.variance import variance_split


def _study(rng, seeds: int, n: int, d: int, sd_train: float, tau: float, effect: float = 0.1):
    """Values [N, D] per seed for two variants: a shared per-(sequence, draw) part (the fixed noise, which
    cancels in a - b), a per-seed training difference ~ N(effect, sd_train²), and independent draw noise τ."""
    a, b = {}, {}
    base = rng.normal(5.0, 1.0, (n, d)) + np.linspace(1.0, -1.0, d)  # strata differ in level
    for s in range(seeds):
        delta = rng.normal(effect, sd_train)
        a[str(s)] = base + delta + rng.normal(0, tau, (n, d))
        b[str(s)] = base + rng.normal(0, tau, (n, d))
    return a, b


def test_split_matches_its_formula_written_out():
    rng = np.random.default_rng(0)
    a, b = _study(rng, seeds=4, n=6, d=8, sd_train=0.2, tau=0.5)
    got = variance_split(a, b, full_sequences=24)
    diffs = np.array([(a[s] - b[s]).mean() for s in sorted(a)])

    def se(v):  # the collapsed-strata standard error, written out: pairs of neighbouring strata
        n, d = v.shape
        return math.sqrt(sum(((v[i, 2 * k] - v[i, 2 * k + 1]) ** 2) / d**2 for i in range(n) for k in range(d // 2))) / n

    var_val = np.mean([se(a[s] - b[s]) ** 2 for s in sorted(a)])
    var_total = diffs.var(ddof=1)
    assert got["per_seed"] == pytest.approx(dict(zip(sorted(a), diffs)))
    assert got["difference"]["mean"] == pytest.approx(diffs.mean())
    half = st.t.ppf(0.975, 3) * diffs.std(ddof=1) / 2
    assert [got["difference"]["low"], got["difference"]["high"]] == pytest.approx([diffs.mean() - half, diffs.mean() + half])
    assert got["var_total"] == pytest.approx(var_total)
    assert got["var_validation"] == pytest.approx(var_val)
    assert got["var_train"] == pytest.approx(max(var_total - var_val, 0))
    lo, hi = 3 * var_total / st.chi2.ppf(0.975, 3), 3 * var_total / st.chi2.ppf(0.025, 3)
    assert got["var_total_interval"] == pytest.approx([lo, hi])
    assert got["sd_train_interval"] == pytest.approx([math.sqrt(max(lo - var_val, 0)), math.sqrt(max(hi - var_val, 0))])
    # projected to the whole set: the noise term shrinks with the sequences scored (6 of 24)
    sd_full = math.sqrt(max(var_total - var_val, 0) + var_val * 6 / 24)
    assert got["sd_full"] == pytest.approx(sd_full)
    assert got["seeds_for_target"] == seeds_for_mde(sd_full, 0.05)


@pytest.mark.slow  # ~15 s of simulation; make test-slow
def test_training_variance_is_recovered_and_the_interval_covers():
    """Over simulated studies the training component is unbiased and the chi-square interval of the
    total variance covers it about 95 % of the time."""
    rng = np.random.default_rng(1)
    sd_train, tau, n, d, seeds = 0.05, 0.6, 8, 8, 5
    noise_var = 2 * tau**2 / (n * d)  # Var of a seed's mean difference from the draws (0.0113, 4.5x the training part)
    var_train, covered, var_val = [], 0, []
    for _ in range(800):
        a, b = _study(rng, seeds, n, d, sd_train, tau)
        sp = variance_split(a, b)
        var_train.append(sp["var_total"] - sp["var_validation"])  # untruncated, to test unbiasedness
        var_val.append(sp["var_validation"])
        lo, hi = sp["var_total_interval"]
        covered += lo <= sd_train**2 + noise_var <= hi
    assert np.mean(var_val) == pytest.approx(noise_var, rel=0.03)
    # the training part is a small difference of two noisy terms: its mean is within 4 standard errors
    assert abs(np.mean(var_train) - sd_train**2) < 4 * np.std(var_train) / math.sqrt(len(var_train))
    assert 0.925 <= covered / 800 <= 0.975  # ±3.2 binomial SE around 0.95


def test_one_seed_gives_no_split_and_mismatched_runs_are_errors():
    rng = np.random.default_rng(2)
    a, b = _study(rng, seeds=1, n=4, d=4, sd_train=0.1, tau=0.3)
    sp = variance_split(a, b)
    assert sp["difference"]["low"] is None and "var_total" not in sp
    with pytest.raises(ValueError, match="same seeds"):
        variance_split(a, {"7": b["0"]})
    with pytest.raises(ValueError, match="one shape"):
        variance_split(a, {"0": b["0"][:2]})

