"""The demand hint, capability negotiation, the acknowledgement and the ledger record.

Standard library (and the contracts' enums) only. Three facts stay three separate things (ledger-v1,
"Hint and acknowledgement columns"):

1. the ESTIMATE: a `DemandHint` (the `hint_*` columns), made before dispatch;
2. the DECISION: an `Acknowledgement` from the downstream consumer (`ack_state`,
   `ack_decision`): `used`, `ignored`, `unsupported` (no hint version in common:
   no hint was sent) or `absent` (nothing came back);
3. the ACTUAL: the usage observed after completion (`completion_tokens`,
   `finish_reason`, `lifecycle_state`), from which `ledger_record` derives the
   residual columns without touching the estimate.

Negotiation: a consumer declares the hint versions it understands;
`negotiate(offered, accepted)` picks the highest version both know, or None, in
which case no hint is sent and the acknowledgement is `unsupported`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from replaylab.contracts.enums import LOWER_BOUND_FINISH, LOWER_BOUND_LIFECYCLE, AckState

HINT_VERSION = "1"
SUPPORTED_HINT_VERSIONS: tuple[str, ...] = (HINT_VERSION,)
ACK_STATES = AckState.ALL

# Residual columns `ledger_record` adds (extra ledger-v1 columns, carried untouched).
RESIDUAL = "residual_total_tokens"  # actual total - hint_p50; null without usage or hint
RESIDUAL_LOWER_BOUND = "residual_is_lower_bound"  # the actual is a lower bound (censored)
RESIDUAL_COVERED = "residual_covered"  # actual in [hint_lo, hint_hi]; null when unknowable


@dataclass(frozen=True, slots=True)
class DemandHint:
    """One request's demand estimate in total tokens (prompt + output), ledger-v1 `hint_*`.

    `fallback_reason` says why the conservative baseline answered (a manifest
    reason code such as `hash_mismatch`, or `expired`, `missing_prompt_tokens`,
    ...); None when the model answered. It is recorded as the extra ledger
    column `hint_fallback_reason` (ledger-v1 carries extra columns untouched).

    Online recalibration (`replaylab.runtime.online`; None on a fallback hint):
    `correction_cell` the conformal state the interval used, `correction` its
    value (model scale) and `correction_version` its counter (0 = exported);
    `frozen_lo` / `frozen_hi` the interval under the exported correction (equal
    to hint_lo / hint_hi when online recalibration is off or has not moved).
    Extra ledger columns `hint_correction_cell`, `hint_correction`,
    `hint_correction_version`, `hint_lo_frozen`, `hint_hi_frozen`.
    """

    hint_version: str
    hint_model_version: str
    hint_p50: float
    hint_p90: float
    hint_lo: float
    hint_hi: float
    hint_interval: float | None
    hint_age_ms: int | None
    hint_fallback: bool
    fallback_reason: str | None = None
    request_id: str | None = None
    correction_cell: str | None = None
    correction: float | None = None
    correction_version: int | None = None
    frozen_lo: float | None = None
    frozen_hi: float | None = None

    def columns(self) -> dict[str, Any]:
        """The ledger-v1 `hint_*` columns of this hint."""
        return {
            "hint_version": self.hint_version, "hint_model_version": self.hint_model_version,
            "hint_p50": self.hint_p50, "hint_p90": self.hint_p90, "hint_lo": self.hint_lo,
            "hint_hi": self.hint_hi, "hint_interval": self.hint_interval,
            "hint_age_ms": self.hint_age_ms, "hint_fallback": self.hint_fallback,
            "hint_fallback_reason": self.fallback_reason,
            "hint_correction_cell": self.correction_cell, "hint_correction": self.correction,
            "hint_correction_version": self.correction_version,
            "hint_lo_frozen": self.frozen_lo, "hint_hi_frozen": self.frozen_hi,
        }


# the online recalibration's columns (`replaylab.runtime.online`)
ONLINE_HINT_COLUMNS = ("hint_correction_cell", "hint_correction", "hint_correction_version",
                       "hint_lo_frozen", "hint_hi_frozen")
HINT_COLUMNS = (
    "hint_version", "hint_model_version", "hint_p50", "hint_p90", "hint_lo", "hint_hi",
    "hint_interval", "hint_age_ms", "hint_fallback", "hint_fallback_reason",
    *ONLINE_HINT_COLUMNS)


def negotiate(accepted: Iterable[str],
              offered: Iterable[str] = SUPPORTED_HINT_VERSIONS) -> str | None:
    """The highest hint version both sides support (numeric order), else None."""
    common = set(map(str, offered)) & set(map(str, accepted))
    if not common:
        return None
    return max(common, key=lambda v: tuple(int(p) if p.isdigit() else -1 for p in v.split(".")))


@dataclass(frozen=True, slots=True)
class Acknowledgement:
    """What the consumer did with the hint: `state` in ACK_STATES, `decision` e.g. `admitted`."""

    state: str
    decision: str | None = None

    def __post_init__(self) -> None:
        if self.state not in ACK_STATES:
            raise ValueError(f"Acknowledgement.state={self.state!r}: must be one of {ACK_STATES}")
        if self.decision is not None and not isinstance(self.decision, str):
            raise ValueError(f"Acknowledgement.decision={self.decision!r}: must be a string")

    def columns(self) -> dict[str, Any]:
        return {"ack_state": self.state, "ack_decision": self.decision}


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def is_lower_bound(finish_reason: Any, lifecycle_state: Any) -> bool:
    """True when the observed output is only a lower bound (cap hit, cancelled, failed)."""
    return finish_reason in LOWER_BOUND_FINISH or lifecycle_state in LOWER_BOUND_LIFECYCLE


def ledger_record(request: Mapping[str, Any], hint: DemandHint | None,
                  ack: Acknowledgement | None, actual: Mapping[str, Any] | None = None,
                  ) -> dict[str, Any]:
    """One ledger-v1 row: the request's fields, the hint, the ack, the actual and residuals.

    request: the request's ledger fields (pre-dispatch); hint: None when none was
    sent (no version in common); ack: None = nothing came back (`absent`);
    actual: post-completion fields (`completion_tokens` null = usage absent,
    `finish_reason`, `lifecycle_state`, `ended_at`, ...). The residual is
    actual total - hint_p50 (a lower bound when the actual is censored); it is
    null when usage is absent, prompt_tokens unknown or no hint was sent.
    """
    row = dict(request)
    row.update(actual or {})
    row.update(hint.columns() if hint is not None else dict.fromkeys(HINT_COLUMNS))
    row.update((ack or Acknowledgement(AckState.ABSENT)).columns())
    completion, prompt = row.get("completion_tokens"), row.get("prompt_tokens")
    lower = is_lower_bound(row.get("finish_reason"), row.get("lifecycle_state"))
    residual = covered = None
    if hint is not None and not _missing(completion) and not _missing(prompt):
        total = float(prompt) + float(completion)
        residual = total - hint.hint_p50
        if total > hint.hint_hi:
            covered = False  # even a lower bound above hi proves a miss
        elif not lower:
            covered = total >= hint.hint_lo
    row[RESIDUAL] = residual
    row[RESIDUAL_LOWER_BOUND] = lower if residual is not None else None
    row[RESIDUAL_COVERED] = covered
    return row
