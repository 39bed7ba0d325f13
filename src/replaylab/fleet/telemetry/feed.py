"""Modeled replica telemetry for the fleet simulator, and a wrapper that routes on it, not on live state.

`TelemetryFeed(scrape_interval_s=1.0, delay_s=0.0, ttl_s=3.0, outage=())`
scrapes every replica at fixed times and produces observation-v1
`Observation`s (`replaylab.contracts.observation`), all fields `source="modeled"`:
queue_depth (= queued), running_requests (= running), kv_cache_usage
(= kv_used / kv_capacity), power_watts (= power_w), health.

How the feed gets the simulator's state: it is a `Controller`. The simulator
calls `decide(now, fleet)` every `SimConfig.control_interval_s`, exactly on the
tick; the feed snapshots the fleet there (and returns no scale actions). So a
scrape reads the state at its own time, never at a later decision. Wire it with

    feed = TelemetryFeed(...)
    FleetSim(pools, feed.sim_config(SimConfig(...)), TelemetryAware(policy, feed),
             controller=feed)              # or controller=feed.around(autoscaler)

(the rejected alternative, refreshing lazily at a decision, could only read
the state at that decision, i.e. live state labelled with an earlier time).
Ticks more frequent than the scrape interval are skipped; sparser ticks, or a
policy asked before any scrape, raise `PolicyError` rather than run on nothing.

Timing, as the house poller (`adapters.poller`) does it:
- a scrape at s captures the fleet at s: `observed_at = s`, fields expire at
  s + ttl_s; it becomes visible to the router at s + delay_s (transport delay);
  between scrapes the last visible one is what the router knows;
- a scrape inside an outage window [a, b) fails: health becomes `unknown`
  (observed at s) and every load field keeps its old expiry, so it turns stale
  ttl_s after the last good scrape; a replica never scraped well is `missing`;
- replicas starting or off at a scrape are not observed (health `unknown`).

`TelemetryAware(policy, feed, fallback=None)`: per decision, the eligible
replicas are judged at `now` by `feed.fresh(r, now)`, which is
`contracts.observation.freshness(observation, now) is FRESH` (every load field before its
expiry; tested equal), computed once per observation instead of per read.
- All fresh: `policy` decides on the telemetry view (`TelemetryView`): `load`,
  `running`, `queued`, `kv_used`, `power_w` are the last observed values;
  `pool_id`, `model`, `region`, `profile`, `state`, `kv_capacity`, `max_batch`
  are configuration and come from the fleet (the router knows what it
  deployed and which replicas are up). Mode "telemetry".
- Any eligible replica stale or missing: the fallback decides (mode
  "fallback"). Default `IndexRoundRobin`: eligible[request.index %
  len(eligible)], admit everything: a function of the request index and the
  eligible set only, so two runs decide identically. The wrapped policy is not
  consulted at all. A custom fallback gets the same view, in which an
  unreadable field reads None and an unreadable load reads inf: never the live
  value.
`decisions` and `admissions` count decisions per mode; `record=True` keeps
(request index, now, mode, replica) per choice in `trace`.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import replace

from replaylab.config import fail_field
from replaylab.contracts.observation import (
    LOAD_FIELDS,
    FieldValue,
    Health,
    Observation,
    ObsField,
    Source,
)
from replaylab.fleet.policies.common import READY, eligible_replicas
from replaylab.fleet.sim.fleet import DRAINING, SimConfig
from replaylab.fleet.sim.policy import PolicyError

TELEMETRY, FALLBACK = "telemetry", "fallback"
_EPS = 1e-9


class TelemetryFeed:
    """Scrapes the simulated fleet at fixed times; latest visible `Observation` per replica."""

    def __init__(self, scrape_interval_s: float = 1.0, delay_s: float = 0.0, ttl_s: float = 3.0,
                 outage: Sequence[tuple[float, float]] = ()) -> None:
        c = "TelemetryFeed"
        for name, v, low_ok in (("scrape_interval_s", scrape_interval_s, False),
                                ("delay_s", delay_s, True), ("ttl_s", ttl_s, False)):
            if not (isinstance(v, int | float) and math.isfinite(v) and (v >= 0 if low_ok else v > 0)):
                fail_field(c, name, v, "must be finite and " + (">= 0" if low_ok else "> 0"))
        windows = []
        for w in outage:
            if len(w) != 2 or not (0 <= w[0] < w[1]):
                fail_field(c, "outage", w, "each window must be (start_s, end_s) with 0 <= start < end")
            windows.append((float(w[0]), float(w[1])))
        self.scrape_interval_s, self.delay_s, self.ttl_s = (float(scrape_interval_s),
                                                             float(delay_s), float(ttl_s))
        self.outage = tuple(sorted(windows))
        self._pending: deque = deque()   # (visible_at, scrape_t, values | None)
        self._good: list = []            # per replica: (scrape_t, values) of the last good one
        self._health: list = []          # per replica: (scrape_t, healthy) of the last one
        self._obs: dict[int, tuple] = {}  # replica -> (key, Observation)
        self._ids: list = []             # per replica: (replica_id, pool_id, model)
        self._next_due = 0.0
        self._last_tick: float | None = None
        self.scrapes = self.failed_scrapes = 0

    # ---- the Controller face: the simulator calls this on every control tick ----
    def decide(self, now: float, fleet) -> tuple:
        self.scrape(now, fleet)
        return ()

    def around(self, controller):
        """A Controller that scrapes, then asks `controller` (e.g. an autoscaler) on the same tick."""
        return _FeedThen(self, controller)

    def sim_config(self, config: SimConfig | None = None) -> SimConfig:
        """`config` with control_interval_s = scrape_interval_s (the tick the feed needs)."""
        return replace(config or SimConfig(), control_interval_s=self.scrape_interval_s)

    def in_outage(self, t: float) -> bool:
        return any(a <= t < b for a, b in self.outage)

    def scrape(self, now: float, fleet) -> None:
        """Snapshot every replica at `now` (a scrape tick); visible from now + delay_s."""
        last, self._last_tick = self._last_tick, now
        if last is not None and now - last > self.scrape_interval_s * (1 + _EPS) + _EPS:
            raise PolicyError(f"TelemetryFeed ticked at {last}s then {now}s; scrape_interval_s="
                              f"{self.scrape_interval_s}: set SimConfig.control_interval_s <= it "
                              f"(feed.sim_config(config))")
        if now + _EPS < self._next_due:
            return
        self._next_due = now + self.scrape_interval_s
        self.scrapes += 1
        for rep in fleet.replicas[len(self._ids):]:
            self._ids.append((f"r{rep.index}", rep.pool_id, rep.model))
        values = None
        if self.in_outage(now):
            self.failed_scrapes += 1
        else:
            values = [(rep.queued, rep.running, min(1.0, rep.kv_used / rep.kv_capacity),
                       rep.power_w) if rep.state in (READY, DRAINING) else None
                      for rep in fleet.replicas]
        self._pending.append((now + self.delay_s, now, values))

    def _promote(self, now: float) -> None:
        pend = self._pending
        while pend and pend[0][0] <= now:
            _, s, values = pend.popleft()
            n = len(self._ids)
            if len(self._good) < n:
                self._good.extend([None] * (n - len(self._good)))
                self._health.extend([None] * (n - len(self._health)))
            for r in range(n):
                v = values[r] if values is not None and r < len(values) else None
                if v is not None:
                    self._good[r] = (s, v)
                self._health[r] = (s, v is not None)

    def _entry(self, r: int, now: float) -> tuple | None:
        """(key, Observation, fresh_until, values) of replica r as visible at `now`; cached."""
        if self._pending and self._pending[0][0] <= now:
            self._promote(now)
        if r >= len(self._health) or self._health[r] is None:
            return None
        good, health = self._good[r], self._health[r]
        key = (good[0] if good else None, health)
        hit = self._obs.get(r)
        if hit is None or hit[0] != key:
            obs = self._build(r, good, health)
            # freshness(obs, now) is FRESH exactly while now < the earliest load-field expiry
            until = min((obs.fields[n].expires_at for n in LOAD_FIELDS if n in obs.fields),
                        default=-math.inf)
            hit = self._obs[r] = (key, obs, until, good[1] if good else None)
        return hit

    def observation(self, r: int, now: float) -> Observation | None:
        """The latest observation of replica r visible at `now` (None before its first scrape)."""
        e = self._entry(r, now)
        return None if e is None else e[1]

    def fresh(self, r: int, now: float) -> bool:
        """`freshness(self.observation(r, now), now) is Freshness.FRESH`, without re-deriving it."""
        e = self._entry(r, now)
        return e is not None and now < e[2]

    def values(self, r: int, now: float) -> tuple | None:
        """(queue_depth, running_requests, kv_cache_usage, power_watts) if fresh at `now`, else None.

        The same answer as `fresh` + the observation's fields (every load field of a
        replica shares its last good scrape time s and expires at s + ttl_s), read
        without building the `Observation`: controllers call this for every replica
        on every tick.
        """
        if self._pending and self._pending[0][0] <= now:
            self._promote(now)
        if r >= len(self._health) or self._health[r] is None:
            return None
        good = self._good[r]
        return good[1] if good is not None and now < good[0] + self.ttl_s else None

    def _build(self, r: int, good, health) -> Observation:
        ttl, m = self.ttl_s, Source.MODELED
        t_h, ok = health
        fields = {ObsField.HEALTH: FieldValue.observed(
            Health.HEALTHY if ok else Health.UNKNOWN, source=m, at=t_h, ttl_s=ttl,
            origin="fleetsim" if ok else "scrape failed or replica not serving")}
        if good is not None:
            s, (queued, running, kv, watts) = good
            for name, v in ((ObsField.QUEUE_DEPTH, queued), (ObsField.RUNNING_REQUESTS, running),
                            (ObsField.KV_CACHE_USAGE, kv), (ObsField.POWER_WATTS, watts)):
                fields[name] = FieldValue.observed(v, source=m, at=s, ttl_s=ttl, origin="fleetsim")
        rid, pool, model = self._ids[r]
        return Observation(rid, pool, "fleetsim", None, model, t_h, fields)


class _FeedThen:
    """Controller: scrape, then delegate to another controller on the same tick."""

    def __init__(self, feed: TelemetryFeed, controller) -> None:
        self.feed, self.controller = feed, controller

    def decide(self, now, fleet):
        self.feed.scrape(now, fleet)
        return self.controller.decide(now, fleet)


class IndexRoundRobin:
    """Deterministic fallback: eligible[request.index % len(eligible)]; admits everything."""

    def admit(self, request, fleet, now):  # noqa: ARG002 - the Policy signature
        return None

    def choose(self, request, eligible, fleet, now):  # noqa: ARG002
        return eligible[request.index % len(eligible)]


class _ObservedLoad:
    """fleet.load as last observed: queue_depth + running_requests; inf when unreadable."""

    __slots__ = ("_view",)

    def __init__(self, view) -> None:
        self._view = view

    def __len__(self) -> int:
        return len(self._view.fleet.load)

    def __getitem__(self, r: int) -> float:
        v = self._view.feed.values(r, self._view.now)
        return math.inf if v is None else v[0] + v[1]


class ObservedReplica:
    """A replica as telemetry shows it: configuration from the fleet, load from the observation."""

    __slots__ = ("_view", "_rep", "index", "pool_id", "model", "region", "profile",
                 "kv_capacity", "max_batch")

    def __init__(self, view, rep) -> None:
        self._view, self._rep = view, rep
        self.index, self.pool_id, self.model, self.region = rep.index, rep.pool_id, rep.model, rep.region
        self.profile, self.kv_capacity, self.max_batch = rep.profile, rep.kv_capacity, rep.max_batch

    @property
    def state(self) -> str:
        return self._rep.state  # deployment state: the router knows which replicas are up

    def _get(self, k: int):
        v = self._view.feed.values(self.index, self._view.now)
        return None if v is None else v[k]

    @property
    def queued(self) -> int | None:
        return self._get(0)

    @property
    def running(self) -> int | None:
        return self._get(1)

    @property
    def kv_used(self) -> int | None:
        x = self._get(2)
        return None if x is None else int(round(x * self.kv_capacity))

    @property
    def kv_free(self) -> int | None:
        u = self.kv_used
        return None if u is None else self.kv_capacity - u

    @property
    def power_w(self) -> float | None:
        return self._get(3)


class TelemetryView:
    """FleetView whose dynamic values are the feed's observations at `now` (re-pointed per call)."""

    def __init__(self, fleet, feed: TelemetryFeed) -> None:
        self.fleet, self.feed, self.now = fleet, feed, 0.0
        self._reps: list[ObservedReplica] = []
        self.load = _ObservedLoad(self)

    @property
    def replicas(self) -> list[ObservedReplica]:
        live = self.fleet.replicas
        for rep in live[len(self._reps):]:
            self._reps.append(ObservedReplica(self, rep))
        return self._reps

    def pool_replicas(self, pool_id: str) -> list[int]:
        return self.fleet.pool_replicas(pool_id)  # deployment, not load

    def shared_queued(self, model: str, region: str | None = None) -> int:
        return self.fleet.shared_queued(model, region)  # the router's own queue


