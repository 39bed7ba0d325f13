"""Quantile forecasts of one request-rate series (the forecast-driven autoscaler's input).

`rate_forecast` returns an aggregates-v1 forecast table (quantile
columns `requests_q10/q50/q90`, `forecaster`, `forecast_origin`,
`horizon_buckets`) for every bucket of a rate series. The built-in forecaster
is a seasonal naive with empirical quantiles; the statsforecast forecasters of
`replaylab.forecast.forecasters` (moving_window, auto_ets, mstl) are used when named.

Seasonal naive with empirical quantiles, for bucket b at horizon h:
    q50 = y[b - season]  (season >= h, so y is known at the origin b - h)
    q_p = q50 * exp(Q_p(r)),  r[s] = log(y[s] / y[s - season]) over the
          `window` buckets known at the origin (s <= b - h)
`season=1` is the plain naive (last value) forecast.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from replaylab.contracts.columns import Aggregates as A

QUANTILE_COLUMNS = {0.1: "requests_q10", 0.5: "requests_q50", 0.9: "requests_q90"}


def _qcol(q: float) -> str:
    return QUANTILE_COLUMNS.get(q, f"requests_q{round(q * 100):02d}")


def seasonal_naive_quantiles(requests: pd.Series, horizon: int, quantiles: tuple[float, ...],
                             season: int, window: int) -> pd.DataFrame:
    """Forecasts of `requests` (indexed by bucket_start) at horizon `horizon` for every bucket
    with enough history; rows without history are left out."""
    if season < horizon:
        raise ValueError(f"season={season} < horizon={horizon}: y[b - season] is not yet known")
    y = requests.to_numpy(dtype=float)
    point = pd.Series(y, index=requests.index).shift(season)
    resid = np.log((y + 1.0) / (point.to_numpy() + 1.0))
    # residual quantiles known at the origin: residuals up to bucket b - h
    r = pd.Series(resid, index=requests.index)
    out = pd.DataFrame({A.BUCKET_START: requests.index})
    for q in quantiles:
        rq = r.rolling(window, min_periods=max(6, window // 4)).quantile(q).shift(horizon)
        out[_qcol(q)] = (point * np.exp(rq)).to_numpy()
    out["requests_point"] = point.to_numpy()
    out["horizon_buckets"] = horizon
    return out.dropna().reset_index(drop=True)


def _statsforecast_forecaster(name: str, requests: pd.Series, horizon: int,
                              quantiles: tuple[float, ...], season: int,
                              n_eval: int) -> pd.DataFrame:
    """A statsforecast model of `replaylab.forecast.forecasters` (moving_window, auto_ets,
    mstl), run over rolling origins for the last `n_eval` buckets; q10/q90 are the ends
    of its 80% interval, as in the forecasting pipeline."""
    try:
        from statsforecast import StatsForecast

        from replaylab.forecast.forecasters import INTERVAL_LEVEL, statsforecast_models
        from replaylab.forecast.panel import Seasons
    except ImportError as e:
        raise ValueError(f"forecaster={name!r} needs replaylab.forecast.forecasters and "
                         f"statsforecast ({e}); use naive or seasonal_naive") from e
    if tuple(sorted(quantiles)) != (0.1, 0.5, 0.9):
        raise ValueError(f"forecaster={name!r} gives q10/q50/q90 only, not {quantiles}")
    try:  # the forecasting pipeline's API: keyword arguments, checked here
        models = statsforecast_models((name,), Seasons(naive=season, mstl=(season,)), horizon,
                                      moving_window=6, conformal_windows=24,
                                      history=len(requests) - n_eval)
    except TypeError as e:
        raise ValueError(f"forecaster={name!r}: replaylab.forecast.forecasters."
                         f"statsforecast_models changed its arguments ({e})") from e
    if name not in models:
        raise ValueError(f"forecaster={name!r}: not one of the statsforecast forecasters "
                         "(moving_window, auto_ets, mstl); or use naive / seasonal_naive")
    long = pd.DataFrame({"unique_id": "pool", "ds": np.arange(len(requests)),
                         "y": requests.to_numpy(dtype=float)})
    cv = StatsForecast(models=[models[name]], freq=1, n_jobs=1).cross_validation(
        df=long, h=horizon, n_windows=n_eval, step_size=1, level=[INTERVAL_LEVEL],
        refit=name == "moving_window")  # WindowAverage has no `forward`
    cv = cv.reset_index() if "unique_id" not in cv.columns else cv
    cv = cv[cv["ds"] - cv["cutoff"] == horizon]
    lo, hi = f"{name}-lo-{INTERVAL_LEVEL}", f"{name}-hi-{INTERVAL_LEVEL}"
    return pd.DataFrame({A.BUCKET_START: requests.index[cv["ds"].to_numpy(dtype=int)],
                         _qcol(0.1): cv[lo].to_numpy(float), _qcol(0.5): cv[name].to_numpy(float),
                         _qcol(0.9): cv[hi].to_numpy(float), "horizon_buckets": horizon})


def rate_forecast(rates: pd.Series, horizon: int = 1,
                  quantiles: tuple[float, ...] = (0.1, 0.5, 0.9), *,
                  forecaster: str = "seasonal_naive", season: int = 144,
                  window: int = 1008, bucket_seconds: int = 600,
                  archetype: str = "all", n_eval: int = 144) -> pd.DataFrame:
    """rates: requests per bucket, indexed by bucket_start (epoch ms) -> aggregates-v1 forecast.

    `naive` and `seasonal_naive` are the built-in ones (every bucket with enough
    history); any other name goes to the statsforecast forecasters of the
    forecasting pipeline, for the last `n_eval` buckets.

    `forecast_origin` is the epoch ms at which the forecast could be made (the
    end of the last bucket it saw).
    """
    if horizon < 1:
        raise ValueError(f"horizon={horizon}; must be >= 1")
    rates = rates.sort_index()
    if forecaster == "seasonal_naive":
        fc = seasonal_naive_quantiles(rates, horizon, quantiles, season, window)
        name = f"seasonal_naive(season={season},window={window})"
    elif forecaster == "naive":
        fc = seasonal_naive_quantiles(rates, horizon, quantiles, horizon, window)
        name = f"naive(window={window})"
    else:
        fc = _statsforecast_forecaster(forecaster, rates, horizon, quantiles, season, n_eval)
        name = forecaster
    cols = [_qcol(q) for q in quantiles]
    fc[cols] = np.maximum.accumulate(np.clip(fc[cols].to_numpy(), 0, None), axis=1)  # no crossing
    fc[A.VERSION] = "1"
    fc[A.BUCKET_SECONDS] = bucket_seconds
    fc[A.ARCHETYPE] = archetype
    fc[A.SLO_CLASS] = "all"
    fc[A.REGION] = "all"
    fc["forecaster"] = name
    fc["forecast_origin"] = fc[A.BUCKET_START] - (horizon - 1) * bucket_seconds * 1000
    return fc


def inject_forecast_error(forecast: pd.DataFrame, bias: float, noise_sigma: float,
                          seed: int) -> pd.DataFrame:
    """Multiply every quantile column by (1 + bias) * lognormal(0, noise_sigma), per bucket.

    One draw per bucket shifts all its quantiles together (a wrong level, not a
    wrong spread); the draw is seeded.
    """
    rng = np.random.default_rng(seed)
    factor = (1.0 + bias) * np.exp(rng.normal(0.0, noise_sigma, len(forecast)))
    out = forecast.copy()
    cols = [c for c in out.columns if c.startswith("requests_q")]
    out[cols] = out[cols].to_numpy() * factor[:, None]
    out["forecaster"] = out["forecaster"] + f"+error(bias={bias},sigma={noise_sigma})"
    return out


def pinball_and_coverage(forecast: pd.DataFrame, actual: pd.Series) -> dict:
    """Mean pinball loss (requests per bucket) and 80% coverage of a forecast against actuals."""
    y = actual.reindex(forecast[A.BUCKET_START]).to_numpy(dtype=float)
    loss = []
    for q, col in QUANTILE_COLUMNS.items():
        if col in forecast:
            d = y - forecast[col].to_numpy()
            loss.append(np.mean(np.maximum(q * d, (q - 1) * d)))
    cov = np.mean((y >= forecast["requests_q10"].to_numpy())
                  & (y <= forecast["requests_q90"].to_numpy()))
    return {"pinball_mean": float(np.mean(loss)), "coverage_80": float(cov),
            "buckets": int(len(y))}


def usable_in_time(forecast: pd.DataFrame, lead_s: float) -> pd.DataFrame:
    """Per bucket and series (archetype, SLO class, region: those present), the freshest
    forecast row made at least `lead_s` before its bucket starts: what a controller with
    that lead could have acted on. Empty when no row was made in time."""
    lead_ms = int(round(lead_s * 1000))
    fc = forecast[forecast["forecast_origin"] <= forecast[A.BUCKET_START] - lead_ms]
    series = [c for c in (A.ARCHETYPE, A.SLO_CLASS, A.REGION) if c in fc.columns]
    return fc.sort_values("forecast_origin").groupby([A.BUCKET_START, *series],
                                                     sort=True).tail(1)


def read_pipeline_forecast(path: str, forecaster: str, *, lead_s: float, start_ms: int,
                           end_ms: int, scale: float = 1.0) -> pd.DataFrame:
    """A forecast table written by `pipeline=forecast` (backtest.parquet: every rolling
    origin; or forecast.parquet) as one row per bucket of [start_ms, end_ms), in the form
    `rate_forecast` returns.

    Per bucket and series (archetype, SLO class, region) the freshest forecast made at
    least `lead_s` before the bucket starts is kept (what a controller could have had in
    time); the series' quantiles are then summed per bucket. A sum of q90s is at least the
    q90 of the sum when the series move together and more than it otherwise, so the
    summed band is conservative (wider) for several series; with one series it is exact.
    `scale` multiplies the counts (the autoscaling trace's `scale`).
    """
    fc = pd.read_parquet(path)
    need = [A.BUCKET_START, A.BUCKET_SECONDS, "forecaster", "forecast_origin",
            *QUANTILE_COLUMNS.values()]
    missing = [c for c in need if c not in fc.columns]
    if missing:
        raise ValueError(f"{path}: lacks {missing}; expected a pipeline=forecast table "
                         "(backtest.parquet or forecast.parquet)")
    names = sorted(fc["forecaster"].unique())
    if forecaster not in names:
        raise ValueError(f"{path}: no forecaster {forecaster!r}; it holds {names}")
    fc = fc[(fc["forecaster"] == forecaster) & (fc[A.BUCKET_START] >= start_ms)
            & (fc[A.BUCKET_START] < end_ms)]
    fresh = usable_in_time(fc, lead_s)
    if fresh.empty:
        raise ValueError(f"{path}: no {forecaster} forecast made >= {lead_s:g} s before a "
                         f"bucket in [{start_ms}, {end_ms}) ms; run pipeline=forecast with "
                         "forecast.backtest.step_buckets=1 over the evaluated day")
    qcols = list(QUANTILE_COLUMNS.values())
    per_bucket = fresh.groupby(A.BUCKET_START).agg(
        **{c: (c, "sum") for c in qcols}, forecast_origin=("forecast_origin", "max"),
        bucket_seconds=(A.BUCKET_SECONDS, "first"), series=(qcols[0], "size")).reset_index()
    per_bucket[qcols] = per_bucket[qcols].to_numpy() * scale
    width_ms = per_bucket[A.BUCKET_SECONDS].to_numpy("int64") * 1000
    per_bucket["horizon_buckets"] = (
        (per_bucket[A.BUCKET_START] - per_bucket["forecast_origin"]) // width_ms + 1)
    for col, v in ((A.VERSION, "1"), (A.ARCHETYPE, "all"), (A.SLO_CLASS, "all"),
                   (A.REGION, "all")):
        per_bucket[col] = v
    per_bucket["forecaster"] = f"{forecaster} (pipeline=forecast table)"
    return per_bucket.drop(columns="series")
