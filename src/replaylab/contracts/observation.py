"""Engine-neutral replica telemetry: the observation-v1 contract (versioned, TTL-bound).

An `Observation` is what the serving layer knows about one replica at one instant:
its identity (replica, pool, engine and version, model) and a mapping of named
fields (`ObsField`). Every field is a `FieldValue` carrying

    value        number, `LatencySummary` or `Health` (see `FIELD_SPECS` for kind and unit)
    source       `Source`: router_observed | backend_measured | modeled
    observed_at  seconds on the caller's clock (simulator time, or time.monotonic()
                 in a live poller: one clock per store, never mixed)
    expires_at   observed_at + TTL, same clock
    supported    whether the engine can give this field at all
    origin       the metric(s) it came from, e.g. "vllm:num_requests_waiting"
    window_s     for windowed values (rates, histogram summaries, energy): the
                 seconds between the two scrapes the value was computed from

Three rules the API enforces rather than documents:

1. Absent, never fabricated. A field the engine cannot give is present with
   `supported=False` and no value; a field the engine can give but did not this
   time (a rate before its second scrape, a histogram with no new samples) is not
   in `fields` at all. Nothing fills either with a default.
2. Stale is unreadable. A value is reached only through `FieldValue.read(now)` or
   `Observation.get(name, now)`, which return None once `now >= expires_at`; the
   stored value is private and there is no accessor that skips the clock check.
   `status(name, now)` says why a read came back empty (stale, missing, unsupported).
3. Versioned. JSON carries `schema_version`; `Observation.from_json` refuses any
   other version and names the offending path on every malformed value.

Pure standard library; no I/O. This is the contract only (floor 0): what produces
observations lives in the fleet, the simulator's modeled feed in
`replaylab.fleet.telemetry.feed` and the adapters that build them from Prometheus text
in `replaylab.fleet.telemetry.adapters`; see docs/specs/telemetry.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

OBSERVATION_SCHEMA_VERSION = "1"
OBSERVATION_KIND = "observation"


class ObservationSchemaError(ValueError):
    """A serialized observation that does not satisfy observation-v1; the message names the path."""


class Source(StrEnum):
    """Where a field's value came from."""

    ROUTER_OBSERVED = "router_observed"    # seen by the router/poller itself (scrape outcome)
    BACKEND_MEASURED = "backend_measured"  # reported by the engine's own metrics
    MODELED = "modeled"                    # produced by a model or the simulator


class Health(StrEnum):
    """Replica health as the poller sees it (router_observed)."""

    HEALTHY = "healthy"      # last scrape parsed and carried the engine's metrics
    UNHEALTHY = "unhealthy"  # repeated scrape failures (poller threshold)
    UNKNOWN = "unknown"      # scrape failed, timed out, or was unreadable


class FieldStatus(StrEnum):
    """Why a read returned a value or not."""

    FRESH = "fresh"
    STALE = "stale"              # reported, but now >= expires_at
    MISSING = "missing"          # supported, not reported in this observation
    UNSUPPORTED = "unsupported"  # the engine cannot give this field


class Freshness(StrEnum):
    """Replica-level freshness for deterministic stale-telemetry fallbacks."""

    FRESH = "fresh"
    STALE = "stale"
    MISSING = "missing"


class ObsField:
    """Field names of observation-v1 (constants, not literals sprinkled around)."""

    HEALTH = "health"
    QUEUE_DEPTH = "queue_depth"
    RUNNING_REQUESTS = "running_requests"
    KV_CACHE_USAGE = "kv_cache_usage"
    PREFIX_CACHE_HIT_RATE = "prefix_cache_hit_rate"
    TTFT_SECONDS = "ttft_seconds"
    TPOT_SECONDS = "tpot_seconds"
    POWER_WATTS = "power_watts"
    ENERGY_JOULES = "energy_joules"


@dataclass(frozen=True)
class FieldSpec:
    """kind: count | fraction | nonneg | latency_summary | health; unit for docs."""

    kind: str
    unit: str
    description: str


FIELD_SPECS: Mapping[str, FieldSpec] = MappingProxyType({
    ObsField.HEALTH: FieldSpec("health", "", "scrape outcome: healthy / unhealthy / unknown"),
    ObsField.QUEUE_DEPTH: FieldSpec("count", "requests", "requests waiting to be scheduled"),
    ObsField.RUNNING_REQUESTS: FieldSpec("count", "requests", "requests in the running batch"),
    ObsField.KV_CACHE_USAGE: FieldSpec("fraction", "0-1", "fraction of KV-cache capacity in use"),
    ObsField.PREFIX_CACHE_HIT_RATE: FieldSpec(
        "fraction", "0-1", "prefix-cache token hit rate over window_s"),
    ObsField.TTFT_SECONDS: FieldSpec("latency_summary", "s", "time to first token, over window_s"),
    ObsField.TPOT_SECONDS: FieldSpec(
        "latency_summary", "s", "time per output token / inter-token latency, over window_s"),
    ObsField.POWER_WATTS: FieldSpec("nonneg", "W", "instantaneous GPU power, summed over GPUs"),
    ObsField.ENERGY_JOULES: FieldSpec("nonneg", "J", "GPU energy consumed during window_s"),
})

