"""Arrivals, rejections and aborts of the fleet simulation run (a mixin of sim._Run).

An arriving request is admitted or rejected by the policy, then placed: in
"replica" queueing at the replica the policy chooses (bounded FIFO there); in
"shared" queueing at a free eligible replica the policy chooses, else in the
shared FIFO of its (model, residency) class. A request that may end early gets
one heap event: its cancel or deadline time, whichever comes first, and a queue
timeout if it waits. An abort of a queued request is immediate (lazy deletion
from the FIFO); a running one leaves its batch at the next iteration boundary.
"""

from __future__ import annotations

from heapq import heappush

from replaylab.fleet.sim.fleet import INF, K_CANCEL, K_DEADLINE, K_QTIMEOUT, Replica
from replaylab.fleet.sim.policy import PolicyError
from replaylab.fleet.sim.result import QUEUED, REJECTED


class ArrivalsMixin:
    """Request placement and early ends; the state lives on sim._Run."""

    def _arrive(self, i: int, t: float) -> None:
        c = self.cls[i]
        el = self.eligible[c]
        rv = self.rv
        rv.index = i
        if self.admit is not None:
            reason = self.admit(rv, self, t)
            if reason is not None:
                return self._reject(i, t, str(reason))
        if self.shared:
            return self._arrive_shared(i, t, c, el)
        if not el:
            return self._reject(i, t, "no_replica")
        r = self.choose(rv, el, self, t)
        if r not in self.elset[c]:
            raise PolicyError(f"policy chose replica {r!r} for request {i}; eligible: {el}")
        rep = self.reps[r]
        need = rep.kvneed[i]
        if need > rep.kv_capacity:
            return self._reject(i, t, "exceeds_kv")
        now = (rep.queued == 0 and rep.running < rep.max_batch
               and rep.kv_used + need <= rep.kv_capacity)
        if not now and rep.queued >= self.qcap:
            return self._reject(i, t, "queue_full")
        self._enqueue_local(rep, i, t, now)

    def _arrive_shared(self, i: int, t: float, c: int, el: list[int]) -> None:
        reps = self.reps
        if self.sq_len[c] == 0 and el:
            free = [r for r in el if (rp := reps[r]).queued == 0 and rp.running < rp.max_batch
                    and rp.kv_used + rp.kvneed[i] <= rp.kv_capacity]
            if free:
                r = self.choose(self.rv, free, self, t)
                if r not in free:
                    raise PolicyError(f"policy chose replica {r!r} for request {i}; "
                                      f"eligible and free: {free}")
                return self._enqueue_local(reps[r], i, t, True)
        serving = self.serving[c]
        if not serving:
            return self._reject(i, t, "no_replica")
        if not any(reps[r].kvneed[i] <= reps[r].kv_capacity for r in serving):
            return self._reject(i, t, "exceeds_kv")
        if self.sq_len[c] >= self.qcap:
            return self._reject(i, t, "queue_full")
        self.state[i] = QUEUED
        self.sq[c].append(i)
        self.sq_len[c] += 1
        self.inflight += 1
        self._arm(i, t, True)

    def _enqueue_local(self, rep: Replica, i: int, t: float, now: bool) -> None:
        """Place request i at replica `rep`; `now`: it fits and nobody waits before it."""
        r = rep.index
        self.rep_of[i] = r
        self.load[r] += 1
        self.inflight += 1
        if self.may_end or (self.may_abort and not now):  # else _arm would push nothing
            self._arm(i, t, not now)
        if now and rep.running == 0:  # idle: its first iteration starts at once
            self._account(rep, t)
            rep.t_seg = t
            self._join(rep, i, t)
            self._schedule(rep)
            return
        self.state[i] = QUEUED
        rep.queue.append(i)
        rep.queued += 1
        if now:  # busy: it joins when the current iteration ends
            self._wake(rep, t)

    def _arm(self, i: int, t: float, waits: bool) -> None:
        """Push the request's cancel or deadline event, and its queue timeout if it waits."""
        d, c = self.deadline[i], self.cancel[i]
        if c < d:
            heappush(self.heap, (t + c, i * 8 + K_CANCEL))
        elif d < INF:
            heappush(self.heap, (t + d, i * 8 + K_DEADLINE))
        if waits and self.qtimeout < INF and self.qtimeout < min(c, d):
            heappush(self.heap, (t + self.qtimeout, i * 8 + K_QTIMEOUT))

    def _reject(self, i: int, t: float, reason: str) -> None:
        self.state[i] = REJECTED
        self.t_end[i] = t
        self.reasons[reason] += 1

    def _abort(self, i: int, t: float, code: int) -> None:
        was = self.state[i]
        self.state[i] = code
        self.t_end[i] = t
        self.inflight -= 1
        r = self.rep_of[i]
        if was == QUEUED:
            if r < 0:
                self.sq_len[self.cls[i]] -= 1
                return
            rep = self.reps[r]
            rep.queued -= 1
            self.load[r] -= 1
            self._poke(rep, t)
            return
        rep = self.reps[r]  # running: it leaves the batch at the next boundary
        xb = rep.V + int((t - rep.t_seg) / rep.dt) + 1
        heappush(rep.fin, xb * self.N + i)
        if xb < rep.next_x:
            rep.next_x = xb
            rep.next_t = rep.t_seg + (xb - rep.V) * rep.dt
            heappush(self.heap, (rep.next_t, r * 8))
