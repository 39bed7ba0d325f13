"""GPU profiles and energy: FleetSim constants, fits to measured points, joules in the simulator."""

from __future__ import annotations

import json

import numpy as np
import pytest

from replaylab.fleet.hardware.curves import fit_power_curve, logistic_power_w
from replaylab.fleet.hardware.profiles import (
    GpuProfile,
    calibrate_mlenergy,
    calibrate_splitwise,
    kv_capacity_estimate,
    load_fleetsim_profiles,
    weakest,
)
from replaylab.fleet.sim.fleet import PoolConfig, SimConfig
from replaylab.fleet.sim.outcomes import summarize
from replaylab.fleet.sim.simulator import FleetSim
from replaylab.fleet.sim.workload import Workload

SECTION = "manual_profiles__fleet_sim/gpu_profiles/profiles.py"


@pytest.fixture(scope="module")
def fleetsim(shared_data):
    path = shared_data / "fleet" / "fleetsim_gpu_profiles.json"
    return load_fleetsim_profiles(path), json.loads(path.read_text())[SECTION]


def test_fleetsim_profiles_reproduce_fleetsims_own_numbers(fleetsim):
    profiles, raw = fleetsim
    for name, prof in profiles.items():
        expect = raw[name]
        table = prof.power_table()
        for batch, watts in expect["computed_power_W_at_batch"].items():
            if int(batch) <= prof.max_batch:
                assert table[int(batch)] == pytest.approx(watts, abs=0.06)
        n1, n_slots = expect["computed_iter_latency_ms_n1_and_nslots8192"]
        ctx = expect["calibration_ctx"]
        assert prof.iteration_s(1, ctx) * 1e3 == pytest.approx(n1, abs=0.01)
        slots = expect["computed_n_slots"]["8192"]
        assert prof.iteration_s(slots, slots * ctx) * 1e3 == pytest.approx(n_slots, rel=1e-3)
        assert prof.kv_capacity_tokens // 8192 == slots
        assert prof.energy_provenance == "modeled"  # mixed per-GPU / per-instance units


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-8B",
                                   "meta-llama/Llama-3.1-70B-Instruct"])
def test_power_and_throughput_fits_explain_the_measured_points(shared_data, model):
    cal = calibrate_mlenergy(shared_data / "energy" / "mlenergy_v3_measured.csv", model=model,
                             gpu="H100", kv_capacity_tokens=400_000)
    power, tput = cal.fits["power"], cal.fits["throughput"]
    assert power.mape < 0.02 and power.max_abs_rel < 0.05
    assert tput.mape < 0.04 and tput.max_abs_rel < 0.10
    p = cal.profile
    assert p.power_idle_w < p.power_nominal_w
    assert (p.service_provenance, p.power_provenance, p.kv_provenance) == (
        "calibrated", "calibrated", "modeled")
    table = power.table()
    assert len(table) == power.y.size and {"measured", "fitted", "rel_residual"} <= set(table)


def test_splitwise_step_time_fit(shared_data, fleetsim):
    cal = calibrate_splitwise(shared_data / "energy" / "splitwise_perf.csv", model="llama2-70b",
                              hardware="h100-80gb", tensor_parallel=2,
                              kv_capacity_tokens=200_000, power_from=fleetsim[0]["H100-80GB"])
    step = cal.fits["decode_step"]
    assert step.mape < 0.03 and step.max_abs_rel < 0.08
    assert cal.profile.gpus == 2 and cal.profile.prefill_chunk_s > 0
    assert cal.profile.energy_provenance == "modeled"  # power borrowed from FleetSim


def test_power_fit_recovers_a_known_curve():
    n = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256.0])
    watts = logistic_power_w(n, 250.0, 650.0, 1.1, 4.5)
    fit = fit_power_curve(n, watts, source="synthetic")
    assert fit.params["idle_w"] == pytest.approx(250.0, rel=1e-3)
    assert fit.params["x0"] == pytest.approx(4.5, rel=1e-3)
    assert fit.rmse < 1e-6
    held = fit_power_curve(n, watts, source="synthetic", idle_w=250.0)
    assert held.params["idle_w"] == 250.0 and held.params["nominal_w"] == pytest.approx(650.0)


def test_provenance_order_and_kv_estimate():
    assert weakest(["calibrated", "measured"]) == "calibrated"
    assert weakest(["calibrated", "projected", "modeled"]) == "projected"
    # Llama-3.1-8B on one H100: 72 GB usable - 16 GB weights, 128 KiB per token
    assert kv_capacity_estimate(80, 16, 131072) == pytest.approx(427_246, rel=1e-3)


IDLE_ONLY = GpuProfile("p", "test", base_s=0.01, gpus=2, power_idle_w=100.0,
                       power_nominal_w=500.0, power_k=1.0, power_x0=0.0, max_batch=4,
                       kv_capacity_tokens=10_000, service_provenance="calibrated",
                       power_provenance="calibrated")


def _one_request(at: float, completion: int) -> Workload:
    return Workload(np.array([at]), np.array([10]), np.array([completion]), np.zeros(1),
                    ("m",), np.zeros(1), ("interactive",), np.full(1, -1))


def test_energy_integrates_power_over_busy_and_idle_intervals():
    # one request at t=10 running 100 iterations of 10 ms = 1 s, window 0..100 s
    w = _one_request(10.0, 100)
    r = FleetSim([PoolConfig("p", "m", IDLE_ONLY)], SimConfig(horizon_s=100.0)).run(w)
    busy_w = 2 * logistic_power_w(1, 100.0, 500.0, 1.0, 0.0)  # 2 GPUs at batch 1: 300 W each
    expect = 2 * 100.0 * 99.0 + float(busy_w) * 1.0
    assert r.energy_j == pytest.approx(expect, rel=1e-9)
    assert r.replicas["busy_s"].iloc[0] == pytest.approx(1.0)
    assert r.gpu_hours == pytest.approx(2 * 100 / 3600)
    s = summarize(r)
    assert s["joules_per_success"] == pytest.approx(expect)
    assert s["joules_per_output_token"] == pytest.approx(expect / 100)
    assert s["energy_provenance"] == "calibrated"
    assert s["cost"] == pytest.approx(r.gpu_hours * IDLE_ONLY.cost_per_gpu_hour)


def test_a_replica_that_never_serves_still_costs_idle_energy():
    w = _one_request(0.0, 10)
    pools = [PoolConfig("p", "m", IDLE_ONLY, replicas=3)]
    r = FleetSim(pools, SimConfig(horizon_s=50.0)).run(w)
    idle = r.replicas[r.replicas["served"] == 0]
    assert len(idle) == 2
    assert idle["energy_j"].to_numpy() == pytest.approx([2 * 100.0 * 50.0] * 2)
