"""Operations written once over `Engine.each` / `Engine.map`: the same result on either engine.

- Exact order statistics by histogram refinement (`refine`, `order_statistics`,
  `exact_quantiles`, `weighted_crossings`): values are mapped to order-preserving int64
  keys (`sortable_keys` for float64, the value itself for int64 ms); each pass counts,
  per partition (`Engine.each`) and then summed on the driver, the weight of the keys in
  `BUCKETS` buckets of the current interval around each target, and keeps the bucket
  where the cumulative weight reaches it; the interval shrinks 4096-fold per pass (at
  most 6 passes for 64-bit keys). The driver holds O(buckets x targets) counts, never a
  row. Why by hand: dask's `quantile` is approximate, and numpy's needs every value in
  one place; the split boundaries need a row-weighted version of the same selection.
- `exact_quantiles`: numpy.quantile (method "linear") bit for bit, from the two order
  statistics around each q and numpy's own interpolation arithmetic.
- `key_hash`, `hash_uniform`: a uniform [0, 1) number per key from a 64-bit hash of the
  key and a salt (splitmix64 over pandas' stable `hash_array`): every worker computes
  the same number for the same key without talking to the others, so `hashed_sample`
  keeps the same sessions whatever the engine or partitioning.
- `poisson_weights`: THE session bootstrap. w[b, s] ~ Poisson(1), independent over
  replicates b and sessions s, the inverse CDF of `hash_uniform(session, salt=b)`
  (Hanley & MacGibbon 2006; Chamandy et al. 2012); a replicate of a ratio of sums is
  sum_s w[b, s] X_s / sum_s w[b, s] n_s, a partition sum.
- `ledger_fingerprint`: sha256 of the valued column names, the row count and the SORTED row
  hashes (`row_hashes`): independent of row order, column order, partitioning and
  engine. The hashes are sorted in ranges of their top bits (`FINGERPRINT_CHUNK_ROWS`
  hashes at a time travel to the driver, 8 bytes each), so one digest serves both
  engines and the driver never holds a row.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from replaylab.stats import histogram_edges

BUCKETS = 4096  # histogram buckets per refinement pass
FINGERPRINT_TOP_BITS = 12  # the fingerprint's hash ranges: 4096 by the top 12 bits
FINGERPRINT_CHUNK_ROWS = 4_000_000  # row hashes per range pass (32 MB on the driver)
_FLIP = np.int64(0x7FFF_FFFF_FFFF_FFFF)
_GOLDEN = np.uint64(0x9E37_79B9_7F4A_7C15)
KeysFn = Callable[[pd.DataFrame], tuple[np.ndarray, np.ndarray | None]]


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


def sample_rows(part: pd.DataFrame, frac: float, seed: int, key: str) -> pd.DataFrame:
    """The rows of `part` whose key's `hash_uniform(key_hash(key), seed)` is below frac."""
    if frac >= 1.0 or len(part) == 0:
        return part
    u = hash_uniform(key_hash(part[key].to_numpy(dtype=object)), salt=seed)
    return part[u < frac]


def hashed_sample(engine: Any, frame: Any, frac: float, seed: int,
                  key: str = "session_id") -> Any:
    """The rows of every key whose hashed uniform is below `frac` (whole keys: a session is
    in or out): the same rows on either engine and any partitioning; frac >= 1: all."""
    if not 0.0 <= frac:
        raise ValueError(f"frac={frac!r}: must be >= 0")
    return engine.map(sample_rows, frame, float(frac), int(seed), key)


# ------------------------------------------------------------------ keys


def sortable_keys(x: np.ndarray) -> np.ndarray:
    """int64 keys with the order of the float64 values (finite, no NaN)."""
    b = np.asarray(x, dtype="float64").view(np.int64)
    return np.where(b < 0, b ^ _FLIP, b)


def from_keys(k: np.ndarray | int) -> np.ndarray:
    """The float64 values of `sortable_keys` keys."""
    k = np.asarray(k, dtype=np.int64)
    return np.where(k < 0, k ^ _FLIP, k).view("float64")


