"""Receipts: what production would log, simulated from full-information outcomes.

Method. Each prompt i of an OutcomeMatrix opens `sessions_per_prompt` sessions s
of T_s ~ min(Geometric(1 / mean_turns), max_turns) turns. The logging policy
binds the session ONCE, at its first turn, with the scenario-rules choice r(i)
except in a fraction `rate` = eps of new sessions, which bind to another candidate
drawn uniformly among the K - 1 the rules did not choose. The logged propensity of
the opening binding is therefore the exact probability of the bound candidate:

    pi_0(a | i) = 1 - eps            if a = r(i)
                = eps / (K - 1)      otherwise,           sum_a pi_0(a | i) = 1,

with eps <= cap (RouterExplorationConfig refuses more). The binding never changes
per turn; only a failure rebinds: after a failed turn the session moves to the
next stronger candidate of the ladder for the remaining turns (rebind_reason =
escalation, routing_source = heuristic, propensity 1: deterministic given the
failure). The strongest candidate has nowhere to go and keeps the session.

Turn outcomes. The table holds one label per (prompt, candidate); every turn of
session s served by candidate a carries that label (the follow-ups are about the
same task) and that call's cost (measured, priced or per-call: replay.py). Only
the served candidate's outcome reaches the ledger; `SessionTruth` keeps what every
opening candidate would have produced (quality of the opening answer, session
cost and quality with escalation) for checking off-policy estimates.

The ledger is ledger-v1 (routing columns binding_id, routing_source,
rebind_reason, propensity, outcome_status, outcome_score, actual_cost) plus the
extra columns prompt_id and task; it is validated before it is returned and
holds no prompt text. `bandit_rows` turns any receipts ledger, simulated or real,
into one row per binding: (context key, action, reward, propensity, cost, session).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from replaylab.contracts import (
    LEDGER_SCHEMA,
    LEDGER_VERSION,
    ValidationResult,
    has_values,
    validate_ledger,
)
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.columns import Outcomes as O
from replaylab.contracts.enums import LifecycleState, OutcomeStatus, RebindReason, RoutingSource
from replaylab.router.config import RouterExplorationConfig
from replaylab.router.replay import Label, OutcomeMatrix
from replaylab.router.rules import ScenarioRules

CURRENCY = "USD"


@dataclass(frozen=True)
class SessionTruth:
    """Counterfactual outcome of every session under every opening candidate.

    session_id, prompt_row, turns: (S,); the rest (S, K) over `candidates`:
    opening_quality = r(i, a); session_cost = USD over all turns with escalation;
    session_quality = mean turn quality; escalations = rebinds in the session.
    """

    candidates: tuple[str, ...]
    session_id: np.ndarray
    prompt_row: np.ndarray
    turns: np.ndarray
    opening_quality: np.ndarray
    session_cost: np.ndarray
    session_quality: np.ndarray
    escalations: np.ndarray


@dataclass(frozen=True)
class ReceiptsSimulation:
    """The receipts ledger (validated ledger-v1), the counterfactual truth and the counts.

    logging_probs: (S, K) pi_0(a | session) of the opening binding, rows sum to 1.
    opening: (S,) column index of the logged opening candidate.
    """

    ledger: pd.DataFrame
    truth: SessionTruth
    logging_probs: np.ndarray
    opening: np.ndarray
    stats: dict


def ladder(matrix: OutcomeMatrix, config: RouterExplorationConfig) -> tuple[np.ndarray, str]:
    """Column indices weakest -> strongest, and where the order came from."""
    if config.ladder:
        missing = sorted(set(matrix.candidates) - set(config.ladder))
        extra = sorted(set(config.ladder) - set(matrix.candidates))
        if missing or extra:
            raise ValueError(f"RouterExplorationConfig.ladder={list(config.ladder)}: must list the "
                             f"table's candidates exactly (missing {missing}, unknown {extra})")
        return np.array([matrix.index(c) for c in config.ladder]), "configured"
    mean = matrix.score.mean(axis=0)
    return np.lexsort((matrix.cost.mean(axis=0), mean)), "fitted: mean score on the given table"


def _rollout(matrix: OutcomeMatrix, rows: np.ndarray, opening: np.ndarray, turns: np.ndarray,
             next_of: np.ndarray, escalation: bool) -> dict[str, np.ndarray]:
    """Serve sessions turn by turn: (S, T) served candidate, quality, success, cost, rebind."""
    s, t_max = len(rows), int(turns.max()) if len(turns) else 0
    out = {k: np.zeros((s, t_max), dtype=d) for k, d in (
        ("served", np.int64), ("quality", float), ("success", bool), ("cost", float),
        ("rebind", bool))}
    current = opening.copy()
    for t in range(t_max):
        out["served"][:, t] = current
        out["quality"][:, t] = matrix.score[rows, current]
        ok = matrix.success[rows, current]
        out["success"][:, t] = ok
        out["cost"][:, t] = matrix.cost[rows, current]
        if t > 0:
            out["rebind"][:, t] = current != out["served"][:, t - 1]
        if escalation:
            current = np.where(ok, current, next_of[current])
    out["active"] = np.arange(t_max)[None, :] < turns[:, None]
    return out


def _truth(matrix: OutcomeMatrix, rows: np.ndarray, turns: np.ndarray, next_of: np.ndarray,
           escalation: bool, session_id: np.ndarray) -> SessionTruth:
    k = len(matrix.candidates)
    cost, quality, esc = (np.zeros((len(rows), k)) for _ in range(3))
    for a in range(k):
        r = _rollout(matrix, rows, np.full(len(rows), a), turns, next_of, escalation)
        cost[:, a] = (r["cost"] * r["active"]).sum(axis=1)
        quality[:, a] = (r["quality"] * r["active"]).sum(axis=1) / turns
        esc[:, a] = (r["rebind"] & r["active"]).sum(axis=1)
    return SessionTruth(matrix.candidates, session_id, rows, turns, matrix.score[rows].copy(),
                        cost, quality, esc)


def _ledger_frame(matrix: OutcomeMatrix, sim: dict[str, np.ndarray], session_id: np.ndarray,
                  rows: np.ndarray, opens_ms: np.ndarray, offsets_ms: np.ndarray,
                  explored: np.ndarray, propensity: np.ndarray, decision: np.ndarray) -> pd.DataFrame:
    s_idx, t_idx = np.nonzero(sim["active"])  # row-major: session by session, turn by turn
    served = sim["served"][s_idx, t_idx]
    rebind = sim["rebind"][s_idx, t_idx]
    first = t_idx == 0
    n_binding = np.cumsum(sim["rebind"], axis=1)[s_idx, t_idx]
    sid = session_id[s_idx].astype(str)
    tokens = {c: getattr(matrix, c)[rows[s_idx], served] for c in (L.PROMPT_TOKENS,
                                                                    L.COMPLETION_TOKENS)}
    source = np.where(first, np.where(explored[s_idx], RoutingSource.EXPLORATION,
                                      RoutingSource.HEURISTIC),
                      np.where(rebind, RoutingSource.HEURISTIC, RoutingSource.STICKY_BINDING))
    ok = sim["success"][s_idx, t_idx]
    # decision of the binding: the opening decision, or "escalation" once rebound
    binding_decision = np.where(n_binding > 0, "escalation", decision[s_idx])
    return pd.DataFrame({
        L.VERSION: LEDGER_VERSION,
        L.REQUEST_ID: np.char.add(np.char.add(sid, "/t"), t_idx.astype(str)),
        L.SESSION_ID: sid,
        L.TURN_INDEX: t_idx.astype(np.int64),
        L.TIMESTAMP: (opens_ms[s_idx] + offsets_ms[s_idx, t_idx]).astype(np.int64),
        L.PROMPT_TOKENS: pd.array(np.round(tokens[L.PROMPT_TOKENS]), dtype="Int64"),
        L.COMPLETION_TOKENS: pd.array(np.round(tokens[L.COMPLETION_TOKENS]), dtype="Int64"),
        L.LIFECYCLE_STATE: LifecycleState.COMPLETED,
        L.SELECTED_MODEL: np.asarray(matrix.candidates, dtype=object)[served],
        L.DECISION: binding_decision,
        L.ACTUAL_COST: sim["cost"][s_idx, t_idx],
        L.CURRENCY: CURRENCY,
        L.ROUTING_SOURCE: source,
        L.BINDING_ID: np.char.add(np.char.add(sid, "/b"), n_binding.astype(str)),
        L.REBIND_REASON: np.where(rebind, RebindReason.ESCALATION, None),
        L.PROPENSITY: np.where(first, propensity[s_idx], np.where(rebind, 1.0, np.nan)),
        L.OUTCOME_STATUS: np.where(ok, OutcomeStatus.SUCCESS, OutcomeStatus.FAILURE),
        L.OUTCOME_SCORE: sim["quality"][s_idx, t_idx],
        O.PROMPT_ID: matrix.prompt_ids[rows[s_idx]],
        O.TASK: matrix.meta[O.TASK].to_numpy()[rows[s_idx]],
    })


def simulate_receipts(matrix: OutcomeMatrix, rules: ScenarioRules,
                      config: RouterExplorationConfig | None = None) -> ReceiptsSimulation:
    """Simulate the receipts ledger of the rules policy with session-scoped exploration.

    matrix: the prompts that open sessions (full information); rules: fitted
    ScenarioRules (the logging policy). Seeded by `config.seed`: the same inputs
    give the same ledger.
    """
    config = config or RouterExplorationConfig()
    k, eps = len(matrix.candidates), float(config.rate)
    order, ladder_source = ladder(matrix, config)
    next_of = np.arange(k)
    next_of[order[:-1]] = order[1:]  # the strongest maps to itself
    rng = np.random.default_rng(config.seed)
    rows = np.repeat(np.arange(matrix.n_prompts), config.sessions_per_prompt)
    n = len(rows)
    reps = np.tile(np.arange(config.sessions_per_prompt), matrix.n_prompts)
    session_id = np.char.add(np.char.add(matrix.prompt_ids[rows].astype(str), "#"), reps.astype(str))
    turns = np.minimum(rng.geometric(1.0 / config.mean_turns, size=n), config.max_turns)
    explored = rng.random(n) < eps
    other = rng.integers(0, k - 1, size=n)
    opens_ms = config.start_ms + np.cumsum(
        np.round(rng.exponential(config.mean_session_gap_s * 1000.0, size=n))).astype(np.int64)
    think = np.round(rng.exponential(config.mean_think_s * 1000.0, size=(n, config.max_turns)))
    offsets_ms = np.cumsum(think, axis=1) - think[:, :1]  # turn 0 at the session opening

    choice, decision = rules.decide(matrix.meta)
    rule_idx = np.array([matrix.index(c) for c in choice], dtype=np.int64)[rows]
    opening = np.where(explored, other + (other >= rule_idx), rule_idx)
    probs = np.full((n, k), eps / (k - 1))
    probs[np.arange(n), rule_idx] = 1.0 - eps
    propensity = probs[np.arange(n), opening]
    decision = np.where(explored, "exploration", decision[rows])

    sim = _rollout(matrix, rows, opening, turns, next_of, config.escalation)
    frame = _ledger_frame(matrix, sim, session_id, rows, opens_ms, offsets_ms, explored,
                          propensity, decision)
    checked = validate_ledger(frame, source="simulate_receipts")
    if checked.rows_quarantined:
        raise RuntimeError(f"simulated ledger failed ledger-v1: {checked.by_reason()}")
    truth = _truth(matrix, rows, turns, next_of, config.escalation, session_id)
    ledger = checked.valid
    stats = {
        "prompts": matrix.n_prompts, "sessions": n, "turns": len(ledger),
        "mean_turns": float(turns.mean()), "candidates": list(matrix.candidates),
        "ladder": [matrix.candidates[i] for i in order], "ladder_source": ladder_source,
        "exploration_rate": eps, "exploration_sessions": int(explored.sum()),
        "exploration_share": float(explored.mean()) if n else 0.0,
        "escalations": int((ledger[L.REBIND_REASON] == RebindReason.ESCALATION).sum()),
        "sessions_escalated": int((sim["rebind"] & sim["active"]).any(axis=1).sum()),
        "opening_by_candidate": dict(zip(matrix.candidates,
                                         np.bincount(opening, minlength=k).tolist(), strict=True)),
        "propensities": {f"{p:.6g}": int(c) for p, c in zip(*np.unique(propensity,
                                                                       return_counts=True),
                                                                   strict=True)},
        "logged_opening_quality": float(truth.opening_quality[np.arange(n), opening].mean()),
        "logged_cost_usd": float(ledger[L.ACTUAL_COST].sum()),
        "rows_quarantined": checked.rows_quarantined,
    }
    return ReceiptsSimulation(ledger, truth, probs, opening, stats)


def _turn_quality(frame: pd.DataFrame) -> pd.Series:
    """outcome_score where known, else 1 / 0 from outcome_status; NaN when neither says."""
    status = LEDGER_SCHEMA.column(frame, L.OUTCOME_STATUS)
    from_status = status.map({OutcomeStatus.SUCCESS: 1.0,
                              OutcomeStatus.FAILURE: 0.0}).astype("float64")
    score = pd.to_numeric(LEDGER_SCHEMA.column(frame, L.OUTCOME_SCORE), errors="coerce")
    return score.astype("float64").fillna(from_status)


def _require(frame: pd.DataFrame) -> None:
    need = [L.BINDING_ID, L.PROPENSITY, L.SELECTED_MODEL]
    missing = [c for c in need if c not in frame.columns]
    if not (has_values(frame, L.OUTCOME_SCORE) or has_values(frame, L.OUTCOME_STATUS)):
        missing.append(f"{L.OUTCOME_SCORE} or {L.OUTCOME_STATUS}")  # absent or all null
    if missing:
        raise ValueError(f"bandit_rows: the ledger lacks routing column(s) {', '.join(missing)}: "
                         "it is not a receipts ledger")
    if frame[L.BINDING_ID].isna().any():
        raise ValueError(f"bandit_rows: {int(frame[L.BINDING_ID].isna().sum())} rows have no "
                         f"{L.BINDING_ID}")


def bandit_rows(ledger: pd.DataFrame, *, validated: bool = False) -> pd.DataFrame:
    """Receipts ledger (ledger-v1 with routing columns) -> one bandit row per binding.

    The ledger is validated (quarantined rows are counted in
    `attrs["label_report"]` and not used). Columns: Label.* (session_id,
    binding_id, context_key, candidate, reward, success, cost, propensity,
    label_source, policy_decision, binding_turns, binding_cost, session_cost) plus
    prompt_id / task / prompt_tokens / prompt_embedding / embedding_model when
    present; never prompt_text. A binding opened by the logging policy (every
    binding but escalations) must carry its propensity in (0, 1] on its first
    turn: a missing one is refused with the count and examples. validated: `ledger` is
    already the valid part of `validate_ledger` (not validated again; counts as read).
    """
    checked = (ValidationResult("ledger", ledger, ledger.iloc[:0], len(ledger)) if validated
               else validate_ledger(ledger, source="bandit_rows"))
    frame = checked.valid
    _require(frame)
    frame = frame.sort_values([L.SESSION_ID, L.TURN_INDEX], kind="stable")
    cost = LEDGER_SCHEMA.column(frame, L.ACTUAL_COST)
    frame = frame.assign(_q=_turn_quality(frame), _c=pd.to_numeric(cost, errors="coerce"))
    per_binding = frame.groupby(L.BINDING_ID, sort=False)
    if (per_binding[L.SELECTED_MODEL].nunique() > 1).any() or (
            per_binding[L.SESSION_ID].nunique() > 1).any():
        raise ValueError("bandit_rows: a binding_id spans several models or sessions")
    first = frame.drop_duplicates(L.BINDING_ID, keep="first").reset_index(drop=True)
    reason = LEDGER_SCHEMA.column(first, L.REBIND_REASON)
    decision = (reason != RebindReason.ESCALATION).to_numpy()
    prop = pd.to_numeric(first[L.PROPENSITY], errors="coerce")
    bad = decision & ~(prop.gt(0) & prop.le(1)).to_numpy()
    if bad.any():
        ids = first.loc[bad, L.BINDING_ID].head(3).tolist()
        raise ValueError(f"bandit_rows: {int(bad.sum())} binding(s) chosen by the logging policy "
                         f"have no propensity in (0, 1] on their first turn (e.g. {ids}); "
                         "off-policy estimates need the logged probability of every choice")
    binding_cost = frame.groupby(L.BINDING_ID, sort=False)["_c"].sum(min_count=1)
    session_cost = frame.groupby(L.SESSION_ID, sort=False)["_c"].sum(min_count=1)
    source = LEDGER_SCHEMA.column(first, L.ROUTING_SOURCE)
    has_pid = O.PROMPT_ID in first and first[O.PROMPT_ID].notna().all()
    status = LEDGER_SCHEMA.column(first, L.OUTCOME_STATUS)
    out = pd.DataFrame({
        Label.SESSION_ID: first[L.SESSION_ID], Label.BINDING_ID: first[L.BINDING_ID],
        Label.CONTEXT_KEY: first[O.PROMPT_ID] if has_pid else first[L.REQUEST_ID],
        Label.CANDIDATE: first[L.SELECTED_MODEL], Label.REWARD: first["_q"],
        Label.SUCCESS: status.map({OutcomeStatus.SUCCESS: True,
                                   OutcomeStatus.FAILURE: False}).astype("boolean"),
        Label.COST: first["_c"],
        Label.PROPENSITY: prop,
        Label.LABEL_SOURCE: np.where(source == RoutingSource.EXPLORATION, "exploration", "logged"),
        Label.POLICY_DECISION: decision,
        Label.BINDING_TURNS: per_binding.size().reindex(first[L.BINDING_ID]).to_numpy(),
        Label.BINDING_COST: binding_cost.reindex(first[L.BINDING_ID]).to_numpy(),
        Label.SESSION_COST: session_cost.reindex(first[L.SESSION_ID]).to_numpy(),
    })
    for col in (O.PROMPT_ID, O.TASK, L.CATEGORY, L.PROMPT_TOKENS, L.TIMESTAMP,
                L.PROMPT_EMBEDDING, L.EMBEDDING_MODEL):
        if has_values(first, col):  # an all-null column is not carried: absent is the same
            out[col] = first[col].to_numpy()
    out.attrs["label_report"] = {
        "rows_read": checked.rows_read, "rows_quarantined": checked.rows_quarantined,
        "quarantine_by_reason": checked.by_reason(), "bindings": len(out),
        "policy_decisions": int(decision.sum()), "escalations": int((~decision).sum()),
        "exploration": int((out[Label.LABEL_SOURCE] == "exploration").sum()),
        "no_outcome": int(out[Label.REWARD].isna().sum()),
        "context_key": O.PROMPT_ID if has_pid else L.REQUEST_ID,
    }
    return out


def deployment_ledger(sim: ReceiptsSimulation, texts: dict[str, str]) -> pd.DataFrame:
    """The simulated receipts as a deployment would write them: `category` (the task),
    `prompt_text` on opening turns only, and no `prompt_id` / `task` columns (a deployment
    knows no benchmark ids; replays join on the opening turn's request_id). texts:
    prompt_id -> text of the matrix's prompts."""
    led = sim.ledger.copy()
    opening = led[L.TURN_INDEX].to_numpy() == 0
    led[L.CATEGORY] = led[O.TASK].astype(str)
    led[L.PROMPT_TEXT] = np.where(opening, led[O.PROMPT_ID].map(texts).to_numpy(dtype=object),
                                  None)
    return led.drop(columns=[O.PROMPT_ID, O.TASK])


def replay_outcomes(sim: ReceiptsSimulation, matrix: OutcomeMatrix, texts: dict[str, str],
                    share: float, seed: int, sessions: np.ndarray | None = None) -> pd.DataFrame:
    """Offline replays of a seeded `share` of the logged opening prompts against every
    candidate not logged for them, as outcomes-v1 rows (`prompt_id` = the opening turn's
    request_id, the receipts-mode join key; the text and task as the user's replay
    harness would record them). sessions: restrict to these session ids."""
    led = sim.ledger
    first = led[led[L.TURN_INDEX] == 0]
    if sessions is not None:
        first = first[first[L.SESSION_ID].isin(set(map(str, sessions)))]
    rng = np.random.default_rng(seed)
    pick = first.iloc[np.sort(rng.choice(len(first), size=int(round(share * len(first))),
                                         replace=False))] if len(first) else first
    row_of = pd.Series(sim.truth.prompt_row, index=sim.truth.session_id.astype(str))
    out = []
    for rid, sid, logged in zip(pick[L.REQUEST_ID], pick[L.SESSION_ID], pick[L.SELECTED_MODEL],
                                strict=True):
        i = int(row_of[str(sid)])
        pid = matrix.prompt_ids[i]
        for k, cand in enumerate(matrix.candidates):
            if cand == logged:
                continue
            out.append({O.VERSION: "1", O.PROMPT_ID: str(rid), O.PROMPT_TEXT: texts.get(pid, ""),
                        O.TASK: str(matrix.meta[O.TASK].iat[i]), O.CANDIDATE: cand, O.SCORE: float(matrix.score[i, k]),
                        O.SUCCESS: bool(matrix.success[i, k]), O.COST: float(matrix.cost[i, k])})
    return pd.DataFrame(out, columns=[O.VERSION, O.PROMPT_ID, O.PROMPT_TEXT, O.TASK, O.CANDIDATE,
                                      O.SCORE, O.SUCCESS, O.COST])


def policy_truth(sim: ReceiptsSimulation, matrix: OutcomeMatrix, session_ids: np.ndarray,
                 choice: np.ndarray) -> dict:
    """The true opening-turn value of a deterministic policy on some simulated sessions,
    beside the logging policy's expected value, from the full table (`sim.truth`).

    session_ids: (n,) ids of the sessions; choice: (n,) column the policy opens them with.
    Returns quality and cost per opening call of the policy and of the logging policy
    (sum_a pi_0(a | s) value(s, a)) and their differences policy - logging."""
    pos = pd.Series(np.arange(len(sim.truth.session_id)),
                    index=sim.truth.session_id.astype(str)).reindex(
        np.asarray(session_ids, dtype=str)).to_numpy()
    if np.isnan(pos.astype(float)).any():
        raise ValueError("policy_truth: some session ids are not in the simulation")
    pos = pos.astype(np.int64)
    rows = sim.truth.prompt_row[pos]
    q, c = matrix.score[rows], matrix.cost[rows]
    p0 = sim.logging_probs[pos]
    ch = np.asarray(choice, np.int64)
    at = np.arange(len(pos))
    out = {"quality": float(q[at, ch].mean()), "cost": float(c[at, ch].mean()),
           "logging_quality": float((p0 * q).sum(axis=1).mean()),
           "logging_cost": float((p0 * c).sum(axis=1).mean()), "sessions": int(len(pos))}
    out["diff_quality"] = out["quality"] - out["logging_quality"]
    out["diff_cost"] = out["cost"] - out["logging_cost"]
    return out


def serve_sessions(binder: Any, matrix: OutcomeMatrix, texts: dict[str, str], *,
                   sessions: int, seed: int, start_ms: int, mean_turns: float = 3.0,
                   max_turns: int = 8, mean_session_gap_s: float = 30.0,
                   mean_think_s: float = 20.0, session_prefix: str = "r1-",
                   prompt_rows: np.ndarray | None = None) -> ReceiptsSimulation:
    """New traffic through a served session binder (`replaylab.runtime.SessionBinder`),
    with outcomes read from the full table: the receipts a deployment of the binder writes.

    Each new session opens on a prompt drawn uniformly from `matrix` (with replacement);
    every turn asks the binder (`bind`: opening decision, then sticky), the served
    candidate's outcome and cost come from the table (as in `simulate_receipts`), and a
    failed turn is reported (`report_failure`: the binder escalates). The ledger rows carry
    the binder's receipt fields under their contract names, `category` (the task) and
    `prompt_text` on opening turns. The truth keeps what every opening candidate would have
    produced, and `logging_probs` the binder's exact opening policy (its router's choice
    with 1 - rate, each other candidate rate / (K - 1); from the receipts' propensities).
    prompt_rows: (sessions,) the matrix rows that open the sessions, when the caller drew
    them (an A/B arm of a random split of new sessions); None: drawn here.
    """
    rng = np.random.default_rng(seed)
    k = len(matrix.candidates)
    col = {c: j for j, c in enumerate(matrix.candidates)}
    rows = rng.integers(0, matrix.n_prompts, size=sessions)
    if prompt_rows is not None:
        rows = np.asarray(prompt_rows, dtype=np.int64)
        if rows.shape != (sessions,):
            raise ValueError(f"serve_sessions: prompt_rows has shape {rows.shape}, "
                             f"expected ({sessions},)")
    turns = np.minimum(rng.geometric(1.0 / mean_turns, size=sessions), max_turns)
    opens = start_ms + np.cumsum(np.round(rng.exponential(mean_session_gap_s * 1000.0,
                                                          size=sessions))).astype(np.int64)
    think = np.round(rng.exponential(mean_think_s * 1000.0, size=(sessions, max_turns)))
    offsets = (np.cumsum(think, axis=1) - think[:, :1]).astype(np.int64)
    task = matrix.meta[O.TASK].astype(str).to_numpy()
    length = matrix.meta[Label.PROMPT_LENGTH].to_numpy(float)
    records, opening = [], np.zeros(sessions, np.int64)
    probs = np.zeros((sessions, k))
    sid = np.array([f"{session_prefix}{seed}-{s}" for s in range(sessions)], dtype=object)
    for s in range(sessions):
        i = int(rows[s])
        text = texts.get(matrix.prompt_ids[i], "")
        for t in range(int(turns[s])):
            r = binder.bind(sid[s], text, category=task[i], prompt_tokens=float(length[i]))
            a = col[r.selected_model]
            if t == 0:
                opening[s] = a
                p = float(r.propensity)
                explored = r.routing_source == RoutingSource.EXPLORATION
                probs[s] = (1.0 - p) / max(k - 1, 1) if not explored else p
                probs[s, a] = p
                if explored:  # the router's own choice had the rest: 1 - (K - 1) p
                    own = col[binder.router_choice(sid[s])]
                    probs[s, own] = 1.0 - (k - 1) * p
            ok = bool(matrix.success[i, a])
            records.append({
                L.VERSION: LEDGER_VERSION, L.REQUEST_ID: f"{sid[s]}/t{t}", L.SESSION_ID: sid[s],
                L.TURN_INDEX: t, L.TIMESTAMP: int(opens[s] + offsets[s, t]),
                L.PROMPT_TOKENS: int(round(matrix.prompt_tokens[i, a]))
                if np.isfinite(matrix.prompt_tokens[i, a]) else None,
                L.COMPLETION_TOKENS: int(round(matrix.completion_tokens[i, a]))
                if np.isfinite(matrix.completion_tokens[i, a]) else None,
                L.LIFECYCLE_STATE: LifecycleState.COMPLETED, L.ACTUAL_COST: float(matrix.cost[i, a]),
                L.CURRENCY: CURRENCY, L.CATEGORY: task[i],
                L.OUTCOME_STATUS: OutcomeStatus.SUCCESS if ok else OutcomeStatus.FAILURE,
                L.OUTCOME_SCORE: float(matrix.score[i, a]),
                L.PROMPT_TEXT: text if t == 0 else None, **r.as_record()})
            if not ok:
                binder.report_failure(sid[s])
    frame = pd.DataFrame(records)
    checked = validate_ledger(frame, source="serve_sessions")
    if checked.rows_quarantined:
        raise RuntimeError(f"served receipts failed ledger-v1: {checked.by_reason()}")
    order = np.array([col[c] for c in getattr(binder, "ladder", matrix.candidates)])
    next_of = np.arange(k)
    next_of[order[:-1]] = order[1:]
    truth = _truth(matrix, rows, turns, next_of, True, sid.astype(str))
    stats = {"sessions": sessions, "turns": len(frame), "prompts": matrix.n_prompts,
             "exploration_sessions": int((frame[L.TURN_INDEX].eq(0)
                                          & frame[L.ROUTING_SOURCE].eq(RoutingSource.EXPLORATION)
                                          ).sum()),
             "binder": binder.stats() if hasattr(binder, "stats") else None}
    return ReceiptsSimulation(checked.valid, truth, probs, opening, stats)
