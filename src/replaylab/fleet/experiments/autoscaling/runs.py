"""One autoscaling run on the fleet simulator: build the pool and its controller, simulate, measure.

`simulate_policy(setup, policy, workload, plan, ...)` runs one of the policies

    static              the pool sized once (StaticController; no control ticks)
    reactive            HPAController on batch occupancy from the telemetry feed
    forecast            ForecastController on signed recommendations, with the reactive floor
    forecast_no_floor   the same, following the forecast alone

on one workload and returns `run_metrics`: request end states (conserved),
SLO attainment (TTFT and TPOT targets; rejections and timeouts count as
misses), GPU-hours (switched on: cold start and drain included), joules (all
replicas, idle included), scale events, oscillations, how each sync was
decided, and the replica count over time.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from replaylab.contracts.events import EventLog
from replaylab.fleet.control.controllers import (
    ForecastController,
    ForecastPolicyConfig,
    HPAConfig,
    HPAController,
    StaticController,
    oscillations,
)
from replaylab.fleet.control.recommendations import (
    RecommendationInbox,
    recommendations_from_forecast,
)
from replaylab.fleet.hardware.profiles import GpuProfile
from replaylab.fleet.policies.reference import LeastLoaded
from replaylab.fleet.sim.fleet import PoolConfig, SimConfig
from replaylab.fleet.sim.outcomes import SloTarget, summarize
from replaylab.fleet.sim.simulator import FleetSim
from replaylab.fleet.telemetry.feed import TelemetryFeed

POOL, MODEL = "pool-a", "model"
POLICIES = ("static", "reactive", "forecast", "forecast_no_floor")


@dataclass(frozen=True)
class RunSetup:
    """What every run of one experiment shares (the pool, the feed, the SLO, the controllers)."""

    profile: GpuProfile
    work_s: float                      # modeled replica-seconds per request (hardware/capacity.py)
    cold_start_s: float
    min_replicas: int
    max_replicas: int
    queue_capacity: int
    queue_timeout_s: float
    horizon_s: float
    slo: Mapping[str, SloTarget]
    reactive: HPAConfig
    forecast_policy: ForecastPolicyConfig
    forecast_quantile: float
    forecast_target_util: float
    scrape_interval_s: float = 15.0
    ttl_s: float = 45.0
    delay_s: float = 0.0
    outage: tuple[tuple[float, float], ...] = ()
    oscillation_window_s: float = 600.0


@dataclass(frozen=True)
class RunPlan:
    """Per scenario and seed: the static count, the dynamic policies' start, the forecast."""

    static_replicas: int
    initial_replicas: int
    forecast: pd.DataFrame | None     # aggregates-v1 forecast form (epoch ms)
    t0_ms: int                        # epoch ms of simulated time 0
    key: bytes                        # HMAC key of this run's recommendations


def _feed(s: RunSetup) -> TelemetryFeed:
    return TelemetryFeed(scrape_interval_s=s.scrape_interval_s, delay_s=s.delay_s,
                         ttl_s=s.ttl_s, outage=s.outage)


def build_controller(s: RunSetup, policy: str, plan: RunPlan, feed: TelemetryFeed,
                     target_util: float | None = None) -> tuple[Any, EventLog | None]:
    """(controller, event log or None) of `policy`; target_util overrides its sizing target."""
    if policy == "static":
        return StaticController(POOL, s.min_replicas, s.max_replicas), None
    hpa_cfg = s.reactive if target_util is None or policy != "reactive" else replace(
        s.reactive, target_util=target_util)
    hpa = HPAController(POOL, feed, hpa_cfg, s.min_replicas, s.max_replicas)
    if policy == "reactive":
        return hpa, None
    if policy not in ("forecast", "forecast_no_floor"):
        raise ValueError(f"policy {policy!r}: one of {POLICIES}")
    if plan.forecast is None:
        raise ValueError(f"policy {policy!r} needs a forecast table")
    log = EventLog()
    recs = recommendations_from_forecast(
        plan.forecast, pool=POOL, quantile=s.forecast_quantile, work_s=s.work_s,
        target_util=target_util or s.forecast_target_util,
        lead_s=s.cold_start_s + s.reactive.sync_s, t0_ms=plan.t0_ms, key=plan.key,
        min_replicas=s.min_replicas, max_replicas=s.max_replicas)
    cfg = s.forecast_policy if policy == "forecast" else replace(s.forecast_policy,
                                                                  floor_occupancy=None)
    ctl = ForecastController(POOL, RecommendationInbox(recs, plan.key, POOL, log), hpa, cfg,
                             log, s.min_replicas, s.max_replicas)
    return ctl, log


