"""Benchmark: one static-tier route, the Rust reference scorer vs the Python runtime, one run.

Issue 15: "Measure the Rust route's latency against the Python static tier in one run."

- `rust`: `scorers/rust` built here (`cargo build --offline --release`), its `bench`
  subcommand: the artifact loaded once, then each call timed inside the process (wall,
  `Instant`): tokenize (charmap + WordPiece), embed (lookup, float64 sum, L2), head
  (float64 forward), decide. No process start, no JSON I/O in the timed part.
- `python_static`: `replaylab.runtime.Router.load` on the same artifact, `route(text,
  category)` timed with `perf_counter` per call (the same work, plus building the
  `RouteDecision`). numpy pinned to one thread.

Both get the same queries in the same order: GSM8K prompts of the shipped RouteLLM slice
(shuffled, seed 0; category "gsm8k"; prompt tokens estimated from characters as in
training), `--calls` calls each (default clamp(--rows, 1000, 3000)), 20 warm-up calls, in
`--rounds` alternating blocks (Rust, Python, Rust, ...) so that load from other processes
on a shared machine falls on both alike; the percentiles pool every block's calls.
Also: both load times, and the agreement of the two on the timed queries (token ids
equal, max |P(success)| difference, decisions equal), read through `replaylab-route route`.

The artifact: `--router DIR`, else one trained here by `python -m training pipeline=router
router.encoder.tier=static` (small head; the static encoder from the repo cache when
there). Without cargo the benchmark prints {"skipped": ...} and exits 0.
Prints one JSON object on the last line (bench/run_all.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CRATE = REPO / "scorers" / "rust"
BINARY = CRATE / "target" / "release" / "replaylab-route"
WARMUP = 20
STATIC_TARGET_P99_US = 100.0


def find_cargo() -> str | None:
    found = shutil.which("cargo")
    if found:
        return found
    home = Path.home() / ".cargo" / "bin" / "cargo"
    return str(home) if home.is_file() else None


def build(cargo: str) -> float:
    env = {**os.environ, "PATH": f"{Path(cargo).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    t0 = time.perf_counter()
    proc = subprocess.run([cargo, "build", "--offline", "--release", "--quiet"], cwd=CRATE,
                          env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"cargo build failed: {proc.stderr[-1500:]}")
    return time.perf_counter() - t0


def train_static_router(out: Path) -> Path:
    cmd = [sys.executable, "-m", "training", "pipeline=router", "tracking=off",
           "router.encoder.tier=static", "router.head.max_epochs=30", "router.go.n_boot=100",
           "router.evaluation.n_boot=50", "router.lgbm_estimators=20", f"hydra.run.dir={out}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"pipeline=router tier=static failed: {proc.stderr[-1500:]}")
    return out / "artifacts" / "router"


def gsm8k_queries(n: int, seed: int = 0) -> list[dict]:
    from replaylab.apps.inputs import default_outcomes
    from replaylab.sources.routellm import import_routellm_gsm8k

    texts = import_routellm_gsm8k(default_outcomes())["prompt_text"].drop_duplicates().tolist()
    random.Random(seed).shuffle(texts)
    while len(texts) < n:
        texts += texts
    return [{"text": t, "category": "gsm8k", "prompt_tokens": None} for t in texts[:n]]


def stats_us(us, decimals: int = 1) -> dict:
    """Percentiles and mean of per-call times in microseconds (`decimals`; max to 0.1)."""
    import numpy as np

    a = np.asarray(us, dtype=np.float64)
    return {f"p{q}_us": round(float(np.percentile(a, q)), decimals) for q in (50, 90, 99)} | {
        "mean_us": round(float(a.mean()), decimals), "max_us": round(float(a.max()), 1),
        "calls": int(a.size)}


def rust_block(art: Path, inputs: Path, n: int, command: str = "bench") -> dict:
    """One in-process timing block of `replaylab-route COMMAND` (bench | demand-bench)."""
    proc = subprocess.run([str(BINARY), command, str(art), "--n", str(n), "--inputs",
                           str(inputs), "--warmup", str(WARMUP), "--samples"],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"replaylab-route {command} failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def python_block(router, queries: list[dict]) -> list[float]:
    route = router.route
    for q in queries[:WARMUP]:
        route(q["text"], q["category"], q["prompt_tokens"])
    out = []
    for q in queries:
        t0 = time.perf_counter()
        route(q["text"], q["category"], q["prompt_tokens"])
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def agreement(router, art: Path, queries: list[dict]) -> dict:
    import numpy as np

    from replaylab.runtime.routing import decision_margin

    stdin = "".join(json.dumps(q) + "\n" for q in queries)
    proc = subprocess.run([str(BINARY), "route", str(art)], input=stdin, capture_output=True,
                          text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"replaylab-route route failed: {proc.stderr.strip()[-500:]}")
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    want = [router.route(q["text"], q["category"], q["prompt_tokens"]) for q in queries]
    ids = router.encoder.token_ids([q["text"] for q in queries])
    p_py = np.array([[w.scores[c] for c in router.candidates] for w in want])
    p_rs = np.array([g["success_prob"] for g in got])
    same = np.array([g["candidate"] == w.candidate for g, w in zip(got, want, strict=True)])
    margin = decision_margin(p_py, router.threshold, fallback=router.fallback,
                             rule=router.rule)
    return {"queries": len(queries),
            "token_ids_equal_share": float(np.mean([g["token_ids"] == i
                                                    for g, i in zip(got, ids, strict=True)])),
            "prob_max_abs_diff": float(np.abs(p_py - p_rs).max()),
            "decision_agreement": float(same.mean()),
            "min_decision_margin": float(margin.min())}


def latency_args() -> argparse.Namespace:
    """The command line of the static-tier latency benchmarks (this one and
    bench_rust_binder.py; bench/run_all.py passes --rows and --json); one thread, as the
    Rust scorer, and no model hub."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2000, help="calls, clamped to [1000, 3000]")
    ap.add_argument("--calls", type=int, default=None, help="timed calls per path and round")
    ap.add_argument("--rounds", type=int, default=2, help="alternating blocks per path")
    ap.add_argument("--router", default=None, help="a static-tier router artifact (else train one)")
    ap.add_argument("--json", action="store_true", help="(accepted for bench/run_all.py)")
    args = ap.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args.calls = args.calls or min(max(args.rows, 1000), 3000)
    return args


