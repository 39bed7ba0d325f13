"""The projection and the splits over an engine's partitions (`replaylab.compute`): one
implementation for both engines.

Features. History features only look inside a session, so once every session is whole
in one partition (`Engine.shuffle_by(session_id)`; one partition: nothing moves) the
pandas `dispatch_time_features` computes exactly the same rows there. Only the columns
the projection reads travel (`keep_columns`). The leakage guard (cfg.canary_checks)
runs inside each partition on its rows.

Splits. The rule is `splits.time_ordered_splits`, in the two steps of
`splits.split_boundaries` and `splits.assign_splits`:

1. Boundaries (`split_boundaries_on`): the first session of `calibration` is the first
   session, in (start, session_id) order, whose preceding sessions hold at least
   train * n rows; the first of `test` likewise with (train + calibration) * n. Each is
   a row-weighted order statistic of the per-session opening times:
   - the per-session table (session_id, start, last, rows) is built per partition
     (`sessions_of`; sessions are whole) and persisted: one row per session, never
     gathered;
   - t1 = min{t : W(<= t) >= threshold}, W(<= t) the rows of sessions opened at or
     before t, is found exactly by `compute.ops.refine` (histogram refinement over int64
     ms, written once for every order statistic);
   - every session opened before t1 precedes the split, every session opened after t1
     is in it or later, so the first session is one of those opened at t1 (the only ones
     gathered: ids and row counts of the sessions sharing that millisecond), resolved by
     session_id as the pandas rule does, else the smallest session_id opened at the
     next opening time after t1.
   All sums are int64 and compared with the same float threshold as the pandas rule, so
   the boundaries are the pandas ones. The driver holds O(buckets + tied sessions).
2. Labels (`assign_splits` per partition with the boundaries): a session's rows are all
   in its partition, so no session straddles two splits.
3. Counts (`split_facts`): rows and sessions per split, summed over partitions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from replaylab.compute import ops
from replaylab.contracts.columns import Ledger as L
from replaylab.projection.config import ProjectionConfig, SplitConfig
from replaylab.projection.features import INPUT_COLUMNS, dispatch_time_features
from replaylab.projection.splits import (
    SPLITS,
    assign_splits,
    boundaries_record,
    first_session_record,
    thresholds,
)

SPLIT_COLUMN = "split"
SESSION_TABLE_META = pd.DataFrame({
    L.SESSION_ID: pd.Series([], dtype=object), "start": pd.Series([], dtype="int64"),
    "last": pd.Series([], dtype="int64"), "rows": pd.Series([], dtype="int64")})


# ------------------------------------------------------------- features


def keep_columns(columns: Sequence[str], cfg: ProjectionConfig) -> list[str]:
    """The columns the projection reads, in the ledger's order: only these travel."""
    wanted = {*INPUT_COLUMNS, *cfg.extra_feature_columns}
    return [c for c in columns if c in wanted]


def object_strings(part: pd.DataFrame) -> pd.DataFrame:
    """String-dtype columns (pyarrow or python) as object with None for missing, as
    `validate_ledger(...).valid` holds them, so the projection's output dtypes and null
    markers are the pandas path's whatever string dtype a partition arrives with."""
    cols = [c for c, d in part.dtypes.items() if isinstance(d, pd.StringDtype)]
    if not cols:
        return part
    part = part.copy(deep=False)
    for c in cols:
        s = part[c]
        part[c] = pd.Series(s.to_numpy(dtype=object, na_value=None), index=s.index, dtype=object)
    return part


def project_partition(part: pd.DataFrame, cfg: ProjectionConfig, columns: list[str],
                      ) -> pd.DataFrame:
    """The pandas projection of one session-whole partition (only `columns` read)."""
    return dispatch_time_features(object_strings(part[columns]), cfg)


def features_meta(columns: list[str], cfg: ProjectionConfig, meta: pd.DataFrame,
                  with_split: bool) -> pd.DataFrame:
    """The projection of the empty frame: a lazy map's meta."""
    out = dispatch_time_features(object_strings(meta[columns]), replace(cfg, canary_checks=False))
    if with_split:
        out[SPLIT_COLUMN] = pd.Series([], dtype=object)
    return out


# ------------------------------------------------------------- the session table


def sessions_of(part: pd.DataFrame) -> pd.DataFrame:
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


