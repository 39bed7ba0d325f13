"""Benchmark: serving through the native library (issue 47 item 3, docs/specs/c-abi.md).

Targets (`target_met`): 2 Python threads serve >= 1.7x the hints/s and the routes/s of 1
thread (on 2 cores); p99 of a static route called from Python < 30 us; no memory growth
over 1M calls. Beside them, each host's p50 / p99 per call: Python (native and pure),
C, Go and Rust (the crate's own in-process bench).

- `threads`: one shared `NativeRouter` / `NativeDemandPredictor` (replaylab.runtime.native,
  ctypes: the GIL released in the call), the request JSON encoded beforehand (what a
  serving host holds); k threads call it in a loop for `--seconds`, calls/s summed; rounds
  alternate 1 and 2 threads (`--rounds`), the median per k kept. The same for the pure
  Python runtime (`Router.route`, `DemandPredictor.predict`) for comparison.
- `latency`: one thread, each call timed alone (`perf_counter`; C: CLOCK_MONOTONIC; Go:
  time.Now; Rust: `replaylab-route bench` / `demand-bench`, Instant), `--calls` calls
  after 20 warm-up calls, over the same GSM8K queries and projected demand requests.
- `ratio_modeled`: the 2-thread ratio Amdahl's law gives when the GIL-held share of a call
  is 1 - (C's p50 / Python-native's p50): what the ratio is on two idle cores, for a host
  whose measured ratio is crowded out by other processes (modeled, not measured).
- `memory`: RSS (/proc/self/statm) after 100k warm-up calls and after 1M more, routes and
  hints alternating; growth in KiB (`--memory-calls`).

Artifacts: `--router DIR` (static tier) else one trained here
(bench_rust_scorer.train_static_router); `--demand DIR` else one trained on a synthetic
ledger of 300 sessions (bench_rust_demand.setup). The library is built with cargo (skipped
without); C with cc, Go with go (each {"skipped": why} without). Prints one JSON object on
the last line. Figures are measured on the machine that runs it: `machine.cpus` and
`loadavg` say what else ran.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_rust_scorer import (  # noqa: E402
    BINARY,
    CRATE,
    WARMUP,
    build,
    find_cargo,
    gsm8k_queries,
    stats_us,
    train_static_router,
)

SCALING_TARGET, ROUTE_P99_TARGET_US = 1.7, 30.0
LIBRARY = CRATE / "target" / "release" / "libreplaylab_scorer.so"
STATIC = CRATE / "target" / "release" / "libreplaylab_scorer.a"


def rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def throughput(call, inputs: list, threads: int, seconds: float) -> float:
    """Calls/s of `threads` threads each calling `call(x)` over `inputs` for `seconds`."""
    counts = [0] * threads
    stop = threading.Event()

    def work(k: int) -> None:
        n, m = 0, len(inputs)
        while not stop.is_set():
            for i in range(64):
                call(inputs[(n + i) % m])
            n += 64
        counts[k] = n

    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def scaling(call, inputs: list, rounds: int, seconds: float) -> dict:
    per = {1: [], 2: []}
    for _ in range(rounds):
        for k in (1, 2):
            per[k].append(throughput(call, inputs, k, seconds))
    one, two = statistics.median(per[1]), statistics.median(per[2])
    return {"threads_1_per_s": round(one), "threads_2_per_s": round(two),
            "ratio": round(two / one, 3), "rounds": rounds, "seconds": seconds}


def timed(call, inputs: list, n: int) -> dict:
    for x in inputs[:WARMUP]:
        call(x)
    us = []
    m = len(inputs)
    for i in range(n):
        x = inputs[i % m]
        t0 = time.perf_counter()
        call(x)
        us.append((time.perf_counter() - t0) * 1e6)
    return stats_us(us, 2)


def c_latency(tmp: Path, router: Path, queries: Path, demand: Path, requests: Path, n: int) -> dict:
    cc = shutil.which("cc")
    if cc is None:
        return {"skipped": "cc not on PATH"}
    exe = tmp / "latency"
    subprocess.run([cc, "-O2", "-std=c11", "-D_POSIX_C_SOURCE=200809L", f"-I{CRATE / 'include'}",
                    str(CRATE / "tests" / "c" / "latency.c"), "-o", str(exe), str(STATIC),
                    "-lpthread", "-ldl", "-lm"], check=True, capture_output=True, timeout=300)
    out = subprocess.run([str(exe), str(router), str(queries), str(demand), str(requests), str(n)],
                         check=True, capture_output=True, text=True, timeout=900)
    return json.loads(out.stdout)


def go_latency(router: Path, queries: Path, demand: Path, requests: Path, n: int) -> dict:
    go = shutil.which("go")
    if go is None:
        return {"skipped": "go not on PATH (make golang)"}
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOPROXY": "off"}
    out = subprocess.run([go, "run", "./cmd/latency", str(router), str(queries), str(demand),
                          str(requests), str(n)], cwd=CRATE.parent / "go", env=env, check=True,
                         capture_output=True, text=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])


def rust_latency(router: Path, queries: Path, demand: Path, requests: Path, n: int) -> dict:
    out = {}
    for name, cmd, art, inputs in (("route", "bench", router, queries),
                                   ("hint", "demand-bench", demand, requests)):
        proc = subprocess.run([str(BINARY), cmd, str(art), "--n", str(n), "--inputs", str(inputs),
                               "--warmup", str(WARMUP)], capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"replaylab-route {cmd}: {proc.stderr.strip()[-500:]}")
        s = json.loads(proc.stdout)
        out[name] = {k: s[k] for k in ("p50_us", "p99_us", "calls") if k in s}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=0, help="(make bench passes it; unused)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--router", help="a static-tier router artifact (default: trained here)")
    ap.add_argument("--demand", help="a demand artifact (default: trained here)")
    ap.add_argument("--calls", type=int, default=20_000, help="timed calls per latency block")
    ap.add_argument("--seconds", type=float, default=2.0, help="per throughput measurement")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--memory-calls", type=int, default=1_000_000)
    args = ap.parse_args()
    cargo = find_cargo()
    if cargo is None:
        print(json.dumps({"skipped": "cargo not found: the native library is not built"}))
        return
    from bench_rust_demand import setup as demand_setup

    from replaylab.runtime import DemandPredictor, Router
    from replaylab.runtime.native import NativeDemandPredictor, NativeLibrary, NativeRouter

    build_s = build(cargo)
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        t0 = time.perf_counter()
        router_dir = Path(args.router).resolve() if args.router else train_static_router(tmp / "router")
        if args.demand:
            demand_dir, requests = Path(args.demand).resolve(), []
        else:
            demand_dir, requests = demand_setup(300, tmp / "demand")
        train_s = time.perf_counter() - t0
        if not requests:  # a given artifact: its golden requests
            requests = [c["input"] for c in json.loads((demand_dir / "golden.json").read_text())["cases"]]
        requests = requests[:2000]
        queries = gsm8k_queries(2000)
        q_json = [json.dumps(q).encode() for q in queries]
        r_json = [json.dumps(r).encode() for r in requests]
        (tmp / "q.jsonl").write_bytes(b"\n".join(q_json) + b"\n")
        (tmp / "r.jsonl").write_bytes(b"\n".join(r_json) + b"\n")

        lib = NativeLibrary.load(LIBRARY)
        router, demand = NativeRouter.load(lib, router_dir), NativeDemandPredictor.load(lib, demand_dir)
        now_ms = int(time.time() * 1000)
        py_router = Router.load(router_dir)
        py_demand = DemandPredictor.load(demand_dir, online=False)
        assert py_router.loaded and py_demand.loaded, (py_router.reason, py_demand.reason)

        def route_native(q: bytes) -> str:
            return router.route_json(q)

        def hint_native(r: bytes) -> str:
            return demand.hint_json(r, now_ms)

        def route_python(q: dict):
            return py_router.route(q["text"], q["category"], q["prompt_tokens"])

        threads = {
            "routes_native": scaling(route_native, q_json, args.rounds, args.seconds),
            "hints_native": scaling(hint_native, r_json, args.rounds, args.seconds),
            "routes_python": scaling(route_python, queries, args.rounds, args.seconds),
            "hints_python": scaling(py_demand.predict, requests, args.rounds, args.seconds),
        }
        latency = {
            "python_native": {"route": timed(route_native, q_json, args.calls),
                              "hint": timed(hint_native, r_json, args.calls)},
            "python": {"route": timed(route_python, queries, args.calls),
                       "hint": timed(py_demand.predict, requests, args.calls)},
            "c": c_latency(tmp, router_dir, tmp / "q.jsonl", demand_dir, tmp / "r.jsonl", args.calls),
            "go": go_latency(router_dir, tmp / "q.jsonl", demand_dir, tmp / "r.jsonl", args.calls),
            "rust": rust_latency(router_dir, tmp / "q.jsonl", demand_dir, tmp / "r.jsonl", args.calls),
        }
        # memory: routes and hints alternating, RSS after warm-up and after the rest
        n_warm = min(100_000, args.memory_calls // 10)
        for i in range(n_warm):
            route_native(q_json[i % len(q_json)]) if i % 2 else hint_native(r_json[i % len(r_json)])
        before = rss_kib()
        t1 = time.perf_counter()
        for i in range(args.memory_calls):
            route_native(q_json[i % len(q_json)]) if i % 2 else hint_native(r_json[i % len(r_json)])
        memory = {"calls": args.memory_calls, "warmup_calls": n_warm, "rss_before_kib": before,
                  "rss_after_kib": rss_kib(), "seconds": round(time.perf_counter() - t1, 1)}
        memory["growth_kib"] = memory["rss_after_kib"] - before
    # modeled, for a host where the measured ratio is crowded out: the share of a Python call
    # spent outside the library (under the GIL) = 1 - C's p50 / Python-native's p50; with it
    # Amdahl's 2-thread ratio 1 / (s + (1 - s) / 2)
    if "route" in latency["c"]:
        for kind, key in (("route", "routes_native"), ("hint", "hints_native")):
            gil = max(0.0, 1 - latency["c"][kind]["p50_us"] / latency["python_native"][kind]["p50_us"])
            threads[key]["gil_share_modeled"] = round(gil, 3)
            threads[key]["ratio_modeled"] = round(1 / (gil + (1 - gil) / 2), 3)
    p99 = latency["python_native"]["route"]["p99_us"]
    # "no growth": under 1 MiB over the calls (page-granular RSS, allocator noise)
    target = {"hints_threads_ratio": threads["hints_native"]["ratio"] >= SCALING_TARGET,
              "routes_threads_ratio": threads["routes_native"]["ratio"] >= SCALING_TARGET,
              "python_route_p99_us": p99 < ROUTE_P99_TARGET_US,
              "memory_growth": memory["growth_kib"] < 1024}
    out = {"threads": threads, "latency": latency, "memory": memory,
           "targets": {"threads_ratio_min": SCALING_TARGET, "python_route_p99_us": ROUTE_P99_TARGET_US,
                       "memory_growth_kib_max": 1024},
           "target_met": target, "router_version": py_router.version,
           "cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()],
           "build_s": round(build_s, 1), "train_s": round(train_s, 1)}
    if not args.json:
        print(json.dumps(out, indent=1))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
