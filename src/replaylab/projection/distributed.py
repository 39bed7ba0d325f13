"""The projection on Dask: partition by session, map the pandas projection.

History features only look inside a session, so once every session is whole in
one partition the pandas function computes exactly the same rows there. The
ledger is shuffled on `session_id` (dask hashes the column: equal ids land in
the same partition) with the task-based shuffle, which pickles pandas frames and
so keeps the nullable dtypes and object strings the pandas path sees.

Pandas input on a distributed client skips the dask frame: rows are split by
hash(session_id) here, scattered to the workers and mapped with `client.map`.

The leakage guard (cfg.canary_checks) runs inside each partition on its rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace

import dask
import dask.dataframe as dd
import numpy as np
import pandas as pd

from replaylab.contracts.columns import Ledger as L
from replaylab.projection.config import ProjectionConfig
from replaylab.projection.features import INPUT_COLUMNS, dispatch_time_features

_ROWS_PER_PARTITION = 250_000


def _connect(client: object) -> tuple[object | None, bool]:
    """(client to use, or None for dask's local scheduler; whether we own it)."""
    if isinstance(client, str):
        from distributed import Client

        return Client(client), True
    if client is None:
        try:
            from distributed import default_client

            return default_client(), False
        except (ImportError, ValueError):  # no distributed, or no client made yet
            return None, False
    return client, False


def _keep(ledger: pd.DataFrame | dd.DataFrame, cfg: ProjectionConfig) -> list[str]:
    """The columns the projection reads: only these travel to the workers."""
    return [c for c in (*INPUT_COLUMNS, *cfg.extra_feature_columns) if c in ledger.columns]


def _session_partitions(ledger: pd.DataFrame, cols: list[str], parts: int,
                        ) -> tuple[Iterator[pd.DataFrame], np.ndarray]:
    """Split rows by hash(session_id) % parts: each session whole in one piece.

    Returns a generator of the pieces (rows in ledger order inside each; made one
    at a time, so at most one copy is held) and `order`, the ledger positions of
    the concatenated pieces' rows.
    """
    h = pd.util.hash_array(ledger[L.SESSION_ID].to_numpy(dtype=object)) % np.uint64(parts)
    order = np.argsort(h, kind="stable")
    bounds = np.searchsorted(h[order], np.arange(parts + 1, dtype=np.uint64))
    at = [ledger.columns.get_loc(c) for c in cols]
    pieces = (ledger.iloc[order[bounds[k]:bounds[k + 1]], at] for k in range(parts))
    return pieces, order


def _pandas_on_client(ledger: pd.DataFrame, cfg: ProjectionConfig, client: object,
                      parts: int) -> pd.DataFrame:
    """Pandas input on a distributed client: hash-partition here, scatter, map, gather.

    Pieces go one at a time, round-robin over the workers, and each is submitted
    at once, so the projection of one overlaps the transfer of the next.
    """
    pieces, order = _session_partitions(ledger, _keep(ledger, cfg), parts)
    workers = sorted(client.scheduler_info()["workers"]) or [None]
    done = []
    for k, piece in enumerate(pieces):
        target = None if workers[0] is None else [workers[k % len(workers)]]
        data = client.scatter(piece, workers=target, hash=False)
        done.append(client.submit(dispatch_time_features, data, cfg, workers=target))
        del piece, data
    gathered = client.gather(done)
    del done  # release the pieces and results held by the workers
    result = pd.concat(gathered, ignore_index=True)
    del gathered
    back = np.empty_like(order)
    back[order] = np.arange(len(order))  # concatenated row of each ledger position
    result = result.take(back)
    result.index = ledger.index
    return result


def _object_strings(part: pd.DataFrame) -> pd.DataFrame:
    """String-dtype columns (pyarrow or python) as object with None for missing, as
    `validate_ledger(...).valid` holds them, so the projection's output dtypes and
    null markers are the pandas path's whatever string dtype the dask frame used."""
    cols = [c for c, d in part.dtypes.items() if isinstance(d, pd.StringDtype)]
    if not cols:
        return part
    part = part.copy(deep=False)
    for c in cols:
        s = part[c]
        part[c] = pd.Series(s.to_numpy(dtype=object, na_value=None), index=s.index, dtype=object)
    return part


def _project_partition(part: pd.DataFrame, cfg: ProjectionConfig) -> pd.DataFrame:
    """The pandas projection of one session-whole partition."""
    return dispatch_time_features(_object_strings(part), cfg)


def _dask_frame(ledger: pd.DataFrame | dd.DataFrame, cfg: ProjectionConfig,
                parts: int | None) -> dd.DataFrame:
    """Lazy projection: shuffle on session_id (equal ids -> one partition), then map."""
    cols = _keep(ledger, cfg)
    if isinstance(ledger, pd.DataFrame):
        # positional index: the result is put back in the caller's row order by it
        ddf = dd.from_pandas(ledger[cols].reset_index(drop=True), npartitions=parts, sort=False)
    else:
        ddf = ledger[cols]
    ddf = ddf.shuffle(on=L.SESSION_ID, npartitions=parts or ddf.npartitions,
                      shuffle_method="tasks")
    meta = _project_partition(ddf._meta, replace(cfg, canary_checks=False))
    return ddf.map_partitions(_project_partition, cfg, meta=meta)


def project_dask(valid: dd.DataFrame, cfg: ProjectionConfig | None = None, *,
                 npartitions: int | None = None) -> dd.DataFrame:
    """Lazy dispatch-time features of a dask frame of valid ledger-v1 rows; nothing computed.

    valid: validated rows (e.g. `replaylab.contracts.dataset`), any partitioning.
    The rows (only the columns the projection reads) are shuffled on
    `session_id` once, with the task-based shuffle (pandas frames pickled: the
    nullable dtypes and object strings of the pandas path survive), into
    `npartitions` (default: the input's), and `dispatch_time_features` runs on
    each partition with an explicit `meta` (the projection of the empty frame).
    Every session is whole in one partition of the result (splits_dask relies on
    it). Each partition equals the pandas projection of its rows; the driver
    holds only the graph. Build and compute it with dataframe.convert-string off
    (`no_string_conversion()`), or strings become pyarrow ones.
    """
    if not isinstance(valid, dd.DataFrame):
        raise TypeError(f"project_dask takes a dask DataFrame (got {type(valid).__name__}); "
                        "pandas input: dispatch_time_features_dask")
    with no_string_conversion():
        return _dask_frame(valid, cfg or ProjectionConfig(), npartitions)


def no_string_conversion() -> object:
    """dask config context: keep object strings (the pandas path's dtypes) in dask frames."""
    return dask.config.set({"dataframe.convert-string": False})


def dispatch_time_features_dask(ledger: pd.DataFrame | dd.DataFrame,
                                cfg: ProjectionConfig | None = None,
                                client: object = None, *, npartitions: int | None = None,
                                compute: bool = True) -> pd.DataFrame | dd.DataFrame:
    """`dispatch_time_features` on a Dask cluster, partitioned by session.

    ledger: validated ledger-v1, pandas (n, *) or dask. client: a
    `distributed.Client`, a scheduler address (connected and closed here), or
    None (the current distributed client if one exists, else dask's local
    scheduler). npartitions: session partitions (default: about 250k rows each
    for pandas input, the input's count for dask input).

    Pandas input with a client is hash-partitioned on session_id here and the
    pieces are scattered (no 1M-row graph); otherwise the dask frame is shuffled
    on session_id. Returns a pandas frame equal to the pandas path: for pandas
    input in the caller's row order and index; for dask input sorted by
    request_id with a fresh RangeIndex. compute=False: the lazy dask frame.
    """
    cfg = cfg or ProjectionConfig()
    is_pandas = isinstance(ledger, pd.DataFrame)
    parts = npartitions or (max(2, math.ceil(len(ledger) / _ROWS_PER_PARTITION))
                            if is_pandas else None)
    conn, owned = _connect(client)
    try:
        if is_pandas and compute and conn is not None:
            return _pandas_on_client(ledger, cfg, conn, parts)
        with dask.config.set({"dataframe.convert-string": False}):
            out = _dask_frame(ledger, cfg, parts)
            if not compute:
                return out
            result = out.compute() if conn is None else conn.compute(out, sync=True)
    finally:
        if owned:
            conn.close()
    if is_pandas:
        result = result.sort_index()
        result.index = ledger.index
        return result
    return result.sort_values(L.REQUEST_ID, kind="stable", ignore_index=True)
