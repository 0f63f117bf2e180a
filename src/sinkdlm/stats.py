"""Paired comparisons with confidence intervals: the one place every reported verdict comes from.

Two variants of an experiment share their seeds (the same data order and masking noise for a
seed) and are scored on the same evaluation items, so every comparison is *paired*:

* `paired_difference(a, b)` — one scalar per seed and variant (e.g. the validation loss):
  Student t on the per-seed differences `d_s = a_s - b_s` with n - 1 degrees of freedom
  (docs/method.md, "Statistics"). With 2 seeds the interval is wide (t_{0.975, 1} = 12.7): that is the honest
  answer, not a defect.
* `paired_accuracy_difference(a, b)` — per-item correctness `[seeds][items]` of two variants on
  the same items. The mean difference `D = mean_{s,i} d_si` has two sources of noise: which
  models training produced (seeds) and which items were drawn. With `d_si = mu + alpha_s + beta_i
  + e_si` (two-way random effects, no replication), the ANOVA mean squares give an unbiased
  estimate of Var(D) = s²_seed/S + s²_item/I + s²_e/(SI); the interval is D ± t_{S-1} sqrt(Var(D))
  (the seed term's degrees of freedom: conservative, see the comment in the code). This is the analytic counterpart of
  a two-stage bootstrap over seeds and items, but it stays valid with 2-3 seeds, where a
  bootstrap over seeds understates the seed variance (it can resample only 2 models). With one
  seed it reduces to the paired test over items.

Both return an `Interval` with the two-sided p-value of the same t model (so an interval excludes 0
exactly when p < 1 - confidence). A variance estimate of exactly 0 (every per-seed difference
equal, or the two-way mean squares cancelling) makes a zero-width interval that is no evidence at
all: such an interval is `degenerate`, has no bounds and never carries a verdict.

`verdict()` turns an interval into the sentence the reports print: a direction only when the
interval excludes zero and, when the report passes a multiplicity-adjusted p-value, only when that
survives too; otherwise "inconclusive". `benjamini_hochberg` adjusts a report's family of p-values
(docs/method.md §7, "Multiplicity"). `mean_interval(..., bounds=(0, 1))` keeps the interval of a
share inside [0, 1]. The false-positive rate under a simulated null and the power are checked by
simulation in tests/test_stats.py.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats as _scipy_stats


@dataclass(frozen=True)
class Interval:
    """Mean difference `a - b` with its two-sided confidence interval [low, high]."""

    mean: float
    low: float
    high: float
    n: int  # seeds (paired over seeds) — the number a reader needs to judge the interval
    confidence: float
    method: str
    df: float | None = None
    items: int | None = None  # items per seed (accuracy comparisons)
    p: float | None = None  # two-sided p of "mean = 0" under the same t model; None: no test possible
    degenerate: bool = False  # the variance estimate is 0: no bounds, no verdict

    @property
    def excludes_zero(self) -> bool:
        return (not self.degenerate and (self.low > 0 or self.high < 0)
                and math.isfinite(self.low) and math.isfinite(self.high))

    def to_dict(self) -> dict:
        def clean(x):
            return None if x is None or not math.isfinite(x) else float(x)

        return {"mean": clean(self.mean), "low": clean(self.low), "high": clean(self.high), "n": self.n,
                "confidence": self.confidence, "method": self.method, "df": clean(self.df), "items": self.items,
                "p": clean(self.p), "degenerate": self.degenerate, "excludes_zero": self.excludes_zero}


def _t_interval(mean: float, var: float, df: float, n: int, confidence: float, method: str,
                items: int | None = None) -> Interval:
    """mean ± t_{df} sqrt(var), with its p-value; a variance of 0 is degenerate (no bounds, no p)."""
    if not var > 0:  # every difference equal (or the mean squares cancel): a zero-width interval is no evidence
        return Interval(mean, math.nan, math.nan, n, confidence, method, df, items, None, True)
    se = math.sqrt(var)
    half = float(_scipy_stats.t.ppf(0.5 + confidence / 2, df)) * se
    p = float(2 * _scipy_stats.t.sf(abs(mean) / se, df))
    return Interval(mean, mean - half, mean + half, n, confidence, method, df, items, p)


def _check_confidence(confidence: float) -> float:
    if not isinstance(confidence, (int, float)) or isinstance(confidence, bool) or not 0.5 <= confidence < 1.0:
        raise ValueError(f"confidence must be a number in [0.5, 1), e.g. 0.95; got {confidence!r}")
    return float(confidence)


def _paired_arrays(a, b, what: str) -> tuple[np.ndarray, np.ndarray, list | None]:
    """Align two per-seed collections. Mappings are keyed by seed and must hold the same seeds."""
    seeds = None
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        if not (isinstance(a, Mapping) and isinstance(b, Mapping)):
            raise ValueError(f"{what}: pass both variants as {{seed: value}} mappings or both as sequences")
        if set(a) != set(b):
            raise ValueError(
                f"{what}: the variants were run on different seeds ({sorted(a, key=str)} vs {sorted(b, key=str)}); "
                "a paired comparison needs the same seeds — rerun the missing seeds or compare the common ones"
            )
        seeds = sorted(a, key=str)
        a, b = [a[s] for s in seeds], [b[s] for s in seeds]
    try:
        a_arr, b_arr = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{what}: values must be numbers ({err})") from err
    if a_arr.shape != b_arr.shape:
        raise ValueError(
            f"{what}: the variants have different shapes {a_arr.shape} vs {b_arr.shape}; a paired comparison "
            "needs the same seeds (and the same items) for both"
        )
    if a_arr.size == 0:
        raise ValueError(f"{what}: nothing to compare (no seeds)")
    if not (np.isfinite(a_arr).all() and np.isfinite(b_arr).all()):
        raise ValueError(f"{what}: values must be finite (got NaN or inf); a run probably failed")
    return a_arr, b_arr, seeds


def paired_difference(a, b, confidence: float = 0.95) -> Interval:
    """Per-seed scalars of two variants on the same seeds -> Interval of mean(a - b).

    `a`, `b`: sequences in the same seed order, or `{seed: value}` mappings (the seeds are checked).
    Student t on the paired differences with n - 1 degrees of freedom; n = 1 gives an unbounded
    interval (no verdict is possible from one seed).
    """
    confidence = _check_confidence(confidence)
    a_arr, b_arr, _ = _paired_arrays(a, b, "paired_difference")
    if a_arr.ndim != 1:
        raise ValueError(f"paired_difference takes one scalar per seed, got shape {a_arr.shape}")
    d = a_arr - b_arr
    n = len(d)
    mean = float(d.mean())
    if n < 2:
        return Interval(mean, -math.inf, math.inf, n, confidence, "paired t over seeds", None)
    # Equal differences computed in floating point (0.1 - 0 three times) leave a variance of rounding
    # noise (~1e-33), not 0: within a few ulps of the values it is no variance estimate either.
    var = float(d.var(ddof=1)) if np.ptp(d) > 8 * np.finfo(float).eps * max(1.0, float(np.abs(d).max())) else 0.0
    return _t_interval(mean, var / n, float(n - 1), n, confidence, "paired t over seeds")


def paired_accuracy_difference(a, b, confidence: float = 0.95) -> Interval:
    """Per-item correctness `[seeds][items]` of two variants on the same items -> Interval of the
    accuracy difference mean(a) - mean(b) (a fraction; multiply by 100 for points).

    `a`, `b`: nested sequences / arrays `[S, I]`, or `{seed: [items]}` mappings. Paired over seeds
    and items; two-way random-effects variance, t with S - 1 degrees of freedom (module doc).
    """
    confidence = _check_confidence(confidence)
    a_arr, b_arr, _ = _paired_arrays(a, b, "paired_accuracy_difference")
    if a_arr.ndim == 1:
        a_arr, b_arr = a_arr[None], b_arr[None]
    if a_arr.ndim != 2:
        raise ValueError(f"paired_accuracy_difference takes [seeds][items] outcomes, got shape {a_arr.shape}")
    d = a_arr - b_arr  # [S, I]
    s_n, i_n = d.shape
    mean = float(d.mean())
    method = "paired over seeds and items (two-way random effects, t with S - 1 df)"
    if i_n < 2:
        return paired_difference(a_arr[:, 0], b_arr[:, 0], confidence)
    if s_n == 1:  # paired t over items
        var = float(d[0].var(ddof=1)) / i_n
        df = float(i_n - 1)
        method = "paired t over items (one seed: training noise not estimated)"
    else:
        row, col = d.mean(1), d.mean(0)
        ms_s = i_n * float(((row - mean) ** 2).sum()) / (s_n - 1)
        ms_i = s_n * float(((col - mean) ** 2).sum()) / (i_n - 1)
        resid = d - row[:, None] - col[None, :] + mean
        ms_e = float((resid ** 2).sum()) / ((s_n - 1) * (i_n - 1))
        # E[ms_s] = s2_e + I s2_seed, E[ms_i] = s2_e + S s2_item, E[ms_e] = s2_e, so
        # Var(D) = s2_seed/S + s2_item/I + s2_e/(SI) = (ms_s + ms_i - ms_e) / (SI); the item term
        # (ms_i - ms_e) is clipped at 0. Degrees of freedom: those of the seed term, S - 1.
        # Satterthwaite's df would be larger, but with 1-4 df in the seed term it breaks down (a
        # small ms_s by chance inflates the df and the false-positive rate: 12 % at 2 seeds in
        # our simulation); S - 1 keeps the rate at or below 1 - confidence.
        var = (ms_s + max(ms_i - ms_e, 0.0)) / (s_n * i_n)
        df = float(s_n - 1)
    return _t_interval(mean, var, df, s_n, confidence, method, i_n)


def signed(x: float, digits: int | None = None) -> str:
    """`x` with its sign, never "-0": 3 significant digits, or `digits` decimals widened (up to 3 more)
    until a non-zero `x` no longer rounds to 0 (a bound of -0.001 must not print as -0.0)."""
    if digits is None:
        text = f"{x:+.3g}"
    else:
        d = digits
        while x != 0 and round(x, d) == 0 and d < digits + 3:
            d += 1
        text = f"{x:+.{d}f}"
    return text.replace("-", "+", 1) if float(text) == 0 and text.startswith("-") else text


def verdict(interval: Interval, *, lower_is_better: bool | None = False, scale: float = 1.0, unit: str = "",
            p_adjusted: float | None = None) -> str:
    """The sentence reports print: "lower (95 % CI [low, high])" only when the interval excludes 0
    (and there are at least 2 seeds, and a variance estimate); otherwise "inconclusive ...".

    `p_adjusted`: the interval's p-value after the report's multiplicity adjustment
    (`benjamini_hochberg`); when given, a direction is stated only if it is below 1 - confidence
    too. `lower_is_better` adds "(better)"/"(worse)"; None for a metric with no good direction.
    `scale`/`unit` format the numbers (e.g. 100 and " points" for accuracies).
    """
    pct = f"{100 * interval.confidence:g} %"
    delta = f"Δ = {signed(scale * interval.mean)}{unit}"
    ci = f"{pct} CI [{signed(scale * interval.low)}, {signed(scale * interval.high)}]"
    if interval.n < 2:
        # One seed says nothing about training noise: never a verdict, whatever the items say.
        more = f" ({delta}, {ci})" if math.isfinite(interval.low) else ""
        return f"inconclusive with 1 seed{more}"
    if interval.degenerate:
        return f"inconclusive (no variance estimate) ({delta}, every seed alike: a zero-width interval is no evidence)"
    if not interval.excludes_zero:
        return f"inconclusive with {interval.n} seeds: no difference detected ({delta}, {ci})"
    if p_adjusted is not None and not p_adjusted < 1 - interval.confidence:
        return (f"inconclusive after the multiplicity adjustment ({delta}, {ci} excludes 0, "
                f"but the BH-adjusted p = {p_adjusted:.2g})")
    direction = "higher" if interval.mean > 0 else "lower"
    if lower_is_better is not None:
        direction += " (better)" if (interval.mean < 0) == lower_is_better else " (worse)"
    adj = "" if p_adjusted is None else f", BH-adjusted p = {p_adjusted:.2g}"
    return f"{direction} by {abs(scale * interval.mean):.3g}{unit} ({ci}{adj})"


def benjamini_hochberg(pvalues: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (step-up, in the input order): a comparison survives at
    level q when its adjusted p is below q, which controls the false discovery rate of the family at q
    (and, when nothing differs at all, the chance of any verdict at q). docs/method.md §7."""
    ps = np.asarray(list(pvalues), dtype=np.float64)
    if ps.size == 0:
        return []
    if not (np.isfinite(ps).all() and ((ps >= 0) & (ps <= 1)).all()):
        raise ValueError(f"p-values must be numbers in [0, 1], got {ps.tolist()}")
    return [float(x) for x in _scipy_stats.false_discovery_control(ps, method="bh")]


