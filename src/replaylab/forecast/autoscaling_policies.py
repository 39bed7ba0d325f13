"""LEGACY: the fluid experiment's policies (forecast/experiments.py only); see fleet/autoscaling.py.

The controllers of the event-driven simulator are `replaylab.fleet.autoscaling`
(which also holds the one `hpa_desired`); this module goes when the autoscaling
entry point is rewired to `replaylab.fleet.autoscaling_experiment`.

Autoscaling policies for `autoscaling.simulate`: static, reactive (HPA), proactive.

- `StaticPolicy`: a fixed replica count (sized ahead for a quantile of a day).
- `HPAPolicy`: the Kubernetes HorizontalPodAutoscaler algorithm (autoscaling/v2,
  pkg/controller/podautoscaler) on one pod metric, utilization =
  (work arrived per second over `metric_window_s` + queued work spread over
  the same window) / ready replicas, as a Prometheus `rate(...[1m])` adapter
  over a work counter plus a queue gauge would report it:
    ratio = utilization / target; within `tolerance` of 1 -> keep current;
    else desired = ceil(ratio * ready). While replicas are starting and
    ratio > 1, starting pods count as 0 usage (desired = ceil(ratio' * all)),
    and no change happens if that flips the direction or lands in tolerance.
    Stabilization: every raw desired is recorded; a scale-down goes only to the
    max of the recommendations of the last `scale_down_window_s` (300 s), a
    scale-up to the min over `scale_up_window_s` (0 s). Rate limits (defaults
    of autoscaling/v2): up by max(4 pods, 100%) per 15 s, down by 100%.
- `ProactivePolicy`: replicas from signed forecast recommendations (see
  recommendation.py), plus an optional reactive floor. Scale-up is immediate;
  scale-down goes to the max of its targets over the last `scale_down_hold_s`
  and only when that is below current by more than the hysteresis band
  (max(1, hysteresis * current)), so a forecast that wobbles inside the band
  never moves the pool. Falls back to `HPAPolicy` when no fresh, verified
  message covers now; reverts its last scale-down on an SLO drop or on request.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from replaylab.fleet.autoscaling import hpa_desired
from replaylab.forecast.autoscaling import Observation
from replaylab.forecast.recommendation import EventLog, RecommendationInbox


class StaticPolicy:
    def __init__(self, replicas: int, name: str = "static") -> None:
        self.replicas, self.name = int(replicas), name

    def initial_replicas(self, first_work_rate: float) -> int:
        return self.replicas

    def decide(self, obs: Observation) -> int:
        return self.replicas


@dataclass(frozen=True)
class HPAConfig:
    target_util: float = 0.7
    tolerance: float = 0.1
    sync_s: float = 15.0
    metric_window_s: float = 60.0  # the metric is a rate over this window (Prometheus-style)
    scale_down_window_s: float = 300.0
    scale_up_window_s: float = 0.0
    scale_up_pods: int = 4         # per sync period
    scale_up_percent: float = 100.0
    scale_down_percent: float = 100.0

    def __post_init__(self) -> None:
        if not 0 < self.target_util <= 1 or not 0 <= self.tolerance < 1:
            raise ValueError(f"HPAConfig: target_util={self.target_util}, "
                             f"tolerance={self.tolerance} out of range")


class HPAPolicy:
    """Kubernetes HPA on the pool's utilization metric (see module doc)."""

    def __init__(self, cfg: HPAConfig, tick_s: float, name: str = "reactive") -> None:
        self.cfg, self.tick_s, self.name = cfg, tick_s, name
        self._period = max(1, round(cfg.sync_s / tick_s))
        self._arrived: deque[float] = deque(maxlen=max(1, round(cfg.metric_window_s / tick_s)))
        self._recs: deque[tuple[float, int]] = deque()
        self._last = None

    def initial_replicas(self, first_work_rate: float) -> int:
        return max(1, math.ceil(first_work_rate / self.cfg.target_util))

    def demand_rate(self, obs: Observation) -> float:
        """Replica-equivalents asked for: work arriving per second over the metric window,
        plus the queued work to be finished within that window."""
        window_s = max(len(self._arrived), 1) * self.tick_s
        return (sum(self._arrived) + obs.backlog_work) / window_s

    def utilization(self, obs: Observation) -> float:
        """The pod metric: demand per ready replica (1.0 = all of a replica's throughput)."""
        return self.demand_rate(obs) / max(obs.ready, 1e-9)

    def decide(self, obs: Observation) -> int:
        self._arrived.append(obs.arrived_work)
        current = obs.current
        if obs.tick % self._period != self._period - 1:
            return current
        c = self.cfg
        desired = hpa_desired(obs.ready, obs.starting, self.utilization(obs), c.target_util,
                              c.tolerance)
        t = obs.t_s
        self._recs.append((t, desired))
        horizon = max(c.scale_down_window_s, c.scale_up_window_s)
        while self._recs and self._recs[0][0] <= t - horizon:
            self._recs.popleft()
        up = min([r for s, r in self._recs if s > t - c.scale_up_window_s] + [desired])
        down = max([r for s, r in self._recs if s > t - c.scale_down_window_s] + [desired])
        rec = min(max(current, up), down)
        up_limit = max(current + c.scale_up_pods, math.ceil(current * (1 + c.scale_up_percent
                                                                        / 100)))
        down_limit = math.floor(current * (1 - c.scale_down_percent / 100))
        return int(min(max(rec, down_limit), up_limit))


