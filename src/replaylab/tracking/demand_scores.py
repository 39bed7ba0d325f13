"""What the demand report reads from a test-predictions frame and a run summary.

Predictor and quantile columns, the scored-row mask, and metrics recomputed from
the predictions (to cross-check the summary). Pure functions.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

MODEL = "model"
BASELINES = ("prompt_length", "max_tokens_cap", "category_bucket", "session_ewma")
GROUP_COLUMNS = ("selected_model", "category", "slo_class")
MIN_GROUP_N = 200
COLORS = {MODEL: "#1f5fa8", "prompt_length": "#e39b54", "max_tokens_cap": "#9a9a9a",
          "category_bucket": "#6aa56a", "session_ewma": "#b07cc6"}
GOOD, BAD, GREY = "#1f5fa8", "#c0392b", "#c8c8c8"


# ---------------------------------------------------------------- data helpers
def _get(d: Any, dotted: str, default: Any = None) -> Any:
    """``d['a']['b']`` for 'a.b'; keys may hold dots themselves ('pinball.0.9')."""
    if not isinstance(d, dict):
        return default
    if dotted in d:
        return d[dotted]
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:i])
        if head in d:
            found = _get(d[head], ".".join(parts[i:]), _MISSING)
            if found is not _MISSING:
                return found
    return default


_MISSING = object()


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _fmt(x: Any, kind: str = "tok") -> str:
    v = _num(x)
    if math.isnan(v):
        return "—"
    if kind == "cov":
        return f"{v:.3f}"
    if kind == "int":
        return f"{int(round(v)):,}"
    return f"{v:,.1f}" if abs(v) < 1000 else f"{v:,.0f}"


def _predictors(pred: pd.DataFrame) -> list[str]:
    found = {c.rsplit("-q", 1)[0] for c in pred.columns if c.endswith("-q0.5")}
    order = [MODEL, *BASELINES]
    return [p for p in order if p in found] + sorted(found - set(order))


def _quantiles(pred: pd.DataFrame) -> list[float]:
    qs = sorted({float(c.rsplit("-q", 1)[1]) for c in pred.columns
                 if c.startswith(f"{MODEL}-q")})
    return qs or [0.1, 0.5, 0.9]


def _band(pred: pd.DataFrame, p: str) -> tuple[str, str]:
    """The calibrated interval's columns of predictor p ('P-lo-80', 'P-hi-80')."""
    lo = next((c for c in pred.columns if c.startswith(f"{p}-lo-")), f"{p}-lo-80")
    return lo, lo.replace("-lo-", "-hi-", 1)


def _flag(pred: pd.DataFrame, col: str) -> pd.Series:
    if col not in pred:
        return pd.Series(False, index=pred.index)
    return pred[col].fillna(False).astype(bool)


def _eval_mask(pred: pd.DataFrame) -> pd.Series:
    """Rows scored by pinball and coverage: usage present, not censored, not cancelled."""
    y = pd.to_numeric(pred["y"], errors="coerce") if "y" in pred else pd.Series(
        np.nan, index=pred.index)
    return (y.notna() & ~_flag(pred, "censored") & ~_flag(pred, "absent_usage")
            & ~_flag(pred, "cancelled"))


def _prepare(pred: pd.DataFrame) -> pd.DataFrame:
    """Plain float64 for y and every predictor column (nullable Parquet dtypes become NaN)."""
    pred = pred.copy()
    for c in pred.columns:
        if c == "y" or any(c.startswith(f"{p}-") for p in _predictors(pred)):
            pred[c] = pd.to_numeric(pred[c], errors="coerce").astype("float64")
    if "y" not in pred:
        pred["y"] = np.nan
    return pred


def _pinball(y: np.ndarray, q: np.ndarray, tau: float) -> float:
    ok = np.isfinite(y) & np.isfinite(q)
    if not ok.any():
        return math.nan
    d = y[ok] - q[ok]
    return float(np.mean(np.maximum(tau * d, (tau - 1) * d)))


def _metrics(pred: pd.DataFrame, p: str, qs: list[float]) -> dict[str, Any]:
    """Recompute one predictor's metrics on the given (already masked) rows."""
    y = pred["y"].to_numpy(float)
    pin = {str(t): _pinball(y, pred[f"{p}-q{t}"].to_numpy(float), t) for t in qs
           if f"{p}-q{t}" in pred}
    lo_c, hi_c = _band(pred, p)
    lo = pred.get(lo_c, pred.get(f"{p}-q{qs[0]}"))
    hi = pred.get(hi_c, pred.get(f"{p}-q{qs[-1]}"))
    cov = width = math.nan
    if lo is not None and hi is not None and len(pred):
        lo_a, hi_a = lo.to_numpy(float), hi.to_numpy(float)
        cov = float(np.mean((y >= lo_a) & (y <= hi_a)))  # a missing bound covers nothing
        w = hi_a - lo_a
        width = float(np.mean(w[np.isfinite(w)])) if np.isfinite(w).any() else math.nan
    vals = [v for v in pin.values() if not math.isnan(v)]
    return {"pinball": pin, "mean_pinball": float(np.mean(vals)) if vals else math.nan,
            "coverage": cov, "mean_width": width}


def _mean_pinball(m: dict | None) -> float:
    if not m:
        return math.nan
    if "mean_pinball" in m:
        return _num(m["mean_pinball"])
    vals = [_num(v) for v in (m.get("pinball") or {}).values()]
    return float(np.mean(vals)) if vals else math.nan


def _scores(summary: dict) -> dict[str, dict]:
    """{predictor: metrics} from summary.json's test.model and test.baselines."""
    out = {MODEL: dict(_get(summary, "test.model") or {})}
    out.update({b: dict(m) for b, m in (_get(summary, "test.baselines") or {}).items()})
    for m in out.values():
        m.setdefault("mean_pinball", _mean_pinball(m))
    return out


def _best_baseline(scores: dict[str, dict], key: str) -> str | None:
    cands = [(v, b) for b, m in scores.items() if b != MODEL
             and not math.isnan(v := _num(_get(m, key)))]
    return min(cands)[1] if cands else None


# ---------------------------------------------------------------- figures
