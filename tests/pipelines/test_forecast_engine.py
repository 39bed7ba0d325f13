"""pipeline=forecast written once on the compute engine (`pipelines/forecast.py`): the
same rows give the same aggregates-v1 table and report (suppression counts, edge trim, row
accounting; a partition with quarantined rows, one whose optional label column is all
null) on one local partition, on several local partitions (the shuffle on the bucket) and
on the session's Dask cluster; the backtest's predictions bit for bit and its scores
equal wherever its jobs run; `python -m training pipeline=forecast compute=dask
data.ledger=DIR` gives the local run's forecast, the summary saying which engine ran."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from replaylab.compute import ComputeConfig, LocalEngine, engine
from replaylab.compute.ledger import read_ledger_dataset
from replaylab.contracts import validate_aggregates
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.io import write_table
from replaylab.forecast import BacktestConfig, ForecastConfig, LightGBMConfig
from replaylab.forecast.backtest import backtest_jobs, run_backtest, score_backtest
from replaylab.forecast.config import AggregationConfig
from replaylab.forecast.panel import build_panel, choose_seasons, plan_backtest
from replaylab.forecast.synthetic import seasonal_poisson_aggregates
from replaylab.pipelines.forecast import aggregate_ledger
from replaylab.sources.defects import inject_defects
from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger
from tests.helpers.entrypoints import in_process

AGGREGATIONS = {
    "merge": AggregationConfig(bucket_seconds=60),
    "drop, no edge trim, slo pooled": AggregationConfig(bucket_seconds=60, k_min=5,
                                                        suppression="drop", trim_edges=False,
                                                        slo_classes=None),
}
# a small, fast backtest whose LightGBM has two refit groups (two tasks)
BACKTEST_CFG = ForecastConfig(
    forecasters=("seasonal_naive", "moving_window", "auto_ets", "mstl", "lightgbm"),
    backtest=BacktestConfig(horizon_buckets=6, n_windows=4, min_train_buckets=36,
                            conformal_windows=12, refit_every_windows=2),
    lightgbm=LightGBMConfig(n_estimators=20), include_total=False)
ENTRY_OVERRIDES = [
    "forecast.aggregation.bucket_seconds=60", "forecast.backtest.horizon_buckets=3",
    "forecast.backtest.n_windows=4", "forecast.backtest.min_train_buckets=24",
    "forecast.backtest.refit_every_windows=2", "forecast.min_nonzero_fraction=0.3",
    "forecast.lightgbm.n_estimators=20",
    "forecast.forecasters=[seasonal_naive,moving_window,auto_ets,lightgbm]"]


def write_dataset(root: Path, n_requests: int = 6000, seed: int = 3) -> Path:
    """A defective synthetic ledger as a 3-way hive dataset; the first part's region is
    all null (the whole ledger has regions, so its rows are `unknown`, not `all`)."""
    frame = generate_synthetic_ledger(SyntheticLedgerConfig(n_requests=n_requests), seed=seed)
    frame, _ = inject_defects(frame, rate=0.02, seed=seed)
    n = len(frame) // 3
    parts = [frame.iloc[:n].assign(**{L.REGION: None}), frame.iloc[n:2 * n], frame.iloc[2 * n:]]
    for i, part in enumerate(parts):
        write_table(part, root / f"date=2026-12-0{i + 1}" / "part.parquet")
    return root


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("fd") / "ds")


def _check_report(rep: dict, cfg: AggregationConfig) -> None:
    acc = rep["ledger_validation"]
    # row accounting: read = valid + quarantined; every valid row kept, dropped or trimmed
    assert acc["rows_read"] == acc["rows_valid"] + acc["rows_quarantined"]
    assert acc["rows_quarantined"] > 0
    assert rep["ledger_rows"] == acc["rows_valid"]
    assert rep["requests_kept"] + rep["dropped_requests"] + rep["edge_requests"] \
        == rep["ledger_rows"]
    assert rep["suppressed_cells"] > 0 and rep["dropped_requests"] > 0
    assert (rep["edge_requests"] > 0) == cfg.trim_edges
    # part 1's all-null regions are `unknown` (the ledger has regions), never pooled `all`
    assert rep["region_values"]["unknown"] > 0 and "all" not in rep["region_values"]


@pytest.mark.parametrize("name", list(AGGREGATIONS))
def test_local_partitions_aggregate_as_one(dataset, name):
    """Three local partitions (split by row, so buckets straddle them until the shuffle)
    give the one-partition table and report exactly."""
    cfg = AGGREGATIONS[name]
    result = read_ledger_dataset(str(dataset))
    one = aggregate_ledger(result, cfg)
    local = LocalEngine()
    three = aggregate_ledger(local.from_validated(result, npartitions=3), cfg, local)
    pd.testing.assert_frame_equal(three.aggregates, one.aggregates, check_exact=True)
    assert three.report == one.report and list(three.report) == list(one.report)
    _check_report(one.report, cfg)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("name", list(AGGREGATIONS))
def test_dask_aggregates_equal_local_exactly(dask_address, dataset, tmp_path, name):
    cfg = AGGREGATIONS[name]
    local = aggregate_ledger(read_ledger_dataset(str(dataset)), cfg)
    with engine(ComputeConfig(kind="dask", address=dask_address)) as eng:
        ledger = eng.read_ledger(str(dataset), blocksize=40_000)
        quarantine = ledger.write_quarantine(tmp_path / "quarantine")
        dist = aggregate_ledger(ledger, cfg, eng)
    pd.testing.assert_frame_equal(dist.aggregates, local.aggregates, check_exact=True)
    assert dist.report == local.report
    assert list(dist.report) == list(local.report)
    _check_report(dist.report, cfg)
    # the workers wrote the quarantine, one file per partition, some partition non-empty
    q = [pd.read_parquet(p) for p in sorted(Path(quarantine).glob("part-*.parquet"))]
    assert len(q) == ledger.npartitions > 1
    assert sum(map(len, q)) == dist.report["ledger_validation"]["rows_quarantined"]
    assert len(q[0]) > 0


def _prepared():
    agg = seasonal_poisson_aggregates(n_series=3, days=3, seed=1, weekend_factor=1.0)
    panel = build_panel(validate_aggregates(agg).valid, BACKTEST_CFG)
    plan = plan_backtest(panel.n_buckets, BACKTEST_CFG.backtest)
    seasons = choose_seasons(BACKTEST_CFG.seasonalities_s, panel.bucket_seconds,
                             panel.n_buckets - plan.test_size())
    return panel, plan, seasons


def _without_seconds(scores: dict) -> dict:
    return {n: {k: v for k, v in s.items() if k != "seconds"} for n, s in scores.items()}


def test_backtest_does_not_depend_on_the_map(tmp_path):
    """Jobs run in reverse order (as a scheduler may) assemble to the same result."""
    panel, plan, seasons = _prepared()

    def reversed_map(fn, items):
        return [fn(x) for x in items[::-1]][::-1]

    base = run_backtest(panel, BACKTEST_CFG, plan, seasons)
    other = run_backtest(panel, BACKTEST_CFG, plan, seasons, map_fn=reversed_map)
    assert base.forecasters == other.forecasters == list(BACKTEST_CFG.forecasters)
    pd.testing.assert_frame_equal(base.predictions, other.predictions, check_exact=True)


@pytest.mark.slow
@pytest.mark.integration
def test_dask_backtest_equals_local_bit_for_bit(dask_address):
    panel, plan, seasons = _prepared()
    jobs, _ = backtest_jobs(panel, BACKTEST_CFG, plan, seasons)
    assert [j.name for j in jobs].count("lightgbm") == 2  # one task per refit group
    local = run_backtest(panel, BACKTEST_CFG, plan, seasons, map_fn=LocalEngine().submit_all)
    with engine(ComputeConfig(kind="dask", address=dask_address)) as eng:
        dist = run_backtest(panel, BACKTEST_CFG, plan, seasons, map_fn=eng.submit_all)
    assert dist.forecasters == local.forecasters and dist.skipped == local.skipped
    assert set(dist.timings_s) == set(local.timings_s)
    pd.testing.assert_frame_equal(dist.predictions, local.predictions, check_exact=True)
    assert _without_seconds(score_backtest(dist, panel, seasons)) \
        == _without_seconds(score_backtest(local, panel, seasons))


def _forecast_summary(out: Path, ledger: Path, *extra: str) -> dict:
    run = in_process("training", "pipeline=forecast", *extra, f"data.ledger={ledger}",
                     "tracking=off", *ENTRY_OVERRIDES, run_dir=out, check=True)
    return run.summary


@pytest.mark.slow
@pytest.mark.integration
def test_python_m_training_forecast_on_dask_equals_local(dask_address, tmp_path):
    ds = write_dataset(tmp_path / "ds")
    dist = _forecast_summary(tmp_path / "dask", ds, "compute=dask",
                             f"compute.address={dask_address}")
    loc = _forecast_summary(tmp_path / "local", ds)
    assert dist["compute"]["kind"] == "dask" and dist["compute"]["n_workers"] == 2
    assert loc["compute"] == {"kind": "local"}
    assert dist["input"] == loc["input"]  # path, suppression report, ledger accounting
    assert dist["input"]["aggregation"]["ledger_validation"]["rows_quarantined"] > 0
    assert _without_seconds(dist["backtest"]) == _without_seconds(loc["backtest"])
    for key in ("series", "buckets", "suppressed_buckets", "series_ids", "plan", "seasons",
                "backtest_by_series", "skipped", "best", "targets", "gate", "drift"):
        assert dist[key] == loc[key], key
    for name in ("aggregates", "backtest", "forecast"):
        pd.testing.assert_frame_equal(pd.read_parquet(dist["artifacts"][name]),
                                      pd.read_parquet(loc["artifacts"][name]),
                                      check_exact=True)
    # each engine wrote the quarantined rows under the run folder (Dask: per partition)
    n = dist["input"]["aggregation"]["ledger_validation"]["rows_quarantined"]
    assert len(pd.read_parquet(dist["artifacts"]["quarantine"])) == n
    assert len(pd.read_json(loc["artifacts"]["quarantine"], lines=True)) == n
