"""Benchmark: the session binder's overhead per turn over the route alone, Python and Rust.

Issue 29 item 6: the binder (docs/specs/binder.md) must add under 5 us (p99) to a turn.

- `python`: `replaylab.runtime.SessionBinder` over `Router.load` (static tier), its default
  clock (`time.monotonic`). Per query, interleaved (the order alternating): `router.route`
  alone and `binder.bind` of a fresh session id (the opening turn: route + the binder),
  each timed with `perf_counter`; then one more (sticky) turn of every session. The
  opening overhead is p50/p99 of the bind path minus p50/p99 of the route path.
  `binder_only`: the same openings with the router's answer looked up (a proxy router
  holding the decisions), i.e. the binder's own work without the route's noise.
- `rust`: `replaylab-route bind-bench` (scorers/rust, built here): the same paths on the
  same queries inside the Rust process (`Instant`), the crate's binder over its router;
  `binder_only` there: `Binder::bind_with` given the router's choice.

Queries: GSM8K prompts of the shipped RouteLLM slice (bench_rust_scorer.gsm8k_queries),
`--calls` per round (default clamp(--rows, 1000, 3000)), 20 warm-up calls, `--rounds`
alternating blocks (Rust, Python, ...); percentiles pool the blocks. Rate 0.05, cap 0.10.
`target_met`: opening overhead p99 and sticky-turn p99 under 5 us, per language. The
overhead is a difference of two tails, each with the host's scheduling noise in it; on a
loaded host `binder_only` p99 is the steadier figure of the binder's own cost.

The artifact: `--router DIR`, else one trained here (bench_rust_scorer.train_static_router).
Without cargo the Rust half is {"skipped": ...}. Prints one JSON object on the last line.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_rust_scorer import (  # noqa: E402
    BINARY,
    WARMUP,
    build,
    find_cargo,
    latency_args,
    router_and_queries,
    run_header,
    stats_us,
)

TARGET_US = 5.0
RATE, CAP, SALT = 0.05, 0.10, "bench"


class _Decided:
    """A router proxy answering the decisions computed beforehand (binder_only)."""

    def __init__(self, router, decisions: dict[str, object]) -> None:
        self._router, self._decisions = router, decisions
        self.loaded, self.candidates = router.loaded, router.candidates
        self.fallback_candidate, self.encoder = router.fallback_candidate, router.encoder
        self.route_by_rules = router.route_by_rules

    def route(self, text, category=None, prompt_tokens=None, *, keep_embedding=False):
        return self._decisions[text]


def python_block(router, queries: list[dict], round_: int) -> dict[str, list[float]]:
    from replaylab.runtime.binder import STICKY, SessionBinder

    b = SessionBinder(router, rate=RATE, cap=CAP, salt=SALT)
    decided = {q["text"]: router.route(q["text"], q["category"], q["prompt_tokens"])
               for q in queries}
    b_only = SessionBinder(_Decided(router, decided), rate=RATE, cap=CAP, salt=SALT)
    route, bind, only = router.route, b.bind, b_only.bind
    pc = time.perf_counter
    sids = [f"r{round_}-{i:08d}" for i in range(len(queries) + WARMUP)]
    out: dict[str, list[float]] = {"route": [], "open": [], "sticky": [], "binder_only": []}
    for i, sid in enumerate(sids):
        q = queries[i % len(queries)]
        t, c, p = q["text"], q["category"], q["prompt_tokens"]
        if i % 2 == 0:
            t0 = pc()
            route(t, c, p)
            t1 = pc()
            bind(sid, t, category=c, prompt_tokens=p)
            t2 = pc()
            r_us, o_us = t1 - t0, t2 - t1
        else:
            t0 = pc()
            bind(sid, t, category=c, prompt_tokens=p)
            t1 = pc()
            route(t, c, p)
            t2 = pc()
            o_us, r_us = t1 - t0, t2 - t1
        t0 = pc()
        only(sid, t, category=c, prompt_tokens=p)
        b_us = pc() - t0
        if i >= WARMUP:
            out["route"].append(r_us * 1e6)
            out["open"].append(o_us * 1e6)
            out["binder_only"].append(b_us * 1e6)
    for i, sid in enumerate(sids):
        t0 = pc()
        r = bind(sid)
        s_us = pc() - t0
        assert r.routing_source == STICKY
        if i >= WARMUP:
            out["sticky"].append(s_us * 1e6)
    return out


def rust_block(art: Path, inputs: Path, n: int) -> dict:
    import subprocess

    proc = subprocess.run([str(BINARY), "bind-bench", "--artifact", str(art), "--n", str(n),
                           "--inputs", str(inputs), "--warmup", str(WARMUP), "--samples",
                           "--rate", repr(RATE), "--cap", repr(CAP), "--salt", SALT],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"replaylab-route bind-bench failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def figures(samples: dict[str, list[float]], decimals: int = 2) -> dict:
    s = {k: stats_us(v, decimals) for k, v in samples.items()}
    return s | {"open_overhead_p50_us": round(s["open"]["p50_us"] - s["route"]["p50_us"], 2),
                "open_overhead_p99_us": round(s["open"]["p99_us"] - s["route"]["p99_us"], 2),
                "sticky_p50_us": s["sticky"]["p50_us"], "sticky_p99_us": s["sticky"]["p99_us"]}


def met(f: dict) -> bool:
    return f["open_overhead_p99_us"] < TARGET_US and f["sticky_p99_us"] < TARGET_US


def main() -> None:
    args = latency_args()
    calls = args.calls
    rounds = max(args.rounds, 1)

    from replaylab.runtime import Router

    cargo = find_cargo()
    build_s = build(cargo) if cargo else None
    with tempfile.TemporaryDirectory() as tmp_name:
        art, train_s, queries, inputs = router_and_queries(args, Path(tmp_name))
        router = Router.load(art)
        if not router.loaded or router.tier != "static":
            raise RuntimeError(f"the Python router did not load the static tier: {router.reason}")
        py: dict[str, list[float]] = {}
        rs: dict[str, list[float]] = {}
        explored = 0
        for r in range(rounds):
            if cargo:
                got = rust_block(art, inputs, calls)
                explored += got["explored"]
                for k in ("route", "open", "sticky", "binder_only"):
                    rs.setdefault(k, []).extend(got[f"{k}_samples_us"])
            for k, v in python_block(router, queries, r).items():
                py.setdefault(k, []).extend(v)
    python = figures(py)
    rust = figures(rs, 3) | {"explored": explored} if cargo else {
        "skipped": "cargo not on PATH: the Rust binder is not measured"}
    head = run_header(args, train_s, build_s, router)
    head["router"]["candidates"] = len(router.candidates)
    out = {
        **head,
        "inputs": {"source": "RouteLLM GSM8K prompts (shuffled, seed 0), category gsm8k",
                   "calls_per_round": calls, "rounds": rounds, "warmup": WARMUP,
                   "rate": RATE, "cap": CAP},
        "threads": 1, "clock": "wall, in-process per call",
        "python": python, "rust": rust,
        "target_overhead_p99_us": TARGET_US,
        "python_open_overhead_p99_us": python["open_overhead_p99_us"],
        "python_binder_only_p99_us": python["binder_only"]["p99_us"],
        "python_sticky_p99_us": python["sticky_p99_us"],
        "rust_open_overhead_p99_us": rust.get("open_overhead_p99_us"),
        "rust_binder_only_p99_us": rust.get("binder_only", {}).get("p99_us"),
        "rust_sticky_p99_us": rust.get("sticky_p99_us"),
        "target_met": {"python": met(python), "rust": met(rust) if cargo else None},
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
