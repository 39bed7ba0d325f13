"""observation-v1 contract (TTL, provenance, JSON) and the four separate fleet events."""

from __future__ import annotations

import json

import pytest

from replaylab.contracts.events import (
    Actuation,
    EventLinkError,
    EventLog,
    EventSchemaError,
    Outcome,
    Recommendation,
    RecommendationDecision,
    event_from_json,
    event_to_json,
)
from replaylab.contracts.observation import (
    FieldStatus,
    FieldValue,
    Freshness,
    Health,
    LatencySummary,
    Observation,
    ObservationSchemaError,
    ObsField,
    Source,
    freshness,
)

T0 = 1000.0


def _obs(**fields: FieldValue) -> Observation:
    return Observation("replica-1", "pool-a", "vllm", "0.11.0", "meta-llama/Llama-3.1-8B", T0,
                       fields)


def _measured(value, ttl_s=5.0, at=T0, **kw) -> FieldValue:
    return FieldValue.observed(value, source=Source.BACKEND_MEASURED, at=at, ttl_s=ttl_s, **kw)


@pytest.fixture
def full_obs() -> Observation:
    return _obs(**{
        ObsField.HEALTH: FieldValue.observed(Health.HEALTHY, source=Source.ROUTER_OBSERVED,
                                             at=T0, ttl_s=5.0, origin="scrape"),
        ObsField.QUEUE_DEPTH: _measured(3.0, origin="vllm:num_requests_waiting"),
        ObsField.RUNNING_REQUESTS: _measured(12.0),
        ObsField.KV_CACHE_USAGE: _measured(0.62, ttl_s=2.0),
        ObsField.TTFT_SECONDS: _measured(LatencySummary(0.25, 0.5, 0.725, 0.309, 100),
                                         ttl_s=30.0, window_s=10.0),
        ObsField.POWER_WATTS: FieldValue.unsupported(at=T0, ttl_s=5.0, origin="no metric"),
        ObsField.PREFIX_CACHE_HIT_RATE: FieldValue.observed(0.4, source=Source.MODELED, at=T0,
                                                            ttl_s=5.0),
    })


# --- TTL: a stale value is never read as fresh ------------------------------------------
def test_fresh_values_are_readable_with_provenance(full_obs):
    assert full_obs.get(ObsField.QUEUE_DEPTH, T0 + 1) == 3.0
    assert full_obs.get(ObsField.HEALTH, T0) is Health.HEALTHY
    fv = full_obs.fields[ObsField.QUEUE_DEPTH]
    assert (fv.source, fv.observed_at, fv.expires_at, fv.supported, fv.origin) == (
        Source.BACKEND_MEASURED, T0, T0 + 5.0, True, "vllm:num_requests_waiting")
    assert full_obs.fields[ObsField.PREFIX_CACHE_HIT_RATE].source is Source.MODELED


def test_expired_fields_are_unreadable(full_obs):
    # kv has a 2 s TTL, queue 5 s, ttft 30 s: each goes dark at its own expiry
    assert full_obs.get(ObsField.KV_CACHE_USAGE, T0 + 1.999) == 0.62
    assert full_obs.get(ObsField.KV_CACHE_USAGE, T0 + 2.0) is None
    assert full_obs.status(ObsField.KV_CACHE_USAGE, T0 + 2.0) is FieldStatus.STALE
    assert full_obs.get(ObsField.QUEUE_DEPTH, T0 + 5.0) is None
    assert full_obs.get(ObsField.TTFT_SECONDS, T0 + 29.0).p99 == 0.725
    late = full_obs.fresh_values(T0 + 10.0)
    assert set(late) == {ObsField.TTFT_SECONDS}
    fv = full_obs.fields[ObsField.QUEUE_DEPTH]
    assert fv.read(T0 + 100) is None and fv.status(T0 + 100) is FieldStatus.STALE


def test_stale_value_has_no_bypass(full_obs):
    fv = full_obs.fields[ObsField.QUEUE_DEPTH]
    assert not hasattr(fv, "value")  # only read(now) reaches the value
    with pytest.raises(AttributeError):
        fv.expires_at = T0 + 1e9  # immutable: expiry cannot be pushed out
    with pytest.raises(TypeError):
        full_obs.fields[ObsField.QUEUE_DEPTH] = _measured(1.0, ttl_s=1e9)  # read-only mapping


