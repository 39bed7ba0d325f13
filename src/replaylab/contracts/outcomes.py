"""outcomes-v1: full-information candidate outcomes (docs/specs/data-contracts/outcomes-v1.md)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from replaylab.contracts.columns import Outcomes as O
from replaylab.contracts.io import read_raw
from replaylab.contracts.schema import Field, Schema, ValidationResult, validate_frame

OUTCOMES_VERSION = "1"

OUTCOMES_SCHEMA = Schema(
    name="outcomes-v1",
    version_column=O.VERSION,
    supported_versions=(OUTCOMES_VERSION,),
    fields=(
        Field(O.VERSION, "str", required=True, nullable=False),
        Field(O.PROMPT_ID, "str", required=True, nullable=False),
        Field(O.PROMPT_TEXT, "str", required=True, nullable=False),
        Field(O.TASK, "str", required=True, nullable=False),
        Field(O.CANDIDATE, "str", required=True, nullable=False),
        Field(O.SCORE, "float", required=True, nullable=False, min=0, max=1),
        Field(O.SUCCESS, "bool", required=True, nullable=False),
        Field(O.COST, "float", min=0),
        Field(O.CURRENCY, "str"),
        Field(O.PROMPT_TOKENS, "int", min=0, below_min_reason="negative_tokens"),
        Field(O.COMPLETION_TOKENS, "int", min=0, below_min_reason="negative_tokens"),
    ),
    unique_key=(O.PROMPT_ID, O.CANDIDATE),
    duplicate_reason="duplicate_prompt_candidate",
)


def validate_outcomes(frame: pd.DataFrame, source: str | None = None) -> ValidationResult:
    """Validate an outcomes-v1 frame."""
    return validate_frame(frame, OUTCOMES_SCHEMA, source=source)


def read_outcomes(path: str | Path) -> ValidationResult:
    """Read an outcomes-v1 file (Parquet or JSON Lines) and validate it."""
    raw, unparsed = read_raw(path, allowed=("parquet", "jsonl"))
    return validate_frame(raw, OUTCOMES_SCHEMA, source=str(path), pre_quarantined=unparsed)
