"""LEGACY: the fluid autoscaling experiment's replica messages (forecast/experiments.py only).

Superseded by `replaylab.fleet.events` (one Recommendation / Acknowledgement /
Actuation / Outcome model, signed with the manifests' helper) and
`replaylab.fleet.recommendations`; this module goes when the autoscaling entry
point is rewired to `replaylab.fleet.autoscaling_experiment`. It already signs
with the shared `replaylab.artifacts.manifest.canonical_json` / `hmac_sha256`.

Advise-only replica recommendations: signed, versioned messages and their event log.

A recommendation says "pool P should have N replicas from `valid_from_ms` until
`valid_until_ms`", with the forecast it came from. It is signed with
HMAC-SHA256 over its canonical JSON (sorted keys, no whitespace, UTF-8) using a
key the caller passes; nothing here reads a key from the environment. It never
actuates: a consumer (the proactive policy, standing in for the serving layer)
verifies it, acknowledges it, and may actuate it; each step is a separate event
in an append-only `EventLog`:

    recommended   the advisor issued a message
    acknowledged  a consumer accepted a verified, fresh message (once per message)
    actuated      the consumer changed the replica count following a message
    rolled_back   an actuation was reverted (SLO drop, or an operator request)
    fallback      the consumer used reactive control instead, with the reason
                  (`missing`, `stale`, `bad_signature`, `bad_version`, `wrong_pool`)
"""

from __future__ import annotations

import bisect
import dataclasses
import hmac
from dataclasses import dataclass
from typing import Any

from replaylab.artifacts.manifest import canonical_json, hmac_sha256

MESSAGE_VERSION = "replica-recommendation-v1"
EVENT_TYPES = ("recommended", "acknowledged", "actuated", "rolled_back", "fallback")
FALLBACK_REASONS = ("missing", "stale", "bad_signature", "bad_version", "wrong_pool")


