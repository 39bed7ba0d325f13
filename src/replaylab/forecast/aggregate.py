"""Ledger-v1 rows -> aggregates-v1 buckets, with k_min suppression (docs/design/archetypes.md).

What can reach the output, by construction:
- the contract's columns only (ids, model names, text and any extra ledger column
  never leave this function);
- archetype: a label of the taxonomy's fixed vocabulary, or `other`;
- slo_class / region: a value of the configured allow-list, `other` (any value
  outside it), `unknown` (null) or `all` (the dimension pooled, or absent from the
  ledger: a column that is all null is absent).
A cell (bucket x archetype x slo_class x region) under `k_min` requests is
suppressed and counted: merged into archetype `other` of its bucket, slo_class and
region (an `other` cell still under k_min is dropped), or dropped (`drop`).
With `trim_edges`, the ledger's first and last buckets (cut by its collection
window) are left out and their requests counted as `edge_requests`.
requests kept + dropped + edge == ledger rows, always (tested).

Every rule above is per bucket once the edges are known (a cell is inside one
bucket; `other` merges within its bucket), so the work splits by bucket:
`request_cells` (row by row) -> `aggregate_cells` on rows holding WHOLE buckets ->
`combine_cell_aggregates` (counts summed, tables concatenated and sorted).
`ledger_to_aggregates` is one part; `pipelines/forecast.aggregate_ledger` shuffles the
cells of the compute engine's partitions on bucket_start and runs the same two functions
per partition, so its output is this one's exactly, on any engine. Two
inputs are global and come first: which label columns hold any value
(`label_presence`) and the first and last bucket (`edges`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from replaylab.contracts import AGGREGATES_VERSION, has_values, validate_aggregates
from replaylab.contracts.columns import Aggregates as A
from replaylab.contracts.columns import Ledger as L
from replaylab.forecast.config import AggregationConfig
from replaylab.forecast.taxonomy import ALL, OTHER, assign_archetypes

UNKNOWN = "unknown"
ORDER = (A.VERSION, A.BUCKET_START, A.BUCKET_SECONDS, A.ARCHETYPE, A.TAXONOMY_VERSION,
         A.SLO_CLASS, A.REGION, A.REQUESTS, A.PROMPT_TOKENS_SUM, A.COMPLETION_TOKENS_SUM,
         A.PROMPT_TOKENS_P50, A.PROMPT_TOKENS_P90, A.COMPLETION_TOKENS_P50,
         A.COMPLETION_TOKENS_P90, A.RATE_CV)
_KEYS = [A.BUCKET_START, A.ARCHETYPE, A.SLO_CLASS, A.REGION]
LABELS = (L.SLO_CLASS, L.REGION)  # the optional label columns (allow-listed)
# per-part counts of `aggregate_cells`, summed by `combine_cell_aggregates`
COUNTS = ("cells_before_suppression", "suppressed_cells", "suppressed_requests",
          "dropped_cells", "dropped_requests", "merged_requests", "edge_buckets_trimmed",
          "edge_requests", "ledger_rows")


@dataclass
class AggregationResult:
    """aggregates-v1 rows and the suppression report (counts only, never values)."""

    aggregates: pd.DataFrame
    report: dict[str, Any] = field(default_factory=dict)


def allow_listed(values: pd.Series | None, allow: tuple[str, ...] | None,
                 index: pd.Index) -> pd.Series:
    """Map a label column onto its allow-list: kept, `other`, `unknown` (null) or `all`."""
    if allow is None or values is None:
        return pd.Series(ALL, index=index, dtype=object)
    s = values.astype(object)
    out = np.where(s.isna(), UNKNOWN, np.where(s.isin(list(allow)), s, OTHER))
    return pd.Series(out, index=index, dtype=object)


def label_presence(ledger: pd.DataFrame) -> dict[str, bool]:
    """Which optional label columns hold a value: an all-null column is the same as an
    absent one (the dimension is pooled into `all`, not `unknown`). Over a partitioned
    ledger: OR the partitions' answers (`request_cells`' `present`)."""
    return {col: has_values(ledger, col) for col in LABELS}


def request_cells(ledger: pd.DataFrame, cfg: AggregationConfig,
                  present: Mapping[str, bool] | None = None) -> pd.DataFrame:
    """One row per request: its cell key, timestamp and token counts (nothing else).

    present: `label_presence` of the WHOLE ledger (default: of these rows), so that a
    part of a ledger labels its rows as the whole ledger would.
    """
    present = label_presence(ledger) if present is None else present

    def labels(col: str) -> pd.Series | None:
        return ledger[col] if present.get(col) and col in ledger.columns else None

    ts = pd.to_numeric(ledger[L.TIMESTAMP], errors="raise").astype("int64")
    width_ms = cfg.bucket_seconds * 1000
    return pd.DataFrame({
        A.BUCKET_START: (ts // width_ms) * width_ms,
        A.ARCHETYPE: assign_archetypes(ledger, cfg.taxonomy_version).astype(str),
        A.SLO_CLASS: allow_listed(labels(L.SLO_CLASS), cfg.slo_classes, ledger.index),
        A.REGION: allow_listed(labels(L.REGION), cfg.regions, ledger.index),
        "ts": ts,
        "prompt": pd.to_numeric(ledger[L.PROMPT_TOKENS], errors="coerce").astype("float64"),
        "completion": pd.to_numeric(ledger[L.COMPLETION_TOKENS],
                                    errors="coerce").astype("float64"),
    }).reset_index(drop=True)


def _suppress(cells: pd.DataFrame, cfg: AggregationConfig) -> tuple[pd.DataFrame, dict]:
    """Apply k_min: merge small cells into `other` (or drop them); return kept rows + counts."""
    n = cells.groupby(_KEYS, sort=False)["ts"].transform("size")
    small = n < cfg.k_min
    suppressed_cells = int(cells.loc[small, _KEYS].drop_duplicates().shape[0])
    report = {"k_min": cfg.k_min, "suppression": cfg.suppression,
              "cells_before_suppression": int(cells[_KEYS].drop_duplicates().shape[0]),
              "suppressed_cells": suppressed_cells,
              "suppressed_requests": int(small.sum())}
    if cfg.suppression == "merge":
        cells = cells.copy()
        cells.loc[small, A.ARCHETYPE] = OTHER
        n = cells.groupby(_KEYS, sort=False)["ts"].transform("size")
        drop = (cells[A.ARCHETYPE] == OTHER) & (n < cfg.k_min)
    else:
        drop = small
    report["dropped_cells"] = int(cells.loc[drop, _KEYS].drop_duplicates().shape[0])
    report["dropped_requests"] = int(drop.sum())
    # an `other` cell holds suppressed requests only, so what was not dropped was merged
    report["merged_requests"] = report["suppressed_requests"] - report["dropped_requests"] \
        if cfg.suppression == "merge" else 0
    return cells.loc[~drop], report


def _rate_cv(kept: pd.DataFrame) -> pd.Series:
    """CV (population std / mean) of inter-arrival gaps inside each cell; null under 2 gaps."""
    s = kept.sort_values([*_KEYS, "ts"])
    gap = s["ts"].diff().astype("float64")
    first = (s[_KEYS] != s[_KEYS].shift()).any(axis=1)
    gap[first] = np.nan
    g = gap.groupby([s[k] for k in _KEYS], sort=False)
    stats = pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=0), "n": g.count()})
    cv = stats["std"] / stats["mean"].where(stats["mean"] > 0)
    return cv.where(stats["n"] >= 2)


def _bucket_table(kept: pd.DataFrame, cfg: AggregationConfig) -> pd.DataFrame:
    g = kept.groupby(_KEYS, sort=True)
    out = pd.DataFrame({
        A.REQUESTS: g.size(),
        A.PROMPT_TOKENS_SUM: g["prompt"].sum(min_count=1),
        A.COMPLETION_TOKENS_SUM: g["completion"].sum(min_count=1),
        A.PROMPT_TOKENS_P50: g["prompt"].quantile(0.5),
        A.PROMPT_TOKENS_P90: g["prompt"].quantile(0.9),
        A.COMPLETION_TOKENS_P50: g["completion"].quantile(0.5),
        A.COMPLETION_TOKENS_P90: g["completion"].quantile(0.9),
    })
    out[A.RATE_CV] = _rate_cv(kept).reindex(out.index)
    out = out.reset_index()
    out[A.VERSION] = AGGREGATES_VERSION
    out[A.BUCKET_SECONDS] = cfg.bucket_seconds
    out[A.TAXONOMY_VERSION] = cfg.taxonomy_version
    for col in (A.PROMPT_TOKENS_SUM, A.COMPLETION_TOKENS_SUM):
        out[col] = out[col].round().astype("Int64")
    out[A.REQUESTS] = out[A.REQUESTS].astype("int64")
    return out[list(ORDER)].reset_index(drop=True)


@dataclass
class CellAggregate:
    """`aggregate_cells` of a set of whole buckets: its aggregates rows (not yet
    validated), its counts (`COUNTS`) and its requests per output label."""

    table: pd.DataFrame
    counts: dict[str, int]
    slo_class_values: dict[str, int]
    region_values: dict[str, int]


def edges(cells: pd.DataFrame, cfg: AggregationConfig) -> tuple[int, int] | None:
    """The (first, last) bucket_start to trim (None: `trim_edges` off or no rows)."""
    if not cfg.trim_edges or cells.empty:
        return None
    b = cells[A.BUCKET_START]
    return int(b.min()), int(b.max())


def aggregate_cells(cells: pd.DataFrame, cfg: AggregationConfig,
                    trim: tuple[int, int] | None) -> CellAggregate:
    """Trim the edge buckets `trim` (the whole ledger's: `edges`), apply k_min and build the
    bucket table, on `request_cells` rows that hold every row of each of their buckets."""
    edge = pd.Series(False, index=cells.index)
    if trim is not None:
        b = cells[A.BUCKET_START]
        edge = (b == trim[0]) | (b == trim[1])
    kept, report = _suppress(cells[~edge], cfg)
    report["edge_buckets_trimmed"] = int(cells.loc[edge, A.BUCKET_START].nunique())
    report["edge_requests"] = int(edge.sum())
    report["ledger_rows"] = int(len(cells))
    table = (pd.DataFrame({c: pd.Series(dtype=object) for c in ORDER}) if kept.empty
             else _bucket_table(kept, cfg))
    return CellAggregate(table, {k: int(report[k]) for k in COUNTS},
                         _value_counts(cells[A.SLO_CLASS]), _value_counts(cells[A.REGION]))


def combine_cell_aggregates(parts: Iterable[CellAggregate],
                            cfg: AggregationConfig) -> AggregationResult:
    """The aggregates-v1 table and report of parts that split the ledger by bucket (no
    bucket in two parts): counts summed, tables concatenated and sorted by cell key, then
    validated; equal to `ledger_to_aggregates` on the whole ledger."""
    parts = list(parts)
    counts = {k: sum(p.counts[k] for p in parts) for k in COUNTS}
    if counts["ledger_rows"] == 0:
        raise ValueError("ledger_to_aggregates: the ledger has no rows")
    if cfg.trim_edges and counts["edge_requests"] == counts["ledger_rows"]:
        raise ValueError(f"the ledger spans at most two {cfg.bucket_seconds} s buckets: "
                         "nothing is left after trimming the partial edge buckets")
    tables = [p.table for p in parts if len(p.table)]
    if not tables:  # every cell suppressed: an empty table (the report says why)
        table = pd.DataFrame({c: pd.Series(dtype=object) for c in ORDER})
    else:
        table = pd.concat(tables, ignore_index=True) if len(tables) > 1 else tables[0]
        table = table.sort_values(_KEYS, kind="stable").reset_index(drop=True)
        checked = validate_aggregates(table, source="ledger_to_aggregates")
        if checked.rows_quarantined:  # a bug here, not a data problem
            raise AssertionError(f"aggregation produced invalid rows: {checked.by_reason()}")
        table = checked.valid[list(ORDER)]
    report: dict[str, Any] = {"k_min": cfg.k_min, "suppression": cfg.suppression}
    report.update({k: counts[k] for k in COUNTS if k != "ledger_rows"})
    report.update({
        "ledger_rows": counts["ledger_rows"], "requests_kept": int(table[A.REQUESTS].sum()),
        "buckets_out": int(len(table)), "bucket_seconds": cfg.bucket_seconds,
        "taxonomy_version": cfg.taxonomy_version,
        "slo_class_values": _sum_counts(p.slo_class_values for p in parts),
        "region_values": _sum_counts(p.region_values for p in parts),
    })
    return AggregationResult(table, report)


def ledger_to_aggregates(ledger: pd.DataFrame, cfg: AggregationConfig) -> AggregationResult:
    """Validated ledger-v1 rows -> aggregates-v1 buckets plus the suppression report.

    `ledger` is `validate_ledger(...).valid` (epoch-ms timestamps). Every request
    is counted in a kept bucket, in `dropped_requests` or in `edge_requests`.
    """
    if ledger.empty:
        raise ValueError("ledger_to_aggregates: the ledger has no rows")
    cells = request_cells(ledger, cfg)
    return combine_cell_aggregates([aggregate_cells(cells, cfg, edges(cells, cfg))], cfg)


def _sum_counts(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    return {k: total[k] for k in sorted(total)}


def _value_counts(s: pd.Series) -> dict[str, int]:
    """Requests per OUTPUT label (allow-listed, so safe to report)."""
    return {str(k): int(v) for k, v in s.value_counts().sort_index().items()}
