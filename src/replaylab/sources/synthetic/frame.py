"""The synthetic ledger's drawn arrays, their integer codes, and their ledger-v1 columns.

sources/synthetic/generator.py draws a ledger stage by stage (sessions, row layout, tokens,
routing, timing) into the typed arrays declared here; `assemble_frame` turns them
into ledger-v1 columns. Enum columns are drawn as int64 codes into the name tables
below, whose values come from contracts.enums. Imports go one way: generator.py
imports this module, never the reverse.
"""

from __future__ import annotations

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
from replaylab.sources.synthetic import params as P
from replaylab.sources.synthetic.config import SyntheticLedgerConfig

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


@dataclass(frozen=True)
class LedgerDraws:
    """Everything one draw of the generator made: the stages' outputs and the export window."""

    sessions: SessionDraws
    rows: SessionRows
    tokens: TurnDraws
    route: RouteDraws
    times: Timing
    keep: np.ndarray  # bool (n,): rows the export holds


@dataclass(frozen=True)
class Coded:
    """An enum-like column as codes into its values: values[codes] (a value may be None)."""

    values: tuple[str | None, ...]
    codes: np.ndarray  # int64 (n,)


@dataclass(frozen=True)
class NullableInt:
    """An integer column with nulls."""

    values: np.ndarray  # int64 (n,), 0 where null
    null: np.ndarray  # bool (n,)


# Columns whose text each writer renders itself (they carry its seed or chunk prefix).
ID_COLUMNS = (L.REQUEST_ID, L.SESSION_ID, L.BINDING_ID)


@dataclass(frozen=True)
class LedgerColumns:
    """The kept rows in dispatch order, as ledger-v1 columns in contract order: numpy arrays,
    `Coded` and `NullableInt` columns, and None for the ID_COLUMNS, which the writer renders
    from `session` (numbered in order of first dispatch), `binding` and the row position."""

    columns: dict[str, np.ndarray | Coded | NullableInt | None]
    session: np.ndarray  # int64 (n,): session number of each row
    binding: np.ndarray  # int64 (n,): 0 = the first binding, 1 = after the escalation
    n_sessions: int


def ledger_columns(cfg: SyntheticLedgerConfig, d: LedgerDraws) -> LedgerColumns:
    """The ledger-v1 columns of the `d.keep` rows in dispatch order (ids left to the writer)."""
    s, r, tok, route, times = d.sessions, d.rows, d.tokens, d.route, d.times
    rows = np.flatnonzero(d.keep)
    order = rows[np.argsort(times.timestamp[rows], kind="stable")]
    sess, st = r.sess[order], tok.state[order]
    kept, first_pos, inv = np.unique(sess, return_index=True, return_inverse=True)
    number = np.empty(kept.size, dtype=np.int64)
    number[np.argsort(first_pos)] = np.arange(kept.size)
    number = number[inv]  # session number per row, in order of first dispatch
    cat, gen, absent, prompt = tok.cat[order], tok.gen[order], tok.absent[order], tok.prompt[order]
    cap, model, rebound = tok.cap[order], route.model[order], route.rebound[order]
    ts, dur = times.timestamp[order], times.duration[order]
    unknown = st == UNKNOWN
    price = [P.MODEL_PROFILES[m] for m in cfg.models]
    p_in, p_out = (np.array([getattr(p, k) for p in price])[model]
                   for k in ("usd_per_mtok_in", "usd_per_mtok_out"))
    cost = (prompt * p_in + gen * p_out) / 1e6
    cost = np.where((st == FAILED) & (gen == 0), 0.0, np.where(absent, np.nan, cost))
    terminal = np.where((st == FAILED) & ~tok.upstream[order], _DEADLINE, st)
    asked = s.asked[sess]
    cols: dict[str, np.ndarray | Coded | NullableInt | None] = {
        L.VERSION: Coded((LEDGER_VERSION,), np.zeros(ts.size, dtype=np.int64)),
        L.REQUEST_ID: None, L.SESSION_ID: None, L.TURN_INDEX: r.turn[order], L.TIMESTAMP: ts,
        L.PROMPT_TOKENS: prompt,
        L.COMPLETION_TOKENS: NullableInt(gen, absent),
        L.LIFECYCLE_STATE: Coded(tuple(LifecycleState.ALL), st),
        L.SELECTED_MODEL: Coded(tuple(cfg.models), model),
        L.ENDED_AT: NullableInt(ts + dur, unknown), L.DURATION_MS: NullableInt(dur, unknown),
        L.TERMINAL_REASON: Coded(_TERMINAL, terminal),
        L.FINISH_REASON: Coded(_FINISH, np.where(tok.length[order], _CAPPED, st)),
        L.MAX_TOKENS: NullableInt(cap, cap < 0),
        L.STREAMING: s.stream[sess], L.CACHED_PROMPT_TOKENS: tok.cached[order],
        L.DECISION: Coded(tuple(_DECISIONS.get(c, f"{c}_default") for c in cfg.categories), cat),
        L.CATEGORY: Coded(tuple(cfg.categories), cat),
        L.ORIGINAL_MODEL: Coded(("auto", *cfg.models), asked + 1),
        L.SLO_CLASS: Coded(tuple(cfg.slo_classes), s.slo[sess]),
        L.REGION: Coded(tuple(cfg.regions), s.region[sess]),
        L.ACTUAL_COST: cost,
        L.CURRENCY: Coded((cfg.currency, None), np.isnan(cost).astype(np.int64)),
        L.ROUTING_SOURCE: Coded(ROUTING_SOURCES, route.source[order]),
        L.BINDING_ID: None,
        L.REBIND_REASON: Coded((None, RebindReason.ESCALATION), route.rebind[order].astype(np.int64)),
        L.PROPENSITY: route.propensity[order],
        L.OUTCOME_STATUS: Coded(tuple(OutcomeStatus.ALL), route.status[order]),
        L.OUTCOME_SCORE: route.score[order],
    }
    return LedgerColumns(columns=cols, session=number, binding=rebound.astype(np.int64),
                         n_sessions=int(kept.size))


def _pandas(col: np.ndarray | Coded | NullableInt) -> np.ndarray | pd.arrays.IntegerArray:
    if isinstance(col, Coded):
        return np.asarray(list(col.values), dtype=object)[col.codes]
    if isinstance(col, NullableInt):
        return pd.arrays.IntegerArray(np.where(col.null, 0, col.values).astype(np.int64),
                                      col.null.astype(bool))
    return col


def assemble_frame(cfg: SyntheticLedgerConfig, seed: int, d: LedgerDraws) -> pd.DataFrame:
    """Assemble ledger-v1 columns of the `d.keep` rows in dispatch order; request and session
    ids are numbered in dispatch order (`r{seed}-00000000`, `s{seed}-0000000`)."""
    lc = ledger_columns(cfg, d)
    sid = np.array([f"s{seed}-{i:07d}" for i in range(lc.n_sessions)], dtype=object)
    bindings = np.stack([sid + "/b0", sid + "/b1"])  # (2, S): first binding, after escalation
    ids = {L.REQUEST_ID: np.array([f"r{seed}-{i:08d}" for i in range(lc.session.size)],
                                  dtype=object),
           L.SESSION_ID: sid[lc.session], L.BINDING_ID: bindings[lc.binding, lc.session]}
    return pd.DataFrame({k: ids[k] if v is None else _pandas(v) for k, v in lc.columns.items()})
