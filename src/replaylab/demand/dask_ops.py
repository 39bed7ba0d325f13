"""Distributed building blocks of `pipeline=demand compute=dask`: exact order statistics,
hashed sampling and hashed Poisson bootstrap weights, on dask collections.

Nothing here gathers rows on the driver: each function maps over partitions and
brings back fixed-size aggregates.

- `exact_quantiles_dask`: `numpy.quantile(x, qs)` (method "linear") of a dask
  Series, bit for bit. The order statistics it needs (ranks floor and ceil of
  (n - 1) q) are found by histogram refinement over the float64 values mapped to
  order-preserving int64 keys: each pass counts, per partition and then summed,
  the values in 4096 buckets of the current key interval around each wanted rank,
  and keeps the bucket where the cumulative count reaches it; the interval shrinks
  4096-fold per pass (at most 6 passes for 64-bit keys). The driver holds
  O(buckets x ranks) counts. Then numpy's own interpolation formula
  (`_lerp(a, b, gamma)` with gamma = (n - 1) q - floor((n - 1) q)) is applied to
  the two order statistics, so the result is the local one exactly.
- `hash_uniform`: a uniform [0, 1) number per key, from a 64-bit hash of the key
  and a salt (splitmix64 finaliser over pandas' stable `hash_array`): every worker
  computes the same number for the same key without talking to the others.
- `poisson_weights`: w[b, s] ~ Poisson(1), independent over replicates b and
  sessions s, as the inverse CDF of `hash_uniform(session, salt=b)`: the
  session-cluster Poisson bootstrap (Hanley & MacGibbon 2006; Chamandy et al.
  2012, "Estimating uncertainty for massive data streams"), whose replicate of a
  ratio of sums is sum_s w[b, s] X_s / sum_s w[b, s] n_s, a partition sum.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import dask
import numpy as np
import pandas as pd

from replaylab.stats import histogram_edges

BUCKETS = 4096
_FLIP = np.int64(0x7FFF_FFFF_FFFF_FFFF)
_GOLDEN = np.uint64(0x9E37_79B9_7F4A_7C15)


# ------------------------------------------------------------------ hashing


def _splitmix(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58_476D_1CE4_E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D0_49BB_1331_11EB)
        return z ^ (z >> np.uint64(31))


def key_hash(keys: np.ndarray | pd.Series) -> np.ndarray:
    """A stable uint64 hash per key (pandas `hash_array` of the values as strings)."""
    values = np.asarray(pd.Series(keys).astype(str).to_numpy(dtype=object))
    return pd.util.hash_array(values, categorize=False)


def hash_uniform(hashes: np.ndarray, salt: int) -> np.ndarray:
    """Uniform [0, 1) float64 per key hash (`key_hash`), one independent stream per salt."""
    with np.errstate(over="ignore"):
        z = hashes.astype(np.uint64) + _GOLDEN * np.uint64(int(salt) % 2**63 + 1)
    return (_splitmix(z) >> np.uint64(11)).astype("float64") * 2.0 ** -53


_POISSON1_CDF = np.cumsum([math.exp(-1.0) / math.factorial(k) for k in range(25)])


def poisson_weights(hashes: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, len(hashes)) Poisson(1) draws, w[b, i] a function of (hashes[i], b, seed) only."""
    out = np.empty((int(n_boot), len(hashes)), dtype="float64")
    for b in range(int(n_boot)):
        u = hash_uniform(hashes, salt=(int(seed) * 1_000_003 + b) * 2 + 1)
        out[b] = np.searchsorted(_POISSON1_CDF, u, side="right")
    return out


# ------------------------------------------------------------------ exact quantiles


def sortable_keys(x: np.ndarray) -> np.ndarray:
    """int64 keys with the order of the float64 values (finite, no NaN)."""
    b = np.asarray(x, dtype="float64").view(np.int64)
    return np.where(b < 0, b ^ _FLIP, b)


def from_keys(k: np.ndarray | int) -> np.ndarray:
    """The float64 values of `sortable_keys` keys."""
    k = np.asarray(k, dtype=np.int64)
    return np.where(k < 0, k ^ _FLIP, k).view("float64")


def _part_stats(x: pd.Series) -> tuple[int, int | None, int | None]:
    k = sortable_keys(x.to_numpy(dtype="float64"))
    return (len(k), int(k.min()) if len(k) else None, int(k.max()) if len(k) else None)


def _stats_sum(parts: Sequence[tuple]) -> tuple[int, int | None, int | None]:
    lo = [p[1] for p in parts if p[1] is not None]
    hi = [p[2] for p in parts if p[2] is not None]
    return sum(p[0] for p in parts), (min(lo) if lo else None), (max(hi) if hi else None)


