"""Forecast: archetypes, privacy-safe aggregates, backtested probabilistic forecasts.

Light at import (configs, taxonomy); aggregation, statsforecast / LightGBM
forecasters, backtests and drift load on first use (`replaylab.forecast.X`).
See docs/design/archetypes.md and docs/results/forecast.md.
"""

from replaylab.contracts.lazy import lazy_exports
from replaylab.forecast.config import (
    CONTROLS,
    FORECASTERS,
    AggregationConfig,
    BacktestConfig,
    ForecastConfig,
    LightGBMConfig,
)
from replaylab.forecast.taxonomy import (
    TAXONOMIES,
    TAXONOMY_VERSION,
    Taxonomy,
    assign_archetypes,
    get_taxonomy,
)

_LAZY = {
    "AggregationResult": "replaylab.forecast.aggregate",
    "ledger_to_aggregates": "replaylab.forecast.aggregate",
    "ForecastDataError": "replaylab.forecast.panel",
    "Panel": "replaylab.forecast.panel",
    "build_panel": "replaylab.forecast.panel",
    "plan_backtest": "replaylab.forecast.panel",
    "choose_seasons": "replaylab.forecast.panel",
    "run_backtest": "replaylab.forecast.backtest",
    "score_backtest": "replaylab.forecast.backtest",
    "GlobalQuantileLGBM": "replaylab.forecast.gbm",
    "archetype_mix_drift": "replaylab.forecast.drift",
    "calibration_drift": "replaylab.forecast.drift",
    "js_divergence": "replaylab.forecast.drift",
    "future_forecast": "replaylab.forecast.future",
    "seasonal_poisson_aggregates": "replaylab.forecast.synthetic",
}

__all__ = ["CONTROLS", "FORECASTERS", "TAXONOMIES", "TAXONOMY_VERSION", "AggregationConfig",
           "BacktestConfig", "ForecastConfig", "LightGBMConfig", "Taxonomy",
           "assign_archetypes", "get_taxonomy", *_LAZY]

# lazy: keep statsforecast / lightgbm out of the import
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
