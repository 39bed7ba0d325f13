"""Dispatch-time features and labels: one row per request, only what was known at dispatch.

`dispatch_time_features(ledger, cfg)` takes a validated ledger-v1 frame
(`validate_ledger(...).valid`: `timestamp` int64 epoch ms, `ended_at` nullable
Int64 ms; datetime64 columns are accepted too) and returns a frame with the same
index and row order holding three kinds of columns:

- keys (`KEY_COLUMNS`): request_id, session_id, timestamp (dispatch, epoch ms),
  to join and split on; never features;
- features (`FEATURE_COLUMNS` plus `cfg.extra_feature_columns`): the request's
  own pre-dispatch fields, calendar of the dispatch (UTC), and the session
  history known at dispatch (see `history.py` for the exact rule);
- labels (`LABEL_COLUMNS`, prefix `label_`): what happened afterwards.

History over censored turns: a censored earlier turn (finish_reason length or
cancelled, or lifecycle aborted) counts in every count, its observed
completion_tokens (a lower bound) enters mean / EWMA / last like any other, and
`hist_turns_censored` says how many there were. A turn without usage
(completion_tokens null) counts in `hist_turns_ended` only.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from replaylab.config import ConfigError
from replaylab.contracts import SOURCE_ATTR
from replaylab.contracts.columns import (
    FEATURE_COLUMNS,
    KEY_COLUMNS,
    LABEL_COLUMNS,
    OWN_BOOL_COLUMNS,
    OWN_CATEGORY_COLUMNS,
    OWN_INT_COLUMNS,
)
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.columns import Projected as P
from replaylab.contracts.enums import CENSORED_FINISH, CENSORED_LIFECYCLE
from replaylab.projection.config import ProjectionConfig
from replaylab.projection.history import session_history
from replaylab.projection.leakage import (
    FORBIDDEN_PREFIXES,
    LeakageError,
    canary_self_test,
    check_no_label_leakage,
)

# Labels unknown at dispatch that the guard checks features against. Total demand is
# left out: its prompt part is known at dispatch and may rightly be tracked by a feature.
GUARDED_LABELS = (P.LABEL_COMPLETION_TOKENS, P.LABEL_CENSORED, P.LABEL_USAGE_ABSENT)
# Columns the projection reads; the Dask path ships only these (plus extras).
INPUT_COLUMNS = (KEY_COLUMNS + OWN_INT_COLUMNS + OWN_BOOL_COLUMNS + OWN_CATEGORY_COLUMNS
                 + (L.ENDED_AT, L.DURATION_MS, L.COMPLETION_TOKENS, L.FINISH_REASON,
                    L.LIFECYCLE_STATE))
_REQUIRED = (L.REQUEST_ID, L.SESSION_ID, L.TIMESTAMP, L.TURN_INDEX, L.COMPLETION_TOKENS)
_MS_PER_HOUR, _MS_PER_DAY = 3_600_000, 86_400_000


def feature_columns(df: pd.DataFrame) -> list[str]:
    """The feature columns of a projection frame: not a key, never a `label_` column."""
    return [c for c in df.columns if c not in KEY_COLUMNS and not str(c).startswith("label_")]


def _ms(s: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """A time column as (int64 epoch ms, known mask), shape (n,) each."""
    if pd.api.types.is_datetime64_any_dtype(s):
        known = s.notna().to_numpy()
        dt = s.dt.tz_convert("UTC") if s.dt.tz is not None else s.dt.tz_localize("UTC")
        ns = dt.astype("datetime64[ns, UTC]").to_numpy(dtype="int64", na_value=0)
        return ns // 1_000_000, known
    if pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s):
        return s.to_numpy(dtype="int64", na_value=0), s.notna().to_numpy()
    raise TypeError(f"column {s.name!r} has dtype {s.dtype}: expected epoch ms; "
                    "pass validate_ledger(...).valid")


def _int_array(values: np.ndarray, known: np.ndarray) -> pd.arrays.IntegerArray:
    return pd.arrays.IntegerArray(values.astype(np.int64), ~known.astype(bool))


def _own_fields(ledger: pd.DataFrame, n: int) -> dict[str, object]:
    """The request's own pre-dispatch fields; an absent optional column -> all null."""
    out: dict[str, object] = {}
    for col in OWN_INT_COLUMNS:
        out[col] = (ledger[col].astype("Int64").array if col in ledger.columns
                    else pd.array([pd.NA] * n, dtype="Int64"))
    for col in OWN_BOOL_COLUMNS:
        out[col] = (ledger[col].astype("boolean").array if col in ledger.columns
                    else pd.array([pd.NA] * n, dtype="boolean"))
    for col in OWN_CATEGORY_COLUMNS:
        if col in ledger.columns:
            vals = ledger[col].to_numpy(dtype=object)
        else:
            vals = np.full(n, None, dtype=object)
        out[col] = vals
    return out


