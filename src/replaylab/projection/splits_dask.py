"""Time-ordered, session-grouped splits on Dask: exact boundaries, labels per partition.

The rule is `splits.time_ordered_splits`, in the two steps of `splits.split_boundaries`
and `splits.assign_splits`:

1. Boundaries (`split_boundaries_dask`): the first session of `calibration` is
   the first session, in (start, session_id) order, whose preceding sessions
   hold at least train * n rows; the first of `test` likewise with
   (train + calibration) * n. Each is a row-weighted order statistic of the
   per-session opening times, found exactly by a distributed selection:

   - the per-session table (session_id, start, last, rows) is built per
     partition (sessions are whole in one partition after `project_dask`'s
     shuffle) and persisted on the workers: one row per session, never
     gathered;
   - t1 = min{t : W(<= t) >= threshold}, W(<= t) being the rows of sessions
     opened at or before t, is found by histogram refinement over int64 ms:
     each pass sums, per partition and then across partitions, the rows of
     sessions opened in each of 4096 buckets of the current interval, and the
     driver keeps the bucket where the cumulative count crosses the
     threshold; the interval shrinks 4096-fold per pass until it is one
     millisecond (3 passes for a span of a month, 6 at most for int64);
   - every session opened before t1 precedes the split (its rows before it are
     at most W(<= t) - 1 < threshold for t < t1), every session opened after t1
     is in it or later, so the first session is one of those opened at t1 (the
     only ones gathered: ids and row counts of the sessions sharing that one
     millisecond), resolved by session_id as the pandas rule does, else the
     smallest session_id opened at the next opening time after t1.

   All sums are int64 and compared with the same float threshold as the
   pandas rule, so the boundaries are the pandas ones, not an approximate
   quantile (dask's `quantile` is approximate; not used). The driver holds
   O(buckets + sessions tied at one millisecond) values.
2. Labels (`assign_splits_dask`): `splits.assign_splits` per partition with the
   boundaries; a session's rows are all in its partition, so its start, last
   dispatch and key are exact there, and no session straddles two splits.
3. Counts (`split_summary_dask`): rows and sessions per split, summed per
   partition on the cluster; only the small dict comes back.

The input is a features frame whose sessions are whole in one partition:
`project_dask`'s output (persist it first on a cluster, or each step recomputes
the projection).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd

from replaylab.contracts.columns import Ledger as L
from replaylab.projection.config import SplitConfig
from replaylab.projection.splits import (
    SPLITS,
    assign_splits,
    boundaries_record,
    first_session_record,
    thresholds,
)
from replaylab.stats import histogram_edges

BUCKETS = 4096  # histogram buckets per refinement pass
SESSION_TABLE_META = pd.DataFrame({
    L.SESSION_ID: pd.Series([], dtype=object), "start": pd.Series([], dtype="int64"),
    "last": pd.Series([], dtype="int64"), "rows": pd.Series([], dtype="int64")})


# ------------------------------------------------------------- per-session table


def _sessions_of(part: pd.DataFrame) -> pd.DataFrame:
    """One row per session of a session-whole partition: id, first and last dispatch, rows."""
    if len(part) == 0:
        return SESSION_TABLE_META.copy()
    t = part[L.TIMESTAMP]
    if not pd.api.types.is_integer_dtype(t):
        raise TypeError(f"{L.TIMESTAMP} must be int64 epoch ms (got {t.dtype})")
    codes, ids = pd.factorize(part[L.SESSION_ID])
    g = pd.Series(t.to_numpy(dtype="int64")).groupby(codes, sort=True)
    return pd.DataFrame({L.SESSION_ID: np.asarray(ids, dtype=object),
                         "start": g.min().to_numpy(), "last": g.max().to_numpy(),
                         "rows": g.size().to_numpy().astype("int64")})


def session_table_dask(features: dd.DataFrame) -> dd.DataFrame:
    """Lazy per-session table (session_id, start, last, rows), partitioned as `features`.

    features must have every session whole in one partition (`project_dask`).
    """
    return features[[L.SESSION_ID, L.TIMESTAMP]].map_partitions(
        _sessions_of, meta=SESSION_TABLE_META)


def _on_cluster(table: dd.DataFrame, fn: Callable, combine: Callable, *args: object) -> object:
    """fn(partition, *args) on every partition, combined there; only the result comes back."""
    parts = [dask.delayed(fn)(p, *args) for p in table.to_delayed()]
    return dask.delayed(combine)(parts).compute()


# ------------------------------------------------------------- passes (per partition)


def _stats(p: pd.DataFrame) -> tuple[int, int, int | None, int | None]:
    if len(p) == 0:
        return 0, 0, None, None
    s = p["start"].to_numpy()
    return int(p["rows"].sum()), len(p), int(s.min()), int(s.max())


def _stats_sum(parts: Sequence[tuple]) -> tuple[int, int, int | None, int | None]:
    lo = [x[2] for x in parts if x[2] is not None]
    hi = [x[3] for x in parts if x[3] is not None]
    return (sum(x[0] for x in parts), sum(x[1] for x in parts),
            min(lo) if lo else None, max(hi) if hi else None)


def _histograms(p: pd.DataFrame, edges: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Per edge vector e: rows of sessions opened in (e[i-1], e[i]], at index i (0 unused)."""
    s, w = p["start"].to_numpy(), p["rows"].to_numpy()
    out = []
    for e in edges:
        inside = (s > e[0]) & (s <= e[-1])
        idx = np.searchsorted(e, s[inside], side="left")
        h = np.zeros(len(e), dtype=np.int64)
        np.add.at(h, idx, w[inside])
        out.append(h)
    return out


