"""Workloads for the fleet simulator: a replayed ledger-v1 trace or a synthetic stream.

A `Workload` is a set of columns, one row per request, sorted by arrival:

    arrival_s (n,) float64      seconds from the first arrival
    prompt_tokens (n,) int64    >= 0
    completion_tokens (n,) int64 >= 1 (the tokens the request will generate)
    model, slo_class (n,) int16 codes into `models`, `slo_classes`
    region (n,) int16           code into `regions`: the residency constraint; -1 = anywhere
    deadline_s (n,) float64     seconds after arrival by which it must finish; inf = none
    cancel_after_s (n,) float64 the client cancels this long after arrival; inf = never
    hint_p90 (n,) float64       the demand hint (total tokens, p90); NaN = no hint

From a ledger (`workload_from_ledger`): arrival times and token counts of the
real trace. Rows that cannot be simulated (quarantined by the contract, or with
null prompt/completion tokens) are counted in `skipped`, never dropped silently;
a completion of 0 tokens is simulated as 1 (one forward pass) and counted in
`adjusted`.

Synthetic (`workload_from_cdf`): total tokens drawn from an empirical CDF
(FleetSim's JSON: [[threshold, cumulative fraction], ...] or {"cdf": [...]},
linear between points, i.e. uniform within a bucket), split into prompt and
completion by `output_fraction` (FleetSim's 0.2). Arrivals: Poisson, or a gamma
renewal process with coefficient of variation `cv` (cv > 1: bursty).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from replaylab.config import fail_field
from replaylab.contracts import Ledger as L
from replaylab.contracts import ValidationResult, read_ledger, validate_ledger
from replaylab.contracts.enums import LifecycleState

ARRIVALS = ("poisson", "gamma")


@dataclass(frozen=True)
class Workload:
    """Requests to simulate, one row each; see the module docstring for the columns."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    completion_tokens: np.ndarray
    model: np.ndarray
    models: tuple[str, ...]
    slo_class: np.ndarray
    slo_classes: tuple[str, ...]
    region: np.ndarray
    regions: tuple[str, ...] = ()
    deadline_s: np.ndarray | None = None
    cancel_after_s: np.ndarray | None = None
    hint_p90: np.ndarray | None = None
    source: str = ""
    skipped: dict[str, int] = field(default_factory=dict)
    adjusted: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        put = object.__setattr__  # frozen: normalise dtypes once, here
        put(self, "arrival_s", np.ascontiguousarray(self.arrival_s, dtype="float64"))
        for name, dt in (("prompt_tokens", "int64"), ("completion_tokens", "int64"),
                         ("model", "int16"), ("slo_class", "int16"), ("region", "int16")):
            put(self, name, np.ascontiguousarray(getattr(self, name), dtype=dt))
        for name, fill in (("deadline_s", math.inf), ("cancel_after_s", math.inf),
                           ("hint_p90", math.nan)):
            v = getattr(self, name)
            put(self, name, np.full(n, fill) if v is None
                else np.ascontiguousarray(v, dtype="float64"))
        c = "Workload"
        for name in ("prompt_tokens", "completion_tokens", "model", "slo_class", "region",
                     "deadline_s", "cancel_after_s", "hint_p90"):
            if len(getattr(self, name)) != n:
                fail_field(c, name, len(getattr(self, name)), f"length must equal n={n}")
        if n and (np.any(np.diff(self.arrival_s) < 0) or not np.isfinite(self.arrival_s).all()):
            fail_field(c, "arrival_s", "unsorted or non-finite", "must be finite and sorted")
        if n and self.prompt_tokens.min() < 0:
            fail_field(c, "prompt_tokens", int(self.prompt_tokens.min()), "must be >= 0")
        if n and self.completion_tokens.min() < 1:
            fail_field(c, "completion_tokens", int(self.completion_tokens.min()), "must be >= 1")
        for name, codes, k in (("model", self.model, len(self.models)),
                               ("slo_class", self.slo_class, len(self.slo_classes)),
                               ("region", self.region, len(self.regions))):
            if n and (codes.min() < (-1 if name == "region" else 0) or codes.max() >= k):
                fail_field(c, name, (int(codes.min()), int(codes.max())), f"codes outside [0, {k})")
        if n and (self.deadline_s <= 0).any():
            fail_field(c, "deadline_s", float(self.deadline_s.min()), "must be > 0 (inf: none)")
        if n and (self.cancel_after_s < 0).any():
            fail_field(c, "cancel_after_s", float(self.cancel_after_s.min()), "must be >= 0")

    @property
    def n(self) -> int:
        return int(self.arrival_s.size)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if self.n else 0.0

    def time_scaled(self, factor: float) -> Workload:
        """Arrivals `factor` times denser (factor 2: twice the rate); deadlines unchanged."""
        if not factor > 0:
            fail_field("Workload.time_scaled", "factor", factor, "must be > 0")
        return replace(self, arrival_s=self.arrival_s / factor)

    def with_columns(self, **columns: np.ndarray) -> Workload:
        """A copy with some per-request columns replaced (e.g. deadline_s, cancel_after_s)."""
        return replace(self, **columns)

    def head(self, k: int) -> Workload:
        """The first k requests (a view; for tests and quick looks)."""
        cols = {c: getattr(self, c)[:k] for c in _ROW_COLUMNS}
        return replace(self, **cols)


