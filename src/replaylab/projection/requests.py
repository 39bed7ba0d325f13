"""A projected row as a demand runtime request: the one place rows become requests.

A request (`replaylab.runtime.demand`) is a mapping of the ledger-v1 pre-dispatch fields
(`REQUEST_FIELDS`) plus the session history known at dispatch (the projection's `hist_*`
columns, `contracts.columns.HISTORY_COLUMNS`); the calendar features are left to the
runtime, which derives them from `timestamp`. Cells are plain Python values
(`plain_value`: pd.NA / NaN / NaT -> None, numpy scalars -> int / float / bool).

Used by the hint replay (`hints.replay`: ledger rows and their history at dispatch), the
re-scoring of an artifact (`artifacts.rescore_demand`) and the golden vectors of the export
(`artifacts.demand_export`, which names the artifact's own columns).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from replaylab.contracts.columns import (
    HISTORY_COLUMNS,
    OWN_BOOL_COLUMNS,
    OWN_CATEGORY_COLUMNS,
)
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.columns import Projected as P

# Pre-dispatch request fields handed to the runtime (the rest of a ledger row is the actual).
REQUEST_FIELDS = (L.REQUEST_ID, L.SESSION_ID, L.TURN_INDEX, L.TIMESTAMP, L.PROMPT_TOKENS,
                  L.MAX_TOKENS, L.CACHED_PROMPT_TOKENS, *OWN_BOOL_COLUMNS,
                  *OWN_CATEGORY_COLUMNS)
# What `requests` sends by default: the request's fields, then its session history.
REQUEST_COLUMNS = tuple(dict.fromkeys((*REQUEST_FIELDS, *HISTORY_COLUMNS)))


def plain_value(v: Any) -> Any:
    """A frame cell as a plain Python value (pd.NA / NaN / NaT -> None)."""
    if v is None or v is pd.NA or v is pd.NaT:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, np.generic):
        return v.item()
    return v


def plain_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Every row of `frame` as a dict of plain values, in column order."""
    return [{k: plain_value(v) for k, v in rec.items()} for rec in frame.to_dict("records")]


def requests(frame: pd.DataFrame, columns: Sequence[str] = REQUEST_COLUMNS, *,
             bare_first_turn: bool = True) -> list[dict[str, Any]]:
    """One runtime request per row of a projection frame.

    columns: the fields sent, in this order, those the frame has. bare_first_turn: a
    first turn (`hist_turns_dispatched` 0) is sent without any `hist_*` field (the
    runtime's first-turn path, as the golden vectors send it); False sends the history
    columns as they are (a first turn's counts 0, the rest None: the same features).
    """
    wanted = [c for c in dict.fromkeys(columns) if c in frame.columns]
    out = plain_records(frame[wanted])
    if bare_first_turn:
        out = [{k: v for k, v in r.items() if k not in HISTORY_COLUMNS}
               if r.get(P.TURNS_DISPATCHED) == 0 else r for r in out]
    return out


def ledger_requests(ledger: pd.DataFrame, history: pd.DataFrame) -> list[dict[str, Any]]:
    """One request per ledger row: its pre-dispatch fields and its `history` row (the
    projection's history columns, same rows in the same order), every history field sent."""
    fields = plain_records(ledger[[c for c in REQUEST_FIELDS if c in ledger.columns]])
    hist = plain_records(history[[c for c in HISTORY_COLUMNS if c in history.columns]])
    return [{**f, **h} for f, h in zip(fields, hist, strict=True)]