def simulate_policy(s: RunSetup, policy: str, workload, plan: RunPlan,
                    target_util: float | None = None) -> dict[str, Any]:
    """Run `policy` on `workload`; `run_metrics` plus the event counts."""
    wall = time.perf_counter()
    feed = _feed(s)
    ctl, log = build_controller(s, policy, plan, feed, target_util)
    n0 = plan.static_replicas if policy == "static" else plan.initial_replicas
    pool = PoolConfig(POOL, MODEL, s.profile, replicas=int(n0), cold_start_s=s.cold_start_s)
    cfg = SimConfig(queueing="replica", queue_capacity=s.queue_capacity,
                    queue_timeout_s=s.queue_timeout_s, horizon_s=s.horizon_s, warm_start=True)
    if policy == "static":  # it never acts: no control ticks to pay for
        result = FleetSim([pool], cfg, LeastLoaded()).run(workload)
    else:
        result = FleetSim([pool], feed.sim_config(cfg), LeastLoaded(),
                          controller=feed.around(ctl)).run(workload)
    out = run_metrics(result, ctl, int(n0), s)
    out["events"] = log.counts() if log is not None else {}
    out["scrapes"], out["failed_scrapes"] = feed.scrapes, feed.failed_scrapes
    out["wall_s"] = round(time.perf_counter() - wall, 2)
    return out


def run_metrics(result, controller, initial: int, s: RunSetup) -> dict[str, Any]:
    """The numbers one run reports (see the module doc); `trace`: [(t, replicas)] per sync."""
    summ = summarize(result, s.slo)
    counts = {k: int(summ[k]) for k in ("arrived", "completed", "rejected", "timed_out",
                                         "cancelled")}
    acts = controller.actions
    trace = [(0.0, initial), *controller.trace]
    on_s = float(result.replicas["on_s"].sum()) if len(result.replicas) else 0.0
    window = max(result.end_time_s, 1e-9)
    return {
        **counts,
        "conserved": counts["arrived"] == sum(v for k, v in counts.items() if k != "arrived"),
        "slo_attainment": float(summ["slo_attainment"]),
        "ttft_p99_s": float(summ["ttft_p99_s"]),
        "gpu_hours": float(result.gpu_hours),
        "energy_kwh": float(result.energy_j) / 3.6e6,
        "joules_per_success": float(summ["joules_per_success"]),
        "scale_events": len(acts),
        "replicas_added": int(sum(max(b - a, 0) for _, a, b in acts)),
        "replicas_removed": int(sum(max(a - b, 0) for _, a, b in acts)),
        "oscillations": oscillations(acts, s.oscillation_window_s),
        "mean_replicas": on_s / window,
        "peak_replicas": int(max(n for _, n in trace)),
        "modes": dict(controller.modes),
        "energy_provenance": summ["energy_provenance"],
        "trace": trace,
        "reject_reasons": dict(result.reject_reasons),
    }


def needed_replicas(workload, work_s: float, minutes: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(hour, replicas at 100 % utilization) per `minutes` of arrivals (for the timeline)."""
    width = minutes * 60.0
    if workload.n == 0:
        return np.zeros(0), np.zeros(0)
    k = (workload.arrival_s // width).astype("int64")
    per = np.bincount(k) / width * work_s
    return np.arange(per.size) * width / 3600.0, per