def router_and_queries(args: argparse.Namespace, tmp: Path) -> tuple[Path, float, list[dict], Path]:
    """The static-tier artifact (--router, else trained into tmp), its training seconds,
    `args.calls` GSM8K queries and the JSONL file the Rust binary reads them from."""
    t0 = time.perf_counter()
    art = Path(args.router) if args.router else train_static_router(tmp / "run")
    train_s = time.perf_counter() - t0
    queries = gsm8k_queries(args.calls)
    inputs = tmp / "queries.jsonl"
    inputs.write_text("".join(json.dumps(q) + "\n" for q in queries))
    return art, train_s, queries, inputs


def run_header(args: argparse.Namespace, train_s: float, build_s: float | None,
               router: object) -> dict:
    """When, on what machine, and which router: the head of a latency bench's JSON."""
    return {"measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {"cpu": platform.processor() or platform.machine(),
                        "cpus_affinity": len(os.sched_getaffinity(0)),
                        "loadavg_1m": round(os.getloadavg()[0], 2)},
            "router": {"artifact": "given" if args.router else "trained here",
                       "train_seconds": None if args.router else round(train_s, 1),
                       "cargo_build_seconds": None if build_s is None else round(build_s, 1),
                       "version": router.version}}


def main() -> None:
    args = latency_args()
    cargo = find_cargo()
    if cargo is None:
        print(json.dumps({"skipped": "cargo not on PATH: the Rust scorer is not measured"}))
        return
    calls = args.calls

    from replaylab.runtime import Router

    build_s = build(cargo)
    with tempfile.TemporaryDirectory() as tmp_name:
        art, train_s, queries, inputs = router_and_queries(args, Path(tmp_name))
        t0 = time.perf_counter()
        router = Router.load(art)
        py_load_ms = (time.perf_counter() - t0) * 1e3
        if not router.loaded or router.tier != "static":
            raise RuntimeError(f"the Python router did not load the static tier: {router.reason}")
        rust_us: list[float] = []
        py_us: list[float] = []
        rust_runs = []
        for _ in range(max(args.rounds, 1)):
            r = rust_block(art, inputs, calls)
            rust_us += r.pop("samples_us")
            rust_runs.append(r)
            py_us += python_block(router, queries)
        agree = agreement(router, art, queries[:500])
    rust = stats_us(rust_us) | {"load_ms": round(min(r["load_ms"] for r in rust_runs), 1),
                                "tokens_mean": rust_runs[0]["tokens_mean"]}
    python = stats_us(py_us) | {"load_ms": round(py_load_ms, 1)}
    out = {
        **run_header(args, train_s, build_s, router),
        "inputs": {"source": "RouteLLM GSM8K prompts (shuffled, seed 0), category gsm8k",
                   "calls_per_round": calls, "rounds": max(args.rounds, 1), "warmup": WARMUP},
        "threads": 1, "clock": "wall, in-process per call",
        "rust": rust, "python_static": python,
        "python_over_rust": {"p50": round(python["p50_us"] / rust["p50_us"], 2),
                             "p99": round(python["p99_us"] / rust["p99_us"], 2)},
        "agreement": agree,
        "target_p99_us": STATIC_TARGET_P99_US,
        "rust_route_p50_us": rust["p50_us"], "rust_route_p99_us": rust["p99_us"],
        "python_static_route_p50_us": python["p50_us"],
        "python_static_route_p99_us": python["p99_us"],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