def _histograms_sum(parts: Sequence[list[np.ndarray]]) -> list[np.ndarray]:
    return [np.sum([p[k] for p in parts], axis=0) for k in range(len(parts[0]))]


def _ties(p: pd.DataFrame, times: Sequence[int]) -> list[tuple]:
    """Per t: rows of sessions opened before t, (ids, rows) of those opened at t, next start."""
    s, w = p["start"].to_numpy(), p["rows"].to_numpy()
    ids = p[L.SESSION_ID].to_numpy(dtype=object)
    out = []
    for t in times:
        at = s == t
        after = s[s > t]
        out.append((int(w[s < t].sum()), ids[at], w[at], int(after.min()) if len(after) else None))
    return out


def _ties_sum(parts: Sequence[list[tuple]]) -> list[tuple]:
    out = []
    for k in range(len(parts[0])):
        nxt = [p[k][3] for p in parts if p[k][3] is not None]
        out.append((sum(p[k][0] for p in parts),
                    np.concatenate([p[k][1] for p in parts]),
                    np.concatenate([p[k][2] for p in parts]).astype(np.int64),
                    min(nxt) if nxt else None))
    return out


def _first_id(p: pd.DataFrame, times: Sequence[int]) -> list[str | None]:
    """Per t: the smallest session_id opened at t in this partition (None if none)."""
    s, ids = p["start"].to_numpy(), p[L.SESSION_ID].to_numpy(dtype=object)
    return [min(ids[s == t]) if (s == t).any() else None for t in times]


def _first_id_min(parts: Sequence[list]) -> list[str | None]:
    out = []
    for k in range(len(parts[0])):
        got = [p[k] for p in parts if p[k] is not None]
        out.append(min(got) if got else None)
    return out


# ------------------------------------------------------------- the selection


def _crossing_times(table: dd.DataFrame, n: int, start_min: int, start_max: int,
                    targets: dict[str, float], buckets: int) -> tuple[dict[str, int | None], int]:
    """Per target threshold: t1 = min{t : W(<= t) >= threshold} (None if no session can reach
    it); and the number of histogram passes run."""
    found: dict[str, int | None] = {}
    state: dict[str, list[int]] = {}  # name -> [lo, hi, W(<= lo)], W(<= lo) < thr <= W(<= hi)
    for name, thr in targets.items():
        if np.int64(0) >= thr:
            found[name] = start_min
        elif np.int64(n) < thr:
            found[name] = None
        else:
            state[name] = [start_min - 1, start_max, 0]
    passes = 0
    while state:
        names = [k for k, (lo, hi, _) in state.items() if hi - lo > 1]
        for k in [k for k in state if k not in names]:
            found[k] = state.pop(k)[1]
        if not names:
            break
        edges = [histogram_edges(state[k][0], state[k][1], buckets) for k in names]
        hists = _on_cluster(table, _histograms, _histograms_sum, edges)
        passes += 1
        for k, e, h in zip(names, edges, hists, strict=True):
            cum = np.int64(state[k][2]) + np.cumsum(h[1:])  # W(<= e[i]) at i - 1
            j = int(np.argmax(cum >= targets[k]))  # exists: W(<= hi) >= threshold
            state[k] = [int(e[j]), int(e[j + 1]), int(cum[j - 1]) if j > 0 else state[k][2]]
    return found, passes


