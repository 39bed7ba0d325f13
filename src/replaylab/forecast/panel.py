"""aggregates-v1 rows -> a dense panel of request counts, the backtest plan and seasons.

A series is one (archetype, slo_class, region) of one taxonomy version at one
bucket width. The panel is dense: every series gets every bucket of the common
time grid; a bucket absent from the aggregates counts 0 requests (no request
arrived, or its cell was suppressed under k_min and dropped).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from replaylab.config import ConfigError
from replaylab.contracts.columns import Aggregates as A
from replaylab.forecast.config import BacktestConfig, ForecastConfig
from replaylab.forecast.taxonomy import ALL

SERIES_KEYS = (A.ARCHETYPE, A.SLO_CLASS, A.REGION)
SEP = "|"  # unique_id = "archetype|slo_class|region" (archetypes may hold "/")


class ForecastDataError(ConfigError):
    """The data cannot support the configured forecast (too short, mixed widths...).

    A ConfigError subclass: the fix is usually a setting (fewer windows, a
    shorter horizon, narrower buckets), and the entry point reports it in one line.
    """


@dataclass
class Panel:
    """Dense request counts: y[i, t] = requests of series ids[i] in bucket t."""

    y: np.ndarray  # (n_series, n_buckets) float64
    ids: list[str]
    bucket_start_ms: np.ndarray  # (n_buckets,) int64, epoch ms
    bucket_seconds: int
    taxonomy_version: str
    selection: dict = field(default_factory=dict)

    @property
    def n_series(self) -> int:
        return len(self.ids)

    @property
    def n_buckets(self) -> int:
        return self.y.shape[1]

    def keys(self) -> pd.DataFrame:
        """archetype, slo_class, region of each series (row i = ids[i])."""
        parts = [i.split(SEP) for i in self.ids]
        return pd.DataFrame(parts, columns=list(SERIES_KEYS))

    def long(self, upto: int | None = None) -> pd.DataFrame:
        """statsforecast's long frame: unique_id, ds (bucket index), y."""
        y = self.y[:, :upto]
        return pd.DataFrame({"unique_id": np.repeat(self.ids, y.shape[1]),
                             "ds": np.tile(np.arange(y.shape[1], dtype="int64"), len(self.ids)),
                             "y": y.ravel()})


def _single(aggregates: pd.DataFrame, col: str) -> object:
    values = aggregates[col].unique()
    if len(values) != 1:
        raise ForecastDataError(f"aggregates mix {len(values)} values of {col} "
                                f"({', '.join(map(str, values[:5]))}); forecast one at a time")
    return values[0]


def build_panel(aggregates: pd.DataFrame, cfg: ForecastConfig) -> Panel:
    """Validated aggregates-v1 rows -> the panel of the series to forecast."""
    if aggregates.empty:
        raise ForecastDataError("no aggregates rows to forecast")
    width = int(_single(aggregates, A.BUCKET_SECONDS))
    taxonomy = str(_single(aggregates, A.TAXONOMY_VERSION))
    width_ms = width * 1000
    start = int(aggregates[A.BUCKET_START].min())
    if ((aggregates[A.BUCKET_START] - start) % width_ms != 0).any():
        raise ForecastDataError(f"bucket_start values are not on one {width} s grid")
    n_buckets = int((aggregates[A.BUCKET_START].max() - start) // width_ms) + 1
    ids = aggregates[list(SERIES_KEYS)].astype(str).agg(SEP.join, axis=1)
    idx = ((aggregates[A.BUCKET_START] - start) // width_ms).astype(int)
    table = pd.crosstab(ids, idx, values=aggregates[A.REQUESTS], aggfunc="sum")
    table = table.reindex(columns=range(n_buckets)).fillna(0.0)
    if cfg.include_total and len(table) > 1 and not (aggregates[A.ARCHETYPE] == ALL).any():
        table.loc[SEP.join((ALL, ALL, ALL))] = table.sum(axis=0)
    nonzero = (table > 0).mean(axis=1)
    eligible = table[nonzero >= cfg.min_nonzero_fraction]
    order = eligible.sum(axis=1).sort_values(ascending=False, kind="stable")
    chosen = order.index[: cfg.max_series]
    selection = {"series_in_input": int(len(table)),
                 "too_sparse": int((nonzero < cfg.min_nonzero_fraction).sum()),
                 "beyond_max_series": int(max(len(order) - cfg.max_series, 0)),
                 "requests_in_input": int(aggregates[A.REQUESTS].sum())}
    if not len(chosen):
        raise ForecastDataError(
            f"no series has >= {cfg.min_nonzero_fraction:.0%} non-zero buckets "
            f"(of {len(table)} series); lower forecast.min_nonzero_fraction or widen buckets")
    times = start + width_ms * np.arange(n_buckets, dtype="int64")
    return Panel(y=table.loc[chosen].to_numpy(dtype="float64"), ids=[str(i) for i in chosen],
                 bucket_start_ms=times, bucket_seconds=width, taxonomy_version=taxonomy,
                 selection=selection)


@dataclass(frozen=True)
class BacktestPlan:
    """Origins of the rolling backtest: origin k trains on buckets [0, first_origin + k*step)."""

    horizon: int
    step: int
    n_windows: int
    n_windows_requested: int

    def test_size(self) -> int:
        return self.horizon + self.step * (self.n_windows - 1)

    def origins(self, n_buckets: int) -> list[int]:
        first = n_buckets - self.test_size()
        return [first + k * self.step for k in range(self.n_windows)]


def plan_backtest(n_buckets: int, cfg: BacktestConfig) -> BacktestPlan:
    """The configured windows, reduced (and reported) to keep min_train_buckets of history."""
    h, step = cfg.horizon_buckets, cfg.step
    room = n_buckets - cfg.min_train_buckets - h
    if room < 0:
        raise ForecastDataError(
            f"{n_buckets} buckets cannot hold min_train_buckets={cfg.min_train_buckets} plus "
            f"horizon_buckets={h}; use narrower buckets or a shorter horizon")
    n = min(cfg.n_windows, room // step + 1)
    return BacktestPlan(horizon=h, step=step, n_windows=n, n_windows_requested=cfg.n_windows)


@dataclass(frozen=True)
class Seasons:
    """Season lengths in buckets: the seasonal naive's (1 = plain naive) and MSTL's."""

    naive: int
    mstl: tuple[int, ...]
    notes: tuple[str, ...] = ()


def choose_seasons(seasonalities_s: tuple[int, ...], bucket_seconds: int,
                   history: int) -> Seasons:
    """Seasons (in buckets) that `history` buckets before the first origin can support.

    A season is usable when it spans >= 2 buckets and the history holds two full
    seasons (STL needs two; one would make the seasonal naive's MASE scale rest
    on a single season of differences).
    """
    usable, notes = [], []
    for s in seasonalities_s:
        m = s / bucket_seconds
        if m < 2:
            notes.append(f"season {s} s is under two {bucket_seconds} s buckets: unused")
            continue
        if not math.isclose(m, round(m)):
            notes.append(f"season {s} s is {m:.2f} buckets: rounded to {round(m)}")
        m = round(m)
        if history >= 2 * m:
            usable.append(m)
        else:
            notes.append(f"season {s} s = {m} buckets needs {2 * m} buckets of history "
                         f"before the first origin, have {history}: unused")
    naive = min(usable) if usable else 1
    if not usable:
        notes.append("no season usable: seasonal naive is the plain naive (season 1), "
                     "MSTL is skipped")
    return Seasons(naive=naive, mstl=tuple(sorted(set(usable))), notes=tuple(notes))
