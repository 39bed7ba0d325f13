"""Drift: how the archetype mix moves between windows, and how calibration moves over time.

- Mix drift: the share of requests per archetype in each window (a day, an hour...),
  and the Jensen-Shannon divergence (base 2, so in [0, 1]: 0 = the same mix,
  1 = disjoint) between consecutive windows and against the first window.
- Calibration drift: the coverage of each forecaster's 80% interval per backtest
  origin (pooled over series and steps ahead), its range and its halves.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from replaylab.contracts.columns import Aggregates as A
from replaylab.forecast.backtest import band
from replaylab.forecast.taxonomy import ALL

_HOUR, _DAY = 3_600, 86_400


def js_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon divergence in bits of two (unnormalised) non-negative vectors."""
    p = np.asarray(p, float) / np.sum(p)
    q = np.asarray(q, float) / np.sum(q)
    m = (p + q) / 2

    def kl(a: np.ndarray) -> float:
        nz = a > 0
        return float(np.sum(a[nz] * np.log2(a[nz] / m[nz])))

    return max(0.0, 0.5 * kl(p) + 0.5 * kl(q))


def drift_window_seconds(span_s: int, bucket_seconds: int) -> int:
    """A day when the data spans >= 2 days, an hour when >= 2 hours, else 6 buckets."""
    if span_s >= 2 * _DAY:
        return _DAY
    if span_s >= 2 * _HOUR and bucket_seconds <= _HOUR // 2:
        return _HOUR
    return 6 * bucket_seconds


def mix_shares(aggregates: pd.DataFrame, window_s: int) -> pd.DataFrame:
    """windows x archetypes share of requests (complete windows only; `all` rows excluded)."""
    a = aggregates[aggregates[A.ARCHETYPE] != ALL]
    if a.empty:
        a = aggregates
    width = int(a[A.BUCKET_SECONDS].iloc[0])
    start = int(aggregates[A.BUCKET_START].min())
    win = (a[A.BUCKET_START] - start) // (window_s * 1000)
    counts = a.groupby([win, a[A.ARCHETYPE]])[A.REQUESTS].sum().unstack(fill_value=0)
    buckets = a.groupby(win)[A.BUCKET_START].nunique()
    full = buckets >= 0.5 * max(window_s // width, 1)  # a half-empty edge window is left out
    counts = counts.loc[full[full].index]
    counts.index = start + counts.index.astype("int64") * window_s * 1000
    return counts.div(counts.sum(axis=1).replace(0, np.nan), axis=0).fillna(0.0)


def archetype_mix_drift(aggregates: pd.DataFrame, window_s: int | None = None) -> dict:
    """JS divergence of the archetype mix between consecutive windows and vs the first."""
    width = int(aggregates[A.BUCKET_SECONDS].iloc[0])
    span = int((aggregates[A.BUCKET_START].max() - aggregates[A.BUCKET_START].min()) // 1000)
    window_s = window_s or drift_window_seconds(span + width, width)
    shares = mix_shares(aggregates, window_s)
    vals = shares.to_numpy()
    consecutive = [js_divergence(vals[i - 1], vals[i]) for i in range(1, len(vals))]
    vs_first = [js_divergence(vals[0], vals[i]) for i in range(1, len(vals))]
    out = {"window_s": window_s, "windows": int(len(shares)),
           "archetypes": int(shares.shape[1]),
           "window_start_ms": [int(t) for t in shares.index],
           "js_consecutive": [round(x, 5) for x in consecutive],
           "js_consecutive_max": round(max(consecutive), 5) if consecutive else None,
           "js_consecutive_mean": round(float(np.mean(consecutive)), 5) if consecutive else None,
           "js_vs_first_max": round(max(vs_first), 5) if vs_first else None}
    if shares.shape[1] < 2:
        out["note"] = "one archetype only: the mix cannot drift (divergence 0 by construction)"
    elif len(shares) < 2:
        out["note"] = "fewer than two complete windows: no divergence to report"
    return out


def coverage_by_origin(predictions: pd.DataFrame, forecasters: list[str]) -> pd.DataFrame:
    """cutoff x forecaster: share of actuals inside the 80% interval at each origin."""
    y = predictions["y"].to_numpy()
    cols = {}
    for name in forecasters:
        lo, _, hi = band(name)
        cols[name] = (y >= predictions[lo].to_numpy()) & (y <= predictions[hi].to_numpy())
    frame = pd.DataFrame(cols, index=predictions["cutoff"].to_numpy())
    return frame.groupby(level=0).mean().sort_index()


def calibration_drift(predictions: pd.DataFrame, forecasters: list[str]) -> dict:
    """Per forecaster: coverage per origin, its min / max, and first vs second half."""
    cov = coverage_by_origin(predictions, forecasters)
    half = len(cov) // 2
    out = {}
    for name in forecasters:
        c = cov[name]
        out[name] = {"by_origin": [round(float(x), 4) for x in c],
                     "min": round(float(c.min()), 4), "max": round(float(c.max()), 4),
                     "first_half": round(float(c.iloc[:half].mean()), 4) if half else None,
                     "second_half": round(float(c.iloc[half:].mean()), 4)}
    return out
