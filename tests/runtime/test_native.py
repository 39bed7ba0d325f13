"""Python serving through the native library (replaylab.runtime.native, ctypes over the C
ABI of scorers/rust; docs/specs/c-abi.md).

On the committed fixture artifacts, from Python:
- demand hints: every field's JSON text equal to `DemandPredictor`'s (frozen corrections,
  the manifest's clock) on the golden requests and fallbacks; the line byte-equal to
  `replaylab-route demand`'s;
- static routes: the golden candidates and token ids, probabilities within the golden
  tolerance of the Python `Router`'s;
- the golden binder sessions byte for byte (the Python runtime's records);
- the MiniLM-tier fixture: text refused (`embedding_only`), the golden triples' embeddings
  routed as `Router.route_embedding` routes them, the host's encoder verified, a drifted
  one refused (`encoder_drift`);
- 4 threads sharing one demand, router and binder handle get the serial answers;
- refusals: a missing library, a missing or tampered artifact, bad JSON (`NativeError`, an
  `InputError`, with the library's reason); the library is freed with its handles;
- `replaylab.apps.serving.native_library` honours REPLAYLAB_NATIVE_LIB.
Skipped, saying so, without cargo.
"""

from __future__ import annotations

import json
import math
import shutil
import threading

import numpy as np
import pytest

from replaylab.contracts.errors import InputError
from replaylab.runtime.native import (
    NativeDemandPredictor,
    NativeError,
    NativeLibrary,
    NativeRouter,
    NativeSessionBinder,
)
from tests.helpers.rust import CRATE, SESSIONS, build_library, cargo_or_skip, created_ms, run_bin

FIXTURES = CRATE / "tests" / "fixtures"
CLI = CRATE / "target" / "release" / "replaylab-route"


@pytest.fixture(scope="module")
def lib() -> NativeLibrary:
    return NativeLibrary.load(build_library(cargo_or_skip()))



def _requests() -> list[dict]:
    cases = json.loads((FIXTURES / "demand" / "golden.json").read_text())["cases"]
    reqs = [c["input"] for c in cases]
    return reqs + [{**r, "prompt_tokens": None} for r in reqs[:3]] + \
        [{**r, "prompt_tokens": [1]} for r in reqs[:3]]


def test_demand_hints_equal_the_python_runtime(lib):
    from replaylab.runtime import DemandPredictor

    art = FIXTURES / "demand"
    now_ms = created_ms(art)
    native = NativeDemandPredictor.load(lib, art)
    python = DemandPredictor.load(art, clock=lambda: now_ms / 1000, online=False)
    requests = _requests()
    lines = [native.hint_json(json.dumps(r), now_ms) for r in requests]
    fields = ("request_id", "hint_p50", "hint_p90", "hint_lo", "hint_hi", "hint_interval",
              "hint_fallback", "fallback_reason", "hint_model_version", "correction_cell", "correction")
    for r, line in zip(requests, lines, strict=True):
        g, w = json.loads(line), python.predict(r)
        keys = fields[:-2] if w.hint_fallback else fields  # a fallback line keeps its cell's correction
        assert {k: json.dumps(g[k]) for k in keys} == {k: json.dumps(getattr(w, k)) for k in keys}
    assert {json.loads(x)["fallback_reason"] for x in lines} == {None, "missing_prompt_tokens",
                                                                 "bad_request"}
    cli = run_bin(CLI, "demand", str(art), "--now-ms", str(now_ms),
                  stdin="".join(json.dumps(r) + "\n" for r in requests))
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.splitlines() == lines
    assert native.predict(requests[0], now_ms) == json.loads(lines[0])


def test_static_routes_are_the_golden_vectors(lib):
    from replaylab.runtime import Router

    art = FIXTURES / "router"
    golden = json.loads((art / "golden.json").read_text())
    tol = golden["tolerances"]["static_prob_abs"]
    native, python = NativeRouter.load(lib, art), Router.load(art)
    for c in golden["cases"]:
        q, e = c["input"], c["expected"]["static"]
        g = native.route(q["text"], q.get("category"), q.get("prompt_tokens"))
        assert (g["candidate"], g["token_ids"]) == (e["candidate"], e["token_ids"])
        w = python.route(q["text"], q.get("category"), q.get("prompt_tokens"))
        assert g["candidate"] == w.candidate
        assert np.abs(np.array(g["success_prob"]) -
                      [w.scores[k] for k in python.candidates]).max() <= tol


