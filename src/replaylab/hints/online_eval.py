"""Frozen vs adaptive (online-recalibrated) demand hints on a time-ordered replay.

`compare_online(ledger, predictor, online_from_ms=...)` replays the ledger twice
through `replay_hints`: once with the exported (frozen) correction and once with
the runtime's online recalibration (`replaylab.runtime.online`), which is fed
each request's actual only once the request has ended and only for requests
dispatched from `online_from_ms` on (the deployment: by default the first
dispatch of the artifact's test window, `deployment_start_ms`). Scored rows:
dispatched from the deployment on, model hints (not fallback) with both
bounds, exact actuals (usage known, not a lower bound), the same rows for both.

Figures per variant (`summary["frozen"]`, `summary["adaptive"]`):
- coverage of [hint_lo, hint_hi] with its exact 95% interval, mean width in tokens;
- blocks: consecutive non-overlapping blocks of `window` scored rows in dispatch
  order; the share of blocks whose coverage lies in `band` (0.77..0.83 by
  default), with the share a perfectly calibrated hint would reach
  (`in_band_expected`: Binomial(window, level) mass inside the band, about 0.91
  for 500 rows: even an exact 80% interval leaves some blocks outside);
- capped rows (a lower-bound actual: cap hit, cancelled, failed): share with
  hi >= observed.
`summary["width_ratio_where_frozen_covers"]`: adaptive / frozen mean width over
the blocks where the frozen coverage is at least the band's lower end (the
issue's "not more than 10% wider where the frozen model already covers").
`summary["drift"]`: the drift flags the adaptive hints carried (counts by state,
first flag time) and the final corrections and versions per cell.

`online_figure` draws both rolling coverages over time with the band, the drift
flags and an injected shift, and the rolling widths below.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from replaylab.contracts import LEDGER_SCHEMA
from replaylab.contracts.columns import Ledger as L
from replaylab.hints.replay import ModeledLatency, replay_hints
from replaylab.hints.residuals import row_residuals
from replaylab.stats import binomial_ci

VARIANTS = ("frozen", "adaptive")
DEFAULT_LATENCY = ModeledLatency()


def deployment_start_ms(manifest: dict | None) -> int | None:
    """The first dispatch of the artifact's test window (None when the manifest has none)."""
    window = ((manifest or {}).get("training") or {}).get("time_window") or {}
    test = window.get("test") or {}
    return None if test.get("first_ms") is None else int(test["first_ms"])


@dataclass
class OnlineComparison:
    """Both replays (ledger-v1 frames, dispatch order), the scored rows, the summary."""

    frozen: pd.DataFrame
    adaptive: pd.DataFrame
    scored: pd.DataFrame  # t_ms, covered_/width_/drift per variant, one row per scored request
    summary: dict


def compare_online(ledger: pd.DataFrame, predictor: Any, *, online_from_ms: int | None = None,
                   online: Any = None, window: int = 500, band: tuple[float, float] = (0.77, 0.83),
                   latency: ModeledLatency | None = DEFAULT_LATENCY) -> OnlineComparison:
    """Replay `ledger` frozen and adaptive and score both on the same rows (module docstring).

    predictor: a loaded `DemandPredictor`; online: its online config for the
    adaptive replay (None: the predictor's own, an `OnlineConfig`);
    online_from_ms: the deployment (None: `deployment_start_ms` of the
    predictor's manifest, else the first dispatch); window: scored rows per
    block and per rolling window; band: the coverage band.
    """
    if not getattr(predictor, "loaded", False):
        raise ValueError(f"compare_online: the predictor did not load ({predictor.reason})")
    if window < 10:
        raise ValueError(f"compare_online: window={window} must be >= 10")
    lo_band, hi_band = float(band[0]), float(band[1])
    if not 0 < lo_band < hi_band < 1:
        raise ValueError(f"compare_online: band={band} must satisfy 0 < lo < hi < 1")
    start = online_from_ms if online_from_ms is not None else \
        deployment_start_ms(getattr(predictor, "manifest", None))
    if start is None:
        start = int(ledger[L.TIMESTAMP].min())
    frozen = replay_hints(ledger, predictor, online=False)
    adaptive = replay_hints(ledger, predictor, online=online, latency=latency,
                            online_from_ms=int(start))
    if "online_state" not in adaptive.attrs:
        raise ValueError("compare_online: online recalibration is off in `online`; "
                         "nothing to compare")
    level = float(adaptive.attrs["online_state"]["level"])
    scored, capped = _scored(frozen, adaptive, int(start))
    summary = {"online_from_ms": int(start), "level": level, "window": int(window),
               "band": [lo_band, hi_band], "rows_replayed": int(len(ledger)),
               "rows_scored": int(len(scored)),
               "online_config": adaptive.attrs["online_state"]["config"]}
    blocks = _blocks(scored, window)
    expected = _in_band_mass(window, level, lo_band, hi_band)
    for v in VARIANTS:
        summary[v] = _variant(scored, blocks, capped, v, lo_band, hi_band, expected)
    covers = blocks[blocks["coverage_frozen"] >= lo_band]
    summary["width_ratio_where_frozen_covers"] = (
        float(covers["width_adaptive"].sum() / covers["width_frozen"].sum())
        if len(covers) else None)
    summary["blocks_where_frozen_covers"] = int(len(covers))
    summary["drift"] = _drift(scored, adaptive.attrs["online_state"])
    for kind in ("mix_shift", "latent_shift"):  # replaylab.sources.shift
        if kind in ledger.attrs:
            summary["shift"] = {"kind": kind, **ledger.attrs[kind]}
    return OnlineComparison(frozen, adaptive, scored, summary)


