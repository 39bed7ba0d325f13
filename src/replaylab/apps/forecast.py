"""pipeline=forecast: Hydra config in, typed ForecastConfig, library call, summary out.

Input, first match wins:
- `data.aggregates`: an aggregates-v1 file (CSV or Parquet), forecast as it is;
- `data.ledger`: a ledger-v1 file, aggregated first (`forecast.aggregation`);
- neither: the embedded synthetic ledger (`data.synthetic`), aggregated first.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from replaylab.apps.inputs import ledger_input, plain
from replaylab.config import ConfigError, from_mapping


def forecast(cfg: DictConfig, run_dir: Path) -> dict:
    """Aggregate if needed, backtest every forecaster, forecast the next horizon."""
    from replaylab.contracts import read_aggregates
    from replaylab.forecast import ForecastConfig
    from replaylab.pipelines.forecast import aggregate_ledger, run_forecast

    if cfg.get("forecast") is None:
        raise ConfigError("pipeline=forecast needs the `forecast` config group "
                          "(conf/forecast/default.yaml)")
    fc = from_mapping(ForecastConfig, plain(cfg.forecast), "forecast")
    aggregates_path = cfg.data.get("aggregates")
    ledger_path = cfg.data.get("ledger")
    if aggregates_path and ledger_path:
        raise ConfigError("pipeline=forecast: give data.aggregates or data.ledger, not both")
    if aggregates_path:
        data = read_aggregates(aggregates_path)
        origin = str(aggregates_path)
    else:
        from replaylab.pipelines.project import load_ledger

        loaded = load_ledger(ledger_input(cfg))
        data = aggregate_ledger(loaded.result, fc.aggregation)
        origin = loaded.origin
    summary = run_forecast(data, fc, run_dir)
    summary["input"]["path"] = origin
    return summary
