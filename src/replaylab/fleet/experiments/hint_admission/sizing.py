"""Sizing a pool for the in-flight KV reservation each admission mode plans with
(hint_p90 x the residuals' multiplier; prompt + cap; the truth), at the ledger's own
service times (`size_pools`).

Part of the hint_admission experiment (`hint_admission/__init__.py`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from replaylab.config import ConfigError
from replaylab.fleet.experiments.hint_admission.config import HintConfig


def reservation(frame: pd.DataFrame, mode: str, multiplier: float, default_max_tokens: int,
                ) -> np.ndarray:
    """Tokens each row's admission plans to reserve under `mode` (hint: p90 x multiplier)."""
    prompt = frame["prompt_tokens"].to_numpy("float64", na_value=0.0)
    comp = frame["completion_tokens"].to_numpy("float64", na_value=np.nan)
    if mode == "none":
        return prompt + default_max_tokens
    if mode == "perfect":
        return prompt + np.where(np.isfinite(comp), np.maximum(comp, 1), default_max_tokens)
    hint = frame["hint_p90"].to_numpy("float64", na_value=np.nan)
    return np.where(np.isfinite(hint), hint * multiplier, prompt + default_max_tokens)


def service_seconds(frame: pd.DataFrame, how: str, profile, reference_batch: int,
                    ) -> np.ndarray:
    """Seconds each (past) request held its KV: by the profile's iterations or the ledger."""
    if how == "ledger":
        dur = frame["duration_ms"].to_numpy("float64", na_value=np.nan) / 1000.0
    elif how == "profile":
        p = frame["prompt_tokens"].to_numpy("float64", na_value=0.0)
        comp = frame["completion_tokens"].to_numpy("float64", na_value=np.nan)
        iters = np.maximum(1, np.ceil(p / profile.chunk_tokens)) + np.maximum(comp, 1) - 1
        n = max(1, min(int(reference_batch), profile.max_batch))
        dur = iters * profile.iteration_s(n)
    else:
        raise ConfigError(f"experiment.sizing.service_time={how!r}: profile or ledger")
    fill = np.nanmedian(dur) if np.isfinite(dur).any() else 1.0
    return np.where(np.isfinite(dur), dur, fill)


def kv_need(frame: pd.DataFrame, tokens: np.ndarray, time_scale: float, q: float,
            dur: np.ndarray) -> float:
    """Quantile over arrivals of the reservation in flight (each held for `dur` seconds)."""
    ts = frame["timestamp"].to_numpy("int64")
    start = (ts - ts.min()) / 1000.0 / time_scale
    end = start + dur
    order = np.argsort(start, kind="stable")
    start, end, tokens = start[order], end[order], tokens[order]
    # in flight at each arrival: started at or before it and not yet ended
    ev_t = np.concatenate([start, end])
    ev_v = np.concatenate([tokens, -tokens])
    o = np.lexsort((ev_v, ev_t))  # at equal times, ends (negative) first
    level = np.cumsum(ev_v[o])
    at_start = level[np.isin(o, np.arange(len(start)))]
    return float(np.quantile(at_start, q)) if at_start.size else 0.0


def size_pools(calib: pd.DataFrame, c: HintConfig, multiplier: float, profile,
               ) -> dict[str, dict[str, float]]:
    """Replicas each mode's rule asks for (from the calibration window)."""
    out = {}
    dur = service_seconds(calib, c.sizing.service_time, profile, c.sizing.reference_batch)
    for mode in ("none", "hint", "perfect"):
        tok = reservation(calib, mode, multiplier, c.default_max_tokens)
        need = kv_need(calib, tok, c.workload.time_scale, c.sizing.need_quantile, dur)
        n = math.ceil(need / (profile.kv_capacity_tokens * c.sizing.target_fill))
        out[mode] = {"kv_need_tokens": need,
                     "replicas": int(min(max(n, c.sizing.min_replicas), c.sizing.max_replicas))}
    return out
