"""Intervals written once: cluster bootstrap, percentile intervals, t and exact binomial.

Who uses what:

    router OPE and curve metrics   session_bootstrap + percentile_interval
    router go/no-go                paired_bootstrap_diff (prompt-resampled a - b)
    demand results on real traces  ClusterBootstrap + quantile_interval
    fleet experiments              mean_ci, paired_diff (Student t over replicates)
    hint residuals                 binomial_ci (Clopper-Pearson coverage)

Cluster bootstrap. Rows of one session (a cluster) share a user and a prompt, so
they are not independent: a replicate draws the G clusters with replacement
(multinomial counts over clusters; Field & Welsh, "Bootstrapping clustered data",
JRSS-B 2007) and gives every row its cluster's count. A statistic that is a ratio
of sums is then one matrix product per chunk of replicates: mean_b = (c_b . x) /
(c_b . 1). Written here because scipy.stats.bootstrap resamples observations, not
clusters, and calls the statistic once per replicate. The draws come from
`numpy.random.default_rng(seed).multinomial(G, 1/G, size=b)` in chunks; the stream
does not depend on the chunk size, so the same seed gives the same replicates
whichever consumer draws them.

Student t and Clopper-Pearson come from scipy (`scipy.stats.t.ppf`,
`scipy.stats.binomtest(...).proportion_ci`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd

# ---------------------------------------------------------------- cluster bootstrap


def cluster_counts(n_clusters: int, n_boot: int, seed: int,
                   chunk: int | None = 100) -> Iterator[np.ndarray]:
    """Yield (b, n_clusters) int draw counts, b <= chunk, n_boot replicates in all.

    Each replicate draws n_clusters clusters with replacement out of n_clusters
    (each row of counts sums to n_clusters). chunk=None: all replicates at once.
    Nothing is yielded when n_clusters or n_boot is 0.
    """
    if n_clusters < 0 or n_boot < 0:
        raise ValueError(f"n_clusters={n_clusters} and n_boot={n_boot} must be >= 0")
    step = n_boot if chunk is None else int(chunk)
    if step <= 0 and n_boot:
        raise ValueError(f"chunk={chunk} must be positive")
    rng = np.random.default_rng(seed)
    done = 0
    while n_clusters and done < n_boot:
        b = min(step, n_boot - done)
        done += b
        yield rng.multinomial(n_clusters, np.full(n_clusters, 1.0 / n_clusters), size=b)


# The draws of the last `session_bootstrap` call, kept while they fit in this many bytes
# (uint8 counts): one evaluation asks for the same replicates of the same sessions for
# every figure (each estimate, the cost, the paired differences, the logging policy's
# own), and drawing a multinomial over tens of thousands of sessions is the cost.
_DRAWS_CACHE_BYTES = 128 * 2**20
_last_draws: dict[tuple, list[np.ndarray]] = {}


def session_bootstrap(session: np.ndarray, n_boot: int, seed: int,
                      chunk: int = 100) -> Iterator[np.ndarray]:
    """Yield (b, n) float row multiplicities, b <= chunk, n_boot replicates in all.

    session: (n,) cluster label of each row (any hashable values). Each replicate
    draws G sessions with replacement out of the G sessions and gives every row
    its session's count; the same seed gives the same replicates (repeated calls on
    the same sessions reuse the last call's draws: the same numbers, drawn once).
    """
    codes = pd.factorize(np.asarray(session))[0]
    g = int(codes.max()) + 1 if len(codes) else 0
    identity = bool(len(codes) == g and np.array_equal(codes, np.arange(g)))
    key = (g, int(n_boot), int(seed), int(chunk), hash(codes.tobytes()))
    cached = _last_draws.get(key)
    if cached is None:
        cached = []
        keep = g * int(n_boot) <= _DRAWS_CACHE_BYTES
        for counts in cluster_counts(g, n_boot, seed, chunk):
            if keep and counts.max(initial=0) <= 255:
                cached.append(counts.astype(np.uint8))
            else:
                keep = False
            yield counts.astype(float) if identity else counts[:, codes].astype(float)
        if keep:
            _last_draws.clear()
            _last_draws[key] = cached
        return
    for counts in cached:
        yield counts.astype(float) if identity else counts[:, codes].astype(float)  # (b, n)


class ClusterBootstrap:
    """Replicate means of per-row values, resampling clusters (all replicates drawn once).

    clusters: (n,) cluster label of each row. `means(x)` is the (n_boot,) replicate
    mean of x over the rows, weighting each cluster by its draw count; its
    replicates are those of `session_bootstrap` with the same seed.
    """

    def __init__(self, clusters: Sequence | np.ndarray | pd.Series, n_boot: int,
                 seed: int = 0) -> None:
        if not isinstance(clusters, pd.Series | np.ndarray):
            clusters = np.asarray(clusters)
        self.codes, uniq = pd.factorize(clusters)
        if (self.codes < 0).any():
            raise ValueError("clusters holds missing values")
        self.n_clusters = len(uniq)
        self.n_boot = int(n_boot)
        draws = list(cluster_counts(self.n_clusters, self.n_boot, seed, chunk=None))
        self.weights = (draws[0] if draws else np.zeros((0, self.n_clusters))
                        ).astype(float)  # (n_boot, G)
        size = np.bincount(self.codes, minlength=self.n_clusters).astype(float)
        self.denom = self.weights @ size  # (n_boot,) rows drawn per replicate

    def means(self, per_row: np.ndarray) -> np.ndarray:
        """(n_boot,) replicate means of per_row (n,)."""
        per_row = np.asarray(per_row, dtype=float)
        if per_row.shape != self.codes.shape:
            raise ValueError(f"per_row has shape {per_row.shape}, expected {self.codes.shape}")
        sums = np.bincount(self.codes, weights=per_row, minlength=self.n_clusters)
        return (self.weights @ sums) / self.denom

    def interval(self, per_row: np.ndarray, lo: float = 0.025,
                 hi: float = 0.975) -> tuple[float, float]:
        """The [lo, hi] quantiles of the replicate means of per_row."""
        return quantile_interval(self.means(per_row), lo, hi)


# ---------------------------------------------------------------- percentile intervals


def quantile_interval(reps: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
    """(lo, hi) quantiles of replicates, NaNs and infinities ignored; NaNs when none is left."""
    if not 0.0 <= lo <= hi <= 1.0:
        raise ValueError(f"quantiles lo={lo}, hi={hi}: need 0 <= lo <= hi <= 1")
    reps = np.asarray(reps, dtype=float)
    reps = reps[np.isfinite(reps)]
    if not len(reps):
        return float("nan"), float("nan")
    a, b = np.quantile(reps, [lo, hi])
    return float(a), float(b)


def percentile_interval(reps: np.ndarray, level: float) -> tuple[float, float]:
    """Two-sided percentile interval of bootstrap replicates at `level` (NaNs ignored)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level}: need 0 < level < 1")
    alpha = (1.0 - level) / 2.0
    return quantile_interval(reps, alpha, 1.0 - alpha)


