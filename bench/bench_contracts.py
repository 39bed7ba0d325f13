"""Benchmark: validate a synthetic ledger of --rows rows (frame and Parquet file paths).

Prints one JSON object on the last line (rows/s, peak RSS); see bench/run_all.py.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import psutil

from replaylab.contracts import read_ledger, validate_ledger
from replaylab.sources.defects import inject_defects
from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger


def _rss_gb() -> float:
    return psutil.Process().memory_info().rss / 2**30


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    frame = generate_synthetic_ledger(SyntheticLedgerConfig(n_requests=args.rows), seed=0)
    gen_s = time.perf_counter() - t0
    frame, _ = inject_defects(frame, rate=0.001, seed=0)
    peak = _rss_gb()
    t0 = time.perf_counter()
    r = validate_ledger(frame)
    frame_s = time.perf_counter() - t0
    peak = max(peak, _rss_gb())
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "ledger.parquet"
        frame.to_parquet(path, index=False)
        del frame
        t0 = time.perf_counter()
        rf = read_ledger(path)
        file_s = time.perf_counter() - t0
        peak = max(peak, _rss_gb())
    assert rf.rows_valid == r.rows_valid
    out = {
        "rows": len(r.valid) + len(r.quarantine),
        "generate_seconds": round(gen_s, 2),
        "validate_frame_rows_per_s": round(r.rows_read / frame_s),
        "read_validate_parquet_rows_per_s": round(rf.rows_read / file_s),
        "rows_quarantined": r.rows_quarantined,
        # sampled after each stage, so a lower bound of the true peak; ru_maxrss below is exact
        "peak_rss_gb_sampled": round(peak, 2),
        "ru_maxrss_gb": round(_maxrss_gb(), 2),
    }
    print(json.dumps(out))


def _maxrss_gb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


if __name__ == "__main__":
    main()
