"""Test metrics of a demand predictor, in total tokens, on rows with a regression label.

pinball: sklearn `mean_pinball_loss` per quantile level of the RAW predicted
quantiles (conformal calibration moves only the interval ends); coverage: share of
rows whose actual total lies in the CALIBRATED interval [lo, hi] (ends included);
mean_width: mean hi - lo, tokens; mae_p50: sklearn `mean_absolute_error` of the
0.5 quantile. Every predictor is scored on the same rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.metrics import mean_absolute_error, mean_pinball_loss


def quantile_key(q: float) -> str:
    """'0.1' for 0.1: the key of a quantile level in summaries and column names."""
    return f"{float(q):g}"


def pinball_losses(y: np.ndarray, quantiles_pred: np.ndarray,
                   quantiles: Sequence[float]) -> dict[str, float]:
    """Mean pinball loss per level: y (n,), quantiles_pred (n, q)."""
    return {quantile_key(q): float(mean_pinball_loss(y, quantiles_pred[:, j], alpha=float(q)))
            for j, q in enumerate(quantiles)}


def mean_pinball(y: np.ndarray, quantiles_pred: np.ndarray, quantiles: Sequence[float]) -> float:
    """Mean over the levels of `pinball_losses`."""
    return float(np.mean(list(pinball_losses(y, quantiles_pred, quantiles).values())))


def coverage(y: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> float:
    """Share of rows with lo <= y <= hi."""
    return float(np.mean((y >= lo) & (y <= hi)))


def interval_metrics(y: np.ndarray, quantiles_pred: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                     quantiles: Sequence[float]) -> dict:
    """pinball per level, mean_pinball, coverage, mean_width, mae_p50, and the raw band's."""
    y = np.asarray(y, dtype="float64")
    if y.size == 0:
        return {"n": 0}
    pinball = pinball_losses(y, quantiles_pred, quantiles)
    median = list(quantiles).index(0.5)
    return {
        "n": int(y.size),
        "pinball": pinball,
        "mean_pinball": float(np.mean(list(pinball.values()))),
        "coverage": coverage(y, lo, hi),
        "mean_width": float(np.mean(hi - lo)),
        "mae_p50": float(mean_absolute_error(y, quantiles_pred[:, median])),
        # the uncalibrated band (lowest, highest quantile), nominal q_hi - q_lo
        "coverage_raw": coverage(y, quantiles_pred[:, 0], quantiles_pred[:, -1]),
        "mean_width_raw": float(np.mean(quantiles_pred[:, -1] - quantiles_pred[:, 0])),
    }


def lower_bound_metrics(observed: np.ndarray, hi: np.ndarray, reasons: np.ndarray) -> dict:
    """Rows whose observed total is only a lower bound: share with hi >= observed, by reason.

    A miss (hi < observed) is a sure miss of the true demand; a hit is necessary,
    not sufficient, for coverage.
    """
    ok = np.asarray(hi) >= np.asarray(observed)
    out: dict = {"n": int(ok.size),
                 "hi_at_least_observed": float(ok.mean()) if ok.size else None,
                 "by_reason": {}}
    for reason in sorted(set(reasons.tolist())):
        m = reasons == reason
        out["by_reason"][str(reason)] = {"n": int(m.sum()),
                                         "hi_at_least_observed": float(ok[m].mean())}
    return out