# Fields that describe load; `freshness` judges a replica by these.
LOAD_FIELDS = (ObsField.QUEUE_DEPTH, ObsField.RUNNING_REQUESTS, ObsField.KV_CACHE_USAGE)


def _finite(x: Any, what: str, minimum: float | None = None, maximum: float | None = None) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        raise ValueError(f"{what} must be a finite number, got {x!r}")
    if minimum is not None and x < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {x!r}")
    if maximum is not None and x > maximum:
        raise ValueError(f"{what} must be <= {maximum}, got {x!r}")
    return float(x)


@dataclass(frozen=True)
class LatencySummary:
    """Quantiles (seconds) of a latency distribution over a window; count = samples in it."""

    p50: float
    p90: float
    p99: float
    mean: float
    count: float

    def __post_init__(self) -> None:
        for name in ("p50", "p90", "p99", "mean"):
            _finite(getattr(self, name), f"LatencySummary.{name}", minimum=0.0)
        _finite(self.count, "LatencySummary.count", minimum=0.0)
        if self.count <= 0:
            raise ValueError(f"LatencySummary.count must be > 0, got {self.count!r}")
        if not self.p50 <= self.p90 <= self.p99:
            raise ValueError(f"LatencySummary quantiles must be ordered, got "
                             f"p50={self.p50!r} p90={self.p90!r} p99={self.p99!r}")

    def to_dict(self) -> dict[str, float]:
        return {"p50": self.p50, "p90": self.p90, "p99": self.p99, "mean": self.mean,
                "count": self.count}


def _check_value(name: str, value: Any) -> Any:
    """Validate `value` against FIELD_SPECS[name]; returns the canonical value."""
    spec = FIELD_SPECS[name]
    what = f"field {name!r}"
    if spec.kind == "health":
        try:
            return Health(value)
        except ValueError:
            raise ValueError(f"{what} must be one of {[h.value for h in Health]}, "
                             f"got {value!r}") from None
    if spec.kind == "latency_summary":
        if not isinstance(value, LatencySummary):
            raise ValueError(f"{what} must be a LatencySummary, got {type(value).__name__}")
        return value
    if spec.kind == "fraction":
        return _finite(value, what, minimum=0.0, maximum=1.0)
    return _finite(value, what, minimum=0.0)  # count, nonneg


class FieldValue:
    """One field's value with provenance and expiry; immutable.

    The value is private: read it with `read(now)`, which returns None when the
    field is unsupported or `now >= expires_at`. Build with `FieldValue.observed`
    or `FieldValue.unsupported`; the constructor checks the invariants
    (supported <=> a value is present, expires_at > observed_at).
    """

    __slots__ = ("_value", "source", "observed_at", "expires_at", "supported", "origin",
                 "window_s")

    def __init__(self, value: Any, *, source: Source | str, observed_at: float,
                 expires_at: float, supported: bool = True, origin: str | None = None,
                 window_s: float | None = None) -> None:
        if not isinstance(supported, bool):
            raise ValueError(f"supported must be a bool, got {supported!r}")
        if supported and value is None:
            raise ValueError("a supported field carries a value; leave an unreported field "
                             "out of Observation.fields instead")
        if not supported and value is not None:
            raise ValueError("an unsupported field must not carry a value")
        try:
            src = Source(source)
        except ValueError:
            raise ValueError(f"source must be one of {[s.value for s in Source]}, "
                             f"got {source!r}") from None
        t0 = _finite(observed_at, "observed_at")
        t1 = _finite(expires_at, "expires_at")
        if t1 <= t0:
            raise ValueError(f"expires_at ({t1}) must be after observed_at ({t0})")
        if origin is not None and not isinstance(origin, str):
            raise ValueError(f"origin must be a string or None, got {origin!r}")
        if window_s is not None:
            window_s = _finite(window_s, "window_s", minimum=0.0)
        for slot, v in (("_value", value), ("source", src), ("observed_at", t0),
                        ("expires_at", t1), ("supported", supported), ("origin", origin),
                        ("window_s", window_s)):
            object.__setattr__(self, slot, v)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("FieldValue is immutable")

    @classmethod
    def observed(cls, value: Any, *, source: Source | str, at: float, ttl_s: float,
                 origin: str | None = None, window_s: float | None = None) -> FieldValue:
        """A value seen at `at`, readable until `at + ttl_s`."""
        _finite(ttl_s, "ttl_s", minimum=0.0)
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s!r}")
        return cls(value, source=source, observed_at=at, expires_at=at + ttl_s,
                   origin=origin, window_s=window_s)

    @classmethod
    def unsupported(cls, *, at: float, ttl_s: float, origin: str | None = None,
                    source: Source | str = Source.BACKEND_MEASURED) -> FieldValue:
        """The engine cannot give this field (origin may say why)."""
        return cls(None, source=source, observed_at=at, expires_at=at + ttl_s,
                   supported=False, origin=origin)

    def status(self, now: float) -> FieldStatus:
        if not self.supported:
            return FieldStatus.UNSUPPORTED
        return FieldStatus.FRESH if now < self.expires_at else FieldStatus.STALE

    def read(self, now: float) -> Any | None:
        """The value if fresh at `now`, else None (stale and unsupported read the same)."""
        return self._value if self.status(now) is FieldStatus.FRESH else None

    def to_dict(self) -> dict[str, Any]:
        v = self._value
        if isinstance(v, LatencySummary):
            v = v.to_dict()
        elif isinstance(v, Health):
            v = v.value
        return {"value": v, "source": self.source.value, "observed_at": self.observed_at,
                "expires_at": self.expires_at, "supported": self.supported,
                "origin": self.origin, "window_s": self.window_s}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FieldValue) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_dict(), sort_keys=True))

    def __repr__(self) -> str:
        return (f"FieldValue({self._value!r}, source={self.source.value}, "
                f"observed_at={self.observed_at}, expires_at={self.expires_at}, "
                f"supported={self.supported}, origin={self.origin!r})")


