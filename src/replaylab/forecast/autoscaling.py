"""LEGACY fluid approximation, used only by forecast/experiments.py until its rewire.

Autoscaling is measured on the event-driven fleet simulator
(`replaylab.fleet.autoscaling_experiment`; controllers in
`replaylab.fleet.autoscaling`). This tick-based fluid model is not
cross-checked against it and is not kept as an approximation: it goes, with
autoscaling_policies.py, capacity.py and recommendation.py, when
`python -m evaluation experiment=autoscaling` is rewired.

Discrete-time simulator of one serving pool under an autoscaling policy.

Time advances in ticks of `tick_s` (15 s, the HPA sync period). A tick k:
1. replicas whose cold start has ended become ready;
2. the tick's arrivals (requests, each costing `work[k]` replica-seconds) join
   a FIFO fluid queue as one cohort;
3. the ready replicas serve `ready * tick_s` replica-seconds of the queue,
   oldest cohort first; a cohort served in tick k that arrived in tick j waited
   (k - j) * tick_s, and meets the SLO when that is <= `slo_wait_s`;
4. cohorts older than `timeout_s` leave as timed out;
5. the policy sees the tick and returns a replica count; scale-down is
   immediate, added replicas are billed at once and ready `cold_start_s` later.

Queue model (modeled, documented in docs/autoscaling.md): a fluid queue whose
backlog drains at spare capacity; waiting time at tick resolution. Requests
arriving while load <= ready capacity and no backlog wait 0; burstiness inside
a tick is not modeled (the arrivals per tick are Poisson around a noisy rate),
which is why the policies keep headroom (target utilization < 1).

Every request ends in exactly one state: `served_in_slo`, `served_late`,
`timed_out`, or still `queued` when the drain ends; their sum equals `arrived`.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class PoolConfig:
    """One pool: tick, cold start, SLO on waiting time, bounds (seconds, replicas)."""

    tick_s: float = 15.0
    cold_start_s: float = 180.0
    gpus_per_replica: int = 4
    min_replicas: int = 1
    max_replicas: int = 10_000
    slo_wait_s: float = 0.0            # 0: served in the tick of arrival
    timeout_s: float = 600.0
    drain_s: float = 3600.0            # after the trace, serve the backlog for at most this long
    oscillation_window_s: float = 600.0
    attainment_window_s: float = 300.0  # trailing window of `Observation.recent_attainment`

    def __post_init__(self) -> None:
        if self.tick_s <= 0 or self.cold_start_s < 0 or self.slo_wait_s < 0:
            raise ValueError(f"PoolConfig: tick_s={self.tick_s}, cold_start_s="
                             f"{self.cold_start_s}, slo_wait_s={self.slo_wait_s} out of range")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"PoolConfig: min_replicas={self.min_replicas} "
                             f"max_replicas={self.max_replicas}")

    @property
    def cold_ticks(self) -> int:
        return math.ceil(self.cold_start_s / self.tick_s - 1e-9)


@dataclass(frozen=True)
class Demand:
    """Arrivals per tick (requests) and replica-seconds per request in each tick."""

    arrivals: np.ndarray
    work: np.ndarray
    t0_ms: int = 0  # epoch ms of tick 0 (recommendations are timed in epoch ms)

    def __post_init__(self) -> None:
        if self.arrivals.shape != self.work.shape or (self.arrivals < 0).any() or (
                self.work <= 0).any():
            raise ValueError("Demand: arrivals >= 0 and work > 0, one of each per tick")


@dataclass
class Observation:
    """What a policy sees at the end of a tick (the pool's own metrics)."""

    tick: int
    t_s: float            # seconds since tick 0, end of this tick
    t_ms: int             # epoch ms, end of this tick
    ready: int
    starting: int
    arrived_work: float   # replica-seconds that arrived this tick
    backlog_work: float   # replica-seconds still queued after this tick
    recent_attainment: float  # in-SLO share of outcomes in the trailing window (1 if none)

    @property
    def current(self) -> int:
        return self.ready + self.starting


class Policy(Protocol):
    name: str

    def initial_replicas(self, first_work_rate: float) -> int: ...

    def decide(self, obs: Observation) -> int: ...


@dataclass
class SimResult:
    """Per-tick series and totals of one run (requests are fluid: floats)."""

    policy: str
    provisioned: np.ndarray   # replicas billed per tick (ready + starting)
    ready: np.ndarray
    needed: np.ndarray        # replica-equivalents of the tick's arrived work at 100% util
    backlog: np.ndarray       # replica-seconds queued after each tick
    totals: dict = field(default_factory=dict)
    actions: list = field(default_factory=list)  # (tick, from, to)


class _Pool:
    """Replica bookkeeping: `ready` count and the ready-ticks of starting replicas."""

    def __init__(self, replicas: int) -> None:
        self.ready = replicas
        self.starting: deque[int] = deque()

    def promote(self, tick: int) -> None:
        while self.starting and self.starting[0] <= tick:
            self.starting.popleft()
            self.ready += 1

    def resize(self, target: int, ready_tick: int) -> None:
        n = self.ready + len(self.starting)
        for _ in range(target - n):
            self.starting.append(ready_tick)
        for _ in range(n - target):  # newest starting replicas go first, then ready ones
            if self.starting:
                self.starting.pop()
            else:
                self.ready -= 1


class _FluidQueue:
    """FIFO cohorts [arrival tick, requests, replica-seconds per request]."""

    def __init__(self) -> None:
        self.cohorts: deque[list] = deque()
        self.work = 0.0

    def add(self, tick: int, requests: float, work: float) -> None:
        if requests > 0:
            self.cohorts.append([tick, float(requests), work])
            self.work += requests * work

    def serve(self, tick: int, capacity: float, slo_ticks: int) -> tuple[float, float]:
        """Serve `capacity` replica-seconds; return (requests in SLO, requests late)."""
        in_slo = late = 0.0
        while capacity > 1e-12 and self.cohorts:
            c = self.cohorts[0]
            n = min(c[1], capacity / c[2])
            capacity -= n * c[2]
            self.work -= n * c[2]
            if tick - c[0] <= slo_ticks:
                in_slo += n
            else:
                late += n
            c[1] -= n
            if c[1] <= 1e-9:
                self.work -= c[1] * c[2]
                late += c[1] if tick - c[0] > slo_ticks else 0.0
                in_slo += c[1] if tick - c[0] <= slo_ticks else 0.0
                self.cohorts.popleft()
        self.work = max(self.work, 0.0)
        return in_slo, late

    def expire(self, tick: int, timeout_ticks: int) -> float:
        dropped = 0.0
        while self.cohorts and tick - self.cohorts[0][0] >= timeout_ticks:
            c = self.cohorts.popleft()
            dropped += c[1]
            self.work -= c[1] * c[2]
        self.work = max(self.work, 0.0) if self.cohorts else 0.0
        return dropped

    @property
    def requests(self) -> float:
        return float(sum(c[1] for c in self.cohorts))


def _count_oscillations(actions: list, window_ticks: int) -> int:
    """Direction changes between consecutive actions no more than `window_ticks` apart."""
    osc = 0
    for (t0, a0, b0), (t1, a1, b1) in zip(actions, actions[1:], strict=False):
        if (b0 - a0) * (b1 - a1) < 0 and t1 - t0 <= window_ticks:
            osc += 1
    return osc


def simulate(demand: Demand, policy: Policy, cfg: PoolConfig) -> SimResult:
    """Run `policy` on `demand`; the trace is followed by a drain with no arrivals."""
    n = len(demand.arrivals)
    tick = cfg.tick_s
    slo_ticks = int(cfg.slo_wait_s // tick)
    timeout_ticks = max(1, math.ceil(cfg.timeout_s / tick))
    window = max(1, round(cfg.attainment_window_s / tick))
    first = float(demand.arrivals[0] * demand.work[0] / tick)
    pool = _Pool(min(cfg.max_replicas, max(cfg.min_replicas, policy.initial_replicas(first))))
    q = _FluidQueue()
    prov, ready, needed, backlog = (np.zeros(n) for _ in range(4))
    in_slo_t, out_t = np.zeros(n), np.zeros(n)  # for the trailing attainment window
    tot = {"arrived": 0.0, "served_in_slo": 0.0, "served_late": 0.0, "timed_out": 0.0}
    actions: list[tuple[int, int, int]] = []
    for k in range(n):
        pool.promote(k)
        a, w = float(demand.arrivals[k]), float(demand.work[k])
        q.add(k, a, w)
        s_in, s_late = q.serve(k, pool.ready * tick, slo_ticks)
        dropped = q.expire(k, timeout_ticks)
        tot["arrived"] += a
        tot["served_in_slo"] += s_in
        tot["served_late"] += s_late
        tot["timed_out"] += dropped
        in_slo_t[k], out_t[k] = s_in, s_in + s_late + dropped
        prov[k], ready[k], needed[k], backlog[k] = (pool.ready + len(pool.starting), pool.ready,
                                                    a * w / tick, q.work)
        lo = max(0, k + 1 - window)
        outs = out_t[lo:k + 1].sum()
        obs = Observation(k, (k + 1) * tick, demand.t0_ms + int((k + 1) * tick * 1000),
                          pool.ready, len(pool.starting), a * w, q.work,
                          in_slo_t[lo:k + 1].sum() / outs if outs > 0 else 1.0)
        target = min(cfg.max_replicas, max(cfg.min_replicas, int(policy.decide(obs))))
        if target != obs.current:
            actions.append((k, obs.current, target))
            pool.resize(target, k + 1 + cfg.cold_ticks)
    k = n
    while q.cohorts and (k - n) * tick < cfg.drain_s:  # drain: no arrivals, last replica count
        pool.promote(k)
        s_in, s_late = q.serve(k, max(pool.ready, 1) * tick, slo_ticks)
        tot["served_in_slo"] += s_in
        tot["served_late"] += s_late
        tot["timed_out"] += q.expire(k, timeout_ticks)
        k += 1
    tot["queued_end"] = q.requests
    return SimResult(policy.name, prov, ready, needed, backlog,
                     _metrics(tot, prov, ready, needed, actions, cfg), actions)


def _metrics(tot: dict, prov: np.ndarray, ready: np.ndarray, needed: np.ndarray,
             actions: list, cfg: PoolConfig) -> dict:
    gh = cfg.gpus_per_replica * cfg.tick_s / 3600.0  # GPU-hours per replica-tick
    arrived = tot["arrived"]
    out = {k: round(v, 3) for k, v in tot.items()}
    out.update({
        "slo_attainment": round(tot["served_in_slo"] / arrived, 6) if arrived else 1.0,
        "gpu_hours": round(float(prov.sum() * gh), 3),
        "overprovision_gpu_hours": round(float(np.maximum(prov - needed, 0).sum() * gh), 3),
        "underprovision_gpu_hours": round(float(np.maximum(needed - ready, 0).sum() * gh), 3),
        "scaling_actions": len(actions),
        "replicas_added": int(sum(max(b - a, 0) for _, a, b in actions)),
        "replicas_removed": int(sum(max(a - b, 0) for _, a, b in actions)),
        "oscillations": _count_oscillations(
            actions, max(1, round(cfg.oscillation_window_s / cfg.tick_s))),
        "mean_replicas": round(float(prov.mean()), 3),
        "peak_replicas": int(prov.max()) if len(prov) else 0,
    })
    return out
