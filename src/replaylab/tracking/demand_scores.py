"""What the demand report reads from a test-predictions frame and a run summary.

Predictor and quantile columns, the scored-row mask, metrics recomputed from the
predictions (to cross-check the summary), the summary's scores and per-group rows.
Pure functions; the frame is described in demand_report.py.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from replaylab.tracking.summary import lookup, to_float

MODEL = "model"
BASELINES = ("prompt_length", "max_tokens_cap", "category_bucket", "session_ewma")
GROUP_COLUMNS = ("selected_model", "category", "slo_class")
MIN_GROUP_N = 200  # smaller groups are shown but not held to the coverage band


def fmt_metric(x: Any, kind: str = "tok") -> str:
    """'—' for NaN/None; kind 'cov': 3 decimals, 'int': thousands, 'tok': tokens
    (1 decimal below 1,000)."""
    v = to_float(x)
    if math.isnan(v):
        return "—"
    if kind == "cov":
        return f"{v:.3f}"
    if kind == "int":
        return f"{int(round(v)):,}"
    return f"{v:,.1f}" if abs(v) < 1000 else f"{v:,.0f}"


def predictors(pred: pd.DataFrame) -> list[str]:
    """Predictors with a ``P-q0.5`` column: the model, the known baselines, then others."""
    found = {c.rsplit("-q", 1)[0] for c in pred.columns if c.endswith("-q0.5")}
    order = [MODEL, *BASELINES]
    return [p for p in order if p in found] + sorted(found - set(order))


def quantile_levels(pred: pd.DataFrame) -> list[float]:
    """The model's quantile levels, sorted (0.1, 0.5, 0.9 when it has none)."""
    qs = sorted({float(c.rsplit("-q", 1)[1]) for c in pred.columns
                 if c.startswith(f"{MODEL}-q")})
    return qs or [0.1, 0.5, 0.9]


def interval_columns(pred: pd.DataFrame, p: str) -> tuple[str, str]:
    """The calibrated interval's columns of predictor p ('P-lo-80', 'P-hi-80')."""
    lo = next((c for c in pred.columns if c.startswith(f"{p}-lo-")), f"{p}-lo-80")
    return lo, lo.replace("-lo-", "-hi-", 1)


def flag_column(pred: pd.DataFrame, col: str) -> pd.Series:
    """A boolean column with nulls as False; all False when the column is absent."""
    if col not in pred:
        return pd.Series(False, index=pred.index)
    return pred[col].fillna(False).astype(bool)


def scored_mask(pred: pd.DataFrame) -> pd.Series:
    """Rows scored by pinball and coverage: usage present, not censored, not cancelled."""
    y = pd.to_numeric(pred["y"], errors="coerce") if "y" in pred else pd.Series(
        np.nan, index=pred.index)
    return (y.notna() & ~flag_column(pred, "censored") & ~flag_column(pred, "absent_usage")
            & ~flag_column(pred, "cancelled"))


def prepare_predictions(pred: pd.DataFrame) -> pd.DataFrame:
    """Plain float64 for y and every predictor column (nullable Parquet dtypes become NaN)."""
    pred = pred.copy()
    for c in pred.columns:
        if c == "y" or any(c.startswith(f"{p}-") for p in predictors(pred)):
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


def recompute_metrics(pred: pd.DataFrame, p: str, qs: list[float]) -> dict[str, Any]:
    """Recompute one predictor's metrics on the given (already masked) rows."""
    y = pred["y"].to_numpy(float)
    pin = {str(t): _pinball(y, pred[f"{p}-q{t}"].to_numpy(float), t) for t in qs
           if f"{p}-q{t}" in pred}
    lo_c, hi_c = interval_columns(pred, p)
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


def mean_pinball(m: dict | None) -> float:
    """A metrics dict's mean_pinball, else the mean of its pinball values (NaN if none)."""
    if not m:
        return math.nan
    if "mean_pinball" in m:
        return to_float(m["mean_pinball"])
    vals = [to_float(v) for v in (m.get("pinball") or {}).values()]
    return float(np.mean(vals)) if vals else math.nan


def summary_scores(summary: dict) -> dict[str, dict]:
    """{predictor: metrics} from summary.json's test.model and test.baselines."""
    out = {MODEL: dict(lookup(summary, "test.model") or {})}
    out.update({b: dict(m) for b, m in (lookup(summary, "test.baselines") or {}).items()})
    for m in out.values():
        m.setdefault("mean_pinball", mean_pinball(m))
    return out


def best_baseline(scores: dict[str, dict], key: str) -> str | None:
    """The baseline with the lowest value of key (None when none has one)."""
    cands = [(v, b) for b, m in scores.items() if b != MODEL
             and not math.isnan(v := to_float(lookup(m, key)))]
    return min(cands)[1] if cands else None


def group_rows(pred: pd.DataFrame, summary: dict, preds: list[str], qs, interval):
    """Per (by, value): n, coverage, pinball from summary (else recomputed), plus the
    model's mean pinball over the best baseline's in that group (summary's
    best_baseline when given, else recomputed from the predictions)."""
    ev = pred[scored_mask(pred)]
    listed = lookup(summary, "test.groups") or []
    bys = list(dict.fromkeys([g["by"] for g in listed] or
                             [c for c in GROUP_COLUMNS if c in pred]))
    out: dict[str, list[dict]] = {}
    for by in bys:
        rows = [dict(g) for g in listed if g["by"] == by]
        if not rows and by in ev:
            rows = [{"by": by, "value": v, "n": len(sub), **recompute_metrics(sub, MODEL, qs)}
                    for v, sub in ev.groupby(by, observed=True)]
        for r in rows:
            if r.get("best_baseline") and not math.isnan(
                    to_float(r.get("best_baseline_mean_pinball"))):
                r["best"], r["best_mean_pinball"] = r["best_baseline"], to_float(
                    r["best_baseline_mean_pinball"])
                r["model_mean_pinball"] = mean_pinball(r)
                r["best_from"] = "summary"
            else:  # recompute from the predictions
                sub = ev[ev[by].astype(str) == str(r["value"])] if by in ev else ev.iloc[:0]
                mp = ({p: recompute_metrics(sub, p, qs)["mean_pinball"] for p in preds}
                      if len(sub) else {})
                base = {b: v for b, v in mp.items() if b != MODEL and not math.isnan(v)}
                r["model_mean_pinball"] = mean_pinball(r) if r.get("pinball") else mp.get(MODEL)
                if base:
                    r["best"] = min(base, key=base.get)
                    r["best_mean_pinball"] = base[r["best"]]
                    r["best_from"] = "predictions"
            b = to_float(r.get("best_mean_pinball"))
            r["ratio"] = to_float(r.get("model_mean_pinball")) / b if b > 0 else math.nan
        out[by] = rows
    return out
