"""The two engines: where the partitions of a pipeline are processed.

A `Frame` is opaque to the pipelines: a list of pandas DataFrames on `LocalEngine`,
a dask DataFrame on `DaskEngine`. A pipeline is written once against `Engine`:
it maps pandas functions over partitions (`map`, lazy on Dask), brings back small
per-partition results (`each`: sums, histograms, counts; the driver combines them),
and writes partitions (`write`). The generic operations over those two calls
(exact order statistics, hashed samples, the session bootstrap, the ledger
fingerprint) are `replaylab.compute.ops`, written once for both engines.

Nothing is imported from Dask until a `DaskEngine` is made (no I/O at import).
"""

from __future__ import annotations

import logging
import resource
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from replaylab.compute.config import ComputeConfig
from replaylab.compute.ledger import (
    DEFAULT_BLOCKSIZE,
    LedgerAccounting,
    read_ledger_dask,
    read_ledger_dataset,
)
from replaylab.compute.stages import DaskStages, LocalStages
from replaylab.contracts.io import write_quarantine
from replaylab.contracts.schema import ValidationResult

Frame = Any  # list[pd.DataFrame] (local) | dask.dataframe.DataFrame (dask)
log = logging.getLogger("replaylab")


def _part_name(i: int) -> str:
    return f"part.{i}.parquet"  # dask's own default name of partition i


class LedgerFrame:
    """A ledger read and validated per partition: `valid` (a Frame), the accounting
    (rows read = valid + quarantined, `LedgerAccounting`) and the quarantined rows
    (`write_quarantine(directory)`). Refusals are `compute.ledger`'s, unchanged."""

    def __init__(self, valid: Frame, npartitions: int, source: str, *,
                 result: ValidationResult | None = None, dataset: Any = None) -> None:
        self.valid = valid
        self.npartitions = npartitions
        self.source = source
        self.result = result  # local: the whole validated ledger
        self.dataset = dataset  # dask: the `LedgerDataset`
        self._accounting: LedgerAccounting | None = None

    @property
    def accounting(self) -> LedgerAccounting:
        """The counts (on Dask: one number per count key travels to the driver)."""
        if self._accounting is None:
            if self.result is not None:
                r = self.result
                self._accounting = LedgerAccounting(
                    self.source, r.rows_read, r.rows_valid, r.rows_quarantined,
                    dict(sorted(r.by_reason().items())))
            else:
                self._accounting = self.dataset.accounting()
        return self._accounting

    def summary(self) -> dict:
        """The counts as every pipeline's summary.json has them (`ValidationResult.summary`)."""
        if self.result is not None:
            return self.result.summary()
        return self.accounting.summary()

    def write_quarantine(self, directory: str | Path) -> str | None:
        """Write the quarantined rows under `directory`: locally `ledger.jsonl` (None when
        there are none), on Dask one `part-NNNNN.parquet` per partition written by the
        workers (the directory); the accounting is computed in the same pass."""
        if self.result is not None:
            path = write_quarantine(self.result, Path(directory) / "ledger.jsonl")
            return None if path is None else str(path)
        self._accounting = self.dataset.write_quarantine(str(directory))
        return str(directory)


class Engine(Protocol):
    """What the pipelines use; `LocalEngine` and `DaskEngine` implement it."""

    kind: str

    def facts(self) -> dict: ...
    def from_pandas(self, df: pd.DataFrame, npartitions: int = 1,
                    by: str | None = None) -> Frame: ...
    def from_validated(self, result: ValidationResult,
                       npartitions: int | None = None) -> LedgerFrame: ...
    def read_ledger(self, spec: str, **opts: Any) -> LedgerFrame: ...
    def map(self, fn: Callable, frame: Frame, *args: Any, meta: Any = None,
            **kw: Any) -> Frame: ...
    def each(self, fn: Callable, frame: Frame, *args: Any, **kw: Any) -> list: ...
    def each_sum(self, fn: Callable, frame: Frame, *args: Any) -> Any: ...
    def map_aligned(self, fn: Callable, frame: Frame, other: Frame, *args: Any,
                    meta: Any = None) -> Frame: ...
    def collect(self, frame: Frame, columns: list[str] | None = None) -> pd.DataFrame: ...
    def persist(self, frame: Frame) -> Frame: ...
    def shuffle_by(self, frame: Frame, column: str) -> Frame: ...
    def write(self, frame: Frame, path: str | Path,
              name_function: Callable[[int], str] | None = None) -> list[str]: ...
    def npartitions(self, frame: Frame) -> int: ...
    def columns(self, frame: Frame) -> list[str]: ...
    def meta(self, frame: Frame) -> pd.DataFrame: ...
    def stages(self, stages: Mapping[str, str],
               progress: Callable[[str], None] | None = None,
               ) -> AbstractContextManager: ...
    def stage(self, name: str) -> AbstractContextManager: ...
    def submit_all(self, fn: Callable, items: list, *args: Any) -> list: ...