def _scored(frozen: pd.DataFrame, adaptive: pd.DataFrame, start: int,
            ) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """The scored rows of both replays (same order: replay_hints sorts identically).

    Per-row actuals, coverage and width are `row_residuals`'; a row is scored when
    both replays gave it a model hint with both bounds and its actual is exact.
    """
    if not (frozen[L.REQUEST_ID].to_numpy() == adaptive[L.REQUEST_ID].to_numpy()).all():
        raise AssertionError("the two replays are not in the same row order")
    t = frozen[L.TIMESTAMP].to_numpy(dtype="int64")
    replays = {"frozen": frozen, "adaptive": adaptive}
    res, model = {}, t >= start
    for name, f in replays.items():
        r = res[name] = row_residuals(f)
        fb = LEDGER_SCHEMA.column(f, L.HINT_FALLBACK).astype("boolean").fillna(False).to_numpy(
            dtype=bool)
        model &= r["hinted"].to_numpy() & ~fb & np.isfinite(r["width"].to_numpy())
    rows = model & res["frozen"]["exact"].to_numpy()
    out = {"t_ms": t[rows]}
    for name, r in res.items():
        out[f"covered_{name}"] = r["covered"].to_numpy()[rows].astype(bool)
        out[f"width_{name}"] = r["width"].to_numpy()[rows]
    drift = adaptive["online_drift"].to_numpy(dtype=object) if "online_drift" in adaptive else \
        np.full(len(adaptive), None, dtype=object)
    out["drift"] = drift[rows]
    lower = model & res["frozen"]["lower_bound"].to_numpy() & \
        np.isfinite(res["frozen"]["actual_total"].to_numpy())
    cap = {name: (pd.to_numeric(f[L.HINT_HI]).to_numpy(dtype="float64", na_value=np.nan)
                  >= res[name]["actual_total"].to_numpy())[lower] for name, f in replays.items()}
    return pd.DataFrame(out), cap


def _blocks(scored: pd.DataFrame, window: int) -> pd.DataFrame:
    """Coverage and mean width per block of `window` consecutive scored rows (full blocks)."""
    n = len(scored) // window
    if n == 0:
        return pd.DataFrame(columns=["t_ms", *(f"{k}_{v}" for k in ("coverage", "width")
                                                for v in VARIANTS)])
    b = np.repeat(np.arange(n), window)
    g = scored.iloc[: n * window].groupby(b)
    out = {"t_ms": g["t_ms"].first().to_numpy()}
    for v in VARIANTS:
        out[f"coverage_{v}"] = g[f"covered_{v}"].mean().to_numpy()
        out[f"width_{v}"] = g[f"width_{v}"].mean().to_numpy()
    return pd.DataFrame(out)


def _in_band_mass(n: int, p: float, lo: float, hi: float) -> float:
    """P(lo <= K / n <= hi) for K ~ Binomial(n, p): the in-band share an exact interval reaches."""
    from scipy.stats import binom

    k_lo, k_hi = int(np.ceil(lo * n - 1e-9)), int(np.floor(hi * n + 1e-9))
    return float(binom.cdf(k_hi, n, p) - binom.cdf(k_lo - 1, n, p))