@dataclass(frozen=True)
class Observation:
    """Telemetry of one replica at `observed_at`; fields keyed by `ObsField` names."""

    replica_id: str
    pool_id: str
    engine: str
    engine_version: str | None
    model: str | None
    observed_at: float
    fields: Mapping[str, FieldValue] = field(default_factory=dict)
    schema_version: str = OBSERVATION_SCHEMA_VERSION

    def __post_init__(self) -> None:
        for name in ("replica_id", "pool_id", "engine"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v:
                raise ValueError(f"Observation.{name} must be a non-empty string, got {v!r}")
        for name in ("engine_version", "model"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                raise ValueError(f"Observation.{name} must be a string or None, got {v!r}")
        if self.schema_version != OBSERVATION_SCHEMA_VERSION:
            raise ValueError(f"Observation.schema_version={self.schema_version!r}: this code "
                             f"reads version {OBSERVATION_SCHEMA_VERSION!r}")
        _finite(self.observed_at, "Observation.observed_at")
        checked: dict[str, FieldValue] = {}
        for name, fv in dict(self.fields).items():
            if name not in FIELD_SPECS:
                raise ValueError(f"Observation.fields: unknown field {name!r}; "
                                 f"known: {', '.join(FIELD_SPECS)}")
            if not isinstance(fv, FieldValue):
                raise ValueError(f"Observation.fields[{name!r}] must be a FieldValue")
            if fv.supported:
                canonical = _check_value(name, fv._value)
                if canonical is not fv._value:
                    fv = FieldValue(canonical, source=fv.source, observed_at=fv.observed_at,
                                    expires_at=fv.expires_at, origin=fv.origin,
                                    window_s=fv.window_s)
            checked[name] = fv
        object.__setattr__(self, "fields", MappingProxyType(checked))

    # --- reads (the only way to a value) -----------------------------------------------
    def get(self, name: str, now: float) -> Any | None:
        """Fresh value of field `name` at `now`, or None (absent, stale or unsupported)."""
        fv = self._field(name)
        return None if fv is None else fv.read(now)

    def status(self, name: str, now: float) -> FieldStatus:
        fv = self._field(name)
        return FieldStatus.MISSING if fv is None else fv.status(now)

    def fresh_values(self, now: float) -> dict[str, Any]:
        """Every field readable at `now` (the stale, missing and unsupported are left out)."""
        return {n: fv.read(now) for n, fv in self.fields.items()
                if fv.status(now) is FieldStatus.FRESH}

    def supports(self, name: str) -> bool | None:
        """True/False when the observation says; None when the field is not in it."""
        fv = self._field(name)
        return None if fv is None else fv.supported

    def _field(self, name: str) -> FieldValue | None:
        if name not in FIELD_SPECS:
            raise KeyError(f"unknown observation field {name!r}; known: {', '.join(FIELD_SPECS)}")
        return self.fields.get(name)

    def with_fields(self, updates: Mapping[str, FieldValue]) -> Observation:
        """A copy with `updates` replacing (or adding) fields; other fields keep their expiry."""
        return Observation(self.replica_id, self.pool_id, self.engine, self.engine_version,
                           self.model, self.observed_at, {**self.fields, **updates})

    # --- serialization -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": self.schema_version, "kind": OBSERVATION_KIND,
                "replica_id": self.replica_id, "pool_id": self.pool_id,
                "engine": self.engine, "engine_version": self.engine_version,
                "model": self.model, "observed_at": self.observed_at,
                "fields": {n: fv.to_dict() for n, fv in sorted(self.fields.items())}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"),
                          allow_nan=False)

    @classmethod
    def from_dict(cls, d: Any) -> Observation:
        return _observation_from_dict(d)

    @classmethod
    def from_json(cls, text: str) -> Observation:
        try:
            d = json.loads(text, parse_constant=_reject_constant)
        except (json.JSONDecodeError, ValueError) as e:
            raise ObservationSchemaError(f"observation: not valid JSON ({e})") from e
        return _observation_from_dict(d)


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} is not allowed")


