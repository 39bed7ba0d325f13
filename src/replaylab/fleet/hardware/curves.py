"""Power and throughput curves of a GPU replica, fitted to measured points.

Power of one GPU serving a batch of n sequences (FleetSim's form, per GPU):

    P(0) = P_idle
    P(n) = P_idle + (P_nom - P_idle) * sigmoid(k * (log2(n) - x0)),   n >= 1

so power rises from idle to nominal as the batch doubles, with the midpoint at
n = 2**x0. A replica of g GPUs draws g * P(n).

Decode throughput of a replica with iteration time W + a*n (one token per
sequence per iteration; see sim/simulator.py for the full iteration model):

    tokens_per_s(n) = n / (W + a * n)

Splitwise step times are fitted in two pieces, both linear least squares:

    token_time(b, p)  = W + a*b + h*b*p      (one decode step, batch b, prompt p)
    prompt_time(b, p) = p0 + beta*b*p        (prefill of b prompts of p tokens)

All fits use `scipy.optimize.curve_fit` on relative residuals and keep the residual at every point
(`CurveFit.table()`), so a report can show how well the curve explains the
measurements it was fitted to. The points are measured; the fitted curves are
`calibrated`. Energy integration over busy and idle intervals happens in the
simulator (one multiply-add per batch change); `power_table` gives it P(n) for
every batch size up front.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd


def logistic_power_w(n: np.ndarray | float, idle_w: float, nominal_w: float, k: float,
                     x0: float) -> np.ndarray:
    """Per-GPU watts at batch size n (array or scalar); n = 0 draws idle power."""
    n = np.asarray(n, dtype="float64")
    with np.errstate(divide="ignore"):
        x = np.log2(np.maximum(n, 1.0))
    p = idle_w + (nominal_w - idle_w) / (1.0 + np.exp(-k * (x - x0)))
    return np.where(n <= 0, idle_w, p)


def decode_tokens_per_s(n: np.ndarray | float, base_s: float, per_seq_s: float) -> np.ndarray:
    """Decode throughput (tokens/s) of a batch of n with iteration time base_s + per_seq_s*n."""
    n = np.asarray(n, dtype="float64")
    return n / (base_s + per_seq_s * n)


@dataclass(frozen=True)
class CurveFit:
    """A fitted curve and its residuals at the points it was fitted to.

    x: the inputs (n, k) or (n,); y: measured values (n,); fitted: the curve at x (n,).
    """

    name: str
    params: dict[str, float]
    x: np.ndarray
    y: np.ndarray
    fitted: np.ndarray
    unit: str
    source: str
    labels: list[str] = field(default_factory=list)  # one per point, e.g. "batch=64"

    @property
    def residual(self) -> np.ndarray:
        return self.y - self.fitted

    @property
    def rel_residual(self) -> np.ndarray:
        return self.residual / np.where(self.y == 0, np.nan, self.y)

    @property
    def rmse(self) -> float:
        return float(np.sqrt(np.mean(self.residual ** 2)))

    @property
    def mape(self) -> float:
        """Mean absolute relative residual (0.03 = 3%)."""
        return float(np.nanmean(np.abs(self.rel_residual)))

    @property
    def max_abs_rel(self) -> float:
        return float(np.nanmax(np.abs(self.rel_residual)))

    def summary(self) -> dict:
        return {"curve": self.name, "n_points": int(self.y.size), "unit": self.unit,
                "rmse": round(self.rmse, 4), "mape": round(self.mape, 4),
                "max_abs_rel": round(self.max_abs_rel, 4),
                **{k: float(v) for k, v in self.params.items()}, "source": self.source}

    def table(self) -> pd.DataFrame:
        """One row per measured point: label, measured, fitted, residual, relative residual."""
        return pd.DataFrame({"point": self.labels or [str(i) for i in range(self.y.size)],
                             "measured": self.y, "fitted": self.fitted,
                             "residual": self.residual, "rel_residual": self.rel_residual})


def _curve_fit(f, x, y, p0, bounds):
    """Least squares on RELATIVE residuals (sigma = |y|): small and large points count alike."""
    from scipy.optimize import curve_fit  # scipy is a training-side dependency: import late

    params, _ = curve_fit(f, x, y, p0=p0, sigma=np.abs(y), bounds=bounds, maxfev=20000)
    return params


def fit_power_curve(batch: np.ndarray, watts: np.ndarray, *, source: str,
                    labels: list[str] | None = None, idle_w: float | None = None) -> CurveFit:
    """Fit P_idle, P_nom, k, x0 of `logistic_power_w` to per-GPU watts at batch sizes.

    batch, watts: (n,) with n >= 4 points. Bounds keep 0 < P_idle <= P_nom and k > 0.
    idle_w: hold P_idle at this value (e.g. a measured idle draw) and fit the
    other three; without it P_idle is the curve's lower asymptote, which data
    starting at batch 8 only extrapolate to.
    """
    batch = np.asarray(batch, dtype="float64")
    watts = np.asarray(watts, dtype="float64")
    if batch.size < 4:
        raise ValueError(f"fit_power_curve needs >= 4 points, got {batch.size}")
    lo, hi = float(watts.min()), float(watts.max())
    x0 = float(np.log2(np.median(batch)))
    if idle_w is None:
        p = _curve_fit(lambda n, a, b, k, x: logistic_power_w(n, a, b, k, x), batch, watts,
                       [0.8 * lo, 1.02 * hi, 1.0, x0],
                       ([1.0, lo, 0.05, -4.0], [hi, 3.0 * hi, 10.0, 16.0]))
    else:
        q = _curve_fit(lambda n, b, k, x: logistic_power_w(n, idle_w, b, k, x), batch, watts,
                       [1.02 * hi, 1.0, x0], ([max(lo, idle_w), 0.05, -4.0], [3.0 * hi, 10.0, 16.0]))
        p = [idle_w, *q]
    names = ("idle_w", "nominal_w", "k", "x0")
    return CurveFit("power_per_gpu", dict(zip(names, map(float, p), strict=True)), batch, watts,
                    logistic_power_w(batch, *p), "W", source, labels or [])


def fit_throughput_curve(batch: np.ndarray, tokens_per_s: np.ndarray, *, source: str,
                         labels: list[str] | None = None) -> CurveFit:
    """Fit W (base_s) and a (per_seq_s) of n / (W + a*n) to measured decode throughput."""
    batch = np.asarray(batch, dtype="float64")
    tps = np.asarray(tokens_per_s, dtype="float64")
    if batch.size < 2:
        raise ValueError(f"fit_throughput_curve needs >= 2 points, got {batch.size}")
    # start from the line through 1/throughput per sequence: n/tps = W + a*n
    a0, w0 = np.polyfit(batch, batch / tps, 1)
    p0 = [max(float(w0), 1e-4), max(float(a0), 1e-7)]
    p = _curve_fit(decode_tokens_per_s, batch, tps, p0, ([1e-6, 0.0], [10.0, 1.0]))
    return CurveFit("decode_tokens_per_s", {"base_s": float(p[0]), "per_seq_s": float(p[1])},
                    batch, tps, decode_tokens_per_s(batch, *p), "tokens/s", source, labels or [])


def fit_step_time(batch: np.ndarray, context: np.ndarray, step_ms: np.ndarray, *, source: str,
                  labels: list[str] | None = None) -> CurveFit:
    """Fit W + a*b + h*b*p (ms) to decode step times at batch b and prompt length p."""
    x = np.vstack([np.asarray(batch, "float64"), np.asarray(context, "float64")])
    y = np.asarray(step_ms, dtype="float64")

    def f(xx, w, a, h):
        return w + a * xx[0] + h * xx[0] * xx[1]

    p = _curve_fit(f, x, y, [float(y.min()), 0.1, 1e-5], ([0.0, 0.0, 0.0], [1e4, 1e3, 1.0]))
    return CurveFit("decode_step_ms", {"base_ms": float(p[0]), "per_seq_ms": float(p[1]),
                                       "per_kv_token_ms": float(p[2])},
                    x.T, y, f(x, *p), "ms", source, labels or [])


def fit_prefill_time(batch: np.ndarray, prompt: np.ndarray, prompt_ms: np.ndarray, *,
                     source: str, labels: list[str] | None = None) -> CurveFit:
    """Fit p0 + beta*b*p (ms) to the prefill time of b prompts of p tokens."""
    x = np.asarray(batch, "float64") * np.asarray(prompt, "float64")
    y = np.asarray(prompt_ms, dtype="float64")
    p = _curve_fit(lambda t, p0, beta: p0 + beta * t, x, y, [float(y.min()), 0.1],
                   ([0.0, 0.0], [1e5, 10.0]))
    return CurveFit("prefill_ms", {"base_ms": float(p[0]), "per_token_ms": float(p[1])},
                    x, y, p[0] + p[1] * x, "ms", source, labels or [])


def power_table(idle_w: float, nominal_w: float, k: float, x0: float, max_batch: int,
                gpus: int = 1) -> list[float]:
    """Replica watts for batch sizes 0..max_batch (a Python list: the simulator indexes it)."""
    n = np.arange(max_batch + 1)
    return (gpus * logistic_power_w(n, idle_w, nominal_w, k, x0)).tolist()


def energy_ratios(joules: float, successes: int, output_tokens: int) -> dict[str, float]:
    """joules_per_success and joules_per_output_token; NaN when the denominator is zero."""
    return {"joules_per_success": joules / successes if successes else float("nan"),
            "joules_per_output_token": joules / output_tokens if output_tokens else float("nan")}