def _variant(scored: pd.DataFrame, blocks: pd.DataFrame, capped: dict[str, np.ndarray],
             v: str, lo: float, hi: float, expected: float) -> dict:
    cov = scored[f"covered_{v}"].to_numpy(dtype=bool)
    k, n = int(cov.sum()), int(len(cov))
    bc = blocks[f"coverage_{v}"].to_numpy(dtype=float)
    c = capped[v]
    return {
        "coverage": k / n if n else None,
        "coverage_ci95": list(binomial_ci(k, n)) if n else None,
        "mean_width": float(scored[f"width_{v}"].mean()) if n else None,
        "blocks": int(len(bc)),
        "blocks_in_band": float(np.mean((bc >= lo) & (bc <= hi))) if len(bc) else None,
        "in_band_expected": expected,
        "block_coverage_min": float(bc.min()) if len(bc) else None,
        "block_coverage_max": float(bc.max()) if len(bc) else None,
        "in_band": bool(n and lo <= k / n <= hi),
        "capped_rows": int(len(c)),
        "capped_hi_at_least_observed": float(c.mean()) if len(c) else None,
    }


def _drift(scored: pd.DataFrame, state: dict) -> dict:
    d = scored["drift"].fillna("none").astype(str)
    flagged = scored.loc[d.isin(["retrain", "fallback"]).to_numpy(), "t_ms"]
    cells = state.get("cells", {}) if isinstance(state, dict) else {}
    return {
        "hints_by_state": {str(k): int(v) for k, v in d.value_counts().items()},
        "first_flag_ms": int(flagged.min()) if len(flagged) else None,
        "alarms": state.get("alarms"),
        "final": {c: {k: s.get(k) for k in ("exported", "correction", "version", "updates",
                                            "drift", "alarms")}
                  for c, s in cells.items()},
    }


def online_figure(comparison: OnlineComparison, path: Path, *, title: str | None = None) -> Path:
    """Rolling coverage (frozen, adaptive) with the band, drift flags, shift; widths below."""
    from replaylab.tracking.figures import pyplot, save_figure

    plt = pyplot()
    s, summ = comparison.scored, comparison.summary
    w = min(summ["window"], max(len(s) // 4, 10))
    t0 = summ["online_from_ms"]
    minutes = (s["t_ms"].to_numpy() - t0) / 60000.0
    fig, ax = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True,
                           gridspec_kw={"height_ratios": [2, 1]})
    lo, hi = summ["band"]
    ax[0].axhspan(lo, hi, color="green", alpha=0.12, label=f"target band {lo:g}..{hi:g}")
    ax[0].axhline(summ["level"], color="k", ls="--", lw=1, label=f"nominal {summ['level']:g}")
    for v, color in (("frozen", "0.45"), ("adaptive", "C0")):
        roll = s[f"covered_{v}"].astype(float).rolling(w, min_periods=w).mean()
        ax[0].plot(minutes, roll, color=color, lw=1.6,
                   label=f"{v} (overall {summ[v]['coverage']:.3f})")
        ax[1].plot(minutes, s[f"width_{v}"].rolling(w, min_periods=w).mean(), color=color,
                   lw=1.4, label=v)
    for state, color in (("retrain", "C1"), ("fallback", "C3")):
        m = (s["drift"] == state).to_numpy()
        if m.any():
            ax[0].scatter(minutes[m], np.full(m.sum(), ax[0].get_ylim()[0]), marker="|",
                          color=color, s=40, label=f"drift flag: {state}")
    shift = summ.get("shift")
    if shift:
        for a in ax:
            a.axvline((shift["at_ms"] - t0) / 60000.0, color="C3", ls=":", lw=1.5)
        ax[0].text((shift["at_ms"] - t0) / 60000.0, hi + 0.01, f" {shift['kind'].replace('_', ' ')}",
                   color="C3", fontsize=8)
    ax[0].set_ylabel(f"coverage, rolling {w} requests")
    ax[0].legend(fontsize=8, loc="lower left")
    ax[0].set_title(title or "Demand hint coverage after deployment: frozen vs online recalibration")
    ax[1].set_ylabel("mean width (tokens)")
    ax[1].set_xlabel("minutes since deployment (first dispatch of the test window)")
    ax[1].legend(fontsize=8)
    return save_figure(fig, plt, Path(path))
