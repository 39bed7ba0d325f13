"""Serving policies below the router: eligibility under random fleets, spillover, energy, admission,
stale telemetry and its fallback, flapping, carbon, shadow/canary."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaylab.contracts.observation import Freshness, ObsField, freshness
from replaylab.fleet.control.shadow import ShadowPolicy, shadow_report
from replaylab.fleet.hardware.profiles import GpuProfile
from replaylab.fleet.policies.admission import HintAdmission
from replaylab.fleet.policies.energy import (
    CarbonSignal,
    EnergyAwarePolicy,
    StaticEfficientPolicy,
    marginal_j_per_token,
)
from replaylab.fleet.policies.reference import LeastLoaded, RoundRobin
from replaylab.fleet.policies.spillover import SpilloverPolicy
from replaylab.fleet.sim.fleet import PoolConfig, SimConfig
from replaylab.fleet.sim.outcomes import summarize
from replaylab.fleet.sim.policy import PolicyError
from replaylab.fleet.sim.simulator import FleetSim
from replaylab.fleet.sim.workload import SyntheticWorkloadConfig, Workload, workload_from_cdf
from replaylab.fleet.telemetry.feed import TelemetryAware, TelemetryFeed, TelemetryView

# FleetSim's H100 / A100 / A10G constants (modeled), inline so the tests need no data folder
H100 = GpuProfile("h100", "H100", base_s=0.004, per_kv_token_s=0.00032 / 8192, chunk_tokens=1024,
                  kv_capacity_tokens=1_048_576, max_batch=256, power_idle_w=300,
                  power_nominal_w=600, power_k=1.0, power_x0=4.2)
A100 = GpuProfile("a100", "A100", base_s=0.008, per_kv_token_s=0.00065 / 8192, chunk_tokens=512,
                  kv_capacity_tokens=1_048_576, max_batch=128, power_idle_w=175,
                  power_nominal_w=385, power_k=1.0, power_x0=2.5)
A10G = GpuProfile("a10g", "A10G", base_s=0.012, per_kv_token_s=0.0009 / 8192, chunk_tokens=256,
                  kv_capacity_tokens=524_288, max_batch=64, power_idle_w=75, power_nominal_w=120,
                  power_k=0.7, power_x0=3.0)
FLAT = GpuProfile("flat", "test", base_s=0.01, chunk_tokens=512, max_batch=8,
                  kv_capacity_tokens=100_000, kv_block_tokens=1)
CDF = [[64, .13], [128, .24], [256, .38], [512, .64], [768, .76], [1024, .83], [1536, .91],
       [2048, .95], [4096, 1.0]]


def synthetic(n, rate, seed=1, **kw) -> Workload:
    return workload_from_cdf(CDF, SyntheticWorkloadConfig(n_requests=n, rate_per_s=rate,
                                                          hint_sigma=0.3, **kw), seed=seed)


def make_workload(arrival, prompt, completion, models=("m",), model=None, region=None,
                  regions=(), **cols) -> Workload:
    n = len(arrival)
    return Workload(np.asarray(arrival, float), np.asarray(prompt), np.asarray(completion),
                    np.zeros(n) if model is None else np.asarray(model), models, np.zeros(n),
                    ("interactive",), np.full(n, -1) if region is None else np.asarray(region),
                    regions, **cols)


class Audited:
    """Checks every choice against the live fleet, then passes it through."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def admit(self, request, fleet, now):
        return self.inner.admit(request, fleet, now)

    def choose(self, request, eligible, fleet, now):
        r = self.inner.choose(request, eligible, fleet, now)
        assert r in eligible
        rep = fleet.replicas[r]
        assert rep.state == "ready" and rep.model == request.model
        assert request.region is None or rep.region == request.region
        return r


class Probe:
    """Records (request index, chosen pool, loads of the eligible replicas by pool) per choice."""

    def __init__(self, inner) -> None:
        self.inner, self.seen = inner, []

    def admit(self, request, fleet, now):
        return self.inner.admit(request, fleet, now)

    def choose(self, request, eligible, fleet, now):
        loads = {}
        for r in eligible:
            loads.setdefault(fleet.replicas[r].pool_id, []).append(fleet.load[r])
        r = self.inner.choose(request, eligible, fleet, now)
        self.seen.append((request.index, fleet.replicas[r].pool_id, loads))
        return r