def paired_bootstrap_diff(a: np.ndarray, b: np.ndarray, n_boot: int, seed: int,
                          session: np.ndarray | None = None,
                          level: float = 0.95) -> dict[str, Any]:
    """mean(a - b) and its percentile interval from the session bootstrap.

    a, b: (n,) paired values (the same rows); session: (n,) cluster of each row
    (default: each row its own). Returns {"mean": float, "ci": [lo, hi]}.
    """
    d = np.asarray(a, float) - np.asarray(b, float)
    groups = np.arange(len(d)) if session is None else session
    reps = [(w @ d) / w.sum(axis=1) for w in session_bootstrap(groups, n_boot, seed)]
    lo, hi = percentile_interval(np.concatenate(reps) if reps else np.zeros(0), level)
    return {"mean": float(d.mean()) if len(d) else float("nan"), "ci": [float(lo), float(hi)]}


# ---------------------------------------------------------------- t and binomial


def mean_ci(values: Sequence[float | None], level: float = 0.95) -> dict[str, Any]:
    """Mean and two-sided Student-t interval over replicates (None / NaN / inf dropped).

    Returns {"mean", "ci<level %>": [lo, hi], "n"} (the key is "ci95" at 0.95);
    the interval is NaN with fewer than 2 finite values, the mean with none.
    """
    from scipy import stats

    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level}: need 0 < level < 1")
    key = f"ci{100 * level:g}"
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype="float64")
    n = int(x.size)
    if n == 0:
        return {"mean": math.nan, key: [math.nan, math.nan], "n": 0}
    m = float(x.mean())
    if n < 2:
        return {"mean": m, key: [math.nan, math.nan], "n": n}
    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return {"mean": m, key: [m - half, m + half], "n": n}


def paired_diff(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """a - b per replicate (the same requests), its mean and t-interval (`mean_ci`), and
    `excludes_zero`: whether that interval lies wholly above or below 0."""
    d = [x - y for x, y in zip(a, b, strict=True)]
    out = mean_ci(d, level)
    lo, hi = out[f"ci{100 * level:g}"]
    out["excludes_zero"] = bool(math.isfinite(lo) and (lo > 0 or hi < 0))
    return out


def binomial_ci(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper-Pearson) two-sided interval of a proportion k / n; NaNs when n = 0."""
    from scipy.stats import binomtest

    if n == 0:
        return float("nan"), float("nan")
    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=level)
    return float(ci.low), float(ci.high)


def histogram_edges(lo: int, hi: int, buckets: int) -> np.ndarray:
    """Increasing int64 edges from lo to hi (both included), at most buckets + 1 of them:
    one pass of an exact distributed order statistic by histogram refinement (each pass
    counts per bucket on every partition and keeps the bucket where the count crosses;
    `compute.ops.refine`)."""
    span = hi - lo
    if span <= buckets:
        return np.arange(lo, hi + 1, dtype=np.int64)
    return np.unique(np.array([lo + span * i // buckets for i in range(buckets + 1)],
                              dtype=np.int64))