def hash_partition(df: pd.DataFrame, column: str, npartitions: int) -> list[pd.DataFrame]:
    """Rows split by hash(column) % npartitions (pandas' stable `hash_array`), each part in
    the input's row order: every row of a key lands in one part. One part: `df` itself."""
    if npartitions <= 1:
        return [df]
    h = pd.util.hash_array(df[column].to_numpy(dtype=object)) % np.uint64(npartitions)
    return [df.iloc[np.flatnonzero(h == k)] for k in range(npartitions)]


class LocalEngine:
    """Partitions as pandas DataFrames in this process (the ledger as one or a few)."""

    kind = "local"

    def __init__(self, cfg: ComputeConfig | None = None) -> None:
        self.cfg = cfg or ComputeConfig()

    def facts(self) -> dict:
        return {"kind": "local"}

    def from_pandas(self, df: pd.DataFrame, npartitions: int = 1,
                    by: str | None = None) -> list[pd.DataFrame]:
        n = max(1, int(npartitions))
        if by is not None:
            return hash_partition(df, by, n)
        if n == 1:
            return [df]
        bounds = np.linspace(0, len(df), n + 1).astype(int)
        return [df.iloc[bounds[i]:bounds[i + 1]] for i in range(n)]

    def from_validated(self, result: ValidationResult,
                       npartitions: int | None = None) -> LedgerFrame:
        """A ledger validated in memory (e.g. the synthetic one) as a LedgerFrame."""
        valid = self.from_pandas(result.valid, npartitions or 1)
        return LedgerFrame(valid, len(valid), result.source or "", result=result)

    def read_ledger(self, spec: str, **opts: Any) -> LedgerFrame:
        """`compute.ledger.read_ledger_dataset`: a file as `read_ledger` reads it, a dataset
        in local blocks (`rows_per_block`, `storage_options`); one partition."""
        opts.pop("blocksize", None)  # a Dask partition size: not a local block
        result = read_ledger_dataset(spec, **opts)
        return LedgerFrame([result.valid], 1, str(spec), result=result)

    def map(self, fn: Callable, frame: list[pd.DataFrame], *args: Any, meta: Any = None,
            **kw: Any) -> list:
        return [fn(part, *args, **kw) for part in frame]

    def each(self, fn: Callable, frame: list, *args: Any, **kw: Any) -> list:
        return [fn(part, *args, **kw) for part in frame]

    def each_sum(self, fn: Callable, frame: list, *args: Any) -> Any:
        """fn(partition, *args) per partition, summed here."""
        return sum(self.each(fn, frame, *args))

    def map_aligned(self, fn: Callable, frame: list[pd.DataFrame], other: list[pd.DataFrame],
                    *args: Any, meta: Any = None) -> list:
        """fn(part, other_part, *args) over two frames partitioned alike (part i with
        part i: the same shuffle by the same key and partition count)."""
        if len(frame) != len(other):
            raise ValueError(f"map_aligned: {len(frame)} partitions against {len(other)}")
        return [fn(p, o, *args) for p, o in zip(frame, other, strict=True)]

    def collect(self, frame: list, columns: list[str] | None = None) -> pd.DataFrame:
        parts = [p if columns is None else p[list(columns)] for p in frame]
        if len(parts) == 1:
            return parts[0].reset_index(drop=True)
        return pd.concat(parts, ignore_index=True)

    def persist(self, frame: list) -> list:
        return frame

    def shuffle_by(self, frame: list[pd.DataFrame], column: str) -> list[pd.DataFrame]:
        if len(frame) <= 1:
            return frame
        whole = pd.concat(frame, ignore_index=True)
        return hash_partition(whole, column, len(frame))

    def write(self, frame: list[pd.DataFrame], path: str | Path,
              name_function: Callable[[int], str] | None = None) -> list[str]:
        """Each partition as `path/<name_function(i)>` (default `part.i.parquet`)."""
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        out = []
        for i, part in enumerate(frame):
            target = root / (name_function or _part_name)(i)
            part.to_parquet(target, index=False)
            out.append(str(target))
        return out

    def npartitions(self, frame: list) -> int:
        return len(frame)

    def columns(self, frame: list[pd.DataFrame]) -> list[str]:
        return list(frame[0].columns) if frame else []

    def meta(self, frame: list[pd.DataFrame]) -> pd.DataFrame:
        """The frame's columns and dtypes, no rows."""
        return frame[0].iloc[0:0] if frame else pd.DataFrame()

    def stages(self, stages: Mapping[str, str],
               progress: Callable[[str], None] | None = None) -> LocalStages:
        return LocalStages(stages, progress)

    def stage(self, name: str) -> AbstractContextManager:
        return LocalStages({name: name})(name)

    def submit_all(self, fn: Callable, items: list, *args: Any) -> list:
        return [fn(item, *args) for item in items]


