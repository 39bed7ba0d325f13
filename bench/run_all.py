"""make bench: run every bench/bench_*.py in its own process; merge their figures into one JSON.

Each benchmark prints one JSON object (its figures) on its last stdout line.
Separate processes so that one benchmark's peak RSS is not another's.
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(HERE / "results.json"))
    ap.add_argument("--rows", type=int, default=1_000_000)
    args = ap.parse_args()
    results: dict = {"machine": {"python": platform.python_version(), "cpus": _cpus(),
                                 "platform": platform.platform()},
                     "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for script in sorted(HERE.glob("bench_*.py")):
        name = script.stem.removeprefix("bench_")
        print(f"== {name}", flush=True)
        proc = subprocess.run([sys.executable, str(script), "--rows", str(args.rows), "--json"],
                              capture_output=True, text=True)
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
