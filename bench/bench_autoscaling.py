"""Benchmark: the autoscaling experiment on the fleet simulator, one simulated day.

The issue-14 target: one simulated day of the default trace, every default policy
(static, reactive HPA, forecast-driven), within 2 minutes on one core. By default the
shipped data: the seeded synthetic diurnal (day 3, mean 50 requests/s: ~4.3 million
requests) with the tokens of the shipped Azure conversation slice and the shipped ML.ENERGY
+ Splitwise points. With REPLAYLAB_SHARED_DATA=DIR (the full downloads, layout of
../shared/data): ServeGen language/m-large day 3 x 0.25 and the full Azure conversation
trace (~3.8 million requests), the trace the issue-14 figures were measured on. One process, one (scenario=steady, seed=0) job, as the experiment runs it
(`replaylab.fleet.experiments.autoscaling.experiment.run_job`); CPU seconds (`time.process_time`) so a
shared machine's wall time does not count against it; wall seconds beside.
`--hours` shortens the day (for a quick look; `full_day_cpu_s_est` scales the
simulation linearly, which the diurnal rate makes only a rough estimate).
Prints one JSON object on the last line (`data` says which); see bench/run_all.py.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

TARGET_CPU_S = 120.0


def _sources() -> tuple[str, dict, dict]:
    """(label, trace section, fleet.workload section): the shipped data, or the full
    downloads under $REPLAYLAB_SHARED_DATA."""
    env = os.environ.get("REPLAYLAB_SHARED_DATA")
    if not env:
        return ("shipped", {"source": "synthetic", "scale": 1.0},
                {"source": "azure_conv_slice", "time_scale": 1.0})
    data = Path(env)
    return ("REPLAYLAB_SHARED_DATA",
            {"source": "servegen", "path": str(data / "traces/servegen/language/m-large"),
             "scale": 0.25},
            {"source": "azure_conv", "time_scale": 1.0, "path": str(
                data / "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv")})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=0, help="(ignored: run_all passes it)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--hours", type=float, default=24.0)
    args = ap.parse_args()
    label, trace, workload = _sources()
    from replaylab.fleet.experiments.autoscaling.experiment import (
        autoscaling_config,
        build_context,
        run_job,
    )

    c0, t0 = time.process_time(), time.perf_counter()
    cfg = autoscaling_config({"trace": {**trace, "hours": args.hours}, "workload": workload,
                              "scenarios": {"steady": {"kind": "steady"}}, "seeds": [0],
                              "sweep": None, "workers": 1})
    ctx = build_context(cfg)
    setup_cpu = time.process_time() - c0
    job_c0 = time.process_time()
    out = run_job(ctx, ("steady", 0, [(p, None) for p in cfg.policies]))
    per_policy = {r["policy"]: {"wall_s": r["wall_s"], "slo_attainment": round(
        r["slo_attainment"], 5), "gpu_hours": round(r["gpu_hours"], 1)} for r in out["runs"]}
    job_cpu = time.process_time() - job_c0
    total = setup_cpu + job_cpu
    scale = 24.0 / args.hours
    res = {"data": label, "hours": args.hours, "requests": out["requests"] if out else 0,
           "policies": per_policy, "setup_cpu_s": round(setup_cpu, 1),
           "total_cpu_s": round(total, 1), "wall_s": round(time.perf_counter() - t0, 1),
           "full_day_cpu_s_est": round(setup_cpu + job_cpu * scale, 1),
           "us_per_request_per_policy": round(1e6 * job_cpu / max(out["requests"], 1)
                                              / len(cfg.policies), 2) if out else None,
           "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
           "target_cpu_s": TARGET_CPU_S,
           "within_target": setup_cpu + job_cpu * scale <= TARGET_CPU_S}
    print(json.dumps(res))


if __name__ == "__main__":
    main()
