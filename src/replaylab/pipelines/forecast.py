"""The forecast pipeline: aggregates in, backtested probabilistic forecasts out, written
once on the compute engine (`replaylab.compute`: local or Dask, the same numbers).

`aggregate_ledger` turns a ledger into aggregates-v1 with k_min suppression, over the
engine's partitions (a LocalEngine holds the ledger as one partition in this process; a
DaskEngine's workers hold it and nothing of it reaches the driver):

1. which optional label columns hold any value, per partition, OR-ed on the driver (an
   all-null column is pooled into `all` over the WHOLE ledger, not per partition);
2. each valid row's cell key, timestamp and token counts (`aggregate.request_cells`,
   seven narrow columns), and the first and last bucket (two numbers) for the edge trim;
3. those cells shuffled on bucket_start, so that every bucket is whole in one partition,
   and `aggregate.aggregate_cells` per partition: edge trim, k_min suppression (a cell
   and its `other` merge are inside one bucket) and the bucket table;
4. the per-partition tables (a few rows per bucket) and counts to the driver,
   `aggregate.combine_cell_aggregates`: counts summed, tables concatenated and sorted.

Why a shuffle and not only partial sums: requests and token sums would add up across
partitions, but the p50/p90 token quantiles, the inter-arrival CV (gaps between
consecutive requests of a cell, wherever they were read) and the k_min merge (which
changes the `other` cell's members) need every request of a bucket together. With the
buckets whole, each statistic is the same pandas code on the same values: the table
equals the one-partition table exactly (quantiles included), not within a tolerance.

`run_forecast` backtests every forecaster over rolling origins (one engine task per
forecaster and per LightGBM refit group: `forecast.backtest.backtest_jobs`), scores
them, judges them (`summary["gate"]`: `replaylab.forecast.gate`), measures drift, writes
the forecast table of the last origin, the backtest predictions and a report under the
folder it is handed, and returns the summary (DIR/summary.json).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from replaylab.compute import Engine, LedgerFrame, LocalEngine
from replaylab.contracts import ValidationResult, validate_aggregates, validate_ledger
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
from replaylab.forecast.config import COVERAGE_TARGET, AggregationConfig, ForecastConfig
from replaylab.forecast.panel import ForecastDataError, build_panel, choose_seasons, plan_backtest

STAGES = {"labels": "which optional label columns hold a value, per partition",
          "cells": "cell keys per partition and the edge buckets",
          "aggregate": "cells shuffled on bucket_start, k_min and bucket tables per partition"}


def presence(ledger: pd.DataFrame) -> dict[str, bool]:
    """A partition's `label_presence` (OR-ed over the partitions on the driver)."""
    return label_presence(ledger)


def cells_meta(cfg: AggregationConfig) -> pd.DataFrame:
    """The empty frame `request_cells` returns (its columns and dtypes), from the function."""
    empty = pd.DataFrame({L.TIMESTAMP: pd.Series(dtype="int64"),
                          L.PROMPT_TOKENS: pd.Series(dtype="float64"),
                          L.COMPLETION_TOKENS: pd.Series(dtype="float64"),
                          L.TURN_INDEX: pd.Series(dtype="float64")})
    return request_cells(empty, cfg, dict.fromkeys(LABELS, False))


def bucket_range(cells: pd.DataFrame) -> tuple[int, int] | None:
    """(first, last) bucket_start of a partition's cells; None when it has none."""
    if cells.empty:
        return None
    b = cells[A.BUCKET_START]
    return int(b.min()), int(b.max())


