"""`pipeline=forecast compute=dask` over a ledger dataset: no row of the ledger on the driver.

`aggregate_dataset_dask` gives `pipelines.forecast.aggregate_ledger`'s result (the
aggregates-v1 table and its report, row for row and count for count) from a Dask
graph the workers run:

1. read and validate per partition (`contracts.dataset.read_ledger_dask`), the
   quarantine written as Parquet by the workers (`DIR/quarantine/part-*.parquet`);
   rows_read = rows_valid + rows_quarantined in the report's `ledger_validation`;
2. which optional label columns hold any value (one row per partition: an all-null
   column is pooled into `all` over the WHOLE ledger, not per partition);
3. each valid row's cell key, timestamp and token counts (`aggregate.request_cells`,
   seven narrow columns), and the first and last bucket (two numbers) for the edge trim;
4. those cells shuffled on bucket_start (a task shuffle), so that every bucket is whole
   in one partition, and `aggregate.aggregate_cells` per partition: edge trim, k_min
   suppression (a cell and its `other` merge are inside one bucket) and the bucket
   table, with the local pandas code;
5. the per-partition tables (a few rows per bucket) and counts to the driver,
   `aggregate.combine_cell_aggregates`: counts summed, tables concatenated and sorted.

Why a shuffle and not only partial sums: requests and token sums would add up across
partitions, but the p50/p90 token quantiles, the inter-arrival CV (gaps between
consecutive requests of a cell, wherever they were read) and the k_min merge (which
changes the `other` cell's members) need every request of a bucket together. With the
buckets whole, each statistic is the local code on the same values: the table equals
the local one exactly (quantiles included), not within a tolerance.

`client_map(client)` runs the backtest's jobs (one per forecaster, one per LightGBM refit
group: `forecast.backtest.backtest_jobs`) as Dask tasks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from replaylab.contracts.columns import Aggregates as A
from replaylab.contracts.columns import Ledger as L
from replaylab.forecast.aggregate import (
    LABELS,
    AggregationResult,
    aggregate_cells,
    combine_cell_aggregates,
    label_presence,
    request_cells,
)
from replaylab.forecast.config import AggregationConfig
from replaylab.forecast.panel import ForecastDataError

STAGES = {"read": "read and validate per partition, the quarantine written by the workers",
          "cells": "cell keys per partition, label presence and edge buckets",
          "aggregate": "cells shuffled on bucket_start, k_min and bucket tables per partition"}


def presence_row(ledger: pd.DataFrame) -> pd.DataFrame:
    """A partition's `label_presence` as one row (OR-ed over partitions on the driver)."""
    return pd.DataFrame([label_presence(ledger)], columns=list(LABELS)).astype(bool)


def cells_meta(cfg: AggregationConfig) -> pd.DataFrame:
    """The empty frame `request_cells` returns (its columns and dtypes), from the function."""
    empty = pd.DataFrame({L.TIMESTAMP: pd.Series(dtype="int64"),
                          L.PROMPT_TOKENS: pd.Series(dtype="float64"),
                          L.COMPLETION_TOKENS: pd.Series(dtype="float64"),
                          L.TURN_INDEX: pd.Series(dtype="float64")})
    return request_cells(empty, cfg, {c: False for c in LABELS})


def aggregate_dataset_dask(spec: str, cfg: AggregationConfig, out_dir: Path,
                           blocksize: int | str | None = None,
                           progress: Callable[[str], Any] | None = None,
                           ) -> tuple[AggregationResult, dict[str, Any]]:
    """The ledger dataset `spec` -> aggregates-v1 and its report, on the current Dask client.

    The result equals `aggregate_ledger(read_ledger_dataset(spec), cfg)` (table, report and
    its `ledger_validation`); the quarantine is written under out_dir/quarantine. Also
    returns facts of the run: partitions, the quarantine path, timings.
    """
    import dask
    from dask import delayed

    from replaylab.contracts.dataset import DEFAULT_BLOCKSIZE, read_ledger_dask

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    done: list[str] = []

    def stage(name: str) -> float:
        done.append(name)
        if progress is not None:
            progress(f"dask stage {len(done)}/{len(STAGES)}: {STAGES[name]}")
        return time.perf_counter()

    with dask.config.set({"dataframe.convert-string": False}):
        t0 = stage("read")
        ds = read_ledger_dask(spec, blocksize or DEFAULT_BLOCKSIZE).persist()
        accounting = ds.write_quarantine(str(out_dir / "quarantine"))
        timings["read_validate"] = time.perf_counter() - t0
        if accounting.rows_valid == 0:
            raise ForecastDataError(f"{accounting.source}: no valid ledger rows to aggregate "
                                    f"({accounting.rows_quarantined} quarantined)")
        t0 = stage("cells")
        flags = ds.valid.map_partitions(presence_row, meta=presence_row(pd.DataFrame()))
        flags = flags.compute()
        present = {c: bool(flags[c].any()) for c in LABELS}
        cells = ds.valid.map_partitions(request_cells, cfg, present,
                                        meta=cells_meta(cfg)).persist()
        del ds  # the validated rows are no longer needed on the workers
        trim = None
        if cfg.trim_edges:
            lo, hi = dask.compute(cells[A.BUCKET_START].min(), cells[A.BUCKET_START].max())
            trim = (int(lo), int(hi))
        timings["cells"] = time.perf_counter() - t0
        t0 = stage("aggregate")
        by_bucket = cells.shuffle(on=A.BUCKET_START, npartitions=cells.npartitions,
                                  shuffle_method="tasks")
        parts = dask.compute(*[delayed(aggregate_cells, pure=True)(p, cfg, trim)
                               for p in by_bucket.to_delayed()])
        timings["aggregate"] = time.perf_counter() - t0
        n_partitions = int(cells.npartitions)
        del cells, by_bucket
    try:
        result = combine_cell_aggregates(parts, cfg)
    except ValueError as e:  # e.g. everything in the trimmed edge buckets
        raise ForecastDataError(f"{accounting.source}: cannot aggregate the ledger: {e}") from e
    if result.report["ledger_rows"] != accounting.rows_valid:  # a bug, not a data problem
        raise AssertionError(f"aggregated {result.report['ledger_rows']} rows of "
                             f"{accounting.rows_valid} valid")
    result.report["ledger_validation"] = {k: v for k, v in accounting.summary().items()
                                          if k != "contract"}
    facts = {"partitions": n_partitions, "quarantine": str(out_dir / "quarantine"),
             "timings_s": {k: round(v, 3) for k, v in timings.items()}}
    return result, facts


def client_map(client: Any) -> Callable[[Callable, list], list]:
    """A `map_fn` for `forecast.backtest.run_backtest`: one Dask task per item, results in
    order (a task's exception is raised here, as the serial map would)."""
    def map_fn(fn: Callable, items: list) -> list:
        if not items:
            return []
        return client.gather(client.map(fn, items, pure=False))
    return map_fn