# ---------- no policy ever leaves the eligible set (random fleets, telemetry, requests) ----------

@st.composite
def policy_scenarios(draw):
    n = draw(st.integers(1, 40))
    arrival = np.sort(np.array(draw(st.lists(st.floats(0, 6), min_size=n, max_size=n))))
    prompt = np.array(draw(st.lists(st.integers(0, 3000), min_size=n, max_size=n)))
    completion = np.array(draw(st.lists(st.integers(1, 200), min_size=n, max_size=n)))
    hint = np.array(draw(st.lists(st.one_of(st.just(math.nan), st.floats(1, 5000)),
                                  min_size=n, max_size=n)))
    model = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    region = draw(st.lists(st.integers(-1, 1), min_size=n, max_size=n))
    finite = st.one_of(st.just(math.inf), st.floats(0.05, 4))
    w = make_workload(arrival, prompt, completion, ("a", "b"), model, region, ("eu", "us"),
                      deadline_s=np.array(draw(st.lists(finite, min_size=n, max_size=n))),
                      hint_p90=hint)
    pools = []
    for k in range(draw(st.integers(1, 4))):
        idle = draw(st.floats(10, 400))
        prof = FLAT.with_overrides(
            name=f"prof{k}", max_batch=draw(st.integers(1, 6)),
            kv_capacity_tokens=draw(st.integers(500, 8000)),
            kv_block_tokens=draw(st.sampled_from([1, 16])), per_seq_s=draw(st.floats(0, 0.01)),
            per_kv_token_s=draw(st.floats(0, 1e-5)), prefill_chunk_s=draw(st.floats(0, 0.02)),
            power_idle_w=idle, power_nominal_w=idle + draw(st.floats(0, 500)),
            power_k=draw(st.floats(0.1, 3)), power_x0=draw(st.floats(0, 6)))
        pools.append(PoolConfig(f"p{k}", draw(st.sampled_from(["a", "b"])), prof,
                                draw(st.integers(0, 2)), draw(st.sampled_from([None, "eu", "us"])),
                                cold_start_s=draw(st.floats(0, 2))))
    ids = [p.pool_id for p in pools]
    events = tuple((draw(st.floats(0, 6)), draw(st.sampled_from(ids)), draw(st.integers(-2, 2)))
                   for _ in range(draw(st.integers(0, 3))))
    cfg = SimConfig(queueing=draw(st.sampled_from(["replica", "shared"])),
                    queue_capacity=draw(st.integers(0, 5)), scale_events=events,
                    warm_start=draw(st.booleans()))

    def carbon():
        return [CarbonSignal(draw(st.sampled_from(["eu", "us"])), draw(st.floats(0, 800)),
                             t0 := draw(st.floats(0, 5)), t0 + draw(st.floats(0.1, 5)),
                             draw(st.integers(0, 3)))
                for _ in range(draw(st.integers(0, 3)))]

    def base(depth=0):
        kind = draw(st.sampled_from(["spill", "static", "energy", "hint", "ll"]
                                    + (["shadow"] if depth == 0 else [])))
        if kind == "spill":
            return SpilloverPolicy({m: draw(st.sampled_from(ids)) for m in ("a", "b")},
                                   draw(st.integers(1, 4)))
        if kind == "static":
            return StaticEfficientPolicy()
        if kind == "energy":
            try:
                sig = carbon()
                return EnergyAwarePolicy(draw(st.integers(1, 6)), draw(st.floats(0, 1)), sig)
            except ValueError:  # two drawn signals of one version overlapping: refused up front
                return EnergyAwarePolicy(draw(st.integers(1, 6)), draw(st.floats(0, 1)))
        if kind == "hint":
            return HintAdmission(draw(st.sampled_from(["hint", "perfect", "none"])),
                                 draw(st.floats(0.2, 1.5)), draw(st.integers(1, 4096)),
                                 draw(st.sampled_from([None, StaticEfficientPolicy(),
                                                       EnergyAwarePolicy()])))
        if kind == "ll":
            return LeastLoaded()
        # a shadowed candidate may break every rule: it must never reach the simulator
        return ShadowPolicy(base(1), ResidencyBreaker() if draw(st.booleans()) else base(1))

    policy = base()
    controller = None
    if draw(st.booleans()):
        feed = TelemetryFeed(draw(st.floats(0.2, 2)), draw(st.floats(0, 3)), draw(st.floats(0.1, 4)),
                             [(a := draw(st.floats(0, 6)), a + draw(st.floats(0.1, 4)))]
                             if draw(st.booleans()) else ())
        policy = TelemetryAware(policy, feed, draw(st.sampled_from([None, RoundRobin()])))
        cfg, controller = feed.sim_config(cfg), feed
    return w, pools, cfg, Audited(policy), controller


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy_scenarios())
def test_no_policy_ever_chooses_outside_the_eligible_set_or_residency(scenario):
    w, pools, cfg, policy, controller = scenario
    r = FleetSim(pools, cfg, policy, controller).run(w)  # a choice outside raises PolicyError
    c = r.counts()
    assert c["completed"] + c["rejected"] + c["timed_out"] + c["cancelled"] == c["arrived"] == w.n
    placed = r.replica >= 0
    if placed.any():
        reps = r.replicas.set_index("replica")
        region = np.array([None, "eu", "us"], dtype=object)[w.region[placed] + 1]
        rep_region = reps.loc[r.replica[placed], "region"].to_numpy()
        assert all(g is None or g == h for g, h in zip(region, rep_region, strict=True))


