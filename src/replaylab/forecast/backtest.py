"""Rolling-origin backtest of every forecaster, and its scores.

statsforecast's `cross_validation` runs its models (one call per forecaster, so
one failure or its timing stays separate); the global LightGBM model, which
statsforecast cannot run, goes through the same origins by hand. Both produce
statsforecast's frame: unique_id, ds, cutoff (the last bucket the model saw), y,
`<name>`, `<name>-lo-80`, `<name>-hi-80`. Scores come from utilsforecast.losses.

The backtest is a list of independent jobs (`backtest_jobs`): one per statsforecast
forecaster, one per LightGBM refit group (the origins that share one fit). `run_backtest`
runs them with a `map_fn` (default: one after the other here; the pipeline's: one task
each of the compute engine, `Engine.submit_all`) and assembles the result in the
configured order, so the predictions do not depend on where the jobs ran.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from replaylab.forecast.config import CONTROLS, ForecastConfig
from replaylab.forecast.forecasters import (
    INTERVAL_LEVEL,
    refits_every_window,
    statsforecast_models,
)
from replaylab.forecast.gbm import GlobalQuantileLGBM
from replaylab.forecast.panel import BacktestPlan, ForecastDataError, Panel, Seasons

KEYS = ["unique_id", "ds", "cutoff", "y"]


def band(name: str) -> tuple[str, str, str]:
    """(q10, q50, q90) columns of a forecaster in statsforecast's naming."""
    return f"{name}-lo-{INTERVAL_LEVEL}", name, f"{name}-hi-{INTERVAL_LEVEL}"


@dataclass
class BacktestResult:
    predictions: pd.DataFrame  # KEYS + three columns per forecaster that ran
    forecasters: list[str]
    skipped: dict[str, str] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)


