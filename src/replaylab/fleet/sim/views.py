"""The simulator's faces toward policies and controllers: the request cursor, the fleet view, scaling.

`RequestCursor` is one object per run, re-pointed at each arriving request
(`index`); its attributes read the workload columns on demand, so a policy
that looks at nothing costs nothing. `ScalingMixin` gives the run its
FleetView surface (replicas, load, pool_replicas, shared_queued) and the
replica life cycle: add (cold start), ready, drain, off.
"""

from __future__ import annotations

from collections import deque
from heapq import heappush

from replaylab.fleet.sim.fleet import (
    DRAINING,
    K_CANCEL,
    K_DEADLINE,
    K_QTIMEOUT,
    K_READY,
    K_SCALE,
    K_TICK,
    OFF,
    READY,
    STARTING,
    PoolConfig,
    Replica,
)
from replaylab.fleet.sim.policy import PolicyError, ScaleAction
from replaylab.fleet.sim.result import QUEUED

# Control ticks a run keeps going with every replica off, nothing pending and the controller
# idle before it ends (see ScalingMixin._stalled).
STALL_TICKS = 1000


class RequestCursor:
    """The arriving request (policy.RequestView); valid only during the policy call."""

    __slots__ = ("_run", "index")

    def __init__(self, run) -> None:
        self._run = run
        self.index = -1

    @property
    def arrival_s(self) -> float:
        return self._run.arr[self.index]

    @property
    def prompt_tokens(self) -> int:
        return int(self._run.w.prompt_tokens[self.index])

    @property
    def completion_tokens(self) -> int:
        return self._run.comp[self.index]

    @property
    def model(self) -> str:
        w = self._run.w
        return w.models[w.model[self.index]]

    @property
    def slo_class(self) -> str:
        w = self._run.w
        return w.slo_classes[w.slo_class[self.index]]

    @property
    def region(self) -> str | None:
        w = self._run.w
        g = int(w.region[self.index])
        return None if g < 0 else w.regions[g]

    @property
    def deadline_s(self) -> float:
        return self._run.deadline[self.index]

    @property
    def hint_p90(self) -> float:
        return float(self._run.w.hint_p90[self.index])

    @property
    def eligibility_class(self) -> int:
        return self._run.cls[self.index]


class ScalingMixin:
    """Replica life cycle and the FleetView surface of a simulation run (see sim._Run)."""

    @property
    def replicas(self) -> list[Replica]:
        return self.reps

    def pool_replicas(self, pool_id: str) -> list[int]:
        """Indices of the pool's replicas that are not off."""
        return [r.index for r in self.reps if r.pool_id == pool_id and r.state != OFF]

    def shared_queued(self, model: str, region: str | None = None) -> int:
        """Requests waiting in the shared queue of (model, residency region)."""
        for c, key in enumerate(self.classes):
            if key == (model, region):
                return self.sq_len[c]
        return 0

    def _add_replica(self, pool: PoolConfig, t: float, ready: bool) -> Replica:
        rep = Replica(len(self.reps), pool.pool_id, pool.model, pool.region, pool.profile,
                      READY if ready else STARTING, t_on=t)
        rep.queue = deque()
        rep.pf = self.prefill_iters(pool.profile.chunk_tokens)
        rep.kvneed = self.kv_need(pool.profile.kv_block_tokens)
        rep.pull = tuple(c for c, (m, g) in enumerate(self.classes)
                         if m == rep.model and (g is None or g == rep.region))
        self.reps.append(rep)
        self.load.append(0)
        if not ready:
            heappush(self.heap, (t + pool.cold_start_s, rep.index * 8 + K_READY))
        return rep

    def _rebuild_eligibility(self) -> None:
        """eligible[c]: ready replicas for class c; serving[c]: ready or starting (shared mode)."""
        self.eligible, self.elset, self.serving = [], [], []
        for m, g in self.classes:
            ok = [r for r in self.reps if r.model == m and (g is None or r.region == g)]
            el = [r.index for r in ok if r.state == READY]
            self.eligible.append(el)
            self.elset.append(frozenset(el))
            self.serving.append([r.index for r in ok if r.state in (READY, STARTING)])

    def _on_ready(self, rep: Replica, t: float) -> None:
        if rep.state != STARTING:
            return  # removed while starting
        self._account(rep, t)
        rep.state = READY
        rep.t_seg = t
        self._rebuild_eligibility()
        if self.shared:
            self._fill(rep, t)
            self._schedule(rep)

    def _switch_off(self, rep: Replica, t: float) -> None:
        self._account(rep, t)
        rep.on_s += t - rep.t_on
        rep.t_off = t
        rep.state = OFF
        self._rebuild_eligibility()

    def scale(self, action: ScaleAction, t: float) -> None:
        """Add replicas (they cold-start) or drain the least loaded (newest on ties)."""
        pool = self.pools.get(action.pool_id)
        if pool is None:
            raise PolicyError(f"scale action for unknown pool {action.pool_id!r}")
        if action.delta > 0:
            for _ in range(action.delta):
                self._add_replica(pool, t, ready=False)
        elif action.delta < 0:
            cands = [r for r in self.reps if r.pool_id == pool.pool_id
                     and r.state in (STARTING, READY)]
            cands.sort(key=lambda r: (r.state != STARTING, self.load[r.index], -r.index))
            for rep in cands[:-action.delta]:
                if rep.state == STARTING or (rep.running == 0 and rep.queued == 0):
                    self._switch_off(rep, t)
                else:
                    rep.state = DRAINING
        self._rebuild_eligibility()

    def _on_tick(self, t: float, more_arrivals: bool) -> None:
        acted = False
        for action in self.controller.decide(t, self) or ():
            self.scale(action, t)
            acted = True
        if more_arrivals or (self.inflight > 0 and not self._stalled(acted)):
            heappush(self.heap, (t + self.cfg.control_interval_s, K_TICK))

    def _stalled(self, acted: bool) -> bool:
        """True once nothing but the controller could ever serve the requests still queued,
        and it has not acted for `STALL_TICKS` ticks: no arrivals remain (the caller checks),
        every replica is off, and no pending event (a scale event, a deadline, a cancel or
        a queue timeout of a queued request) can change anything. Ticking on would loop
        forever (a passive controller such as a TelemetryFeed never scales), so the run
        ends and `_finish` drains those requests as timed out. The grace leaves a
        controller with a stabilisation window time to scale up from zero.

        "Every replica is off" includes replicas that are on but idle: a ready replica with
        nothing running or queued would already hold an eligible queued request, so the
        requests left wait for a model whose pool was scaled away (found by the property
        test: one pool scaled to zero, the other idle, a shared queue, no timeouts)."""
        if acted or any(r.state == STARTING or (r.state != OFF and (r.running or r.queued))
                        for r in self.reps):
            self._idle_ticks = 0
            return False
        for _, key in self.heap:
            kind = key & 7
            if kind == K_SCALE or (kind in (K_DEADLINE, K_CANCEL, K_QTIMEOUT)
                                   and self.state_a[key >> 3] == QUEUED):
                self._idle_ticks = 0
                return False
        self._idle_ticks = getattr(self, "_idle_ticks", 0) + 1
        return self._idle_ticks >= STALL_TICKS
