"""The two reference policies: `RoundRobin` and `LeastLoaded` (the simulator's default).

Both follow `sim.policy.Policy` and admit every request.
"""

from __future__ import annotations

from operator import itemgetter


class RoundRobin:
    """Each request to the next eligible replica; one counter per (model, residency) class."""

    def __init__(self) -> None:
        self._next: dict[int, int] = {}

    def admit(self, request, fleet, now):  # noqa: ARG002 - the Policy signature
        return None

    def choose(self, request, eligible, fleet, now):  # noqa: ARG002
        key = request.eligibility_class
        k = self._next.get(key, 0)
        self._next[key] = k + 1
        return eligible[k % len(eligible)]


class LeastLoaded:
    """The eligible replica with the fewest running + queued requests (join the shortest queue).

    Ties are spread: the search for the minimum starts one position later on
    every call, so equally loaded replicas take turns instead of the first one
    taking all. O(len(eligible)) per request, all of it in C: an itemgetter
    (cached per eligible list) reads the loads, `min` and `tuple.index` find one.
    Measured: about 1 us per request at 16 replicas, 2 us at 64.
    """

    def __init__(self) -> None:
        self._turn = 0
        self._getters: dict[int, tuple] = {}

    def admit(self, request, fleet, now):  # noqa: ARG002
        return None

    def choose(self, request, eligible, fleet, now):  # noqa: ARG002
        n = len(eligible)
        if n == 1:
            return eligible[0]
        cached = self._getters.get(id(eligible))
        if cached is None or cached[0] is not eligible:
            if len(self._getters) > 256:  # shared queueing hands out a fresh list per request
                self._getters.clear()
            cached = self._getters[id(eligible)] = (eligible, itemgetter(*eligible))
        loads = cached[1](fleet.load)
        low = min(loads)
        self._turn = k = (self._turn + 1) % n
        try:
            j = loads.index(low, k)
        except ValueError:
            j = loads.index(low)
        return eligible[j]
