"""A demand request read into the artifact's feature row (standard library; numpy for the row).

A request is a mapping of ledger-v1 pre-dispatch fields (`prompt_tokens`, `max_tokens`,
`turn_index`, `streaming`, `category`, `selected_model`, ..., `timestamp` as epoch ms,
RFC 3339 or an aware datetime; now when absent) plus the session history the caller
keeps (the projection's `hist_*` names, `contracts.columns.HISTORY_COLUMNS`). A request
with no `hist_*` field is a first turn (each feature's `first_turn` value: counts 0,
the rest missing); a request with some has the missing counts set to the largest given
count (`censored` to 0) and the other missing fields treated as missing values
(LightGBM's missing branch). Numeric fields take int, float, bool or None; a string
there raises `BadRequest` (the request's hint is a fallback, reason `bad_request`).

The encoding mirrors the projection (`replaylab.projection.features`): calendar
features from `timestamp` (UTC hour, day of week with 0 = Monday), categories as their
position in the artifact's vocabulary (an unseen value is missing).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from replaylab.contracts.columns import HISTORY_COLUMNS, HISTORY_COUNT_COLUMNS
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.columns import Projected as P

NONE_CELL = "<none>"  # conformal cell value of a missing group attribute (as in training)
NUMERIC, CATEGORY, HISTORY, HOUR, DOW = range(5)  # feature-assembly operations
_FAST = frozenset((int, float, bool))  # exact types read with float() directly
_MS_PER_HOUR, _MS_PER_DAY = 3_600_000, 86_400_000
_HISTORY = frozenset(HISTORY_COLUMNS)


class BadRequest(ValueError):
    """A request field this runtime cannot read (the request gets a fallback hint)."""


def number(value: Any, default: float = math.nan) -> float:
    """A numeric request field as float; None/NaN -> default; a string is a bad request."""
    if value is None:
        return default
    if isinstance(value, bool | int | float | np.integer | np.floating | np.bool_):
        v = float(value)
        return default if math.isnan(v) else v
    raise BadRequest(f"not a number: {value!r}")


def lenient(value: Any) -> float:
    """Like `number`, but anything unreadable is NaN: the fallback never raises."""
    try:
        return number(value)
    except BadRequest:
        return math.nan


def request_id(request: Mapping[str, Any]) -> str | None:
    rid = request.get(L.REQUEST_ID)
    return None if rid is None else str(rid)


def epoch_ms(value: Any, now_ms: int) -> int:
    """timestamp as int epoch ms: int/float ms, RFC 3339 string, aware datetime; None -> now."""
    if value is None:
        return now_ms
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise BadRequest("timestamp datetime has no timezone")
        return int(value.timestamp() * 1000)
    if isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value)
        except ValueError:
            raise BadRequest(f"timestamp {value!r} is not RFC 3339") from None
        return epoch_ms(dt if dt.tzinfo else dt.replace(tzinfo=UTC), now_ms)
    v = number(value)
    if not math.isfinite(v):
        return now_ms
    return int(v)


def cell_key(r: Mapping[str, Any], columns: Sequence[str]) -> str:
    """The request's conformal cell key, as training built it ('a|b|c', missing -> '<none>')."""
    if not columns:
        return "*"
    parts = []
    for c in columns:
        v = r.get(c)
        parts.append(NONE_CELL if v is None or (isinstance(v, float) and math.isnan(v))
                     else str(v))
    return "|".join(parts)


def operation(name: str, kind: str, source: str) -> int:
    """The assembly operation of one feature of the schema."""
    if source == "calendar":
        return HOUR if name == P.HOUR_UTC else DOW
    if source == "history":
        return HISTORY
    return CATEGORY if kind == "category" else NUMERIC


def assemble(plan: Sequence[tuple], r: Mapping[str, Any], now_ms: int, row: np.ndarray) -> None:
    """Fill one float64 row in the artifact's feature order (the projection's encoding).

    plan: (name, operation, category index or None, first-turn value) per feature
    (`spec.DemandSpec.plan`). Hot path (one call per request): plain Python floats,
    one write into the numpy row. Raises BadRequest for an unreadable field.
    """
    has_history = not r.keys().isdisjoint(_HISTORY)
    max_count = max(number(r.get(h), 0.0) for h in HISTORY_COUNT_COLUMNS) \
        if has_history else 0.0
    ts = None
    vals = []
    for name, op, index, first in plan:
        if op == NUMERIC:
            v = r.get(name)
            if type(v) in _FAST:
                vals.append(float(v))  # NaN stays NaN
            else:
                vals.append(number(v))
        elif op == CATEGORY:
            v = r.get(name)
            code = None if v is None or (isinstance(v, float) and v != v) else \
                index.get(v if type(v) is str else str(v))
            vals.append(math.nan if code is None else float(code))
        elif op == HISTORY:
            if name in r:
                vals.append(number(r[name]))
            elif not has_history:
                vals.append(first)
            elif name in HISTORY_COUNT_COLUMNS:
                vals.append(max_count)
            else:
                vals.append(0.0 if name == P.TURNS_CENSORED else math.nan)
        else:  # calendar
            if ts is None:
                ts = epoch_ms(r.get(L.TIMESTAMP), now_ms)
            vals.append(float((ts // _MS_PER_HOUR) % 24) if op == HOUR else
                        float((ts // _MS_PER_DAY + 3) % 7))  # 1970-01-01 was a Thursday
    row[:] = vals
