"""Session binder: the served router's session-scoped decisions, and the receipts they log.

A deployment asks the binder, not the router, on every turn (`bind`). The binder
decides ONCE per session, on its opening turn, and the binding is sticky for the
session's later turns; only a reported failure rebinds (the escalation ladder). It
returns the ledger-v1 receipt fields of each turn under their contract names
(`BindingReceipt.as_record()`: `selected_model`, `binding_id`, `routing_source`,
`propensity`, `rebind_reason`, optionally `prompt_embedding` + `embedding_model`),
which is exactly what `python -m training pipeline=router data.ledger=FILE` trains
and judges the next round on. docs/specs/binder.md is the normative text (the Rust
crate in scorers/rust implements the same binder).

Opening decision of session s (K candidates, exploration rate eps <= cap):

    u(s) = (first 8 bytes of SHA-256(salt || 0x1f || s), big-endian) >> 11) * 2^-53
    explored  iff  u(s) < eps                            (K >= 2 and eps > 0)
    choice    = the router's choice r(s)                  propensity 1 - eps
              or, explored, others[j],                    propensity eps / (K - 1)
              j = min(floor(u / eps * (K - 1)), K - 2),   others = ladder without r(s)

`u` depends on (salt, session id) alone, so the same session gets the same
exploration draw in every process and on every machine; given `u < eps`, `u / eps`
is uniform, so each other candidate is drawn with probability eps / (K - 1) and the
logged propensities are the exact probabilities of the logged choices (to 2^-53).
The router's own choice is deterministic given the opening text, so the receipt's
propensity is the logging policy's probability of the choice it logged.

Escalation: `report_failure(s)` moves the session one step up the ladder (cheapest
first, strongest last: the router's candidates unless configured); the next turn
opens a new binding with `rebind_reason = escalation`, `routing_source = heuristic`,
propensity 1 (deterministic given the failure). The strongest keeps the session.

Fallbacks (never an exception on a serving call): a router that did not load, a rate
above the cap (or outside [0, 1)), or a configured ladder naming a candidate the
artifact does not know -> every opening is decided by the rules (the artifact's
scenario rules when it loaded, else the caller's fallback candidate), propensity 1,
no exploration, with the reason code on the receipt (`reason`) and in `stats()`. A
router choice outside the ladder (e.g. its rules naming another model) is replaced
the same way, reason `unknown_candidate`.

Bounded memory: at most `max_sessions` sessions are held, least recently used
evicted first, and a session idle longer than `ttl_s` is dropped. A session seen
again after it was dropped, on a turn after its opening (`turn_index > 0`), is
decided again as a new binding (`stats()["reopened"]`; its binding id carries the
turn); without `turn_index` the binder cannot tell it from a new session.
"""

from __future__ import annotations

import hashlib
import math
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from replaylab.runtime.router import RouteDecision, Router

SPEC_VERSION = "1"
SEPARATOR = b"\x1f"
_TWO_POW_53 = float(2**53)
_FIRST_U64 = struct.Struct(">Q").unpack_from

# routing_source / rebind_reason values of ledger-v1 (replaylab.contracts.enums; the
# runtime does not import the contracts package, which needs pandas)
STICKY = "sticky_binding"
CLASSIFIER = "classifier"
HEURISTIC = "heuristic"
FIXED = "fixed"
EXPLORATION = "exploration"
ESCALATION = "escalation"

# reason codes of a rules-fallback binding
NOT_LOADED = "router_not_loaded"
RATE_ABOVE_CAP = "rate_above_cap"
BAD_RATE = "bad_rate"
UNKNOWN_CANDIDATE = "unknown_candidate"


def exploration_draw(salt: str, session_id: str) -> float:
    """u(s) in [0, 1) on a 2^-53 grid: SHA-256 of salt, 0x1f, session id (UTF-8); the
    first 8 bytes big-endian, top 53 bits. The same on every process and machine."""
    return _draw(salt.encode() + SEPARATOR, session_id)


def _draw(prefix: bytes, session_id: str) -> float:
    return (_FIRST_U64(hashlib.sha256(prefix + session_id.encode()).digest())[0] >> 11) \
        / _TWO_POW_53


def explored_index(u: float, rate: float, k: int) -> int | None:
    """Index among the K - 1 other candidates of an explored session, None when not
    explored (u >= rate, rate <= 0 or K < 2)."""
    if k < 2 or not rate > 0.0 or not u < rate:
        return None
    return min(math.floor(u / rate * (k - 1)), k - 2)


