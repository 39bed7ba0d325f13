"""Import a public source into its contract: run the importer, validate, write, count."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pandas as pd

from replaylab.contracts import (
    ContractError,
    validate_aggregates,
    validate_ledger,
    validate_outcomes,
    write_quarantine,
    write_table,
)
from replaylab.contracts.columns import QUARANTINE_DETAIL, QUARANTINE_REASON, SOURCE_ROW
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.io import jsonable
from replaylab.sources.registry import SOURCES, import_source, source_file
from replaylab.sources.router_replay import Readiness

_VALIDATORS = {
    "ledger": validate_ledger,
    "outcomes": validate_outcomes,
    "aggregates": validate_aggregates,
}


def import_to_contract(name: str, path: str | None, options: dict[str, Any], out: Path,
                       run_dir: Path) -> dict[str, Any]:
    """Import source `name` from `path` into `out` (Parquet/JSONL/CSV by extension).

    Rows the contract refuses go to `run_dir/quarantine/<name>.jsonl`; the
    returned summary counts them by reason.
    """
    if name in SOURCES and SOURCES[name].chunks is not None:
        return import_chunked(name, path, options, out, run_dir)
    t0 = time.perf_counter()
    contract, frame = import_source(name, path, **options)
    imported_s = time.perf_counter() - t0
    result = _VALIDATORS[contract](frame, source=f"{name}:{path}")
    write_table(result.valid, out)
    q = write_quarantine(result, run_dir / "quarantine" / f"{name}.jsonl")
    summary: dict[str, Any] = {
        "pipeline": "import",
        "source": name,
        "source_path": path,
        "contract": f"{contract}-v1",
        **{k: v for k, v in result.summary().items() if k not in ("contract", "source")},
        "artifacts": {"table": str(out), **({"quarantine": str(q)} if q else {})},
        "timings_s": {"import": round(imported_s, 3),
                      "total": round(time.perf_counter() - t0, 3)},
    }
    return summary


def import_chunked(name: str, path: str | None, options: dict[str, Any], out: Path,
                   run_dir: Path) -> dict[str, Any]:
    """A ledger source read chunk by chunk (`SourceSpec.chunks`): each chunk mapped, the
    rows its importer refuses and the contract's quarantine kept apart, the valid rows
    validated as every ledger is. `out` a .parquet/.jsonl/.csv file: one table, sorted by
    (`timestamp`, `request_id`) so the same records give the same bytes from any input;
    `out` a folder (no suffix): one Parquet part per chunk, in input order, never the
    whole ledger in memory. A `request_id` valid in an earlier chunk is quarantined
    (`duplicate_request_id`) as the contract does within one. The summary's `readiness`
    says what each pipeline can do with the ledger (its `line` ends the verdict)."""
    t0 = time.perf_counter()
    spec = SOURCES[name]
    path = source_file(name, path)
    chunks = spec.chunk_loader()
    assert chunks is not None
    kwargs = {**dict(spec.fixed_options), **options}
    where = f"{name}:{path if path is not None else kwargs.get('uri')}"
    as_parts = out.suffix == ""
    if as_parts:
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("part-*.parquet"):
            old.unlink()
    valid_frames: list[pd.DataFrame] = []
    q_path = run_dir / "quarantine" / f"{name}.jsonl"
    q_path.unlink(missing_ok=True)
    by_reason: dict[str, int] = {}

    def quarantine(rows: pd.DataFrame) -> None:  # appended as it comes: never all in memory
        q_path.parent.mkdir(parents=True, exist_ok=True)
        with open(q_path, "a", encoding="utf-8") as fh:
            for row in rows.to_dict(orient="records"):
                fh.write(json.dumps(jsonable(row), allow_nan=False) + "\n")
        for reason, n in rows[QUARANTINE_REASON].value_counts().items():
            by_reason[str(reason)] = by_reason.get(str(reason), 0) + int(n)

    seen: set[str] = set()
    readiness = Readiness()
    rows_read = rows_valid = n_chunks = 0
    for chunk in chunks(path, **kwargs):
        n_chunks += 1
        rows_read += len(chunk.rows) + len(chunk.refused)
        if len(chunk.refused):
            quarantine(chunk.refused)
        if not len(chunk.rows):
            continue
        result = validate_ledger(chunk.rows, source=where)
        if len(result.quarantine):
            quarantine(result.quarantine)
        valid = result.valid
        again = valid[L.REQUEST_ID].isin(seen).to_numpy()
        if again.any():  # the raw rows of `valid`, in its order, are those not quarantined
            refused_rows = result.quarantine[SOURCE_ROW] if len(result.quarantine) else []
            kept = chunk.rows[~chunk.rows[SOURCE_ROW].isin(refused_rows)].reset_index(drop=True)
            dup = kept[again].copy()
            dup[QUARANTINE_REASON] = "duplicate_request_id"
            dup[QUARANTINE_DETAIL] = L.REQUEST_ID
            quarantine(dup)
            valid = valid[~again].reset_index(drop=True)
        seen.update(valid[L.REQUEST_ID].tolist())
        readiness.add(valid)
        rows_valid += len(valid)
        if as_parts:
            write_table(valid, out / f"part-{n_chunks - 1:05d}.parquet")
        else:
            valid_frames.append(valid)
    imported_s = time.perf_counter() - t0
    if not as_parts:
        if not valid_frames:
            raise ContractError(f"{where}: no valid rows to write ({rows_read} read)")
        ledger = pd.concat(valid_frames, ignore_index=True)
        ledger = ledger.sort_values([L.TIMESTAMP, L.REQUEST_ID], kind="mergesort",
                                    ignore_index=True)
        ledger.attrs = {}
        write_table(ledger, out)
    if sum(by_reason.values()) != rows_read - rows_valid:  # every row accounted for
        raise RuntimeError(f"{where}: {rows_read} read != {rows_valid} valid + "
                           f"{sum(by_reason.values())} quarantined")
    ready = readiness.summary()
    return {
        "pipeline": "import",
        "source": name,
        "source_path": path,
        **({"source_uri": _redacted(str(kwargs["uri"])), "source_table": kwargs.get("table")}
           if kwargs.get("uri") else {}),
        "contract": "ledger-v1",
        "rows_read": rows_read,
        "rows_valid": rows_valid,
        "rows_quarantined": rows_read - rows_valid,
        "quarantine_by_reason": dict(sorted(by_reason.items())),
        "chunks": n_chunks,
        "readiness": ready,
        "artifacts": {"table": str(out), **({"quarantine": str(q_path)} if by_reason else {})},
        "timings_s": {"import": round(imported_s, 3),
                      "total": round(time.perf_counter() - t0, 3)},
    }


def _redacted(uri: str) -> str:
    """A connection URI without its password (the summary and MLflow keep it)."""
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    return uri.replace(f":{parts.password}@", ":***@", 1)