def float_keys(part: pd.DataFrame, column: str) -> tuple[np.ndarray, None]:
    """The sortable keys of a column's finite float64 values (NaN and inf left out)."""
    x = pd.to_numeric(part[column], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
    return sortable_keys(x[np.isfinite(x)]), None


# ------------------------------------------------------------------ the refinement


def _key_stats(part: pd.DataFrame, keys_fn: Callable, args: tuple) -> tuple:
    k, w = keys_fn(part, *args)
    total = int(len(k) if w is None else np.asarray(w, dtype=np.int64).sum())
    return total, len(k), (int(k.min()) if len(k) else None), (int(k.max()) if len(k) else None)


def key_stats(engine: Any, frame: Any, keys_fn: Callable, *args: Any) -> tuple:
    """(total weight, keys, smallest key, largest key) over every partition."""
    parts = engine.each(_key_stats, frame, keys_fn, args)
    lo = [p[2] for p in parts if p[2] is not None]
    hi = [p[3] for p in parts if p[3] is not None]
    return (sum(p[0] for p in parts), sum(p[1] for p in parts),
            min(lo) if lo else None, max(hi) if hi else None)


def _histograms(part: pd.DataFrame, keys_fn: Callable, args: tuple,
                edges: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Per edge vector e: the weight of keys in (e[i-1], e[i]], at index i (0 unused)."""
    k, w = keys_fn(part, *args)
    out = []
    for e in edges:
        inside = (k > e[0]) & (k <= e[-1])
        idx = np.searchsorted(e, k[inside], side="left")
        h = np.zeros(len(e), dtype=np.int64)
        if w is None:
            h += np.bincount(idx, minlength=len(e)).astype(np.int64)
        else:
            np.add.at(h, idx, np.asarray(w, dtype=np.int64)[inside])
        out.append(h)
    return out


def refine(engine: Any, frame: Any, keys_fn: Callable, targets: dict[Any, float],
           lo: int, hi: int, *args: Any, buckets: int = BUCKETS) -> tuple[dict, int]:
    """Per target threshold T: min{key t : W(<= t) >= T}, W(<= t) the weight of keys at or
    below t (keys_fn(part, *args) -> (int64 keys, int64 weights or None for 1 each)); None
    when the total weight is below T. lo, hi: the smallest and largest key. Returns
    ({target name: key}, histogram passes run). All sums int64, compared with T as given."""
    total = key_stats(engine, frame, keys_fn, *args)[0] if targets else 0
    found: dict[Any, int | None] = {}
    state: dict[Any, list[int]] = {}  # name -> [lo, hi, W(<= lo)], W(<= lo) < T <= W(<= hi)
    for name, thr in targets.items():
        if np.int64(0) >= thr:
            found[name] = lo
        elif np.int64(total) < thr:
            found[name] = None
        else:
            state[name] = [lo - 1, hi, 0]
    passes = 0
    while state:
        for k in [k for k, (a, b, _) in state.items() if b - a <= 1]:
            found[k] = state.pop(k)[1]
        if not state:
            break
        names = list(state)
        edges = [histogram_edges(state[k][0], state[k][1], buckets) for k in names]
        parts = engine.each(_histograms, frame, keys_fn, args, edges)
        hists = [np.sum([p[j] for p in parts], axis=0) for j in range(len(names))]
        passes += 1
        for k, e, h in zip(names, edges, hists, strict=True):
            cum = np.int64(state[k][2]) + np.cumsum(h[1:])  # W(<= e[i]) at i - 1
            j = int(np.argmax(cum >= targets[k]))  # exists: W(<= hi) >= T
            state[k] = [int(e[j]), int(e[j + 1]), int(cum[j - 1]) if j > 0 else state[k][2]]
    return found, passes


def order_statistics(engine: Any, frame: Any, column: str, ranks: Sequence[int],
                     buckets: int = BUCKETS) -> list[float]:
    """The values at 0-based `ranks` of the sorted finite values of `column`, exactly."""
    _, n, kmin, kmax = key_stats(engine, frame, float_keys, column)
    bad = [r for r in ranks if not 0 <= int(r) < n]
    if bad:
        raise ValueError(f"ranks {bad} outside [0, {n}) of {n} finite values of {column}")
    wanted = {int(r): int(r) + 1 for r in ranks}
    found, _ = refine(engine, frame, float_keys, wanted, kmin, kmax, column, buckets=buckets)
    return [float(from_keys(found[int(r)])) for r in ranks]


def kth_smallest(engine: Any, frame: Any, column: str, n: int, k: int) -> float:
    """The k-th smallest of the n finite values of `column` (1-based k; +inf when k >= n:
    a cap at or above the count keeps every row)."""
    if k >= n:
        return float("inf")
    return order_statistics(engine, frame, column, [k - 1])[0]


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


def exact_quantiles(engine: Any, frame: Any, column: str, qs: Sequence[float],
                    buckets: int = BUCKETS) -> list[float]:
    """numpy.quantile(finite values of column, qs) (method "linear"), exactly."""
    _, n, _, _ = key_stats(engine, frame, float_keys, column)
    if n == 0:
        raise ValueError(f"no finite values of {column}: cannot take quantiles")
    ranks = needed_ranks(n, qs)
    values = dict(zip(ranks, order_statistics(engine, frame, column, ranks, buckets),
                      strict=True))
    return [float(v) for v in linear_quantiles(n, qs, values.__getitem__)]


# ------------------------------------------------------------------ the fingerprint


def row_hashes(frame: pd.DataFrame, columns: Sequence[str] | None = None) -> np.ndarray:
    """(n,) uint64 hash of each row over `columns` (default all), in sorted-name order,
    index ignored (pandas `hash_pandas_object`; unhashable cells, e.g. embeddings as
    lists, by repr)."""
    cols = sorted(map(str, frame.columns if columns is None else columns))
    if not len(frame) or not cols:
        return np.zeros(0, np.uint64)
    sub = frame[cols]
    try:
        rows = pd.util.hash_pandas_object(sub, index=False).to_numpy()
    except TypeError:
        sub = sub.apply(lambda s: s.map(repr) if s.dtype == object else s)
        rows = pd.util.hash_pandas_object(sub, index=False).to_numpy()
    return rows.astype(np.uint64)


def valued_columns(part: pd.DataFrame) -> set[str]:
    """The columns of `part` holding at least one value (not all null)."""
    return {str(c) for c in part.columns if part[c].notna().any()}


def _top(h: np.ndarray) -> np.ndarray:
    return (h >> np.uint64(64 - FINGERPRINT_TOP_BITS)).astype(np.int64)


def _range_counts(part: pd.DataFrame, columns: list[str]) -> np.ndarray:
    return np.bincount(_top(row_hashes(part, columns)), minlength=2 ** FINGERPRINT_TOP_BITS)


def _hashes_in(part: pd.DataFrame, columns: list[str], first: int, last: int) -> np.ndarray:
    h = row_hashes(part, columns)
    top = _top(h)
    return h[(top >= first) & (top <= last)]


def fingerprint_start(columns: Sequence[str], rows: int) -> Any:
    """The sha256 state after the header: sorted column names and the row count."""
    h = hashlib.sha256()
    h.update(json.dumps({"columns": sorted(map(str, columns)), "rows": int(rows)}).encode())
    return h


def frame_fingerprint(ledger: pd.DataFrame) -> str:
    """`ledger_fingerprint` of one pandas frame (its sorted row hashes in one piece)."""
    columns = sorted(valued_columns(ledger))
    h = fingerprint_start(columns, len(ledger))
    if len(ledger) and columns:
        h.update(np.sort(row_hashes(ledger, columns)).tobytes())
    return h.hexdigest()


def ledger_fingerprint(engine: Any, frame: Any,
                       chunk_rows: int = FINGERPRINT_CHUNK_ROWS) -> str:
    """sha256 hex of a ledger's content, independent of row order, column order,
    partitioning and engine: the names of the columns that hold a value (a column all
    null counts as absent, `has_values`' rule: a JSON Lines dataset read on Dask carries
    every contract column, a local read only those present), the row count and the sorted
    row hashes over those columns (`row_hashes`), sorted range by range of their top bits
    (see the module docstring)."""
    columns = sorted(set().union(*engine.each(valued_columns, frame)))
    counts = np.sum(engine.each(_range_counts, frame, columns), axis=0)
    n = int(counts.sum()) if columns else sum(engine.each(len, frame))
    h = fingerprint_start(columns, n)
    if n == 0 or not columns:
        return h.hexdigest()
    first, held = 0, 0
    for i, c in enumerate(counts):  # consecutive ranges of at most chunk_rows hashes
        held += int(c)
        last_range = i == len(counts) - 1
        if last_range or held + int(counts[i + 1]) > chunk_rows:
            if held:
                got = engine.each(_hashes_in, frame, columns, first, i)
                h.update(np.sort(np.concatenate(got)).tobytes())
            first, held = i + 1, 0
    return h.hexdigest()
