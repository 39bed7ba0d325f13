"""The simulator against queueing theory: M/G/c (Lee-Longton) in the stable regime."""

from __future__ import annotations

import math

import numpy as np
import pytest

from replaylab.data import shipped
from replaylab.fleet.hardware.profiles import GpuProfile
from replaylab.fleet.policies.reference import RoundRobin
from replaylab.fleet.sim.fleet import PoolConfig, SimConfig
from replaylab.fleet.sim.queueing import (
    erlang_b,
    erlang_c,
    mgc_mean_wait,
    mgc_summary,
    single_sequence_service_s,
)
from replaylab.fleet.sim.simulator import FleetSim
from replaylab.fleet.sim.workload import SyntheticWorkloadConfig, workload_from_cdf

ONE_SERVER = GpuProfile("one-sequence", "test", base_s=0.01, chunk_tokens=512, max_batch=1,
                        kv_capacity_tokens=10**6)


def test_erlang_formulas_match_known_values():
    assert erlang_b(1, 1.0) == pytest.approx(0.5)
    assert erlang_b(2, 1.0) == pytest.approx(0.2)
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)  # M/M/2, a = 1
    assert erlang_c(1, 0.6) == pytest.approx(0.6)  # M/M/1: P(wait) = rho
    # M/M/1: Wq = rho / (mu - lam)
    assert mgc_mean_wait(0.6, 1.0, 1.0, 1) == pytest.approx(0.6 / 0.4)
    # M/D/1 (cs2 = 0): Pollaczek-Khinchine, half the M/M/1 wait
    assert mgc_mean_wait(0.6, 1.0, 0.0, 1) == pytest.approx(0.75)
    assert mgc_mean_wait(2.0, 1.0, 1.0, 2) == math.inf  # unstable


def test_single_sequence_service_time_matches_the_iteration_count():
    # prompt 1000 -> 2 chunks of 512; 5 output tokens -> 4 more iterations; 10 ms each
    s = single_sequence_service_s(np.array([1000]), np.array([5]), ONE_SERVER)
    assert s[0] == pytest.approx(6 * 0.01)


@pytest.mark.parametrize("cdf,c,rho", [("azure", 4, 0.7), ("agent_heavy", 8, 0.8)])
def test_mgc_wait_and_utilization_within_10_percent(cdf, c, rho):
    """Poisson arrivals, c one-sequence replicas, one shared FIFO: an M/G/c queue."""
    w0 = workload_from_cdf(shipped("fleet", f"{cdf}_cdf.json"),
                           SyntheticWorkloadConfig(n_requests=100_000, rate_per_s=1.0), seed=0)
    service = single_sequence_service_s(w0.prompt_tokens, w0.completion_tokens, ONE_SERVER)
    w = w0.time_scaled(rho * c / service.mean())
    lam = (w.n - 1) / w.duration_s  # the realised rate
    analytic = mgc_summary(lam, service, c)
    assert 0.5 < analytic["cs2"] < 2.0  # the regime where Allen-Cunneen is accurate
    result = FleetSim([PoolConfig("p", "model", ONE_SERVER, replicas=c)],
                      SimConfig(queueing="shared", queue_capacity=10**9), RoundRobin()).run(w)
    assert result.counts()["completed"] == w.n
    wait = float(np.nanmean(result.queue_wait_s))
    assert wait == pytest.approx(analytic["mean_wait_s"], rel=0.10)
    assert result.utilization() == pytest.approx(analytic["utilization"], rel=0.10)
