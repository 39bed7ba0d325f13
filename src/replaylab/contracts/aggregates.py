"""aggregates-v1: content-free demand buckets (docs/specs/data-contracts/aggregates-v1.md)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from replaylab.contracts.columns import Aggregates as A
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.io import detect_format, read_raw
from replaylab.contracts.schema import Field, Schema, ValidationResult, validate_frame

AGGREGATES_VERSION = "1"
_NEG = "negative_count"

AGGREGATES_SCHEMA = Schema(
    name="aggregates-v1",
    version_column=A.VERSION,
    supported_versions=(AGGREGATES_VERSION,),
    fields=(
        Field(A.VERSION, "str", required=True, nullable=False),
        Field(A.BUCKET_START, "timestamp", required=True, nullable=False),
        Field(A.BUCKET_SECONDS, "int", required=True, nullable=False, min=1),
        Field(A.ARCHETYPE, "str", required=True, nullable=False),
        Field(A.TAXONOMY_VERSION, "str", required=True, nullable=False),
        Field(A.SLO_CLASS, "str", required=True, nullable=False),
        Field(A.REGION, "str", required=True, nullable=False),
        Field(A.REQUESTS, "int", required=True, nullable=False, min=0, below_min_reason=_NEG),
        Field(A.PROMPT_TOKENS_SUM, "int", min=0, below_min_reason=_NEG),
        Field(A.COMPLETION_TOKENS_SUM, "int", min=0, below_min_reason=_NEG),
        Field(A.PROMPT_TOKENS_P50, "float", min=0),
        Field(A.PROMPT_TOKENS_P90, "float", min=0),
        Field(A.COMPLETION_TOKENS_P50, "float", min=0),
        Field(A.COMPLETION_TOKENS_P90, "float", min=0),
        Field(A.RATE_CV, "float", min=0),
    ),
    unique_key=(A.BUCKET_START, A.BUCKET_SECONDS, A.ARCHETYPE, A.SLO_CLASS, A.REGION),
    duplicate_reason="duplicate_bucket",
    # Aggregates are content-free: a file carrying ids or text is refused whole.
    forbidden_columns=(L.REQUEST_ID, L.SESSION_ID, L.PROMPT_TEXT, L.PROMPT_EMBEDDING,
                       "caller", "user_id", "api_key"),
)


def validate_aggregates(frame: pd.DataFrame, source: str | None = None) -> ValidationResult:
    """Validate an aggregates-v1 frame."""
    return validate_frame(frame, AGGREGATES_SCHEMA, source=source)


def read_aggregates(path: str | Path) -> ValidationResult:
    """Read an aggregates-v1 file (Parquet or CSV) and validate it."""
    raw, unparsed = read_raw(path, allowed=("parquet", "csv"))
    if detect_format(Path(path)) == "csv":
        raw = _csv_numbers(raw)
    return validate_frame(raw, AGGREGATES_SCHEMA, source=str(path), pre_quarantined=unparsed)


def _csv_numbers(raw: pd.DataFrame) -> pd.DataFrame:
    """CSV has no types: pandas reads a column as text as soon as one cell is not a
    number, and every row of the file would then be quarantined (`bad_type`) for that
    one cell. The numeric fields get their numbers back cell by cell; a cell that is
    not a number stays text, and only its row is quarantined."""
    for f in AGGREGATES_SCHEMA.fields:
        if f.kind not in ("int", "float") or f.name not in raw.columns:
            continue
        col = raw[f.name]
        if not (pd.api.types.is_string_dtype(col) or pd.api.types.is_object_dtype(col)):
            continue
        try:
            num = pd.to_numeric(col, errors="coerce")
        except (ValueError, TypeError, OverflowError):
            continue
        if num.notna().any():
            raw[f.name] = col.astype(object).where(num.isna(), num.astype(object))
    return raw
