"""Import a public source into its contract: run the importer, validate, write, count."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from replaylab.contracts import (
    validate_aggregates,
    validate_ledger,
    validate_outcomes,
    write_quarantine,
    write_table,
)
from replaylab.sources.registry import import_source

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
