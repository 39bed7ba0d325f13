"""The Rust session binder (scorers/rust/src/router/binder/) against the Python one, receipt for
receipt (docs/specs/binder.md, "Golden sessions").

Fixtures are tests/scorers/test_rust_scorer.py's: the crate built with `cargo build --offline
--release` (the module skips without cargo) and a static-tier router trained by the real
pipeline. Then the same JSONL events go through `replaylab.runtime.binder.replay_events`
(a `SessionBinder` over `Router.load`) and through `replaylab-route bind`; every record's
canonical JSON must be the same bytes: selected models, binding ids, routing sources,
rebind reasons, reason codes, the router's decisions, propensities (float repr, so bit for
bit), escalation answers and the final counts. Scenarios:

- `main`: 320 interleaved sessions of 2-9 turns at rate 0.1 (K=2: the shipped artifact's
  candidates), failures mid-session, categories and prompt lengths varied;
- `ttl`: sessions idle past ttl_s re-seen (with and without turn_index), failures on
  dropped sessions; `lru`: max_sessions 8 under 90 sessions;
- the fallbacks: rate above cap, a bad rate, a ladder naming an unknown candidate, a
  one-candidate ladder (the router's choice off it: per opening), a missing artifact with
  a fallback model and a two-step ladder; rate 0 and rate 0.5.

The draw and the explored index alone (K = 2..5) are compared on ids of every script
without an artifact (`replaylab-route draw`). The opening texts are those whose Python
decision is farther from the threshold than the artifact's `static_prob_abs` can move it
(docs/specs/router-scorer.md: probabilities agree to that tolerance, not bit for bit).
"""

from __future__ import annotations

import json
import random
import types
from pathlib import Path

import numpy as np
import pytest

from replaylab.contracts.manifest import canonical_json
from tests.helpers.rust import (
    build_binary,
    cargo_or_skip,
    router_texts,
    run_bin,
    train_static_router,
)

SALT = "golden-29"


@pytest.fixture(scope="module")
def cargo() -> str:
    return cargo_or_skip()


@pytest.fixture(scope="module")
def binary(cargo) -> Path:
    return build_binary(cargo)


@pytest.fixture(scope="module")
def static_router(tmp_path_factory, cargo) -> Path:
    """A static-tier router artifact from the real pipeline (see train_static_router)."""
    return train_static_router(tmp_path_factory.mktemp("rust-scorer") / "run")


# ------------------------------------------------------------------ fast: the draw alone
def test_draw_and_explored_index_are_pythons(binary):
    from replaylab.runtime.binder import exploration_draw, explored_index

    rng = random.Random(6)
    ids = [f"s{i}" for i in range(3000)] + [
        "".join(chr(rng.choice([rng.randrange(0x20, 0x7F), rng.randrange(0xA0, 0x2000),
                                rng.randrange(0x4E00, 0x4F00), rng.randrange(0x1F300, 0x1F650)]))
                for _ in range(rng.randrange(0, 30))) for _ in range(1000)]
    ids = [s for s in ids if "\n" not in s and "\r" not in s and s.strip() == s]
    for salt, rate, k in [("", 0.1, 2), (SALT, 0.1, 3), ("ü", 0.5, 4), ("x", 0.999, 5),
                          ("y", 0.0, 3)]:
        proc = run_bin(binary, "draw", "--salt", salt, "--rate", repr(rate), "--k", str(k),
                       stdin="".join(s + "\n" for s in ids))
        assert proc.returncode == 0, proc.stderr
        got = [json.loads(line) for line in proc.stdout.splitlines()]
        assert len(got) == len(ids)
        for s, g in zip(ids, got, strict=True):
            u = exploration_draw(salt, s)
            assert repr(g["u"]) == repr(u) and g["j"] == explored_index(u, rate, k), (s, salt)
        if rate > 0:
            assert any(g["j"] is not None for g in got)


# ------------------------------------------------------------------ slow: golden sessions
@pytest.fixture(scope="module")
def router(static_router):
    from replaylab.runtime import Router

    r = Router.load(static_router)
    assert r.loaded and r.tier == "static", r.reason
    return r


@pytest.fixture(scope="module")
def texts(router, static_router):
    """Opening texts whose decision is stable under the tolerance the two implementations
    share (docs/specs/router-scorer.md), with a category and a prompt length."""
    from replaylab.runtime.routing import decision_margin

    tol = json.loads((static_router / "golden.json").read_text())["tolerances"]["static_prob_abs"]
    moved = tol * (2.0 if router.rule == "margin" else 1.0)
    vocab = list(router.head.vocabulary)
    queries = [{"text": t, "category": [None, *vocab, "not-a-label"][i % (len(vocab) + 2)],
                "prompt_tokens": [None, None, 17.0, 4000.0][i % 4]}
               for i, t in enumerate(router_texts())]
    d = [router.route(q["text"], q["category"], q["prompt_tokens"]) for q in queries]
    p = np.array([[x.scores[c] for c in router.candidates] for x in d])
    margin = decision_margin(p, router.threshold, fallback=router.fallback, rule=router.rule)
    keep = [q for q, m in zip(queries, margin, strict=True) if m > moved]
    assert len(keep) > 0.9 * len(queries)
    assert len({x.candidate for x in d}) == len(router.candidates)  # both candidates decided
    return keep


