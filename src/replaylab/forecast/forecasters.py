"""The statsforecast forecasters, configured for bucketed request counts.

Each forecaster yields statsforecast's columns `<name>`, `<name>-lo-80`,
`<name>-hi-80`; here q50 = `<name>`, q10 = lo-80, q90 = hi-80 (the 80% interval's
ends). For AutoETS and MSTL those are their own (normal) prediction intervals, whose
centre is the mean, equal to the median under that normal law.

- seasonal_naive: SeasonalNaive(season); moving_window: WindowAverage(window).
  Neither has a predictive distribution of its own that we trust, so both take
  statsforecast's ConformalIntervals ("conformal_error"): at each origin, the
  80% quantile of the absolute errors of the same step ahead over the last
  `conformal_windows` non-overlapping horizon-long windows before the origin.
- auto_ets: AutoETS. statsforecast's ETS (like R's ets) cannot hold a season
  longer than 24, so with 10-minute buckets (a day = 144) it is non-seasonal; the
  daily season is MSTL's job.
- mstl: MSTL(seasons) with an AutoETS(ZZN) trend. STL is given R's default LOESS
  jumps (10% of each smoother's window); statsmodels' default of 1 evaluates
  every point and made MSTL ~10x slower here for the same decomposition.
"""

from __future__ import annotations

import math

from replaylab.forecast.panel import Seasons

INTERVAL_LEVEL = 80  # q10 / q90 = the 80% interval's ends
_ETS_MAX_SEASON = 24  # statsforecast.ets ignores longer seasons


def stl_jumps(season: int, seasonal_window: int = 11) -> dict[str, int]:
    """R stl's default jumps (ceil(window / 10)) for statsmodels' STL of one season."""
    # statsmodels' default windows: trend = the smallest odd integer >= 1.5 m / (1 - 1.5 / s),
    # low pass = the smallest odd integer > m
    trend = math.ceil(1.5 * season / (1 - 1.5 / seasonal_window))
    trend += trend % 2 == 0
    low_pass = season + 1 if season % 2 == 0 else season + 2
    return {"trend_jump": math.ceil(trend / 10), "low_pass_jump": math.ceil(low_pass / 10),
            "seasonal_jump": math.ceil(seasonal_window / 10)}


def conformal_windows_for(history: int, needs: int, horizon: int, wanted: int) -> int:
    """Conformal windows that fit: statsforecast forecasts each past window from the
    buckets before it, and a model that needs `needs` buckets (the season, the moving
    window) yields NaN, hence NaN intervals, for a window starting earlier."""
    return max(min(wanted, (history - needs) // horizon), 0)


def statsforecast_models(names: tuple[str, ...], seasons: Seasons, horizon: int,
                         moving_window: int, conformal_windows: int,
                         history: int) -> dict[str, object]:
    """{name: statsforecast model} for the configured names that can run on these seasons.

    `history`: buckets before the first origin. MSTL is left out (the caller reports
    it skipped) when no season is usable; a conformal model when fewer than two
    conformal windows fit in the history.
    """
    from statsforecast.models import MSTL, AutoETS, SeasonalNaive, WindowAverage
    from statsforecast.utils import ConformalIntervals

    def conformal(needs: int) -> ConformalIntervals | None:
        n = conformal_windows_for(history, needs, horizon, conformal_windows)
        return ConformalIntervals(n_windows=n, h=horizon, method="conformal_error") \
            if n >= 2 else None

    out: dict[str, object] = {}
    for name in names:
        if name == "seasonal_naive" and conformal(seasons.naive):
            out[name] = SeasonalNaive(season_length=seasons.naive, alias=name,
                                      prediction_intervals=conformal(seasons.naive))
        elif name == "moving_window" and conformal(moving_window):
            out[name] = WindowAverage(window_size=moving_window, alias=name,
                                      prediction_intervals=conformal(moving_window))
        elif name == "auto_ets":
            m = seasons.naive if seasons.naive <= _ETS_MAX_SEASON else 1
            out[name] = AutoETS(season_length=m, alias=name)
        elif name == "mstl" and seasons.mstl:
            out[name] = MSTL(season_length=list(seasons.mstl), alias=name,
                             trend_forecaster=AutoETS(model="ZZN"),
                             stl_kwargs=stl_jumps(min(seasons.mstl)))
    return out


def refits_every_window(name: str) -> bool:
    """Seasonal naive and moving window are refitted at every origin (cheap; and
    statsforecast's WindowAverage has no `forward`); the others follow the config."""
    return name in ("seasonal_naive", "moving_window")
