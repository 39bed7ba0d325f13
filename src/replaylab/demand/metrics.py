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
import pandas as pd
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


# ---------------------------------------------------------------- per row, for intervals
def row_pinball(y: np.ndarray, quantiles_pred: np.ndarray,
                quantiles: Sequence[float]) -> np.ndarray:
    """(n, q) pinball loss of each row at each level: their column means are
    `pinball_losses`, their overall mean `mean_pinball` (the same numbers)."""
    y = np.asarray(y, dtype="float64")[:, None]
    tau = np.asarray([float(q) for q in quantiles], dtype="float64")[None, :]
    d = y - np.asarray(quantiles_pred, dtype="float64")
    return np.maximum(tau * d, (tau - 1.0) * d)


def row_figures(y: np.ndarray, quantiles_pred: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                quantiles: Sequence[float]) -> dict[str, np.ndarray]:
    """Per-row values whose means are the figures of `interval_metrics`: pinball per level
    (`pinball.<q>`), `mean_pinball`, `coverage` (0/1), `mean_width`, `mae_p50`."""
    y = np.asarray(y, dtype="float64")
    pin = row_pinball(y, quantiles_pred, quantiles)
    out = {f"pinball.{quantile_key(q)}": pin[:, j] for j, q in enumerate(quantiles)}
    out["mean_pinball"] = pin.mean(axis=1)
    out["coverage"] = ((y >= lo) & (y <= hi)).astype("float64")
    out["mean_width"] = np.asarray(hi, dtype="float64") - np.asarray(lo, dtype="float64")
    if 0.5 in [float(q) for q in quantiles]:
        out["mae_p50"] = np.abs(y - quantiles_pred[:, [float(q) for q in quantiles].index(0.5)])
    return out


SESSION_CHUNK = 4096  # sessions per block of Poisson weights: (n_boot, 4096) float64, 33 MB


def session_replicates(x: np.ndarray, session: np.ndarray, n_boot: int, seed: int
                       ) -> tuple[np.ndarray, np.ndarray, int]:
    """The session bootstrap of every demand figure, as sums: (sums (n_boot, m), counts
    (n_boot,), sessions) over the rows x (n, m) of `session` (n,).

    THE one session bootstrap of the demand pipeline on either engine: session s gets the
    weight w[b, s] ~ Poisson(1) from a hash of (session_id, b, seed)
    (`replaylab.compute.ops.poisson_weights`; Hanley & MacGibbon 2006, Chamandy et al.
    2012), every row of s that weight, and replicate b of a mean is
    sum_s w[b, s] X_s / sum_s w[b, s] n_s. The weights depend on the session alone, so
    these sums add over any partitioning of the rows (a partition's replicates are its
    sums; the run's are their total) and a figure's interval is the same under
    compute=local and compute=dask. Blocks of SESSION_CHUNK sessions bound the memory."""
    from replaylab.compute.ops import key_hash, poisson_weights

    x = np.asarray(x, dtype="float64").reshape(len(session), -1)
    codes, uniq = pd.factorize(np.asarray(session, dtype=object))
    xs = np.zeros((len(uniq), x.shape[1]))
    np.add.at(xs, codes, x)
    ns = np.bincount(codes, minlength=len(uniq)).astype("float64")
    hashes = key_hash(np.asarray(uniq, dtype=object))
    sums, counts = np.zeros((int(n_boot), x.shape[1])), np.zeros(int(n_boot))
    for lo in range(0, len(uniq), SESSION_CHUNK):
        w = poisson_weights(hashes[lo:lo + SESSION_CHUNK], n_boot, seed)  # (B, chunk)
        sums += w @ xs[lo:lo + SESSION_CHUNK]
        counts += w @ ns[lo:lo + SESSION_CHUNK]
    return sums, counts, len(uniq)


def bootstrap_means(values: dict[str, np.ndarray], session: np.ndarray | None, n_boot: int,
                    seed: int, level: float = 0.95) -> dict[str, list[float]]:
    """The percentile interval at `level` of the mean of every per-row array in `values`,
    all from the same replicates of the session bootstrap (`session_replicates`: hashed
    Poisson(1) weights per session; each row its own session when `session` is None).
    Paired differences are rows of differences in `values`: the same draws for both sides."""
    from replaylab.stats import percentile_interval

    keys = list(values)
    if not keys:
        return {}
    x = np.column_stack([np.asarray(values[k], dtype="float64") for k in keys])  # (n, m)
    n = x.shape[0]
    if n == 0 or n_boot < 1:
        return {k: [float("nan"), float("nan")] for k in keys}
    groups = np.arange(n) if session is None else np.asarray(session)
    sums, counts, _ = session_replicates(x, groups, n_boot, seed)
    with np.errstate(invalid="ignore", divide="ignore"):  # a replicate that drew no session
        r = sums / counts[:, None]
    return {k: [float(v) for v in percentile_interval(r[:, j], level)]
            for j, k in enumerate(keys)}


def paired_pinball_delta(y: np.ndarray, a_pred: np.ndarray, b_pred: np.ndarray,
                         quantiles: Sequence[float], session: np.ndarray | None,
                         n_boot: int, seed: int, level: float = 0.95) -> dict:
    """Mean pinball of predictor a minus predictor b on the same rows, with its paired
    session-bootstrap interval: {"delta", "ci": [lo, hi], "level", "n", "sessions",
    "resampled"}. Negative: a is better; the interval's upper bound below 0: a is better
    beyond the resampling noise of these sessions."""
    da = row_pinball(y, a_pred, quantiles).mean(axis=1)
    db = row_pinball(y, b_pred, quantiles).mean(axis=1)
    d = da - db
    ci = bootstrap_means({"d": d}, session, n_boot, seed, level)["d"]
    n_sessions = len(set(np.asarray(session).tolist())) if session is not None else int(d.size)
    return {"delta": float(d.mean()) if d.size else float("nan"), "ci": ci, "level": level,
            "n": int(d.size), "sessions": int(n_sessions),
            "resampled": "sessions" if session is not None else "rows"}
