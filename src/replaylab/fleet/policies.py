"""Serving policies below the router: which replica takes a request, and whether it is admitted.

Every policy here follows `sim_policy.Policy` (`admit(request, fleet, now)`,
`choose(request, eligible, fleet, now)`), only ever answers with a member of
`eligible` (the simulator's ready, same-model, same-residency set), and reads
only what a router can see: `fleet.load`, and per replica `pool_id`, `model`,
`region`, `profile`, `state`, `running`, `queued`, `kv_used`, `kv_capacity`,
`max_batch` (so `telemetry_feed.TelemetryAware` can hand them the telemetry
view instead of the live fleet). Rules:

- `SpilloverPolicy(primary, max_load_per_replica=8)`: `primary[model]` is the
  model's preferred pool. Least-loaded (ties spread) among its eligible
  replicas while the least loaded of them has running + queued <
  max_load_per_replica; otherwise least-loaded among the other eligible
  replicas (a spill, counted in `spills`); with no other, back to the primary.
  A model without a primary: least-loaded among all eligible.
- `StaticEfficientPolicy()`: pools ranked once by modeled joules per output
  token at a reference batch; the most efficient pool with room takes the
  request (policies_energy.py).
- `EnergyAwarePolicy(max_load_per_replica=8, hysteresis=0.1, carbon=())`:
  lowest marginal joules (or gCO2) per token of one more sequence, with
  per-model pool hysteresis (policies_energy.py).
- `HintAdmission(mode="hint", kv_headroom=1.0, default_max_tokens=4096,
  chooser=None, max_queue=0)`: admission by predicted KV need. The estimate:
  mode "hint": `hint_p90` (a forecast of total tokens, prompt included; NaN ->
  the conservative rule); "perfect": prompt + the true completion tokens (the
  oracle bound, for comparison only); "none": prompt + default_max_tokens (the
  cap reserved whole: the conservative baseline; the Workload has no per-request
  max_tokens, so the default cap is used for every request). need = the
  estimate rounded up to the replica's KV blocks. Admit when some eligible
  replica has free KV kv_capacity * kv_headroom - kv_used >= need, or a short
  queue (queued <= max_queue: the request would be next in line); else reject
  with reason "kv_forecast". With no eligible replica it admits and lets the
  simulator answer `no_replica`. `choose` hands `chooser` (default LeastLoaded)
  the eligible replicas whose free KV covers the need, or all of them when none
  does.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping

from replaylab.config import fail_field
from replaylab.fleet.policies_common import (
    KV_MODES,
    Spread,
    blocks,
    eligible_replicas,
    kv_estimate,
)
from replaylab.fleet.policies_energy import (
    CarbonSignal,
    EnergyAwarePolicy,
    StaticEfficientPolicy,
    marginal_j_per_token,
    reference_j_per_token,
)
from replaylab.fleet.sim_policy import LeastLoaded, Policy

__all__ = ["CarbonSignal", "EnergyAwarePolicy", "HintAdmission", "SpilloverPolicy",
           "StaticEfficientPolicy", "eligible_replicas", "marginal_j_per_token",
           "reference_j_per_token"]


class SpilloverPolicy:
    """Primary pool per model while it has room below max_load_per_replica; else the rest."""

    def __init__(self, primary: Mapping[str, str], max_load_per_replica: int = 8) -> None:
        c = "SpilloverPolicy"
        if not isinstance(primary, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) and v for k, v in primary.items()):
            fail_field(c, "primary", primary, "must map model name -> non-empty pool_id")
        if not isinstance(max_load_per_replica, int) or max_load_per_replica < 1:
            fail_field(c, "max_load_per_replica", max_load_per_replica, "must be an integer >= 1")
        self.primary = dict(primary)
        self.max_load = max_load_per_replica
        self._spread = Spread()
        self.spills = 0

    def admit(self, request, fleet, now):  # noqa: ARG002 - the Policy signature
        return None

    def choose(self, request, eligible, fleet, now):  # noqa: ARG002
        load, reps = fleet.load, fleet.replicas
        pool = self.primary.get(request.model)
        if pool is None:
            return self._spread.least_loaded(eligible, load)
        prim = [r for r in eligible if reps[r].pool_id == pool]
        if prim and min(load[r] for r in prim) < self.max_load:
            return self._spread.least_loaded(prim, load)
        others = [r for r in eligible if reps[r].pool_id != pool]
        if others:
            self.spills += 1
            return self._spread.least_loaded(others, load)
        return self._spread.least_loaded(prim, load)


class HintAdmission:
    """Admit by forecast KV need (hint / perfect / none); prefer replicas whose free KV covers it."""

    def __init__(self, mode: str = "hint", kv_headroom: float = 1.0,
                 default_max_tokens: int = 4096, chooser: Policy | None = None,
                 max_queue: int = 0) -> None:
        c = "HintAdmission"
        if mode not in KV_MODES:
            fail_field(c, "mode", mode, f"must be one of {KV_MODES}")
        if not (isinstance(kv_headroom, int | float) and math.isfinite(kv_headroom)
                and kv_headroom > 0):
            fail_field(c, "kv_headroom", kv_headroom, "must be finite and > 0")
        if not isinstance(default_max_tokens, int) or default_max_tokens < 1:
            fail_field(c, "default_max_tokens", default_max_tokens, "must be an integer >= 1")
        if chooser is not None and not callable(getattr(chooser, "choose", None)):
            fail_field(c, "chooser", type(chooser).__name__, "must have choose(...)")
        if not isinstance(max_queue, int) or max_queue < 0:
            fail_field(c, "max_queue", max_queue, "must be an integer >= 0")
        self.mode, self.kv_headroom = mode, float(kv_headroom)
        self.default_max_tokens, self.max_queue = default_max_tokens, max_queue
        self.chooser = chooser if chooser is not None else LeastLoaded()
        self.decisions: Counter = Counter()  # admit_kv, admit_queue, reject, no_hint

    def estimate(self, request) -> float:
        """Predicted KV tokens of the request under this mode (before block rounding)."""
        return kv_estimate(request, self.mode, self.default_max_tokens)

    def _free(self, rep) -> float:
        return rep.kv_capacity * self.kv_headroom - rep.kv_used

    def admit(self, request, fleet, now):
        if self.mode == "hint" and math.isnan(request.hint_p90):
            self.decisions["no_hint"] += 1
        el = eligible_replicas(request, fleet)
        if not el:
            return None  # the simulator says no_replica
        est = self.estimate(request)
        reps = fleet.replicas
        short = False
        for r in el:
            rep = reps[r]
            if self._free(rep) >= blocks(est, rep.profile.kv_block_tokens):
                self.decisions["admit_kv"] += 1
                return None
            short = short or rep.queued <= self.max_queue
        if short:
            self.decisions["admit_queue"] += 1
            return None
        self.decisions["reject"] += 1
        return "kv_forecast"

    def choose(self, request, eligible, fleet, now):
        est = self.estimate(request)
        reps = fleet.replicas
        fit = [r for r in eligible
               if self._free(reps[r]) >= blocks(est, reps[r].profile.kv_block_tokens)]
        return self.chooser.choose(request, fit or eligible, fleet, now)
