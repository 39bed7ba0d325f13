"""Recommendation, acknowledgement, actuation and outcome: four separate logged events (events-v1).

A policy *recommends* and never acts; the serving layer *acknowledges* the
recommendation (accepts or rejects it, and says who decided); an actuator records
what it *actually applied*, which may differ from what was recommended; an
*outcome* is measured or modeled afterwards. Keeping the four apart means
"the policy said scale to 4" is never logged as "the pool has 4 replicas", and a
report can count recommendations that were rejected, applied late or failed.

Links. Every event carries `recommendation_id`; an actuation has its own
`actuation_id`, which an outcome may cite. `EventLog.append` enforces, in order:
- ids are unique per kind; timestamps are finite seconds on one clock;
- an acknowledgement needs a logged recommendation, at most one per
  recommendation, not before it;
- an actuation needs a logged recommendation with an *accepted* acknowledgement,
  not before that acknowledgement, and not after the recommendation's
  `expires_at` (a stale recommendation is not actuated);
- an outcome needs a logged recommendation; its `actuation_id`, if given, must be
  a logged actuation of the same recommendation; an outcome without an actuation
  is allowed (what happened to a rejected recommendation's target).
A violation raises `EventLinkError` and leaves the log unchanged.

JSONL: one event per line, `{"schema_version": "1", "kind": ..., ...}`; reading
replays every line through the same checks. Standard library only; files are
written only to a path the caller hands over.

Signing. A recommendation may carry `signature`: the hex HMAC-SHA256 of the
canonical JSON of its event dict without `signature` (`sign_recommendation`,
`verify_recommendation`), with the same helper that signs artifact manifests
(`replaylab.contracts.manifest.hmac_sha256`). A consumer that acts on
recommendations checks it (`recommendation_problem`) and refuses an unsigned,
tampered, expired or not-yet-valid one; the key is handed in by the caller.

This is the contract only (floor 0): the policies that emit recommendations and the
consumers that act on them live in the fleet (`replaylab.fleet.control`:
recommendations.py, controllers.py); docs/specs/telemetry.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

from replaylab.contracts.manifest import hmac_sha256, hmac_sha256_matches

EVENTS_SCHEMA_VERSION = "1"
ACTUATION_STATUSES = ("applied", "partial", "failed")
OUTCOME_SOURCES = ("measured", "modeled")


class EventLinkError(ValueError):
    """An event that breaks the recommendation -> ack -> actuation -> outcome chain."""


class EventSchemaError(ValueError):
    """A serialized event that is not events-v1 (the message names the field)."""


def _nonempty(cls: str, name: str, v: Any) -> None:
    if not isinstance(v, str) or not v:
        raise ValueError(f"{cls}.{name}={v!r}: must be a non-empty string")


def _time(cls: str, name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"{cls}.{name}={v!r}: must be a finite number of seconds")


def _json_mapping(obj: Any, cls: str, name: str) -> None:
    """Freeze a JSON-serializable mapping field in place."""
    v = getattr(obj, name)
    if not isinstance(v, Mapping):
        raise ValueError(f"{cls}.{name}: must be a mapping, got {type(v).__name__}")
    try:
        json.dumps(dict(v), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{cls}.{name}: must be JSON-serializable ({e})") from e
    object.__setattr__(obj, name, MappingProxyType(dict(v)))


@dataclass(frozen=True)
class Recommendation:
    """What a policy proposes, e.g. action="scale_pool", target="pool-a", params={"replicas": 4}.

    telemetry: what the policy saw, e.g. {"replica-1": "fresh", "replica-2": "stale"};
    expires_at: after this the recommendation must not be actuated (None: never expires);
    valid_from: not to be actuated before this (None: from `at`);
    signature: hex HMAC-SHA256 over every other field ("" = unsigned; see the module doc).
    """

    kind: ClassVar[str] = "recommendation"
    recommendation_id: str
    at: float
    policy: str
    action: str
    target: str
    params: Mapping[str, Any] = field(default_factory=dict)
    reason: str = ""
    telemetry: Mapping[str, Any] = field(default_factory=dict)
    expires_at: float | None = None
    valid_from: float | None = None
    signature: str = ""

    def __post_init__(self) -> None:
        for n in ("recommendation_id", "policy", "action", "target"):
            _nonempty("Recommendation", n, getattr(self, n))
        _time("Recommendation", "at", self.at)
        if self.expires_at is not None:
            _time("Recommendation", "expires_at", self.expires_at)
            if self.expires_at <= self.at:
                raise ValueError(f"Recommendation.expires_at={self.expires_at!r}: must be after "
                                 f"at={self.at!r}")
        if self.valid_from is not None:
            _time("Recommendation", "valid_from", self.valid_from)
            if self.expires_at is not None and self.valid_from >= self.expires_at:
                raise ValueError(f"Recommendation.valid_from={self.valid_from!r}: must be "
                                 f"before expires_at={self.expires_at!r}")
        if not isinstance(self.signature, str):
            raise ValueError(f"Recommendation.signature={self.signature!r}: must be a string")
        _json_mapping(self, "Recommendation", "params")
        _json_mapping(self, "Recommendation", "telemetry")


@dataclass(frozen=True)
class RecommendationDecision:
    """The serving layer's answer to a recommendation (events-v1 kind "acknowledgement"):
    accepted or not, by whom (an operator, "auto", a guard)."""

    kind: ClassVar[str] = "acknowledgement"
    recommendation_id: str
    at: float
    accepted: bool
    by: str
    reason: str = ""

    def __post_init__(self) -> None:
        _nonempty("RecommendationDecision", "recommendation_id", self.recommendation_id)
        _nonempty("RecommendationDecision", "by", self.by)
        _time("RecommendationDecision", "at", self.at)
        if not isinstance(self.accepted, bool):
            raise ValueError(f"RecommendationDecision.accepted={self.accepted!r}: must be a bool")


@dataclass(frozen=True)
class Actuation:
    """What was actually applied (may differ from what was recommended).

    status: applied | partial | failed.
    """

    kind: ClassVar[str] = "actuation"
    actuation_id: str
    recommendation_id: str
    at: float
    action: str
    target: str
    params: Mapping[str, Any] = field(default_factory=dict)
    status: str = "applied"
    detail: str = ""

    def __post_init__(self) -> None:
        for n in ("actuation_id", "recommendation_id", "action", "target"):
            _nonempty("Actuation", n, getattr(self, n))
        _time("Actuation", "at", self.at)
        if self.status not in ACTUATION_STATUSES:
            raise ValueError(f"Actuation.status={self.status!r}: must be one of "
                             f"{ACTUATION_STATUSES}")
        _json_mapping(self, "Actuation", "params")


@dataclass(frozen=True)
class Outcome:
    """What followed, e.g. metrics={"ttft_p99_s": 0.8, "energy_j": 1.2e6} over window_s."""

    kind: ClassVar[str] = "outcome"
    outcome_id: str
    recommendation_id: str
    at: float
    metrics: Mapping[str, float]
    source: str
    actuation_id: str | None = None
    window_s: float | None = None

    def __post_init__(self) -> None:
        for n in ("outcome_id", "recommendation_id"):
            _nonempty("Outcome", n, getattr(self, n))
        if self.actuation_id is not None:
            _nonempty("Outcome", "actuation_id", self.actuation_id)
        _time("Outcome", "at", self.at)
        if self.source not in OUTCOME_SOURCES:
            raise ValueError(f"Outcome.source={self.source!r}: must be one of {OUTCOME_SOURCES}")
        if self.window_s is not None and (isinstance(self.window_s, bool) or not isinstance(
                self.window_s, int | float) or not math.isfinite(self.window_s)
                or self.window_s <= 0):
            raise ValueError(f"Outcome.window_s={self.window_s!r}: must be a positive number")
        if not isinstance(self.metrics, Mapping):
            raise ValueError("Outcome.metrics: must be a mapping of name -> number")
        for k, v in self.metrics.items():
            if (not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int | float)
                    or not math.isfinite(v)):
                raise ValueError(f"Outcome.metrics[{k!r}]={v!r}: must be a finite number")
        object.__setattr__(self, "metrics", MappingProxyType(dict(self.metrics)))


Event = Recommendation | RecommendationDecision | Actuation | Outcome
EVENT_TYPES: Mapping[str, type] = MappingProxyType(
    {c.kind: c for c in (Recommendation, RecommendationDecision, Actuation, Outcome)})


def event_to_dict(event: Event) -> dict[str, Any]:
    d = {f.name: getattr(event, f.name) for f in fields(event)}  # type: ignore[arg-type]
    d = {k: dict(v) if isinstance(v, Mapping) else v for k, v in d.items()}
    return {"schema_version": EVENTS_SCHEMA_VERSION, "kind": event.kind, **d}


def event_to_json(event: Event) -> str:
    return json.dumps(event_to_dict(event), sort_keys=True, separators=(",", ":"),
                      allow_nan=False)


def _signed_body(rec: Recommendation) -> dict[str, Any]:
    return {k: v for k, v in event_to_dict(rec).items() if k != "signature"}


def sign_recommendation(rec: Recommendation, key: bytes) -> Recommendation:
    """`rec` with `signature` = HMAC-SHA256 of its canonical JSON without the signature."""
    if not isinstance(key, bytes | bytearray) or not key:
        raise ValueError("sign_recommendation: the key must be non-empty bytes")
    return replace(rec, signature=hmac_sha256(_signed_body(rec), bytes(key)))


def verify_recommendation(rec: Recommendation, key: bytes) -> bool:
    """True when `rec.signature` matches its other fields under `key` (False if unsigned)."""
    return bool(key) and hmac_sha256_matches(_signed_body(rec), bytes(key), rec.signature)


REFUSALS = ("unsigned", "bad_signature", "expired", "not_yet_valid", "wrong_target")


def signature_problem(rec: Recommendation, key: bytes, target: str | None = None) -> str | None:
    """"unsigned", "bad_signature" (wrong key or a field changed after signing),
    "wrong_target", or None: the checks that do not depend on the time."""
    if not rec.signature:
        return "unsigned"
    if not verify_recommendation(rec, key):
        return "bad_signature"
    if target is not None and rec.target != target:
        return "wrong_target"
    return None


def recommendation_problem(rec: Recommendation, key: bytes, now: float,
                           target: str | None = None) -> str | None:
    """Why a consumer must not act on `rec` at `now` (one of REFUSALS), or None if it may."""
    problem = signature_problem(rec, key, target)
    if problem is not None:
        return problem
    if rec.expires_at is not None and now >= rec.expires_at:
        return "expired"
    if now < (rec.at if rec.valid_from is None else max(rec.at, rec.valid_from)):
        return "not_yet_valid"
    return None


def event_from_dict(d: Any) -> Event:
    if not isinstance(d, dict):
        raise EventSchemaError(f"event: expected an object, got {type(d).__name__}")
    if d.get("schema_version") != EVENTS_SCHEMA_VERSION:
        raise EventSchemaError(f"event.schema_version={d.get('schema_version')!r}: this code "
                               f"reads version {EVENTS_SCHEMA_VERSION!r} only")
    cls = EVENT_TYPES.get(d.get("kind"))  # type: ignore[arg-type]
    if cls is None:
        raise EventSchemaError(f"event.kind={d.get('kind')!r}: must be one of {list(EVENT_TYPES)}")
    body = {k: v for k, v in d.items() if k not in ("schema_version", "kind")}
    names = {f.name for f in fields(cls)}
    if set(body) - names:
        raise EventSchemaError(f"{cls.kind}: unknown field(s) {sorted(set(body) - names)}")
    try:
        return cls(**body)
    except (TypeError, ValueError) as e:
        raise EventSchemaError(f"{cls.kind}: {e}") from e


def event_from_json(line: str) -> Event:
    try:
        d = json.loads(line)
    except json.JSONDecodeError as e:
        raise EventSchemaError(f"event: not valid JSON ({e})") from e
    return event_from_dict(d)


@dataclass
class _Chain:
    recommendation: Recommendation
    acknowledgement: RecommendationDecision | None = None
    actuations: list[Actuation] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)


class EventLog:
    """Append-only, in-memory event log that enforces the links (see module docstring)."""

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._chains: dict[str, _Chain] = {}
        self._actuations: dict[str, Actuation] = {}
        self._outcomes: set[str] = set()

    def __len__(self) -> int:
        return len(self._events)

    @property
    def events(self) -> tuple[Event, ...]:
        return tuple(self._events)

    def has(self, recommendation_id: str) -> bool:
        """Whether a recommendation with this id is logged."""
        return recommendation_id in self._chains

    def counts(self) -> dict[str, int]:
        """Events per kind (every kind listed, zeros included)."""
        out = dict.fromkeys(EVENT_TYPES, 0)
        for e in self._events:
            out[e.kind] += 1
        return out

    def of_kind(self, kind: str) -> list[Event]:
        return [e for e in self._events if e.kind == kind]

    def chain(self, recommendation_id: str) -> dict[str, Any]:
        """{recommendation, acknowledgement, actuations, outcomes} of one recommendation."""
        c = self._chains.get(recommendation_id)
        if c is None:
            raise KeyError(f"no recommendation {recommendation_id!r}")
        return {"recommendation": c.recommendation, "acknowledgement": c.acknowledgement,
                "actuations": tuple(c.actuations), "outcomes": tuple(c.outcomes)}

    def append(self, event: Event) -> Event:
        if isinstance(event, Recommendation):
            if event.recommendation_id in self._chains:
                raise EventLinkError(f"recommendation {event.recommendation_id!r} already logged")
            self._chains[event.recommendation_id] = _Chain(event)
        elif isinstance(event, RecommendationDecision):
            c = self._need(event)
            if c.acknowledgement is not None:
                raise EventLinkError(f"recommendation {event.recommendation_id!r} is already "
                                     f"acknowledged")
            self._not_before(event, c.recommendation.at, "its recommendation")
            c.acknowledgement = event
        elif isinstance(event, Actuation):
            c = self._need(event)
            if event.actuation_id in self._actuations:
                raise EventLinkError(f"actuation {event.actuation_id!r} already logged")
            ack = c.acknowledgement
            if ack is None or not ack.accepted:
                state = "not acknowledged" if ack is None else "rejected"
                raise EventLinkError(f"actuation {event.actuation_id!r}: recommendation "
                                     f"{event.recommendation_id!r} is {state}")
            self._not_before(event, ack.at, "its acknowledgement")
            exp = c.recommendation.expires_at
            if exp is not None and event.at > exp:
                raise EventLinkError(f"actuation {event.actuation_id!r} at {event.at} is after "
                                     f"recommendation {event.recommendation_id!r} expired at {exp}")
            c.actuations.append(event)
            self._actuations[event.actuation_id] = event
        elif isinstance(event, Outcome):
            c = self._need(event)
            if event.outcome_id in self._outcomes:
                raise EventLinkError(f"outcome {event.outcome_id!r} already logged")
            if event.actuation_id is not None:
                act = self._actuations.get(event.actuation_id)
                if act is None or act.recommendation_id != event.recommendation_id:
                    raise EventLinkError(f"outcome {event.outcome_id!r}: actuation "
                                         f"{event.actuation_id!r} is not an actuation of "
                                         f"recommendation {event.recommendation_id!r}")
                self._not_before(event, act.at, "its actuation")
            else:
                self._not_before(event, c.recommendation.at, "its recommendation")
            c.outcomes.append(event)
            self._outcomes.add(event.outcome_id)
        else:
            raise TypeError(f"not an event: {type(event).__name__}")
        self._events.append(event)
        return event

    def _need(self, event: Event) -> _Chain:
        c = self._chains.get(event.recommendation_id)
        if c is None:
            raise EventLinkError(f"{event.kind} for unknown recommendation "
                                 f"{event.recommendation_id!r}")
        return c

    @staticmethod
    def _not_before(event: Event, t: float, what: str) -> None:
        if event.at < t:
            raise EventLinkError(f"{event.kind} at {event.at} is before {what} at {t}")

    # --- JSONL ------------------------------------------------------------------------
    def to_jsonl(self) -> str:
        return "".join(event_to_json(e) + "\n" for e in self._events)

    def write_jsonl(self, path: Path) -> Path:
        path = Path(path)
        path.write_text(self.to_jsonl(), encoding="utf-8")
        return path

    @classmethod
    def from_jsonl(cls, lines: str | Iterable[str]) -> EventLog:
        """Replay JSONL through `append`; errors name the line number."""
        log = cls()
        it = lines.splitlines() if isinstance(lines, str) else lines
        for i, line in enumerate(it, 1):
            if not line.strip():
                continue
            try:
                log.append(event_from_json(line))
            except (EventSchemaError, EventLinkError) as e:
                raise type(e)(f"line {i}: {e}") from e
        return log

    @classmethod
    def read_jsonl(cls, path: Path) -> EventLog:
        return cls.from_jsonl(Path(path).read_text(encoding="utf-8"))
