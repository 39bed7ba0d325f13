"""ledger-v1: the replay ledger, one row per request (docs/specs/data-contracts/ledger-v1.md)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.enums import LedgerEnums as E
from replaylab.contracts.io import read_raw
from replaylab.contracts.schema import Field, Schema, ValidationResult, validate_frame

LEDGER_VERSION = "1"
_TOKENS = "negative_tokens"


def _end_before_dispatch(df: pd.DataFrame) -> tuple[pd.Series, str, str]:
    if L.ENDED_AT not in df.columns:
        return pd.Series(False, index=df.index), "", ""
    m = (df[L.ENDED_AT] < df[L.TIMESTAMP]).fillna(False)
    return m, "end_before_dispatch", f"{L.ENDED_AT} < {L.TIMESTAMP}"


LEDGER_SCHEMA = Schema(
    name="ledger-v1",
    version_column=L.VERSION,
    supported_versions=(LEDGER_VERSION,),
    fields=(
        Field(L.VERSION, "str", required=True, nullable=False),
        Field(L.REQUEST_ID, "str", required=True, nullable=False),
        Field(L.SESSION_ID, "str", required=True, nullable=False),
        Field(L.TURN_INDEX, "int", required=True, nullable=False, min=0),
        Field(L.TIMESTAMP, "timestamp", required=True, nullable=False),
        Field(L.PROMPT_TOKENS, "int", required=True, min=0, below_min_reason=_TOKENS),
        Field(L.COMPLETION_TOKENS, "int", required=True, min=0, below_min_reason=_TOKENS),
        Field(L.LIFECYCLE_STATE, "enum", required=True, nullable=False, values=E.LIFECYCLE_STATE),
        Field(L.SELECTED_MODEL, "str", required=True, nullable=False),
        Field(L.ENDED_AT, "timestamp"),
        Field(L.DURATION_MS, "int", min=0),
        Field(L.TERMINAL_REASON, "str"),
        Field(L.FINISH_REASON, "enum", values=E.FINISH_REASON),
        Field(L.MAX_TOKENS, "int", min=0, below_min_reason=_TOKENS),
        Field(L.STREAMING, "bool"),
        Field(L.CACHED_PROMPT_TOKENS, "int", min=0, below_min_reason=_TOKENS),
        Field(L.DECISION, "str"),
        Field(L.CATEGORY, "str"),
        Field(L.ORIGINAL_MODEL, "str"),
        Field(L.SLO_CLASS, "str"),
        Field(L.REGION, "str"),
        Field(L.ACTUAL_COST, "float", min=0),
        Field(L.CURRENCY, "str"),
        Field(L.ROUTING_SOURCE, "enum", values=E.ROUTING_SOURCE),
        Field(L.BINDING_ID, "str"),
        Field(L.REBIND_REASON, "enum", values=E.REBIND_REASON),
        Field(L.PROPENSITY, "float", min=0, min_exclusive=True, max=1),
        Field(L.OUTCOME_STATUS, "enum", values=E.OUTCOME_STATUS),
        Field(L.OUTCOME_SCORE, "float", min=0, max=1),
        Field(L.HINT_VERSION, "str"),
        Field(L.HINT_MODEL_VERSION, "str"),
        Field(L.HINT_P50, "float", min=0),
        Field(L.HINT_P90, "float", min=0),
        Field(L.HINT_LO, "float", min=0),
        Field(L.HINT_HI, "float", min=0),
        Field(L.HINT_INTERVAL, "float", min=0, max=1),
        Field(L.HINT_AGE_MS, "int", min=0),
        Field(L.HINT_FALLBACK, "bool"),
        Field(L.ACK_STATE, "enum", values=E.ACK_STATE),
        Field(L.ACK_DECISION, "str"),
        Field(L.PROMPT_TEXT, "str"),
        Field(L.PROMPT_EMBEDDING, "list"),
        Field(L.EMBEDDING_MODEL, "str"),
    ),
    unique_key=(L.REQUEST_ID,),
    duplicate_reason="duplicate_request_id",
    row_rules=(_end_before_dispatch,),
)


def validate_ledger(frame: pd.DataFrame, source: str | None = None) -> ValidationResult:
    """Validate a ledger-v1 frame: valid rows (timestamps as epoch ms) and a quarantine."""
    return validate_frame(frame, LEDGER_SCHEMA, source=source)


def read_ledger(path: str | Path) -> ValidationResult:
    """Read a ledger-v1 file (Parquet or JSON Lines) and validate it.

    Raises ContractError when the file cannot be read as a ledger at all.
    """
    raw, unparsed = read_raw(path, allowed=("parquet", "jsonl"))
    return validate_frame(raw, LEDGER_SCHEMA, source=str(path), pre_quarantined=unparsed)