def accuracy_interval(outcomes, confidence: float = 0.95) -> Interval:
    """Interval of one variant's accuracy from its per-item correctness `[seeds][items]` (or
    `{seed: [items]}`): the two-way random-effects interval of `paired_accuracy_difference` against a
    variant that is always wrong, so it counts both which items were drawn and which models training
    produced. This, not the spread over seeds alone, says whether an accuracy is above chance: every
    seed is scored on the same items, so the item noise is shared and seeds cannot average it away."""
    if isinstance(outcomes, Mapping):
        zeros = {k: [0.0] * len(v) for k, v in outcomes.items()}
    else:
        zeros = np.zeros_like(np.asarray(outcomes, dtype=float))
    iv = paired_accuracy_difference(outcomes, zeros, confidence)
    if iv.degenerate or not (math.isfinite(iv.low) and math.isfinite(iv.high)):
        return iv
    # An accuracy lies in [0, 1]: the interval is intersected with it (coverage unchanged, as for shares
    # in `mean_interval`), so no bound reads 106 % or -5.8 %.
    return replace(iv, low=min(max(iv.low, 0.0), 1.0), high=max(min(iv.high, 1.0), 0.0))


def mean_interval(values: Sequence[float], confidence: float = 0.95, bounds: tuple[float, float] | None = None) -> Interval:
    """Student-t interval of a mean over seeds (e.g. one variant's metric): `paired_difference(v, 0)`.

    `bounds=(0, 1)` for a share (attention share, Jaccard, change rate): the interval is intersected
    with the range. The true mean lies in the range, so the intersection covers it whenever the t
    interval does: the coverage is unchanged and no bound reads -0.4 % or 1.045."""
    values = list(values)
    iv = paired_difference(values, [0.0] * len(values), confidence)
    if bounds is None or iv.degenerate or not (math.isfinite(iv.low) and math.isfinite(iv.high)):
        return iv  # one seed: no interval, not the whole range [lo, hi] (docs/method.md §7)
    lo, hi = bounds
    if any(v < lo or v > hi for v in values):
        raise ValueError(f"mean_interval: values outside the bounds {bounds}: {values}")
    return replace(iv, low=min(max(iv.low, lo), hi), high=max(min(iv.high, hi), lo))