def test_a_fleet_scaled_to_zero_under_a_passive_controller_ends():
    """Regression (found by the property test): every replica scaled away at t=0, shared
    queue, no deadlines, a TelemetryFeed ticking (it never scales): the run used to tick
    forever. It now ends after the stall grace, the queued requests drained as timed out."""
    from replaylab.fleet.sim.views import STALL_TICKS

    # the requests queue while the only replica is still starting; then it is switched off
    pools = [PoolConfig("p0", "m", FLAT, replicas=1, cold_start_s=2.0)]
    feed = TelemetryFeed(0.5, 0.0, 0.1)
    cfg = feed.sim_config(SimConfig(queueing="shared", queue_capacity=4, warm_start=False,
                                    scale_events=((1.0, "p0", -1),)))
    w = make_workload([0.0, 0.5], [100, 100], [10, 10])
    r = FleetSim(pools, cfg, LeastLoaded(), feed).run(w)
    c = r.counts()
    assert c["timed_out"] == 2 and c["arrived"] == 2 == sum(v for k, v in c.items()
                                                             if k != "arrived")
    assert feed.scrapes <= STALL_TICKS + 10  # ended after the grace, not at a memory limit



def test_a_pool_scaled_to_zero_beside_an_idle_one_ends():
    """Regression (found by the property test, a random draw that grew make test to 24 GB):
    model b's only pool scaled to zero while model a's pool stays up and idle, a shared
    queue, no deadlines, a passive controller ticking. b's requests can never be served;
    the run used to tick forever (the other pool was not off). It now ends after the stall
    grace, b's requests timed out, a's served."""
    from replaylab.fleet.sim.views import STALL_TICKS

    pools = [PoolConfig("p0", "b", FLAT, replicas=1, cold_start_s=2.0),
             PoolConfig("p1", "a", FLAT, replicas=1, cold_start_s=0.1)]
    feed = TelemetryFeed(0.5, 0.0, 0.1)
    # b's requests queue while p0 is still starting; then p0 is switched off
    cfg = feed.sim_config(SimConfig(queueing="shared", queue_capacity=4, warm_start=False,
                                    scale_events=((1.0, "p0", -1),)))
    w = make_workload([0.0, 0.5, 0.6], [100, 100, 100], [10, 10, 10], models=("a", "b"),
                      model=[0, 1, 1])
    r = FleetSim(pools, cfg, LeastLoaded(), feed).run(w)
    c = r.counts()
    assert c["completed"] == 1 and c["timed_out"] == 2 and c["arrived"] == 3
    assert feed.scrapes <= STALL_TICKS + 10  # ended after the grace, not at a memory limit

