"""pipeline=forecast: Hydra config in, typed ForecastConfig, library call, summary out.

Input, first match wins:
- `data.aggregates`: an aggregates-v1 file (CSV or Parquet), forecast as it is;
- `data.ledger`: a ledger-v1 file or dataset, aggregated first (`forecast.aggregation`);
- neither: the embedded synthetic ledger (`data.synthetic`), aggregated first; for this
  pipeline 4 days with a daily profile of session starts (conf/pipeline/forecast.yaml), so
  the bare `python -m training pipeline=forecast` has a season to forecast and room for
  its backtest. The run ends with the gate's verdict (`replaylab.forecast.gate`).

`compute` (where the partitions are processed, `replaylab.compute`): the ledger is read
and aggregated over the engine's partitions (compute=dask: by the workers, nothing of a
`data.ledger` dataset on the driver), its quarantine written under the run folder
(`artifacts.quarantine`), and the backtest's jobs run as engine tasks. The summary is the
same on both engines (timings aside) and says which one ran (`compute`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from replaylab.apps.inputs import compute_engine, ledger_input, plain
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
    with compute_engine(cfg) as engine:
        data, origin, quarantine = _input(cfg, fc, run_dir, engine)
        summary = run_forecast(data, fc, run_dir, engine=engine)
        summary["compute"] = engine.facts()
    summary["input"]["path"] = origin
    if quarantine is not None:
        summary["artifacts"]["quarantine"] = quarantine
    return summary


def _input(cfg: DictConfig, fc, run_dir: Path, engine):
    """(aggregates or an aggregation, where they came from, the quarantine written or None)."""
    from replaylab.contracts import read_aggregates
    from replaylab.pipelines.forecast import aggregate_ledger

    aggregates_path = cfg.data.get("aggregates")
    if aggregates_path:
        return read_aggregates(aggregates_path), str(aggregates_path), None
    inp = ledger_input(cfg)
    if inp.path:  # read by the engine (compute=dask: the workers; never on the driver)
        ledger, origin = engine.read_ledger(str(inp.path)), str(inp.path)
    else:  # the seeded synthetic ledger, made here
        from replaylab.pipelines.project import load_ledger

        loaded = load_ledger(inp)
        ledger, origin = engine.from_validated(loaded.result), loaded.origin
    quarantine = ledger.write_quarantine(run_dir / "quarantine")
    return aggregate_ledger(ledger, fc.aggregation, engine, progress=log.info), origin, quarantine