def test_unsupported_and_missing_are_absent(full_obs):
    assert full_obs.get(ObsField.POWER_WATTS, T0) is None
    assert full_obs.status(ObsField.POWER_WATTS, T0) is FieldStatus.UNSUPPORTED
    assert full_obs.supports(ObsField.POWER_WATTS) is False
    assert full_obs.get(ObsField.ENERGY_JOULES, T0) is None
    assert full_obs.status(ObsField.ENERGY_JOULES, T0) is FieldStatus.MISSING
    assert full_obs.supports(ObsField.ENERGY_JOULES) is None
    with pytest.raises(KeyError, match="unknown observation field"):
        full_obs.get("queue_dept", T0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(value=None), "supported field carries a value"),
    (dict(value=1.0, supported=False), "unsupported field must not carry"),
    (dict(value=1.0, expires_at=T0), "must be after observed_at"),
    (dict(value=1.0, source="guessed"), "source must be one of"),
    (dict(value=1.0, observed_at=float("nan")), "finite"),
])
def test_field_value_invariants(kwargs, match):
    args = dict(source="backend_measured", observed_at=T0, expires_at=T0 + 1)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        FieldValue(args.pop("value"), **args)


@pytest.mark.parametrize("name, value, match", [
    (ObsField.KV_CACHE_USAGE, 1.2, "<= 1.0"),
    (ObsField.QUEUE_DEPTH, -1.0, ">= 0.0"),
    (ObsField.HEALTH, "fine", "must be one of"),
    (ObsField.TTFT_SECONDS, 0.3, "LatencySummary"),
])
def test_observation_checks_value_kinds(name, value, match):
    with pytest.raises(ValueError, match=match):
        _obs(**{name: _measured(value)})


def test_latency_summary_must_be_ordered():
    with pytest.raises(ValueError, match="ordered"):
        LatencySummary(p50=0.5, p90=0.4, p99=0.9, mean=0.5, count=10)


# --- JSON round trip and version check ----------------------------------------------------
def test_json_round_trip(full_obs):
    back = Observation.from_json(full_obs.to_json())
    assert back == full_obs
    assert back.get(ObsField.TTFT_SECONDS, T0) == LatencySummary(0.25, 0.5, 0.725, 0.309, 100)
    assert back.fields[ObsField.TTFT_SECONDS].window_s == 10.0
    assert back.get(ObsField.HEALTH, T0) is Health.HEALTHY
    assert back.status(ObsField.POWER_WATTS, T0) is FieldStatus.UNSUPPORTED
    assert back.get(ObsField.KV_CACHE_USAGE, T0 + 3) is None  # expiry survives the trip


def test_json_rejects_other_versions_and_bad_values(full_obs):
    d = full_obs.to_dict()
    with pytest.raises(ObservationSchemaError, match="schema_version='2'"):
        Observation.from_dict({**d, "schema_version": "2"})
    bad = json.loads(full_obs.to_json())
    bad["fields"]["kv_cache_usage"]["value"] = 3.0
    with pytest.raises(ObservationSchemaError, match=r"fields\.kv_cache_usage: .*<= 1\.0"):
        Observation.from_dict(bad)
    bad = json.loads(full_obs.to_json())
    bad["fields"]["gpu_temp"] = bad["fields"]["kv_cache_usage"]
    with pytest.raises(ObservationSchemaError, match="gpu_temp: unknown field"):
        Observation.from_dict(bad)
    with pytest.raises(ObservationSchemaError, match="not valid JSON"):
        Observation.from_json('{"schema_version": "1", "observed_at": NaN}')
    with pytest.raises(ObservationSchemaError, match="missing"):
        Observation.from_dict({"schema_version": "1", "kind": "observation"})


# --- replica freshness for fallbacks ------------------------------------------------------
def test_freshness_verdicts(full_obs):
    assert freshness(None, T0) is Freshness.MISSING
    assert freshness(full_obs, T0 + 1) is Freshness.FRESH
    assert freshness(full_obs, T0 + 3) is Freshness.STALE  # kv expired at +2
    assert freshness(full_obs, T0 + 60) is Freshness.STALE
    health_only = _obs(**{ObsField.HEALTH: full_obs.fields[ObsField.HEALTH]})
    assert freshness(health_only, T0) is Freshness.MISSING
    no_kv = _obs(**{ObsField.QUEUE_DEPTH: _measured(1.0),
                    ObsField.KV_CACHE_USAGE: FieldValue.unsupported(at=T0, ttl_s=1.0)})
    assert freshness(no_kv, T0 + 3) is Freshness.FRESH  # unsupported never makes it stale