@dataclass(frozen=True)
class ProactiveConfig:
    hysteresis: float = 0.1          # scale down only by > this share of current (and >= 1)
    scale_down_hold_s: float = 600.0  # scale down to the max target of this trailing window
    floor_util: float | None = 0.9   # reactive floor: never below queued+arrived work / this
    rollback_attainment: float = 0.9  # roll back a scale-down when trailing SLO falls below
    rollback_window_s: float = 900.0  # ... within this long after it
    rollback_hold_s: float = 1800.0   # then keep at least the restored count this long


class ProactivePolicy:
    """Consumer of signed recommendations; the HPA is its fallback (see module doc)."""

    def __init__(self, cfg: ProactiveConfig, inbox: RecommendationInbox, key: bytes, pool: str,
                 fallback: HPAPolicy, events: EventLog, tick_s: float,
                 name: str = "proactive") -> None:
        self.cfg, self.inbox, self.key, self.pool = cfg, inbox, key, pool
        self.fallback, self.events, self.tick_s, self.name = fallback, events, tick_s, name
        self._acked: set[str] = set()
        self._mode = None               # "forecast" or a fallback reason
        self._targets: deque[tuple[float, int]] = deque()  # (t_s, target) for scale-down
        self._last_down: tuple[float, int, int, str | None] | None = None  # (t, from, to, id)
        self._pin: tuple[float, int] | None = None  # (until_s, min replicas) after a rollback
        self._operator_rollbacks: list[float] = []

    def initial_replicas(self, first_work_rate: float) -> int:
        return self.fallback.initial_replicas(first_work_rate)

    def request_rollback(self, t_s: float) -> None:
        """An operator asks to revert the last actuation at time `t_s` (seconds)."""
        self._operator_rollbacks.append(t_s)

    def _set_mode(self, obs: Observation, mode: str, msg_id: str | None) -> None:
        if mode != self._mode and mode != "forecast":
            self.events.append("fallback", obs.t_ms, self.pool, msg_id, reason=mode,
                               policy="reactive")
        self._mode = mode

    def _rollback(self, obs: Observation, target: int) -> int:
        """Revert the last scale-down on an SLO drop or an operator request."""
        ops = [t for t in self._operator_rollbacks if t <= obs.t_s]
        self._operator_rollbacks = [t for t in self._operator_rollbacks if t > obs.t_s]
        last = self._last_down
        slo_drop = (last is not None and obs.t_s - last[0] <= self.cfg.rollback_window_s
                    and obs.recent_attainment < self.cfg.rollback_attainment)
        if (ops or slo_drop) and last is not None:
            restored = max(target, last[1])
            self.events.append("rolled_back", obs.t_ms, self.pool, last[3], reason=(
                "operator" if ops else "slo_drop"), from_replicas=obs.current,
                to_replicas=restored, attainment=round(obs.recent_attainment, 4))
            self._pin = (obs.t_s + self.cfg.rollback_hold_s, last[1])
            self._last_down = None
            return restored
        return target

    def _hysteresis(self, obs: Observation, target: int) -> int:
        """Up at once; down to the window's max target, and only past the band."""
        while self._targets and self._targets[0][0] <= obs.t_s - self.cfg.scale_down_hold_s:
            self._targets.popleft()
        self._targets.append((obs.t_s, target))
        current = obs.current
        if target >= current:
            return target
        down = max(t for _, t in self._targets)
        return down if current - down >= max(1.0, self.cfg.hysteresis * current) else current

    def decide(self, obs: Observation) -> int:
        reactive = self.fallback.decide(obs)  # keeps the HPA's window warm in every mode
        msg, reason = self.inbox.select(obs.t_ms, self.key, self.pool)
        if msg is None:
            self._set_mode(obs, reason, None)
            target, msg_id = reactive, None
        else:
            self._set_mode(obs, "forecast", msg.message_id)
            if msg.message_id not in self._acked:
                self._acked.add(msg.message_id)
                self.events.append("acknowledged", obs.t_ms, self.pool, msg.message_id,
                                   replicas=msg.replicas)
            target, msg_id = msg.replicas, msg.message_id
            if self.cfg.floor_util:
                need = self.fallback.demand_rate(obs) / self.cfg.floor_util
                target = max(target, math.ceil(need - 1e-9))
            target = self._hysteresis(obs, target)
        if self._pin and obs.t_s < self._pin[0]:
            target = max(target, self._pin[1])
        target = self._rollback(obs, target)
        if target != obs.current:
            if msg_id is not None:
                self.events.append("actuated", obs.t_ms, self.pool, msg_id,
                                   from_replicas=obs.current, to_replicas=target)
            if target < obs.current:
                self._last_down = (obs.t_s, obs.current, target, msg_id)
        return target
