"""What a serving policy sees and decides in the fleet simulator (policies: fleet/policies/).

The simulator asks a `Policy` two questions per arriving request:

1. `admit(request, fleet, now) -> None | str`: None admits; a string rejects the
   request with that reason (counted under `SimResult.reject_reasons`).
2. `choose(request, eligible, fleet, now) -> int`: the index of the replica that
   gets the request, taken from `eligible` (the ready replicas that serve the
   request's model and, when it carries a residency region, sit in that region).
   Any other answer raises `PolicyError`: a policy cannot break residency.

In shared-queue mode `eligible` holds only the eligible replicas that can start
the request at their next iteration; when there is none the request waits in
the shared queue without asking the policy.

A `Controller` is asked every `SimConfig.control_interval_s` for scale actions
(add replicas to a pool, which then cold-start; remove replicas, which drain).

Views are live and read-only by contract: `RequestView` is one object re-pointed
at each request (copy what you keep), `fleet.replicas[r]` is the replica itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol


class PolicyError(ValueError):
    """A policy or controller answered something the simulator cannot do."""


class RequestView(Protocol):
    """The arriving request as a policy sees it (what serving knows at dispatch).

    `completion_tokens` is the oracle output length: a fair policy uses
    `hint_p90` (NaN without a hint) instead.
    """

    index: int
    arrival_s: float
    prompt_tokens: int
    completion_tokens: int
    model: str
    slo_class: str
    region: str | None  # residency constraint; None = anywhere
    deadline_s: float   # seconds after arrival; inf = none
    hint_p90: float
    eligibility_class: int  # one id per (model, residency) pair: same id, same eligible set


class ReplicaView(Protocol):
    """One replica's live state; see fleet.Replica for the full list."""

    index: int
    pool_id: str
    model: str
    region: str | None
    state: str           # "starting", "ready", "draining", "off"
    running: int         # sequences in the batch
    queued: int          # requests waiting at this replica
    kv_used: int         # KV tokens reserved by the batch
    kv_capacity: int
    max_batch: int

    @property
    def power_w(self) -> float: ...


class FleetView(Protocol):
    """The fleet as policies see it."""

    replicas: list  # list[ReplicaView], indexed by replica index (stable, never reused)
    load: list[int]  # running + queued per replica (kept by the simulator)

    def pool_replicas(self, pool_id: str) -> list[int]: ...

    def shared_queued(self, model: str, region: str | None = None) -> int: ...


class Policy(Protocol):
    def admit(self, request: RequestView, fleet: FleetView, now: float) -> str | None: ...

    def choose(self, request: RequestView, eligible: Sequence[int], fleet: FleetView,
               now: float) -> int: ...


@dataclass(frozen=True)
class ScaleAction:
    """Add (delta > 0) or drain (delta < 0) replicas of a pool."""

    pool_id: str
    delta: int


class Controller(Protocol):
    def decide(self, now: float, fleet: FleetView) -> Iterable[ScaleAction]: ...