# ---------- the rules ----------

def test_marginal_energy_is_extra_watts_over_extra_tokens_per_second():
    prof = FLAT.with_overrides(per_seq_s=0.001, power_idle_w=100, power_nominal_w=300)
    t = prof.power_table()
    # batch 2 -> 3: dt .012 -> .013; throughput 2/.012 -> 3/.013
    expect = (t[3] - t[2]) / (3 / 0.013 - 2 / 0.012)
    assert marginal_j_per_token(prof, t, 2, 0, 0) == pytest.approx(expect)
    assert marginal_j_per_token(prof, t, 0, 0, 0) == pytest.approx((t[1] - t[0]) * 0.011)
    assert marginal_j_per_token(prof, t, prof.max_batch, 0, 0) == math.inf


def test_spillover_spills_only_when_the_primary_is_loaded():
    pools = [PoolConfig("a", "model", FLAT, replicas=2), PoolConfig("b", "model", FLAT, replicas=2)]
    light = synthetic(300, 2, seed=3)
    probe = Probe(SpilloverPolicy({"model": "a"}, max_load_per_replica=4))
    FleetSim(pools, SimConfig(), probe).run(light)
    assert {pool for _, pool, _ in probe.seen} == {"a"}
    heavy = synthetic(600, 60, seed=3)
    pol = SpilloverPolicy({"model": "a"}, max_load_per_replica=4)
    probe = Probe(pol)
    FleetSim(pools, SimConfig(), probe).run(heavy)
    spilled = [loads for _, pool, loads in probe.seen if pool == "b"]
    assert len(spilled) == pol.spills > 0
    assert all(min(loads["a"]) >= 4 for loads in spilled)
    assert all(min(loads["a"]) < 4 for _, pool, loads in probe.seen if pool == "a")


def test_static_efficient_prefers_the_efficient_pool_and_spills_when_it_is_full():
    hog = FLAT.with_overrides(name="hog", power_idle_w=300, power_nominal_w=900)
    eff = FLAT.with_overrides(name="eff", power_idle_w=100, power_nominal_w=200, max_batch=4)
    pol = StaticEfficientPolicy()
    assert pol.efficiency(eff) < pol.efficiency(hog)
    pools = [PoolConfig("hog", "model", hog, replicas=2), PoolConfig("eff", "model", eff, replicas=2)]
    probe = Probe(pol)
    FleetSim(pools, SimConfig(), probe).run(synthetic(300, 1, seed=4))
    assert {pool for _, pool, _ in probe.seen} == {"eff"}
    pol = StaticEfficientPolicy()
    probe = Probe(pol)
    FleetSim(pools, SimConfig(), probe).run(synthetic(600, 80, seed=4))
    to_hog = [loads for _, pool, loads in probe.seen if pool == "hog"]
    assert to_hog and all(min(loads["eff"]) >= eff.max_batch for loads in to_hog)
    assert pol.spills == sum(min(loads["hog"]) < hog.max_batch for loads in to_hog) > 0


ENERGY_FLEET = [PoolConfig("h100", "model", H100, replicas=4),
                PoolConfig("a100", "model", A100, replicas=4)]


def test_energy_aware_uses_fewer_joules_per_token_than_least_loaded():
    w = synthetic(4000, 30)
    cfg = SimConfig(horizon_s=w.duration_s + 120)  # one energy window for both policies
    ea = summarize(FleetSim(ENERGY_FLEET, cfg, EnergyAwarePolicy()).run(w))
    ll = summarize(FleetSim(ENERGY_FLEET, cfg, LeastLoaded()).run(w))
    print(f"joules/output token: energy-aware {ea['joules_per_output_token']:.4f}, "
          f"least-loaded {ll['joules_per_output_token']:.4f}")
    assert ea["completed"] == ll["completed"] == w.n
    assert ea["joules_per_output_token"] < 0.97 * ll["joules_per_output_token"]
    assert ea["slo_attainment"] >= ll["slo_attainment"] - 0.01


