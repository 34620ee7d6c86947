"""Intervals for held-out metrics (pure: numpy only, no Dagster, no model).

The report scores k samples per held-out query. Samples of one query are not independent (an easy query
is easy for all k), so every interval here treats the *query* as the unit of resampling:

- `wilson`: the 95% Wilson score interval for a rate (stays inside [0, 1], sane at 0/n and n/n).
- `clustered_wilson`: Wilson with the effective sample size n / deff, where the design effect deff is the
  ratio of the between-query variance of the mean to the binomial variance (clamped to >= 1). With one
  sample per query it is plain Wilson.
- `cluster_bootstrap_mean`: percentile bootstrap of the mean, resampling queries with replacement (the mean
  is over all samples of the drawn queries).
- `paired_bootstrap_diff`: the same over per-(query, sample) differences between two systems scored on the
  same queries and seeds, so the interval is for the paired difference, not two overlapping bars.

Bootstraps use `numpy.random.default_rng(seed)` and draw all resamples as one (B, queries) integer array,
so a fixed seed gives a fixed interval.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

Z95 = 1.959963984540054
DEFAULT_RESAMPLES = 2000


def wilson(successes: float, n: float, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for `successes` out of `n` (successes may be fractional); (0, 0) when n = 0."""
    if n < 0 or successes < 0 or successes > n + 1e-9:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return (0.0, 0.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(0.0, p * (1 - p) / n + z * z / (4 * n * n))) / denom
    # exact ends at 0/n and n/n (the formula gives them up to float rounding)
    lo = 0.0 if successes <= 0 else max(0.0, centre - half)
    hi = 1.0 if successes >= n else min(1.0, centre + half)
    return (lo, hi)


def _clusters(values: Sequence[Sequence[float]]) -> list[np.ndarray]:
    out = [np.asarray(list(v), dtype=float) for v in values]
    return [v for v in out if v.size]


def design_effect(clusters: Sequence[Sequence[float]]) -> float:
    """Var(mean) from between-cluster spread over the binomial-style Var(mean) of independent samples, >= 1.

    Between-cluster variance of the mean: sum_q (n_q (m_q - p))^2 / (N^2) * C/(C-1) (the ratio-estimator
    variance with C clusters, N samples); the independent one: p(1-p)/N. 1 when undefined (one cluster,
    one sample per cluster, or p in {0, 1})."""
    cs = _clusters(clusters)
    n = sum(c.size for c in cs)
    if len(cs) < 2 or n == len(cs):
        return 1.0
    p = sum(c.sum() for c in cs) / n
    if p <= 0 or p >= 1:
        return 1.0
    v_cluster = sum((c.size * (c.mean() - p)) ** 2 for c in cs) / n ** 2 * len(cs) / (len(cs) - 1)
    v_indep = p * (1 - p) / n
    return max(1.0, float(v_cluster / v_indep))


def clustered_wilson(clusters: Sequence[Sequence[float]], z: float = Z95) -> tuple[float, float, float, float]:
    """(rate, low, high, effective n) for 0/1 (or [0, 1]) outcomes grouped by query."""
    cs = _clusters(clusters)
    n = sum(c.size for c in cs)
    if n == 0:
        return (0.0, 0.0, 0.0, 0.0)
    p = float(sum(c.sum() for c in cs) / n)
    n_eff = n / design_effect(cs)
    lo, hi = wilson(p * n_eff, n_eff, z)
    return (p, lo, hi, n_eff)


def _resample_index(n_clusters: int, resamples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n_clusters, size=(resamples, n_clusters))


def _boot_means(cs: list[np.ndarray], resamples: int, seed: int) -> np.ndarray:
    sums = np.array([c.sum() for c in cs])
    sizes = np.array([c.size for c in cs], dtype=float)
    idx = _resample_index(len(cs), resamples, seed)
    return sums[idx].sum(axis=1) / sizes[idx].sum(axis=1)