class TelemetryAware:
    """Route on telemetry when every eligible replica's observation is fresh, else on the fallback."""

    def __init__(self, policy, feed: TelemetryFeed, fallback=None, record: bool = False) -> None:
        if not callable(getattr(policy, "choose", None)):
            fail_field("TelemetryAware", "policy", type(policy).__name__, "must have choose(...)")
        if not isinstance(feed, TelemetryFeed):
            fail_field("TelemetryAware", "feed", type(feed).__name__, "must be a TelemetryFeed")
        self.policy, self.feed = policy, feed
        self.fallback = fallback if fallback is not None else IndexRoundRobin()
        self.record = record
        self.trace: list[tuple[int, float, str, int]] = []
        self.decisions: Counter = Counter()
        self.admissions: Counter = Counter()
        self._view: TelemetryView | None = None

    def _view_of(self, fleet, now: float) -> TelemetryView:
        if self.feed.scrapes == 0:
            raise PolicyError("TelemetryAware asked before any scrape: pass the feed as the "
                              "FleetSim controller with control_interval_s = scrape_interval_s "
                              "(controller=feed, config=feed.sim_config(config))")
        v = self._view
        if v is None or v.fleet is not fleet:
            v = self._view = TelemetryView(fleet, self.feed)
        v.now = now
        return v

    def mode(self, eligible: Sequence[int], now: float) -> str:
        """"telemetry" when every eligible replica is fresh at `now`, else "fallback"."""
        fresh = self.feed.fresh
        if eligible and all(fresh(r, now) for r in eligible):
            return TELEMETRY
        return FALLBACK

    def admit(self, request, fleet, now):
        view = self._view_of(fleet, now)
        mode = self.mode(eligible_replicas(request, view), now)
        self.admissions[mode] += 1
        pol = self.policy if mode == TELEMETRY else self.fallback
        admit = getattr(pol, "admit", None)
        return None if admit is None else admit(request, view, now)

    def choose(self, request, eligible, fleet, now):
        view = self._view_of(fleet, now)
        mode = self.mode(eligible, now)
        self.decisions[mode] += 1
        pol = self.policy if mode == TELEMETRY else self.fallback
        r = pol.choose(request, eligible, view, now)
        if self.record:
            self.trace.append((request.index, now, mode, r))
        return r
