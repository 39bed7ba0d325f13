"""Forecast tables in the aggregates-v1 forecast form.

One row per (series, forecaster, step ahead): the series' aggregates columns
(archetype, slo_class, region, bucket_start of the forecast bucket...) with
`requests` replaced by `requests_q10`, `requests_q50`, `requests_q90`, plus
`forecaster`, `forecast_origin` (epoch ms: the start of the first bucket the
forecaster did not see) and `horizon_buckets` (steps ahead, 1 = the first bucket).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from replaylab.contracts import AGGREGATES_VERSION
from replaylab.contracts.columns import Aggregates as A
from replaylab.forecast.backtest import band
from replaylab.forecast.config import ForecastConfig
from replaylab.forecast.forecasters import INTERVAL_LEVEL, statsforecast_models
from replaylab.forecast.gbm import GlobalQuantileLGBM
from replaylab.forecast.panel import SEP, SERIES_KEYS, Panel, Seasons

Q10, Q50, Q90 = "requests_q10", "requests_q50", "requests_q90"
FORECASTER, ORIGIN, HORIZON = "forecaster", "forecast_origin", "horizon_buckets"


def to_forecast_form(wide: pd.DataFrame, panel: Panel, forecasters: list[str],
                     actual: bool) -> pd.DataFrame:
    """statsforecast-style rows (unique_id, ds, cutoff, [y], bands) -> the forecast form.

    `ds` and `cutoff` are bucket indices of the panel's grid (ds may run past it).
    """
    width_ms = panel.bucket_seconds * 1000
    t0 = int(panel.bucket_start_ms[0])
    parts = []
    for name in forecasters:
        lo, mid, hi = band(name)
        part = pd.DataFrame({
            "unique_id": wide["unique_id"].to_numpy(),
            A.BUCKET_START: t0 + wide["ds"].to_numpy(dtype="int64") * width_ms,
            ORIGIN: t0 + (wide["cutoff"].to_numpy(dtype="int64") + 1) * width_ms,
            HORIZON: (wide["ds"] - wide["cutoff"]).to_numpy(dtype="int64"),
            FORECASTER: name, Q10: wide[lo].to_numpy(float), Q50: wide[mid].to_numpy(float),
            Q90: wide[hi].to_numpy(float)})
        if actual:
            part[A.REQUESTS] = wide["y"].to_numpy(float)
        parts.append(part)
    out = pd.concat(parts, ignore_index=True)
    keys = out["unique_id"].str.split(SEP, expand=True, regex=False)
    for i, col in enumerate(SERIES_KEYS):
        out[col] = keys[i]
    out[A.VERSION] = AGGREGATES_VERSION
    out[A.BUCKET_SECONDS] = panel.bucket_seconds
    out[A.TAXONOMY_VERSION] = panel.taxonomy_version
    cols = [A.VERSION, A.BUCKET_START, A.BUCKET_SECONDS, A.ARCHETYPE, A.TAXONOMY_VERSION,
            A.SLO_CLASS, A.REGION, *([A.REQUESTS] if actual else []), Q10, Q50, Q90,
            FORECASTER, ORIGIN, HORIZON]
    return out[cols].sort_values([FORECASTER, A.ARCHETYPE, A.SLO_CLASS, A.REGION, ORIGIN,
                                  A.BUCKET_START]).reset_index(drop=True)


def future_forecast(panel: Panel, cfg: ForecastConfig, seasons: Seasons,
                    forecasters: list[str]) -> pd.DataFrame:
    """Fit on every bucket and forecast the next horizon: the table an operator would use."""
    from statsforecast import StatsForecast

    h = cfg.backtest.horizon_buckets
    models = statsforecast_models(tuple(f for f in forecasters if f != "lightgbm"), seasons, h,
                                  cfg.moving_window_buckets, cfg.backtest.conformal_windows,
                                  history=panel.n_buckets)
    n = panel.n_buckets
    wide = pd.DataFrame({"unique_id": np.repeat(panel.ids, h),
                         "ds": np.tile(np.arange(n, n + h), panel.n_series), "cutoff": n - 1})
    if models:
        sf = StatsForecast(models=list(models.values()), freq=1, n_jobs=cfg.n_jobs)
        fc = sf.forecast(df=panel.long(), h=h, level=[INTERVAL_LEVEL])
        fc = fc.reset_index() if "unique_id" not in fc.columns else fc
        wide = wide.merge(fc, on=["unique_id", "ds"], how="left")
    if "lightgbm" in forecasters:
        future_ms = panel.bucket_start_ms[-1] + panel.bucket_seconds * 1000 * np.arange(1, h + 1)
        model = GlobalQuantileLGBM(cfg.lightgbm, h, seasons.naive, cfg.seed,
                                   cfg.lightgbm.calibration_buckets(cfg.backtest))
        q = model.fit(panel.y, panel.bucket_start_ms).predict(panel.y, future_ms)
        for k, col in enumerate(band("lightgbm")):
            wide[col] = q[:, :, k].ravel()
    names = [f for f in forecasters if f in models or f == "lightgbm"]
    for name in names:
        cols = list(band(name))
        wide[cols] = np.clip(wide[cols].to_numpy(float), 0.0, None)
    return to_forecast_form(wide, panel, names, actual=False)
