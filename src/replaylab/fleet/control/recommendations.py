"""Forecast quantiles -> signed scale recommendations, and the inbox a controller reads them from.

The advisor (`recommendations_from_forecast`) reads a forecast table in the
aggregates-v1 forecast form that `pipeline=forecast` writes
(`replaylab.forecast.future`: bucket_start, bucket_seconds, archetype, ...,
requests_q10 / q50 / q90, forecaster, forecast_origin, horizon_buckets; epoch
ms) and issues one events-v1 `Recommendation` per forecast bucket:

    replicas = ceil(sum over series of requests_q / bucket_seconds x work_s / target_util)
    valid_from = bucket start - lead_s (cold start + sync: replicas ready when it begins)
    expires_at = bucket end;  at (issued) = forecast_origin

Per bucket and series it uses the freshest forecast whose origin is no later
than `valid_from` (a forecast made later could not have been acted on in
time); buckets without one get no recommendation. Summing per-series
quantiles is conservative for q > 0.5 (exact when the series move together).
`work_s` may be one number or a mapping archetype -> replica-seconds (then a
per-archetype forecast sizes a changing mix; "all" or the default covers others).
Times become simulator seconds: (epoch ms - t0_ms) / 1000. Every message is
signed (`events.sign_recommendation`) with the key handed in.

`RecommendationInbox(recs, key, target, events)`: what a consumer received.
`select(now)` returns the highest-replica recommendation that covers `now`
(valid_from <= now < expires_at, issued by now) and passes
`events.signature_problem` (signed, untampered, for this target), or None
and the reason: the refusal of a covering one ("unsigned", "bad_signature",
"wrong_target"), else "expired" when earlier ones have all run out, else
"missing". Each recommendation is acknowledged once in `events`: accepted the
first time it is used, refused (with the reason) the first time it is refused.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

import pandas as pd

from replaylab.contracts.columns import Aggregates as A
from replaylab.contracts.events import (
    EventLog,
    Recommendation,
    RecommendationDecision,
    sign_recommendation,
    signature_problem,
)
from replaylab.forecast.rates import usable_in_time

ORIGIN, FORECASTER = "forecast_origin", "forecaster"
SCALE_POOL = "scale_pool"
CONSUMER = "forecast-controller"


def quantile_column(q: float) -> str:
    """requests_q10 / q50 / q90 ... : the forecast form's column of quantile q."""
    return f"requests_q{round(q * 100):02d}"


def _work(work_s: float | Mapping[str, float], archetype: str) -> float:
    if not isinstance(work_s, Mapping):
        return float(work_s)
    for k in (archetype, "all", "default"):
        if k in work_s:
            return float(work_s[k])
    raise ValueError(f"work_s has no entry for archetype {archetype!r} (nor 'all')")


