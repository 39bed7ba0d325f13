"""Benchmark: one demand hint, the Rust scorer (trees.safetensors) vs the Python runtime, one run.

Issue 15 (demand part): "tree ensemble evaluation from the ONNX file or from a flat
export, with golden hints" - and what it costs per request next to the Python runtime.

- `rust`: `scorers/rust` built here (`cargo build --offline --release`), its
  `demand-bench` subcommand: the artifact loaded (verified) once, then each call timed
  inside the process (wall, `Instant`): feature row from a parsed request object, every
  tree walked (LightGBM's rule), sort / inverse scale / clip, conformal band. No process
  start and no JSON parsing in the timed part.
- `python_runtime`: `replaylab.runtime.DemandPredictor.load(threads=1, online=False)` on
  the same artifact, `predict(request)` timed with `perf_counter_ns` per call (feature
  assembly, onnxruntime on model.onnx, the same arithmetic on Python floats, the
  `DemandHint`). online=False: the exported corrections, as the Rust scorer serves them.
  numpy and onnxruntime on one thread, GC off while timing.

Both get the same requests in the same order: projection rows of the seeded synthetic
ledger the model is trained on (`--sessions`, the pre-dispatch fields plus `hist_*`, as
bench_runtime.py builds them), `--calls` calls per block after 20 warm-up calls, in
`--rounds` alternating blocks (Rust, Python, Rust, ...) so that load from other processes
falls on both alike; the percentiles pool every block's calls. The requests are ~2,500
distinct objects, so each call also pays cache misses on its request (as a server hinting
a request parsed long before would); `hot` repeats both sides on the first 32 requests
cycled (in cache, as right after parsing). Also: both load times, and
the agreement of the two on the timed requests (`replaylab-route demand`: fallbacks equal,
max |hint difference|). Without cargo it prints {"skipped": ...} and exits 0.
--rows is accepted and ignored (bench/run_all.py passes it to every bench).
Prints one JSON object on the last line.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # before numpy loads: one thread, like the Rust side

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from bench_rust_scorer import BINARY, WARMUP, build, find_cargo, rust_block, stats_us  # noqa: E402

HINTS = ("hint_p50", "hint_p90", "hint_lo", "hint_hi")


def setup(sessions: int, tmp: Path):
    """(artifact dir, request dicts, trees) of a demand run trained and exported here."""
    from replaylab.artifacts.demand_export import export_demand
    from replaylab.demand import DemandConfig
    from replaylab.pipelines.demand import train_demand
    from replaylab.pipelines.project import LedgerInput, load_ledger
    from replaylab.projection import ProjectionConfig, SplitConfig, dispatch_time_features
    from replaylab.projection.requests import requests as projected_requests
    from replaylab.sources.synthetic import SyntheticLedgerConfig

    loaded = load_ledger(LedgerInput(
        synthetic=SyntheticLedgerConfig(n_sessions=sessions, sessions_per_s=0.25)))
    summary, run = train_demand(loaded, ProjectionConfig(), SplitConfig(embargo_ms=300_000),
                                DemandConfig(), tmp / "run")
    art = export_demand(run, summary, tmp / "art")
    feats = dispatch_time_features(loaded.result.valid, ProjectionConfig())
    requests = projected_requests(feats, bare_first_turn=False)
    # through JSON once, so both sides read the very same values
    return art, [json.loads(json.dumps(r)) for r in requests]


def python_block(predictor, requests: list[dict]) -> list[float]:
    predict = predictor.predict
    for r in requests[:WARMUP]:
        predict(r)
    out = []
    gc.disable()
    try:
        for r in requests:
            t0 = time.perf_counter_ns()
            predict(r)
            out.append((time.perf_counter_ns() - t0) / 1e3)
    finally:
        gc.enable()
    return out


def agreement(predictor, art: Path, requests: list[dict], now_s: float) -> dict:
    stdin = "".join(json.dumps(r) + "\n" for r in requests)
    proc = subprocess.run([str(BINARY), "demand", str(art), "--now-ms", str(int(now_s * 1000))],
                          input=stdin, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"replaylab-route demand failed: {proc.stderr.strip()[-500:]}")
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    want = predictor.predict_batch(requests)
    worst_abs = worst_rel = 0.0
    for g, w in zip(got, want, strict=True):
        for k in HINTS:
            d = abs(g[k] - getattr(w, k))
            worst_abs, worst_rel = max(worst_abs, d), max(worst_rel, d / max(abs(getattr(w, k)), 1))
    return {"requests": len(requests),
            "fallbacks_equal": sum(g["hint_fallback"] == w.hint_fallback and
                                   g["fallback_reason"] == w.fallback_reason
                                   for g, w in zip(got, want, strict=True)),
            "model_answered": sum(not w.hint_fallback for w in want),
            "hint_max_abs": worst_abs, "hint_max_rel": worst_rel}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=0, help="ignored (run_all passes it to all)")
    ap.add_argument("--sessions", type=int, default=1500, help="synthetic sessions to train on")
    ap.add_argument("--calls", type=int, default=3000, help="timed calls per block and side")
    ap.add_argument("--rounds", type=int, default=3, help="alternating blocks per side")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cargo = find_cargo()
    if cargo is None:
        print(json.dumps({"skipped": "cargo not found: the Rust demand scorer is not timed"}))
        return
    started = time.perf_counter()
    build_s = build(cargo)
    from datetime import datetime

    from replaylab.runtime import DemandPredictor

    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        art, requests = setup(args.sessions, Path(d))
        setup_s = time.perf_counter() - t0
        timed = [requests[i % len(requests)] for i in range(args.calls)]
        inputs = Path(d) / "requests.jsonl"
        inputs.write_text("".join(json.dumps(r) + "\n" for r in timed))
        t0 = time.perf_counter()
        predictor = DemandPredictor.load(art, threads=1, online=False)
        py_load_ms = (time.perf_counter() - t0) * 1e3
        if not predictor.loaded:
            raise SystemExit(f"the artifact did not load in Python: {predictor.reason}")
        manifest = json.loads((art / "manifest.json").read_text())
        now_s = datetime.fromisoformat(manifest["created_at"]).timestamp() + 3600.0
        rust_us, py_us, rust_runs = [], [], []
        for _ in range(args.rounds):
            block = rust_block(art, inputs, args.calls, command="demand-bench")
            rust_runs.append(block)
            rust_us += block.pop("samples_us")
            py_us += python_block(predictor, timed)
        agree = agreement(predictor, art, timed, now_s)
        hot_inputs = Path(d) / "hot.jsonl"
        hot = [timed[i % 32] for i in range(args.calls)]
        hot_inputs.write_text("".join(json.dumps(r) + "\n" for r in timed[:32]))
        hot_rust = stats_us(rust_block(art, hot_inputs, args.calls, command="demand-bench")
                            .pop("samples_us"), decimals=2)
        hot_py = stats_us(python_block(predictor, hot), decimals=2)
    rust, py = stats_us(rust_us, decimals=2), stats_us(py_us, decimals=2)
    rust["load_ms"] = round(min(b["load_ms"] for b in rust_runs), 2)
    py["load_ms"] = round(py_load_ms, 1)
    out = {
        "rust": rust, "python_runtime": py,
        "speedup_p50": round(py["p50_us"] / rust["p50_us"], 1),
        "speedup_p99": round(py["p99_us"] / rust["p99_us"], 1),
        "hot": {"rust": hot_rust, "python_runtime": hot_py, "requests": 32},
        "agreement": agree, "trees": rust_runs[0]["trees"], "sessions": args.sessions,
        "distinct_requests": len(set(map(json.dumps, timed))),
        "python_runtime_path": "DemandPredictor.predict, online=False, threads=1",
        "rust_path": "replaylab-route demand-bench (Demand::hint in process)",
        "build_s": round(build_s, 1), "setup_s": round(setup_s, 1),
        "wall_s": round(time.perf_counter() - started, 1),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
    }
    print(json.dumps(out, indent=None if args.json else 1))


if __name__ == "__main__":
    main()
