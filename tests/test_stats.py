"""core.stats: intervals checked against values worked out by hand and against a plain numpy recomputation."""

from __future__ import annotations

import numpy as np
import pytest

from spogw_dagster.core import stats


def test_wilson_by_hand():
    # 3/10, z = 1.96: centre (0.3 + 0.19208) / 1.38416 = 0.35551, half 1.96 * sqrt(0.021 + 0.009604) / 1.38416
    lo, hi = stats.wilson(3, 10, z=1.96)
    assert lo == pytest.approx(0.1078, abs=1e-4) and hi == pytest.approx(0.6032, abs=1e-4)
    # 0/10: the lower end is 0, the upper end z^2/n / (1 + z^2/n) = 0.38416 / 1.38416
    lo, hi = stats.wilson(0, 10, z=1.96)
    assert lo == 0.0 and hi == pytest.approx(0.27754, abs=1e-5)
    lo, hi = stats.wilson(10, 10, z=1.96)
    assert hi == 1.0 and lo == pytest.approx(1 - 0.27754, abs=1e-5)
    assert stats.wilson(0, 0) == (0.0, 0.0)
    with pytest.raises(ValueError):
        stats.wilson(11, 10)


def test_design_effect_and_clustered_wilson_by_hand():
    # two queries, all-or-nothing: p = 0.5, between-query variance of the mean ((2*0.5)^2 + (2*0.5)^2) / 16 * 2
    # = 0.25, independent 0.25 / 4 = 0.0625: deff 4, so 4 samples count as one
    assert stats.design_effect([[1, 1], [0, 0]]) == pytest.approx(4.0)
    p, lo, hi, n_eff = stats.clustered_wilson([[1, 1], [0, 0]], z=1.96)
    assert (p, n_eff) == (0.5, pytest.approx(1.0))
    assert (lo, hi) == (pytest.approx(0.0546, abs=1e-4), pytest.approx(0.9454, abs=1e-4))
    # identical queries: no clustering penalty (clamped to 1), plain Wilson over 4 samples
    assert stats.design_effect([[1, 0], [1, 0]]) == 1.0
    assert stats.clustered_wilson([[1, 0], [1, 0]])[1:3] == stats.wilson(2, 4)
    # one sample per query is plain Wilson
    assert stats.clustered_wilson([[1], [0], [0], [1], [1], [0], [0], [0], [0], [0]], z=1.96)[1:3] == \
        stats.wilson(3, 10, z=1.96)
    assert stats.clustered_wilson([]) == (0.0, 0.0, 0.0, 0.0)


def test_bootstrap_zero_width_when_nothing_varies():
    assert stats.cluster_bootstrap_mean([[0.3, 0.3], [0.3], [0.3, 0.3, 0.3]]) == pytest.approx((0.3, 0.3, 0.3))
    # all paired differences equal 0.2: the interval is exactly [0.2, 0.2]
    a = [[0.5, 0.7], [0.2, 1.0], [0.4, 0.4]]
    b = [[0.3, 0.5], [0.0, 0.8], [0.2, 0.2]]
    assert stats.paired_bootstrap_diff(a, b) == pytest.approx((0.2, 0.2, 0.2))
    with pytest.raises(ValueError, match="same queries"):
        stats.paired_bootstrap_diff(a, b[:2])
    with pytest.raises(ValueError, match="same seeds"):
        stats.paired_bootstrap_diff(a, [[0.3], [0.0, 0.8], [0.2, 0.2]])


def test_bootstrap_matches_an_independent_numpy_loop():
    clusters = [[1, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0], [1, 0, 0]]
    mean, lo, hi = stats.cluster_bootstrap_mean(clusters, resamples=500, seed=7)
    assert mean == pytest.approx(7 / 15)
    rng = np.random.default_rng(7)
    draws = rng.integers(0, 5, size=(500, 5))
    boot = []
    for row in draws:
        picked = [x for q in row for x in clusters[q]]
        boot.append(sum(picked) / len(picked))
    assert (lo, hi) == (pytest.approx(np.quantile(boot, 0.025)), pytest.approx(np.quantile(boot, 0.975)))
    assert lo < mean < hi
    # the same seed gives the same interval, another seed (almost surely) another one
    assert stats.cluster_bootstrap_mean(clusters, resamples=500, seed=7) == (mean, lo, hi)


def test_paired_bootstrap_resamples_queries_not_samples():
    # query 0 improves by 1 on both samples, query 1 by 0: the mean diff is 0.5 and a resample of queries
    # can only give 0, 0.5 or 1, so the percentile interval is [0, 1]
    mean, lo, hi = stats.paired_bootstrap_diff([[1, 1], [0, 0]], [[0, 0], [0, 0]], resamples=4000, seed=1)
    assert (mean, lo, hi) == (0.5, 0.0, 1.0)