def _signed_rank_null(n: int) -> np.ndarray:
    """P(T+ = t), t = 0..n(n+1)/2, for the Wilcoxon signed-rank statistic of n untied differences under
    the null (each rank's sign a fair coin): the exact distribution, by counting subsets of {1..n}."""
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1.0
    for r in range(1, n + 1):
        counts[r:] = counts[r:] + counts[:-r].copy()
    return counts / 2.0**n


def sign_interval_rank(n: int, confidence: float = 0.95) -> tuple[int, float]:
    """(k, exact coverage) of the sign test's order-statistic interval [d_(k), d_(n+1-k)] for the median of n
    values: k - 1 the largest c with P(Binom(n, 1/2) <= c) <= (1 - confidence) / 2, and the interval's exact
    coverage 1 - 2 P(Binom(n, 1/2) <= k - 1) (at least `confidence`; k = 0: no such interval, coverage 0)."""
    cdf = _scipy_stats.binom.cdf(np.arange(n + 1), n, 0.5)  # P(B <= c)
    ok = np.nonzero(cdf <= (1 - confidence) / 2)[0]
    k = int(ok[-1]) + 1 if ok.size else 0
    return k, float(1 - 2 * cdf[k - 1]) if k else 0.0


def rank_test(d: Sequence[float], test: str = "wilcoxon", confidence: float = 0.95) -> dict:
    """A test of the paired differences `d` that their tails cannot fool, beside the t interval:

    * `wilcoxon`: the exact signed-rank test of symmetry about 0 (scipy), with the Hodges-Lehmann estimate
      (the median of the n(n+1)/2 Walsh averages (d_i + d_j) / 2, i <= j) and its exact interval
      [W_(k), W_(M+1-k)], k - 1 the largest c with P(T+ <= c) <= (1 - confidence) / 2;
    * `sign`: the exact binomial test of P(d > 0) = 1/2, with the median and its order-statistic interval.

    With few seeds no interval reaches the confidence (5 untied differences: the smallest two-sided p of
    either test is 1/16): then `low`/`high` are None and `min_p` says why. Zeros are dropped (Wilcoxon's rule).
    The test is discrete, so the interval covers with more than `confidence`: `exact_confidence` is its exact
    coverage (6 differences, Wilcoxon: [W_(1), W_(21)], the range of the differences, 1 - 2/64 = 96.9 %).
    """
    confidence = _check_confidence(confidence)
    if test not in ("wilcoxon", "sign"):
        raise ValueError(f"rank_test: test must be 'wilcoxon' or 'sign', got {test!r}")
    x = np.asarray(list(d), dtype=np.float64)
    x = x[x != 0]
    n = len(x)
    alpha = 1 - confidence
    if n == 0:
        return {"test": test, "n": 0, "estimate": 0.0, "low": None, "high": None, "p": None, "min_p": None}
    if test == "wilcoxon":
        i, j = np.triu_indices(n)
        walsh = np.sort((x[i] + x[j]) / 2)
        cdf = np.cumsum(_signed_rank_null(n))
        ok = np.nonzero(cdf <= alpha / 2)[0]
        k = int(ok[-1]) + 1 if ok.size else 0  # W_(k), 1-based: c = k - 1
        low, high = (float(walsh[k - 1]), float(walsh[len(walsh) - k])) if k else (None, None)
        exact = float(1 - 2 * cdf[k - 1]) if k else None  # P(T+ <= k - 1) in each tail
        p = float(_scipy_stats.wilcoxon(x, method="exact").pvalue) if n >= 1 else None
        estimate, min_p = float(np.median(walsh)), float(min(1.0, 2 * cdf[0]))
    else:
        s = np.sort(x)
        k, exact = sign_interval_rank(n, confidence)
        low, high = (float(s[k - 1]), float(s[n - k])) if k else (None, None)
        exact = exact if k else None
        p = float(_scipy_stats.binomtest(int((x > 0).sum()), n, 0.5).pvalue)
        estimate, min_p = float(np.median(s)), float(min(1.0, 2 * 0.5 ** n))
    return {"test": test, "n": n, "estimate": estimate, "low": low, "high": high, "p": p, "min_p": min_p,
            "confidence": confidence, "exact_confidence": exact}


