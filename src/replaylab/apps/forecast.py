"""pipeline=forecast: Hydra config in, typed ForecastConfig, library call, summary out.

Input, first match wins:
- `data.aggregates`: an aggregates-v1 file (CSV or Parquet), forecast as it is;
- `data.ledger`: a ledger-v1 file or dataset, aggregated first (`forecast.aggregation`);
- neither: the embedded synthetic ledger (`data.synthetic`), aggregated first; for this
  pipeline 4 days with a daily profile of session starts (conf/pipeline/forecast.yaml), so
  the bare `python -m training pipeline=forecast` has a season to forecast and room for
  its backtest. The run ends with the gate's verdict (`replaylab.forecast.gate`).

compute=dask: the backtest's jobs run as Dask tasks (`pipelines.forecast_dask.client_map`),
and a `data.ledger` is aggregated on the workers (`aggregate_dataset_dask`: nothing of the
ledger on the driver, the quarantine written under the run folder). The summary equals
compute=local's (timings and `compute` aside).
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from replaylab.apps.inputs import compute_facts, dask_client, ledger_input, plain
from replaylab.config import ConfigError, from_mapping

log = logging.getLogger("replaylab")


def forecast(cfg: DictConfig, run_dir: Path) -> dict:
    """Aggregate if needed, backtest every forecaster, forecast the next horizon."""
    from replaylab.forecast import ForecastConfig
    from replaylab.pipelines.forecast import run_forecast

    if cfg.get("forecast") is None:
        raise ConfigError("pipeline=forecast needs the `forecast` config group "
                          "(conf/forecast/default.yaml)")
    fc = from_mapping(ForecastConfig, plain(cfg.forecast), "forecast")
    if cfg.data.get("aggregates") and cfg.data.get("ledger"):
        raise ConfigError("pipeline=forecast: give data.aggregates or data.ledger, not both")
    compute = cfg.get("compute")
    kind = compute.kind if compute is not None else "local"
    if kind not in ("local", "dask"):
        raise ConfigError(f"compute.kind={kind!r}; choose local or dask")
    if kind == "local":
        data, origin, _ = _input(cfg, fc, run_dir, dask=False)
        summary = run_forecast(data, fc, run_dir)
        summary["input"]["path"] = origin
        return summary
    from replaylab.pipelines.forecast_dask import client_map

    with dask_client(compute) as client:
        data, origin, facts = _input(cfg, fc, run_dir, dask=True)
        summary = run_forecast(data, fc, run_dir, map_fn=client_map(client))
        summary["compute"] = compute_facts(compute, client)
    summary["input"]["path"] = origin
    if facts:
        summary["artifacts"]["quarantine"] = facts["quarantine"]
        summary["compute"].update({"aggregation_partitions": facts["partitions"],
                                   "aggregation_timings_s": facts["timings_s"]})
    return summary


def _input(cfg: DictConfig, fc, run_dir: Path, dask: bool):
    """(aggregates or an aggregation, where they came from, the Dask aggregation's facts)."""
    from replaylab.contracts import read_aggregates
    from replaylab.pipelines.forecast import aggregate_ledger

    aggregates_path = cfg.data.get("aggregates")
    if aggregates_path:
        return read_aggregates(aggregates_path), str(aggregates_path), None
    inp = ledger_input(cfg)
    if dask and inp.path:  # the ledger never on the driver
        from replaylab.pipelines.forecast_dask import aggregate_dataset_dask

        data, facts = aggregate_dataset_dask(str(inp.path), fc.aggregation, run_dir,
                                             progress=log.info)
        return data, str(inp.path), facts
    from replaylab.pipelines.project import load_ledger

    loaded = load_ledger(inp)
    return aggregate_ledger(loaded.result, fc.aggregation), loaded.origin, None
