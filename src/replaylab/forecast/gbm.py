"""Global LightGBM quantile model over all series: lags >= horizon, calendar, series id.

Written here rather than with mlforecast (the Nixtla library built for this)
because mlforecast is not in the environment; the design is its "direct, lags >=
horizon" strategy: every lag a row uses is at least `horizon` buckets back, so
one model per quantile forecasts every step 1..horizon from an origin without
recursion, and a forecast at origin o reads only buckets < o (tested).

Counts are divided by a per-series scale (1 + mean of the training history) so
one model serves series of very different volume; log1p(scale) is a feature so
the model can still learn that relative noise shrinks with volume (Poisson).
Quantile regression commutes with that positive rescaling.

In-sample quantiles of boosted trees are too narrow out of sample, so the band is
conformalized (conformalized quantile regression, Romano et al. 2019), per series:
boosters fitted without the last `calibration_buckets` of the history forecast
them; the conformity score max(q10 - y, y - q90) of those buckets, at its
ceil(0.8 (n + 1)) / n quantile, widens (or narrows, when negative) the band of the
boosters then refitted on the whole history.
"""

from __future__ import annotations

import numpy as np

from replaylab.forecast.config import LightGBMConfig

QUANTILES = (0.1, 0.5, 0.9)


def calendar(times_ms: np.ndarray) -> np.ndarray:
    """(n, 2): hour of day (UTC) and day of week (Monday = 0) of each bucket start."""
    t = np.asarray(times_ms, dtype="int64")
    hour = (t // 3_600_000) % 24
    dow = (t // 86_400_000 + 3) % 7  # 1970-01-01 was a Thursday
    return np.stack([hour, dow], axis=1).astype("float64")


class GlobalQuantileLGBM:
    """One LightGBM booster per quantile, trained on every series at once.

    fit(y, times_ms): y is (n_series, n) history (buckets [0, n)); predict(y,
    times_ms) forecasts buckets n..n+horizon-1 of each series from the history y
    (which may be longer than at fit time: the boosters are re-applied).
    """

    def __init__(self, cfg: LightGBMConfig, horizon: int, season: int, seed: int = 0,
                 calibration_buckets: int = 0):
        self.cfg = cfg
        self.horizon = horizon
        self.season = season
        self.seed = seed
        self.calibration_buckets = calibration_buckets  # 0: no conformal correction

    # ------------------------------------------------------------ features
    def _lags(self) -> list[int]:
        h, m = self.horizon, self.season
        lags = {h + o for o in self.cfg.lag_offsets}
        if m >= 2:
            lags |= {k * m for k in (1, 2) if k * m >= h}
        return sorted(lags)

    def _features(self, y: np.ndarray, targets: np.ndarray, times_ms: np.ndarray,
                  scale: np.ndarray) -> np.ndarray:
        """(n_series * len(targets), n_features) for target buckets `targets` of every series.

        Reads y[:, t - lag] with lag >= horizon only (NaN before the series start).
        """
        n_s, n = y.shape
        cols = []
        for lag in self._lags():
            src = targets - lag
            v = np.full((n_s, len(targets)), np.nan)
            ok = (src >= 0) & (src < n)
            v[:, ok] = y[:, src[ok]]
            cols.append(v / scale[:, None])
        csum = np.concatenate([np.zeros((n_s, 1)), np.cumsum(y, axis=1)], axis=1)
        end = targets - self.horizon + 1  # exclusive end of the window: bucket t - horizon
        for w in self.cfg.rolling_windows:
            v = np.full((n_s, len(targets)), np.nan)
            ok = (end - w >= 0) & (end <= n)
            v[:, ok] = (csum[:, end[ok]] - csum[:, end[ok] - w]) / w
            cols.append(v / scale[:, None])
        cal = calendar(times_ms)
        cols += [np.broadcast_to(cal[:, 0], (n_s, len(targets))),
                 np.broadcast_to(cal[:, 1], (n_s, len(targets))),
                 np.broadcast_to(np.arange(n_s, dtype=float)[:, None], (n_s, len(targets))),
                 np.broadcast_to(np.log1p(scale)[:, None], (n_s, len(targets)))]
        return np.stack([c.reshape(-1) for c in cols], axis=1)

    # ------------------------------------------------------------ estimator
    def _boosters(self, y: np.ndarray, times_ms: np.ndarray, scale: np.ndarray) -> list:
        import lightgbm as lgb

        first = self.horizon + max(self.cfg.lag_offsets)
        if y.shape[1] - first < 2:
            raise ValueError(f"LightGBM needs more than {first + 1} buckets of history, "
                             f"has {y.shape[1]}")
        targets = np.arange(first, y.shape[1])
        x = self._features(y, targets, times_ms[targets], scale)
        label = (y[:, targets] / scale[:, None]).reshape(-1)
        boosters = []
        for q in QUANTILES:
            data = lgb.Dataset(x, label, categorical_feature=[x.shape[1] - 2],
                               free_raw_data=True)
            params = self.cfg.lightgbm_params(q, self.seed)
            boosters.append(lgb.train(params, data, num_boost_round=self.cfg.n_estimators))
        return boosters

    def _raw(self, boosters: list, y: np.ndarray, targets: np.ndarray,
             times_ms: np.ndarray) -> np.ndarray:
        """(n_series, len(targets), 3) sorted quantiles in the series' units."""
        x = self._features(y, targets, times_ms, self.scale_)
        preds = np.stack([b.predict(x) for b in boosters], axis=1)
        preds = preds.reshape(y.shape[0], len(targets), len(QUANTILES))
        return np.sort(preds, axis=2) * self.scale_[:, None, None]

    def _conformal_margin(self, y: np.ndarray, times_ms: np.ndarray) -> np.ndarray:
        """Per-series CQR margin from the last `calibration_buckets` (0 when disabled)."""
        n = y.shape[1]
        first = self.horizon + max(self.cfg.lag_offsets)
        c = min(self.calibration_buckets, n // 2, n - first - 2)  # leave the boosters rows
        if c < 1:
            return np.zeros(y.shape[0])
        boosters = self._boosters(y[:, : n - c], times_ms[: n - c], self.scale_)
        targets = np.arange(n - c, n)
        # direct features read lags >= horizon: y[:, :n] holds every bucket they need
        q = self._raw(boosters, y, targets, times_ms[targets])
        score = np.maximum(q[:, :, 0] - y[:, targets], y[:, targets] - q[:, :, 2])
        level = min(np.ceil(0.8 * (c + 1)) / c, 1.0)
        return np.quantile(score, level, axis=1, method="higher")

    def fit(self, y: np.ndarray, times_ms: np.ndarray) -> GlobalQuantileLGBM:
        y = np.asarray(y, dtype="float64")
        times_ms = np.asarray(times_ms)
        self.n_series_ = y.shape[0]
        self.scale_ = 1.0 + y.mean(axis=1)
        self.margin_ = self._conformal_margin(y, times_ms)
        self.boosters_ = self._boosters(y, times_ms, self.scale_)
        return self

    def predict(self, y: np.ndarray, future_times_ms: np.ndarray) -> np.ndarray:
        """(n_series, horizon, 3): q10, q50, q90 of buckets n..n+horizon-1; sorted, >= 0."""
        y = np.asarray(y, dtype="float64")
        if y.shape[0] != self.n_series_:
            raise ValueError(f"fitted on {self.n_series_} series, got {y.shape[0]}")
        n = y.shape[1]
        q = self._raw(self.boosters_, y, np.arange(n, n + self.horizon),
                      np.asarray(future_times_ms))
        q[:, :, 0] -= self.margin_[:, None]
        q[:, :, 2] += self.margin_[:, None]
        return np.clip(np.sort(q, axis=2), 0.0, None)
