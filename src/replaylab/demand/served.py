"""The interval serving will serve: the runtime's online recalibration replayed over the test window.

The artifact freezes one conformal correction Q0 per cell; serving
(`runtime.demand.DemandPredictor`, online on by default) moves each cell's correction
with the actuals of requests that have ended (`runtime.online.OnlineConformal`, the
adaptive conformal inference tracker of Gibbs & Candes 2021). A static interval
calibrated on the window before the test window over-covers or under-covers when the
output mix drifts (Azure conv: 0.872 frozen), so the gate judges the interval the
runtime will actually serve, computed here by the runtime's own tracker:

    deploy at the first test dispatch with q_c = Q0_c for every cell c
    for each test row i in dispatch order (ties: row order):
        feed back every earlier row j with end_j <= t_i, in end order:
            OnlineConformal.update(cell_j, served lo/hi_j, frozen lo/hi_j, y_j, lower_bound_j)
        served band_i = conformal_band_row(base band_i, prompt_i, q_{cell_i}, cap_i)

exactly `hints.replay.replay_hints` with online on, without the ONNX graph: the base band
is the model's own (`model.base_band`, what the export's golden vectors hold the graph
to) and the band arithmetic is `runtime.demand_math`, the functions serving calls. The
end of a request: the ledger's `ended_at`, else `timestamp + duration_ms`, else the
MODELED end dispatch + ttft + ms per output token (`ServedConfig`), counted. A row
without a usable actual (usage absent) is served but never fed back; a lower-bound
actual (cap hit, cancelled, failed) is fed back as the runtime does (a miss only when
above hi). A cell whose exported correction is unbounded has no online state: it is
served its static band (the runtime falls back there). Only the test split's rows are
replayed: a turn of an earlier session dispatched inside the test window (its session began
before the split) is neither hinted nor fed back here, though serving would feed it back; the
runtime replay test holds the two equal on the test split's rows.

Cost: one Python step per test row plus a heap push and pop: measured 8 us a row on the
shared 2-core host (200,000 rows, one cell, in 1.6 s at load 6), so about 8 s per million
test rows, inside the run's `timings_s.evaluation`. Why not MAPIE: its online method
(`MapieTimeSeriesRegressor.adapt_conformal_inference`) is a different tracker from the
one serving runs; judging serving means replaying serving's own code.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from replaylab.contracts import Ledger as L
from replaylab.demand.config import ServedConfig
from replaylab.runtime.demand_math import conformal_band, conformal_band_row
from replaylab.runtime.online import GLOBAL_CELL, OnlineConformal

# column (compute=dask, beside the labels): when the request ended, epoch ms, NaN unknown; an
# outcome known only after the request, so a `label_` column: never a model feature
END_MS = "label_end_ms"
SERVED = "served"  # predictions_test columns `served-lo-80` / `served-hi-80`; the gate's interval
MS_PER_DAY = 86_400_000.0


def feedback_actuals(y: np.ndarray, label_class: np.ndarray) -> np.ndarray:
    """The actual each row feeds back: its total where it is a label or a lower bound (the
    runtime acknowledges those), NaN otherwise (usage or prompt absent: never fed back)."""
    from replaylab.demand.labels import LABEL, LOWER_BOUND_CLASSES

    keep = np.isin(np.asarray(label_class, dtype=object), (LABEL, *LOWER_BOUND_CLASSES))
    return np.where(keep, np.asarray(y, dtype="float64"), np.nan)


def ledger_end_ms(ledger: pd.DataFrame) -> np.ndarray:
    """(n,) float end of each ledger row: `ended_at`, else `timestamp + duration_ms`, else NaN."""
    n = len(ledger)
    ended = (ledger[L.ENDED_AT].to_numpy(dtype="float64", na_value=np.nan)
             if L.ENDED_AT in ledger.columns else np.full(n, np.nan))
    if L.DURATION_MS in ledger.columns:
        dur = ledger[L.DURATION_MS].to_numpy(dtype="float64", na_value=np.nan)
        t = ledger[L.TIMESTAMP].to_numpy(dtype="float64", na_value=np.nan)
        ended = np.where(np.isfinite(ended), ended, t + dur)
    return ended


def end_ms_of(features: pd.DataFrame, ledger: pd.DataFrame) -> np.ndarray:
    """`ledger_end_ms` aligned to the projected rows `features` by request_id."""
    led = ledger.drop_duplicates(L.REQUEST_ID)
    ends = pd.Series(ledger_end_ms(led), index=led[L.REQUEST_ID].to_numpy(dtype=object))
    return ends.reindex(features[L.REQUEST_ID].to_numpy(dtype=object)).to_numpy(dtype="float64")


@dataclass
class ServedBand:
    """The served interval of every test row and how the replay went."""

    lo: np.ndarray  # (n,) served interval, tokens
    hi: np.ndarray
    fed_back: int  # actuals the tracker used during the window (ended before the last dispatch)
    modeled_end: int  # rows whose end was modeled (no ended_at / duration_ms)
    actuals: int  # rows with an actual to feed back (a label or a lower bound)
    state: dict  # OnlineConformal.state() at the end of the window


def served_band(dispatch_ms: np.ndarray, end_ms: np.ndarray, cells: np.ndarray,
                corrections: dict[str, float], global_correction: float, level: float,
                base_lo: np.ndarray, base_hi: np.ndarray, prompt: np.ndarray,
                cap: np.ndarray | None, y: np.ndarray, lower_bound: np.ndarray, scale: str,
                cfg: ServedConfig) -> ServedBand:
    """The interval serving would have served each row of a test window (module docstring).

    dispatch_ms, end_ms (NaN: unknown, modeled), cells (the conformal cell key of each
    row, `conformal.cell_keys`), base_lo/base_hi (the model's base band), prompt, cap
    (max_tokens, NaN = none; None: no clip), y (observed total; NaN: usage absent),
    lower_bound (y is a lower bound): (n,) each. corrections / global_correction /
    level: the exported calibration (`GroupConformal.corrections_`, ...).
    """
    n = len(dispatch_ms)
    t = np.asarray(dispatch_ms, dtype="float64")
    y = np.asarray(y, dtype="float64")
    prompt = np.asarray(prompt, dtype="float64")
    capv = np.full(n, np.nan) if cap is None else np.asarray(cap, dtype="float64")
    end = np.asarray(end_ms, dtype="float64")
    unknown = ~np.isfinite(end)
    modeled = t + cfg.modeled_ttft_ms + cfg.modeled_ms_per_token * np.maximum(y - prompt, 0.0)
    end = np.where(unknown, modeled, end)
    modeled_end = int((unknown & np.isfinite(y)).sum())
    keys = [c if c in corrections else GLOBAL_CELL for c in np.asarray(cells, dtype=object)]
    q0 = np.array([corrections.get(c, global_correction) for c in np.asarray(cells, dtype=object)],
                  dtype="float64")
    online = OnlineConformal(corrections, global_correction, level, cfg.online_config())
    blo, bhi = np.asarray(base_lo, dtype="float64"), np.asarray(base_hi, dtype="float64")
    # the exported band, as `GroupConformal.predict_interval` gives it (bit for bit)
    flo, fhi = conformal_band(blo, bhi, prompt, q0, cap, scale)
    lo, hi = flo.copy(), fhi.copy()
    pending: list[tuple[float, int]] = []  # (end ms, row): actuals not yet fed back
    fed = 0
    for i in np.argsort(t, kind="stable").tolist():
        while pending and pending[0][0] <= t[i]:
            _, j = heapq.heappop(pending)
            fed += online.update(keys[j], lo[j], hi[j], flo[j], fhi[j], y[j],
                                 bool(lower_bound[j]))
        now = online.current(keys[i]) if online.enabled else None
        if now is not None and now[0] != q0[i]:  # else: no online state (unbounded), unmoved
            lo[i], hi[i] = conformal_band_row(blo[i], bhi[i], prompt[i], now[0], capv[i], scale)
        if math.isfinite(y[i]):
            heapq.heappush(pending, (float(end[i]), i))
    return ServedBand(lo, hi, fed, modeled_end, int(np.isfinite(y).sum()), online.state())


def served_section(band: ServedBand, y: np.ndarray, usable: np.ndarray, frozen_lo: np.ndarray,
                   frozen_hi: np.ndarray, cfg: ServedConfig,
                   coverage_ci: list[float] | None = None, per_day: float | None = None,
                   sessions: int | None = None) -> dict[str, Any]:
    """The summary's `test.served`: the served interval's coverage and width on the labelled
    test rows beside the frozen one's, and how the replay went."""
    yu = y[usable]
    cov = (yu >= band.lo[usable]) & (yu <= band.hi[usable])
    fcov = (yu >= frozen_lo[usable]) & (yu <= frozen_hi[usable])
    st = band.state
    return {
        "recalibration": "online" if cfg.online else "frozen",
        "how": ("the runtime's online recalibration (runtime/online.py) replayed over the "
                "test window in dispatch order, each actual fed back once its request ended"
                if cfg.online else "the exported (frozen) correction, as served with online off"),
        "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        "n": int(usable.sum()), "sessions": sessions, "rows_per_day": per_day,
        "coverage": float(cov.mean()) if cov.size else math.nan,
        "ci": coverage_ci,
        "mean_width": float(np.mean(band.hi[usable] - band.lo[usable])) if cov.size else math.nan,
        "frozen_coverage": float(fcov.mean()) if fcov.size else math.nan,
        "frozen_mean_width": (float(np.mean(frozen_hi[usable] - frozen_lo[usable]))
                              if fcov.size else math.nan),
        "actuals": int(band.actuals), "fed_back": int(band.fed_back),
        "modeled_end": int(band.modeled_end),
        "drift": st.get("drift"), "alarms": st.get("alarms"),
        "corrections_end": {k: {"exported": c["exported"], "served": c["correction"],
                                "updates": c["updates"], "drift": c["drift"]}
                            for k, c in st.get("cells", {}).items()},
    }


def rows_per_day(dispatch_ms: np.ndarray) -> float | None:
    """Rows per day over the span of their dispatch times (None under two rows or no span)."""
    t = np.asarray(dispatch_ms, dtype="float64")
    t = t[np.isfinite(t)]
    if t.size < 2 or t.max() <= t.min():
        return None
    return float(t.size / ((t.max() - t.min()) / MS_PER_DAY))
