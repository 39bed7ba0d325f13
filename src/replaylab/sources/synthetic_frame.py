"""Assembly of the synthetic ledger's ledger-v1 columns from the drawn arrays (synthetic.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.ledger import LEDGER_VERSION
from replaylab.sources import synthetic_params as P

if TYPE_CHECKING:
    from replaylab.sources.synthetic import SyntheticLedgerConfig

_FAILED, _UNKNOWN = 2, 3  # lifecycle codes, in LedgerEnums order (synthetic.py)
_DECISIONS = {"chat": "general_chat", "code": "code_generation", "rag": "document_qa",
              "math": "math_reasoning"}
_SOURCES = ("sticky_binding", "classifier", "exploration", "fixed", "heuristic")
_STATUS = ("success", "failure", "cancelled", "unknown")
_FINISH = ("stop", "cancelled", "error", "unknown", "length")  # by lifecycle code, then length
_TERMINAL = ("response_complete", "client_canceled", "upstream_error_response", None,
             "deadline_exceeded")


def _names(values: Sequence[str], idx: np.ndarray) -> np.ndarray:
    return np.asarray(list(values), dtype=object)[idx]


def _nullable_int(values: np.ndarray, null: np.ndarray) -> pd.arrays.IntegerArray:
    return pd.arrays.IntegerArray(np.where(null, 0, values).astype(np.int64), null.astype(bool))


def assemble_frame(cfg: SyntheticLedgerConfig, seed: int, s: dict, r: dict, tok: dict, route: dict,
           times: dict, keep: np.ndarray) -> pd.DataFrame:
    """Assemble ledger-v1 columns of the `keep` rows in dispatch order; request and session
    ids are numbered in dispatch order."""
    rows = np.flatnonzero(keep)
    order = rows[np.argsort(times["timestamp"][rows], kind="stable")]
    sess, st = r["sess"][order], tok["state"][order]
    kept, first_pos, inv = np.unique(sess, return_index=True, return_inverse=True)
    number = np.empty(kept.size, dtype=np.int64)
    number[np.argsort(first_pos)] = np.arange(kept.size)
    number = number[inv]  # session number per row, in order of first dispatch
    tk = {k: v[order] for k, v in tok.items()}
    rt = {k: v[order] for k, v in route.items()}
    ts, dur = times["timestamp"][order], times["duration"][order]
    sid = np.array([f"s{seed}-{i:07d}" for i in range(kept.size)], dtype=object)
    bindings = np.stack([sid + "/b0", sid + "/b1"])  # (2, S): first binding, after escalation
    unknown = st == _UNKNOWN
    price = [P.MODEL_PROFILES[m] for m in cfg.models]
    p_in, p_out = (np.array([getattr(p, k) for p in price])[rt["model"]]
                   for k in ("usd_per_mtok_in", "usd_per_mtok_out"))
    cost = (tk["prompt"] * p_in + tk["gen"] * p_out) / 1e6
    cost = np.where((st == _FAILED) & (tk["gen"] == 0), 0.0, np.where(tk["absent"], np.nan, cost))
    terminal = np.where((st == _FAILED) & ~tk["upstream"], 4, st)
    asked = s["asked"][sess]
    cols = {
        L.VERSION: np.full(ts.size, LEDGER_VERSION, dtype=object),
        L.REQUEST_ID: np.array([f"r{seed}-{i:08d}" for i in range(ts.size)], dtype=object),
        L.SESSION_ID: sid[number], L.TURN_INDEX: r["turn"][order], L.TIMESTAMP: ts,
        L.PROMPT_TOKENS: tk["prompt"],
        L.COMPLETION_TOKENS: _nullable_int(tk["gen"], tk["absent"]),
        L.LIFECYCLE_STATE: _names(("completed", "aborted", "failed", "unknown"), st),
        L.SELECTED_MODEL: _names(cfg.models, rt["model"]),
        L.ENDED_AT: _nullable_int(ts + dur, unknown), L.DURATION_MS: _nullable_int(dur, unknown),
        L.TERMINAL_REASON: _names(_TERMINAL, terminal),
        L.FINISH_REASON: _names(_FINISH, np.where(tk["length"], 4, st)),
        L.MAX_TOKENS: _nullable_int(tk["cap"], tk["cap"] < 0),
        L.STREAMING: s["stream"][sess], L.CACHED_PROMPT_TOKENS: tk["cached"],
        L.DECISION: _names([_DECISIONS.get(c, f"{c}_default") for c in cfg.categories], tk["cat"]),
        L.CATEGORY: _names(cfg.categories, tk["cat"]),
        L.ORIGINAL_MODEL: _names(("auto", *cfg.models), asked + 1),
        L.SLO_CLASS: _names(cfg.slo_classes, s["slo"][sess]),
        L.REGION: _names(cfg.regions, s["region"][sess]),
        L.ACTUAL_COST: cost,
        L.CURRENCY: _names((cfg.currency, None), np.isnan(cost).astype(np.int64)),
        L.ROUTING_SOURCE: _names(_SOURCES, rt["source"]),
        L.BINDING_ID: bindings[rt["rebound"].astype(np.int64), number],
        L.REBIND_REASON: _names((None, "escalation"), rt["rebind"].astype(np.int64)),
        L.PROPENSITY: rt["propensity"], L.OUTCOME_STATUS: _names(_STATUS, rt["status"]),
        L.OUTCOME_SCORE: rt["score"],
    }
    return pd.DataFrame(cols)
