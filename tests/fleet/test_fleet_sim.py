"""Fleet simulator: hand-computed timings, conservation, capacity, cold start, policies, workloads."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaylab.data import shipped
from replaylab.fleet.hardware.profiles import GpuProfile
from replaylab.fleet.policies.reference import LeastLoaded, RoundRobin
from replaylab.fleet.sim.fleet import PoolConfig, SimConfig
from replaylab.fleet.sim.outcomes import SUMMARY_KEYS, SloTarget, compare_policies, summarize
from replaylab.fleet.sim.policy import PolicyError, ScaleAction
from replaylab.fleet.sim.result import COMPLETED
from replaylab.fleet.sim.simulator import FleetSim
from replaylab.fleet.sim.workload import (
    SyntheticWorkloadConfig,
    Workload,
    load_token_cdf,
    workload_from_cdf,
    workload_from_ledger,
)

FLAT = GpuProfile("flat", "test", base_s=0.01, chunk_tokens=512, max_batch=8,
                  kv_capacity_tokens=100_000, kv_block_tokens=1)


def make_workload(arrival, prompt, completion, models=("m",), model=None, region=None,
                  regions=(), **cols) -> Workload:
    n = len(arrival)
    return Workload(np.asarray(arrival, float), np.asarray(prompt), np.asarray(completion),
                    np.zeros(n) if model is None else np.asarray(model), models, np.zeros(n),
                    ("interactive",), np.full(n, -1) if region is None else np.asarray(region),
                    regions, **cols)


def run(workload, pools=None, config=None, policy=None, controller=None):
    pools = pools or [PoolConfig("p", "m", FLAT, replicas=1)]
    return FleetSim(pools, config or SimConfig(), policy or RoundRobin(), controller).run(workload)


# ---------- exact timings on hand-computed cases ----------

def test_single_request_timings_are_iteration_counts():
    # prompt 1000 -> 2 prefill chunks; first token after iteration 2; 4 more decode iterations
    r = run(make_workload([0.0], [1000], [5]))
    assert r.ttft_s[0] == pytest.approx(0.02)
    assert r.e2e_s[0] == pytest.approx(0.06)
    assert r.tpot_s[0] == pytest.approx(0.01)
    assert r.output_tokens[0] == 5


def test_batch_change_mid_stream_and_join_at_the_next_boundary():
    prof = FLAT.with_overrides(per_seq_s=0.01)  # dt = 0.01 + 0.01 n
    r = run(make_workload([0.0, 0.015], [100, 100], [4, 2]),
            [PoolConfig("p", "m", prof)])
    # A alone: dt .02 until B joins at boundary 1 (t=.02); then dt .03; B ends at
    # boundary 3 (t=.08); A ends at boundary 4 at .08 + .02
    assert r.start_s[1] == pytest.approx(0.02)
    assert r.ttft_s[0] == pytest.approx(0.02)
    assert r.first_token_s[1] == pytest.approx(0.05)
    assert r.end_s[1] == pytest.approx(0.08)
    assert r.end_s[0] == pytest.approx(0.10)


def test_prefill_chunk_cost_ends_with_the_prefill():
    prof = FLAT.with_overrides(prefill_chunk_s=0.01)
    r = run(make_workload([0.0], [1024], [3]), [PoolConfig("p", "m", prof)])
    assert r.ttft_s[0] == pytest.approx(0.04)  # 2 chunks at .02
    assert r.e2e_s[0] == pytest.approx(0.06)   # then 2 decode iterations at .01


def test_kv_capacity_bounds_concurrency():
    prof = FLAT.with_overrides(kv_capacity_tokens=1000)
    r = run(make_workload([0.0] * 4, [300] * 4, [100] * 4), [PoolConfig("p", "m", prof)])
    # 400 tokens each: two fit (the second joins at the first boundary), the next two
    # wait until the first has finished its 100 iterations
    assert r.replicas["kv_peak"].iloc[0] == 800
    assert r.start_s[:2] == pytest.approx([0.0, 0.01])
    assert (r.start_s[2:] >= 1.0).all()


def test_bounded_queue_rejects_and_queue_timeout_times_out():
    one = FLAT.with_overrides(max_batch=1)
    w = make_workload([0.0] * 10, [10] * 10, [100] * 10)
    r = run(w, [PoolConfig("p", "m", one)], SimConfig(queue_capacity=2))
    assert r.counts() == {"arrived": 10, "completed": 3, "rejected": 7, "timed_out": 0,
                          "cancelled": 0}
    assert r.reject_reasons == {"queue_full": 7}
    r = run(w, [PoolConfig("p", "m", one)], SimConfig(queue_capacity=100, queue_timeout_s=1.5))
    # each takes 1 s: the first runs, the second starts at 1.0, the rest time out at 1.5
    assert r.counts()["completed"] == 2 and r.counts()["timed_out"] == 8
    assert np.nanmax(r.end_s[r.state != COMPLETED]) == pytest.approx(1.5)


def test_cancel_mid_stream_frees_the_slot_and_counts_partial_tokens():
    one = FLAT.with_overrides(max_batch=1)
    w = make_workload([0.0, 0.0], [10, 10], [100, 10],
                      cancel_after_s=np.array([0.255, math.inf]))
    r = run(w, [PoolConfig("p", "m", one)])
    assert r.counts()["cancelled"] == 1 and r.counts()["completed"] == 1
    assert r.end_s[0] == pytest.approx(0.255)
    assert r.output_tokens[0] == 26          # leaves at boundary 26 (t = .26)
    assert r.start_s[1] == pytest.approx(0.26)


def test_deadline_times_out_queued_and_running_requests():
    one = FLAT.with_overrides(max_batch=1)
    w = make_workload([0.0, 0.0], [10, 10], [100, 10], deadline_s=np.array([0.5, 0.3]))
    r = run(w, [PoolConfig("p", "m", one)])
    assert r.counts()["timed_out"] == 2
    assert r.output_tokens[0] == 51 and math.isnan(r.start_s[1])


def test_the_energy_window_ends_at_the_last_processed_event_not_a_stale_deadline():
    """A deadline armed for a request that already finished must not stretch the run
    (it did: energy and GPU-hours then depended on which policy armed which events)."""
    w = make_workload([0.0], [10], [20], deadline_s=np.array([1000.0]))
    r = run(w, [PoolConfig("p", "m", FLAT)])
    assert r.counts()["completed"] == 1
    assert r.end_time_s == pytest.approx(r.end_s[0]) and r.end_time_s < 1000.0


def test_cold_start_delays_the_first_service_of_an_added_replica():
    w = make_workload(np.linspace(0, 20, 400), [100] * 400, [50] * 400)
    pools = [PoolConfig("p", "m", FLAT, replicas=1, cold_start_s=5.0)]
    r = run(w, pools, SimConfig(scale_events=((10.0, "p", 1),)))
    added = r.replicas.iloc[1]
    assert added["t_on"] == 10.0
    starts = r.start_s[r.replica == 1]
    assert starts.size > 0 and starts.min() >= 15.0
    assert added["gpu_hours"] == pytest.approx((r.end_time_s - 10.0) / 3600)
    assert added["energy_j"] >= 5.0 * FLAT.power_idle_w  # idle power while it loads


def test_shared_queue_waits_for_a_cold_starting_replica_where_replica_mode_rejects():
    w = make_workload([1.0, 2.0, 3.0], [10] * 3, [10] * 3)
    pools = [PoolConfig("p", "m", FLAT, replicas=0, cold_start_s=5.0)]
    events = ((0.0, "p", 1),)
    shared = run(w, pools, SimConfig(queueing="shared", scale_events=events))
    assert shared.counts()["completed"] == 3 and shared.start_s.min() == pytest.approx(5.0)
    per_replica = run(w, pools, SimConfig(scale_events=events))
    assert per_replica.reject_reasons == {"no_replica": 3}


class ScaleOnce:
    def __init__(self):
        self.calls = 0

    def decide(self, now, fleet):
        self.calls += 1
        return [ScaleAction("p", -1)] if self.calls == 2 else []


def test_controller_drains_a_replica_that_then_switches_off():
    w = make_workload(np.linspace(0, 10, 200), [100] * 200, [20] * 200)
    r = run(w, [PoolConfig("p", "m", FLAT, replicas=2)], SimConfig(control_interval_s=1.0),
            controller=ScaleOnce())
    off = r.replicas[r.replicas["t_off"].notna()]
    assert len(off) == 1 and off["t_off"].iloc[0] >= 1.0
    assert r.counts()["completed"] == 200


# ---------- policies and eligibility ----------

class Wrong:
    def admit(self, request, fleet, now):
        return None

    def choose(self, request, eligible, fleet, now):
        return max(range(len(fleet.replicas))) if len(eligible) < len(fleet.replicas) else -1


def test_a_policy_choice_outside_the_eligible_set_raises():
    w = make_workload([0.0], [10], [10], models=("a", "b"), model=[0])
    pools = [PoolConfig("pa", "a", FLAT), PoolConfig("pb", "b", FLAT)]
    with pytest.raises(PolicyError, match="eligible"):
        run(w, pools, policy=Wrong())


def test_residency_keeps_requests_in_their_region():
    w = make_workload(np.linspace(0, 1, 60), [10] * 60, [10] * 60, region=[0, 1, -1] * 20,
                      regions=("eu", "us"))
    pools = [PoolConfig("eu", "m", FLAT, 2, region="eu"), PoolConfig("us", "m", FLAT, 1, "us")]
    r = run(w, pools, policy=RoundRobin())
    region_of = np.array(["eu", "eu", "us"])[r.replica]
    assert (region_of[0::3] == "eu").all() and (region_of[1::3] == "us").all()
    assert set(region_of[2::3]) == {"eu", "us"}  # unconstrained requests may go anywhere


def test_least_loaded_spreads_ties_and_round_robin_cycles():
    w = make_workload([0.0, 0.0, 0.0, 0.0], [10] * 4, [1000] * 4)
    pools = [PoolConfig("p", "m", FLAT, replicas=4)]
    assert sorted(run(w, pools, policy=LeastLoaded()).replica) == [0, 1, 2, 3]
    assert list(run(w, pools, policy=RoundRobin()).replica) == [0, 1, 2, 3]


class RejectLong:
    def admit(self, request, fleet, now):
        return "too_long" if request.prompt_tokens > 500 else None

    def choose(self, request, eligible, fleet, now):
        return eligible[0]


def test_admission_rejections_are_counted_with_their_reason():
    r = run(make_workload([0, 1, 2], [100, 900, 800], [5, 5, 5]), policy=RejectLong())
    assert r.reject_reasons == {"too_long": 2} and r.counts()["completed"] == 1


def test_unknown_model_is_rejected_not_lost():
    r = run(make_workload([0.0, 0.1], [10, 10], [5, 5], models=("m", "x"), model=[0, 1]))
    assert r.reject_reasons == {"no_replica": 1} and r.counts()["completed"] == 1


# ---------- conservation and invariants over random workloads and fleets ----------

class Audited:
    """Wraps a policy; checks every answer against the eligible set it was given."""

    def __init__(self, inner):
        self.inner = inner

    def admit(self, request, fleet, now):
        return "coin" if request.index % 11 == 5 else None

    def choose(self, request, eligible, fleet, now):
        for r in eligible:
            rep = fleet.replicas[r]
            assert rep.state == "ready" and rep.model == request.model
            assert request.region is None or rep.region == request.region
        return self.inner.choose(request, eligible, fleet, now)


@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 50))
    arrival = np.sort(np.array(draw(st.lists(st.floats(0, 5), min_size=n, max_size=n))))
    prompt = draw(st.lists(st.integers(0, 3000), min_size=n, max_size=n))
    completion = draw(st.lists(st.integers(1, 200), min_size=n, max_size=n))
    model = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    region = draw(st.lists(st.integers(-1, 1), min_size=n, max_size=n))
    finite = st.one_of(st.just(math.inf), st.floats(0.05, 4))
    w = make_workload(arrival, prompt, completion, ("a", "b"), model, region, ("eu", "us"),
                      deadline_s=np.array(draw(st.lists(finite, min_size=n, max_size=n))),
                      cancel_after_s=np.array(draw(st.lists(finite, min_size=n, max_size=n))))
    pools = []
    for k in range(draw(st.integers(1, 3))):
        prof = FLAT.with_overrides(
            max_batch=draw(st.integers(1, 6)), kv_capacity_tokens=draw(st.integers(500, 8000)),
            kv_block_tokens=draw(st.sampled_from([1, 16])), per_seq_s=draw(st.floats(0, 0.01)),
            per_kv_token_s=draw(st.floats(0, 1e-5)), prefill_chunk_s=draw(st.floats(0, 0.02)),
            chunk_tokens=draw(st.sampled_from([256, 512])))
        pools.append(PoolConfig(f"p{k}", draw(st.sampled_from(["a", "b"])), prof,
                                draw(st.integers(0, 2)), draw(st.sampled_from([None, "eu", "us"])),
                                cold_start_s=draw(st.floats(0, 2))))
    events = tuple((draw(st.floats(0, 5)), f"p{draw(st.integers(0, len(pools) - 1))}",
                    draw(st.integers(-2, 2))) for _ in range(draw(st.integers(0, 3))))
    cfg = SimConfig(queueing=draw(st.sampled_from(["replica", "shared"])),
                    queue_capacity=draw(st.integers(0, 5)),
                    queue_timeout_s=draw(st.one_of(st.just(math.inf), st.floats(0.1, 3))),
                    scale_events=events, warm_start=draw(st.booleans()))
    policy = Audited(draw(st.sampled_from([RoundRobin(), LeastLoaded()])))
    return w, pools, cfg, policy


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_request_ends_in_exactly_one_state(scenario):
    w, pools, cfg, policy = scenario
    r = FleetSim(pools, cfg, policy).run(w)
    c = r.counts()
    assert c["completed"] + c["rejected"] + c["timed_out"] + c["cancelled"] == c["arrived"] == w.n
    assert np.isfinite(r.end_s).all() and (r.end_s >= w.arrival_s - 1e-12).all()
    reps = r.replicas
    assert (reps["kv_peak"] <= reps["kv_capacity"]).all()
    assert (reps["run_peak"] <= reps["max_batch"]).all()
    done = r.completed
    assert np.isfinite(r.first_token_s[done]).all()
    assert (r.ttft_s[done] <= r.e2e_s[done] + 1e-12).all()
    assert (r.start_s[done] >= w.arrival_s[done] - 1e-12).all()
    assert (r.output_tokens <= w.completion_tokens).all()
    assert (r.output_tokens[done] == w.completion_tokens[done]).all()
    placed = r.replica[done]
    if placed.size:
        model_of = reps.set_index("replica").loc[placed, "model"].to_numpy()
        assert (model_of == np.array(w.models)[w.model[done]]).all()
    assert r.energy_j >= 0 and r.gpu_hours >= 0


# ---------- against a naive simulator that steps every iteration ----------

def reference_one_replica(w: Workload, prof: GpuProfile):
    """Brute force: one replica, one FIFO, every iteration stepped. (start, first, end, tokens, ok)."""
    n = w.n
    start, first, end = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    tokens, completed = np.zeros(n, int), np.zeros(n, bool)
    pf = np.maximum(1, -(-w.prompt_tokens // prof.chunk_tokens))
    blk = prof.kv_block_tokens
    need = -(-(w.prompt_tokens + w.completion_tokens) // blk) * blk
    abort = w.arrival_s + np.minimum(w.deadline_s, w.cancel_after_s)
    queue, batch, ia, t = [], {}, 0, 0.0

    def admit(now):
        while queue and len(batch) < prof.max_batch:
            i = queue[0]
            if abort[i] < now:
                queue.pop(0)
                continue
            if sum(need[j] for j in batch) + need[i] > prof.kv_capacity_tokens:
                break
            batch[queue.pop(0)] = 0
            start[i] = now

    while True:
        if not batch:
            queue[:] = [i for i in queue if abort[i] >= t]
            assert not queue
            if ia == n:
                break
            t = w.arrival_s[ia]
            queue.append(ia)
            ia += 1
            admit(t)
            continue
        kv = sum(need[j] for j in batch)
        m = sum(1 for j, d in batch.items() if d < pf[j])
        t_next = t + prof.iteration_s(len(batch), kv, m)
        while ia < n and w.arrival_s[ia] < t_next:
            queue.append(ia)
            ia += 1
        for j in list(batch):
            batch[j] += 1
            d = batch[j]
            if d == pf[j] and abort[j] >= t_next:
                first[j] = t_next
            if abort[j] < t_next:  # aborted during this iteration: leaves at its end
                tokens[j] = min(w.completion_tokens[j], max(0, d - pf[j] + 1))
                del batch[j]
            elif d == pf[j] + w.completion_tokens[j] - 1:
                end[j], tokens[j], completed[j] = t_next, w.completion_tokens[j], True
                del batch[j]
        t = t_next
        admit(t)
    end[~completed] = abort[~completed]
    return start, first, end, tokens, completed


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_event_engine_matches_a_naive_iteration_stepper(data):
    n = data.draw(st.integers(1, 25))
    floats = st.lists(st.floats(0, 3), min_size=n, max_size=n)
    # an irrational jitter: no arrival falls on an iteration boundary, where the order of
    # two simultaneous events would hang on float rounding in either simulator
    arrival = np.sort(np.array(data.draw(floats))) + math.sqrt(2) * 1e-6 * np.arange(1, n + 1)
    def ints(lo, hi):
        return np.array(data.draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n)))

    late = st.one_of(st.just(math.inf), st.floats(0.05, 3).map(lambda x: x + math.sqrt(3) * 1e-7))
    w = make_workload(arrival, ints(0, 1500), ints(1, 120),
                      deadline_s=np.array(data.draw(st.lists(late, min_size=n, max_size=n))),
                      cancel_after_s=np.array(data.draw(st.lists(late, min_size=n, max_size=n))))
    prof = FLAT.with_overrides(
        max_batch=data.draw(st.integers(1, 5)), kv_capacity_tokens=data.draw(st.integers(1700, 4000)),
        kv_block_tokens=16, per_seq_s=data.draw(st.sampled_from([0.0, 0.003])),
        per_kv_token_s=data.draw(st.sampled_from([0.0, 2e-6])),
        prefill_chunk_s=data.draw(st.sampled_from([0.0, 0.007])), chunk_tokens=256)
    r = run(w, [PoolConfig("p", "m", prof)], SimConfig(queue_capacity=10**6))
    start, first, end, tokens, completed = reference_one_replica(w, prof)
    assert (r.completed == completed).all()
    np.testing.assert_allclose(r.start_s, start, rtol=0, atol=1e-9)
    np.testing.assert_allclose(r.end_s, end, rtol=0, atol=1e-9)
    np.testing.assert_allclose(r.first_token_s, first, rtol=0, atol=1e-9)
    assert (r.output_tokens == tokens).all()


# ---------- summary ----------

def test_summary_has_exactly_the_contract_keys():
    w = make_workload(np.linspace(0, 2, 50), [100] * 50, [20] * 50)
    s = summarize(run(w), {"interactive": SloTarget(ttft_s=0.5, tpot_s=0.05)})
    assert tuple(s) == SUMMARY_KEYS
    assert s["slo_attainment"] == 1.0 and s["completed"] == 50
    assert s["energy_provenance"] == "modeled"
    assert s["joules_per_success"] > 0 and s["goodput_rps"] > 0
    df = compare_policies({"rr": run(w), "ll": run(w, policy=LeastLoaded())})
    assert list(df["policy"]) == ["rr", "ll"]


# ---------- workloads ----------

def test_workload_from_ledger_keeps_arrivals_and_counts_skipped_rows(tmp_path):
    from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger

    frame = generate_synthetic_ledger(SyntheticLedgerConfig(n_requests=300), seed=0)
    path = tmp_path / "ledger.parquet"
    frame.to_parquet(path, index=False)
    w = workload_from_ledger(path, residency=True, deadline_s_by_slo={"batch": 600.0})
    null = int(frame["completion_tokens"].isna().sum())
    assert w.n == 300 - null and w.skipped.get("completion_tokens_null", 0) == null
    assert w.arrival_s[0] == 0.0 and (np.diff(w.arrival_s) >= 0).all()
    assert set(w.models) == set(frame["selected_model"])
    assert set(w.regions) <= set(frame["region"].dropna())
    batch = w.slo_class == w.slo_classes.index("batch")
    assert (w.deadline_s[batch] == 600.0).all() and np.isinf(w.deadline_s[~batch]).all()
    fleet = [PoolConfig(f"{m}-{g}", m, FLAT, 1, g) for m in w.models for g in w.regions]
    r = run(w, fleet, policy=LeastLoaded())
    assert r.counts()["arrived"] == w.n


def test_cdf_workload_follows_the_cdf_and_the_arrival_process():
    path = shipped("fleet", "azure_cdf.json")
    cfg = SyntheticWorkloadConfig(n_requests=40_000, rate_per_s=50.0, arrival="gamma", cv=3.0,
                                  hint_sigma=0.5)
    w = workload_from_cdf(path, cfg, seed=1)
    total = w.prompt_tokens + w.completion_tokens
    thresholds, fractions = load_token_cdf(path)
    for x, f in zip(thresholds[:8], fractions[:8], strict=True):
        assert np.mean(total <= x) == pytest.approx(f, abs=0.01)
    gaps = np.diff(w.arrival_s)
    assert gaps.mean() == pytest.approx(1 / 50, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.1)
    assert np.mean(total <= w.hint_p90) == pytest.approx(0.9, abs=0.01)
    poisson = workload_from_cdf(path, SyntheticWorkloadConfig(n_requests=20_000), seed=2)
    g = np.diff(poisson.arrival_s)
    assert g.std() / g.mean() == pytest.approx(1.0, rel=0.05)


def test_bad_config_values_name_the_field():
    with pytest.raises(ValueError, match="SimConfig.queueing='lifo'"):
        SimConfig(queueing="lifo")
    with pytest.raises(ValueError, match="GpuProfile.max_batch=0"):
        FLAT.with_overrides(max_batch=0)
    with pytest.raises(ValueError, match="Workload.completion_tokens"):
        make_workload([0.0], [1], [0])