def aggregate_ledger(ledger: LedgerFrame | ValidationResult | pd.DataFrame,
                     cfg: AggregationConfig, engine: Engine | None = None,
                     progress: Callable[[str], Any] | None = None) -> AggregationResult:
    """A ledger -> aggregates-v1 and the suppression report, over `engine`'s partitions.

    `ledger`: what `engine.read_ledger` or `engine.from_validated` returned, or a ledger-v1
    frame or validation result (validated here, one partition of a LocalEngine when no
    engine is given). The report's `ledger_validation` holds the reader's accounting
    (rows read = valid + quarantined). Equal on every engine and partitioning.
    """
    engine = engine or LocalEngine()
    if not isinstance(ledger, LedgerFrame):
        result = ledger if isinstance(ledger, ValidationResult) else validate_ledger(ledger)
        if result.contract != "ledger-v1":
            raise ForecastDataError(f"aggregate_ledger needs ledger-v1 rows, got {result.contract}")
        ledger = engine.from_validated(result)
    accounting = ledger.accounting
    where = accounting.source or "the ledger"
    if accounting.rows_valid == 0:
        raise ForecastDataError(f"{where}: no valid ledger rows to aggregate "
                                f"({accounting.rows_quarantined} quarantined)")
    with engine.stages(STAGES, progress) as stage:
        with stage("labels"):
            flags = engine.each(presence, ledger.valid)
            present = {c: any(f[c] for f in flags) for c in LABELS}
        with stage("cells"):
            cells = engine.persist(engine.map(request_cells, ledger.valid, cfg, present,
                                              meta=cells_meta(cfg)))
            ends = [e for e in engine.each(bucket_range, cells) if e is not None]
            trim = ((min(e[0] for e in ends), max(e[1] for e in ends))
                    if cfg.trim_edges and ends else None)
        with stage("aggregate"):
            by_bucket = engine.shuffle_by(cells, A.BUCKET_START)
            parts = engine.each(aggregate_cells, by_bucket, cfg, trim)
    try:
        agg = combine_cell_aggregates(parts, cfg)
    except ValueError as e:  # e.g. everything in the trimmed edge buckets
        raise ForecastDataError(f"{where}: cannot aggregate the ledger: {e}") from e
    if agg.report["ledger_rows"] != accounting.rows_valid:  # a bug, not a data problem
        raise AssertionError(f"aggregated {agg.report['ledger_rows']} rows of "
                             f"{accounting.rows_valid} valid")
    agg.report["ledger_validation"] = {k: v for k, v in ledger.summary().items()
                                       if k != "contract"}
    return agg