def test_minilm_tier_routes_the_hosts_embedding(lib):
    from replaylab.runtime import Router

    art = FIXTURES / "router-minilm"
    golden = json.loads((art / "golden.json").read_text())
    tol = golden["tolerances"]["fp32_prob_abs"]
    cpt = json.loads((art / "router.json").read_text())["prompt_tokens"]["chars_per_token"]
    native, python = NativeRouter.load(lib, art), Router.load(art)
    assert python.loaded, python.reason
    with pytest.raises(NativeError, match="answered -5: embedding_only"):
        native.route("text needs the static tier")
    texts = native.golden_texts()
    assert [t["text"] for t in texts] == [c["input"]["text"] for c in golden["cases"]]
    rows = [c["expected"]["fp32"]["embedding"] for c in golden["cases"]]
    for c, emb in zip(golden["cases"], rows, strict=True):
        q, e = c["input"], c["expected"]["fp32"]
        tokens = q.get("prompt_tokens")
        if tokens is None:  # what the golden decision used: ceil(codepoints / chars_per_token)
            tokens = math.ceil(len(q["text"]) / cpt)
        g = native.route_embedding(emb, q.get("category"), tokens)
        w = python.route_embedding(emb, q.get("category"), tokens)
        assert g["token_ids"] == [] and g["candidate"] == w.candidate == e["candidate"]
        assert np.abs(np.array(g["success_prob"]) - e["success_prob"]).max() <= tol
        assert np.abs(np.array(g["success_prob"]) - [w.scores[k] for k in python.candidates]).max() <= tol
    assert native.verify_encoder(rows)["ok"]
    with pytest.raises(NativeError, match="answered -7: encoder_drift"):
        native.verify_encoder([r[::-1] for r in rows])  # an encoder that drifted


def _replay(binder: NativeSessionBinder, events: list[dict]) -> list[bytes]:
    out = []
    for e in events:
        if e["op"] == "bind":
            out.append(binder.bind_json(json.dumps(e)).encode())
        elif e["op"] == "fail":
            ok = binder.report_failure(e["session_id"])
            out.append(json.dumps({"escalated": ok, "op": "fail", "session_id": e["session_id"]},
                                  separators=(",", ":")).encode())
        else:
            out.append(binder.stats_json().encode())
    return out


def test_golden_sessions_byte_for_byte(lib):
    config = json.loads((SESSIONS / "config.json").read_text())
    events = [json.loads(x) for x in (SESSIONS / "events.jsonl").read_text().splitlines()]
    want = (SESSIONS / "receipts.jsonl").read_bytes().splitlines()
    router = NativeRouter.load(lib, FIXTURES / "router")
    assert _replay(NativeSessionBinder(lib, router, **config), events) == want
    # without a router: the rules' fallback on every opening
    rec = NativeSessionBinder(lib, None, fallback_candidate="strong").bind("s", now=0.0)
    assert (rec["reason"], rec["selected_model"]) == ("router_not_loaded", "strong")


def test_threads_share_handles_and_agree_with_a_serial_run(lib):
    art = FIXTURES / "router"
    router = NativeRouter.load(lib, art)
    demand = NativeDemandPredictor.load(lib, FIXTURES / "demand")
    queries = [json.dumps(c["input"]) for c in json.loads((art / "golden.json").read_text())["cases"]]
    requests = [json.dumps(r) for r in _requests()]
    now_ms = created_ms(FIXTURES / "demand")
    want = ([router.route_json(q) for q in queries], [demand.hint_json(r, now_ms) for r in requests])
    binds = [json.loads(x) for x in (SESSIONS / "events.jsonl").read_text().splitlines()]
    binds = [e for e in binds if e["op"] == "bind"]
    cfg = {"rate": 0.2, "cap": 0.3, "salt": "t", "max_sessions": 10**6, "ttl_s": 1e9}
    serial = NativeSessionBinder(lib, router, **cfg)
    want_binds = {}
    for e in binds:
        want_binds.setdefault(e["session_id"], []).append(serial.bind_json(json.dumps(e)))
    shared = NativeSessionBinder(lib, router, **cfg)
    got: dict[int, tuple] = {}
    got_binds: dict[str, list[str]] = {}
    lock = threading.Lock()

    def work(k: int) -> None:
        answers = ([router.route_json(q) for q in queries] * 20,
                   [demand.hint_json(r, now_ms) for r in requests] * 20)
        for e in binds:
            if int(e["session_id"][1:]) % 4 == k:
                rec = shared.bind_json(json.dumps(e))
                with lock:
                    got_binds.setdefault(e["session_id"], []).append(rec)
        got[k] = answers

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(4):
        assert got[k] == (want[0] * 20, want[1] * 20)
    assert got_binds == want_binds


def test_refusals(lib, tmp_path):
    assert NativeLibrary.find(tmp_path / "absent.so") is None
    with pytest.raises(NativeError, match="not found"):
        NativeLibrary.load(tmp_path / "absent.so")
    with pytest.raises(NativeError, match="missing_artifact"):
        NativeRouter.load(lib, tmp_path / "nothing")
    art = tmp_path / "router"
    shutil.copytree(FIXTURES / "router", art)
    with (art / "router.json").open("a") as f:
        f.write(" ")
    with pytest.raises(InputError, match="size|sha256|hash"):
        NativeRouter.load(lib, art)
    router = NativeRouter.load(lib, FIXTURES / "router")
    with pytest.raises(NativeError, match=r"answered -2: bad_input"):
        router.route_json('{"text": 3}')
    with pytest.raises(NativeError, match="answered -5: dimension"):
        router.route_embedding([0.0, 1.0])
    router.close()
    router.close()  # twice: nothing


def test_apps_serving_honours_the_environment(lib, tmp_path):
    from replaylab.apps.serving import ENV_NATIVE_LIB, native_library

    assert native_library({ENV_NATIVE_LIB: str(lib.path)}).path == lib.path
    with pytest.raises(NativeError, match=ENV_NATIVE_LIB):
        native_library({ENV_NATIVE_LIB: str(tmp_path / "none.so")})
    found = native_library({})
    assert found is None or found.path.is_file()
