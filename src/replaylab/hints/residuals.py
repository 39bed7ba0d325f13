"""Residuals of emitted demand hints against actual usage: by group, over time, for sizing.

Input: a ledger-v1 frame with `hint_*` columns (what serving emitted) and the
actuals (`prompt_tokens`, `completion_tokens`, `finish_reason`,
`lifecycle_state`), e.g. the output of `replay_hints` or a production ledger.
Per row (`row_residuals`):

- actual total = prompt + completion; unknown when usage is absent;
- lower bound: the actual is censored (cap hit, cancelled, failed), so the
  true demand is at least the actual;
- covered: actual in [hint_lo, hint_hi] (known for uncensored rows whose hint
  has both bounds; a censored actual above hint_hi is a proven miss but is NOT
  counted, so coverage is measured on uncensored rows only, as in training);
- exceeds_p90: actual > hint_p90 (uncensored rows with a p90);

Only `hint_p50` must be there: the other hint columns are optional in ledger-v1,
and an absent one reads exactly like an all-null one (the figures it feeds are
null, never 0).
- ratio_p90: actual / hint_p90: how far capacity sized from `hint_p90` must
  stretch; its upper quantiles are the sizing multipliers fleet sizing uses.

`residual_summary` aggregates every group (overall, each group column
separately, fallback flag, ack state, model version) and a time series of
coverage per bucket with an exact binomial confidence interval
(`replaylab.stats.binomial_ci`, Clopper-Pearson): a bucket whose interval excludes the
nominal level is flagged as calibration drift. `residual_figures` draws them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.metrics import mean_pinball_loss

from replaylab.contracts import LEDGER_SCHEMA, has_values
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.errors import InputError
from replaylab.contracts.hints import is_lower_bound
from replaylab.stats import binomial_ci

GROUP_COLUMNS = (L.SELECTED_MODEL, L.CATEGORY, L.SLO_CLASS)
ALWAYS = (L.HINT_FALLBACK, L.ACK_STATE, L.HINT_MODEL_VERSION)
_NONE = "<none>"


class ResidualDataError(InputError, ValueError):
    """The ledger carries no hints to evaluate (the message says what is missing)."""


def row_residuals(ledger: pd.DataFrame) -> pd.DataFrame:
    """Per-row actual, residual and coverage columns (n rows, ledger index).

    Only `hint_p50` is needed; an absent `hint_p90` / `hint_lo` / `hint_hi` reads as
    all null, like an empty one: rows without an interval claim no coverage (null,
    not a miss), rows without a p90 no exceedance.
    """
    if not has_values(ledger, L.HINT_P50):
        raise ResidualDataError(f"no row carries a hint: {L.HINT_P50} is absent or null "
                                "everywhere (replay it first: replaylab.hints.replay_hints)")
    need = [L.HINT_P50, L.HINT_P90, L.HINT_LO, L.HINT_HI, L.PROMPT_TOKENS, L.COMPLETION_TOKENS]
    f = {c: pd.to_numeric(LEDGER_SCHEMA.column(ledger, c)).to_numpy(dtype="float64",
                                                                     na_value=np.nan)
         for c in need}
    finish = LEDGER_SCHEMA.column(ledger, L.FINISH_REASON)
    life = LEDGER_SCHEMA.column(ledger, L.LIFECYCLE_STATE)
    lower = np.array([is_lower_bound(a, b) for a, b in zip(finish.astype(object),
                                                          life.astype(object), strict=True)])
    total = f[L.PROMPT_TOKENS] + f[L.COMPLETION_TOKENS]
    hinted = np.isfinite(f[L.HINT_P50])
    known = hinted & np.isfinite(total)
    exact = known & ~lower
    interval = np.isfinite(f[L.HINT_LO]) & np.isfinite(f[L.HINT_HI])
    p90 = np.isfinite(f[L.HINT_P90])
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(exact & (f[L.HINT_P90] > 0), total / f[L.HINT_P90], np.nan)
    return pd.DataFrame({
        "actual_total": total, "hinted": hinted, "usage_known": np.isfinite(total),
        "lower_bound": lower, "exact": exact,
        "residual": np.where(known, total - f[L.HINT_P50], np.nan),
        "covered": np.where(exact & interval, (total >= f[L.HINT_LO]) & (total <= f[L.HINT_HI]),
                            np.nan),
        "exceeds_p90": np.where(exact & p90, total > f[L.HINT_P90], np.nan),
        "ratio_p90": ratio, "width": f[L.HINT_HI] - f[L.HINT_LO],
        "p50": f[L.HINT_P50], "p90": f[L.HINT_P90],
    }, index=ledger.index)


def _mean(s: pd.Series) -> float | None:
    """Mean over the known values; None when there is none (a hint field never emitted)."""
    return float(s.mean()) if s.notna().any() else None


def _pinball(y: np.ndarray, hint: pd.Series, alpha: float) -> float | None:
    known = hint.notna().to_numpy()
    return float(mean_pinball_loss(y[known], hint[known], alpha=alpha)) if known.any() else None


def _stats(r: pd.DataFrame, nominal: float | None) -> dict:
    e = r[r["exact"]]
    n = len(e)
    covered = e["covered"].dropna()  # rows whose hint carried an interval
    cov_k, n_cov = int(covered.sum()), len(covered)
    lo, hi = binomial_ci(cov_k, n_cov)
    y = e["actual_total"].to_numpy()
    out = {
        "rows": int(len(r)), "hinted": int(r["hinted"].sum()),
        "usage_absent": int((r["hinted"] & ~r["usage_known"]).sum()),
        "lower_bound": int((r["hinted"] & r["usage_known"] & r["lower_bound"]).sum()),
        "scored": n,
        "coverage": cov_k / n_cov if n_cov else None,
        "coverage_ci95": [lo, hi] if n_cov else None,
        "nominal": nominal,
        "drift": bool(nominal is not None and n_cov and not lo <= nominal <= hi),
        "p90_exceedance": _mean(e["exceeds_p90"]),
        "mean_width": _mean(e["width"]),
        "residual_mean": float(e["residual"].mean()) if n else None,
        "residual_q": ({f"q{int(q * 100)}": float(v) for q, v in
                        zip((0.1, 0.5, 0.9), np.quantile(e["residual"], (0.1, 0.5, 0.9)),
                            strict=True)} if n else None),
        "pinball": ({"0.5": _pinball(y, e["p50"], 0.5), "0.9": _pinball(y, e["p90"], 0.9)}
                    if n else None),
        # capacity sized from hint_p90 must stretch by this much to hold 90 / 95 / 99 %
        "sizing_multiplier": ({f"q{int(q * 100)}": float(v) for q, v in zip(
            (0.9, 0.95, 0.99), np.nanquantile(e["ratio_p90"], (0.9, 0.95, 0.99)), strict=True)}
            if e["ratio_p90"].notna().any() else None),
    }
    return out


def _keys(ledger: pd.DataFrame, col: str) -> pd.Series:
    if col not in ledger.columns:
        return pd.Series(_NONE, index=ledger.index)
    return ledger[col].astype(object).where(ledger[col].notna(), _NONE).astype(str)


def _time_series(ledger: pd.DataFrame, r: pd.DataFrame, bucket_ms: int,
                 nominal: float | None) -> list[dict]:
    t = ledger[L.TIMESTAMP]
    ms = t.to_numpy(dtype="int64") if not pd.api.types.is_datetime64_any_dtype(t) else \
        t.dt.tz_convert("UTC").astype("int64").to_numpy() // 1_000_000
    bucket = (ms // bucket_ms) * bucket_ms
    rows = []
    for b, idx in pd.Series(np.arange(len(r)), index=bucket).groupby(level=0):
        s = _stats(r.iloc[idx.to_numpy()], nominal)
        rows.append({"bucket_ms": int(b), **{k: s[k] for k in (
            "rows", "scored", "coverage", "coverage_ci95", "drift", "p90_exceedance",
            "mean_width")}})
    return rows


def residual_summary(ledger: pd.DataFrame, group_columns: Sequence[str] = GROUP_COLUMNS,
                     time_bucket_s: float | None = None, min_group_rows: int = 30) -> dict:
    """Residual and calibration figures of a hinted ledger (see the module docstring).

    time_bucket_s: width of the drift buckets (None: the span / 12, at least 60 s);
    min_group_rows: groups with fewer scored rows are listed but not flagged.
    """
    r = row_residuals(ledger)  # raises when no row carries a hint
    fallback = LEDGER_SCHEMA.column(ledger, L.HINT_FALLBACK).astype("boolean").fillna(
        False).to_numpy(dtype=bool)
    model_rows = r["hinted"] & ~fallback
    interval = ledger.get(L.HINT_INTERVAL)
    nominal = float(np.nanmedian(interval.to_numpy(dtype="float64", na_value=np.nan))) \
        if interval is not None and interval.notna().any() else None
    groups = []
    for col in (*group_columns, *ALWAYS):
        keys = _keys(ledger, col)
        for value, idx in pd.Series(np.arange(len(r))).groupby(keys.to_numpy()):
            s = _stats(r.iloc[idx.to_numpy()], nominal)
            s["drift"] = bool(s["drift"] and s["scored"] >= min_group_rows)
            groups.append({"by": col, "value": str(value), **s})
    ts = ledger[L.TIMESTAMP]
    ms = ts.to_numpy(dtype="int64") if not pd.api.types.is_datetime64_any_dtype(ts) else \
        ts.dt.tz_convert("UTC").astype("int64").to_numpy() // 1_000_000
    span_s = max((ms.max() - ms.min()) / 1000.0, 1.0)
    bucket_s = float(time_bucket_s) if time_bucket_s else max(span_s / 12.0, 60.0)
    series = _time_series(ledger[model_rows], r[model_rows], int(bucket_s * 1000), nominal)
    flagged = [b for b in series if b["drift"] and b["scored"] >= min_group_rows]
    return {
        "rows": int(len(ledger)), "nominal": nominal,
        "overall": _stats(r, nominal), "model": _stats(r[model_rows], nominal),
        "groups": groups,
        "time_series": {"bucket_s": bucket_s, "buckets": series},
        "drift": {"buckets": len(series), "flagged": len(flagged),
                  "flagged_buckets_ms": [b["bucket_ms"] for b in flagged],
                  "groups_flagged": [f"{g['by']}={g['value']}" for g in groups if g["drift"]]},
    }


def residual_figures(summary: dict, ledger: pd.DataFrame, out_dir: Path,
                     group_columns: Sequence[str] = GROUP_COLUMNS) -> dict[str, Path]:
    """Calibration drift over time, coverage by group, sizing ratios: PNG files."""
    from replaylab.tracking.figures import pyplot, save_figure

    plt = pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    nominal = summary["nominal"]
    paths = {}
    b = [x for x in summary["time_series"]["buckets"] if x["coverage"] is not None]
    if b:
        t = pd.to_datetime([x["bucket_ms"] for x in b], unit="ms", utc=True)
        fig, ax = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
        cov = np.array([x["coverage"] for x in b])
        ci = np.array([x["coverage_ci95"] for x in b])
        ax[0].fill_between(t, ci[:, 0], ci[:, 1], alpha=0.25, label="95% CI (exact binomial)")
        ax[0].plot(t, cov, marker="o", label="observed coverage")
        if nominal is not None:
            ax[0].axhline(nominal, color="k", ls="--", label=f"nominal {nominal:g}")
        drift = [i for i, x in enumerate(b) if x["drift"]]
        ax[0].scatter(t[drift], cov[drift], color="red", zorder=3, label="drift (CI excludes nominal)")
        ax[0].set_ylabel("coverage of [hint_lo, hint_hi]")
        ax[0].legend(fontsize=8)
        ax[1].plot(t, [np.nan if x["p90_exceedance"] is None else x["p90_exceedance"]
                       for x in b], marker="o", color="C1")
        ax[1].axhline(0.1, color="k", ls="--", label="0.10 expected")
        ax[1].set_ylabel("share actual > hint_p90")
        ax[1].legend(fontsize=8)
        ax[0].set_title("Calibration drift of model hints over time")
        fig.autofmt_xdate()
        paths["drift"] = save_figure(fig, plt, out_dir / "residual_drift.png")
    rows = [g for g in summary["groups"] if g["by"] in group_columns
            and g["coverage"] is not None]
    if rows:
        fig, ax = plt.subplots(figsize=(9, 0.3 * len(rows) + 1.5))
        labels = [f"{g['by']}={g['value']} (n={g['scored']})" for g in rows]
        cov = np.array([g["coverage"] for g in rows])
        err = np.array([[c - g["coverage_ci95"][0], g["coverage_ci95"][1] - c]
                        for c, g in zip(cov, rows, strict=True)]).T
        colors = ["red" if g["drift"] else "C0" for g in rows]
        ax.barh(labels, cov, xerr=err, color=colors)
        if nominal is not None:
            ax.axvline(nominal, color="k", ls="--")
        ax.set_xlabel("coverage (red: CI excludes nominal)")
        ax.invert_yaxis()
        paths["groups"] = save_figure(fig, plt, out_dir / "residual_groups.png")
    r = row_residuals(ledger)
    ratio = r["ratio_p90"].dropna()
    if len(ratio):
        fig, ax = plt.subplots(figsize=(8, 4))
        ax.hist(np.log2(ratio.clip(lower=1e-3)), bins=60)
        ax.axvline(0.0, color="k", ls="--", label="actual = hint_p90")
        ax.set_xlabel("log2(actual total / hint_p90)")
        ax.set_ylabel("requests")
        ax.legend(fontsize=8)
        paths["sizing"] = save_figure(fig, plt, out_dir / "residual_sizing.png")
    return paths