@dataclass(frozen=True)
class Recommendation:
    """One advise-only message; `signature` covers every other field."""

    message_id: str
    pool: str
    replicas: int
    valid_from_ms: int
    valid_until_ms: int
    issued_at_ms: int
    forecast_version: str
    forecaster: str
    quantile: float
    version: str = MESSAGE_VERSION
    advise_only: bool = True
    signature: str = ""

    def body(self) -> dict[str, Any]:
        """Every field but the signature (what the signature covers)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "signature"}


__all__ = ["EVENT_TYPES", "FALLBACK_REASONS", "MESSAGE_VERSION", "Event", "EventLog",
           "Recommendation", "RecommendationInbox", "canonical_json", "from_dict",
           "recommendations_from_forecast", "sign", "to_dict", "verify"]


def _mac(body: dict[str, Any], key: bytes) -> str:
    if not isinstance(key, (bytes, bytearray)) or not key:
        raise ValueError("an HMAC key must be non-empty bytes")
    return hmac_sha256(body, bytes(key))


def sign(message: Recommendation, key: bytes) -> Recommendation:
    """The message with its HMAC-SHA256 signature."""
    return dataclasses.replace(message, signature=_mac(message.body(), key))


def verify(message: Recommendation | dict, key: bytes) -> bool:
    """True when the signature matches the canonical JSON of the other fields."""
    if isinstance(message, Recommendation):
        body, sig = message.body(), message.signature
    else:
        body = {k: v for k, v in message.items() if k != "signature"}
        sig = message.get("signature", "")
    try:
        return hmac.compare_digest(_mac(body, key), str(sig))
    except (TypeError, ValueError):
        return False


def to_dict(message: Recommendation) -> dict[str, Any]:
    return dataclasses.asdict(message)


def from_dict(d: dict[str, Any]) -> Recommendation:
    return Recommendation(**d)


@dataclass(frozen=True)
class Event:
    type: str
    t_ms: int
    pool: str
    message_id: str | None
    detail: dict


class EventLog:
    """Append-only: events can be added and read, never changed or removed."""

    def __init__(self) -> None:
        self._events: list[Event] = []

    def append(self, type: str, t_ms: int, pool: str, message_id: str | None = None,
               **detail: Any) -> Event:
        if type not in EVENT_TYPES:
            raise ValueError(f"event type {type!r}; one of {EVENT_TYPES}")
        if type == "fallback" and detail.get("reason") not in FALLBACK_REASONS:
            raise ValueError(f"fallback reason {detail.get('reason')!r}; one of "
                             f"{FALLBACK_REASONS}")
        e = Event(type, int(t_ms), pool, message_id, dict(detail))
        self._events.append(e)
        return e

    @property
    def events(self) -> tuple[Event, ...]:
        return tuple(self._events)

    def of_type(self, type: str) -> list[Event]:
        return [e for e in self._events if e.type == type]

    def counts(self) -> dict[str, int]:
        return {t: sum(e.type == t for e in self._events) for t in EVENT_TYPES}


class RecommendationInbox:
    """Messages a consumer has received, ordered by `valid_from_ms`; `select` checks them."""

    def __init__(self, messages: list[Recommendation] | tuple = ()) -> None:
        self._msgs = sorted(messages, key=lambda m: (m.valid_from_ms, m.issued_at_ms))
        self._starts = [m.valid_from_ms for m in self._msgs]
        # longest validity: messages starting earlier than t - this have all expired at t
        self._span = max((m.valid_until_ms - m.valid_from_ms for m in self._msgs), default=0)
        self._checked: dict[tuple[int, bytes], bool] = {}  # messages are frozen: check once

    def _verified(self, i: int, key: bytes) -> bool:
        if (i, key) not in self._checked:
            self._checked[(i, key)] = verify(self._msgs[i], key)
        return self._checked[(i, key)]

    def __len__(self) -> int:
        return len(self._msgs)

    def select(self, t_ms: int, key: bytes, pool: str) -> tuple[Recommendation | None, str]:
        """The highest-replica verified message valid at `t_ms` for `pool`, or the reason why
        there is none: a failed check of a covering message (`wrong_pool`, `bad_version`,
        `bad_signature`), else `stale` when earlier messages were received and all have
        expired, else `missing`. An inbox holds one pool's messages."""
        hi = bisect.bisect_right(self._starts, t_ms)
        lo = bisect.bisect_right(self._starts, t_ms - self._span)
        covering, problem, expired = [], None, lo > 0
        for i in range(lo, hi):
            m = self._msgs[i]
            if m.issued_at_ms > t_ms:
                continue
            if t_ms >= m.valid_until_ms:
                expired = True
            elif m.pool != pool:
                problem = problem or "wrong_pool"
            elif m.version != MESSAGE_VERSION:
                problem = "bad_version"
            elif not self._verified(i, key):
                problem = "bad_signature"
            else:
                covering.append(m)
        if covering:
            return max(covering, key=lambda m: (m.replicas, m.issued_at_ms)), "ok"
        if problem:
            return None, problem
        return None, "stale" if expired else "missing"


def recommendations_from_forecast(forecast, *, pool: str, quantile: float, replicas_for_rate,
                                  lead_s: float, key: bytes, events: EventLog,
                                  forecast_version: str) -> list[Recommendation]:
    """One signed message per forecast bucket (aggregates-v1 forecast rows).

    replicas = replicas_for_rate(requests_q / bucket_seconds); valid from the
    bucket start minus `lead_s` (cold start + sync, so replicas are ready when
    the bucket begins) to the bucket end; issued at the forecast origin, which
    must not be later than `valid_from` (else the forecast came too late to use).
    """
    col = f"requests_q{round(quantile * 100):02d}"
    if col not in forecast:
        raise ValueError(f"forecast has no column {col!r} for quantile={quantile}")
    out = []
    for row in forecast.itertuples(index=False):
        start, width = int(row.bucket_start), int(row.bucket_seconds)
        valid_from = start - int(lead_s * 1000)
        origin = int(row.forecast_origin)
        if origin > valid_from:
            raise ValueError(f"forecast for bucket {start} has origin {origin} after "
                             f"valid_from {valid_from}: raise horizon_buckets")
        msg = sign(Recommendation(
            message_id=f"{pool}:{start}:{forecast_version}", pool=pool,
            replicas=int(replicas_for_rate(getattr(row, col) / width)),
            valid_from_ms=valid_from, valid_until_ms=start + width * 1000,
            issued_at_ms=origin, forecast_version=forecast_version,
            forecaster=str(row.forecaster), quantile=float(quantile)), key)
        events.append("recommended", origin, pool, msg.message_id, replicas=msg.replicas,
                      valid_from_ms=msg.valid_from_ms, valid_until_ms=msg.valid_until_ms)
        out.append(msg)
    return out
