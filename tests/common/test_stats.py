"""replaylab.stats: behaviour, and the statistics the intervals promise on seeded data."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from replaylab.stats import (
    ClusterBootstrap,
    binomial_ci,
    cluster_counts,
    mean_ci,
    paired_bootstrap_diff,
    paired_diff,
    percentile_interval,
    quantile_interval,
    session_bootstrap,
)

# ---------------------------------------------------------------- cluster bootstrap


def test_session_bootstrap_resamples_whole_sessions():
    session = np.array([5, 5, 5, 9, 2, 2])
    for counts in session_bootstrap(session, n_boot=30, seed=0, chunk=7):
        assert counts.shape[1] == 6 and counts.shape[0] <= 7
        assert (counts[:, 0] == counts[:, 1]).all() and (counts[:, 4] == counts[:, 5]).all()
        assert np.allclose(counts[:, [0, 3, 4]].sum(axis=1), 3)  # G = 3 sessions drawn
    total = sum(c.shape[0] for c in session_bootstrap(session, n_boot=30, seed=0, chunk=7))
    assert total == 30


def test_draws_do_not_depend_on_chunk_and_follow_the_seed():
    whole = np.concatenate(list(cluster_counts(13, 250, seed=4, chunk=None)))
    chunked = np.concatenate(list(cluster_counts(13, 250, seed=4, chunk=7)))
    assert whole.shape == (250, 13) and (whole == chunked).all()
    assert (whole.sum(axis=1) == 13).all()
    other = np.concatenate(list(cluster_counts(13, 250, seed=5)))
    assert not (whole == other).all()


def test_cluster_bootstrap_means_are_session_bootstrap_means():
    rng = np.random.default_rng(0)
    clusters = rng.integers(0, 40, 300).astype(str)
    x = rng.normal(size=300)
    boot = ClusterBootstrap(clusters, n_boot=400, seed=3)
    via_rows = np.concatenate([(w @ x) / w.sum(axis=1)
                               for w in session_bootstrap(clusters, 400, seed=3)])
    assert boot.n_clusters == 40
    assert np.allclose(boot.means(x), via_rows, rtol=1e-12, atol=1e-12)


def test_cluster_bootstrap_respects_clusters():
    """Rows that move together (one cluster, one value): the cluster bootstrap's interval
    covers the true mean about as often as promised; one that resamples rows does not."""
    rng = np.random.default_rng(11)
    n_sims, g, per = 200, 20, 15
    clusters = np.repeat(np.arange(g), per)
    rows = np.arange(g * per)
    hits_cluster = hits_rows = 0
    for sim in range(n_sims):
        effect = rng.normal(size=g)[clusters]  # shared within a cluster, true mean 0
        x = effect + 0.1 * rng.normal(size=g * per)
        lo, hi = ClusterBootstrap(clusters, 300, seed=sim).interval(x)
        hits_cluster += lo <= 0.0 <= hi
        lo, hi = ClusterBootstrap(rows, 300, seed=sim).interval(x)
        hits_rows += lo <= 0.0 <= hi
    # nominal 0.95; percentile intervals on 20 clusters run a little narrow
    assert hits_cluster / n_sims >= 0.86
    assert hits_rows / n_sims <= 0.5  # ignoring clusters: far too narrow


def test_cluster_bootstrap_single_cluster_and_empty():
    boot = ClusterBootstrap(["a"] * 4, n_boot=10)
    assert boot.interval(np.array([1.0, 2.0, 3.0, 6.0])) == (3.0, 3.0)
    empty = ClusterBootstrap([], n_boot=10)
    assert empty.n_clusters == 0 and all(math.isnan(v) for v in empty.interval(np.zeros(0)))
    assert list(session_bootstrap(np.array([]), 10, seed=0)) == []
    assert list(session_bootstrap(np.array([1, 1]), 0, seed=0)) == []


def test_cluster_bootstrap_bad_input():
    with pytest.raises(ValueError, match="missing"):
        ClusterBootstrap(np.array([1.0, np.nan]), n_boot=5)
    with pytest.raises(ValueError, match="shape"):
        ClusterBootstrap([1, 2, 3], n_boot=5).means(np.zeros(2))
    with pytest.raises(ValueError, match=">= 0"):
        list(cluster_counts(-1, 5, seed=0))
    with pytest.raises(ValueError, match="chunk"):
        list(cluster_counts(3, 5, seed=0, chunk=0))


# ---------------------------------------------------------------- percentile intervals


def test_percentile_interval_ignores_non_finite_and_orders():
    reps = np.concatenate([np.arange(101, dtype=float), [np.nan, np.inf]])
    lo, hi = percentile_interval(reps, 0.9)
    assert lo == pytest.approx(5.0) and hi == pytest.approx(95.0)
    assert all(math.isnan(v) for v in percentile_interval(np.array([np.nan]), 0.95))
    assert quantile_interval(np.arange(101.0), 0.025, 0.975) == (2.5, 97.5)
    with pytest.raises(ValueError, match="level"):
        percentile_interval(reps, 1.5)
    with pytest.raises(ValueError, match="quantiles"):
        quantile_interval(reps, 0.9, 0.1)


def test_paired_bootstrap_diff_sign():
    rng = np.random.default_rng(2)
    b = rng.normal(size=400)
    a = b + 0.5 + 0.1 * rng.normal(size=400)
    up = paired_bootstrap_diff(a, b, n_boot=500, seed=0)
    down = paired_bootstrap_diff(b, a, n_boot=500, seed=0)
    assert up["mean"] > 0 and up["ci"][0] > 0
    assert down["mean"] == pytest.approx(-up["mean"]) and down["ci"][1] < 0
    assert down["ci"] == pytest.approx([-up["ci"][1], -up["ci"][0]])
    same = paired_bootstrap_diff(b, b, n_boot=100, seed=0)
    assert same["mean"] == 0.0 and same["ci"] == [0.0, 0.0]
    assert math.isnan(paired_bootstrap_diff([], [], n_boot=10, seed=0)["ci"][0])


# ---------------------------------------------------------------- t intervals


def test_mean_ci_and_paired_diff():
    out = mean_ci([1.0, 2.0, 3.0])
    assert out["mean"] == 2.0 and out["n"] == 3
    lo, hi = out["ci95"]
    assert lo < 2.0 < hi
    assert math.isclose(hi - 2.0, 4.302652729911275 * 1.0 / math.sqrt(3), rel_tol=1e-9)
    d = paired_diff([1.1, 2.1, 3.11], [1.0, 2.0, 3.0])
    assert d["excludes_zero"] and d["mean"] > 0
    assert not paired_diff([1.0, 2.0], [1.0, 2.0])["excludes_zero"]
    assert math.isnan(mean_ci([5.0])["ci95"][0])


def test_mean_ci_edge_cases_and_bad_input():
    empty = mean_ci([])
    assert empty["n"] == 0 and math.isnan(empty["mean"]) and math.isnan(empty["ci95"][1])
    one = mean_ci([None, 4.0, float("nan"), float("inf")])
    assert one["n"] == 1 and one["mean"] == 4.0 and math.isnan(one["ci95"][0])
    assert "ci90" in mean_ci([1.0, 2.0], level=0.9)
    neg = paired_diff([0.0, 0.1, 0.0], [1.0, 1.0, 1.1])
    assert neg["excludes_zero"] and neg["ci95"][1] < 0
    with pytest.raises(ValueError):
        paired_diff([1.0, 2.0], [1.0])  # unpaired
    with pytest.raises(ValueError, match="level"):
        mean_ci([1.0, 2.0], level=95)


def test_mean_ci_coverage_on_seeded_simulations():
    rng = np.random.default_rng(7)
    n_sims = 2000
    hits = 0
    for _ in range(n_sims):
        lo, hi = mean_ci(rng.normal(3.0, 2.0, size=8))["ci95"]
        hits += lo <= 3.0 <= hi
    # exact for normal data: 0.95; 4 binomial standard errors of 2000 sims = 0.019
    assert abs(hits / n_sims - 0.95) < 0.02


# ---------------------------------------------------------------- exact binomial


def test_binomial_ci_is_clopper_pearson():
    from scipy.stats import beta

    k, n = 7, 40
    lo, hi = binomial_ci(k, n)
    assert lo == pytest.approx(beta.ppf(0.025, k, n - k + 1), rel=1e-9)
    assert hi == pytest.approx(beta.ppf(0.975, k + 1, n - k), rel=1e-9)
    assert binomial_ci(0, 10)[0] == 0.0 and binomial_ci(10, 10)[1] == 1.0
    assert all(math.isnan(v) for v in binomial_ci(0, 0))
    wide, narrow = binomial_ci(5, 10, level=0.99), binomial_ci(5, 10, level=0.8)
    assert wide[0] < narrow[0] < 0.5 < narrow[1] < wide[1]
    with pytest.raises(ValueError):
        binomial_ci(11, 10)


def test_binomial_ci_coverage_is_at_least_nominal():
    """Clopper-Pearson is conservative: coverage >= the level at every p (seeded)."""
    rng = np.random.default_rng(5)
    n, n_sims = 30, 1500
    for p in (0.05, 0.3, 0.8):
        ks = rng.binomial(n, p, size=n_sims)
        cover = {k: (lambda ci: ci[0] <= p <= ci[1])(binomial_ci(int(k), n)) for k in set(ks)}
        rate = float(np.mean([cover[k] for k in ks]))
        assert rate >= 0.95 - 3 * math.sqrt(0.05 * 0.95 / n_sims)


def test_session_bootstrap_reuses_its_draws_without_changing_them():
    """A repeated call (the same sessions, replicates and seed) yields the draws of
    `cluster_counts` again, gathered to rows, for shuffled and for one-row sessions."""
    from replaylab.stats import cluster_counts, session_bootstrap

    rng = np.random.default_rng(3)
    for session in (rng.permutation(np.repeat(np.arange(400), 3)), np.arange(500)):
        codes = pd.factorize(session)[0]
        want = np.concatenate([c[:, codes] for c in cluster_counts(codes.max() + 1, 250, 11)])
        first = np.concatenate(list(session_bootstrap(session, 250, 11)))
        again = np.concatenate(list(session_bootstrap(session, 250, 11)))
        np.testing.assert_array_equal(first, want)
        np.testing.assert_array_equal(again, want)
        other = np.concatenate(list(session_bootstrap(session, 250, 12)))
        assert not np.array_equal(other, want)
