"""Benchmark: pipeline=project (or --pipeline demand) over a partitioned Parquet ledger,
compute=dask vs local.

For each size: the ledger is written by `pipeline=synthesize` (Parquet chunk files),
then `python -m training pipeline=<p> data.ledger=DIR` runs in its own process
under `compute=dask` (a LocalCluster of 2 worker processes) and, up to --local-max
rows, under `compute=local`. Reported per run: wall seconds, rows/s, the per-stage
timings of summary.json, and peak RSS:
- dask: the driver's own (`summary.compute.driver_peak_rss_mb`, getrusage of that
  process; the workers are other processes);
- local: the one process's (GNU time's maximum resident set size).
A local run that fails (e.g. out of memory) is reported with its exit code and the
last line it printed. Prints one JSON object on the last line (bench/run_all.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _training(*overrides: str, timeout: float) -> tuple[subprocess.CompletedProcess, float, int]:
    """(process, wall seconds, peak RSS kB of the process as GNU time measured it)."""
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        cmd = ["/usr/bin/time", "-f", "%M", "-o", rss.name, sys.executable, "-m", "training",
               *overrides, "tracking=off"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
        wall = time.perf_counter() - t0
        text = Path(rss.name).read_text().strip().splitlines()
    return proc, wall, int(text[-1]) if text and text[-1].isdigit() else -1


def _project(ledger: Path, run: Path, compute: str, timeout: float,
             pipeline: str = "project") -> dict:
    proc, wall, rss_kb = _training(f"pipeline={pipeline}", f"data.ledger={ledger}",
                                   f"compute={compute}", f"hydra.run.dir={run}", timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        return {"returncode": proc.returncode, "seconds": round(wall, 1),
                "peak_rss_mb": round(rss_kb / 1024, 1), "error": tail[0][:300]}
    s = json.loads((run / "summary.json").read_text())
    rows = s.get("rows_read") or s.get("data", {}).get("rows_read") or \
        s.get("projection", {}).get("rows")
    out = {"returncode": 0, "seconds": round(wall, 1), "rows": rows,
           "rows_per_s": round(rows / wall) if rows else None,
           "timings_s": s.get("timings_s"), "partitions": s.get("partitions")}
    if pipeline == "demand":
        out["verdict"] = s.get("verdict")
    if compute == "dask":
        out["driver_peak_rss_mb"] = s["compute"]["driver_peak_rss_mb"]
        out["peak_rss_any_process_mb"] = round(rss_kb / 1024, 1)
    else:
        out["peak_rss_mb"] = round(rss_kb / 1024, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000, help="one size (make bench)")
    ap.add_argument("--sizes", default=None, help="comma-separated sizes (overrides --rows)")
    ap.add_argument("--local-max", type=int, default=5_000_000,
                    help="run compute=local up to this many rows")
    ap.add_argument("--keep", default=None, help="folder to keep the ledgers in (reused)")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--pipeline", default="project", choices=("project", "demand"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else [args.rows]
    out: dict = {"pipeline": args.pipeline, "load_avg_1m_before": round(os.getloadavg()[0], 2),
                 "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        for n in sizes:
            ledger = root / f"ledger-{n}"
            if not (ledger / "_ledger.json").is_file():
                proc, wall, _ = _training("pipeline=synthesize", f"data.synthetic.n_requests={n}",
                                          f"out={ledger}", "synthesize.overwrite=true",
                                          f"hydra.run.dir={Path(tmp) / f'syn-{n}'}",
                                          timeout=args.timeout)
                if proc.returncode != 0:
                    raise SystemExit(f"synthesize {n}: {proc.stderr[-500:]}")
            runs = {"dask": _project(ledger, Path(tmp) / f"dask-{n}", "dask", args.timeout,
                                     args.pipeline)}
            if n <= args.local_max:
                runs["local"] = _project(ledger, Path(tmp) / f"local-{n}", "local", args.timeout,
                                         args.pipeline)
            out["runs"][str(n)] = runs
            print(json.dumps({str(n): runs}), file=sys.stderr, flush=True)
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
