"""The synthetic ledger's drawn arrays, their integer codes, and their ledger-v1 columns.

sources/synthetic.py draws a ledger stage by stage (sessions, row layout, tokens,
routing, timing) into the typed arrays declared here; `assemble_frame` turns them
into ledger-v1 columns. Enum columns are drawn as int64 codes into the name tables
below, whose values come from contracts.enums. Imports go one way: synthetic.py
imports this module, never the reverse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.enums import (
    FinishReason,
    LifecycleState,
    OutcomeStatus,
    RebindReason,
    RoutingSource,
)
from replaylab.contracts.ledger import LEDGER_VERSION
from replaylab.sources import synthetic_params as P
from replaylab.sources.synthetic_config import SyntheticLedgerConfig

# Lifecycle codes: positions in LifecycleState.ALL (0 = completed, ...).
COMPLETED, ABORTED, FAILED, UNKNOWN = (LifecycleState.ALL.index(v) for v in (
    LifecycleState.COMPLETED, LifecycleState.ABORTED, LifecycleState.FAILED,
    LifecycleState.UNKNOWN))
# Routing source codes: positions in ROUTING_SOURCES.
ROUTING_SOURCES = (RoutingSource.STICKY_BINDING, RoutingSource.CLASSIFIER,
                   RoutingSource.EXPLORATION, RoutingSource.FIXED, RoutingSource.HEURISTIC)
STICKY, CLASSIFIED, EXPLORED, FIXED, HEURISTIC = range(len(ROUTING_SOURCES))
# Outcome status codes: positions in OutcomeStatus.ALL (0 = success, ...).
SUCCESS, FAILURE, CANCELLED, STATUS_UNKNOWN = (OutcomeStatus.ALL.index(v) for v in (
    OutcomeStatus.SUCCESS, OutcomeStatus.FAILURE, OutcomeStatus.CANCELLED,
    OutcomeStatus.UNKNOWN))

_DECISIONS = {"chat": "general_chat", "code": "code_generation", "rag": "document_qa",
              "math": "math_reasoning"}
# finish_reason and terminal_reason by lifecycle code, then (code 4) the cap / a deadline
_FINISH = (FinishReason.STOP, FinishReason.CANCELLED, FinishReason.ERROR, FinishReason.UNKNOWN,
           FinishReason.LENGTH)
_CAPPED = len(_FINISH) - 1
_TERMINAL = ("response_complete", "client_canceled", "upstream_error_response", None,
             "deadline_exceeded")
_DEADLINE = len(_TERMINAL) - 1


@dataclass(frozen=True)
class SessionDraws:
    """Per-session attributes, arrays (S,): indices into the config's lists."""

    turns: np.ndarray  # int64, turns of the session
    cat: np.ndarray  # into cfg.categories
    slo: np.ndarray  # into cfg.slo_classes
    region: np.ndarray  # into cfg.regions
    stream: np.ndarray  # bool
    cap: np.ndarray  # max_tokens, -1 = none
    asked: np.ndarray  # into cfg.models; -1 = the client asks "auto"


@dataclass(frozen=True)
class SessionRows:
    """Row layout, sessions contiguous: int64 arrays."""

    sess: np.ndarray  # (n,) session of each row
    turn: np.ndarray  # (n,) turn index within the session
    first_row: np.ndarray  # (n,) row of the session's turn 0
    first: np.ndarray  # (S,) row of each session's turn 0


@dataclass(frozen=True)
class TurnDraws:
    """Lifecycle, tokens generated (internal truth) and reported, prompts, cache hits; (n,)."""

    cat: np.ndarray  # into cfg.categories
    state: np.ndarray  # lifecycle code
    gen: np.ndarray  # tokens generated
    absent: np.ndarray  # bool: usage not reported
    overlap: np.ndarray  # bool: dispatched before the previous turn ended
    length: np.ndarray  # bool: completed at the cap (finish_reason length)
    upstream: np.ndarray  # bool: a failure is an upstream error (else a deadline)
    prompt: np.ndarray  # prompt tokens
    cached: np.ndarray  # prompt tokens served from the prefix cache
    cap: np.ndarray  # max_tokens, -1 = none


@dataclass(frozen=True)
class RouteDraws:
    """Bindings, routing receipts and outcomes per row, (n,)."""

    model: np.ndarray  # into cfg.models
    rebound: np.ndarray  # bool: served by the binding after an escalation
    rebind: np.ndarray  # bool: first turn after the escalation
    source: np.ndarray  # routing source code
    propensity: np.ndarray  # float, NaN off the first turn of a binding
    status: np.ndarray  # outcome status code
    score: np.ndarray  # float, NaN without a receipt of a completed turn