def _clip(frame: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    """Counts are >= 0: clip every quantile at 0 (a lower end below 0 covers nothing more)."""
    for name in names:
        cols = list(band(name))
        frame[cols] = np.clip(frame[cols].to_numpy(dtype=float), 0.0, None)
    return frame


def _statsforecast_cv(long: pd.DataFrame, name: str, model: object, plan: BacktestPlan,
                      cfg: ForecastConfig) -> pd.DataFrame:
    from statsforecast import StatsForecast

    every = cfg.backtest.refit_every_windows
    refit = True if refits_every_window(name) else (every if every > 0 else False)
    sf = StatsForecast(models=[model], freq=1, n_jobs=cfg.n_jobs)
    cv = sf.cross_validation(df=long, h=plan.horizon, n_windows=plan.n_windows,
                             step_size=plan.step, level=[INTERVAL_LEVEL], refit=refit)
    return cv.reset_index() if "unique_id" not in cv.columns else cv


def lightgbm_groups(panel: Panel, cfg: ForecastConfig, plan: BacktestPlan) -> list[list[int]]:
    """The plan's origins in refit groups: the model is fitted at each group's first
    origin (`refit_every_windows`; 0: one group) and re-applied at the others."""
    origins = list(plan.origins(panel.n_buckets))
    every = cfg.backtest.refit_every_windows
    if every <= 0:
        return [origins]
    return [origins[i:i + every] for i in range(0, len(origins), every)]


def lightgbm_origins(panel: Panel, cfg: ForecastConfig, plan: BacktestPlan, seasons: Seasons,
                     origins: Sequence[int]) -> pd.DataFrame:
    """One refit group: fit on buckets [0, origins[0]), forecast from each origin (the
    model sees buckets [0, origin) only)."""
    lo, mid, hi = band("lightgbm")
    model = GlobalQuantileLGBM(cfg.lightgbm, plan.horizon, seasons.naive, cfg.seed,
                               cfg.lightgbm.calibration_buckets(cfg.backtest))
    model.fit(panel.y[:, :origins[0]], panel.bucket_start_ms[:origins[0]])
    frames = []
    for origin in origins:
        steps = np.arange(origin, origin + plan.horizon)
        q = model.predict(panel.y[:, :origin], panel.bucket_start_ms[steps])
        frames.append(pd.DataFrame({
            "unique_id": np.repeat(panel.ids, plan.horizon),
            "ds": np.tile(steps, panel.n_series), "cutoff": origin - 1,
            "y": panel.y[:, steps].ravel(),
            lo: q[:, :, 0].ravel(), mid: q[:, :, 1].ravel(), hi: q[:, :, 2].ravel()}))
    return pd.concat(frames, ignore_index=True)


def lightgbm_cv(panel: Panel, cfg: ForecastConfig, plan: BacktestPlan,
                seasons: Seasons) -> pd.DataFrame:
    """The global model through the same origins; it sees buckets [0, origin) only."""
    return pd.concat([lightgbm_origins(panel, cfg, plan, seasons, g)
                      for g in lightgbm_groups(panel, cfg, plan)], ignore_index=True)


@dataclass(frozen=True)
class BacktestJob:
    """One independent piece of the backtest: a statsforecast forecaster (`model`), or a
    LightGBM refit group (`origins`). Carries its inputs, so it runs anywhere."""

    name: str
    panel: Panel
    cfg: ForecastConfig
    plan: BacktestPlan
    seasons: Seasons
    model: object | None = None
    origins: tuple[int, ...] = ()


@dataclass
class JobResult:
    name: str
    frame: pd.DataFrame | None  # None: failed (error says why)
    error: str | None
    seconds: float


def run_job(job: BacktestJob) -> JobResult:
    """Run one job; a failure is a result (seasonal naive's, which is required, raises)."""
    t0 = time.perf_counter()
    try:
        if job.name == "lightgbm":
            frame = lightgbm_origins(job.panel, job.cfg, job.plan, job.seasons, job.origins)
        else:
            frame = _statsforecast_cv(job.panel.long(), job.name, job.model, job.plan, job.cfg)
    except Exception as e:  # noqa: BLE001 - one forecaster's failure is a result
        if job.name == "seasonal_naive":
            raise
        return JobResult(job.name, None, f"{type(e).__name__}: {e}"[:300],
                         time.perf_counter() - t0)
    return JobResult(job.name, frame, None, time.perf_counter() - t0)


def backtest_jobs(panel: Panel, cfg: ForecastConfig, plan: BacktestPlan,
                  seasons: Seasons) -> tuple[list[BacktestJob], dict[str, str]]:
    """The jobs of every configured forecaster that can run, and why the others cannot."""
    models = statsforecast_models(cfg.forecasters, seasons, plan.horizon,
                                  cfg.moving_window_buckets, cfg.backtest.conformal_windows,
                                  history=panel.n_buckets - plan.test_size())
    jobs: list[BacktestJob] = []
    skipped: dict[str, str] = {}
    for name in cfg.forecasters:
        if name == "lightgbm":
            jobs.extend(BacktestJob(name, panel, cfg, plan, seasons, origins=tuple(g))
                        for g in lightgbm_groups(panel, cfg, plan))
        elif name in models:
            jobs.append(BacktestJob(name, panel, cfg, plan, seasons, model=models[name]))
        elif name == "seasonal_naive":  # the MASE scale and the control: required
            raise ForecastDataError(f"seasonal naive cannot run: {_why_not(name, seasons)}; "
                                    "use more history (fewer windows, narrower buckets)")
        else:
            skipped[name] = _why_not(name, seasons)
    return jobs, skipped


def serial_map(fn: Callable, items: list) -> list:
    """The default `map_fn`: here, one after the other, in order."""
    return [fn(x) for x in items]


def run_backtest(panel: Panel, cfg: ForecastConfig, plan: BacktestPlan, seasons: Seasons,
                 map_fn: Callable[[Callable, list], list] | None = None) -> BacktestResult:
    """Every configured forecaster over the plan's origins; failures are reported, not fatal.

    map_fn(fn, jobs) -> [fn(job) for job in jobs], in order, run wherever it likes (default
    `serial_map`; `Engine.submit_all` of `replaylab.compute`: one engine task per job).
    The result does not depend on it: each job is the same computation on the same inputs.
    """
    jobs, skipped = backtest_jobs(panel, cfg, plan, seasons)
    results = (map_fn or serial_map)(run_job, jobs)
    result = BacktestResult(predictions=pd.DataFrame(), forecasters=[])
    merged: pd.DataFrame | None = None
    for name in cfg.forecasters:
        if name in skipped:
            result.skipped[name] = skipped[name]
            continue
        mine = [r for r in results if r.name == name]
        failed = [r.error for r in mine if r.frame is None]
        if failed:
            result.skipped[name] = failed[0]
            continue
        result.timings_s[name] = round(sum(r.seconds for r in mine), 3)
        frame = mine[0].frame if len(mine) == 1 else pd.concat([r.frame for r in mine],
                                                               ignore_index=True)
        frame = frame[KEYS + list(band(name))]
        merged = frame if merged is None else merged.merge(frame, on=KEYS, how="inner")
        result.forecasters.append(name)
    result.predictions = _clip(merged, result.forecasters)
    return result


def _why_not(name: str, seasons: Seasons) -> str:
    if name == "mstl":
        return "no usable season: " + "; ".join(seasons.notes)
    return "fewer than 2 conformal windows fit in the history before the first origin"


def score_backtest(bt: BacktestResult, panel: Panel, seasons: Seasons) -> dict[str, dict]:
    """Per forecaster: MASE, pinball (mean of q10/q50/q90), coverage of the 80% interval.

    Every loss is computed per (origin, series) by utilsforecast, then averaged.
    MASE and the scaled pinball divide by the in-sample MAE of the seasonal naive
    (season `seasons.naive`) over the history up to each origin.
    """
    from utilsforecast.losses import coverage, mase, quantile_loss, scaled_quantile_loss

    cv, names = bt.predictions, bt.forecasters
    train = panel.long()
    ms = mase(cv, models=names, seasonality=seasons.naive, train_df=train)
    cov = coverage(cv, models=names, level=INTERVAL_LEVEL)
    pin, pin_scaled = {}, {}
    for col, q in zip(range(3), (0.1, 0.5, 0.9), strict=True):
        cols = {n: band(n)[col] for n in names}
        pin[q] = quantile_loss(cv, models=cols, q=q)
        pin_scaled[q] = scaled_quantile_loss(cv, models=cols, q=q, seasonality=seasons.naive,
                                             train_df=train)
    out = {}
    for n in names:
        out[n] = {
            "mase": _mean(ms[n]),
            "pinball_mean": _mean(pd.concat([pin[q][n] for q in pin])),
            "pinball_scaled": _mean(pd.concat([pin_scaled[q][n] for q in pin_scaled])),
            "coverage_80": _mean(cov[n]),
            "seconds": bt.timings_s.get(n),
        }
    return out


def origin_mase(bt: BacktestResult, panel: Panel, seasons: Seasons) -> pd.DataFrame:
    """MASE per origin: one row per backtest origin (`cutoff`, in order), one column per
    forecaster, each the mean over series of that origin's MASE (the per-(origin, series)
    values `score_backtest` averages). The paired comparisons of `forecast.gate` read it."""
    from utilsforecast.losses import mase

    names = bt.forecasters
    ms = mase(bt.predictions, models=names, seasonality=seasons.naive, train_df=panel.long())
    ms[names] = ms[names].apply(pd.to_numeric, errors="coerce").replace([np.inf, -np.inf],
                                                                         np.nan)
    return ms.groupby("cutoff", sort=True)[names].mean().reset_index()


def series_scores(bt: BacktestResult, panel: Panel, seasons: Seasons) -> dict[str, dict]:
    """{series id: {forecaster: {"mase", "coverage_80"}}}: the per-series view of the scores."""
    from utilsforecast.losses import coverage, mase

    cv, names = bt.predictions, bt.forecasters
    ms = mase(cv, models=names, seasonality=seasons.naive, train_df=panel.long())
    cov = coverage(cv, models=names, level=INTERVAL_LEVEL)
    out: dict[str, dict] = {}
    for sid in panel.ids:
        m, c = ms[ms["unique_id"] == sid], cov[cov["unique_id"] == sid]
        out[sid] = {n: {"mase": _mean(m[n]), "coverage_80": _mean(c[n])} for n in names}
    return out


def _mean(s: pd.Series) -> float | None:
    v = pd.to_numeric(s, errors="coerce").replace([np.inf, -np.inf], np.nan).mean()
    return None if pd.isna(v) else round(float(v), 4)


def choose_best(scores: dict[str, dict]) -> dict:
    """`best` = the lowest MASE (ties: lowest scaled pinball); how it compares to the controls."""
    ranked = sorted((s["mase"], s["pinball_scaled"] or np.inf, n)
                    for n, s in scores.items() if s["mase"] is not None)
    best = ranked[0][2]
    sn = scores["seasonal_naive"]["mase"]
    controls = {n: scores[n]["mase"] for n in CONTROLS if n in scores and scores[n]["mase"]}
    best_control = min(controls, key=controls.get)
    models = [(m, n) for m, _, n in ranked if n not in CONTROLS]
    out = {"best": best, "beats_seasonal_naive": bool(best != "seasonal_naive" and
                                                      scores[best]["mase"] < sn),
           "best_control": best_control, "best_model": models[0][1] if models else None}
    if models:
        m, name = models[0]
        out["beats_controls"] = bool(m < controls[best_control])
        out["mase_change_vs_best_control_pct"] = round(100 * (m / controls[best_control] - 1), 2)
    out["mase_change_vs_seasonal_naive_pct"] = round(100 * (scores[best]["mase"] / sn - 1), 2)
    return out