class DaskEngine:
    """Partitions as a dask DataFrame on a distributed client (a LocalCluster of the run,
    or the scheduler at `cfg.address`). Made by `compute.engine(cfg)`, which starts and
    stops the cluster; `DaskEngine(client=...)` wraps a client the caller owns."""

    kind = "dask"

    def __init__(self, cfg: ComputeConfig | None = None, client: Any = None) -> None:
        self.cfg = cfg or ComputeConfig(kind="dask")
        self.client = client

    def facts(self) -> dict:
        """What summary.json says of the cluster a run used (workers as the scheduler saw
        them; the driver's own peak memory: the workers are other processes)."""
        info = self.client.scheduler_info()
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return {"kind": "dask", "driver_peak_rss_mb": round(peak_mb, 1),
                "address": self.cfg.address or "LocalCluster",
                "scheduler": info.get("address"), "n_workers": len(info.get("workers", {})),
                "dashboard": (info.get("services") or {}).get("dashboard")}

    def from_pandas(self, df: pd.DataFrame, npartitions: int = 1, by: str | None = None) -> Any:
        import dask.dataframe as dd
        from dask import delayed

        n = max(1, int(npartitions))
        if by is None:
            return dd.from_pandas(df, npartitions=n, sort=False)
        parts = hash_partition(df, by, n)
        return dd.from_delayed([delayed(p) for p in parts], meta=df.iloc[0:0],
                               verify_meta=False)

    def from_validated(self, result: ValidationResult,
                       npartitions: int | None = None) -> LedgerFrame:
        n = npartitions or max(1, -(-len(result.valid) // self.cfg.rows_per_partition))
        valid = self.from_pandas(result.valid, n)
        return LedgerFrame(valid, valid.npartitions, result.source or "", result=result)

    def read_ledger(self, spec: str, **opts: Any) -> LedgerFrame:
        """`compute.ledger.read_ledger_dask`, persisted on the workers (read once)."""
        opts.pop("rows_per_block", None)  # a local block size: not a Dask partition
        blocksize = opts.pop("blocksize", None) or DEFAULT_BLOCKSIZE
        ds = read_ledger_dask(spec, blocksize, **opts).persist()
        return LedgerFrame(ds.valid, ds.npartitions, str(spec), dataset=ds)

    def map(self, fn: Callable, frame: Any, *args: Any, meta: Any = None, **kw: Any) -> Any:
        if meta is None:
            return frame.map_partitions(fn, *args, **kw)
        return frame.map_partitions(fn, *args, meta=meta, **kw)

    def each(self, fn: Callable, frame: Any, *args: Any, **kw: Any) -> list:
        import dask

        parts = [dask.delayed(fn)(p, *args, **kw) for p in frame.to_delayed()]
        return list(dask.compute(*parts))

    def each_sum(self, fn: Callable, frame: Any, *args: Any) -> Any:
        """fn(partition, *args) per partition on the workers, summed on the driver."""
        return sum(self.each(fn, frame, *args))

    def map_aligned(self, fn: Callable, frame: Any, other: Any, *args: Any,
                    meta: Any = None) -> Any:
        """fn(part, other_part, *args) over two collections partitioned alike: a
        collection argument of `map_partitions` is aligned by position when
        align_dataframes=False (no repartitioning by divisions)."""
        if frame.npartitions != other.npartitions:
            raise ValueError(f"map_aligned: {frame.npartitions} partitions against "
                             f"{other.npartitions}")
        return self.map(fn, frame, other, *args, meta=meta, align_dataframes=False)

    def collect(self, frame: Any, columns: list[str] | None = None) -> pd.DataFrame:
        sub = frame if columns is None else frame[list(columns)]
        return sub.compute().reset_index(drop=True)

    def persist(self, frame: Any) -> Any:
        return frame.persist()

    def shuffle_by(self, frame: Any, column: str) -> Any:
        # the task-based shuffle pickles pandas frames: nullable dtypes and object strings
        # survive as the pandas path holds them
        return frame.shuffle(on=column, npartitions=frame.npartitions, shuffle_method="tasks")

    def write(self, frame: Any, path: str | Path,
              name_function: Callable[[int], str] | None = None) -> list[str]:
        """Each partition written by the workers (`to_parquet`, no _metadata file)."""
        frame.to_parquet(str(path), write_index=False, name_function=name_function or _part_name,
                         write_metadata_file=False)
        return [str(Path(path) / (name_function or _part_name)(i))
                for i in range(frame.npartitions)]

    def npartitions(self, frame: Any) -> int:
        return int(frame.npartitions)

    def columns(self, frame: Any) -> list[str]:
        return list(frame.columns)

    def meta(self, frame: Any) -> pd.DataFrame:
        """The frame's columns and dtypes, no rows (the collection's own `_meta`)."""
        return frame._meta

    def stages(self, stages: Mapping[str, str],
               progress: Callable[[str], None] | None = None) -> DaskStages:
        return DaskStages(stages, progress, client=self.client)

    def stage(self, name: str) -> AbstractContextManager:
        return DaskStages({name: name}, client=self.client)(name)

    def submit_all(self, fn: Callable, items: list, *args: Any) -> list:
        """One task per item, fn(item, *args), results in item order. `args` (what every
        task reads: a fleet grid's pools and workloads, 4.5 MB for overload's 48 cells)
        go to the workers once (scattered, broadcast), not inside each task."""
        shared = self.client.scatter(list(args), broadcast=True, hash=False) if args else []
        futures = [self.client.submit(fn, item, *shared, pure=False) for item in items]
        try:
            return self.client.gather(futures)
        finally:
            for f in (*futures, *shared):
                f.release()


def dashboard_address() -> str | None:
    """Where a LocalCluster's dashboard listens: a free port on loopback, or None (and one
    line saying so) when bokeh, which the dashboard needs, is not installed."""
    from importlib.util import find_spec

    if find_spec("bokeh") is None:
        log.info("dask: no dashboard (bokeh is not installed: pip install 'bokeh>=3.1')")
        return None
    return "127.0.0.1:0"


def log_dashboard(client: Any) -> None:
    """One line: the Dask dashboard's link, or that there is none."""
    try:
        link = client.dashboard_link if (client.scheduler_info().get("services") or {}).get(
            "dashboard") else None
    except Exception:  # a link the client cannot format: not worth stopping a run
        link = None
    if link:
        log.info("dask: dashboard %s", link)
    else:
        log.info("dask: no dashboard (the scheduler serves none)")


@contextmanager
def dask_client(cfg: ComputeConfig) -> Iterator[Any]:
    """A Dask client: the scheduler at cfg.address, or a LocalCluster of processes (its
    dashboard on a free loopback port when bokeh is installed); logs the dashboard link.

    The client is the current one for the length of the run (`with Client(...)` sets it;
    also the default for threads): the engine's collections persist and compute through
    the current client, and a client the caller's process had made current (a notebook's,
    a test session's `with Client(...)`) would otherwise get the run's persists while
    lightgbm.dask submits on this one; the scheduler then cancels the fit for "lost
    dependencies" (keys it never held)."""
    from dask.distributed import Client, LocalCluster

    if cfg.address:
        with Client(cfg.address) as client:
            log.info("dask: scheduler %s, %d workers", cfg.address,
                     len(client.scheduler_info().get("workers", {})))
            log_dashboard(client)
            yield client
        return
    address = dashboard_address()
    with LocalCluster(n_workers=cfg.n_workers, threads_per_worker=cfg.threads_per_worker,
                      processes=True, dashboard_address=address) as cluster, \
            Client(cluster) as client:
        if address is not None:
            log_dashboard(client)
        yield client


@contextmanager
def engine(cfg: ComputeConfig | None = None) -> Iterator[LocalEngine | DaskEngine]:
    """The engine of `cfg` for the length of a run: `LocalEngine()`, or a `DaskEngine` on
    a LocalCluster started here (stopped on exit) or on the scheduler at `cfg.address`.
    Dask frames keep object strings (dataframe.convert-string off), as the pandas path."""
    cfg = cfg or ComputeConfig()
    if cfg.kind == "local":
        yield LocalEngine(cfg)
        return
    import dask

    with dask.config.set({"dataframe.convert-string": False}), dask_client(cfg) as client:
        yield DaskEngine(cfg, client)
