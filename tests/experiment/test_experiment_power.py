"""`mde` (docs/method.md §7): the minimum detectable effect at 80 % power, checked by simulating the paired t test."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from sinkdlm.experiment.summary import comparison_mde, minimum_detectable_effect
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
