"""Reading contract files (Parquet, JSON Lines, CSV) and writing quarantines.

A reader returns the raw frame plus the lines it could not parse (each a
quarantined row with a reason); a file it cannot read at all raises
ContractError with a one-line message naming the file and the problem.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from replaylab.contracts.columns import QUARANTINE_DETAIL, QUARANTINE_REASON, SOURCE_ROW
from replaylab.contracts.schema import ContractError, ValidationResult

FORMATS = ("parquet", "jsonl", "csv")
_EXT = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl",
        ".json": "jsonl", ".csv": "csv"}


def detect_format(path: Path) -> str:
    """Format by extension; by magic bytes when the extension says nothing."""
    fmt = _EXT.get(path.suffix.lower())
    if fmt is not None:
        return fmt
    with open(path, "rb") as fh:
        head = fh.read(4)
    return "parquet" if head == b"PAR1" else "jsonl"


def read_raw(path: str | Path, allowed: tuple[str, ...]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read a contract file as it is; return (rows, unparseable lines quarantined)."""
    path = Path(path)
    if not path.exists():
        raise ContractError(f"{path}: no such file")
    if path.is_dir():
        raise ContractError(f"{path}: is a directory, expected a file")
    fmt = detect_format(path)
    if fmt not in allowed:
        raise ContractError(f"{path}: {fmt} is not an accepted format here "
                            f"(accepted: {', '.join(allowed)})")
    empty = pd.DataFrame()
    if fmt == "parquet":
        try:
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pandas(), empty
        except Exception as e:  # noqa: BLE001 - any pyarrow failure means "not Parquet"
            raise ContractError(f"{path}: not a readable Parquet file ({type(e).__name__})") from e
    if fmt == "csv":
        try:
            return pd.read_csv(path, dtype_backend="numpy_nullable"), empty
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            raise ContractError(f"{path}: not a readable CSV file ({type(e).__name__})") from e
    return _read_jsonl(path)


def _read_jsonl(path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    # Line by line so that one bad line is one quarantined row, not a lost file.
    # json.loads per line is ~1 us/row faster than pandas' reader would be after
    # a failure, and keeps every line's position (source_row).
    records: list[dict] = []
    positions: list[int] = []
    bad: list[dict] = []
    try:
        with open(path, encoding="utf-8") as fh:
            for pos, line in enumerate(fh):
                text = line.strip()
                if not text:
                    continue
                try:
                    obj = json.loads(text)
                except (json.JSONDecodeError, RecursionError):
                    bad.append({SOURCE_ROW: pos, "raw_line": text[:2000],
                                QUARANTINE_REASON: "malformed_json", QUARANTINE_DETAIL: "line"})
                    continue
                if not isinstance(obj, dict):
                    bad.append({SOURCE_ROW: pos, "raw_line": text[:2000],
                                QUARANTINE_REASON: "not_an_object",
                                QUARANTINE_DETAIL: type(obj).__name__})
                    continue
                records.append(obj)
                positions.append(pos)
    except UnicodeDecodeError as e:
        raise ContractError(f"{path}: not UTF-8 text, so not JSON Lines") from e
    if not records and bad:
        raise ContractError(f"{path}: not JSON Lines (no line parses as a JSON object)")
    frame = pd.DataFrame.from_records(records) if records else pd.DataFrame()
    if records:
        frame[SOURCE_ROW] = np.asarray(positions, dtype="int64")
    return frame, pd.DataFrame(bad)


def write_quarantine(result: ValidationResult, path: str | Path) -> Path | None:
    """Write quarantined rows as JSON Lines (any value survives); None if there are none."""
    if result.rows_quarantined == 0:
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    result.quarantine.to_json(path, orient="records", lines=True, default_handler=str,
                              date_format="iso")
    return path


def write_table(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a contract table as Parquet (.parquet), JSON Lines (.jsonl) or CSV (.csv)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt = _EXT.get(path.suffix.lower())
    if fmt == "parquet":
        df.to_parquet(path, index=False)
    elif fmt == "jsonl":
        # 15 decimals (pandas' most; its default of 10 rounds a per-call cost of 2.4e-4 USD)
        df.to_json(path, orient="records", lines=True, date_format="iso", double_precision=15)
    elif fmt == "csv":
        df.to_csv(path, index=False)
    else:
        raise ContractError(f"{path}: unknown output format (use .parquet, .jsonl or .csv)")
    return path