def _inputs(data: AggregationResult | ValidationResult | pd.DataFrame
            ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Validated aggregates rows and what the summary says about where they came from."""
    if isinstance(data, AggregationResult):
        rep = data.report
        return data.aggregates, {"from": "ledger", "aggregation": rep,
                                 "suppressed_buckets": rep["suppressed_cells"]}
    result = data if isinstance(data, ValidationResult) else validate_aggregates(data)
    if result.contract != "aggregates-v1":
        raise ForecastDataError(f"run_forecast needs aggregates-v1 rows, got {result.contract}")
    info = {"from": "aggregates", "validation": {k: v for k, v in result.summary().items()
                                                 if k != "contract"},
            # suppression happened upstream (if at all); these rows do not say how much
            "suppressed_buckets": 0,
            "other_rows": int((result.valid[A.ARCHETYPE] == "other").sum())}
    return result.valid, info


def _targets(scores: dict, best: str) -> dict:
    cov = scores[best]["coverage_80"]
    return {"best_mase_below_seasonal_naive": bool(
                best != "seasonal_naive"
                and scores[best]["mase"] < scores["seasonal_naive"]["mase"]),
            "best_coverage_80_in_72_88": cov is not None and
            COVERAGE_TARGET[0] <= cov <= COVERAGE_TARGET[1]}


def _write(out_dir: Path, frames: dict[str, pd.DataFrame]) -> dict[str, str]:
    paths = {}
    for name, frame in frames.items():
        path = out_dir / f"{name}.parquet"
        frame.to_parquet(path, index=False)
        paths[name] = str(path)
    return paths


def _report(out_dir: Path, panel, bt, scores, best, drift, cfg, facts) -> dict[str, str]:
    from replaylab.forecast.figures import bands_figure, drift_figure, scores_figure
    from replaylab.tracking.html import write_html_report

    fig_dir = out_dir / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    cutoffs = sorted(bt.predictions["cutoff"].unique())
    origins = [int(panel.bucket_start_ms[0] + (c + 1) * panel.bucket_seconds * 1000)
               for c in cutoffs]
    figures = {
        "actual_vs_forecast": bands_figure(panel, bt.predictions, best, cfg.report_series,
                                           fig_dir / "actual_vs_forecast.png"),
        "scores": scores_figure(scores, fig_dir / "scores.png"),
        "drift": drift_figure(drift["archetype_mix"], drift["calibration"], origins,
                              fig_dir / "drift.png")}
    html = write_html_report(out_dir / "report.html", title="replaylab: forecast backtest",
                             facts=facts, figures=figures)
    return {"html": str(html), **{k: str(v) for k, v in figures.items()}}


def _backtest(aggregates: pd.DataFrame, cfg: ForecastConfig, engine: Engine) -> dict[str, Any]:
    """Panel, plan, seasons, backtest, scores, comparison and drift of one input."""
    from replaylab.forecast.backtest import (
        choose_best,
        origin_mase,
        run_backtest,
        score_backtest,
        series_scores,
    )
    from replaylab.forecast.drift import archetype_mix_drift, calibration_drift
    from replaylab.forecast.gate import forecast_gate

    panel = build_panel(aggregates, cfg)
    plan = plan_backtest(panel.n_buckets, cfg.backtest)
    seasons = choose_seasons(cfg.seasonalities_s, panel.bucket_seconds,
                             panel.n_buckets - plan.test_size())
    # one engine task per job (LocalEngine: a loop here); assembled in the configured order
    bt = run_backtest(panel, cfg, plan, seasons, map_fn=engine.submit_all)
    scores = score_backtest(bt, panel, seasons)
    drift = {"archetype_mix": archetype_mix_drift(aggregates, cfg.drift_window_s),
             "calibration": calibration_drift(bt.predictions, bt.forecasters)}
    gate = forecast_gate(scores, origin_mase(bt, panel, seasons), plan, cfg.gate, cfg.seed)
    return {"panel": panel, "plan": plan, "seasons": seasons, "bt": bt, "scores": scores,
            "by_series": series_scores(bt, panel, seasons), "comparison": choose_best(scores),
            "drift": drift, "gate": gate}


def _summary(r: dict[str, Any], source: dict, cfg: ForecastConfig) -> dict[str, Any]:
    panel, plan, seasons, scores = r["panel"], r["plan"], r["seasons"], r["scores"]
    best = r["comparison"]["best"]
    return {
        "pipeline": "forecast", "input": source, "series": panel.n_series,
        "buckets": panel.n_buckets, "bucket_seconds": panel.bucket_seconds,
        "suppressed_buckets": source["suppressed_buckets"],
        "horizon_buckets": plan.horizon, "taxonomy_version": panel.taxonomy_version,
        "series_ids": panel.ids, "selection": panel.selection,
        "plan": {"n_windows": plan.n_windows, "n_windows_requested": plan.n_windows_requested,
                 "step_buckets": plan.step, "test_buckets": plan.test_size(),
                 "history_before_first_origin": panel.n_buckets - plan.test_size(),
                 "refit_every_windows": cfg.backtest.refit_every_windows},
        "seasons": {"seasonal_naive": seasons.naive, "mstl": list(seasons.mstl),
                    "notes": list(seasons.notes)},
        "backtest": scores, "backtest_by_series": r["by_series"],
        "skipped": r["bt"].skipped, **r["comparison"],
        "targets": _targets(scores, best), "gate": r["gate"], "drift": r["drift"]}


def run_forecast(data: AggregationResult | ValidationResult | pd.DataFrame,
                 cfg: ForecastConfig, out_dir: Path,
                 engine: Engine | None = None) -> dict[str, Any]:
    """Backtest, score, forecast the next horizon, write artifacts; return the summary.

    `data`: aggregates-v1 rows (a frame, validated here, or `read_aggregates`'s
    result) or `aggregate_ledger`'s result (its suppression report is kept).
    Writes under `out_dir`: forecast.parquet (the last origin's forecast, every
    forecaster), backtest.parquet (every origin's forecast with the actuals),
    aggregates.parquet (when built from a ledger), report.html and figures/.
    engine: where the backtest's jobs run (`forecast.backtest.run_backtest`, one
    `engine.submit_all` task each; default a LocalEngine); the summary does not depend
    on it.
    """
    from replaylab.forecast.future import future_forecast, to_forecast_form

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    aggregates, source = _inputs(data)
    r = _backtest(aggregates, cfg, engine or LocalEngine())
    timings = {"backtest_total": time.perf_counter() - t0}
    panel, bt = r["panel"], r["bt"]
    t0 = time.perf_counter()
    frames = {"forecast": future_forecast(panel, cfg, r["seasons"], bt.forecasters),
              "backtest": to_forecast_form(bt.predictions, panel, bt.forecasters, actual=True)}
    timings["future_forecast"] = time.perf_counter() - t0
    if source["from"] == "ledger":
        frames["aggregates"] = aggregates
    summary = _summary(r, source, cfg)
    summary["artifacts"] = _write(out_dir, frames)
    t0 = time.perf_counter()
    facts = {k: summary[k] for k in ("series", "buckets", "bucket_seconds", "suppressed_buckets",
                                     "horizon_buckets", "taxonomy_version", "plan", "seasons",
                                     "backtest", "best", "beats_seasonal_naive", "targets")}
    facts["gate"] = {k: summary["gate"][k] for k in ("decision", "reasons", "rule")}
    summary["reports"] = _report(out_dir, panel, bt, r["scores"], summary["best"], r["drift"],
                                 cfg, facts)
    timings["report"] = time.perf_counter() - t0
    summary["timings_s"] = {k: round(v, 3) for k, v in {**timings, **bt.timings_s}.items()}
    return summary
