"""Seeded, realistic defects in a ledger-v1 frame, so that a run exercises the quarantine.

Each corrupted row gets exactly one defect, chosen so that `validate_ledger` quarantines
it for the intended reason; `inject_defects` returns the count per reason, which a run
compares with `ValidationResult.by_reason()`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from replaylab.contracts.columns import Ledger as L

# Quarantine reason codes of replaylab.contracts (ledger.py / schema.py), one per defect.
DEFECT_REASONS = (
    "negative_tokens",  # prompt_tokens < 0 (a wrapped or garbage counter)
    "unknown_enum_value",  # e.g. finish_reason "max_tokens" (another vendor's name)
    "duplicate_request_id",  # a retried export writes a row twice under one id
    "bad_timestamp",  # microseconds written where milliseconds belong
    "missing_required_field",  # session_id or selected_model lost
    "unknown_ledger_version",  # a row from a newer writer
    "end_before_dispatch",  # ended_at before timestamp (clock skew)
)
_BAD_ENUMS = ((L.FINISH_REASON, "max_tokens"), (L.LIFECYCLE_STATE, "timeout"),
              (L.ROUTING_SOURCE, "sticky"))


def inject_defects(df: pd.DataFrame, rate: float, seed: int) -> tuple[pd.DataFrame, dict[str, int]]:
    """Corrupt round(rate * len(df)) distinct rows of a clean ledger, one defect each.

    df: a ledger-v1 frame that validates with no quarantined row (e.g. the synthetic one);
    rate: share of rows to corrupt, in [0, 1). Returns a corrupted copy and
    {quarantine reason: rows}, leaving out reasons with no row.
    """
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"rate={rate!r}: must be in [0, 1)")
    out = df.copy().reset_index(drop=True)
    n, k = len(out), int(round(rate * len(out)))
    if k == 0:
        return out, {}
    rng = np.random.default_rng([seed, 0xDEFEC7])  # a stream apart from the generator's
    rows = np.sort(rng.choice(n, k, replace=False))
    reason = rng.integers(0, len(DEFECT_REASONS), k)
    # A duplicate copies the id of a clean row before it (the validator keeps the first).
    clean = np.setdiff1d(np.arange(n), rows)
    before = np.searchsorted(clean, rows)  # clean rows before each corrupted row
    dup = reason == DEFECT_REASONS.index("duplicate_request_id")
    reason[dup & (before == 0)] = DEFECT_REASONS.index("negative_tokens")
    for code, name in enumerate(DEFECT_REASONS):
        at = rows[reason == code]
        if at.size:
            _CORRUPT[name](out, at, rng, clean, np.searchsorted(clean, at))
    counts = np.bincount(reason, minlength=len(DEFECT_REASONS))
    return out, {name: int(c) for name, c in zip(DEFECT_REASONS, counts, strict=True) if c}


def _col(out: pd.DataFrame, name: str) -> int:
    return out.columns.get_loc(name)


def _negative_tokens(out, at, rng, clean, before) -> None:
    prompt = out[L.PROMPT_TOKENS].to_numpy()[at]
    out.iloc[at, _col(out, L.PROMPT_TOKENS)] = -(np.nan_to_num(prompt).astype(np.int64) + 1)


def _unknown_enum(out, at, rng, clean, before) -> None:
    choices = [(c, v) for c, v in _BAD_ENUMS if c in out.columns]
    pick = rng.integers(0, len(choices), at.size)
    for j, (col, value) in enumerate(choices):
        out.iloc[at[pick == j], _col(out, col)] = value


def _duplicate_id(out, at, rng, clean, before) -> None:
    source = clean[np.floor(rng.random(at.size) * before).astype(np.int64)]
    out.iloc[at, _col(out, L.REQUEST_ID)] = out[L.REQUEST_ID].to_numpy()[source]


def _bad_timestamp(out, at, rng, clean, before) -> None:
    out.iloc[at, _col(out, L.TIMESTAMP)] = out[L.TIMESTAMP].to_numpy()[at] * 1000


def _missing_field(out, at, rng, clean, before) -> None:
    which = rng.random(at.size) < 0.5
    out.iloc[at[which], _col(out, L.SESSION_ID)] = None
    out.iloc[at[~which], _col(out, L.SELECTED_MODEL)] = None


def _unknown_version(out, at, rng, clean, before) -> None:
    out.iloc[at, _col(out, L.VERSION)] = "2"


def _end_before_dispatch(out, at, rng, clean, before) -> None:
    if L.ENDED_AT not in out.columns:
        out[L.ENDED_AT] = pd.array([pd.NA] * len(out), dtype="Int64")
    skew = 1 + np.floor(rng.random(at.size) * 60_000).astype(np.int64)
    out.iloc[at, _col(out, L.ENDED_AT)] = out[L.TIMESTAMP].to_numpy()[at] - skew


_CORRUPT = {
    "negative_tokens": _negative_tokens,
    "unknown_enum_value": _unknown_enum,
    "duplicate_request_id": _duplicate_id,
    "bad_timestamp": _bad_timestamp,
    "missing_required_field": _missing_field,
    "unknown_ledger_version": _unknown_version,
    "end_before_dispatch": _end_before_dispatch,
}
