"""Statistics for method-vs-baseline comparisons: mean ± std over seeds, paired tests. Pure functions."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1, as papers report over seeds). One value has no
    sample std: NaN, not 0 (a single seed says nothing about the spread; reports show no ±)."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) == 0:
        return math.nan, math.nan
    return float(x.mean()), float(x.std(ddof=1)) if len(x) > 1 else math.nan


def paired_ttest(method: Mapping[int, float], baseline: Mapping[int, float], *, level: float = 0.95) -> dict:
    """Paired t-test over the seeds both have: t = mean(d) / (sd(d) / sqrt(n)), n - 1 d.o.f.

    Returns {"n", "diff" (mean of method - baseline), "t", "p", "ci_low", "ci_high"}: the two-sided
    p-value and the `level` t-interval of the mean difference over seeds (what the seeds support:
    with 3 seeds, t(0.975, 2) = 4.30 standard errors either side). t, p and the interval are NaN
    with fewer than 2 pairs; with every difference identical (sd 0) p is 0/1 and the interval is
    that difference.
    """
    seeds = sorted(set(method) & set(baseline))
    d = np.array([method[s] - baseline[s] for s in seeds], dtype=np.float64)
    out = {"n": len(seeds), "diff": float(d.mean()) if len(d) else math.nan, "t": math.nan, "p": math.nan,
           **t_interval(d, level)}
    if len(d) < 2:
        return out
    sd = d.std(ddof=1)
    if sd == 0:
        out["t"] = math.copysign(math.inf, d.mean()) if d.mean() else 0.0
        out["p"] = 0.0 if d.mean() else 1.0
        return out
    from scipy import stats

    t = d.mean() / (sd / math.sqrt(len(d)))
    out["t"], out["p"] = float(t), float(2 * stats.t.sf(abs(t), len(d) - 1))
    return out


def t_interval(values: Sequence[float], level: float = 0.95) -> dict:
    """{"ci_low", "ci_high"}: the `level` Student-t interval of the mean of `values` (one per seed),
    mean ± t(1 − (1 − level) / 2, n − 1) · sd / sqrt(n); NaN with fewer than 2 values."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) < 2:
        return {"ci_low": math.nan, "ci_high": math.nan}
    from scipy import stats

    half = float(stats.t.ppf(1 - (1 - level) / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return {"ci_low": float(x.mean()) - half, "ci_high": float(x.mean()) + half}


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (Holm 1979): sorted ascending, the i-th
    smallest (0-based) of m becomes max over j <= i of min(1, (m − j) · p_(j)). Rejecting where the
    adjusted value is below α controls the family-wise error rate at α. NaN p-values (a comparison
    without a test) stay NaN and do not count in m."""
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(len(p), np.nan)
    idx = np.flatnonzero(~np.isnan(p))
    m = len(idx)
    running = 0.0
    for rank, i in enumerate(idx[np.argsort(p[idx], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return [float(x) for x in out]


def paired_bootstrap(method: np.ndarray, baseline: np.ndarray, *, samples: int = 10_000,
                     seed: int = 0) -> dict:
    """Paired bootstrap over questions (Efron & Tibshirani; Koehn 2004).

    Args:
        method, baseline: (q,) per-question scores on the same questions (e.g. F1 averaged over seeds).
    Returns {"n", "diff", "ci_low", "ci_high", "p"}: the observed mean difference, a 95% percentile
    interval, and a two-sided p-value: the share of resampled differences at least as far from the
    observed one as the observed one is from 0 (the bootstrap distribution shifted to the null).
    """
    d = np.asarray(method, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    n = len(d)
    if n == 0 or samples <= 0:  # no examples, or no resampling asked for: the difference alone
        return {"n": n, "diff": float(d.mean()) if n else math.nan, "ci_low": math.nan, "ci_high": math.nan,
                "p": math.nan}
    rng = np.random.default_rng(seed)
    means = np.empty(samples)
    for lo in range(0, samples, 1000):  # chunks bound memory at 1000 x n indices
        idx = rng.integers(0, n, size=(min(1000, samples - lo), n))
        means[lo:lo + len(idx)] = d[idx].mean(axis=1)
    obs = float(d.mean())
    p = float(np.mean(np.abs(means - obs) >= abs(obs))) if obs else 1.0
    return {"n": n, "diff": obs, "ci_low": float(np.percentile(means, 2.5)),
            "ci_high": float(np.percentile(means, 97.5)), "p": p}


def paired_bootstrap_ratio(method: np.ndarray, baseline: np.ndarray, *, samples: int = 10_000,
                           seed: int = 0) -> dict:
    """Paired bootstrap over examples of a corpus-level ratio metric, in points (x100).

    Token-classification metrics are ratios of sums, not means of per-sentence scores: entity F1 =
    2 TP / (predicted + gold), accuracy = correct / words. Each resample draws sentences with
    replacement and recomputes both ratios from the drawn sentences' sums.

    Args:
        method, baseline: (n, 2) per-example (numerator, denominator) on the same examples.
    Returns {"n", "diff", "ci_low", "ci_high", "p"} as `paired_bootstrap`.
    """
    m = np.asarray(method, dtype=np.float64)
    b = np.asarray(baseline, dtype=np.float64)
    n = len(m)
    if n == 0:
        return {"n": 0, "diff": math.nan, "ci_low": math.nan, "ci_high": math.nan, "p": math.nan}

    def ratio(x, axis=None):
        num, den = x[..., 0].sum(axis=axis), x[..., 1].sum(axis=axis)
        return 100 * np.divide(num, den, out=np.zeros_like(num, dtype=np.float64), where=den > 0)

    obs = float(ratio(m) - ratio(b))
    if samples <= 0:  # no resampling asked for: the difference alone
        return {"n": n, "diff": obs, "ci_low": math.nan, "ci_high": math.nan, "p": math.nan}
    rng = np.random.default_rng(seed)
    diffs = np.empty(samples)
    for lo in range(0, samples, 1000):
        idx = rng.integers(0, n, size=(min(1000, samples - lo), n))
        diffs[lo:lo + len(idx)] = ratio(m[idx], axis=1) - ratio(b[idx], axis=1)
    p = float(np.mean(np.abs(diffs - obs) >= abs(obs))) if obs else 1.0
    return {"n": n, "diff": obs, "ci_low": float(np.percentile(diffs, 2.5)),
            "ci_high": float(np.percentile(diffs, 97.5)), "p": p}
