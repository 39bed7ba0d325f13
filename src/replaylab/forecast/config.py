"""Typed configs of the forecast pipeline: aggregation, backtest, LightGBM, forecasters.

Frozen dataclasses; YAML carries the values (conf/forecast/default.yaml). A bad
value fails at construction with a message naming the field and the value;
`replaylab.config.from_mapping` turns it into a ConfigError at the entry point.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from replaylab.config import fail_field as _fail
from replaylab.config import from_mapping

# The 80% interval's target band: what the backtest's coverage must land in (the
# report's shaded band, the summary's `targets`, the console's verdict line).
COVERAGE_TARGET = (0.72, 0.88)

FORECASTERS = ("seasonal_naive", "moving_window", "auto_ets", "mstl", "lightgbm")
# The simple controls every other forecaster must beat to be worth its cost.
CONTROLS = ("seasonal_naive", "moving_window")
SUPPRESSION = ("merge", "drop")
# Values an allow-list may hold: short, lower-case, no spaces (no free text).
_LABEL = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,31}$")
_MAX_ALLOWED = 16  # an allow-list longer than this is not "low cardinality"
RESERVED_LABELS = ("all", "other", "unknown")


def _int(cls: str, name: str, value: object, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value \
            or value < lo:
        _fail(cls, name, value, f"must be an integer >= {lo}")
    return int(value)


def _allow_list(cls: str, name: str, value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):  # type: ignore[union-attr]
        _fail(cls, name, value, "must be a list of labels or null")
    values = tuple(value)  # type: ignore[arg-type]
    bad = [v for v in values if not _LABEL.match(v) or v in RESERVED_LABELS]
    if bad or len(values) > _MAX_ALLOWED or len(set(values)) != len(values):
        _fail(cls, name, value, f"must be at most {_MAX_ALLOWED} distinct labels matching "
              f"{_LABEL.pattern}, none of {', '.join(RESERVED_LABELS)}")
    return values


def _nested(obj: object, name: str, cls: type, where: str) -> None:
    value = getattr(obj, name)
    if isinstance(value, Mapping):  # YAML / Hydra give a mapping
        object.__setattr__(obj, name, from_mapping(cls, dict(value), where))
    elif not isinstance(value, cls):
        _fail(type(obj).__name__, name, value, f"must be a {cls.__name__} or a mapping")


@dataclass(frozen=True)
class AggregationConfig:
    """Ledger -> aggregates-v1 (docs/design/archetypes.md).

    bucket_seconds: bucket width (600 = 10 minutes).
    k_min: a cell (bucket x archetype x slo_class x region) with fewer requests is
        suppressed: `merge` moves its requests into archetype `other` of the same
        bucket, slo_class and region (an `other` cell still under k_min is dropped);
        `drop` drops it. Either way the counts are reported.
    slo_classes, regions: allow-lists; a value outside becomes `other`, a null
        becomes `unknown`; null (no list) pools the dimension into `all`.
    taxonomy_version: the archetype taxonomy to assign (replaylab.forecast.taxonomy).
    trim_edges: leave out the ledger's first and last buckets: the collection window
        cuts them (Azure's trace ends 19 s into its last minute), so their counts
        are not comparable; their requests are counted in the report.
    """

    bucket_seconds: int = 600
    k_min: int = 10
    suppression: str = "merge"
    slo_classes: tuple[str, ...] | None = ("interactive", "standard", "batch")
    regions: tuple[str, ...] | None = ("us-east", "us-west", "eu-west", "eu-central",
                                       "ap-east")
    taxonomy_version: str = "arch-1"
    trim_edges: bool = True

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not isinstance(self.trim_edges, bool):
            _fail(name, "trim_edges", self.trim_edges, "must be a bool")
        object.__setattr__(self, "bucket_seconds",
                           _int(name, "bucket_seconds", self.bucket_seconds, 1))
        object.__setattr__(self, "k_min", _int(name, "k_min", self.k_min, 1))
        if self.suppression not in SUPPRESSION:
            _fail(name, "suppression", self.suppression, f"must be one of {SUPPRESSION}")
        object.__setattr__(self, "slo_classes", _allow_list(name, "slo_classes",
                                                            self.slo_classes))
        object.__setattr__(self, "regions", _allow_list(name, "regions", self.regions))
        from replaylab.forecast.taxonomy import TAXONOMIES

        if self.taxonomy_version not in TAXONOMIES:
            _fail(name, "taxonomy_version", self.taxonomy_version,
                  f"must be one of {sorted(TAXONOMIES)}")


@dataclass(frozen=True)
class BacktestConfig:
    """Rolling-origin backtest.

    horizon_buckets: buckets forecast from each origin (6 x 10 min = 1 h).
    n_windows: origins; consecutive origins are `step_buckets` apart (null: the
        horizon, so windows do not overlap). Reduced (and reported) when the data
        leaves fewer than `min_train_buckets` before the first origin.
    refit_every_windows: statsforecast models with a `forward` (AutoETS, MSTL) and
        LightGBM are fitted at the first origin and refitted every k windows; in
        between, the fitted parameters are re-applied to the history up to the
        origin. 0: fit once. Seasonal naive and moving window refit every window.
        Default 24: daily with 10-minute buckets and the default step (on ServeGen
        language a daily refit cut LightGBM's MASE from 0.78 to 0.61; the others
        moved by under 1%).
    conformal_windows: past non-overlapping horizon-long windows whose absolute
        errors (per step ahead) set the conformal interval of seasonal naive and
        moving window at each origin (statsforecast ConformalIntervals).
    """

    horizon_buckets: int = 6
    n_windows: int = 24
    step_buckets: int | None = None
    min_train_buckets: int = 36
    refit_every_windows: int = 24
    conformal_windows: int = 24

    def __post_init__(self) -> None:
        name = type(self).__name__
        for f, lo in (("horizon_buckets", 1), ("n_windows", 1), ("min_train_buckets", 2),
                      ("refit_every_windows", 0), ("conformal_windows", 2)):
            object.__setattr__(self, f, _int(name, f, getattr(self, f), lo))
        if self.step_buckets is not None:
            object.__setattr__(self, "step_buckets",
                               _int(name, "step_buckets", self.step_buckets, 1))

    @property
    def step(self) -> int:
        return self.step_buckets or self.horizon_buckets


@dataclass(frozen=True)
class LightGBMConfig:
    """The global LightGBM quantile model (one booster per quantile, all series).

    lag_offsets: lags used are horizon + offset (so every lag is known at the
        origin for every step ahead), plus one and two seasons back when those
        are >= the horizon. rolling_windows: means of the `w` buckets ending at
        lag `horizon`.
    conformalize: widen the q10-q90 band per series by conformalized quantile
        regression on the last `backtest.conformal_windows x horizon` buckets of
        the history (at most half of it); false: the boosters' raw quantiles.
    num_threads: 1 by default: on a shared 2-core machine LightGBM's OpenMP
        threads spin against other processes (a 2-thread fit measured 6x slower).
    """

    n_estimators: int = 150
    learning_rate: float = 0.05
    num_leaves: int = 31
    min_child_samples: int = 20
    feature_fraction: float = 0.9
    lambda_l2: float = 1.0
    num_threads: int = 1
    lag_offsets: tuple[int, ...] = (0, 1, 2, 3, 6, 12)
    rolling_windows: tuple[int, ...] = (6, 36)
    conformalize: bool = True

    def __post_init__(self) -> None:
        name = type(self).__name__
        for f in ("n_estimators", "num_leaves", "num_threads"):
            object.__setattr__(self, f, _int(name, f, getattr(self, f), 2 if f == "num_leaves"
                                             else 1))
        object.__setattr__(self, "min_child_samples",
                           _int(name, "min_child_samples", self.min_child_samples, 1))
        if not 0.0 < float(self.learning_rate) <= 1.0:
            _fail(name, "learning_rate", self.learning_rate, "must be in (0, 1]")
        if not 0.0 < float(self.feature_fraction) <= 1.0:
            _fail(name, "feature_fraction", self.feature_fraction, "must be in (0, 1]")
        if float(self.lambda_l2) < 0:
            _fail(name, "lambda_l2", self.lambda_l2, "must be >= 0")
        for f, lo in (("lag_offsets", 0), ("rolling_windows", 1)):
            vals = tuple(_int(name, f, v, lo) for v in getattr(self, f))
            object.__setattr__(self, f, vals)
        if not isinstance(self.conformalize, bool):
            _fail(name, "conformalize", self.conformalize, "must be a bool")
        if not self.lag_offsets:
            _fail(name, "lag_offsets", self.lag_offsets, "must hold at least one offset")

    def calibration_buckets(self, backtest: BacktestConfig) -> int:
        """History buckets held out for the conformal margin (0 = none)."""
        return backtest.conformal_windows * backtest.horizon_buckets if self.conformalize else 0

    def lightgbm_params(self, quantile: float, seed: int) -> dict:
        """LightGBM native parameters for the booster of one quantile."""
        return {"objective": "quantile", "alpha": float(quantile),
                "learning_rate": float(self.learning_rate), "num_leaves": self.num_leaves,
                "min_data_in_leaf": self.min_child_samples,
                "feature_fraction": float(self.feature_fraction),
                "lambda_l2": float(self.lambda_l2), "num_threads": self.num_threads,
                "seed": int(seed), "deterministic": True, "force_col_wise": True,
                "verbosity": -1}


@dataclass(frozen=True)
class GateConfig:
    """The forecast's go/no-go (`replaylab.forecast.gate`).

    min_origins: fewer independent backtest origins than this: NOT ENOUGH EVIDENCE (no
        go/no-go). Origins whose test windows overlap (step < horizon) count as one per
        ceil(horizon / step).
    n_boot, level: the bootstrap over origins of the paired MASE difference (origins
        whose test windows overlap are resampled together).
    """

    min_origins: int = 12
    n_boot: int = 2000
    level: float = 0.95

    def __post_init__(self) -> None:
        name = type(self).__name__
        object.__setattr__(self, "min_origins", _int(name, "min_origins", self.min_origins, 2))
        object.__setattr__(self, "n_boot", _int(name, "n_boot", self.n_boot, 100))
        if not 0.5 <= float(self.level) < 1.0:
            _fail(name, "level", self.level, "must be in [0.5, 1)")


@dataclass(frozen=True)
class ForecastConfig:
    """What the forecast pipeline aggregates, forecasts and backtests.

    forecasters: any of FORECASTERS; `seasonal_naive` is always run (it is the
        MASE scale and the control the issue's target names).
    seasonalities_s: candidate seasons in seconds (a day, a week). A season is used
        when the history before the first origin holds at least two of it; the
        shortest usable one is the seasonal naive's (and MASE's) season, all usable
        ones are MSTL's; none usable: seasonal naive is the plain naive (season 1)
        and MSTL is skipped.
    moving_window_buckets: the moving-window average's window.
    max_series: forecast the largest series (by requests) only; the rest are counted.
    min_nonzero_fraction: a series with fewer non-zero buckets is not forecast
        (too sparse for MASE: its seasonal naive scale is ~0).
    include_total: add the all-archetype total series (`all/all/all`) when the input
        has several series and no `all` rows.
    drift_window_s: window of the archetype-mix drift; null: a day when the data
        spans >= 2 days, else an hour when it spans >= 2 hours, else 6 buckets.
    report_series: series drawn in the actual-vs-forecast figure.
    gate: the go/no-go the run ends with (GateConfig).
    """

    aggregation: AggregationConfig = field(default_factory=AggregationConfig)
    backtest: BacktestConfig = field(default_factory=BacktestConfig)
    lightgbm: LightGBMConfig = field(default_factory=LightGBMConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    forecasters: tuple[str, ...] = FORECASTERS
    seasonalities_s: tuple[int, ...] = (86_400, 604_800)
    moving_window_buckets: int = 6
    max_series: int = 20
    min_nonzero_fraction: float = 0.5
    include_total: bool = True
    drift_window_s: int | None = None
    report_series: int = 3
    n_jobs: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        name = type(self).__name__
        _nested(self, "aggregation", AggregationConfig, "forecast.aggregation")
        _nested(self, "backtest", BacktestConfig, "forecast.backtest")
        _nested(self, "lightgbm", LightGBMConfig, "forecast.lightgbm")
        _nested(self, "gate", GateConfig, "forecast.gate")
        fc = tuple(self.forecasters)
        unknown = [f for f in fc if f not in FORECASTERS]
        if unknown or not fc or len(set(fc)) != len(fc):
            _fail(name, "forecasters", self.forecasters,
                  f"must be distinct names among {', '.join(FORECASTERS)}")
        if "seasonal_naive" not in fc:
            fc = ("seasonal_naive", *fc)
        object.__setattr__(self, "forecasters", fc)
        seasons = tuple(sorted(_int(name, "seasonalities_s", s, 1) for s in self.seasonalities_s))
        object.__setattr__(self, "seasonalities_s", seasons)
        for f, lo in (("moving_window_buckets", 1), ("max_series", 1), ("report_series", 0),
                      ("n_jobs", 1), ("seed", 0)):
            object.__setattr__(self, f, _int(name, f, getattr(self, f), lo))
        if not 0.0 <= float(self.min_nonzero_fraction) <= 1.0:
            _fail(name, "min_nonzero_fraction", self.min_nonzero_fraction, "must be in [0, 1]")
        if not isinstance(self.include_total, bool):
            _fail(name, "include_total", self.include_total, "must be a bool")
        if self.drift_window_s is not None:
            object.__setattr__(self, "drift_window_s",
                               _int(name, "drift_window_s", self.drift_window_s, 1))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