class BindingReceipt(NamedTuple):
    """One turn's routing receipt (immutable; a NamedTuple because a receipt is made on
    every turn of the hot path). Contract fields (ledger-v1 names) plus what serving may
    log beside them: `reason` (fallback code), `decision` (the router's answer on a
    decided opening), `new_binding`, `turn_index` (of the session, as the binder counts)."""

    selected_model: str
    binding_id: str
    routing_source: str
    propensity: float | None = None  # set on the first turn of a binding only
    rebind_reason: str | None = None
    prompt_embedding: Sequence[float] | None = None
    embedding_model: str | None = None
    reason: str | None = None
    decision: RouteDecision | None = None
    new_binding: bool = False
    turn_index: int = 0

    def as_record(self) -> dict[str, Any]:
        """The ledger-v1 routing columns of this turn (embedding only when logged)."""
        out: dict[str, Any] = {"selected_model": self.selected_model,
                               "binding_id": self.binding_id,
                               "routing_source": self.routing_source,
                               "propensity": self.propensity,
                               "rebind_reason": self.rebind_reason}
        if self.prompt_embedding is not None:
            out["prompt_embedding"] = [float(x) for x in self.prompt_embedding]
            out["embedding_model"] = self.embedding_model
        return out


# every field given, in order: a NamedTuple made without its keyword-parsing __new__
# (~0.15 us a turn on the hot path)
def _receipt(fields: tuple) -> BindingReceipt:
    return tuple.__new__(BindingReceipt, fields)


@dataclass(slots=True)
class _Session:
    rung: int              # position of the current binding's candidate on the ladder
    own: str               # the router's (or rules') opening choice
    binding: int           # number of the current binding (0 = opening)
    prefix: str            # binding id prefix: "<sid>/" or "<sid>/t<turn>/" when re-opened
    turns: int             # turns served
    last: float            # clock of the last turn
    pending: int = 0       # escalation steps reported since the last turn


