"""Benchmark: pipeline=synthesize, --rows rows of the synthetic ledger as Parquet chunk files.

Three ways on this machine: the local process pool (2 workers), a Dask LocalCluster of
2 worker processes as the pipeline makes it (its start-up timed apart; --trim adds one
with distributed's default MALLOC_TRIM_THRESHOLD_), and the single-process frame path for
reference (generate_synthetic_ledger + DataFrame.to_parquet). rows/s is wall time;
rows_per_cpu_s is rows over the CPU the workers spent (what a core gives when nothing
else runs on the machine). Prints one JSON object on the last line; see bench/run_all.py.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

from replaylab.pipelines.synthesize import (
    SynthesizeConfig,
    glibc_malloc_defaults,
    synthesize_ledger,
)
from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger

KEYS = ("rows", "files", "bytes", "bytes_per_million_rows", "seconds", "rows_per_s",
        "cpu_seconds", "rows_per_cpu_s", "chunk_gap_s")


def _run(cfg: SyntheticLedgerConfig, out: Path, options: SynthesizeConfig, client=None) -> dict:
    s = synthesize_ledger(cfg, 0, out, options, client=client)
    return {k: s[k] for k in KEYS}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--chunk-rows", type=int, default=500_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-dask", action="store_true")
    ap.add_argument("--trim", action="store_true",
                    help="also on a cluster with distributed's MALLOC_TRIM_THRESHOLD_ (dask_trim)")
    ap.add_argument("--no-frame", action="store_true", help="skip the single-process reference")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cfg = SyntheticLedgerConfig(n_requests=args.rows)
    options = SynthesizeConfig(chunk_rows=args.chunk_rows, workers=args.workers, progress=False,
                               overwrite=True)
    out: dict = {"rows": args.rows, "chunk_rows": args.chunk_rows, "cpus": _cpus(),
                 "load_avg_1m_before": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory() as d:
        out["local_pool"] = _run(cfg, Path(d) / "local", options)
        if not args.no_dask:
            from dask.distributed import Client, LocalCluster

            for name, env in (("dask", glibc_malloc_defaults), ("dask_trim", nullcontext)):
                if name == "dask_trim" and not args.trim:
                    continue
                t0 = time.perf_counter()
                with env(), LocalCluster(n_workers=args.workers, threads_per_worker=1,
                                         processes=True, dashboard_address=None) as cluster, \
                        Client(cluster) as client:
                    started = time.perf_counter() - t0
                    out[name] = {**_run(cfg, Path(d) / name, options, client),
                                 "cluster_start_seconds": round(started, 2)}
        if not args.no_frame:
            n = min(args.rows, 1_000_000)
            t0, c0 = time.perf_counter(), time.process_time()
            frame = generate_synthetic_ledger(SyntheticLedgerConfig(n_requests=n), seed=0)
            frame.to_parquet(Path(d) / "frame.parquet", index=False)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            out["frame_reference"] = {"rows": n, "seconds": round(wall, 3),
                                      "rows_per_s": round(n / wall),
                                      "rows_per_cpu_s": round(n / cpu)}
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


if __name__ == "__main__":
    main()
