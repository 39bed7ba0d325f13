"""Autoscaling: HPA logic, conservation, signed recommendations, fallback, rollback, oscillation.

Hand-made traces with exact expectations; one smoke test of `python -m evaluation`.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaylab.config import ConfigError
from replaylab.forecast.autoscaling import Demand, PoolConfig, simulate
from replaylab.forecast.autoscaling_forecast import forecast_for_experiment
from replaylab.forecast.autoscaling_policies import (
    HPAConfig,
    HPAPolicy,
    ProactiveConfig,
    ProactivePolicy,
    StaticPolicy,
    hpa_desired,
)
from replaylab.forecast.capacity import (
    Archetype,
    ReplicaProfile,
    TokenMix,
    measured_profile,
    replicas_needed,
    work_per_request,
)
from replaylab.forecast.experiments import experiment_config
from replaylab.forecast.recommendation import (
    EventLog,
    Recommendation,
    RecommendationInbox,
    canonical_json,
    from_dict,
    sign,
    to_dict,
    verify,
)
from tests.conftest import REPO

KEY = b"test-key-not-a-secret"
TICK = 15.0
POOL = PoolConfig(tick_s=TICK, cold_start_s=180.0, gpus_per_replica=1, slo_wait_s=0.0,
                  timeout_s=600.0)
# exact HPA arithmetic: the metric is the last tick only
HPA = HPAConfig(target_util=0.5, tolerance=0.1, sync_s=TICK, metric_window_s=TICK)


def flat_demand(levels: list[tuple[int, float]]) -> Demand:
    """[(ticks, replica-equivalents)] -> arrivals at 1 replica-second per request."""
    arr = np.concatenate([np.full(n, lvl * TICK) for n, lvl in levels])
    return Demand(arr, np.ones_like(arr))


def hpa() -> HPAPolicy:
    return HPAPolicy(HPA, TICK)


# ------------------------------------------------------------------ HPA replica calculation


@pytest.mark.parametrize("ready,starting,util,expected", [
    (10, 0, 0.54, 10),   # ratio 1.08: inside the 10% tolerance, keep
    (10, 0, 0.46, 10),   # ratio 0.92: inside tolerance
    (10, 0, 0.56, 12),   # ratio 1.12: outside -> ceil(11.2)
    (10, 0, 1.0, 20),    # ratio 2: double
    (10, 0, 0.25, 5),    # ratio 0.5: halve
    (10, 10, 1.0, 20),   # starting pods count as 0 usage: ratio' = 1.0, keep
    (10, 2, 1.0, 20),    # ratio' = 2 * 10/12 = 1.67 -> ceil(1.67 * 12) = 20
    (10, 5, 0.25, 5),    # scale-down ignores starting pods: ceil(0.5 * 10)
    (0, 3, 5.0, 3),      # no ready pod, no metrics: keep
])
def test_hpa_desired_matches_the_kubernetes_algorithm(ready, starting, util, expected):
    assert hpa_desired(ready, starting, util, 0.5, 0.1) == expected


def test_hpa_scale_down_waits_for_the_300s_stabilization_window():
    # demand 10 replica-equivalents at target 0.5 -> 20 replicas; drops to 5 at tick 40
    r = simulate(flat_demand([(40, 10.0), (60, 5.0)]), hpa(), POOL)
    # the last high recommendation (tick 39, t = 600 s) leaves the window at t = 900 s:
    # tick 59 is the first sync whose window holds only the low ones
    assert r.actions == [(59, 20, 10)]
    assert r.totals["slo_attainment"] == 1.0


def test_hpa_cold_start_delays_capacity_and_unready_pods_stop_runaway():
    # 10 -> 20 replica-equivalents at target 0.5: desired 40 (2 x 20, the rate limit);
    # while 20 pods start they count as 0 usage: ratio' = 2 * 20/40 = 1.0, keep
    r = simulate(flat_demand([(10, 10.0), (30, 20.0)]), hpa(), POOL)
    assert r.actions == [(10, 20, 40)]
    assert r.provisioned[10] == 20 and r.provisioned[11] == 40   # billed at once
    assert r.ready[22] == 20 and r.ready[23] == 40  # ready 180 s (12 ticks) later
    # above ready capacity, requests queue until the new pods are ready
    r = simulate(flat_demand([(10, 10.0), (30, 24.0)]), hpa(), POOL)
    assert (r.ready[10:23] == 20).all() and r.ready[23] >= 40
    assert r.totals["served_late"] > 0 and r.backlog[22] > r.backlog[12] > 0


def test_hpa_tolerance_ignores_small_changes():
    r = simulate(flat_demand([(10, 10.0), (30, 10.5)]), hpa(), POOL)  # +5%
    assert r.actions == []


def test_hpa_scale_up_rate_limit_is_max_of_4_pods_and_100_percent():
    r = simulate(flat_demand([(2, 1.0), (40, 40.0)]), hpa(), POOL)
    assert r.actions[0] == (2, 2, 6)              # 2 -> max(2 + 4, 2 * 2) = 6


# ------------------------------------------------------------------ conservation


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), replicas=st.integers(1, 12),
       timeout=st.sampled_from([30.0, 120.0, 600.0]))
def test_every_request_ends_in_exactly_one_state(seed, replicas, timeout):
    rng = np.random.default_rng(seed)
    arr = rng.poisson(rng.uniform(0, 200), 120).astype(float)
    demand = Demand(arr, rng.uniform(0.05, 2.0, 120))
    cfg = dataclasses.replace(POOL, timeout_s=timeout, drain_s=300.0)
    t = simulate(demand, StaticPolicy(replicas), cfg).totals
    ends = t["served_in_slo"] + t["served_late"] + t["timed_out"] + t["queued_end"]
    assert ends == pytest.approx(t["arrived"], rel=1e-9, abs=0.01)  # totals round to 1e-3
    assert t["arrived"] == pytest.approx(arr.sum())


def test_static_vs_reactive_sanity():
    flat = flat_demand([(200, 8.0)])
    s = simulate(flat, StaticPolicy(16), POOL).totals
    assert s["slo_attainment"] == 1.0 and s["scaling_actions"] == 0
    assert s["gpu_hours"] == pytest.approx(16 * 200 * TICK / 3600, abs=1e-3)
    step = flat_demand([(40, 8.0), (160, 24.0)])  # 3x: static sized for the start drowns
    s, r = (simulate(step, p, POOL).totals for p in (StaticPolicy(16), hpa()))
    assert r["slo_attainment"] > s["slo_attainment"] + 0.3
    assert s["timed_out"] > 0 and r["timed_out"] == 0


# ------------------------------------------------------------------ signed recommendations


def message(replicas=12, start_ms=0, until_ms=600_000, issued_ms=None, **kw) -> Recommendation:
    return sign(Recommendation(
        message_id=f"pool-a:{start_ms}", pool="pool-a", replicas=replicas,
        valid_from_ms=start_ms, valid_until_ms=until_ms,
        issued_at_ms=start_ms if issued_ms is None else issued_ms,
        forecast_version="fc-1", forecaster="naive", quantile=0.9, **kw), KEY)


def test_hmac_sign_verify_and_tamper_detection():
    m = message()
    assert verify(m, KEY) and verify(to_dict(m), KEY) and from_dict(to_dict(m)) == m
    assert not verify(m, b"another key")
    for field, value in [("replicas", 13), ("pool", "pool-b"), ("valid_until_ms", 10**12),
                         ("quantile", 0.5), ("advise_only", False), ("forecaster", "x")]:
        assert not verify(dataclasses.replace(m, **{field: value}), KEY), field
    d = to_dict(m)
    d["replicas"] = 99
    assert not verify(d, KEY)
    assert canonical_json({"b": 1, "a": [1, 2]}) == b'{"a":[1,2],"b":1}'
    assert m.advise_only and m.version == "replica-recommendation-v1"


def test_event_log_is_append_only_and_typed():
    log = EventLog()
    log.append("recommended", 0, "pool-a", "m1", replicas=3)
    with pytest.raises(ValueError):
        log.append("deleted", 0, "pool-a")
    with pytest.raises(ValueError):
        log.append("fallback", 0, "pool-a", reason="because")
    events = log.events
    assert isinstance(events, tuple) and len(events) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        events[0].type = "actuated"


def run_proactive(messages, demand, cfg=None, ops=()):
    cfg = cfg or ProactiveConfig(floor_util=None)
    log = EventLog()
    pol = ProactivePolicy(cfg, RecommendationInbox(messages), KEY, "pool-a", hpa(), log, TICK)
    for t in ops:
        pol.request_rollback(t)
    return simulate(demand, pol, POOL), log


@pytest.mark.parametrize("case,reason", [("missing", "missing"), ("stale", "stale"),
                                         ("tampered", "bad_signature"),
                                         ("wrong_key", "bad_signature")])
def test_proactive_falls_back_to_reactive_with_the_reason(case, reason):
    demand = flat_demand([(80, 10.0), (80, 5.0)])   # 40 min
    msgs = {"missing": [], "stale": [message(25, 0, 300_000)],
            "tampered": [dataclasses.replace(message(25, 0, 10**9), replicas=40)],
            "wrong_key": [sign(dataclasses.replace(message(25, 0, 10**9), signature=""),
                               b"other")]}[case]
    r, log = run_proactive(msgs, demand)
    fb = log.of_type("fallback")
    assert fb and fb[-1].detail["reason"] == reason
    if case == "stale":  # used while valid, then the reactive HPA takes over
        assert log.of_type("acknowledged") and fb[0].t_ms >= 300_000
    else:  # never used: exactly the reactive run
        ref = simulate(demand, hpa(), POOL)
        assert r.actions == ref.actions and not log.of_type("acknowledged")
        assert not log.of_type("actuated")


def test_acknowledgement_and_actuation_are_separate_events():
    msgs = [message(20, 0, 1_200_000), message(14, 1_200_000, 2_400_000)]
    r, log = run_proactive(msgs, flat_demand([(160, 8.0)]),
                           ProactiveConfig(floor_util=None, scale_down_hold_s=0))
    c = log.counts()
    # HPA start (16) -> first message (20) -> second message (14); expired after 40 min
    assert c["acknowledged"] == 2 and c["actuated"] == 2 and c["fallback"] == 1
    first, second = log.of_type("actuated")
    assert first.detail == {"from_replicas": 16, "to_replicas": 20}
    assert second.detail == {"from_replicas": 20, "to_replicas": 14}
    assert [first.message_id, second.message_id] == [m.message_id for m in msgs]
    assert log.of_type("fallback")[0].detail["reason"] == "stale"
    assert all(e.type != "actuated" or e.message_id for e in log.events)


def test_rollback_on_slo_drop_restores_the_previous_replica_count():
    # the second message scales down to 6 replicas for a demand of 8 -> SLO falls
    msgs = [message(20, 0, 600_000), message(6, 600_000, 3_600_000)]
    cfg = ProactiveConfig(floor_util=None, scale_down_hold_s=0, rollback_attainment=0.9)
    r, log = run_proactive(msgs, flat_demand([(200, 8.0)]), cfg)
    rb = log.of_type("rolled_back")[0]
    assert rb.detail["reason"] == "slo_drop" and rb.detail["attainment"] < 0.9
    assert rb.detail["from_replicas"] == 6 and rb.detail["to_replicas"] == 20
    assert rb.message_id == msgs[1].message_id
    k = round(rb.t_ms / 1000 / TICK) - 1        # the tick of the rollback decision
    assert (k, 6, 20) in r.actions
    hold = round(cfg.rollback_hold_s / TICK)
    assert (r.provisioned[k + 1:k + hold] == 20).all()  # pinned for the hold


def test_operator_rollback():
    msgs = [message(20, 0, 600_000), message(16, 600_000, 3_600_000)]
    cfg = ProactiveConfig(floor_util=None, scale_down_hold_s=0)
    r, log = run_proactive(msgs, flat_demand([(200, 6.0)]), cfg, ops=[900.0])
    rb = log.of_type("rolled_back")
    assert len(rb) == 1 and rb[0].detail["reason"] == "operator"
    assert rb[0].detail["from_replicas"] == 16 and rb[0].detail["to_replicas"] == 20
    k = round(rb[0].t_ms / 1000 / TICK) - 1
    assert k == round(900 / TICK) - 1 and (r.provisioned[k + 1:k + 100] == 20).all()


def test_hysteresis_stops_flapping_on_a_noisy_flat_forecast():
    rng = np.random.default_rng(3)
    # 8 hours of 10-minute recommendations of 20 +- 1 replicas (inside the 10% band)
    msgs = [message(int(20 + rng.integers(-1, 2)), b * 600_000, (b + 1) * 600_000)
            for b in range(48)]
    demand = flat_demand([(1920, 8.0)])
    damped, _ = run_proactive(msgs, demand)
    raw, _ = run_proactive(msgs, demand, ProactiveConfig(floor_util=None, hysteresis=0.0,
                                                         scale_down_hold_s=0.0))
    assert damped.totals["oscillations"] == 0 and damped.totals["scaling_actions"] <= 3
    # the same forecast without the band and window follows every wobble
    assert raw.totals["oscillations"] >= 3 and raw.totals["scaling_actions"] > 20


# ------------------------------------------------------------------ capacity and forecast


def test_replicas_needed_from_token_mix():
    prof = ReplicaProfile("p", 4, decode_tok_per_s=2000.0, prefill_tok_per_s=10000.0,
                          batch=64, itl_p99_ms=90.0, provenance="test", source="test")
    mix = TokenMix((Archetype("short", 1000, 100), Archetype("long", 1000, 500)), (0.8, 0.2))
    assert work_per_request(mix, prof) == pytest.approx(0.1 + 0.8 * 0.05 + 0.2 * 0.25)
    assert replicas_needed(19.0, mix, prof, 1.0) == 4          # 19 * 0.19 = 3.61
    assert replicas_needed(19.0, mix, prof, 0.5) == 8
    heavier = mix.with_share("long", 0.4)
    assert replicas_needed(100.0, heavier, prof, 0.7) > replicas_needed(100.0, mix, prof, 0.7)
    assert replicas_needed(0.0, mix, prof, 0.7) == 1


def test_measured_profile_picks_the_fastest_batch_within_the_itl_slo(shared_data):
    p = measured_profile(shared_data, itl_p99_slo_ms=100.0)
    assert p.batch == 64 and p.itl_p99_ms <= 100 and p.decode_tok_per_s == pytest.approx(2510.5)
    assert 8000 < p.prefill_tok_per_s < 10000 and p.gpus_per_replica == 4
    with pytest.raises(ValueError, match="meets"):
        measured_profile(shared_data, itl_p99_slo_ms=1.0)


def test_seasonal_naive_forecast_is_causal_and_non_crossing():
    idx = np.arange(300) * 600_000
    y = pd.Series(1000 + 100 * np.sin(np.arange(300) / 10), index=idx)
    fc = forecast_for_experiment(y, horizon=2, forecaster="seasonal_naive", season=144,
                                 window=144)
    row = fc.iloc[-1]
    assert row["requests_q50"] == pytest.approx(y.iloc[-1 - 144], rel=0.05)
    assert (fc["requests_q10"] <= fc["requests_q50"]).all()
    assert (fc["requests_q50"] <= fc["requests_q90"]).all()
    assert (fc["forecast_origin"] == fc["bucket_start"] - 600_000).all()
    assert set(fc["horizon_buckets"]) == {2}


def test_unknown_config_field_is_named():
    with pytest.raises(ConfigError, match="reactive.*target_utl"):
        experiment_config({"shared_dir": ".", "reactive": {"target_utl": 0.5}})
    with pytest.raises(ConfigError, match="kind"):
        experiment_config({"shared_dir": ".", "scenarios": {"x": {"kind": "tsunami"}}})


# ------------------------------------------------------------------ entry point


def test_evaluation_entry_point_writes_the_summary(tmp_path, shared_data):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "evaluation", "experiment=autoscaling",
           f"hydra.run.dir={out}", "tracking.enabled=false", f"paths.shared_dir={shared_data}",
           "experiment.trace.source=synthetic", "experiment.trace.day=1",
           "experiment.trace.hours=3", "experiment.sweep.target_utils=[0.7,0.9]",
           "experiment.sweep.seeds=[0]"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["pipeline"] == "autoscaling"
    for scen in ("steady", "burst", "mix_drift", "forecast_error"):
        for pol in ("static", "reactive", "proactive"):
            m = s["scenarios"][scen][pol]
            for k in ("slo_attainment", "gpu_hours", "overprovision_gpu_hours",
                      "scaling_actions", "oscillations"):
                assert k in m, (scen, pol, k)
            assert 0 <= m["slo_attainment"] <= 1
    assert s["verdicts"] and all(isinstance(v, str) for v in s["verdicts"])
    assert isinstance(s["target"]["met"], bool) and s["target"]["explanation"]
    assert (out / "report.html").is_file() and (out / "figures").is_dir()


def test_a_forecast_too_late_for_the_cold_start_is_refused():
    from replaylab.forecast.recommendation import recommendations_from_forecast

    idx = np.arange(200) * 600_000
    y = pd.Series(np.full(200, 6000.0), index=idx)
    kw = dict(pool="pool-a", quantile=0.9, replicas_for_rate=lambda r: 3, key=KEY,
              forecast_version="v")
    late = forecast_for_experiment(y, horizon=1, forecaster="naive", window=50)
    with pytest.raises(ValueError, match="raise horizon_buckets"):
        recommendations_from_forecast(late, lead_s=195.0, events=EventLog(), **kw)
    log = EventLog()
    ok = recommendations_from_forecast(forecast_for_experiment(y, horizon=2, forecaster="naive",
                                                               window=50),
                                       lead_s=195.0, events=log, **kw)
    assert all(m.issued_at_ms <= m.valid_from_ms and verify(m, KEY) for m in ok)
    assert log.counts()["recommended"] == len(ok) > 0


def test_adapter_runs_a_forecaster_of_the_forecasting_pipeline():
    pytest.importorskip("statsforecast")
    rng = np.random.default_rng(0)
    idx = np.arange(400) * 600_000
    y = pd.Series(1000 + 100 * np.sin(np.arange(400) / 20) + rng.normal(0, 20, 400), index=idx)
    fc = forecast_for_experiment(y, horizon=2, forecaster="moving_window", n_eval=48)
    assert len(fc) == 48 and set(fc["horizon_buckets"]) == {2}
    assert fc["bucket_start"].iloc[-1] == idx[-1] and (fc["forecaster"] == "moving_window").all()
    assert (fc["requests_q10"] <= fc["requests_q90"]).all()
    assert (fc["forecast_origin"] == fc["bucket_start"] - 600_000).all()
