"""Fleet configuration (pools, simulator settings) and the replica state the simulator keeps.

A pool is a set of identical replicas: one model on one GPU profile in one
region. Replicas are numbered in creation order across the whole fleet; an
index is never reused, so policies may keep per-replica state in lists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from replaylab.config import fail_field
from replaylab.fleet.hardware.profiles import GpuProfile

QUEUEING = ("replica", "shared")
INF = math.inf
# event kinds: the low 3 bits of a global heap key (key = index * 8 + kind)
K_REPLICA, K_READY, K_CANCEL, K_DEADLINE, K_QTIMEOUT, K_TICK, K_SCALE = range(7)
RECORD_COLUMNS = ("replica", "pool_id", "model", "region", "profile", "gpus", "t_on", "t_off",
                  "on_s", "gpu_hours", "busy_s", "energy_j", "served", "kv_peak", "kv_capacity",
                  "run_peak", "max_batch", "cost", "energy_provenance")
STARTING, READY, DRAINING, OFF = "starting", "ready", "draining", "off"


@dataclass(frozen=True)
class PoolConfig:
    """`replicas` copies of `profile` serving `model` in `region` (None: no region)."""

    pool_id: str
    model: str
    profile: GpuProfile
    replicas: int = 1
    region: str | None = None
    cold_start_s: float = 60.0  # from the scale-up decision until the replica takes requests

    def __post_init__(self) -> None:
        c = "PoolConfig"
        if not self.pool_id:
            fail_field(c, "pool_id", self.pool_id, "must be a non-empty string")
        if not isinstance(self.profile, GpuProfile):
            fail_field(c, "profile", type(self.profile).__name__, "must be a GpuProfile")
        if not isinstance(self.replicas, int) or self.replicas < 0:
            fail_field(c, "replicas", self.replicas, "must be an integer >= 0")
        if not self.cold_start_s >= 0:
            fail_field(c, "cold_start_s", self.cold_start_s, "must be >= 0")


@dataclass(frozen=True)
class SimConfig:
    """Simulator settings.

    queueing: "replica" (the policy picks a replica on arrival; each replica has
      its own FIFO of at most `queue_capacity`) or "shared" (a request that no
      eligible replica can start waits in one FIFO per (model, residency) class,
      at most `queue_capacity` long; freed replicas pull from it).
    queue_timeout_s: a request still queued this long after arrival times out.
    control_interval_s: how often a Controller is asked (inf: never).
    horizon_s: energy and GPU-hours are counted until max(drain end, horizon_s),
      so policies compared on one workload share one window.
    scale_events: (time_s, pool_id, delta) applied as if a controller had said so.
    warm_start: initial replicas are ready at t=0 (else they cold-start at t=0).
    """

    queueing: str = "replica"
    queue_capacity: int = 1024
    queue_timeout_s: float = math.inf
    control_interval_s: float = math.inf
    horizon_s: float = 0.0
    scale_events: tuple[tuple[float, str, int], ...] = ()
    warm_start: bool = True

    def __post_init__(self) -> None:
        c = "SimConfig"
        if self.queueing not in QUEUEING:
            fail_field(c, "queueing", self.queueing, f"must be one of {QUEUEING}")
        if not isinstance(self.queue_capacity, int) or self.queue_capacity < 0:
            fail_field(c, "queue_capacity", self.queue_capacity, "must be an integer >= 0")
        if not self.queue_timeout_s > 0:
            fail_field(c, "queue_timeout_s", self.queue_timeout_s, "must be > 0 (inf: none)")
        if not self.control_interval_s > 0:
            fail_field(c, "control_interval_s", self.control_interval_s, "must be > 0")
        if not self.horizon_s >= 0:
            fail_field(c, "horizon_s", self.horizon_s, "must be >= 0")
        for ev in self.scale_events:
            if len(ev) != 3 or not ev[0] >= 0 or not isinstance(ev[2], int):
                fail_field(c, "scale_events", ev, "each must be (time_s >= 0, pool_id, int delta)")


@dataclass(eq=False, slots=True)
class Replica:
    """One serving engine instance; the simulator's state and the policies' view of it.

    Public, read-only for policies: index, pool_id, model, region, profile, state
    ("starting" | "ready" | "draining" | "off"), running (sequences in the
    batch), queued (waiting here), kv_used / kv_capacity (tokens), max_batch,
    n_prefill, served (requests completed), energy_j, busy_s, and `power_w`.
    Everything else is the simulator's bookkeeping.
    """

    index: int
    pool_id: str
    model: str
    region: str | None
    profile: GpuProfile
    state: str
    t_on: float                      # when it was switched on (scale-up decision)
    kv_capacity: int = 0
    max_batch: int = 0
    running: int = 0
    queued: int = 0
    kv_used: int = 0
    n_prefill: int = 0
    served: int = 0
    energy_j: float = 0.0
    busy_s: float = 0.0
    on_s: float = 0.0
    t_off: float = math.nan
    kv_peak: int = 0
    run_peak: int = 0
    # iteration clock: V iterations done at time t_seg; each takes dt until the batch changes
    V: int = 0
    t_seg: float = 0.0
    dt: float = 0.0
    next_x: float = math.inf          # iteration count of the next scheduled event
    next_t: float = math.inf          # its time (the global heap entry that is not stale)
    t_acc: float = 0.0                # energy counted up to here
    fin: list = field(default_factory=list)    # heap of x*N + i: finish / leave points
    ft: list = field(default_factory=list)     # heap of x*N + i: first-token points
    queue: object = None              # collections.deque of request indices (lazy deletion)
    power: list = field(default_factory=list)  # watts at batch 0..max_batch
    pf: object = None                 # memoryview: prefill iterations per request (this chunk)
    kvneed: object = None             # memoryview: KV tokens per request (this block size)
    pull: tuple = ()                  # shared-queue classes this replica serves

    def __post_init__(self) -> None:
        p = self.profile
        self.kv_capacity, self.max_batch = p.kv_capacity_tokens, p.max_batch
        self.power = p.power_table()
        self.t_acc = self.t_seg = self.t_on
        self.dt = p.base_s

    @property
    def power_w(self) -> float:
        """Watts drawn now (0 when off; idle watts while starting)."""
        return 0.0 if self.state == OFF else self.power[self.running]

    @property
    def kv_free(self) -> int:
        return self.kv_capacity - self.kv_used

    @property
    def gpu_hours(self) -> float:
        return self.on_s * self.profile.gpus / 3600.0

    def record(self) -> dict:
        """Per-replica totals for SimResult.replicas."""
        p = self.profile
        return {"replica": self.index, "pool_id": self.pool_id, "model": self.model,
                "region": self.region, "profile": p.name, "gpus": p.gpus, "t_on": self.t_on,
                "t_off": self.t_off, "on_s": self.on_s, "gpu_hours": self.gpu_hours,
                "busy_s": self.busy_s, "energy_j": self.energy_j, "served": self.served,
                "kv_peak": self.kv_peak, "kv_capacity": self.kv_capacity,
                "run_peak": self.run_peak, "max_batch": self.max_batch,
                "cost": self.gpu_hours * p.cost_per_gpu_hour,
                "energy_provenance": p.energy_provenance}