def _end_times(ledger: pd.DataFrame, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """End of each turn, ms: ended_at, else timestamp + duration_ms, else unknown."""
    end = np.zeros(len(t), dtype=np.int64)
    known = np.zeros(len(t), dtype=bool)
    if L.ENDED_AT in ledger.columns:
        end, known = _ms(ledger[L.ENDED_AT])
    if L.DURATION_MS in ledger.columns:
        dur, dknown = _ms(ledger[L.DURATION_MS])
        fill = ~known & dknown
        end = np.where(fill, t + dur, end)
        known = known | fill
    return end, known


def _censored(ledger: pd.DataFrame, n: int) -> np.ndarray:
    """Right-censored output (ledger-v1): finish_reason length/cancelled or lifecycle aborted."""
    out = np.zeros(n, dtype=bool)
    if L.FINISH_REASON in ledger.columns:
        out |= ledger[L.FINISH_REASON].isin(CENSORED_FINISH).to_numpy(dtype=bool)
    if L.LIFECYCLE_STATE in ledger.columns:
        out |= ledger[L.LIFECYCLE_STATE].isin(CENSORED_LIFECYCLE).to_numpy(dtype=bool)
    return out


def _history(ledger: pd.DataFrame, t: np.ndarray, completion: np.ndarray, usage: np.ndarray,
             censored: np.ndarray, cfg: ProjectionConfig) -> dict[str, object]:
    end, has_end = _end_times(ledger, t)
    session = pd.factorize(ledger[L.SESSION_ID])[0].astype(np.int64)
    h = session_history(
        session, t, end, has_end, ledger[L.TURN_INDEX].to_numpy(dtype="int64", na_value=-1),
        ledger[L.REQUEST_ID].to_numpy(dtype=object), completion, usage, censored,
        alpha=float(cfg.ewma_alpha), assume_ended_before_next=cfg.assume_ended_before_next)
    return {
        P.TURNS_DISPATCHED: h["dispatched"], P.TURNS_ENDED: h["ended"],
        P.TURNS_WITH_USAGE: h["with_usage"], P.TURNS_CENSORED: h["censored"],
        P.COMPLETION_MEAN: h["mean"], P.COMPLETION_EWMA: h["ewma"],
        P.LAST_COMPLETION: _int_array(h["last_tokens"], h["last_tokens_known"]),
        P.MS_SINCE_LAST_END: _int_array(h["ms_since_last_end"], h["ms_since_last_end_known"]),
    }


def _extras(ledger: pd.DataFrame, cfg: ProjectionConfig) -> dict[str, object]:
    """Whitelisted extra ledger columns, carried as features after a name check."""
    taken = set(KEY_COLUMNS) | set(FEATURE_COLUMNS) | set(LABEL_COLUMNS)
    where = ledger.attrs.get(SOURCE_ATTR) or "the ledger"
    out: dict[str, object] = {}
    for col in cfg.extra_feature_columns:
        if col not in ledger.columns:
            raise ConfigError(f"projection.extra_feature_columns: {col!r} is not in the ledger "
                              f"({where} has no column {col})")
        if col in taken:
            raise ConfigError(f"projection.extra_feature_columns: {col!r} is already "
                              "a key, feature or label column")
        if col.startswith(FORBIDDEN_PREFIXES):
            raise LeakageError(f"extra feature {col!r}: name looks like an outcome; refused")
        out[col] = ledger[col].array
    return out


def dispatch_time_features(ledger: pd.DataFrame, cfg: ProjectionConfig | None = None,
                           ) -> pd.DataFrame:
    """Features known at each request's dispatch, and its labels in `label_` columns.

    ledger: (n, *) validated ledger-v1 frame, any row order, one row per request.
    Returns an (n, k) frame with the ledger's index and row order: KEY_COLUMNS,
    FEATURE_COLUMNS (+ cfg.extra_feature_columns), LABEL_COLUMNS. Raises
    ValueError for a missing required column, LeakageError when the guard
    refuses a feature (cfg.canary_checks).
    """
    cfg = cfg or ProjectionConfig()
    missing = [c for c in _REQUIRED if c not in ledger.columns]
    if missing:
        raise ValueError(f"ledger lacks required column(s) {', '.join(missing)}")
    n = len(ledger)
    t, t_known = _ms(ledger[L.TIMESTAMP])
    if not t_known.all():
        raise ValueError(f"{L.TIMESTAMP} has nulls; pass validate_ledger(...).valid")
    comp_col = ledger[L.COMPLETION_TOKENS]
    completion = comp_col.to_numpy(dtype="int64", na_value=0)
    usage = comp_col.notna().to_numpy()
    censored = _censored(ledger, n)

    cols: dict[str, object] = {
        L.REQUEST_ID: ledger[L.REQUEST_ID].to_numpy(dtype=object),
        L.SESSION_ID: ledger[L.SESSION_ID].to_numpy(dtype=object),
        L.TIMESTAMP: t,
    }
    cols.update(_own_fields(ledger, n))
    cols[P.HOUR_UTC] = (t // _MS_PER_HOUR) % 24
    cols[P.DAY_OF_WEEK] = (t // _MS_PER_DAY + 3) % 7  # 1970-01-01 was a Thursday (3)
    cols.update(_history(ledger, t, completion, usage, censored, cfg))
    cols.update(_extras(ledger, cfg))

    prompt = (ledger[L.PROMPT_TOKENS] if L.PROMPT_TOKENS in ledger.columns
              else pd.Series(pd.NA, index=ledger.index, dtype="Int64"))
    prompt_known = prompt.notna().to_numpy()
    cols[P.LABEL_COMPLETION_TOKENS] = _int_array(completion, usage)
    cols[P.LABEL_TOTAL_DEMAND] = _int_array(
        prompt.to_numpy(dtype="int64", na_value=0) + completion, usage & prompt_known)
    cols[P.LABEL_CENSORED] = censored
    cols[P.LABEL_USAGE_ABSENT] = ~usage
    out = pd.DataFrame(cols, index=ledger.index)
    if cfg.canary_checks:
        guard(out, cfg)
    return out


def guard(projected: pd.DataFrame, cfg: ProjectionConfig) -> None:
    """Run the leakage guard on a projection frame, and its canary self-test."""
    labels = projected[list(GUARDED_LABELS)]
    check_no_label_leakage(projected[feature_columns(projected)], labels,
                           threshold=cfg.leakage_threshold)
    canary_self_test(projected[P.LABEL_COMPLETION_TOKENS], cfg.leakage_threshold)