def test_energy_aware_flapping_is_bounded_and_hysteresis_bounds_it():
    pools = [PoolConfig("h100", "model", H100, replicas=4), PoolConfig("a10g", "model", A10G, replicas=4)]
    w = synthetic(4000, 30)
    flips = {}
    for h in (0.1, 0.0):
        pol = EnergyAwarePolicy(hysteresis=h)
        FleetSim(pools, SimConfig(), pol).run(w)
        flips[h] = pol.flips_per_1000("model")
    print(f"preferred-pool flips per 1000 requests: default {flips[0.1]:.1f}, h=0 {flips[0.0]:.1f}")
    assert flips[0.1] <= 20
    assert flips[0.0] > flips[0.1]
    same = [PoolConfig("h1", "model", H100, replicas=3), PoolConfig("h2", "model", H100, replicas=3)]
    pol = EnergyAwarePolicy()
    FleetSim(same, SimConfig(), pol).run(w)
    assert pol.flips_per_1000() == 0  # identical pools are one energy class


def test_hint_admission_perfect_rejects_least_and_cap_reservation_admits_fewest():
    rng = np.random.default_rng(0)
    n, rate = 3000, 25
    arrival = np.cumsum(rng.exponential(1 / rate, n))
    prompt, comp = rng.integers(100, 800, n), rng.integers(20, 400, n)
    hint = (prompt + comp) * np.exp(rng.normal(0, 0.3, n) + 1.2816 * 0.3)
    w = make_workload(arrival - arrival[0], prompt, comp, ("model",), hint_p90=hint)
    prof = GpuProfile("small", "t", base_s=0.01, max_batch=32, kv_capacity_tokens=16384)
    pools = [PoolConfig("p", "model", prof, replicas=2)]
    rejected = {}
    for mode in ("perfect", "hint", "none"):
        r = FleetSim(pools, SimConfig(), HintAdmission(mode, default_max_tokens=2048)).run(w)
        assert set(r.reject_reasons) <= {"kv_forecast"}
        rejected[mode] = r.counts()["rejected"]
    print(f"rejected: {rejected}")
    assert 0 < rejected["perfect"] <= rejected["hint"] < rejected["none"]
    light = w.time_scaled(0.1)
    r = FleetSim(pools, SimConfig(), HintAdmission("none", default_max_tokens=2048)).run(light)
    assert r.counts()["rejected"] == 0


def test_hint_admission_without_a_hint_reserves_the_cap():
    req = SimpleNamespace(prompt_tokens=100, completion_tokens=50, hint_p90=math.nan)
    assert HintAdmission("hint", default_max_tokens=1000).estimate(req) == 1100
    assert HintAdmission("perfect").estimate(req) == 150
    req.hint_p90 = 400.0  # a total-token forecast: the prompt is inside it
    assert HintAdmission("hint").estimate(req) == 400
    with pytest.raises(ValueError, match="HintAdmission.mode"):
        HintAdmission("oracle")


# ---------- telemetry: snapshots, staleness, the deterministic fallback ----------

def fake_fleet(queued, running):
    rep = SimpleNamespace(index=0, pool_id="p", model="m", region=None, profile=FLAT,
                          state="ready", queued=queued, running=running, kv_used=500,
                          kv_capacity=1000, max_batch=8, power_w=321.0)
    return SimpleNamespace(replicas=[rep], load=[queued + running])