def equivalence_test(d: Sequence[float], margin: float, confidence: float = 0.95) -> dict:
    """TOST (two one-sided paired t tests) of |mean(d)| < `margin`: p = max(p of mean <= -margin, p of
    mean >= +margin); equivalence within ±margin is shown when p < 1 - confidence (after the report's
    multiplicity adjustment). A zero variance estimate (or one seed) is no test: p None."""
    if not margin > 0:
        raise ValueError(f"equivalence margin must be > 0, got {margin}")
    _check_confidence(confidence)
    x = np.asarray(list(d), dtype=np.float64)
    n = len(x)
    iv = paired_difference(x, np.zeros(n), confidence) if n else None
    if iv is None or n < 2 or iv.degenerate:
        return {"margin": margin, "p": None, "n": n}
    se = float(x.std(ddof=1)) / math.sqrt(n)
    df = n - 1
    p_low = float(_scipy_stats.t.sf((iv.mean + margin) / se, df))  # H0: mean <= -margin
    p_high = float(_scipy_stats.t.cdf((iv.mean - margin) / se, df))  # H0: mean >= +margin
    return {"margin": margin, "p": max(p_low, p_high), "n": n}


# ----------------------------------------------------------------------------- minimum detectable effect
MDE_POWER = 0.8  # the power at which `mde` is stated (two-sided test at 1 - confidence)