def session_starts(table: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(opening ms, rows) of every session of a session-table partition."""
    return table["start"].to_numpy(dtype="int64"), table["rows"].to_numpy(dtype="int64")


def ties_at(table: pd.DataFrame, times: Sequence[int]) -> list[tuple]:
    """Per t: rows of sessions opened before t, (ids, rows) of those opened at t, next start."""
    s, w = table["start"].to_numpy(), table["rows"].to_numpy()
    ids = table[L.SESSION_ID].to_numpy(dtype=object)
    out = []
    for t in times:
        at = s == t
        after = s[s > t]
        out.append((int(w[s < t].sum()), ids[at], w[at].astype(np.int64),
                    int(after.min()) if len(after) else None))
    return out


def first_ids_at(table: pd.DataFrame, times: Sequence[int]) -> list[str | None]:
    """Per t: the smallest session_id opened at t in this partition (None if none)."""
    s, ids = table["start"].to_numpy(), table[L.SESSION_ID].to_numpy(dtype=object)
    return [min(ids[s == t]) if (s == t).any() else None for t in times]


def _combine_ties(parts: list[list[tuple]], k: int) -> tuple:
    nxt = [p[k][3] for p in parts if p[k][3] is not None]
    return (sum(p[k][0] for p in parts), np.concatenate([p[k][1] for p in parts]),
            np.concatenate([p[k][2] for p in parts]).astype(np.int64),
            min(nxt) if nxt else None)


# ------------------------------------------------------------- boundaries, labels, counts


def split_boundaries_on(engine: Any, features: Any, cfg: SplitConfig | None = None, *,
                        buckets: int = ops.BUCKETS) -> dict:
    """`splits.split_boundaries` of a session-partitioned frame on `engine`, exactly.

    features: a Frame with `session_id` and `timestamp` (int64 epoch ms), every session
    whole in one partition. Returns the pandas `split_boundaries` dict plus `selection`
    (the passes the selection took; not part of the rule)."""
    cfg = cfg or SplitConfig()
    table = engine.persist(engine.map(sessions_of, features, meta=SESSION_TABLE_META))
    n, sessions, start_min, start_max = ops.key_stats(engine, table, session_starts)
    if n == 0:
        out = boundaries_record(0, 0, {}, cfg)
        out["selection"] = {"histogram_passes": 0, "tied_sessions_gathered": 0}
        return out
    targets = thresholds(n, cfg)
    t1, passes = ops.refine(engine, table, session_starts, targets, start_min, start_max,
                            buckets=buckets)
    wanted = sorted({t for t in t1.values() if t is not None})
    got = engine.each(ties_at, table, wanted) if wanted else []
    ties = {t: _combine_ties(got, k) for k, t in enumerate(wanted)}
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
        per_part = engine.each(first_ids_at, table, times)
        for name, (t, before) in pending.items():
            k = times.index(t)
            first[name] = first_session_record(
                t, min(p[k] for p in per_part if p[k] is not None), before)
    out = boundaries_record(n, sessions, first, cfg)
    out["selection"] = {"histogram_passes": passes, "buckets": buckets,
                        "tied_sessions_gathered": int(sum(len(v[1]) for v in ties.values()))}
    return out


def split_counts_of(part: pd.DataFrame) -> dict[str, np.ndarray]:
    """Rows and sessions per split (`SPLITS` order) of a session-whole partition."""
    rows = part[SPLIT_COLUMN].value_counts()
    sessions = part.drop_duplicates([L.SESSION_ID, SPLIT_COLUMN])[SPLIT_COLUMN].value_counts()
    return {"rows": np.array([int(rows.get(s, 0)) for s in SPLITS], dtype=np.int64),
            "sessions": np.array([int(sessions.get(s, 0)) for s in SPLITS], dtype=np.int64)}


def split_facts(engine: Any, features: Any, boundaries: dict) -> dict:
    """{"boundaries", "rows": {split: rows}, "sessions": {split: sessions}} for every split
    of `SPLITS`, summed over the partitions (sessions are whole, so their counts add up)."""
    parts = engine.each(split_counts_of, features)
    rows = np.sum([p["rows"] for p in parts], axis=0) if parts else np.zeros(len(SPLITS))
    sessions = (np.sum([p["sessions"] for p in parts], axis=0) if parts
                else np.zeros(len(SPLITS)))
    return {"boundaries": boundaries,
            "rows": {s: int(v) for s, v in zip(SPLITS, rows, strict=True)},
            "sessions": {s: int(v) for s, v in zip(SPLITS, sessions, strict=True)}}


def project_and_split(engine: Any, valid: Any, projection: ProjectionConfig | None = None,
                      split: SplitConfig | None = None) -> tuple[Any, dict]:
    """Features with a `split` column (persisted, partitioned by session) and the split
    facts (`split_facts`), for the valid ledger rows `valid` (a Frame) on `engine`.

    The rows (only the columns read) are shuffled on session_id once; the features are
    computed per partition for the boundaries' session table, then once more with the
    labels (a lazy map on Dask: the persisted copy is the one with the split)."""
    projection = projection or ProjectionConfig()
    split = split or SplitConfig()
    columns = keep_columns(engine.columns(valid), projection)
    meta = engine.meta(valid)
    rows = engine.persist(engine.shuffle_by(engine.map(_select, valid, columns,
                                                       meta=meta[columns]), L.SESSION_ID))
    plain = engine.persist(engine.map(project_partition, rows, projection, columns,
                                      meta=features_meta(columns, projection, meta, False)))
    boundaries = split_boundaries_on(engine, plain, split)
    features = engine.persist(engine.map(_with_split, plain, split, boundaries,
                                         meta=features_meta(columns, projection, meta, True)))
    return features, split_facts(engine, features, boundaries)


def _select(part: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    return part[columns]


def _with_split(part: pd.DataFrame, split: SplitConfig, boundaries: dict) -> pd.DataFrame:
    return part.assign(**{SPLIT_COLUMN: assign_splits(part, boundaries, split)
                          .to_numpy(dtype=object)})