def sessions(rng: random.Random, texts: list[dict], n: int, *, prefix: str, t0: float = 0.0,
             step: float = 1.0, p_fail: float = 0.15, turns: tuple[int, int] = (2, 9),
             turn_index: bool = True) -> list[dict]:
    """`n` sessions interleaved at random: each step binds an active session's next turn or
    reports a failure on it; the clock advances by up to `step` seconds per event."""
    active = {f"{prefix}{i}": [0, rng.randint(*turns)] for i in range(n)}
    order = list(active)
    rng.shuffle(order)
    waiting, live, out, now = order, [], [], t0
    while waiting or live:
        if waiting and (not live or rng.random() < 0.3):
            live.append(waiting.pop())
        sid = rng.choice(live)
        now += rng.random() * step
        done, total = active[sid]
        if done and rng.random() < p_fail:
            out.append({"op": "fail", "session_id": sid, "now": now})
            continue
        ev = {"op": "bind", "session_id": sid, "now": now}
        if done == 0:
            q = rng.choice(texts)
            ev |= {"text": q["text"], "category": q["category"], "prompt_tokens": q["prompt_tokens"]}
        if turn_index:
            ev["turn_index"] = done
        out.append(ev)
        active[sid][0] += 1
        if active[sid][0] >= total:
            live.remove(sid)
    return out


def replay_python(art: Path | None, events: list[dict], *, fallback: str | None = None,
                  **kw) -> list[bytes]:
    from replaylab.runtime import Router
    from replaylab.runtime.binder import SessionBinder, replay_events

    clock = types.SimpleNamespace(now=0.0)
    b = SessionBinder(Router.load(art), clock=lambda: clock.now, fallback_candidate=fallback,
                      **kw)
    return [canonical_json(r) for r in replay_events(b, events, clock)]


