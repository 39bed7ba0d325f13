"""Discrete-event simulation of GPU replica pools serving LLM requests with continuous batching.

The replica model (hardware/profiles.py has the parameters). A replica runs iterations
back to back while its batch is non-empty. With n sequences in the batch, K KV
tokens reserved by them and m of them prefilling, an iteration takes

    dt = base_s + per_seq_s * n + per_kv_token_s * K + prefill_chunk_s * m

A request admitted at iteration boundary X with prompt p and completion c
spends pf = max(1, ceil(p / chunk_tokens)) iterations in prefill; its first
token comes at the end of iteration X + pf, its last at X + pf + c - 1. It
joins only at a boundary (the engine forms each batch before the iteration
starts): an arrival at a busy replica waits for the current iteration to end;
an idle replica starts at once. It joins if the batch has fewer than
`max_batch` sequences and its KV reservation, ceil((p + c) / block) * block
tokens (prompt and completion reserved whole, no preemption), fits in the free
KV capacity; else it waits in a FIFO (head-of-line: a large head blocks the rest,
as first-come-first-served engines do). A bounded FIFO rejects when full.

Time per request: TTFT = first token - arrival; TPOT = (end - first token) / (c - 1);
e2e = end - arrival. Added replicas cold-start for `cold_start_s` before they
take requests (drawing idle power, counted in GPU-hours); removed ones drain.

Event design, O(log R) per event for R replicas. No iteration is simulated.
Between two changes of a replica's batch its iteration time is constant, so a
replica keeps an iteration clock (V iterations done at time t_seg, dt each)
and two heaps of iteration counts (finish points; first-token points). The
next change is the smallest finish point x, at time t_seg + (x - V) * dt; it
sits in one global heap of (time, key) entries. A change that makes a
replica's next event earlier pushes a new entry; the old one is recognised as
stale (its time is not the replica's `next_t`) when popped (lazy invalidation).
First-token points do not change dt when prefill_chunk_s = 0: they are then
resolved lazily at the replica's next event, whose segment still holds them.
Arrivals are read from the sorted workload, not pushed. Per-request state lives
in numpy arrays read through memoryviews (Python ints and floats, no boxing of
numpy scalars).

Why by hand, not SimPy or Ciw: their process/entity models spend a Python
object and a generator step per request and per event; this design needs a
few heap operations per request (about 3 events) to reach 10^6 requests in
seconds. Cross-checked against M/G/c (queueing.py).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from heapq import heappop, heappush

import numpy as np
import pandas as pd

from replaylab.fleet.policies.reference import LeastLoaded
from replaylab.fleet.sim.arrivals import ArrivalsMixin
from replaylab.fleet.sim.fleet import (
    DRAINING,
    INF,
    K_CANCEL,
    K_DEADLINE,
    K_QTIMEOUT,
    K_READY,
    K_REPLICA,
    K_SCALE,
    K_TICK,
    OFF,
    READY,
    RECORD_COLUMNS,
    STARTING,
    PoolConfig,
    Replica,
    SimConfig,
)
from replaylab.fleet.sim.policy import Policy, ScaleAction
from replaylab.fleet.sim.result import (
    CANCELLED,
    COMPLETED,
    QUEUED,
    RUNNING,
    TIMED_OUT,
    SimResult,
)
from replaylab.fleet.sim.views import RequestCursor, ScalingMixin
from replaylab.fleet.sim.workload import Workload


class FleetSim:
    """Simulate `pools` under `policy` (admission + replica choice) and an optional controller.

    `FleetSim(pools, config, policy).run(workload) -> SimResult`; the policy
    defaults to LeastLoaded. A FleetSim holds no run state: `run` may be called
    again (policies with state should be fresh per run).
    """

    def __init__(self, pools: list[PoolConfig] | tuple[PoolConfig, ...],
                 config: SimConfig | None = None, policy: Policy | None = None,
                 controller=None) -> None:
        self.pools = tuple(pools)
        self.config = config or SimConfig()
        self.policy = policy
        self.controller = controller

    def run(self, workload: Workload) -> SimResult:
        ids = [p.pool_id for p in self.pools]
        if len(set(ids)) != len(ids):
            raise ValueError(f"FleetSim.pools: duplicate pool_id in {ids}")
        run = _Run(self.pools, self.config, self.policy or LeastLoaded(), self.controller,
                   workload)
        return run.execute()


class _Run(ArrivalsMixin, ScalingMixin):
    """One simulation: the state of every request and replica, and the event loop."""

    def __init__(self, pools, config: SimConfig, policy, controller, w: Workload) -> None:
        self.pools = {p.pool_id: p for p in pools}
        self.cfg, self.policy, self.controller, self.w = config, policy, controller, w
        n = self.n = w.n
        self.N = max(n, 1)  # heap entries of a replica encode x * N + request index
        self.shared = config.queueing == "shared"
        self.qcap, self.qtimeout = config.queue_capacity, config.queue_timeout_s
        # per-request results; the *_a arrays are returned, the memoryviews are for the loop
        self.state_a = np.zeros(n, dtype="int8")
        self.rep_a = np.full(n, -1, dtype="int32")
        self.start_a, self.first_a, self.end_a = (np.full(n, np.nan) for _ in range(3))
        self.xjoin_a = np.zeros(n, dtype="int64")
        self.tok_a = np.zeros(n, dtype="int32")
        self.state, self.rep_of = memoryview(self.state_a), memoryview(self.rep_a)
        self.t_start, self.t_first = memoryview(self.start_a), memoryview(self.first_a)
        self.t_end, self.x_join = memoryview(self.end_a), memoryview(self.xjoin_a)
        self.tokens, self.held = memoryview(self.tok_a), bytearray(n)
        self.arr, self.comp = memoryview(w.arrival_s), memoryview(w.completion_tokens)
        self.deadline, self.cancel = memoryview(w.deadline_s), memoryview(w.cancel_after_s)
        nreg = len(w.regions) + 1
        self.cls_a = (w.model.astype("int32") * nreg + w.region.astype("int32") + 1)
        self.cls = memoryview(self.cls_a)
        self.classes = [(m, None if g == 0 else w.regions[g - 1])
                        for m in w.models for g in range(nreg)]
        self._pf_cache: dict[int, memoryview] = {}
        self._kv_cache: dict[int, memoryview] = {}
        self.heap: list = []
        self.reps: list[Replica] = []
        self.load: list[int] = []
        self.sq = [deque() for _ in self.classes]  # shared FIFOs, one per class
        self.sq_len = [0] * len(self.classes)
        self.inflight = 0
        self.reasons: Counter = Counter()
        # may_end: some request has a deadline or a client cancel; may_abort: or a queue timeout
        self.may_end = bool(np.isfinite(w.deadline_s).any() or np.isfinite(w.cancel_after_s).any())
        self.may_abort = self.may_end or self.qtimeout < INF
        self.admit = getattr(policy, "admit", None)
        self.choose = policy.choose
        self.rv = RequestCursor(self)
        for p in pools:
            for _ in range(p.replicas):
                self._add_replica(p, 0.0, ready=config.warm_start)
        for k, (t, _pool, _delta) in enumerate(config.scale_events):
            heappush(self.heap, (float(t), k * 8 + K_SCALE))
        if controller is not None and config.control_interval_s < INF:
            heappush(self.heap, (0.0, K_TICK))
        self._rebuild_eligibility()

    # ---- per-profile request arithmetic (one array per distinct chunk / block size) ----
    def prefill_iters(self, chunk: int) -> memoryview:
        if chunk not in self._pf_cache:
            pf = np.maximum(1, -(-self.w.prompt_tokens // chunk)).astype("int32")
            self._pf_cache[chunk] = memoryview(pf)
        return self._pf_cache[chunk]

    def kv_need(self, block: int) -> memoryview:
        if block not in self._kv_cache:
            tot = self.w.prompt_tokens + self.w.completion_tokens
            kv = -(-tot // block) * block
            if kv.size and kv.max() >= 2**31:
                raise ValueError(f"a request needs {kv.max()} KV tokens: more than int32 holds")
            self._kv_cache[block] = memoryview(kv.astype("int32"))
        return self._kv_cache[block]

    # ---- the loop ----
    def execute(self) -> SimResult:
        wall = time.perf_counter()
        heap, reps, arr, n, state = self.heap, self.reps, self.arr, self.n, self.state
        on_replica, arrive, abort = self._on_replica, self._arrive, self._abort
        ia = events = 0
        t = last = 0.0  # last: the last event actually processed (stale pops don't count)
        while True:
            if heap:
                if ia < n and arr[ia] < heap[0][0]:
                    t = arr[ia]
                    arrive(ia, t)
                    ia += 1
                    events += 1
                    last = t
                    continue
                t, key = heappop(heap)
                kind = key & 7
                if kind == K_REPLICA:
                    rep = reps[key >> 3]
                    if t != rep.next_t:
                        continue  # stale: the replica was rescheduled
                    on_replica(rep, t)
                elif kind == K_CANCEL or kind == K_DEADLINE:
                    i = key >> 3
                    if state[i] != QUEUED and state[i] != RUNNING:
                        continue
                    abort(i, t, CANCELLED if kind == K_CANCEL else TIMED_OUT)
                elif kind == K_QTIMEOUT:
                    if state[key >> 3] != QUEUED:
                        continue
                    abort(key >> 3, t, TIMED_OUT)
                elif kind == K_READY:
                    self._on_ready(reps[key >> 3], t)
                elif kind == K_TICK:
                    self._on_tick(t, ia < n)
                else:
                    _, pool_id, delta = self.cfg.scale_events[key >> 3]
                    self.scale(ScaleAction(pool_id, delta), t)
                events += 1
                last = t
            elif ia < n:
                t = arr[ia]
                arrive(ia, t)
                ia += 1
                events += 1
                last = t
            else:
                break
        return self._finish(last, events, time.perf_counter() - wall)

    # ---- replica iteration clock ----
    def _account(self, rep: Replica, t: float) -> None:
        d = t - rep.t_acc
        if d > 0:
            if rep.state != OFF:
                rep.energy_j += rep.power[rep.running] * d
                if rep.running:
                    rep.busy_s += d
            rep.t_acc = t

    def _wake(self, rep: Replica, t: float) -> None:
        """Make the replica's next event no later than its next iteration boundary."""
        xb = rep.V + int((t - rep.t_seg) / rep.dt) + 1
        if xb < rep.next_x:
            rep.next_x = xb
            rep.next_t = rep.t_seg + (xb - rep.V) * rep.dt
            heappush(self.heap, (rep.next_t, rep.index * 8))

    def _poke(self, rep: Replica, t: float) -> None:
        """If the live head of the replica's FIFO fits, start it now (idle) or at the next boundary."""
        q, state = rep.queue, self.state
        while q and state[q[0]] != QUEUED:
            q.popleft()  # lazily deleted: timed out or cancelled while queued
        if not q or rep.running >= rep.max_batch or rep.state == STARTING:
            return
        if rep.kv_used + rep.kvneed[q[0]] > rep.kv_capacity:
            return
        if rep.running == 0:
            self._account(rep, t)
            rep.t_seg = t
            self._fill(rep, t)
            self._schedule(rep)
        else:
            self._wake(rep, t)

    def _schedule(self, rep: Replica) -> None:
        n = rep.running
        if n == 0:
            rep.next_x = rep.next_t = INF
            return
        p = rep.profile
        rep.dt = dt = (p.base_s + p.per_seq_s * n + p.per_kv_token_s * rep.kv_used
                       + p.prefill_chunk_s * rep.n_prefill)
        N = self.N
        x = rep.fin[0] // N
        if p.prefill_chunk_s and rep.ft and rep.ft[0] // N < x:
            x = rep.ft[0] // N  # prefill ends change dt: a real event
        rep.next_x = x
        rep.next_t = t_next = rep.t_seg + (x - rep.V) * dt
        heappush(self.heap, (t_next, rep.index * 8))

    def _on_replica(self, rep: Replica, t: float) -> None:
        """Iteration boundary X = rep.next_x at time t: first tokens, leavers, then joiners.

        Inlines _account and _schedule: this runs about twice per request.
        """
        x = rep.next_x
        d = t - rep.t_acc  # energy of the segment that ends here (a replica with events is on)
        if d > 0:
            rep.energy_j += rep.power[rep.running] * d
            if rep.running:
                rep.busy_s += d
            rep.t_acc = t
        v0, t0, dt0 = rep.V, rep.t_seg, rep.dt
        rep.V, rep.t_seg = x, t
        N, held, state = self.N, self.held, self.state
        lim = (x + 1) * N
        ft, fin = rep.ft, rep.fin
        while ft and ft[0] < lim:
            e = heappop(ft)
            i = e % N
            if held[i]:
                rep.n_prefill -= 1
                tf = t0 + (e // N - v0) * dt0
                if state[i] == RUNNING or tf <= self.t_end[i]:  # reached the client before an abort
                    self.t_first[i] = tf
        while fin and fin[0] < lim:
            i = heappop(fin) % N
            if held[i]:
                self._leave(rep, i, x, t)
        if rep.queue or self.shared:
            self._fill(rep, t)
        n = rep.running
        if n == 0:
            fin.clear()  # only stale entries of requests that left early remain
            ft.clear()
            if rep.state == DRAINING and rep.queued == 0:
                self._switch_off(rep, t)
            rep.next_x = rep.next_t = INF
            return
        p = rep.profile
        rep.dt = dt = (p.base_s + p.per_seq_s * n + p.per_kv_token_s * rep.kv_used
                       + p.prefill_chunk_s * rep.n_prefill)
        x = fin[0] // N
        if p.prefill_chunk_s and ft and ft[0] // N < x:
            x = ft[0] // N  # prefill ends change dt: a real event
        rep.next_x = x
        rep.next_t = t_next = t + (x - rep.V) * dt
        heappush(self.heap, (t_next, rep.index * 8))

    def _leave(self, rep: Replica, i: int, x: int, t: float) -> None:
        self.held[i] = 0
        rep.running -= 1
        rep.kv_used -= rep.kvneed[i]
        self.load[rep.index] -= 1
        if self.state[i] == RUNNING:
            self.state[i] = COMPLETED
            self.t_end[i] = t
            self.tokens[i] = self.comp[i]
            rep.served += 1
            self.inflight -= 1
        else:  # cancelled or timed out mid-stream; it leaves the batch at this boundary
            done = x - self.x_join[i] - rep.pf[i]
            if done < 0:
                rep.n_prefill -= 1
            self.tokens[i] = max(0, min(self.comp[i], done + 1))

    def _fill(self, rep: Replica, t: float) -> None:
        """Join FIFO requests at this boundary while a slot and their KV reservation fit."""
        q, state, kvneed = rep.queue, self.state, rep.kvneed
        while q and rep.running < rep.max_batch:
            i = q[0]
            if state[i] != QUEUED:
                q.popleft()
                continue
            if rep.kv_used + kvneed[i] > rep.kv_capacity:
                break
            q.popleft()
            rep.queued -= 1
            self._join(rep, i, t)
        if self.shared and rep.state == READY and rep.running < rep.max_batch:
            self._pull(rep, t)

    def _pull(self, rep: Replica, t: float) -> None:
        """Shared queueing: take the oldest live head among the classes this replica serves."""
        sq, state, arr = self.sq, self.state, self.arr
        while rep.running < rep.max_batch:
            best, best_t = -1, INF
            for c in rep.pull:
                q = sq[c]
                while q and state[q[0]] != QUEUED:
                    q.popleft()
                if q and arr[q[0]] < best_t:
                    best, best_t = c, arr[q[0]]
            if best < 0 or rep.kv_used + rep.kvneed[sq[best][0]] > rep.kv_capacity:
                return
            i = sq[best].popleft()
            self.sq_len[best] -= 1
            self.load[rep.index] += 1
            self._join(rep, i, t)

    def _join(self, rep: Replica, i: int, t: float) -> None:
        x, N = rep.V, self.N
        self.state[i] = RUNNING
        self.held[i] = 1
        self.t_start[i] = t
        self.x_join[i] = x
        self.rep_of[i] = rep.index
        pf = rep.pf[i]
        heappush(rep.ft, (x + pf) * N + i)
        heappush(rep.fin, (x + pf + self.comp[i] - 1) * N + i)
        rep.running += 1
        rep.n_prefill += 1
        rep.kv_used += rep.kvneed[i]
        if rep.kv_used > rep.kv_peak:
            rep.kv_peak = rep.kv_used
        if rep.running > rep.run_peak:
            rep.run_peak = rep.running

    # ---- the end ----
    def _finish(self, t_last: float, events: int, wall_s: float) -> SimResult:
        self.rv = None  # break the run <-> cursor cycle: the arrays go when the result goes
        t_end = max(t_last, self.cfg.horizon_s, float(self.w.arrival_s[-1]) if self.n else 0.0)
        for rep in self.reps:
            if rep.state != OFF:
                self._account(rep, t_end)
                rep.on_s += t_end - rep.t_on
        st = self.state_a
        stuck = st == QUEUED  # shared queue of a class whose replicas all went away
        drained = int(stuck.sum())
        st[stuck] = TIMED_OUT
        self.end_a[stuck] = t_end
        if (st == RUNNING).any() or (st < QUEUED).any() or any(self.held):
            raise RuntimeError("fleet sim: requests left running or never arrived after the drain")
        result = SimResult(self.w, st, self.rep_a, self.start_a, self.first_a, self.end_a,
                           self.tok_a, pd.DataFrame([r.record() for r in self.reps],
                                        columns=list(RECORD_COLUMNS)),
                           dict(self.reasons), drained, t_end, events, wall_s)
        counts = result.counts()
        if sum(v for k, v in counts.items() if k != "arrived") != counts["arrived"]:
            raise RuntimeError(f"fleet sim: request conservation broken: {counts}")
        return result
