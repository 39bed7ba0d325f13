"""Reading contract files (Parquet, JSON Lines, CSV) and writing quarantines.

A reader returns the raw frame plus the lines it could not parse (each a
quarantined row with a reason); a file it cannot read at all raises
ContractError with a one-line message naming the file and the problem.
Nothing else escapes a reader, whatever the bytes: a JSON Lines line nested
100,000 deep, holding an integer of 5,000 digits or one beyond a double's range
(10**400) is a quarantined row (`malformed_json`); a Parquet or CSV file any
reader library refuses is a ContractError.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from replaylab.contracts.columns import QUARANTINE_DETAIL, QUARANTINE_REASON, SOURCE_ROW
from replaylab.contracts.schema import ContractError, ValidationResult

FORMATS = ("parquet", "jsonl", "csv")
TRUNCATED = "truncated: the file ends mid-line"  # quarantine detail of a cut last line
FORMAT_BY_EXTENSION = _EXT = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl",
        ".json": "jsonl", ".csv": "csv"}
# A \uD800-\uDFFF escape: a lone one decodes to a str that is not Unicode (no UTF-8 for it)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


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
    try:
        fmt = detect_format(path)
    except OSError as e:
        raise ContractError(f"{path}: cannot read ({e.strerror})") from e
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
    try:
        # utf-8-sig: a byte order mark (some Windows tools write one) is not part of line 0
        with open(path, encoding="utf-8-sig") as fh:
            records, positions, bad = parse_jsonl_lines(fh, 0)
    except UnicodeDecodeError as e:
        raise ContractError(f"{path}: not UTF-8 text, so not JSON Lines") from e
    if not records and bad:
        raise ContractError(f"{path}: not JSON Lines (no line parses as a JSON object)")
    warn_truncated(str(path), bad)
    return jsonl_frame(records, positions, bad)


def warn_truncated(source: str, bad: list[dict]) -> None:
    """One warning naming the file, the line and the bytes left when its last line is cut
    (quarantined as `malformed_json`, detail starting with `TRUNCATED`)."""
    for b in bad:
        if str(b.get(QUARANTINE_DETAIL, "")).startswith(TRUNCATED):
            logging.getLogger("replaylab").warning(
                "%s: line %d is cut (%s): quarantined; the run is marked truncated and "
                "export refuses to register it unless export.allow_truncated=true", source,
                b[SOURCE_ROW], b[QUARANTINE_DETAIL])


def read_jsonl_lines(lines: Iterable[str], start: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Parse JSON Lines text: (rows, unparseable lines quarantined), each with `source_row`.

    `lines` as a text file yields them (decoded; the first line is number `start`); a
    block of a file is parsed exactly as the whole file would be (compute/ledger.py).
    Raises UnicodeDecodeError from `lines` only.
    """
    return jsonl_frame(*parse_jsonl_lines(lines, start))


def parse_jsonl_lines(lines: Iterable[str], start: int = 0,
                      ) -> tuple[list[dict], list[int], list[dict]]:
    """(objects, their line numbers, unparseable lines as quarantine rows) of JSON Lines text."""
    # Line by line so that one bad line is one quarantined row, not a lost file.
    # json.loads per line is ~1 us/row faster than pandas' reader would be after
    # a failure, and keeps every line's position (source_row).
    records: list[dict] = []
    positions: list[int] = []
    bad: list[dict] = []
    for pos, line in enumerate(lines, start):
        text = line.strip()
        if not text:
            continue
        try:
            obj = json.loads(text)
        except RecursionError:  # e.g. 100,000 nested arrays
            bad.append(_malformed(pos, text, "nested too deeply"))
            continue
        except ValueError as e:  # JSONDecodeError, or an int over 4300 digits
            if isinstance(e, json.JSONDecodeError) and not line.endswith("\n"):
                # only a file's last line lacks its newline: the file was cut mid-line
                bad.append(_malformed(pos, text, f"{TRUNCATED}, "
                                      f"{len(line.encode('utf-8', 'surrogatepass'))} bytes left"))
                continue
            bad.append(_malformed(pos, text, "line" if isinstance(
                e, json.JSONDecodeError) else str(e)[:100]))
            continue
        if not isinstance(obj, dict):
            bad.append({SOURCE_ROW: pos, "raw_line": text[:2000],
                        QUARANTINE_REASON: "not_an_object",
                        QUARANTINE_DETAIL: type(obj).__name__})
            continue
        if "\\u" in text and _SURROGATE_ESCAPE.search(text) and not _is_unicode(obj):
            # valid JSON syntax, but "\ud800" alone is no character: a str holding
            # it cannot be written as UTF-8 (Parquet, JSON Lines) further down
            bad.append(_malformed(pos, text, "lone surrogate escape (not Unicode)"))
            continue
        records.append(obj)
        positions.append(pos)
    return records, positions, bad


