"""PNG figures of a forecast run (pure functions of data plus the folder they are handed).

Kept beside the forecast code rather than in tracking/ so the forecast pipeline's
files stay together; they use tracking.figures (matplotlib setup, saving) and the
pipeline puts them on tracking.html's page.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from replaylab.forecast.backtest import band
from replaylab.forecast.config import COVERAGE_TARGET
from replaylab.forecast.panel import Panel
from replaylab.tracking.figures import pyplot, save_figure


def _times(panel: Panel, idx: np.ndarray) -> pd.DatetimeIndex:
    return pd.to_datetime(panel.bucket_start_ms[0] + idx * panel.bucket_seconds * 1000,
                          unit="ms", utc=True)


def bands_figure(panel: Panel, predictions: pd.DataFrame, best: str, n_series: int,
                 path: Path) -> Path:
    """Actual requests vs the best forecaster's q50 and 80% band (and seasonal naive's q50)."""
    plt = pyplot()
    ids = panel.ids[: max(n_series, 1)]
    fig, axes = plt.subplots(len(ids), 1, figsize=(11, 2.6 * len(ids)), squeeze=False)
    start = int(predictions["ds"].min())
    context = max(start - (int(predictions["ds"].max()) - start + 1), 0)
    lo, mid, hi = band(best)
    for ax, sid in zip(axes[:, 0], ids, strict=True):
        i = panel.ids.index(sid)
        idx = np.arange(context, panel.n_buckets)
        ax.plot(_times(panel, idx), panel.y[i, idx], color="black", lw=0.8, label="actual")
        p = predictions[predictions["unique_id"] == sid].sort_values(["ds", "cutoff"])
        p = p.drop_duplicates("ds", keep="last")  # the latest origin when windows overlap
        t = _times(panel, p["ds"].to_numpy())
        ax.fill_between(t, p[lo], p[hi], alpha=0.3, color="#4C72B0", label=f"{best} 80%")
        ax.plot(t, p[mid], color="#4C72B0", lw=1.0, label=f"{best} q50")
        if best != "seasonal_naive":
            ax.plot(t, p["seasonal_naive"], color="#DD8452", lw=0.8, ls="--",
                    label="seasonal_naive q50")
        ax.set_title(sid, fontsize=9)
        ax.set_ylabel("requests / bucket")
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("Backtest: actual vs forecast (measured actuals; rolling origins)")
    return save_figure(fig, plt, path, dpi=100)


def scores_figure(scores: dict[str, dict], path: Path) -> Path:
    """MASE and 80% coverage per forecaster, with the coverage target band."""
    plt = pyplot()
    names = list(scores)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6))
    mase = [scores[n]["mase"] or np.nan for n in names]
    a.bar(names, mase, color=["#DD8452" if n == "seasonal_naive" else "#4C72B0" for n in names])
    a.axhline(scores["seasonal_naive"]["mase"] or np.nan, color="#DD8452", ls="--", lw=0.8)
    a.set_ylabel("MASE (seasonal naive in-sample scale)")
    a.set_title("Point accuracy (lower is better)")
    cov = [scores[n]["coverage_80"] or np.nan for n in names]
    b.bar(names, cov, color="#55A868")
    b.axhspan(*COVERAGE_TARGET, color="grey", alpha=0.2, label="target 72-88%")
    b.axhline(0.8, color="black", lw=0.8)
    b.set_ylim(0, 1)
    b.set_ylabel("share of actuals in the 80% interval")
    b.set_title("Calibration")
    b.legend(fontsize=7)
    for ax in (a, b):
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    return save_figure(fig, plt, path, dpi=100)


def drift_figure(mix: dict, calibration: dict, origins_ms: list[int], path: Path) -> Path:
    """Archetype-mix JS divergence per window, and 80% coverage per backtest origin."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6))
    starts = pd.to_datetime(mix["window_start_ms"][1:], unit="ms", utc=True)
    if len(starts):
        a.plot(starts, mix["js_consecutive"], marker="o", label="vs previous window")
    a.set_ylabel("Jensen-Shannon divergence (bits)")
    a.set_title(f"Archetype mix drift ({mix['windows']} windows of {mix['window_s']} s, "
                f"{mix['archetypes']} archetypes)", fontsize=9)
    a.tick_params(axis="x", labelrotation=30, labelsize=7)
    t = pd.to_datetime(origins_ms, unit="ms", utc=True)
    k = min(6, len(origins_ms)) or 1  # one origin holds few points: smooth for reading
    for name, c in calibration.items():
        b.plot(t, pd.Series(c["by_origin"]).rolling(k, min_periods=1).mean(), lw=0.9,
               label=name)
    b.axhspan(*COVERAGE_TARGET, color="grey", alpha=0.2)
    b.axhline(0.8, color="black", lw=0.8)
    b.set_ylim(0, 1.02)
    b.set_ylabel(f"80% coverage (mean of {k} origins)")
    b.set_title("Calibration over time (pooled over series and steps)", fontsize=9)
    b.tick_params(axis="x", labelrotation=30, labelsize=7)
    b.legend(fontsize=7)
    return save_figure(fig, plt, path, dpi=100)
