"""Benchmark: a full forecast backtest, 10 series x 14 days of 10-minute buckets.

Every forecaster of the default config (seasonal naive, moving window, AutoETS,
MSTL, LightGBM) over 24 rolling origins, plus the last-origin forecast and the
report. Target (issue 7): under 2 minutes on the 2-core dev machine. The data is
the seeded seasonal Poisson panel (replaylab.forecast.synthetic): modeled, not
measured. Prints one JSON object on the last line; see bench/run_all.py.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 120.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=0, help="ignored (run_all passes it to all)")
    ap.add_argument("--series", type=int, default=10)
    ap.add_argument("--days", type=float, default=14.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    from replaylab.forecast import ForecastConfig
    from replaylab.forecast.synthetic import seasonal_poisson_aggregates
    from replaylab.pipelines.forecast import run_forecast

    import_s = time.perf_counter() - t0
    agg = seasonal_poisson_aggregates(n_series=args.series, days=args.days, seed=0)
    cfg = ForecastConfig(include_total=False)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        summary = run_forecast(agg, cfg, Path(d))
        wall = time.perf_counter() - t0
    out = {
        "series": summary["series"], "buckets": summary["buckets"],
        "origins": summary["plan"]["n_windows"], "horizon_buckets": summary["horizon_buckets"],
        "wall_seconds": round(wall, 2), "import_seconds": round(import_s, 2),
        "under_target": wall < TARGET_S, "target_seconds": TARGET_S,
        "seconds_by_stage": summary["timings_s"],
        "mase": {k: v["mase"] for k, v in summary["backtest"].items()},
        "coverage_80": {k: v["coverage_80"] for k, v in summary["backtest"].items()},
        "best": summary["best"],
        "ru_maxrss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }
    if not args.json:
        print(json.dumps(out, indent=1), file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
