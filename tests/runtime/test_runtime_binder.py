"""The Python session binder's draw and memory, statistically and by invariants
(docs/specs/binder.md; the Rust parity is tests/scorers/test_rust_binder.py).

A stub router (four candidates, its choice a hash of the text, the rules answering the
strongest) stands in for a trained artifact: the binder only reads `loaded`,
`candidates`, `fallback_candidate`, `route`, `route_by_rules` and `encoder` of a router.

- over 20,000 fresh session ids the explored share lies in the binomial 99.9% interval of
  the rate, and each of the K - 1 other candidates is drawn equally (chi-square, p > 0.001);
- the logged propensity is the logging policy's probability of the logged choice;
- the draw is the same in another process (another PYTHONHASHSEED);
- under random traffic with failures a session's binding never changes without a failure
  and moves exactly one rung per failure, stopping at the strongest;
- the sessions held never exceed max_sessions; a session idle past ttl_s is opened anew.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import types

import numpy as np
import pytest
from scipy import stats

from replaylab.runtime.binder import (
    CLASSIFIER,
    ESCALATION,
    EXPLORATION,
    HEURISTIC,
    STICKY,
    SessionBinder,
    exploration_draw,
    explored_index,
    replay_events,
)
from replaylab.runtime.router import RouteDecision

CANDIDATES = ("tiny", "small", "mid", "big")
N_FRESH = 20_000


class StubRouter:
    """What the binder reads of a loaded Router; the choice: sha256(text) mod K."""

    loaded = True
    candidates = CANDIDATES
    fallback_candidate = "big"
    encoder = None

    def route(self, text, category=None, prompt_tokens=None, *, keep_embedding=False):
        k = hashlib.sha256(text.encode()).digest()[0] % len(self.candidates)
        return RouteDecision(self.candidates[k])

    def route_by_rules(self, text, category=None, tokens=None):
        return RouteDecision("big", fallback=True, decision="rules:default")


def binder(**kw) -> tuple[SessionBinder, types.SimpleNamespace]:
    clock = types.SimpleNamespace(now=0.0)
    return SessionBinder(StubRouter(), clock=lambda: clock.now, **kw), clock


@pytest.mark.parametrize("rate", [0.1, 0.03])
def test_explored_share_and_each_other_candidate_equally_often(rate):
    b, _ = binder(rate=rate, cap=0.1, salt="stat")
    by_candidate = {c: 0 for c in CANDIDATES}
    slots = np.zeros(len(CANDIDATES) - 1, dtype=np.int64)
    n_explored = 0
    for i in range(N_FRESH):
        r = b.bind(f"fresh-{i}", f"text {i % 97}")
        own = b.router_choice(f"fresh-{i}")
        probs = b.propensities(own)
        assert r.propensity == probs[r.selected_model]  # the logged choice's probability
        assert sum(probs.values()) == pytest.approx(1.0, abs=1e-15)
        if r.routing_source == EXPLORATION:
            assert r.selected_model != own
            assert r.propensity == rate / 3
            n_explored += 1
            by_candidate[r.selected_model] += 1
            slots[[c for c in CANDIDATES if c != own].index(r.selected_model)] += 1
        else:
            assert (r.routing_source, r.selected_model, r.propensity) == (CLASSIFIER, own,
                                                                          1.0 - rate)
    lo, hi = stats.binom.ppf([0.0005, 0.9995], N_FRESH, rate)
    assert lo <= n_explored <= hi, (n_explored, lo, hi)
    assert b.stats()["explored"] == n_explored
    assert slots.sum() == n_explored
    assert stats.chisquare(slots).pvalue > 0.001, slots  # each other candidate equally
    # by name too (the stub's choice is uniform over texts, so each name is an "other" alike)
    named = np.array(list(by_candidate.values()))
    assert stats.chisquare(named).pvalue > 0.001, by_candidate


def test_explored_index_is_uniform_on_the_others():
    # the draw alone: u uniform on [0, rate) maps to each of K - 1 slots with rate / (K - 1)
    for k in (2, 3, 5):
        u = np.array([exploration_draw("idx", f"s{i}") for i in range(N_FRESH)])
        j = [explored_index(float(x), 0.5, k) for x in u]
        picked = np.array([x for x in j if x is not None])
        assert set(picked.tolist()) == set(range(k - 1))
        counts = np.bincount(picked, minlength=k - 1)
        assert k == 2 or stats.chisquare(counts).pvalue > 0.001, counts
    assert explored_index(0.3, 0.3, 3) is None and explored_index(0.0, 0.0, 3) is None
    assert explored_index(0.1, 0.3, 1) is None
    assert explored_index(0.3 * (1 - 2**-53), 0.3, 3) == 1  # u / rate rounds to 1: clamped


def test_the_draw_is_the_same_in_another_process():
    ids = [f"sess-{i}" for i in range(3000)] + ["", "ü/ß", "日本語", "🙂" * 5, "a\x1fb"]
    here = [repr(exploration_draw("proc-salt", s)) for s in ids]
    code = ("import json, sys; from replaylab.runtime.binder import exploration_draw; "
            "ids = json.load(sys.stdin); "
            "print(json.dumps([repr(exploration_draw('proc-salt', s)) for s in ids]))")
    for seed in ("0", "12345"):
        proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(ids),
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONHASHSEED": seed})
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == here
    # the definition, spelled out once more: top 53 bits of the first 8 bytes, big-endian
    d = hashlib.sha256(b"proc-salt\x1fsess-7").digest()
    assert exploration_draw("proc-salt", "sess-7") == (int.from_bytes(d[:8], "big") >> 11) / 2**53
    assert exploration_draw("a", "bc") != exploration_draw("ab", "c")  # the separator counts


def test_sticky_bindings_change_only_on_failure_and_stop_at_the_strongest():
    rng = random.Random(29)
    b, clock = binder(rate=0.1, salt="sticky")
    current: dict[str, str] = {}
    pending: dict[str, int] = {}
    binding: dict[str, str] = {}
    n_fail = n_escalated = 0
    for step in range(30_000):
        clock.now = step * 0.01
        sid = f"s{rng.randrange(600)}"
        if sid in current and rng.random() < 0.2:
            ok = b.report_failure(sid)
            n_fail += 1
            rung = CANDIDATES.index(current[sid]) + pending.get(sid, 0)
            assert ok == (rung < len(CANDIDATES) - 1)
            pending[sid] = pending.get(sid, 0) + ok
            continue
        r = b.bind(sid, f"q{sid}")
        if sid not in current:
            assert r.new_binding and r.binding_id == f"{sid}/b0"
        elif pending.get(sid):
            n_escalated += 1
            want = CANDIDATES[CANDIDATES.index(current[sid]) + pending[sid]]
            assert (r.selected_model, r.routing_source, r.rebind_reason, r.propensity) == (
                want, HEURISTIC, ESCALATION, 1.0)
            assert r.binding_id != binding[sid] and r.new_binding
        else:
            assert (r.selected_model, r.routing_source, r.binding_id, r.propensity) == (
                current[sid], STICKY, binding[sid], None)
        current[sid], binding[sid], pending[sid] = r.selected_model, r.binding_id, 0
    assert n_fail > 1000 and n_escalated > 500
    assert sum(c == "big" for c in current.values()) > 300  # many reached the strongest ...
    for sid in [s for s, c in current.items() if c == "big"][:50]:
        assert b.report_failure(sid) is False  # ... and stay there
        assert b.bind(sid).selected_model == "big"
    assert b.stats()["escalations"] == n_escalated


@pytest.mark.parametrize("max_sessions,ttl_s", [(1, 3600.0), (37, 3600.0), (200, 5.0)])
def test_memory_never_exceeds_max_sessions(max_sessions, ttl_s):
    rng = random.Random(max_sessions)
    b, clock = binder(rate=0.1, max_sessions=max_sessions, ttl_s=ttl_s)
    last_seen: dict[str, float] = {}
    for step in range(8000):
        clock.now = step * 0.01
        sid = f"s{rng.randrange(400)}"
        held_before = b.router_choice(sid) is not None
        r = b.bind(sid, "x", turn_index=rng.randrange(3))
        assert b.stats()["held"] <= max_sessions
        if held_before and clock.now - last_seen[sid] > ttl_s:
            assert r.new_binding and r.routing_source != STICKY  # dropped for idleness: reopened
        last_seen[sid] = clock.now
    s = b.stats()
    assert s["evicted_lru"] + s["evicted_ttl"] > 0
    assert s["openings"] == s["held"] + s["evicted_lru"] + s["evicted_ttl"]


def test_replay_events_is_the_binders_calls():
    b, clock = binder(rate=0.1, salt="r", max_sessions=2, ttl_s=10.0)
    text = next(t for t in map(str, range(100)) if StubRouter().route(t).candidate == "tiny")
    assert explored_index(exploration_draw("r", "a"), 0.1, 4) is None
    out = replay_events(b, [
        {"op": "bind", "session_id": "a", "text": text, "now": 1},
        {"op": "fail", "session_id": "a"},
        {"op": "bind", "session_id": "a"},
        {"op": "bind", "session_id": "b", "text": "t", "turn_index": 3, "now": 30},
        {"op": "fail", "session_id": "a"},
        {"op": "stats"},
    ], clock)
    assert clock.now == 30.0
    assert [o["op"] for o in out] == ["bind", "fail", "bind", "bind", "fail", "stats"]
    assert out[0]["binding_id"] == "a/b0" and out[0]["new_binding"] and out[0]["turn_index"] == 0
    assert out[1]["escalated"] is True
    assert (out[2]["rebind_reason"], out[2]["binding_id"], out[2]["turn_index"]) == (
        ESCALATION, "a/b1", 1)
    assert out[3]["binding_id"] == "b/t3/b0" and out[3]["turn_index"] == 3
    assert out[4]["escalated"] is False  # a was dropped (idle 29 s > 10 s) at b's opening
    assert out[5]["evicted_ttl"] == 1 and out[5]["failures_unknown_session"] == 1
    assert out[5]["reopened"] == 1 and out[5]["held"] == 1
    with pytest.raises(ValueError, match="unknown op"):
        replay_events(b, [{"op": "nope"}], clock)