_ROW_COLUMNS = ("arrival_s", "prompt_tokens", "completion_tokens", "model", "slo_class", "region",
                "deadline_s", "cancel_after_s", "hint_p90")


def _codes(values: pd.Series | np.ndarray) -> tuple[np.ndarray, tuple[str, ...]]:
    cat = pd.Categorical(pd.Series(values).astype(str))
    return cat.codes.astype("int16"), tuple(str(c) for c in cat.categories)


def workload_from_ledger(source: str | Path | pd.DataFrame | ValidationResult, *,
                         model_map: dict[str, str] | None = None, residency: bool = False,
                         default_slo_class: str = "interactive",
                         deadline_s_by_slo: dict[str, float] | None = None,
                         cancel_aborted: bool = False, time_scale: float = 1.0) -> Workload:
    """Replay a ledger-v1 file or frame: real arrival times and token counts.

    model_map: ledger `selected_model` -> fleet model name (unmapped names stay).
    residency: treat the ledger's `region` as a constraint (else requests go anywhere).
    deadline_s_by_slo: a deadline per SLO class (others: none).
    cancel_aborted: rows with lifecycle `aborted` and a duration are cancelled by
      the client that long after arrival (their completion tokens are then a lower
      bound, as the contract says).
    time_scale: > 1 compresses the trace (more load from the same requests).
    """
    if isinstance(source, ValidationResult):
        result = source
    elif isinstance(source, pd.DataFrame):
        result = validate_ledger(source)
    else:
        result = read_ledger(source)
    df = result.valid
    skipped = {f"quarantined:{k}": v for k, v in result.by_reason().items()}
    for col in (L.PROMPT_TOKENS, L.COMPLETION_TOKENS):
        null = df[col].isna()
        if null.any():
            skipped[f"{col}_null"] = int(null.sum())
            df = df[~null]
    df = df.sort_values(L.TIMESTAMP, kind="stable")
    n = len(df)
    ts = df[L.TIMESTAMP].to_numpy("int64")
    arrival = (ts - ts[0]) / 1000.0 / time_scale if n else np.zeros(0)
    comp = df[L.COMPLETION_TOKENS].to_numpy("int64")
    adjusted = {"completion_zero_as_one": int((comp == 0).sum())} if (comp == 0).any() else {}
    model, models = _codes(df[L.SELECTED_MODEL].map(lambda m: (model_map or {}).get(m, m)))
    slo_src = (df[L.SLO_CLASS].fillna(default_slo_class) if L.SLO_CLASS in df.columns
               else pd.Series([default_slo_class] * n))
    slo, slo_classes = _codes(slo_src)
    if residency and L.REGION in df.columns:
        reg_s = df[L.REGION]
        region, regions = _codes(reg_s.fillna("__any__"))
        if "__any__" in regions:
            any_code = regions.index("__any__")
            region = np.where(region == any_code, -1, region - (region > any_code)).astype("int16")
            regions = tuple(r for r in regions if r != "__any__")
    else:
        region, regions = np.full(n, -1, dtype="int16"), ()
    deadline = np.full(n, math.inf)
    for cls, d in (deadline_s_by_slo or {}).items():
        if cls in slo_classes:
            deadline[slo == slo_classes.index(cls)] = d
    cancel = np.full(n, math.inf)
    if cancel_aborted and L.DURATION_MS in df.columns:
        ab = ((df[L.LIFECYCLE_STATE] == LifecycleState.ABORTED).to_numpy()
              & df[L.DURATION_MS].notna().to_numpy())
        cancel[ab] = df[L.DURATION_MS].to_numpy("float64", na_value=np.nan)[ab] / 1000.0 / time_scale
    hint = (df[L.HINT_P90].to_numpy("float64", na_value=np.nan) if L.HINT_P90 in df.columns
            else None)
    return Workload(arrival, df[L.PROMPT_TOKENS].to_numpy("int64"), np.maximum(comp, 1), model,
                    models, slo, slo_classes, region, regions, deadline, cancel, hint,
                    source=str(result.source or "frame"), skipped=skipped, adjusted=adjusted)