def minimum_detectable_effect(se: float, df: float, power: float = MDE_POWER, alpha: float = 0.05) -> float:
    """The smallest true difference a two-sided t test at level `alpha` detects with probability `power`,
    when the mean difference has standard error `se` with `df` degrees of freedom (docs/method.md §7):
    `se · λ`, λ the noncentrality at which 1 - F(t_c; df, λ) + F(-t_c; df, λ) = power, F the noncentral
    t distribution and t_c = t_{1 - alpha/2, df}. Large df: (z_{1-alpha/2} + z_power) · se."""
    if not (se > 0 and df > 0 and math.isfinite(se)):
        return math.nan
    return se * _noncentrality(float(df), power, alpha)


@functools.lru_cache(maxsize=256)
def _noncentrality(df: float, power: float, alpha: float) -> float:
    """λ of `minimum_detectable_effect`: it depends on (df, power, alpha) only, and a report asks for the
    same few df many times (each root costs ~100 noncentral-t evaluations)."""
    from scipy import optimize
    from scipy import stats as st

    tc = float(st.t.ppf(1 - alpha / 2, df))

    def shortfall(lam: float) -> float:
        upper, lower = float(st.nct.sf(tc, df, lam)), float(st.nct.cdf(-tc, df, lam))
        # far in the tail scipy's noncentral t returns nan: the power there is 1 (upper) and 0 (lower)
        return (upper if math.isfinite(upper) else 1.0) + (lower if math.isfinite(lower) else 0.0) - power

    hi = tc + 4.0
    while shortfall(hi) < 0:
        hi *= 2
    return float(optimize.brentq(shortfall, 0.0, hi, xtol=1e-10))