def recommendations_from_forecast(forecast: pd.DataFrame, *, pool: str, quantile: float,
                                  work_s: float | Mapping[str, float], target_util: float,
                                  lead_s: float, t0_ms: int, key: bytes,
                                  min_replicas: int = 1,
                                  max_replicas: int | None = None) -> list[Recommendation]:
    """One signed recommendation per forecast bucket (see the module doc)."""
    col = quantile_column(quantile)
    need = [A.BUCKET_START, A.BUCKET_SECONDS, ORIGIN, FORECASTER, col]
    missing = [c for c in need if c not in forecast.columns]
    if missing:
        raise ValueError(f"forecast table lacks {missing} (the pipeline=forecast form)")
    if forecast[FORECASTER].nunique() > 1:
        raise ValueError(f"forecast table holds several forecasters "
                         f"{sorted(forecast[FORECASTER].unique())}: select one")
    if not 0 < target_util <= 1:
        raise ValueError(f"target_util={target_util}: must be in (0, 1]")
    fc = forecast.copy()
    if A.ARCHETYPE not in fc.columns:
        fc[A.ARCHETYPE] = "all"
    lead_ms = int(round(lead_s * 1000))
    fresh = usable_in_time(fc, lead_s)
    if fresh.empty:
        raise ValueError(f"no forecast row was made at least lead_s={lead_s} s before its "
                         "bucket: forecast more buckets ahead (horizon_buckets)")
    out = []
    for start, rows in fresh.groupby(A.BUCKET_START, sort=True):
        width = int(rows[A.BUCKET_SECONDS].iloc[0])
        demand = sum(float(q) / width * _work(work_s, str(a))
                     for q, a in zip(rows[col], rows[A.ARCHETYPE], strict=True))
        n = max(int(min_replicas), math.ceil(demand / target_util - 1e-9))
        if max_replicas is not None:
            n = min(n, int(max_replicas))
        origin = int(rows[ORIGIN].max())
        name = str(rows[FORECASTER].iloc[0])
        rec = Recommendation(
            recommendation_id=f"{pool}:{int(start)}:{name}", at=(origin - t0_ms) / 1000.0,
            policy=f"forecast:{name}", action=SCALE_POOL, target=pool,
            params={"replicas": n, "quantile": float(quantile), "forecaster": name,
                    "bucket_start_ms": int(start), "target_util": float(target_util),
                    "requests_per_s": round(sum(float(q) for q in rows[col]) / width, 6)},
            reason=f"forecast q{round(quantile * 100)} x work per request / target utilization",
            valid_from=(int(start) - lead_ms - t0_ms) / 1000.0,
            expires_at=(int(start) + width * 1000 - t0_ms) / 1000.0)
        out.append(sign_recommendation(rec, key))
    return out


class RecommendationInbox:
    """The recommendations a consumer received for one target; `select` checks them."""

    def __init__(self, recommendations: Sequence[Recommendation], key: bytes, target: str,
                 events: EventLog | None = None) -> None:
        def start(r: Recommendation) -> float:
            return r.at if r.valid_from is None else max(r.at, r.valid_from)

        self._recs = sorted(recommendations, key=lambda r: (start(r), r.at))
        self._starts = [start(r) for r in self._recs]
        spans = [(r.expires_at if r.expires_at is not None else math.inf) - s
                 for r, s in zip(self._recs, self._starts, strict=True)]
        self._span = max(spans, default=0.0)  # longest validity: older ones have all expired
        self.key, self.target = key, target
        self.events = events if events is not None else EventLog()
        for r in self._recs:  # the consumer's log holds what it received, then its answers
            if not self.events.has(r.recommendation_id):
                self.events.append(r)
        self._problem: dict[str, str | None] = {}  # signature, target: checked once per message
        self._acked: set[str] = set()

    def __len__(self) -> int:
        return len(self._recs)

    def _check(self, rec: Recommendation) -> str | None:
        rid = rec.recommendation_id
        if rid not in self._problem:  # frozen messages: verify once; `select` checks the time
            self._problem[rid] = signature_problem(rec, self.key, self.target)
        return self._problem[rid]

    def _ack(self, rec: Recommendation, now: float, problem: str | None) -> None:
        rid = rec.recommendation_id
        if rid in self._acked:
            return
        self._acked.add(rid)
        self.events.append(RecommendationDecision(rid, now, problem is None, CONSUMER,
                                           problem or "verified, valid now"))

    def select(self, now: float) -> tuple[Recommendation | None, str]:
        """The recommendation to follow at `now`, or None and why (see the module doc)."""
        hi = bisect.bisect_right(self._starts, now)
        lo = bisect.bisect_left(self._starts, now - self._span) if math.isfinite(
            self._span) else 0
        ok, problem, expired = [], None, lo > 0
        for i in range(lo, hi):
            rec = self._recs[i]
            if rec.expires_at is not None and now >= rec.expires_at:
                expired = True
                continue
            p = self._check(rec)
            if p is None:
                ok.append(rec)
            else:
                self._ack(rec, now, p)
                problem = problem or p
        if ok:
            best = max(ok, key=lambda r: (int(r.params.get("replicas", 0)), r.at))
            self._ack(best, now, None)
            return best, "ok"
        if problem:
            return None, problem
        return None, "expired" if expired else "missing"