def jsonl_frame(records: list[dict], positions: list[int], bad: list[dict]
                ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`parse_jsonl_lines`' output as (rows with source_row, quarantined lines)."""
    try:
        frame = pd.DataFrame.from_records(records) if records else pd.DataFrame()
    except OverflowError:  # an integer no double holds (10**400): pandas cannot place it
        records, positions, beyond = _without_unplaceable(records, positions)
        bad.extend(beyond)
        bad.sort(key=lambda row: row[SOURCE_ROW])
        frame = pd.DataFrame.from_records(records) if records else pd.DataFrame()
    if records:
        frame[SOURCE_ROW] = np.asarray(positions, dtype="int64")
    return frame, pd.DataFrame(bad)


def _is_unicode(obj: object) -> bool:
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _malformed(pos: int, text: str, detail: str) -> dict:
    return {SOURCE_ROW: pos, "raw_line": text[:2000], QUARANTINE_REASON: "malformed_json",
            QUARANTINE_DETAIL: detail}


def _beyond_double(value: object) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            float(value)
        except OverflowError:
            return True
    return False


def _without_unplaceable(records: list[dict], positions: list[int]
                         ) -> tuple[list[dict], list[int], list[dict]]:
    """Split off (quarantined as `malformed_json`) the records with a top-level integer
    beyond a double's range: the slow path, taken only when pandas refused the lot."""
    kept, kept_pos, bad = [], [], []
    for obj, pos in zip(records, positions, strict=True):
        huge = [k for k, v in obj.items() if _beyond_double(v)]
        if huge:
            bad.append(_malformed(pos, json.dumps(obj)[:2000],
                                  f"integer beyond a double's range: {huge[0][:50]}"))
        else:
            kept.append(obj)
            kept_pos.append(pos)
    return kept, kept_pos, bad


def write_quarantine(result: ValidationResult, path: str | Path) -> Path | None:
    """Write quarantined rows as JSON Lines (any value survives); None if there are none."""
    if result.rows_quarantined == 0:
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        result.quarantine.to_json(path, orient="records", lines=True, default_handler=str,
                                  date_format="iso")
    except (UnicodeError, OverflowError, ValueError, TypeError):
        # pandas' writer refuses some raw values (Parquet binary that is not UTF-8, a
        # str that is not Unicode): write row by row with every value made JSON
        with open(path, "w", encoding="utf-8") as fh:
            for row in result.quarantine.to_dict(orient="records"):
                fh.write(json.dumps(_jsonable(row), allow_nan=False) + "\n")
    return path


def jsonable(x: object) -> object:
    """`x` as plain JSON values (see `_jsonable`): what a quarantine record holds."""
    return _jsonable(x)


def _jsonable(x: object) -> object:
    """`x` as plain JSON values (ASCII-escaped by json.dumps): NaN/inf and missing as
    null, bytes and unknown objects as their str, timestamps as ISO 8601."""
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, np.generic):
        return _jsonable(x.item())
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, np.ndarray)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (dt.datetime, dt.date)):
        return x.isoformat()
    try:
        if pd.isna(x):
            return None
    except (TypeError, ValueError):
        pass
    return str(x)


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
