"""GPU profiles and energy: FleetSim constants, fits to measured points, joules in the simulator.

The profiles read the points the package ships (replaylab.data, fleet/); one test checks
them against the full downloads when those are there (`shared_data`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from replaylab.data import shipped
from replaylab.fleet.hardware.curves import fit_power_curve, logistic_power_w
from replaylab.fleet.hardware.profiles import (
    DATA_FOLDER,
    FITTED_PROFILES,
    FLEETSIM_PROFILES,
    MLENERGY_SHIPPED,
    SPLITWISE_SHIPPED,
    GpuProfile,
    calibrate_mlenergy,
    calibrate_splitwise,
    kv_capacity_estimate,
    load_fleetsim_profiles,
    read_mlenergy,
    read_splitwise,
    weakest,
)
from replaylab.fleet.sim.fleet import PoolConfig, SimConfig
from replaylab.fleet.sim.outcomes import summarize
from replaylab.fleet.sim.simulator import FleetSim
from replaylab.fleet.sim.workload import Workload

SECTION = "manual_profiles__fleet_sim/gpu_profiles/profiles.py"


@pytest.fixture(scope="module")
def fleetsim():
    path = shipped(DATA_FOLDER, FLEETSIM_PROFILES)
    return load_fleetsim_profiles(), json.loads(path.read_text())[SECTION]


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
def test_power_and_throughput_fits_explain_the_measured_points(model):
    cal = calibrate_mlenergy(model=model, gpu="H100", kv_capacity_tokens=400_000)
    power, tput = cal.fits["power"], cal.fits["throughput"]
    assert power.mape < 0.02 and power.max_abs_rel < 0.05
    assert tput.mape < 0.04 and tput.max_abs_rel < 0.10
    p = cal.profile
    assert p.power_idle_w < p.power_nominal_w
    assert (p.service_provenance, p.power_provenance, p.kv_provenance) == (
        "calibrated", "calibrated", "modeled")
    table = power.table()
    assert len(table) == power.y.size and {"measured", "fitted", "rel_residual"} <= set(table)


def test_splitwise_step_time_fit(fleetsim):
    cal = calibrate_splitwise(model="llama2-70b", hardware="h100-80gb", tensor_parallel=2,
                              kv_capacity_tokens=200_000, power_from=fleetsim[0]["H100-80GB"])
    step = cal.fits["decode_step"]
    assert step.mape < 0.03 and step.max_abs_rel < 0.08
    assert cal.profile.gpus == 2 and cal.profile.prefill_chunk_s > 0
    assert cal.profile.energy_provenance == "modeled"  # power borrowed from FleetSim


def test_shipped_fits_are_the_fits_of_the_shipped_points():
    """fitted_profiles.json (scripts/fleet_data.py --fits) is what the shipped points give."""
    record = json.loads(shipped(DATA_FOLDER, FITTED_PROFILES).read_text())
    assert len(record["mlenergy"]) == len(MLENERGY_SHIPPED)
    assert len(record["splitwise"]) == len(SPLITWISE_SHIPPED)
    for task, model, gpu, n in MLENERGY_SHIPPED:
        cal = calibrate_mlenergy(model=model, gpu=gpu, num_gpus=n, task=task,
                                 kv_capacity_tokens=400_000)
        want = record["mlenergy"][f"{task} {model} {gpu}x{n}"]
        for curve, fit in cal.fits.items():
            got = fit.summary()
            assert got["n_points"] == want[curve]["n_points"]
            for k, v in want[curve].items():
                if isinstance(v, float):
                    assert got[k] == pytest.approx(v, rel=1e-6, abs=1e-9), (model, gpu, k)
    h100 = load_fleetsim_profiles()["H100-80GB"]
    for model, hw, tp in SPLITWISE_SHIPPED:
        cal = calibrate_splitwise(model=model, hardware=hw, tensor_parallel=tp,
                                  kv_capacity_tokens=200_000, power_from=h100)
        want = record["splitwise"][f"{model} {hw} tp{tp}"]
        for curve, fit in cal.fits.items():
            for k, v in want[curve].items():
                if isinstance(v, float):
                    assert fit.summary()[k] == pytest.approx(v, rel=1e-6, abs=1e-9), (hw, tp, k)


def test_a_configuration_not_shipped_says_so_and_a_missing_download_says_where():
    with pytest.raises(ValueError, match="shipped points hold only"):
        calibrate_mlenergy(model="Qwen/Qwen3-14B", gpu="H100", kv_capacity_tokens=400_000)
    with pytest.raises(FileNotFoundError, match=r"no such file.*ML.ENERGY.*https://ml.energy"):
        calibrate_mlenergy("nowhere/mlenergy_v3_measured.csv", model="m", gpu="H100",
                           kv_capacity_tokens=1)


def test_shipped_points_are_the_full_files_rows(shared_data):
    """The shipped ML.ENERGY and Splitwise points are the rows of their configurations in
    the full downloads, unchanged (needs ../shared/data: skipped without it)."""
    import pandas as pd

    full = read_mlenergy(shared_data / "energy" / "mlenergy_v3_measured.csv")
    keys = ["task", "model", "gpu", "num_gpus"]
    want = full[full[keys].apply(tuple, axis=1).isin(MLENERGY_SHIPPED)].reset_index(drop=True)
    pd.testing.assert_frame_equal(read_mlenergy(), want)
    full = read_splitwise(shared_data / "energy" / "splitwise_perf.csv")
    keys = ["model", "hardware", "tensor_parallel"]
    want = full[full[keys].apply(tuple, axis=1).isin(SPLITWISE_SHIPPED)].reset_index(drop=True)
    pd.testing.assert_frame_equal(read_splitwise(), want)


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