_TOP_KEYS = {"schema_version", "kind", "replica_id", "pool_id", "engine", "engine_version",
             "model", "observed_at", "fields"}
_FIELD_KEYS = {"value", "source", "observed_at", "expires_at", "supported", "origin", "window_s"}


def _observation_from_dict(d: Any) -> Observation:
    if not isinstance(d, dict):
        raise ObservationSchemaError(f"observation: expected an object, got {type(d).__name__}")
    version = d.get("schema_version")
    if version != OBSERVATION_SCHEMA_VERSION:
        raise ObservationSchemaError(
            f"observation.schema_version={version!r}: this code reads version "
            f"{OBSERVATION_SCHEMA_VERSION!r} only")
    if d.get("kind") != OBSERVATION_KIND:
        raise ObservationSchemaError(f"observation.kind={d.get('kind')!r}: expected "
                                     f"{OBSERVATION_KIND!r}")
    if set(d) != _TOP_KEYS:
        raise ObservationSchemaError(f"observation: missing {sorted(_TOP_KEYS - set(d))}, "
                                     f"unknown {sorted(set(d) - _TOP_KEYS)}")
    if not isinstance(d["fields"], dict):
        raise ObservationSchemaError("observation.fields: expected an object")
    fields: dict[str, FieldValue] = {}
    for name, fd in d["fields"].items():
        path = f"observation.fields.{name}"
        if name not in FIELD_SPECS:
            raise ObservationSchemaError(
                f"{path}: unknown field; known: {', '.join(FIELD_SPECS)}")
        if not isinstance(fd, dict) or set(fd) != _FIELD_KEYS:
            raise ObservationSchemaError(
                f"{path}: expected an object with keys {sorted(_FIELD_KEYS)}")
        value = fd["value"]
        if value is not None and FIELD_SPECS[name].kind == "latency_summary":
            if not isinstance(value, dict) or set(value) != {"p50", "p90", "p99", "mean", "count"}:
                raise ObservationSchemaError(f"{path}.value: expected p50/p90/p99/mean/count")
            try:
                value = LatencySummary(**value)
            except ValueError as e:
                raise ObservationSchemaError(f"{path}.value: {e}") from e
        try:
            fields[name] = FieldValue(value, source=fd["source"], observed_at=fd["observed_at"],
                                      expires_at=fd["expires_at"], supported=fd["supported"],
                                      origin=fd["origin"], window_s=fd["window_s"])
            if fields[name].supported:
                _check_value(name, value)
        except ValueError as e:
            raise ObservationSchemaError(f"{path}: {e}") from e
    try:
        return Observation(d["replica_id"], d["pool_id"], d["engine"], d["engine_version"],
                           d["model"], d["observed_at"], fields)
    except ValueError as e:
        raise ObservationSchemaError(f"observation: {e}") from e


def freshness(obs: Observation | None, now: float,
              fields: Iterable[str] = LOAD_FIELDS) -> Freshness:
    """Deterministic replica-level verdict for stale-telemetry fallbacks.

    missing: no observation, or none of `fields` was ever reported as supported;
    fresh:   every reported, supported field in `fields` is fresh at `now`;
    stale:   otherwise (at least one of them has expired).
    Unsupported fields are ignored: an engine without KV metrics is not stale.
    """
    if obs is None:
        return Freshness.MISSING
    statuses = [obs.status(n, now) for n in fields]
    reported = [s for s in statuses if s in (FieldStatus.FRESH, FieldStatus.STALE)]
    if not reported:
        return Freshness.MISSING
    return Freshness.FRESH if all(s is FieldStatus.FRESH for s in reported) else Freshness.STALE