def replay_rust(binary: Path, art: Path, events: list[dict], tmp: Path, *,
                fallback: str | None = None, **kw) -> list[bytes]:
    f = tmp / "events.jsonl"
    f.write_text("".join(json.dumps(e) + "\n" for e in events))
    flags = {"rate": "--rate", "cap": "--cap", "salt": "--salt", "ladder": "--ladder",
             "max_sessions": "--max-sessions", "ttl_s": "--ttl-s"}
    args = ["bind", "--artifact", str(art), "--events", str(f)]
    for k, v in kw.items():
        args += [flags[k], ",".join(v) if k == "ladder" else repr(v) if isinstance(v, float)
                 else str(v)]
    if fallback:
        args += ["--fallback", fallback]
    proc = run_bin(binary, *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [line.encode() for line in proc.stdout.splitlines()]


def same(binary, art, events, tmp, **kw) -> list[dict]:
    """Both replays; every record byte-equal. Returns the records (parsed)."""
    events = [*events, {"op": "stats"}]
    py = replay_python(art, events, **kw)
    rs = replay_rust(binary, art, events, tmp, **kw)
    assert len(py) == len(rs) == len(events)
    diff = [i for i, (a, b) in enumerate(zip(py, rs, strict=True)) if a != b]
    assert not diff, (f"{len(diff)} of {len(events)} records differ; first: event "
                      f"{json.dumps(events[diff[0]])[:300]}\n python {py[diff[0]]!r}\n"
                      f" rust   {rs[diff[0]]!r}")
    return [json.loads(x) for x in py]


def binds(records: list[dict]) -> list[dict]:
    return [r for r in records if r["op"] == "bind"]


@pytest.mark.slow
def test_golden_sessions_main(binary, static_router, router, texts, tmp_path):
    events = sessions(random.Random(29), texts, 320, prefix="m")
    recs = same(binary, static_router, events, tmp_path, rate=0.1, salt=SALT)
    b, stats = binds(recs), recs[-1]
    opened = [r for r in b if r["new_binding"] and r["rebind_reason"] is None]
    assert len(opened) == stats["openings"] == 320 and len(b) > 1200
    src = {s: sum(r["routing_source"] == s for r in b) for s in
           ("classifier", "exploration", "sticky_binding", "heuristic")}
    assert src["exploration"] == stats["explored"] >= 10  # several explored sessions
    assert src["heuristic"] == stats["escalations"] >= 20  # failures mid-session escalated
    assert {repr(r["propensity"]) for r in b if r["routing_source"] == "exploration"} == {
        repr(0.1 / (len(router.candidates) - 1))}
    assert {repr(r["propensity"]) for r in b if r["routing_source"] == "classifier"} == {
        repr(1.0 - 0.1)}
    assert all(r["propensity"] is None for r in b if r["routing_source"] == "sticky_binding")
    assert {r["candidate"] for r in opened} == set(router.candidates)
    assert stats["reason"] is None and stats["exploring"] and stats["held"] == 320


@pytest.mark.slow
def test_golden_sessions_ttl_and_lru(binary, static_router, texts, tmp_path):
    rng = random.Random(30)
    first = sessions(rng, texts, 60, prefix="t", step=0.5)
    # the same ids re-seen 2 minutes later (ttl 60 s), half with turn_index
    later = sessions(rng, texts, 60, prefix="t", t0=first[-1]["now"] + 120.0, step=0.5)
    for e in later:  # even ids: a later turn of the session (reopened), odd: no turn_index
        if e["op"] == "bind" and int(e["session_id"][1:]) % 2:
            e.pop("turn_index")
        elif e["op"] == "bind":
            e["turn_index"] += 5
    # failures on held but idle sessions (accepted: report_failure does not look at the
    # clock; the escalation is lost when the next turn finds the session expired) and on
    # sessions never seen (unknown)
    fails = [{"op": "fail", "session_id": f"{p}{i}"} for i in range(5) for p in ("t", "ghost")]
    recs = same(binary, static_router, [*first, *fails, *later], tmp_path, rate=0.1, salt=SALT,
                ttl_s=60.0)
    stats = recs[-1]
    assert stats["evicted_ttl"] >= 55 and stats["reopened"] > 0
    assert stats["failures_unknown_session"] >= 5
    assert any("/t" in r["binding_id"] for r in binds(recs))

    lru = sessions(random.Random(31), texts, 90, prefix="l", step=0.2)
    recs = same(binary, static_router, lru, tmp_path, rate=0.1, salt=SALT, max_sessions=8)
    stats = recs[-1]
    assert stats["evicted_lru"] > 20 and stats["held"] == 8
    assert stats["openings"] > 90  # evicted sessions seen again were opened anew


CASES = ["rate_above_cap", "bad_rate", "unknown_candidate", "off_ladder", "missing_artifact",
         "rate0", "rate05"]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_golden_sessions_fallbacks(binary, static_router, router, texts, tmp_path, case):
    cheap, strong = router.candidates[0], router.candidates[-1]
    events = sessions(random.Random(40 + CASES.index(case)), texts, 40, prefix=case[:2])
    art = static_router
    kw: dict = {"salt": SALT}
    want_reason = case
    if case == "rate_above_cap":
        kw |= {"rate": 0.2, "cap": 0.1}
    elif case == "bad_rate":
        kw |= {"rate": 1.5, "cap": 0.1}
    elif case == "unknown_candidate":
        kw |= {"rate": 0.1, "ladder": [cheap, "no-such-model"]}
    elif case == "off_ladder":  # the router's choice of the cheap one is off the ladder
        kw |= {"rate": 0.1, "ladder": [strong]}
        want_reason = None
    elif case == "missing_artifact":
        art = tmp_path / "nowhere"
        kw |= {"rate": 0.1, "ladder": [cheap, strong], "fallback": cheap}
        want_reason = "router_not_loaded"
    elif case == "rate0":
        kw |= {"rate": 0.0}
        want_reason = None
    else:
        kw |= {"rate": 0.5, "cap": 0.6}
        want_reason = None
    recs = same(binary, art, events, tmp_path, **kw)
    b, stats = binds(recs), recs[-1]
    assert stats["reason"] == want_reason
    opened = [r for r in b if r["new_binding"] and r["rebind_reason"] is None]
    if want_reason is not None:
        assert stats["fallback"] == len(opened) == 40 and not stats["exploring"]
        assert all(r["reason"] == want_reason and r["propensity"] == 1.0 for r in opened)
        assert {r["routing_source"] for r in opened} == (
            {"fixed"} if case == "missing_artifact" else {"heuristic"})
        assert stats["escalations"] > 0 or case != "missing_artifact"  # cheap -> strong
    elif case == "off_ladder":
        assert {r["selected_model"] for r in b} == {strong}
        assert stats["fallback_reasons"].get("unknown_candidate", 0) == sum(
            r["candidate"] == cheap for r in opened) > 0
    elif case == "rate0":
        assert {r["routing_source"] for r in opened} == {"classifier"}
        assert {r["propensity"] for r in opened} == {1.0}
    else:
        assert stats["explored"] >= 10


@pytest.mark.slow
def test_bind_refusals(binary, static_router, tmp_path):
    f = tmp_path / "ev.jsonl"
    f.write_text('{"op": "bind", "session_id": "a", "text": "hi"}\n')
    proc = run_bin(binary, "bind", "--artifact", str(tmp_path / "nowhere"), "--events", str(f))
    assert proc.returncode == 2 and proc.stderr.startswith("error: missing_artifact"), proc.stderr
    for bad in ['{"op": "bind"}', '{"op": "jump", "session_id": "a"}',
                '{"op": "bind", "session_id": "a", "turn_index": 1.5}', "[1]"]:
        f.write_text(bad + "\n")
        proc = run_bin(binary, "bind", "--artifact", str(static_router), "--events", str(f))
        assert proc.returncode == 2 and proc.stderr.startswith("error: bad_input"), (bad,
                                                                                   proc.stderr)
    f.write_text('{"op": "stats"}\n')
    proc = run_bin(binary, "bind", "--artifact", str(static_router), "--events", str(f),
                   "--max-sessions", "0")
    assert proc.returncode == 2 and "max_sessions" in proc.stderr
