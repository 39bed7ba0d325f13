"""make bench: run every bench/bench_*.py in its own process; merge their figures into one JSON.

Each benchmark prints one JSON object (its figures) on its last stdout line.
Separate processes so that one benchmark's peak RSS is not another's.

The per-request latency benchmarks (LATENCY) run on a core of their own where
the OS allows it: pinned to the last CPU with SCHED_FIFO priority 10, so other
processes on a shared machine do not preempt them (a serving engine pins its
router thread the same way). On this 2-core host, under other jobs, that is the
difference between a static-route p99 of 83 us and 2.5 ms. Without the
permission (not root, no CAP_SYS_NICE) they run as usual; `isolation` in the
JSON says which, per benchmark. `--no-isolate` turns it off.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LATENCY = ("router_encoder", "rust_binder", "rust_demand", "rust_scorer", "runtime")
FIFO_PRIORITY = 10


def _isolated() -> None:  # preexec_fn: runs in the child before exec
    import os

    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(FIFO_PRIORITY))


def _can_isolate() -> str | None:
    """None when a child may be pinned with SCHED_FIFO here, else why not (a probe child)."""
    import os

    if not hasattr(os, "sched_setscheduler") or not hasattr(os, "sched_setaffinity"):
        return "no sched_setscheduler / sched_setaffinity on this platform"
    try:
        subprocess.run([sys.executable, "-c", "pass"], preexec_fn=_isolated, check=True,
                       capture_output=True)
    except (subprocess.SubprocessError, OSError):
        return "SCHED_FIFO not permitted (needs root or CAP_SYS_NICE)"
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(HERE / "results.json"))
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--no-isolate", action="store_true",
                    help="run the latency benchmarks like the others (no pinning, no SCHED_FIFO)")
    args = ap.parse_args()
    why_not = "--no-isolate" if args.no_isolate else _can_isolate()
    results: dict = {"machine": {"python": platform.python_version(), "cpus": _cpus(),
                                 "platform": platform.platform()},
                     "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "isolation": {}}
    for script in sorted(HERE.glob("bench_*.py")):
        name = script.stem.removeprefix("bench_")
        print(f"== {name}", flush=True)
        isolate = name in LATENCY and why_not is None
        if name in LATENCY:
            results["isolation"][name] = (f"SCHED_FIFO {FIFO_PRIORITY}, pinned to one CPU"
                                          if isolate else f"none: {why_not}")
        proc = subprocess.run([sys.executable, str(script), "--rows", str(args.rows), "--json"],
                              capture_output=True, text=True,
                              preexec_fn=_isolated if isolate else None)
        sys.stderr.write(proc.stderr[-2000:])
        if proc.returncode != 0:
            results[name] = {"error": proc.stderr.strip().splitlines()[-1:]}
            continue
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(json.dumps(results[name], indent=1))
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")
    if any("error" in v for v in results.values() if isinstance(v, dict)):
        sys.exit(1)


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


if __name__ == "__main__":
    main()