def split_boundaries_dask(features: dd.DataFrame, cfg: SplitConfig | None = None, *,
                          buckets: int = BUCKETS) -> dict:
    """`splits.split_boundaries` of a session-partitioned dask frame, computed on the cluster.

    features: dask frame with `session_id` and `timestamp` (int64 epoch ms), every
    session whole in one partition (`project_dask`). Returns the same dict as the
    pandas `split_boundaries` (first session of each later split: id, start in epoch
    ms and ISO, rows before it; thresholds, totals, embargo), plus `selection`:
    the passes the distributed selection took (not part of the rule).
    """
    cfg = cfg or SplitConfig()
    table = session_table_dask(features).persist()  # on the workers under a client
    try:
        n, sessions, start_min, start_max = _on_cluster(table, _stats, _stats_sum)
        if n == 0:
            out = boundaries_record(0, 0, {}, cfg)
            out["selection"] = {"histogram_passes": 0, "tied_sessions_gathered": 0}
            return out
        targets = thresholds(n, cfg)
        t1, passes = _crossing_times(table, n, start_min, start_max, targets, buckets)
        wanted = sorted({t for t in t1.values() if t is not None})
        ties = dict(zip(wanted, _on_cluster(table, _ties, _ties_sum, wanted) if wanted else [],
                        strict=True))
        first: dict[str, dict | None] = {}
        pending: dict[str, tuple[int, int]] = {}  # name -> (next start, rows before it)
        for name, thr in targets.items():
            if t1[name] is None:
                first[name] = None
                continue
            below, ids, rows, nxt = ties[t1[name]]
            order = np.argsort(ids, kind="stable")  # session_id order (python str compare)
            before = np.int64(below) + np.cumsum(rows[order]) - rows[order]
            ok = np.flatnonzero(before >= thr)
            if len(ok):
                i = order[ok[0]]
                first[name] = first_session_record(t1[name], ids[i], before[ok[0]])
            elif nxt is None:
                first[name] = None
            else:  # every session opened at the next time qualifies: take the smallest id
                pending[name] = (nxt, int(below + rows.sum()))
        if pending:
            times = sorted({t for t, _ in pending.values()})
            ids_at = dict(zip(times, _on_cluster(table, _first_id, _first_id_min, times),
                              strict=True))
            for name, (t, before) in pending.items():
                first[name] = first_session_record(t, ids_at[t], before)
        out = boundaries_record(n, sessions, first, cfg)
        out["selection"] = {"histogram_passes": passes, "buckets": buckets,
                            "tied_sessions_gathered": int(sum(len(v[1]) for v in ties.values()))}
        return out
    finally:
        del table


def assign_splits_dask(features: dd.DataFrame, boundaries: dict,
                       cfg: SplitConfig | None = None) -> dd.Series:
    """Lazy split label per row (`splits.assign_splits` on each session-whole partition).

    Returns an object Series named `split`, partitioned like `features`
    (`features.assign(split=...)` puts it beside the rows).
    """
    cfg = cfg or SplitConfig()
    return features[[L.SESSION_ID, L.TIMESTAMP]].map_partitions(
        assign_splits, boundaries, cfg, meta=pd.Series([], dtype=object, name="split"))


def _counts(part: pd.DataFrame) -> dict[str, np.ndarray]:
    rows = part["split"].value_counts()
    sessions = part.drop_duplicates([L.SESSION_ID, "split"])["split"].value_counts()
    return {"rows": np.array([int(rows.get(s, 0)) for s in SPLITS], dtype=np.int64),
            "sessions": np.array([int(sessions.get(s, 0)) for s in SPLITS], dtype=np.int64)}


def _counts_sum(parts: Sequence[dict]) -> dict[str, np.ndarray]:
    return {k: np.sum([p[k] for p in parts], axis=0) for k in ("rows", "sessions")}


def split_summary_dask(features: dd.DataFrame, boundaries: dict, labels: dd.Series) -> dict:
    """The summary's split section, from small aggregates computed on the cluster.

    Returns {"boundaries": boundaries, "rows": {split: rows}, "sessions": {split:
    sessions with a row labelled so}} for every split of `splits.SPLITS`.
    Sessions are whole in a partition, so per-partition distinct counts add up.
    """
    frame = features[[L.SESSION_ID]].assign(split=labels)
    parts = [dask.delayed(_counts)(p) for p in frame.to_delayed()]
    got = dask.delayed(_counts_sum)(parts).compute()
    return {"boundaries": boundaries,
            "rows": {s: int(v) for s, v in zip(SPLITS, got["rows"], strict=True)},
            "sessions": {s: int(v) for s, v in zip(SPLITS, got["sessions"], strict=True)}}


def project_and_split_dask(valid: dd.DataFrame, projection: object = None,
                           split: SplitConfig | None = None, *,
                           npartitions: int | None = None) -> tuple[dd.DataFrame, dict]:
    """compute=dask end to end: features with a `split` column (persisted), and the summary.

    valid: dask frame of valid ledger-v1 rows. The features are persisted (on the
    workers under a distributed client) so the boundaries, labels and counts reuse
    them; the caller writes them out partition by partition (e.g. `to_parquet`).
    Returns (features with `split`, `split_summary_dask(...)`).
    """
    from replaylab.projection.distributed import no_string_conversion, project_dask

    split = split or SplitConfig()
    with no_string_conversion():
        features = project_dask(valid, projection, npartitions=npartitions).persist()
        boundaries = split_boundaries_dask(features, split)
        labels = assign_splits_dask(features, boundaries, split)
        summary = split_summary_dask(features, boundaries, labels)
        return features.assign(split=labels).persist(), summary