def load_token_cdf(source: str | Path | list) -> tuple[np.ndarray, np.ndarray]:
    """(thresholds (k,), cumulative fractions (k,)) from FleetSim's CDF JSON or a list of pairs."""
    if isinstance(source, str | Path):
        raw = json.loads(Path(source).read_text())
        source = raw["cdf"] if isinstance(raw, dict) else raw
    pts = np.asarray(source, dtype="float64")
    if pts.ndim != 2 or pts.shape[1] != 2 or np.any(np.diff(pts[:, 1]) < 0):
        raise ValueError("a token CDF is a list of [threshold, non-decreasing fraction] pairs")
    return pts[:, 0], np.clip(pts[:, 1], 0.0, 1.0)


def sample_total_tokens(thresholds: np.ndarray, fractions: np.ndarray, size: int,
                        rng: np.random.Generator) -> np.ndarray:
    """Inverse-transform samples (size,) int64 >= 1, linear between CDF points from (1, 0)."""
    x = np.concatenate([[1.0], thresholds])
    p = np.concatenate([[0.0], fractions])
    p[-1] = 1.0  # a CDF that stops at 0.9999 ends at its last threshold
    _, first = np.unique(p, return_index=True)  # flat stretches carry no mass: keep their start
    return np.maximum(np.rint(np.interp(rng.random(size), p[first], x[first])), 1).astype("int64")


def arrival_times(n: int, rate_per_s: float, process: str, cv: float,
                  rng: np.random.Generator) -> np.ndarray:
    """n arrival times (s) of a renewal process with mean rate `rate_per_s`.

    poisson: exponential gaps (cv = 1); gamma: gamma gaps with shape 1/cv^2.
    """
    if process == "poisson":
        gaps = rng.exponential(1.0 / rate_per_s, n)
    elif process == "gamma":
        shape = 1.0 / cv ** 2
        gaps = rng.gamma(shape, 1.0 / (rate_per_s * shape), n)
    else:
        raise ValueError(f"arrival process {process!r}: must be one of {ARRIVALS}")
    t = np.cumsum(gaps)
    return t - t[0] if n else t