def cluster_bootstrap_mean(clusters: Sequence[Sequence[float]], *, resamples: int = DEFAULT_RESAMPLES,
                           seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """(mean over all samples, percentile low, percentile high), resampling clusters (queries)."""
    cs = _clusters(clusters)
    if not cs:
        return (0.0, 0.0, 0.0)
    sums = np.array([c.sum() for c in cs])
    sizes = np.array([c.size for c in cs], dtype=float)
    mean = float(sums.sum() / sizes.sum())
    if resamples < 1:
        raise ValueError("resamples must be >= 1")
    boot = _boot_means(cs, resamples, seed)
    a = (1 - level) / 2
    lo, hi = np.quantile(boot, [a, 1 - a])
    # float rounding must not put the point estimate outside a zero-width interval
    return (mean, float(min(lo, mean)), float(max(hi, mean)))


def _paired_diffs(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> list[np.ndarray]:
    if len(a) != len(b):
        raise ValueError(f"paired systems need the same queries: {len(a)} vs {len(b)}")
    diffs = []
    for q, (x, y) in enumerate(zip(a, b)):
        if len(x) != len(y):
            raise ValueError(f"query {q}: {len(x)} samples vs {len(y)}; pairs need the same seeds")
        diffs.append(np.asarray(list(x), dtype=float) - np.asarray(list(y), dtype=float))
    return diffs


def paired_bootstrap_p(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], *,
                       resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> float:
    """Two-sided bootstrap p-value of "mean(a − b) = 0": 2·(1 + k)/(B + 1), k the resampled mean differences
    on the rarer side of 0 (each side counting 0 itself), B the resamples, at most 1. The +1 (the observed
    sample counted as one resample) keeps p > 0: a p of 0 would pass any Holm threshold, whereas B resamples
    can only show p >= 2/(B + 1); with a family of m, significance needs B >= 2m/α − 1. Resamples queries with
    the same draws as `paired_bootstrap_diff`."""
    cs = _clusters(_paired_diffs(a, b))
    if not cs:
        return 1.0
    boot = _boot_means(cs, resamples, seed)
    k = min(int(np.sum(boot <= 0)), int(np.sum(boot >= 0)))
    return float(min(1.0, 2 * (1 + k) / (len(boot) + 1)))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error control over the whole family), in input order:
    sorted ascending, p_(i) becomes max_{j <= i} min(1, (m − j + 1) · p_(j)). E.g. (0.01, 0.04, 0.03) →
    (0.03, 0.06, 0.06)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: (pvalues[i], i))
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        out[i] = running
    return out


def resamples_for_family(family_size: int, resamples: int = DEFAULT_RESAMPLES, alpha: float = 0.05,
                         margin: float = 10.0) -> int:
    """Bootstrap resamples B for a Holm family of m: `paired_bootstrap_p` can show no p below 2/(B + 1), and
    Holm's first step needs p < α/m, so with too few resamples nothing can be significant whatever the data.
    Returns max(`resamples`, ⌈margin · m / α⌉): the smallest attainable p is then about 2α/(margin · m), a
    fifth of α/m at the default margin 10. E.g. m = 6, α = 0.05: max(2000, 1200) = 2000; m = 72: 14,400."""
    if family_size < 0 or not 0 < alpha < 1 or margin <= 2:
        raise ValueError(f"family_size={family_size}, alpha={alpha}, margin={margin}: need m >= 0, 0 < α < 1, "
                         "margin > 2 (below 2 the smallest attainable p is not below α/m)")
    return max(int(resamples), math.ceil(margin * family_size / alpha))


def holm_levels(pvalues: Sequence[float], alpha: float = 0.05) -> list[float]:
    """The confidence level of each hypothesis' interval under Holm: the one ranked r-th smallest p (from 1)
    gets 1 − α/(m − r + 1), so an interval excludes 0 exactly where Holm rejects, up to its first acceptance
    (after it, Holm accepts everything; those intervals keep their step's level)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: (pvalues[i], i))
    out = [0.0] * m
    for rank, i in enumerate(order):
        out[i] = 1 - alpha / (m - rank)
    return out


def paired_bootstrap_diff(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], *,
                          resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                          level: float = 0.95) -> tuple[float, float, float]:
    """Mean of a - b over paired samples with a percentile interval from resampling queries.

    `a[q][j]` and `b[q][j]` are sample j of query q under the same seed for the two systems; queries must
    line up and have equally many samples in both."""
    return cluster_bootstrap_mean(_paired_diffs(a, b), resamples=resamples, seed=seed, level=level)
