"""Prometheus scrape -> observation-v1, driven by a declarative per-engine mapping.

Each engine adapter is a `PrometheusAdapter` subclass holding a `mapping` from
observation field name to either `Unsupported(reason)` or a tuple of alternative
specs tried in order (`Gauge`, `GaugeRatio`, `CounterRatio`, `CounterDelta`,
`HistogramSummary`). The first alternative whose metrics appear in the scrape is
used; if it cannot give a value this time (a rate before the second scrape, no
new histogram samples, a counter reset) the field is absent: no fall-through to a
different quantity, no default.

Two-scrape quantities. The adapter keeps the previous successful scrape:
- `CounterRatio`: delta(numerator) / delta(denominator) (prefix-cache hit rate =
  delta hits / delta queries);
- `CounterDelta`: delta over the window (GPU energy in joules);
- `HistogramSummary` with histogram_window="delta": per-bucket deltas, then
  p50/p90/p99 by `exposition.histogram_quantile` (PromQL's linear interpolation
  inside the bucket) and mean = delta(_sum) / delta(_count).
A decrease in any counter or bucket is a reset: the field is absent for this
scrape and the new scrape becomes the baseline. `window_s` on the field is the
time between the two scrapes.

Aggregation over series (after the label filter): counts, counters, energy and
power are summed (DP engines, several GPUs); fractions take the max (the most
loaded engine bounds admission) or the mean (hit rates). `observe` leaves the
adapter's state unchanged when it raises.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from replaylab.config import fail_field
from replaylab.contracts.observation import (
    FIELD_SPECS,
    FieldValue,
    Health,
    LatencySummary,
    Observation,
    ObsField,
    Source,
)
from replaylab.fleet.telemetry.adapters.exposition import (
    Scrape,
    counter_delta,
    counter_sum,
    histogram_quantile,
    histogram_series,
    histogram_window,
    matches_labels,
    parse_exposition,
    selector_text,
)


# --- mapping specs --------------------------------------------------------------------
@dataclass(frozen=True)
class Gauge:
    """A gauge (or a counter read as a level); `select` pins labels, e.g. request_type=waiting."""

    names: tuple[str, ...]
    select: Mapping[str, str] = field(default_factory=dict)
    agg: str = "sum"       # "sum" | "max" | "mean" over series
    scale: float = 1.0     # multiply into the field's unit

    def __post_init__(self) -> None:
        if self.agg not in ("sum", "max", "mean"):
            fail_field("Gauge", "agg", self.agg, "must be 'sum', 'max' or 'mean'")


@dataclass(frozen=True)
class GaugeRatio:
    """numerator / denominator of two gauges in the same scrape (e.g. used / max blocks)."""

    numerator: Gauge
    denominator: Gauge


@dataclass(frozen=True)
class CounterRatio:
    """delta(numerator) / delta(denominator) between two scrapes."""

    numerator: tuple[str, ...]
    denominator: tuple[str, ...]
    select: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CounterDelta:
    """delta(counter) between two scrapes, times `scale`."""

    names: tuple[str, ...]
    select: Mapping[str, str] = field(default_factory=dict)
    scale: float = 1.0


@dataclass(frozen=True)
class HistogramSummary:
    """p50/p90/p99/mean of a histogram; `scale` converts to seconds (ms -> 0.001)."""

    names: tuple[str, ...]
    select: Mapping[str, str] = field(default_factory=dict)
    scale: float = 1.0


@dataclass(frozen=True)
class Unsupported:
    """The engine documents no metric for this field; `reason` goes to docs and `origin`."""

    reason: str


Spec = Gauge | GaugeRatio | CounterRatio | CounterDelta | HistogramSummary
FieldMapping = Mapping[str, tuple[Spec, ...] | Unsupported]


# --- config ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ReplicaIdentity:
    """Who is scraped: the engine comes from the adapter class, the rest from the deployment."""

    replica_id: str
    pool_id: str
    engine_version: str | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        for name in ("replica_id", "pool_id"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v:
                fail_field("ReplicaIdentity", name, v, "must be a non-empty string")


@dataclass(frozen=True)
class AdapterConfig:
    """TTL and series selection for one adapter.

    ttl_s: seconds a field stays readable (set >= 2x the scrape interval);
    ttl_overrides: per-field TTL; label_filter: keep only series whose label, when
    present, equals the value (None = the engine's default, e.g. Triton model
    "tensorrt_llm"); histogram_window: "delta" (between scrapes, default) or
    "cumulative" (since engine start, one scrape suffices).
    """

    ttl_s: float = 5.0
    ttl_overrides: Mapping[str, float] = field(default_factory=dict)
    label_filter: Mapping[str, str] | None = None
    histogram_window: str = "delta"

    def __post_init__(self) -> None:
        if not _positive(self.ttl_s):
            fail_field("AdapterConfig", "ttl_s", self.ttl_s, "must be a positive finite number")
        for name, ttl in dict(self.ttl_overrides).items():
            if name not in FIELD_SPECS:
                fail_field("AdapterConfig", "ttl_overrides", name, "unknown observation field")
            if not _positive(ttl):
                fail_field("AdapterConfig", f"ttl_overrides[{name}]", ttl,
                           "must be a positive finite number")
        if self.histogram_window not in ("delta", "cumulative"):
            fail_field("AdapterConfig", "histogram_window", self.histogram_window,
                       "must be 'delta' or 'cumulative'")
        if self.label_filter is not None and not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.label_filter.items()):
            fail_field("AdapterConfig", "label_filter", self.label_filter,
                       "must map label names to string values")

    def ttl_for(self, name: str) -> float:
        return float(self.ttl_overrides.get(name, self.ttl_s))


def _positive(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0


# --- the adapter ----------------------------------------------------------------------
class PrometheusAdapter:
    """Stateful scrape -> Observation mapper for one replica (keeps the previous scrape).

    Not thread-safe on its own: one poller owns one adapter.
    """

    engine: ClassVar[str] = ""
    mapping: ClassVar[FieldMapping] = MappingProxyType({})
    model_label: ClassVar[str | None] = None           # label naming the served model
    default_label_filter: ClassVar[Mapping[str, str]] = MappingProxyType({})

    def __init__(self, identity: ReplicaIdentity, config: AdapterConfig | None = None) -> None:
        if not self.engine:
            raise TypeError("use an engine adapter (VLLMAdapter, SGLangAdapter, ...)")
        self.identity = identity
        self.config = config or AdapterConfig()
        self.label_filter = dict(self.config.label_filter if self.config.label_filter
                                 is not None else self.default_label_filter)
        self._prev: Scrape | None = None
        self._prev_at: float | None = None
        self._window_s: float | None = None

    def reset(self) -> None:
        """Forget the previous scrape (rates and deltas restart)."""
        self._prev, self._prev_at, self._window_s = None, None, None

    def metric_names(self) -> set[str]:
        """Every metric name the mapping reads (for health: is this the engine at all?)."""
        names: set[str] = set()
        for specs in self.mapping.values():
            if isinstance(specs, Unsupported):
                continue
            for s in specs:
                if isinstance(s, GaugeRatio):
                    names.update(s.numerator.names + s.denominator.names)
                elif isinstance(s, CounterRatio):
                    names.update(s.numerator + s.denominator)
                else:
                    names.update(s.names)
        return names

    def observe(self, text: str, now: float) -> Observation:
        """Map one scrape taken at `now` (caller's clock) to an Observation."""
        scrape = parse_exposition(text)
        if self._prev_at is not None and now <= self._prev_at:
            raise ValueError(f"scrape time {now} is not after the previous one {self._prev_at}")
        # seconds since the previous scrape: the window of rates, deltas and summaries
        self._window_s = None if self._prev_at is None else now - self._prev_at
        fields: dict[str, FieldValue] = {}
        for name, specs in self.mapping.items():
            ttl = self.config.ttl_for(name)
            if isinstance(specs, Unsupported):
                fields[name] = FieldValue.unsupported(at=now, ttl_s=ttl, origin=specs.reason)
                continue
            fv = self._map_field(name, specs, scrape, now, ttl)
            if fv is not None:
                fields[name] = fv
        gated = self.gated_fields(scrape)
        for name in gated:
            fields.pop(name, None)
        engine_present = scrape.has_any(sorted(self.metric_names()))
        health = Health.HEALTHY if engine_present and self.engine_ready(scrape) else Health.UNKNOWN
        fields[ObsField.HEALTH] = FieldValue.observed(
            health, source=Source.ROUTER_OBSERVED, at=now,
            ttl_s=self.config.ttl_for(ObsField.HEALTH), origin="scrape")
        obs = Observation(self.identity.replica_id, self.identity.pool_id, self.engine,
                          self.identity.engine_version, self.identity.model or self._model(scrape),
                          now, fields)
        # a gated scrape holds placeholder values: never use it as a rate baseline
        self._prev, self._prev_at = (None, None) if gated else (scrape, now)
        return obs

    # hooks for engines with an explicit readiness signal (ATOM) --------------------------
    def gated_fields(self, scrape: Scrape) -> tuple[str, ...]:
        """Fields to drop from this scrape because the engine says they are not valid."""
        return ()

    def engine_ready(self, scrape: Scrape) -> bool:
        return True

    # internals -------------------------------------------------------------------------
    def _model(self, scrape: Scrape) -> str | None:
        if not self.model_label:
            return None
        for name in sorted(self.metric_names()):
            for suffix in ("", "_total", "_bucket"):
                for labels, _ in scrape.samples.get(name + suffix, ()):
                    d = dict(labels)
                    if self.model_label in d and matches_labels(labels, {}, self.label_filter):
                        return d[self.model_label]
        return None

    def _map_field(self, name: str, specs: tuple[Spec, ...], scrape: Scrape, now: float,
                   ttl: float) -> FieldValue | None:
        for spec in specs:
            got = self._evaluate(spec, scrape)
            if got is None:
                continue  # this alternative's metrics are not in the scrape: try the next
            value, origin, window = got
            if value is None:
                return None  # present but no value this time: absent, no fall-through
            try:
                return FieldValue.observed(value, source=Source.BACKEND_MEASURED, at=now,
                                           ttl_s=ttl, origin=origin, window_s=window)
            except ValueError:
                return None
        return None

    def _evaluate(self, spec: Spec, scrape: Scrape) -> tuple[Any, str, float | None] | None:
        """None: metrics absent. (None, origin, w): present, no value. (v, origin, w): value."""
        lf = self.label_filter
        if isinstance(spec, Gauge):
            return self._gauge(spec, scrape)
        if isinstance(spec, GaugeRatio):
            num, den = self._gauge(spec.numerator, scrape), self._gauge(spec.denominator, scrape)
            if num is None or den is None:
                return None
            origin = f"{num[1]} / {den[1]}"
            if num[0] is None or den[0] is None or den[0] <= 0:
                return None, origin, None
            return num[0] / den[0], origin, None
        if isinstance(spec, CounterRatio | CounterDelta):
            names = spec.names if isinstance(spec, CounterDelta) else spec.numerator
            cur = counter_sum(scrape, names, spec.select, lf)
            if cur is None:
                return None
            origin = cur[0]
            if isinstance(spec, CounterRatio):
                den = counter_sum(scrape, spec.denominator, spec.select, lf)
                if den is None:
                    return None
                origin = f"delta {cur[0]} / delta {den[0]}"
            if self._prev is None:
                return None, origin, None
            window = self._window()
            d_num = counter_delta(cur, counter_sum(self._prev, names, spec.select, lf))
            if isinstance(spec, CounterDelta):
                return (None if d_num is None else d_num * spec.scale), f"delta {origin}", window
            d_den = counter_delta(den, counter_sum(self._prev, spec.denominator, spec.select, lf))
            if d_num is None or d_den is None or d_den <= 0 or d_num > d_den:
                return None, origin, window
            return d_num / d_den, origin, window
        if isinstance(spec, HistogramSummary):
            return self._histogram(spec, scrape)
        raise TypeError(f"unknown spec {spec!r}")

    def _window(self) -> float | None:
        return self._window_s

    def _gauge(self, spec: Gauge, scrape: Scrape) -> tuple[float | None, str, None] | None:
        found = scrape.series(spec.names, spec.select, self.label_filter, counter=True)
        if found is None:
            return None
        name, rows = found
        values = [v for _, v in rows if math.isfinite(v)]
        origin = name + selector_text(spec.select)
        if not values:
            return None, origin, None
        agg = {"sum": sum(values), "max": max(values),
               "mean": sum(values) / len(values)}[spec.agg]
        return agg * spec.scale, origin, None

    def _histogram(self, spec: HistogramSummary, scrape: Scrape
                   ) -> tuple[LatencySummary | None, str, float | None] | None:
        found = histogram_series(scrape, spec.names, spec.select, self.label_filter)
        if found is None:
            return None
        name, cur = found
        if self.config.histogram_window == "cumulative":
            window, got = None, histogram_window(cur, None)
        else:
            if self._prev is None:
                return None, name, None
            window = self._window()
            prev = histogram_series(self._prev, spec.names, spec.select, self.label_filter)
            if prev is None or prev[0] != name:
                return None, name, window
            got = histogram_window(cur, prev[1])  # None on a reset
        if got is None:
            return None, name, window
        ordered, total_sum, count = got
        if count <= 0 or not ordered:
            return None, name, window
        qs = [histogram_quantile(q, ordered) for q in (0.5, 0.9, 0.99)]
        if any(x is None for x in qs):
            return None, name, window
        s = spec.scale
        try:
            summary = LatencySummary(p50=qs[0] * s, p90=qs[1] * s, p99=qs[2] * s,
                                     mean=max(total_sum, 0.0) / count * s, count=count)
        except ValueError:
            return None, name, window
        return summary, name, window
