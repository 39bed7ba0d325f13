"""Scenarios of the autoscaling experiment: typed config, rate traces, demand per tick.

A scenario is a day of 10-minute request rates (ServeGen language/m-large,
summed over clients and scaled to the pool, a seeded synthetic diurnal, or the
arrivals of a ledger-v1 file counted per bucket: `ledger_bucket_rps`),
preceded by history days the forecaster and the static sizing may see, and
changed by its kind:
- `steady`: the day as it is;
- `burst`: the rate times `factor` for `minutes`, at a seeded or given hour;
- `mix_drift`: the share of long-output requests times `long_share_factor`,
  ramping in from `start_hour` over `ramp_minutes` (request counts unchanged,
  replica-seconds per request up);
- `forecast_error`: the forecast's quantiles times (1 + bias) and lognormal noise.
Inside a bucket the rate is linear between bucket midpoints, rescaled so the
bucket keeps its recorded mean; the arrivals of a
tick are gamma-Poisson with the index of dispersion (variance / mean) of a
renewal process with the bucket's inter-arrival CV (ServeGen `rate_cv`,
measured per client, pooled by the importer; thinned by `scale` < 1:
D = scale * cv^2 + 1 - scale), or of `tick_noise_cv` for the synthetic trace
(modeled). Every policy of a scenario sees the same arrivals (common random
numbers).

For the event-driven simulator (`scenario_workload`) a tick's arrivals are
placed uniformly at random inside the tick (Poisson given the count, so the
gamma-Poisson count keeps the burstiness at the 15 s scale), and each request
gets the prompt and completion tokens of a row drawn from a measured token
sample (`TokenSample`: the Azure LLM inference trace 2023 by default): a long
one (completion >= the threshold) with the tick's long-output share, else a
short one. A run of several policies on one scenario and seed reuses one
workload (common random numbers).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from replaylab.config import ConfigError
from replaylab.data import PUBLIC_FILES, require_public
from replaylab.fleet.sim.workload import Workload

DAY_S = 86_400
SCENARIO_KINDS = ("steady", "burst", "mix_drift", "forecast_error")


@dataclass(frozen=True)
class TraceConfig:
    source: str = "synthetic"     # synthetic | servegen | ledger (base_rates(..., ledger=frame))
    path: str | None = None       # servegen: a downloaded folder, e.g. language/m-large
    day: int = 3                  # evaluated day (0-based); days before it are history
    scale: float = 1.0            # multiply the source's request rate (ServeGen m-large: 0.25)
    tick_noise_cv: float = 0.1    # synthetic trace: cv of the rate per tick
    synthetic_days: int = 4
    synthetic_mean_rps: float = 50.0
    synthetic_amplitude: float = 0.5
    synthetic_bucket_cv: float = 0.05
    hours: float = 24.0           # evaluate only the first `hours` of the day (tests)

    def __post_init__(self) -> None:
        if self.source not in ("servegen", "synthetic", "ledger"):
            raise ConfigError(f"trace.source={self.source!r}; choose servegen, synthetic or "
                              "ledger")
        if self.source == "servegen" and not self.path:
            f = PUBLIC_FILES["servegen"]
            raise ConfigError(f"trace.source=servegen needs trace.path=FOLDER: {f.what} "
                              f"({f.license}), {f.where}; or trace.source=synthetic (seeded)")
        if self.day < 1 or self.scale <= 0 or not 0 < self.hours <= 24:
            raise ConfigError(f"trace: day={self.day} (needs >= 1 history day), "
                              f"scale={self.scale}, hours={self.hours} out of range")


@dataclass(frozen=True)
class ScenarioConfig:
    kind: str = "steady"
    factor: float = 3.0            # burst
    minutes: float = 20.0          # burst
    start_hour: float | None = None  # burst / mix_drift; None = seeded (burst)
    long_share_factor: float = 2.0  # mix_drift
    ramp_minutes: float = 60.0     # mix_drift
    bias: float = 0.0              # forecast_error
    noise_sigma: float = 0.0       # forecast_error

    def __post_init__(self) -> None:
        if self.kind not in SCENARIO_KINDS:
            raise ConfigError(f"scenario kind={self.kind!r}; one of {SCENARIO_KINDS}")


@dataclass(frozen=True)
class Demand0:
    """Rates of one scenario before arrivals are drawn."""

    bucket_rps: pd.Series      # realized requests/s per bucket, history + day (index: epoch ms)
    tick_rps: np.ndarray       # requests/s per tick of the evaluated day
    tick_dispersion: np.ndarray  # variance / mean of the arrivals per tick
    long_share: np.ndarray     # long-output share per tick
    day_start_ms: int
    bucket_seconds: int
    notes: dict = field(default_factory=dict)


@dataclass(frozen=True)
class BaseRates:
    """Scaled requests/s per bucket (history + day), inter-arrival CV per bucket, width (s)."""

    rps: pd.Series
    cv: pd.Series | None
    width: int


def servegen_bucket_rps(path: str) -> tuple[pd.Series, pd.Series, int]:
    """Requests/s and pooled inter-arrival CV per bucket of a ServeGen folder (archetypes
    summed: cv = sqrt(sum n cv^2 / sum n)), and the bucket width."""
    from replaylab.sources.servegen import import_servegen

    agg = import_servegen(require_public(path, "servegen", "experiment.trace.path",
                                         folder=True))
    width = int(agg["bucket_seconds"].iloc[0])
    agg = agg.assign(w=agg["requests"] * agg["rate_cv"].fillna(1.0) ** 2)
    g = agg.groupby("bucket_start")[["requests", "w"]].sum().sort_index()
    cv = np.sqrt(g["w"] / g["requests"].where(g["requests"] > 0)).fillna(1.0)
    return g["requests"] / width, cv, width


def synthetic_bucket_rps(cfg: TraceConfig, seed: int, width: int = 600) -> pd.Series:
    """A seeded diurnal: mean * (1 + amplitude * sin) * lognormal bucket noise (modeled)."""
    rng = np.random.default_rng(seed)
    n = cfg.synthetic_days * DAY_S // width
    t = np.arange(n) * width
    shape = 1 + cfg.synthetic_amplitude * np.sin(2 * np.pi * (t / DAY_S - 0.375))
    noise = np.exp(rng.normal(0, cfg.synthetic_bucket_cv, n))
    return pd.Series(cfg.synthetic_mean_rps * shape * noise, index=t * 1000)


def ledger_bucket_rps(arrival_s: np.ndarray, width: int = 600) -> tuple[pd.Series, pd.Series]:
    """Requests/s and the inter-arrival CV per bucket of recorded arrivals (seconds from the
    first; a ledger's timestamps, `time_scale` already applied). Buckets start at 0 (index:
    ms); a bucket with fewer than 3 arrivals gets CV 1 (Poisson: too few gaps to measure)."""
    t = np.sort(np.asarray(arrival_s, dtype=float))
    t = t - t[0] if t.size else t
    n_buckets = int(t[-1] // width) + 1 if t.size else 0
    b = (t // width).astype(int)
    counts = np.bincount(b, minlength=n_buckets).astype(float)
    gaps = np.diff(t)
    same = b[1:] == b[:-1]                      # gaps inside one bucket
    g, gb = gaps[same], b[1:][same]
    n = np.bincount(gb, minlength=n_buckets)
    s1 = np.bincount(gb, g, minlength=n_buckets)
    s2 = np.bincount(gb, g * g, minlength=n_buckets)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = s1 / n
        cv = np.sqrt(np.maximum(s2 / n - mean**2, 0.0)) / mean
    cv = np.where((n >= 2) & (mean > 0), cv, 1.0)
    idx = np.arange(n_buckets, dtype="int64") * width * 1000
    return pd.Series(counts / width, index=idx), pd.Series(cv, index=idx)


def base_rates(cfg: TraceConfig, seed: int, arrival_s: np.ndarray | None = None) -> BaseRates:
    """Scaled requests/s per bucket for history + the evaluated day (read once per run).

    source=ledger: `arrival_s` (a ledger's arrivals, seconds) counted per 10-minute
    bucket, at `cfg.scale` (1 keeps the recorded rate)."""
    if cfg.source == "synthetic":
        rps, cv, width = synthetic_bucket_rps(cfg, seed), None, 600
    elif cfg.source == "ledger":
        if arrival_s is None:
            raise ConfigError("trace.source=ledger needs the ledger's arrivals")
        width = 600
        rps, cv = ledger_bucket_rps(arrival_s, width)
    else:
        rps, cv, width = servegen_bucket_rps(cfg.path)
    per_day = DAY_S // width
    if len(rps) < (cfg.day + 1) * per_day:
        raise ConfigError(f"trace.day={cfg.day}: the trace has {len(rps) // per_day} full days "
                          "(the days before trace.day are the history the static and forecast "
                          "policies size from)")
    keep = (cfg.day + 1) * per_day
    return BaseRates(rps.iloc[:keep] * cfg.scale, None if cv is None else cv.iloc[:keep], width)


def _dispersion(cfg: TraceConfig, base: BaseRates, day_start_ms: int, tick_rps: np.ndarray,
                tick_s: float) -> np.ndarray:
    """Index of dispersion of the arrivals per tick (see the module doc)."""
    n = len(tick_rps)
    if base.cv is None:
        return 1.0 + tick_rps * tick_s * cfg.tick_noise_cv**2
    per_bucket = base.width / tick_s
    cv = base.cv[base.cv.index >= day_start_ms].to_numpy()
    cv = cv[np.minimum((np.arange(n) // per_bucket).astype(int), len(cv) - 1)]
    p = min(cfg.scale, 1.0)
    return np.maximum(1.0, p * cv**2 + 1 - p) if cfg.scale <= 1 else np.maximum(1.0, cv**2)


def _tick_rates(rps: pd.Series, width: int, day_start_ms: int, n_ticks: int,
                tick_s: float) -> np.ndarray:
    """Linear between bucket midpoints, rescaled per bucket so each bucket keeps its
    recorded mean (the day's request volume is the trace's)."""
    centers = (rps.index.to_numpy(dtype=float) - day_start_ms) / 1000 + width / 2
    t = (np.arange(n_ticks) + 0.5) * tick_s
    tick = np.interp(t, centers, rps.to_numpy(dtype=float))
    bucket = (t // width).astype(int)
    recorded = rps[rps.index >= day_start_ms].to_numpy(dtype=float)[: bucket.max() + 1]
    interp_mean = np.bincount(bucket, tick) / np.maximum(np.bincount(bucket), 1)
    factor = np.where(interp_mean > 0, recorded / np.where(interp_mean > 0, interp_mean, 1), 0)
    return tick * factor[bucket]


def scenario_rates(base: BaseRates, cfg: TraceConfig, sc: ScenarioConfig,
                   base_long_share: float, tick_s: float, seed: int) -> Demand0:
    """Tick rates, long-output shares and the realized bucket series of one scenario."""
    rps, width = base.rps, base.width
    day_start_ms = int(rps.index[cfg.day * DAY_S // width])
    n_ticks = int(round(cfg.hours * 3600 / tick_s))
    tick = _tick_rates(rps, width, day_start_ms, n_ticks, tick_s)
    long_share = np.full(n_ticks, base_long_share)
    t = np.arange(n_ticks) * tick_s
    notes: dict = {}
    if sc.kind == "burst":
        rng = np.random.default_rng(seed + 7)
        hours = cfg.hours - sc.minutes / 60
        start_h = sc.start_hour if sc.start_hour is not None else float(
            rng.uniform(min(2.0, hours / 4), max(min(2.0, hours / 4), hours - 1)))
        inside = (t >= start_h * 3600) & (t < start_h * 3600 + sc.minutes * 60)
        tick = np.where(inside, tick * sc.factor, tick)
        notes = {"burst_start_hour": round(start_h, 3), "burst_minutes": sc.minutes,
                 "burst_factor": sc.factor}
    elif sc.kind == "mix_drift":
        start_h = sc.start_hour if sc.start_hour is not None else cfg.hours / 3
        ramp = np.clip((t - start_h * 3600) / max(sc.ramp_minutes * 60, 1e-9), 0, 1)
        target = min(1.0, base_long_share * sc.long_share_factor)
        long_share = base_long_share + ramp * (target - base_long_share)
        notes = {"drift_start_hour": round(start_h, 3), "long_share_from": base_long_share,
                 "long_share_to": target}
    # the realized series the forecaster sees: history as is, the day from its ticks
    per_bucket = int(width // tick_s)
    day_idx = rps.index[rps.index >= day_start_ms][: n_ticks // per_bucket]
    realized = rps.copy()
    realized.loc[day_idx] = tick[: len(day_idx) * per_bucket].reshape(-1, per_bucket).mean(1)
    return Demand0(realized.loc[: day_idx[-1]] if len(day_idx) else realized, tick,
                   _dispersion(cfg, base, day_start_ms, tick, tick_s), long_share,
                   day_start_ms, width, notes)


def draw_arrivals(tick_rps: np.ndarray, tick_s: float, dispersion: np.ndarray,
                  seed: int) -> np.ndarray:
    """Gamma-Poisson arrivals per tick: mean rate * tick, variance mean * dispersion."""
    rng = np.random.default_rng(seed)
    mean = tick_rps * tick_s
    v = np.where(mean > 0, (np.asarray(dispersion) - 1.0) / np.maximum(mean, 1e-12), 0.0)
    factor = np.ones(len(mean))
    noisy = v > 1e-12
    factor[noisy] = rng.gamma(1 / v[noisy], v[noisy])
    return rng.poisson(mean * factor).astype(float)


@dataclass(frozen=True)
class TokenSample:
    """Measured (prompt, completion) token pairs, split at `long_threshold` completion tokens."""

    prompt_tokens: np.ndarray
    completion_tokens: np.ndarray
    long_threshold: int = 400
    source: str = ""

    def __post_init__(self) -> None:
        p = np.asarray(self.prompt_tokens, dtype="int64")
        c = np.maximum(np.asarray(self.completion_tokens, dtype="int64"), 1)
        if p.shape != c.shape or p.size == 0 or (p < 0).any():
            raise ConfigError("TokenSample: one prompt (>= 0) per completion, at least one row")
        object.__setattr__(self, "prompt_tokens", p)
        object.__setattr__(self, "completion_tokens", c)
        if not (self.is_long.any() and (~self.is_long).any()):
            raise ConfigError(f"TokenSample: long_threshold={self.long_threshold} leaves one "
                              "class empty (the mix drift needs both)")

    @property
    def is_long(self) -> np.ndarray:
        return self.completion_tokens >= self.long_threshold

    @property
    def long_share(self) -> float:
        return float(self.is_long.mean())


def token_sample(ledger: pd.DataFrame, long_threshold: int = 400,
                 source: str = "") -> TokenSample:
    """The prompt / completion tokens of the ledger-v1 rows that have both."""
    ok = ledger["prompt_tokens"].notna() & ledger["completion_tokens"].notna()
    d = ledger[ok]
    return TokenSample(d["prompt_tokens"].to_numpy("int64"),
                       d["completion_tokens"].to_numpy("int64"), long_threshold, source)


def scenario_workload(d0: Demand0, tick_s: float, tokens: TokenSample, seed: int,
                      model: str = "model") -> Workload:
    """One seeded day of requests for the fleet simulator (see the module doc)."""
    counts = draw_arrivals(d0.tick_rps, tick_s, d0.tick_dispersion, seed + 1).astype("int64")
    rng = np.random.default_rng(seed + 2)
    tick = np.repeat(np.arange(len(counts)), counts)
    n = int(tick.size)
    # disjoint ticks: sorting the times keeps every request in its tick, and the token
    # draws below are exchangeable within a tick, so they need no reordering
    arrival = np.sort((tick + rng.random(n)) * tick_s)
    lng = tokens.is_long
    long_rows, short_rows = np.flatnonzero(lng), np.flatnonzero(~lng)
    is_long = rng.random(n) < d0.long_share[tick]
    rows = np.where(is_long, long_rows[rng.integers(0, long_rows.size, n)],
                    short_rows[rng.integers(0, short_rows.size, n)])
    zeros = np.zeros(n, dtype="int16")
    return Workload(arrival, tokens.prompt_tokens[rows], tokens.completion_tokens[rows], zeros,
                    (model,), zeros, ("interactive",), np.full(n, -1, dtype="int16"),
                    source=f"scenario rates x {tokens.source or 'token sample'}, seed {seed}")
