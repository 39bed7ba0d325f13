"""`HintAdmission`: admission by predicted KV need (demand hint, true length, or the cap).

Rule and context: the package docstring (replaylab.fleet.policies).
"""

from __future__ import annotations

import math
from collections import Counter

from replaylab.config import fail_field
from replaylab.fleet.policies.common import KV_MODES, blocks, eligible_replicas, kv_estimate
from replaylab.fleet.policies.reference import LeastLoaded
from replaylab.fleet.sim.policy import Policy


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