def test_with_fields_keeps_other_expiries(full_obs):
    hv = FieldValue.observed(Health.UNKNOWN, source=Source.ROUTER_OBSERVED, at=T0 + 4,
                             ttl_s=5.0)
    later = full_obs.with_fields({ObsField.HEALTH: hv})
    assert later.get(ObsField.HEALTH, T0 + 8) is Health.UNKNOWN
    assert later.get(ObsField.QUEUE_DEPTH, T0 + 8) is None
    assert later.observed_at == full_obs.observed_at


# --- events: separate, linked, JSONL -------------------------------------------------------
def _chain() -> list:
    return [
        Recommendation("rec-1", 10.0, "autoscaler", "scale_pool", "pool-a", {"replicas": 4},
                       reason="queue p90 above target", telemetry={"replica-1": "fresh"},
                       expires_at=40.0),
        RecommendationDecision("rec-1", 11.0, accepted=True, by="auto"),
        Actuation("act-1", "rec-1", 12.0, "scale_pool", "pool-a", {"replicas": 3},
                  status="partial", detail="one node unavailable"),
        Outcome("out-1", "rec-1", 72.0, {"ttft_p99_s": 0.8, "energy_j": 1.2e6},
                source="modeled", actuation_id="act-1", window_s=60.0),
    ]


def test_events_stay_separate_and_link():
    log = EventLog()
    for e in _chain():
        log.append(e)
    kinds = [e.kind for e in log.events]
    assert kinds == ["recommendation", "acknowledgement", "actuation", "outcome"]
    chain = log.chain("rec-1")
    # what was recommended and what was applied stay distinct records
    assert chain["recommendation"].params["replicas"] == 4
    assert chain["actuations"][0].params["replicas"] == 3
    assert chain["outcomes"][0].actuation_id == "act-1"
    back = EventLog.from_jsonl(log.to_jsonl())
    assert back.events == log.events
    assert all(event_from_json(event_to_json(e)) == e for e in log.events)


def test_event_log_file_round_trip(tmp_path):
    log = EventLog()
    for e in _chain():
        log.append(e)
    path = log.write_jsonl(tmp_path / "events.jsonl")
    assert len(path.read_text().splitlines()) == 4
    assert EventLog.read_jsonl(path).events == log.events


def test_actuation_without_recommendation_is_an_error():
    log = EventLog()
    with pytest.raises(EventLinkError, match="unknown recommendation 'rec-9'"):
        log.append(Actuation("act-1", "rec-9", 1.0, "scale_pool", "pool-a"))
    assert len(log) == 0


@pytest.mark.parametrize("bad, match", [
    (Actuation("act-1", "rec-1", 12.0, "scale_pool", "pool-a"), "not acknowledged"),
    (RecommendationDecision("rec-1", 9.0, accepted=True, by="auto"), "before its recommendation"),
    (Outcome("out-1", "rec-1", 20.0, {}, source="measured", actuation_id="act-x"),
     "not an actuation of"),
])
def test_broken_links_are_rejected(bad, match):
    log = EventLog()
    log.append(_chain()[0])
    with pytest.raises(EventLinkError, match=match):
        log.append(bad)
    assert len(log) == 1


def test_rejected_or_expired_recommendations_are_not_actuated():
    log = EventLog()
    rec, _, act, _ = _chain()
    log.append(rec)
    log.append(RecommendationDecision("rec-1", 11.0, accepted=False, by="operator", reason="freeze"))
    with pytest.raises(EventLinkError, match="rejected"):
        log.append(act)
    # an outcome of a rejected recommendation (no actuation) is still a valid record
    log.append(Outcome("out-1", "rec-1", 70.0, {"ttft_p99_s": 1.4}, source="measured"))
    log2 = EventLog()
    log2.append(rec)
    log2.append(RecommendationDecision("rec-1", 11.0, accepted=True, by="auto"))
    with pytest.raises(EventLinkError, match="expired"):
        log2.append(Actuation("act-1", "rec-1", 41.0, "scale_pool", "pool-a"))


def test_jsonl_errors_name_the_line():
    lines = [event_to_json(_chain()[0]), event_to_json(_chain()[2])]
    with pytest.raises(EventLinkError, match="line 2: .*not acknowledged"):
        EventLog.from_jsonl("\n".join(lines))
    with pytest.raises(EventSchemaError, match="line 1: .*schema_version"):
        EventLog.from_jsonl(json.dumps({"schema_version": "0", "kind": "outcome"}))
    with pytest.raises(ValueError, match="finite"):
        Outcome("o", "r", 1.0, {"x": float("inf")}, source="measured")