@dataclass(frozen=True)
class Timing:
    """Dispatch time (epoch ms) and service time (ms) per row, int64 (n,)."""

    timestamp: np.ndarray
    duration: np.ndarray


def _names(values: Sequence[str | None], idx: np.ndarray) -> np.ndarray:
    return np.asarray(list(values), dtype=object)[idx]


def _nullable_int(values: np.ndarray, null: np.ndarray) -> pd.arrays.IntegerArray:
    return pd.arrays.IntegerArray(np.where(null, 0, values).astype(np.int64), null.astype(bool))


def assemble_frame(cfg: SyntheticLedgerConfig, seed: int, s: SessionDraws, r: SessionRows,
                   tok: TurnDraws, route: RouteDraws, times: Timing,
                   keep: np.ndarray) -> pd.DataFrame:
    """Assemble ledger-v1 columns of the `keep` rows in dispatch order; request and session
    ids are numbered in dispatch order."""
    rows = np.flatnonzero(keep)
    order = rows[np.argsort(times.timestamp[rows], kind="stable")]
    sess, st = r.sess[order], tok.state[order]
    kept, first_pos, inv = np.unique(sess, return_index=True, return_inverse=True)
    number = np.empty(kept.size, dtype=np.int64)
    number[np.argsort(first_pos)] = np.arange(kept.size)
    number = number[inv]  # session number per row, in order of first dispatch
    cat, gen, absent, prompt = tok.cat[order], tok.gen[order], tok.absent[order], tok.prompt[order]
    cap, model, rebound = tok.cap[order], route.model[order], route.rebound[order]
    ts, dur = times.timestamp[order], times.duration[order]
    sid = np.array([f"s{seed}-{i:07d}" for i in range(kept.size)], dtype=object)
    bindings = np.stack([sid + "/b0", sid + "/b1"])  # (2, S): first binding, after escalation
    unknown = st == UNKNOWN
    price = [P.MODEL_PROFILES[m] for m in cfg.models]
    p_in, p_out = (np.array([getattr(p, k) for p in price])[model]
                   for k in ("usd_per_mtok_in", "usd_per_mtok_out"))
    cost = (prompt * p_in + gen * p_out) / 1e6
    cost = np.where((st == FAILED) & (gen == 0), 0.0, np.where(absent, np.nan, cost))
    terminal = np.where((st == FAILED) & ~tok.upstream[order], _DEADLINE, st)
    asked = s.asked[sess]
    cols = {
        L.VERSION: np.full(ts.size, LEDGER_VERSION, dtype=object),
        L.REQUEST_ID: np.array([f"r{seed}-{i:08d}" for i in range(ts.size)], dtype=object),
        L.SESSION_ID: sid[number], L.TURN_INDEX: r.turn[order], L.TIMESTAMP: ts,
        L.PROMPT_TOKENS: prompt,
        L.COMPLETION_TOKENS: _nullable_int(gen, absent),
        L.LIFECYCLE_STATE: _names(LifecycleState.ALL, st),
        L.SELECTED_MODEL: _names(cfg.models, model),
        L.ENDED_AT: _nullable_int(ts + dur, unknown), L.DURATION_MS: _nullable_int(dur, unknown),
        L.TERMINAL_REASON: _names(_TERMINAL, terminal),
        L.FINISH_REASON: _names(_FINISH, np.where(tok.length[order], _CAPPED, st)),
        L.MAX_TOKENS: _nullable_int(cap, cap < 0),
        L.STREAMING: s.stream[sess], L.CACHED_PROMPT_TOKENS: tok.cached[order],
        L.DECISION: _names([_DECISIONS.get(c, f"{c}_default") for c in cfg.categories], cat),
        L.CATEGORY: _names(cfg.categories, cat),
        L.ORIGINAL_MODEL: _names(("auto", *cfg.models), asked + 1),
        L.SLO_CLASS: _names(cfg.slo_classes, s.slo[sess]),
        L.REGION: _names(cfg.regions, s.region[sess]),
        L.ACTUAL_COST: cost,
        L.CURRENCY: _names((cfg.currency, None), np.isnan(cost).astype(np.int64)),
        L.ROUTING_SOURCE: _names(ROUTING_SOURCES, route.source[order]),
        L.BINDING_ID: bindings[rebound.astype(np.int64), number],
        L.REBIND_REASON: _names((None, RebindReason.ESCALATION),
                                route.rebind[order].astype(np.int64)),
        L.PROPENSITY: route.propensity[order], L.OUTCOME_STATUS: _names(OutcomeStatus.ALL,
                                                                        route.status[order]),
        L.OUTCOME_SCORE: route.score[order],
    }
    return pd.DataFrame(cols)
