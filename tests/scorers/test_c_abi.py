"""The C ABI of the Rust crate (docs/specs/c-abi.md, scorers/rust/include/replaylab.h).

A C program (scorers/rust/tests/c/abi_check.c) is compiled with `cc` against the header
and linked with libreplaylab_scorer.a, so the header and the library cannot drift. On the
committed fixture artifacts it must:

- pass the error conventions (NULL handle, JSON cut short, a text that is not a string,
  NULL output buffer asking for the size, a missing folder, a binder without router or
  fallback: each its code and an `rl_last_error` message);
- ask for exactly the answer's size + 1 when handed a 1-byte buffer (a binder turn: an
  upper bound, the turn applied once);
- answer every demand golden request (and fallbacks) with the hint of the Python runtime
  (`DemandPredictor`, frozen corrections, the manifest's clock): every field's JSON text
  equal (a fallback's correction aside: the line carries its cell's, as golden.json), and the whole line byte-equal to `replaylab-route demand`'s;
- route every router golden query to the golden candidate and token ids, its
  probabilities within the golden tolerance of the Python `Router`'s, the line byte-equal to
  `replaylab-route route`'s; the same answer from 8 threads sharing the handle;
- replay the golden binder sessions (scorers/rust/tests/sessions) byte for byte as the
  Python runtime recorded them (which `replaylab-route bind` also writes);
- export exactly the functions the header declares.

Skipped, saying so, without cargo or cc.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import types
from pathlib import Path

import numpy as np
import pytest

from replaylab.contracts.manifest import canonical_json
from tests.helpers.rust import (
    CRATE,
    HEADER,
    LIBRARY_A,
    SESSIONS,
    build_library,
    cargo_or_skip,
    created_ms,
    run_bin,
)

FIXTURES = CRATE / "tests" / "fixtures"
SOURCE = CRATE / "tests" / "c" / "abi_check.c"


@pytest.fixture(scope="module")
def library() -> Path:
    return build_library(cargo_or_skip())


@pytest.fixture(scope="module")
def abi_check(library, tmp_path_factory) -> Path:
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("cc not on PATH: the C ABI program is not compiled")
    exe = tmp_path_factory.mktemp("c") / "abi_check"
    proc = subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-Werror", "-std=c11",
                           "-D_POSIX_C_SOURCE=200809L", f"-I{HEADER.parent}", str(SOURCE), "-o", str(exe),
                           str(LIBRARY_A), "-lpthread", "-ldl", "-lm"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return exe



def _run(exe: Path, commands: list[str]) -> list[str]:
    config = (SESSIONS / "config.json").read_text().strip()
    proc = subprocess.run([str(exe), str(FIXTURES / "demand"), str(FIXTURES / "router"), config],
                          input="".join(c + "\n" for c in commands), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "conventions ok"
    assert len(lines) == len(commands) + 1
    return lines[1:]


def test_demand_hints_are_the_python_runtimes(abi_check, library):
    from replaylab.runtime import DemandPredictor

    art = FIXTURES / "demand"
    now_ms = created_ms(art)
    requests = [c["input"] for c in json.loads((art / "golden.json").read_text())["cases"]]
    # and fallbacks: no prompt_tokens, a prompt_tokens that is not a number
    requests += [{**r, "prompt_tokens": None} for r in requests[:3]]
    requests += [{**r, "prompt_tokens": "many"} for r in requests[:3]]
    got = _run(abi_check, [f"H {now_ms} {json.dumps(r)}" for r in requests])
    predictor = DemandPredictor.load(art, clock=lambda: now_ms / 1000, online=False)
    assert predictor.loaded, predictor.reason
    fields = ("request_id", "hint_p50", "hint_p90", "hint_lo", "hint_hi", "hint_interval",
              "hint_fallback", "fallback_reason", "hint_model_version", "correction_cell",
              "correction")
    for r, line in zip(requests, got, strict=True):
        g, w = json.loads(line), predictor.predict(r)
        # a fallback hint's line also carries its cell's correction (what golden.json
        # records, docs/specs/demand-scorer.md); the Python hint has none
        keys = fields[:-2] if w.hint_fallback else fields
        assert {k: json.dumps(g[k]) for k in keys} == {k: json.dumps(getattr(w, k)) for k in keys}
    assert {json.loads(x)["fallback_reason"] for x in got} == {None, "missing_prompt_tokens",
                                                                "bad_request"}
    cli = run_bin(CRATE / "target" / "release" / "replaylab-route", "demand", str(art),
                  "--now-ms", str(now_ms), stdin="".join(json.dumps(r) + "\n" for r in requests))
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.splitlines() == got


def test_routes_are_the_golden_vectors_and_the_python_routers(abi_check, library):
    from replaylab.runtime import Router

    art = FIXTURES / "router"
    golden = json.loads((art / "golden.json").read_text())
    tol = golden["tolerances"]["static_prob_abs"]
    queries = [c["input"] for c in golden["cases"]]
    got = _run(abi_check, [f"R {json.dumps(q)}" for q in queries] +
               [f"T 8 {json.dumps(q)}" for q in queries[:3]])
    routes, threads = [json.loads(x) for x in got[:len(queries)]], got[len(queries):]
    assert threads == ["same"] * 3
    router = Router.load(art)
    assert router.loaded, router.reason
    for q, c, g in zip(queries, golden["cases"], routes, strict=True):
        e = c["expected"]["static"]
        assert (g["candidate"], g["token_ids"]) == (e["candidate"], e["token_ids"])
        w = router.route(q["text"], q.get("category"), q.get("prompt_tokens"))
        assert g["candidate"] == w.candidate
        p = np.array([w.scores[k] for k in router.candidates])
        assert np.abs(np.array(g["success_prob"]) - p).max() <= tol
    cli = run_bin(CRATE / "target" / "release" / "replaylab-route", "route", str(art),
                  stdin="".join(json.dumps(q) + "\n" for q in queries))
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.splitlines() == got[:len(queries)]


def test_golden_sessions_replay_byte_for_byte(abi_check, library):
    events = [json.loads(x) for x in (SESSIONS / "events.jsonl").read_text().splitlines()]
    want = (SESSIONS / "receipts.jsonl").read_bytes().splitlines()
    cmds = [{"bind": f"B {json.dumps(e)}", "fail": f"F {e.get('session_id')}", "stats": "S"}[e["op"]]
            for e in events]
    got = _run(abi_check, cmds)
    for i, (e, g) in enumerate(zip(events, got, strict=True)):
        if e["op"] == "fail":
            g = canonical_json({"op": "fail", "session_id": e["session_id"],
                                "escalated": {"1": True, "0": False}[g]}).decode()
        assert g.encode() == want[i], (i, e, g)


def test_golden_sessions_are_the_python_runtimes_and_the_clis(library, tmp_path):
    from replaylab.runtime import Router
    from replaylab.runtime.binder import SessionBinder, replay_events

    config = json.loads((SESSIONS / "config.json").read_text())
    events = [json.loads(x) for x in (SESSIONS / "events.jsonl").read_text().splitlines()]
    want = (SESSIONS / "receipts.jsonl").read_bytes().splitlines()
    clock = types.SimpleNamespace(now=0.0)
    binder = SessionBinder(Router.load(FIXTURES / "router"), clock=lambda: clock.now, **config)
    assert [canonical_json(r) for r in replay_events(binder, events, clock)] == want
    kinds = {json.loads(x).get("routing_source") for x in want}
    assert {"classifier", "exploration", "sticky_binding", "heuristic"} <= kinds
    stats = json.loads(want[-1])
    assert stats["escalations"] and stats["evicted_lru"] and stats["evicted_ttl"] and stats["reopened"]
    cli = run_bin(CRATE / "target" / "release" / "replaylab-route", "bind", "--artifact",
                  str(FIXTURES / "router"), "--events", str(SESSIONS / "events.jsonl"),
                  "--rate", repr(config["rate"]), "--cap", repr(config["cap"]), "--salt",
                  config["salt"], "--max-sessions", str(config["max_sessions"]), "--ttl-s",
                  repr(config["ttl_s"]))
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.encode().splitlines() == want


def test_the_library_exports_what_the_header_declares(library):
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm not on PATH: the exported symbols are not listed")
    out = subprocess.run([nm, "-D", "--defined-only", str(library)], capture_output=True,
                         text=True, check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.split()[-1].startswith("rl_")}
    declared = set(re.findall(r"\b(rl_[a-z_]+)\s*\(", HEADER.read_text()))
    assert exported == declared
    assert {"rl_last_error", "rl_demand_load", "rl_router_route_embedding", "rl_binder_bind_json",
            "rl_binder_report_failure"} <= declared