class SessionBinder:
    """Sticky, session-scoped bindings over a loaded `Router` (module docstring).

    rate: exploration share of new sessions (<= cap, else the rules answer with
    `rate_above_cap`); salt: the deployment's exploration salt (change it to draw new
    sessions); ladder: candidates cheapest first (default: the router's); ttl_s,
    max_sessions: the memory bound; log_embedding: receipts of decided openings carry
    the query's embedding and the encoder id; fallback_candidate: what answers when
    the router did not load (default: the router's own fallback candidate).
    """

    def __init__(self, router: Router, *, rate: float = 0.05, salt: str = "",
                 cap: float = 0.10, ladder: Sequence[str] | None = None,
                 ttl_s: float = 3600.0, max_sessions: int = 100_000,
                 log_embedding: bool = False, fallback_candidate: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_sessions < 1 or not ttl_s > 0:
            raise ValueError(f"SessionBinder: max_sessions={max_sessions} must be >= 1 and "
                             f"ttl_s={ttl_s} > 0")
        self.router = router
        self.rate, self.cap, self.salt = float(rate), float(cap), str(salt)
        self._prefix = self.salt.encode() + SEPARATOR
        self.ttl_s, self.max_sessions = float(ttl_s), int(max_sessions)
        self.log_embedding = bool(log_embedding)
        self._clock = clock
        self.fallback_candidate = fallback_candidate or router.fallback_candidate
        known = tuple(router.candidates) if router.loaded else ()
        self.ladder: tuple[str, ...] = tuple(ladder) if ladder is not None else known
        self.reason: str | None = None  # why every opening takes the rules, if it does
        if not router.loaded:
            self.reason = NOT_LOADED
            if self.fallback_candidate is None:
                raise ValueError("SessionBinder: the router did not load and no "
                                 "fallback_candidate was given (name the strongest model)")
            if not self.ladder:
                self.ladder = (self.fallback_candidate,)
        elif not (0.0 <= self.rate < 1.0) or not (0.0 <= self.cap < 1.0):
            self.reason = BAD_RATE
        elif self.rate > self.cap:
            self.reason = RATE_ABOVE_CAP
        elif set(self.ladder) - set(known) or len(set(self.ladder)) != len(self.ladder) \
                or not self.ladder:
            self.reason = UNKNOWN_CANDIDATE
            self.ladder = known
        self._rung = {c: j for j, c in enumerate(self.ladder)}
        self._others = {c: tuple(o for o in self.ladder if o != c) for c in self.ladder}
        self._k1 = max(len(self.ladder) - 1, 1)
        self._p_own = 1.0 - self.rate
        self._p_other = self.rate / self._k1
        self._explore = self.reason is None and len(self.ladder) >= 2 and self.rate > 0.0
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._counts = {"openings": 0, "explored": 0, "sticky": 0, "escalations": 0,
                        "fallback": 0, "evicted_ttl": 0, "evicted_lru": 0, "reopened": 0,
                        "failures_unknown_session": 0}
        self._fallback_reasons: dict[str, int] = {}

    # ------------------------------------------------------------------ serving
    def bind(self, session_id: str, text: str = "", *, category: str | None = None,
             prompt_tokens: float | None = None, turn_index: int | None = None
             ) -> BindingReceipt:
        """The receipt of this turn of `session_id`: the opening decision on a session's
        first turn, the sticky binding after it, a new binding after an escalation.
        `text`, `category`, `prompt_tokens` are read on an opening turn only."""
        now = self._clock()
        if turn_index is not None and turn_index < 0:  # not a turn: as if not given
            turn_index = None
        sessions = self._sessions
        st = sessions.get(session_id)
        if st is not None and now - st.last > self.ttl_s:
            del sessions[session_id]
            self._counts["evicted_ttl"] += 1
            st = None
        if st is None:
            return self._open(session_id, text, category, prompt_tokens, turn_index, now)
        sessions.move_to_end(session_id)
        st.last = now
        turn = st.turns
        st.turns += 1
        if st.pending:
            st.rung = min(st.rung + st.pending, len(self.ladder) - 1)
            st.pending = 0
            st.binding += 1
            self._counts["escalations"] += 1
            return _receipt((self.ladder[st.rung], f"{st.prefix}b{st.binding}", HEURISTIC,
                             1.0, ESCALATION, None, None, None, None, True, turn))
        self._counts["sticky"] += 1
        return _receipt((self.ladder[st.rung], f"{st.prefix}b{st.binding}", STICKY,
                         None, None, None, None, None, None, False, turn))

    def report_failure(self, session_id: str) -> bool:
        """A turn of `session_id` failed: its next turn escalates one step up the ladder.
        False when the session is unknown (never bound, or dropped) or already on the
        strongest candidate."""
        st = self._sessions.get(session_id)
        if st is None:
            self._counts["failures_unknown_session"] += 1
            return False
        if st.rung + st.pending >= len(self.ladder) - 1:
            return False
        st.pending += 1
        return True

    def router_choice(self, session_id: str) -> str | None:
        """The router's (or the rules') own opening choice for a held session: on an
        explored session, the candidate that had probability 1 - rate."""
        st = self._sessions.get(session_id)
        return None if st is None else st.own

    def propensities(self, own: str) -> dict[str, float]:
        """pi_0(a | s) of an opening whose router choice is `own`: the logging policy."""
        k = len(self.ladder)
        if not self._explore:
            return {c: float(c == own) for c in self.ladder}
        return {c: (1.0 - self.rate) if c == own else self.rate / (k - 1) for c in self.ladder}

    def stats(self) -> dict[str, Any]:
        """Counts since construction, the configuration and the fallback reasons."""
        return {**self._counts, "held": len(self._sessions), "rate": self.rate,
                "cap": self.cap, "salt_set": bool(self.salt), "ladder": list(self.ladder),
                "exploring": self._explore, "reason": self.reason,
                "fallback_reasons": dict(self._fallback_reasons), "spec": SPEC_VERSION,
                "max_sessions": self.max_sessions, "ttl_s": self.ttl_s}

    # ------------------------------------------------------------------ internals
    def _open(self, sid: str, text: str, category: str | None, tokens: float | None,
              turn_index: int | None, now: float) -> BindingReceipt:
        # the hot path of an opening turn: locals, positional tuples, no helper calls
        # (`exploration_draw` / `explored_index` are the same arithmetic, for readers)
        counts = self._counts
        reopened = turn_index is not None and turn_index > 0
        prefix = f"{sid}/t{turn_index}/" if reopened else f"{sid}/"
        decision: RouteDecision | None = None
        reason = self.reason
        rung = self._rung
        if reason is None:
            decision = self.router.route(text, category, tokens,
                                         keep_embedding=self.log_embedding)
            own = decision.candidate
            if own not in rung:
                own, reason = self._rules(text, category, tokens), UNKNOWN_CANDIDATE
        else:
            own = self._rules(text, category, tokens)
        # the model failed on this query and the artifact's rules chose: still the logging
        # policy's choice (explored as any other), logged as a heuristic one
        source = HEURISTIC if decision is not None and decision.fallback else CLASSIFIER
        propensity, chosen = 1.0, own
        if reason is not None:
            source = HEURISTIC if self.router.loaded else FIXED
            counts["fallback"] += 1
            self._fallback_reasons[reason] = self._fallback_reasons.get(reason, 0) + 1
        elif self._explore:
            rate = self.rate
            u = (_FIRST_U64(hashlib.sha256(self._prefix + sid.encode()).digest())[0] >> 11) \
                / _TWO_POW_53
            if u < rate:
                k1 = self._k1
                chosen = self._others[own][min(int(u / rate * k1), k1 - 1)]
                source, propensity = EXPLORATION, self._p_other
                counts["explored"] += 1
            else:
                propensity = self._p_own
        counts["openings"] += 1
        if reopened:
            counts["reopened"] += 1
        sessions = self._sessions
        ttl = self.ttl_s
        while sessions:  # the least recently used first: drop the idle ones at the front
            if now - next(iter(sessions.values())).last <= ttl:
                break
            sessions.popitem(last=False)
            counts["evicted_ttl"] += 1
        sessions[sid] = _Session(rung[chosen], own, 0, prefix,
                                 1 if turn_index is None else turn_index + 1, now)
        if len(sessions) > self.max_sessions:
            sessions.popitem(last=False)
            counts["evicted_lru"] += 1
        emb = None if decision is None else decision.embedding
        return _receipt((chosen, prefix + "b0", source, propensity, None, emb,
                         None if emb is None else self.router.encoder.encoder_id,
                         reason or (decision.reason if decision is not None else None),
                         decision, True, 0 if turn_index is None else turn_index))

    def _rules(self, text: str, category: str | None, tokens: float | None) -> str:
        """The rules' choice, kept on the ladder: the artifact's scenario rules when it
        loaded, else (or when they name a candidate off the ladder) the fallback candidate,
        else the strongest on the ladder."""
        if self.router.loaded:
            cand = self.router.route_by_rules(text, category, tokens).candidate
            if cand in self._rung:
                return cand
        fb = self.fallback_candidate
        return fb if fb in self._rung else self.ladder[-1]


def replay_events(binder: SessionBinder, events: Iterable[dict[str, Any]],
                  clock: Any) -> list[dict[str, Any]]:
    """Run the binder's event format (docs/specs/binder.md; the Rust crate's `replaylab-route
    bind`) through `binder`, in order; one record per event, the records the crate writes
    (as dicts: `canonical_json` of each is its line, byte for byte).

    `clock` is the object the binder's clock reads, its `now` attribute (build the binder
    with `clock=lambda: clock.now`): each event's `now`, when given, is written to it before
    the call, else the last one stays (start it at 0.0, as the crate does). Events:
    `{"op": "bind", "session_id", "text"?, "category"?, "prompt_tokens"?, "turn_index"?,
    "now"?}` -> the receipt (ledger-v1 fields, `reason`, the router's `candidate` on a
    decided opening, `new_binding`, `turn_index`); `{"op": "fail", "session_id", "now"?}`
    -> `escalated` (`report_failure`); `{"op": "stats"}` -> the counts and `held`."""
    out: list[dict[str, Any]] = []
    for ev in events:
        op = ev["op"]
        if ev.get("now") is not None:
            clock.now = float(ev["now"])
        if op == "bind":
            sid = ev["session_id"]
            r = binder.bind(sid, ev.get("text", ""), category=ev.get("category"),
                            prompt_tokens=ev.get("prompt_tokens"), turn_index=ev.get("turn_index"))
            out.append({"op": "bind", "session_id": sid, **r.as_record(), "reason": r.reason,
                        "candidate": None if r.decision is None else r.decision.candidate,
                        "new_binding": r.new_binding, "turn_index": r.turn_index})
            out[-1].pop("prompt_embedding", None)
            out[-1].pop("embedding_model", None)
        elif op == "fail":
            out.append({"op": "fail", "session_id": ev["session_id"],
                        "escalated": binder.report_failure(ev["session_id"])})
        elif op == "stats":
            s = binder.stats()
            out.append({"op": "stats", **{k: s[k] for k in (
                "openings", "explored", "sticky", "escalations", "fallback", "evicted_ttl",
                "evicted_lru", "reopened", "failures_unknown_session", "held", "reason",
                "exploring", "ladder", "fallback_reasons")}})
        else:
            raise ValueError(f"replay_events: unknown op {op!r} (bind | fail | stats)")
    return out