def _part_hist(x: pd.Series, edges: Sequence[np.ndarray]) -> list[np.ndarray]:
    k = sortable_keys(x.to_numpy(dtype="float64"))
    out = []
    for e in edges:
        inside = k[(k > e[0]) & (k <= e[-1])]
        out.append(np.bincount(np.searchsorted(e, inside, side="left"),
                               minlength=len(e)).astype(np.int64))
    return out


def _hist_sum(parts: Sequence[list[np.ndarray]]) -> list[np.ndarray]:
    return [np.sum([p[j] for p in parts], axis=0) for j in range(len(parts[0]))]


def on_partitions(series: object, fn: Callable, combine: Callable, *args: object) -> object:
    """fn(partition, *args) per partition, combined on the cluster; the result comes back."""
    parts = [dask.delayed(fn)(p, *args) for p in series.to_delayed()]
    return dask.delayed(combine)(parts).compute()


def order_statistics_dask(x: object, ranks: Sequence[int], n: int, kmin: int, kmax: int,
                          buckets: int = BUCKETS) -> dict[int, float]:
    """The values at 0-based `ranks` of the sorted dask Series x (n finite values, keys in
    [kmin, kmax]): {rank: value}, exact (histogram refinement, see the module docstring)."""
    state = {r: [kmin - 1, kmax, 0] for r in sorted(set(int(r) for r in ranks))}
    done: dict[int, float] = {}
    while state:
        for r in [r for r, (lo, hi, _) in state.items() if hi - lo <= 1]:
            done[r] = float(from_keys(state.pop(r)[1]))
        if not state:
            break
        names = list(state)
        edges = [histogram_edges(state[r][0], state[r][1], buckets) for r in names]
        hists = on_partitions(x, _part_hist, _hist_sum, edges)
        for r, e, h in zip(names, edges, hists, strict=True):
            cum = np.int64(state[r][2]) + np.cumsum(h[1:])  # count(<= e[i]) at i - 1
            j = int(np.argmax(cum >= r + 1))
            state[r] = [int(e[j]), int(e[j + 1]), int(cum[j - 1]) if j > 0 else state[r][2]]
    return done


def linear_quantiles(n: int, qs: Sequence[float], order_stat: Callable[[int], float]
                     ) -> np.ndarray:
    """numpy.quantile(x, qs) (method "linear") from x's order statistics, numpy's arithmetic."""
    q = np.asarray(qs, dtype="float64")
    virtual = (n - 1) * q
    prev = np.floor(virtual)
    nxt = prev + 1
    above = virtual >= n - 1
    prev[above] = n - 1
    nxt[above] = n - 1
    prev[virtual < 0] = 0
    nxt[virtual < 0] = 0
    gamma = virtual - np.floor(virtual)
    a = np.array([order_stat(int(i)) for i in prev], dtype="float64")
    b = np.array([order_stat(int(i)) for i in nxt], dtype="float64")
    diff = b - a
    out = np.add(a, diff * gamma)
    np.subtract(b, diff * (1 - gamma), out=out, where=gamma >= 0.5)
    return out


def needed_ranks(n: int, qs: Sequence[float]) -> list[int]:
    """The 0-based ranks `linear_quantiles` reads for n values."""
    virtual = (n - 1) * np.asarray(qs, dtype="float64")
    prev = np.clip(np.floor(virtual), 0, n - 1).astype(int)
    return sorted({*prev.tolist(), *np.minimum(prev + 1, n - 1).tolist()})


def exact_quantiles_dask(x: object, qs: Sequence[float], buckets: int = BUCKETS
                         ) -> tuple[np.ndarray, int]:
    """(numpy.quantile(x, qs), n) of a dask Series of finite float64 values, exactly."""
    n, kmin, kmax = on_partitions(x, _part_stats, _stats_sum)
    if n == 0:
        raise ValueError("no values: cannot take quantiles")
    stats = order_statistics_dask(x, needed_ranks(n, qs), n, kmin, kmax, buckets)
    return linear_quantiles(n, qs, stats.__getitem__), int(n)


def exact_order_statistics_dask(x: object, ranks: Sequence[int], buckets: int = BUCKETS
                                ) -> tuple[dict[int, float], int]:
    """({rank: value} at 0-based `ranks` of a dask Series of finite float64 values, n),
    exactly (`order_statistics_dask` after one pass for the count and key range)."""
    n, kmin, kmax = on_partitions(x, _part_stats, _stats_sum)
    if n == 0:
        raise ValueError("no values: cannot take order statistics")
    return order_statistics_dask(x, ranks, n, kmin, kmax, buckets), int(n)


def kth_smallest_hash(x: object, m: int, buckets: int = BUCKETS) -> float:
    """The m-th smallest (1-based) value of a dask Series of finite float64 (a threshold
    for an exact uniform subsample of size m by hashed keys)."""
    n, kmin, kmax = on_partitions(x, _part_stats, _stats_sum)
    if m >= n:
        return math.inf
    return order_statistics_dask(x, [m - 1], n, kmin, kmax, buckets)[m - 1]