def test_feed_snapshots_at_scrape_time_with_delay_ttl_and_outage():
    feed = TelemetryFeed(scrape_interval_s=1.0, delay_s=0.25, ttl_s=1.5, outage=[(2.0, 4.0)])
    fleet = fake_fleet(3, 5)
    feed.scrape(0.0, fleet)
    assert feed.observation(0, 0.2) is None                       # not yet delivered: missing
    fleet.replicas[0].queued = 99                                  # live state moves on
    obs = feed.observation(0, 0.3)
    assert obs.get(ObsField.QUEUE_DEPTH, 0.3) == 3                 # the value at the scrape
    assert obs.get(ObsField.KV_CACHE_USAGE, 0.3) == 0.5
    assert obs.fields[ObsField.QUEUE_DEPTH].source == "modeled"
    assert freshness(obs, 1.49) is Freshness.FRESH and freshness(obs, 1.5) is Freshness.STALE
    assert obs.get(ObsField.QUEUE_DEPTH, 1.5) is None             # stale is unreadable
    feed.scrape(1.0, fleet)
    assert feed.observation(0, 1.3).get(ObsField.QUEUE_DEPTH, 1.3) == 99
    for t in (2.0, 3.0):                                           # outage: scrapes fail
        feed.scrape(t, fleet)
    obs = feed.observation(0, 2.4)
    assert obs.get(ObsField.HEALTH, 2.4) == "unknown"
    assert obs.get(ObsField.QUEUE_DEPTH, 2.4) == 99               # old value until its TTL
    assert freshness(feed.observation(0, 2.6), 2.6) is Freshness.STALE
    feed.scrape(4.0, fleet)
    assert freshness(feed.observation(0, 4.2), 4.2) is Freshness.STALE   # in transit
    assert freshness(feed.observation(0, 4.25), 4.25) is Freshness.FRESH
    for t in np.arange(0.0, 6.0, 0.05):                           # fresh() is freshness()
        obs = feed.observation(0, t)
        fresh = freshness(obs, t) is Freshness.FRESH
        assert feed.fresh(0, t) == fresh
        assert (feed.values(0, t) is not None) == fresh
        if fresh:
            assert feed.values(0, t)[0] == obs.get(ObsField.QUEUE_DEPTH, t)
    with pytest.raises(PolicyError, match="control_interval_s"):
        feed.scrape(6.5, fleet)                                    # ticks sparser than scrapes


class Spy:
    """LeastLoaded that records the view and time of every call it gets."""

    def __init__(self) -> None:
        self.inner, self.calls = LeastLoaded(), []

    def admit(self, request, fleet, now):
        return None

    def choose(self, request, eligible, fleet, now):
        self.calls.append((now, type(fleet)))
        return self.inner.choose(request, eligible, fleet, now)


def run_with_feed(w, pools, delay=0.5):
    feed = TelemetryFeed(scrape_interval_s=1.0, delay_s=delay, ttl_s=3.0, outage=[(20.0, 40.0)])
    spy = Spy()
    pol = TelemetryAware(spy, feed, record=True)
    r = FleetSim(pools, feed.sim_config(SimConfig()), pol, controller=feed).run(w)
    return r, pol, spy


def test_stale_telemetry_switches_to_the_fallback_deterministically():
    w = synthetic(1500, 25)
    pools = [PoolConfig("h100", "model", H100, replicas=3), PoolConfig("a100", "model", A100, replicas=2)]
    r1, pol1, spy = run_with_feed(w, pools)
    r2, pol2, _ = run_with_feed(w, pools)
    assert pol1.trace == pol2.trace and np.array_equal(r1.replica, r2.replica)
    # last good scrape before the outage at 19 s goes stale at 22 s; the first good one after
    # it (40 s) arrives at 40.5 s; before the first scrape arrives (0.5 s) nothing is known
    for i, t, mode, choice in pol1.trace:
        in_fallback = t < 0.5 or 22.0 <= t < 40.5
        assert mode == ("fallback" if in_fallback else "telemetry"), (i, t, mode)
        if mode == "fallback":
            assert choice == [0, 1, 2, 3, 4][i % 5]  # round-robin keyed by the request index
    assert pol1.decisions["fallback"] == sum(22.0 <= t < 40.5 or t < 0.5 for t in w.arrival_s)
    assert pol1.decisions["telemetry"] > 0
    assert all(not (22.0 <= t < 40.5) and view is TelemetryView for t, view in spy.calls)


def test_telemetry_aware_refuses_to_run_without_scrapes():
    feed = TelemetryFeed()
    with pytest.raises(PolicyError, match="before any scrape"):
        FleetSim([PoolConfig("p", "model", FLAT)], SimConfig(),
                 TelemetryAware(LeastLoaded(), feed)).run(synthetic(5, 1))


# ---------- carbon ----------

