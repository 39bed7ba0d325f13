"""Benchmark: the fleet simulator on --rows requests over 16 and 64 replicas.

Workload: token totals from FleetSim's LMSYS CDF (shipped in replaylab.data, fleet/),
Poisson arrivals at 4 requests/s per
replica, so the load per replica (and the batch sizes) stay the same as the
fleet grows. Profile: FleetSim's H100-80GB constants (modeled). Policies:
RoundRobin (O(1): the simulator's own cost) and LeastLoaded (adds an
O(replicas) scan in C per request).

Each (policy, fleet size) runs in its own process (so peak RSS is its own); the
simulation is timed --repeats times and the fastest run is reported. Rates are
per CPU second of the (single-threaded) simulation, since a shared machine
stretches wall time; the wall seconds are reported beside them. Figures per
size: requests/s and events/s of `FleetSim.run`, generation and summary seconds, ru_maxrss (whole process:
interpreter, numpy and pandas included) and the simulation's own growth over
the RSS before it. Targets (issue 6): 10^6 requests over 16 replicas in under
20 s, under 400 MB peak, and 64 replicas at most 1.5x slower per request.
Prints one JSON object on the last line; see bench/run_all.py.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RATE_PER_REPLICA = 4.0
TARGET_S, TARGET_MB, TARGET_RATIO = 20.0, 400.0, 1.5


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _one(replicas: int, rows: int, policy_name: str, repeats: int) -> dict:
    from replaylab.data import shipped
    from replaylab.fleet.hardware.profiles import load_fleetsim_profiles
    from replaylab.fleet.policies.reference import LeastLoaded, RoundRobin
    from replaylab.fleet.sim.fleet import PoolConfig, SimConfig
    from replaylab.fleet.sim.outcomes import summarize
    from replaylab.fleet.sim.simulator import FleetSim
    from replaylab.fleet.sim.workload import SyntheticWorkloadConfig, workload_from_cdf

    profile = load_fleetsim_profiles()["H100-80GB"]      # shipped (replaylab.data)
    cdf = shipped("fleet", "lmsys_cdf.json")
    t0 = time.perf_counter()
    cfg = SyntheticWorkloadConfig(n_requests=rows, rate_per_s=RATE_PER_REPLICA * replicas)
    workload = workload_from_cdf(cdf, cfg, seed=0)
    gen_s = time.perf_counter() - t0
    rss_before = _maxrss_mb()
    pools = [PoolConfig("p", "model", profile, replicas=replicas)]
    best, best_wall, result = float("inf"), float("inf"), None
    for _ in range(repeats):
        policy = LeastLoaded() if policy_name == "least_loaded" else RoundRobin()
        result = None  # free the previous run's arrays before the next one
        t0, c0 = time.perf_counter(), time.process_time()
        result = FleetSim(pools, SimConfig(), policy).run(workload)
        best = min(best, time.process_time() - c0)
        best_wall = min(best_wall, time.perf_counter() - t0)
    t0 = time.perf_counter()
    summary = summarize(result)
    sum_s = time.perf_counter() - t0
    peak = _maxrss_mb()
    return {
        "replicas": replicas, "requests": rows, "policy": policy_name,
        "sim_cpu_seconds": round(best, 2), "sim_wall_seconds": round(best_wall, 2),
        "requests_per_s": round(rows / best),
        "events": result.events, "events_per_s": round(result.events / best),
        "events_per_request": round(result.events / rows, 2),
        "generate_seconds": round(gen_s, 2), "summary_seconds": round(sum_s, 2),
        "peak_rss_mb": round(peak, 1), "sim_rss_growth_mb": round(peak - rss_before, 1),
        "mean_batch_peak": round(float(result.replicas["run_peak"].mean()), 1),
        "completed": summary["completed"], "ttft_p99_s": round(summary["ttft_p99_s"], 4),
        "e2e_p99_s": round(summary["e2e_p99_s"], 3),
        "joules_per_output_token": round(summary["joules_per_output_token"], 4),
        "data": "shipped (replaylab.data: FleetSim H100-80GB, lmsys_cdf.json)",
    }


def _targets(runs: dict, rows: int) -> dict:
    small, big = runs.get("16"), runs.get("64")
    if small is None or big is None:
        return {}
    ratio = small["requests_per_s"] / big["requests_per_s"]
    return {"per_request_slowdown_64_vs_16": round(ratio, 2),
            "16_under_20s": small["sim_cpu_seconds"] < TARGET_S * rows / 1e6,
            "peak_under_400mb": max(v["peak_rss_mb"] for v in runs.values()) < TARGET_MB,
            "64_within_1_5x": ratio <= TARGET_RATIO}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--sizes", default="16,64")
    ap.add_argument("--policies", default="round_robin,least_loaded")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--one", type=int, default=0, help="(internal) run one fleet size")
    ap.add_argument("--policy", default="round_robin", help="(internal) with --one")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(_one(args.one, args.rows, args.policy, args.repeats)))
        return
    out: dict = {"rows": args.rows, "rate_per_replica": RATE_PER_REPLICA}
    for policy in args.policies.split(","):
        runs = {}
        for r in (int(s) for s in args.sizes.split(",")):
            proc = subprocess.run([sys.executable, __file__, "--one", str(r), "--rows",
                                   str(args.rows), "--policy", policy, "--repeats",
                                   str(args.repeats)], capture_output=True, text=True, check=True)
            runs[str(r)] = json.loads(proc.stdout.strip().splitlines()[-1])
            if not args.json:
                print(json.dumps(runs[str(r)]), file=sys.stderr)
        out[policy] = {"by_replicas": runs, "targets": _targets(runs, args.rows)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
