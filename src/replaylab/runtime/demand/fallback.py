"""The conservative baseline a demand predictor answers with when its model cannot."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.hints import HINT_VERSION, DemandHint
from replaylab.runtime.demand.request import lenient, request_id


@dataclass(frozen=True, slots=True)
class FallbackBaseline:
    """The documented conservative baseline: reserve the prompt plus the whole output cap.

    hint_lo = prompt; hint_p50 = hint_p90 = hint_hi = prompt + cap, where cap is
    the request's `max_tokens`, else `default_max_tokens`. It never
    under-reserves a request that respects its cap: it is a reservation, not an
    estimate, so `hint_interval` is None (no coverage is claimed). A request
    without `prompt_tokens` reserves the cap alone. `hint_model_version` is
    `baseline:max_tokens_cap`.
    """

    default_max_tokens: int = 4096
    name: str = "max_tokens_cap"

    def __post_init__(self) -> None:
        if isinstance(self.default_max_tokens, bool) or not isinstance(
                self.default_max_tokens, int) or self.default_max_tokens < 1:
            raise ValueError(f"FallbackBaseline.default_max_tokens={self.default_max_tokens!r}: "
                             "must be an int >= 1")

    def hint(self, request: Mapping[str, Any], reason: str, age_ms: int | None = None,
             ) -> DemandHint:
        prompt = lenient(request.get(L.PROMPT_TOKENS))
        cap = lenient(request.get(L.MAX_TOKENS))
        if not math.isfinite(prompt) or prompt < 0:
            prompt = 0.0
        if not math.isfinite(cap) or cap < 0:
            cap = float(self.default_max_tokens)
        top = prompt + cap
        return DemandHint(HINT_VERSION, f"baseline:{self.name}", top, top, prompt, top, None,
                          age_ms, True, reason, request_id(request))