def test_carbon_signal_reranks_regions_never_overrides_residency_and_expires():
    pools = [PoolConfig("eu", "model", H100, replicas=2, region="eu"),
             PoolConfig("us", "model", H100, replicas=2, region="us")]
    w = synthetic(600, 5, regions=("", "us"), region_mix=(0.5, 0.5))
    signals = [CarbonSignal("eu", 500.0, 0.0, 1e6, 1), CarbonSignal("us", 50.0, 0.0, 1e6, 1),
               CarbonSignal("eu", 20.0, 0.0, 1e6, 2)]        # a re-issue: version 2 wins
    pol = EnergyAwarePolicy(carbon=signals)
    assert pol.intensity("eu", 10.0) == 20.0
    r = FleetSim(pools, SimConfig(), Audited(pol)).run(w)
    rep_region = r.replicas.set_index("replica").loc[r.replica, "region"].to_numpy()
    anywhere = w.region == -1
    assert (rep_region[~anywhere] == "us").all()               # residency holds
    assert (rep_region[anywhere] == "eu").mean() > 0.9         # low-carbon region preferred
    assert pol.carbon_used == w.n
    expired = EnergyAwarePolicy(carbon=[CarbonSignal("eu", 20.0, 0.0, 1.0, 1),
                                        CarbonSignal("us", 50.0, 0.0, 1e6, 1)])
    FleetSim(pools, SimConfig(), expired).run(w)
    assert expired.intensity("eu", 2.0) is None
    assert expired.carbon_ignored == int((w.arrival_s >= 1.0)[anywhere].sum())
    with pytest.raises(ValueError, match="CarbonSignal.valid_until_s"):
        CarbonSignal("eu", 1.0, 5.0, 5.0, 1)


# ---------- shadow and canary ----------

class ResidencyBreaker:
    """A bad candidate: the first replica of the model anywhere, ignoring residency."""

    def admit(self, request, fleet, now):
        return None

    def choose(self, request, eligible, fleet, now):
        for rep in fleet.replicas:
            if rep.model == request.model and rep.state == "ready":
                return rep.index
        return eligible[0]


def test_shadow_reports_a_residency_violating_candidate_without_changing_the_run():
    pools = [PoolConfig("eu", "model", H100, replicas=2, region="eu"),
             PoolConfig("us", "model", A100, replicas=2, region="us")]
    w = synthetic(800, 10, regions=("eu", "us"), region_mix=(0.5, 0.5))
    alone = FleetSim(pools, SimConfig(), LeastLoaded()).run(w)
    shadow = ShadowPolicy(LeastLoaded(), ResidencyBreaker())
    shadowed = FleetSim(pools, SimConfig(), shadow).run(w)
    for name in ("state", "replica", "start_s", "end_s", "output_tokens"):
        assert np.array_equal(getattr(alone, name), getattr(shadowed, name), equal_nan=True)
    assert shadowed.energy_j == alone.energy_j
    rep = shadow_report(shadow, shadowed)
    assert rep["candidate_violations"] > 0 and rep["violations_by_kind"].keys() == {"residency"}
    assert rep["canary_ready"] is False and "hard-constraint" in rep["reasons"][0]
    assert rep["acting"]["completed"] == w.n
    good = ShadowPolicy(LeastLoaded(), EnergyAwarePolicy())
    rep = shadow_report(good, FleetSim(pools, SimConfig(), good).run(w))
    assert rep["candidate_violations"] == 0 and rep["canary_ready"] is True, rep["reasons"]
    assert 0 < rep["choice_agreement"] < 1 and rep["admit_agreement"] == 1.0


def test_energy_aware_breaks_a_tie_between_classes_by_label_not_pool_order():
    """Two regions with the same profile score the same: the class label (profile@region)
    decides, whichever pool the fleet lists first (issue 30: ties never arbitrary)."""
    w = make_workload([0.0, 5.0, 10.0], [100, 100, 100], [10, 10, 10])
    chosen = []
    for order in (("us", "eu"), ("eu", "us")):
        pools = [PoolConfig(reg, "m", H100, replicas=1, region=reg) for reg in order]
        probe = Probe(EnergyAwarePolicy())
        FleetSim(pools, SimConfig(), probe).run(w)
        chosen.append([pool for _, pool, _ in probe.seen])
    assert chosen[0] == chosen[1] == ["eu", "eu", "eu"]
