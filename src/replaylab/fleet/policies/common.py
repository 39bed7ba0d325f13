"""Pieces the serving policies share: eligibility, tie-spreading argmin, per-request KV estimates.

- `eligible_replicas(request, fleet)`: the set the simulator would offer the
  request (ready, its model, its residency region). Admission sees no
  `eligible` argument, so admission policies recompute it (O(replicas)).
- `Spread`: argmin whose scan starts one position later on every call, so
  equal keys take turns (LeastLoaded's rule) instead of the first one taking all.
- `kv_estimate(request, mode, default_max_tokens)`: the KV tokens a request is
  predicted to reserve. `hint_p90` is a forecast of TOTAL tokens (prompt +
  output; `contracts.hints.DemandHint`), so the hint estimate is the hint itself,
  never below prompt + 1.
- `expected_kv(request)`: the same with the hint when there is one, else the
  prompt alone (the part that is known): the energy models' context term.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

READY = "ready"
KV_MODES = ("hint", "perfect", "none")


def eligible_replicas(request, fleet) -> list[int]:
    """Ready replicas of the request's model in its residency region (any region if None)."""
    model, region = request.model, request.region
    return [rep.index for rep in fleet.replicas
            if rep.state == READY and rep.model == model
            and (region is None or rep.region == region)]


class Spread:
    """argmin over parallel sequences with ties spread across calls."""

    __slots__ = ("_turn",)

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, cands: Sequence[int], keys: list) -> int:
        n = len(cands)
        if n == 1:
            return cands[0]
        low = min(keys)
        self._turn = k = (self._turn + 1) % n
        try:
            j = keys.index(low, k)
        except ValueError:
            j = keys.index(low)
        return cands[j]

    def least_loaded(self, cands: Sequence[int], load) -> int:
        return self.pick(cands, [load[r] for r in cands])


def kv_estimate(request, mode: str, default_max_tokens: int) -> float:
    """Predicted KV tokens of `request`: hint (total-token p90), perfect (oracle) or none (cap)."""
    p = request.prompt_tokens
    if mode == "perfect":
        return float(p + request.completion_tokens)
    if mode == "hint":
        h = request.hint_p90
        if not math.isnan(h):
            return max(float(h), p + 1.0)
    return float(p + default_max_tokens)  # no max_tokens column in Workload: the cap


def expected_kv(request) -> float:
    """The hint when present (total tokens), else the prompt: what a fair policy can know."""
    h = request.hint_p90
    p = request.prompt_tokens
    return p + 0.0 if math.isnan(h) else max(float(h), p + 1.0)


def blocks(tokens: float, block: int) -> int:
    """Tokens rounded up to whole KV blocks (what the engine would reserve)."""
    return -(-math.ceil(tokens) // block) * block
