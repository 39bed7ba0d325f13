"""`SpilloverPolicy`: a model's primary pool while it has room, else least-loaded elsewhere.

Rule and context: the package docstring (replaylab.fleet.policies).
"""

from __future__ import annotations

from collections.abc import Mapping

from replaylab.config import fail_field
from replaylab.fleet.policies.common import Spread


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