@dataclass(frozen=True)
class SyntheticWorkloadConfig:
    """A synthetic stream: arrival process, token CDF, and the per-request attributes' mix.

    regions: residency constraints to draw from ("" = anywhere) with `region_mix`.
    deadline_s: per SLO class (missing: none). cancel_share: fraction of requests
    whose client cancels after an exponential time with mean `cancel_after_mean_s`.
    hint_sigma: if set, a calibrated p90 hint with log-scale noise sigma:
    hint = total * exp(eps + 1.2816 sigma), eps ~ N(0, sigma^2), so P(total <= hint) = 0.9.
    """

    n_requests: int = 10_000
    rate_per_s: float = 10.0
    arrival: str = "poisson"
    cv: float = 1.0
    output_fraction: float = 0.2
    models: tuple[str, ...] = ("model",)
    model_mix: tuple[float, ...] = (1.0,)
    slo_classes: tuple[str, ...] = ("interactive",)
    slo_mix: tuple[float, ...] = (1.0,)
    regions: tuple[str, ...] = ("",)
    region_mix: tuple[float, ...] = (1.0,)
    deadline_s: dict[str, float] = field(default_factory=dict)
    cancel_share: float = 0.0
    cancel_after_mean_s: float = 10.0
    hint_sigma: float | None = None

    def __post_init__(self) -> None:
        c = "SyntheticWorkloadConfig"
        if not isinstance(self.n_requests, int) or self.n_requests < 0:
            fail_field(c, "n_requests", self.n_requests, "must be an integer >= 0")
        if not self.rate_per_s > 0:
            fail_field(c, "rate_per_s", self.rate_per_s, "must be > 0")
        if self.arrival not in ARRIVALS:
            fail_field(c, "arrival", self.arrival, f"must be one of {ARRIVALS}")
        if not self.cv > 0:
            fail_field(c, "cv", self.cv, "must be > 0")
        if not 0 < self.output_fraction < 1:
            fail_field(c, "output_fraction", self.output_fraction, "must be in (0, 1)")
        for names, mix in (("models", "model_mix"), ("slo_classes", "slo_mix"),
                           ("regions", "region_mix")):
            a, w = getattr(self, names), getattr(self, mix)
            if len(a) == 0 or len(a) != len(w) or min(w) < 0 or not math.isclose(sum(w), 1.0):
                fail_field(c, mix, w, f"one weight >= 0 per entry of {names}, summing to 1")
        if not 0 <= self.cancel_share <= 1:
            fail_field(c, "cancel_share", self.cancel_share, "must be in [0, 1]")
        if self.hint_sigma is not None and not self.hint_sigma >= 0:
            fail_field(c, "hint_sigma", self.hint_sigma, "must be >= 0 or None")


def workload_from_cdf(cdf: str | Path | list, config: SyntheticWorkloadConfig,
                      seed: int = 0) -> Workload:
    """A synthetic workload: token totals from `cdf`, arrivals and attributes from `config`."""
    cfg, n = config, config.n_requests
    rng = np.random.default_rng(seed)
    arrival = arrival_times(n, cfg.rate_per_s, cfg.arrival, cfg.cv, rng)
    total = sample_total_tokens(*load_token_cdf(cdf), n, rng)
    completion = np.maximum(np.rint(total * cfg.output_fraction), 1).astype("int64")
    prompt = np.maximum(total - completion, 0)
    model = rng.choice(len(cfg.models), n, p=cfg.model_mix).astype("int16")
    slo = rng.choice(len(cfg.slo_classes), n, p=cfg.slo_mix).astype("int16")
    named = tuple(r for r in cfg.regions if r)
    pick = rng.choice(len(cfg.regions), n, p=cfg.region_mix)
    region = np.array([named.index(r) if r else -1 for r in cfg.regions], dtype="int16")[pick]
    deadline = np.full(n, math.inf)
    for k, name in enumerate(cfg.slo_classes):
        if name in cfg.deadline_s:
            deadline[slo == k] = cfg.deadline_s[name]
    cancel = np.where(rng.random(n) < cfg.cancel_share,
                      rng.exponential(cfg.cancel_after_mean_s, n), math.inf)
    hint = None
    if cfg.hint_sigma is not None:
        s = cfg.hint_sigma
        hint = (prompt + completion) * np.exp(rng.normal(0.0, s, n) + 1.2815516 * s)
    src = cdf if isinstance(cdf, str | Path) else "cdf points"
    return Workload(arrival, prompt, completion, model, cfg.models, slo, cfg.slo_classes, region,
                    named, deadline, cancel, hint, source=f"synthetic:{src}")
