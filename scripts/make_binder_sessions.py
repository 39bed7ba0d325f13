"""Golden binder sessions for the hosts of the C ABI (scorers/rust/tests/sessions/).

A seeded replay (docs/specs/binder.md, event format) over the fixture router
(scorers/rust/tests/fixtures/router): 40 sessions of 1-6 turns, interleaved, with reported
failures (escalations), idle gaps past `ttl_s`, more sessions than `max_sessions` (LRU
evictions), re-opened turns (`turn_index` > 0), a router category unknown to it, and
`stats` events; exploration at rate 0.2. Written:

- `config.json`: the binder's keyword arguments (`SessionBinder`, `rl_binder_new`);
- `events.jsonl`: the events, one a line;
- `receipts.jsonl`: the Python runtime's record of each event (`replay_events`, canonical
  JSON), which the Rust CLI (`replaylab-route bind`), the C program and the Go test
  must write byte for byte (tests/scorers/test_c_abi.py, scorers/go).

    .venv/bin/python scripts/make_binder_sessions.py   # rerun when the binder changes on purpose
"""

from __future__ import annotations

import argparse
import json
import random
import types
from pathlib import Path

from replaylab.contracts.manifest import canonical_json
from replaylab.runtime import Router
from replaylab.runtime.binder import SessionBinder, replay_events

REPO = Path(__file__).resolve().parents[1]
ROUTER = REPO / "scorers" / "rust" / "tests" / "fixtures" / "router"
OUT = REPO / "scorers" / "rust" / "tests" / "sessions"
CONFIG = {"rate": 0.2, "cap": 0.3, "salt": "abi", "max_sessions": 32, "ttl_s": 300.0}


def session_events(router_dir: Path, seed: int = 47, n: int = 40) -> list[dict]:
    """Interleaved seeded sessions over the router's golden queries."""
    golden = json.loads((router_dir / "golden.json").read_text(encoding="utf-8"))
    queries = [c["input"] for c in golden["cases"]]
    queries.append({"text": "Ünïcödé prompt, unknown category", "category": "not-a-label",
                    "prompt_tokens": 40.0})
    rng = random.Random(seed)
    live = {f"s{i:02d}": [0, rng.randint(1, 6)] for i in range(n)}
    now, events = 0.0, []
    while live:
        sid = rng.choice(sorted(live))
        done, total = live[sid]
        now += rng.choice([0.5, 1.0, 2.0, 4.0]) + (400.0 if rng.random() < 0.01 else 0.0)
        ev = {"op": "bind", "session_id": sid, "now": now}
        q = queries[rng.randrange(len(queries))]
        ev |= {"text": q["text"], "category": q.get("category"),
               "prompt_tokens": q.get("prompt_tokens")}
        if done and rng.random() < 0.15:
            ev["turn_index"] = done
        events.append(ev)
        if rng.random() < 0.2:
            events.append({"op": "fail", "session_id": sid})
        if rng.random() < 0.05:
            events.append({"op": "stats"})
        live[sid][0] += 1
        if live[sid][0] >= total:
            del live[sid]
    events.append({"op": "fail", "session_id": "never-bound"})
    events.append({"op": "stats"})
    return events


def receipts(router_dir: Path, events: list[dict]) -> list[bytes]:
    clock = types.SimpleNamespace(now=0.0)
    binder = SessionBinder(Router.load(router_dir), clock=lambda: clock.now, **CONFIG)
    return [canonical_json(r) for r in replay_events(binder, events, clock)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    events = session_events(ROUTER)
    (args.out / "config.json").write_text(json.dumps(CONFIG, sort_keys=True) + "\n", encoding="utf-8")
    (args.out / "events.jsonl").write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in events),
                                          encoding="utf-8")
    (args.out / "receipts.jsonl").write_bytes(b"".join(r + b"\n" for r in receipts(ROUTER, events)))
    print(f"{len(events)} events -> {args.out}")


if __name__ == "__main__":
    main()
