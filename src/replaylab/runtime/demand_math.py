"""The demand model's output arithmetic, numpy only: shared by training and serving.

Training (`replaylab.demand.model`, `replaylab.demand.conformal`) and the
serving runtime (`replaylab.runtime.demand`) call these same functions, so the
exported artifact cannot drift from the model it was exported from:

- `forward` / `inverse`: output tokens <-> the model scale (log1p or linear);
- `raw_to_total`: raw booster scores (n, q) -> non-crossing total-token
  quantiles: sort each row, inverse scale, + prompt, clip to [prompt, prompt + cap];
- `total_and_band`: the clipped quantiles and the base band conformal
  calibration widens: the lowest and highest quantile BEFORE the cap clip
  (`clipped_band=False`, artifacts with `calibration.base_band: unclipped`) or
  after it (older artifacts). Clipping after the correction never changes an
  uncensored row's coverage (its total cannot exceed prompt + cap), and a band
  the model puts above the cap is not pulled under it by a narrowing correction;
- `conformal_band`: the group-conformal (CQR) interval from the base band and a
  per-row correction Q: [p + g^-1(g(lo - p) - Q), p + g^-1(g(hi - p) + Q)],
  an inside-out interval collapsed to its midpoint, then clipped like the quantiles.
"""

from __future__ import annotations

import math

import numpy as np

SCALES = ("log1p", "linear")


def forward(out_tokens: np.ndarray, scale: str) -> np.ndarray:
    """Output tokens -> the model / conformal scale."""
    out = np.maximum(np.asarray(out_tokens, dtype="float64"), 0.0)
    return np.log1p(out) if scale == "log1p" else out


def inverse(values: np.ndarray, scale: str) -> np.ndarray:
    """The model / conformal scale -> output tokens (>= 0)."""
    values = np.asarray(values, dtype="float64")
    return np.maximum(np.expm1(values) if scale == "log1p" else values, 0.0)


def clip_total(total: np.ndarray, prompt: np.ndarray, cap: np.ndarray | None) -> np.ndarray:
    """Clip totals (n, k) to [prompt, prompt + cap]; cap NaN (or None) = no upper bound."""
    lo = prompt[:, None]
    hi = np.inf if cap is None else np.where(np.isfinite(cap), prompt + cap, np.inf)[:, None]
    return np.clip(total, lo, hi)


def raw_to_total(raw: np.ndarray, prompt: np.ndarray, cap: np.ndarray | None,
                 scale: str) -> np.ndarray:
    """Raw model-scale scores (n, q) -> total-token quantiles (n, q), non-crossing and clipped.

    prompt (n,) float64 (0 where unknown); cap (n,) max_tokens with NaN = none,
    or None to skip the upper clip.
    """
    raw = np.sort(np.asarray(raw, dtype="float64"), axis=1)  # k-th smallest answers level k
    total = prompt[:, None] + inverse(raw, scale)
    return clip_total(total, prompt, cap)


def total_and_band(raw: np.ndarray, prompt: np.ndarray, cap: np.ndarray | None, scale: str,
                   clipped_band: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(clipped quantiles (n, q), base band lo (n,), hi (n,)) of raw scores (n, q)."""
    unclipped = raw_to_total(raw, prompt, None, scale)
    total = clip_total(unclipped, prompt, cap)
    band = total if clipped_band else unclipped
    return total, band[:, 0], band[:, -1]


def conformal_band(lo: np.ndarray, hi: np.ndarray, prompt: np.ndarray, q: np.ndarray,
                   cap: np.ndarray | None, scale: str) -> tuple[np.ndarray, np.ndarray]:
    """Calibrated (lo, hi) totals (n,) each from the base band (lo, hi) and corrections q (n,)."""
    glo = forward(np.asarray(lo, float) - prompt, scale) - q
    ghi = forward(np.asarray(hi, float) - prompt, scale) + q
    inside_out = glo > ghi
    with np.errstate(invalid="ignore"):  # -inf + inf where a cell is unbounded: not inside out
        mid = (glo + ghi) / 2.0
    glo, ghi = np.where(inside_out, mid, glo), np.where(inside_out, mid, ghi)
    band = prompt[:, None] + inverse(np.column_stack([glo, ghi]), scale)
    band = clip_total(band, prompt, cap)
    return band[:, 0], band[:, 1]


# --------------------------------------------------------------------------- one row
# The same arithmetic on Python floats for the single-request path: numpy's per-call
# overhead on arrays of one row costs ~35 us, these ~5 us. Tests check both paths agree.
def _fwd1(out: float, scale: str) -> float:
    out = max(out, 0.0)
    return math.log1p(out) if scale == "log1p" else out


def _inv1(v: float, scale: str) -> float:
    return max(math.expm1(v) if scale == "log1p" else v, 0.0)


def _clip1(x: float, prompt: float, cap: float) -> float:
    hi = prompt + cap if cap == cap else math.inf  # cap NaN = no upper bound
    return min(max(x, prompt), hi)


def total_and_band_row(raw: list[float], prompt: float, cap: float, scale: str,
                       clipped_band: bool) -> tuple[list[float], float, float]:
    """`total_and_band` of one row: (clipped quantiles (q,), base band lo, hi)."""
    unclipped = [prompt + _inv1(v, scale) for v in sorted(raw)]
    total = [_clip1(x, prompt, cap) for x in unclipped]
    band = total if clipped_band else unclipped
    return total, band[0], band[-1]


def conformal_band_row(lo: float, hi: float, prompt: float, q: float, cap: float,
                       scale: str) -> tuple[float, float]:
    """`conformal_band` of one row."""
    glo = _fwd1(lo - prompt, scale) - q
    ghi = _fwd1(hi - prompt, scale) + q
    if glo > ghi:
        glo = ghi = (glo + ghi) / 2.0
    return (_clip1(prompt + _inv1(glo, scale), prompt, cap),
            _clip1(prompt + _inv1(ghi, scale), prompt, cap))
