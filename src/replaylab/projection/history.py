"""Session history known at dispatch time, vectorized ("Dispatch time is the cut").

Definitions (ledger-v1; all times int64 epoch ms):

- A turn j's end e_j is `ended_at`, else `timestamp + duration_ms`, else unknown.
  An end before its own dispatch (e_j < t_j, impossible in a validated ledger)
  is treated as unknown. With `assume_ended_before_next`, an unknown end is
  taken to be the next strictly later dispatch of the same session (none when
  j is the last dispatch: then it stays unknown).
- Turn j is in the history of request R iff same session, t_j < t_R (dispatched
  strictly before R: two dispatches at the same ms are concurrent, neither saw
  the other) and e_j known and e_j <= t_R ("not after" R's dispatch). A turn
  still running at t_R, or with an unknown end, contributes nothing.
- Completion order inside a history: (e_j, t_j, turn_index_j, request_id_j)
  ascending. It fixes "last" and the EWMA when several turns end at one ms.

Algorithm, O((n + m) log m) with numpy only (n requests, m turns with an end):
every turn with an end becomes a completion event keyed (session, e_j, kind)
where kind = 0 if t_j < e_j and 2 if t_j == e_j; a dispatch is keyed
(session, t_R, 1). Sorted on one int64 composite key, the completions that R
may see are exactly the events of its session with key < R's dispatch key:
a contiguous range [start_s, pos_R) found by two `searchsorted` calls. Counts,
sums and the EWMA are then prefix differences / prefix lookups over the
sorted completions.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# Composite keys must stay below this (int64 with head room).
_KEY_LIMIT = 2**62


def _time_axis(t: np.ndarray, e: np.ndarray, has_end: np.ndarray,
               n_sessions: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Integer time codes (order-preserving) for dispatch and end times, and their span.

    Raw ms offsets when session x span fits the composite key; otherwise dense
    ranks of the distinct times (only the order matters to the algorithm).
    """
    if len(t) == 0:
        return t.copy(), e.copy(), 1
    tmin = int(t.min())
    tmax = max(int(t.max()), int(e[has_end].max()) if has_end.any() else tmin)
    span = tmax - tmin + 1
    if n_sessions * span * 4 < _KEY_LIMIT:
        return t - tmin, np.where(has_end, e - tmin, 0), span
    uniq, inv = np.unique(np.concatenate([t, e[has_end]]), return_inverse=True)
    ecode = np.zeros(len(t), dtype=np.int64)
    ecode[has_end] = inv[len(t):]
    return inv[: len(t)].astype(np.int64), ecode, len(uniq)


def _segmented_ewma(x: np.ndarray, seg_start: np.ndarray, alpha: float) -> np.ndarray:
    """y_k = a*x_k + (1-a)*y_{k-1}, restarting with y = x at each segment start.

    Shape (k,) -> (k,). The recurrence is an affine map y -> A_k*y + B_k; maps
    compose associatively, so a Hillis-Steele doubling scan computes all prefixes
    in ceil(log2(longest segment)) vector passes. A_k = 0 at a segment start cuts
    the dependence on earlier segments; products of A only shrink (no overflow,
    unlike the (1-a)^-k cumulative-sum trick).
    """
    k = len(x)
    if k == 0:
        return x.astype(np.float64)
    a = np.where(seg_start, 0.0, 1.0 - alpha)
    b = np.where(seg_start, x, alpha * x).astype(np.float64)
    starts = np.flatnonzero(seg_start)
    longest = int(np.diff(np.append(starts, k)).max())
    s = 1
    while s < longest:
        b[s:] = b[s:] + a[s:] * b[:-s]  # right side is built before assignment
        a[s:] = a[s:] * a[:-s]
        s *= 2
    return b


def _sorted_completions(ckey: np.ndarray, c: np.ndarray, t: np.ndarray,
                        turn_index: np.ndarray, request_id: np.ndarray,
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Row ids of completion events in (key, t, turn_index, request_id) order, and their keys."""
    order = np.argsort(ckey, kind="stable")
    rows, keys = c[order], ckey[order]
    tie = keys[1:] == keys[:-1]
    if tie.any():
        # Only events sharing a key need the tie-break; their positions form
        # contiguous blocks of equal keys, so re-sorting the subset by
        # (key, t, turn_index, request_id) and writing it back keeps `keys` sorted.
        mark = np.zeros(len(keys), dtype=bool)
        mark[1:] |= tie
        mark[:-1] |= tie
        pos = np.flatnonzero(mark)
        sub = rows[pos]
        rid_rank = pd.factorize(request_id[sub], sort=True)[0]
        rows[pos] = sub[np.lexsort((rid_rank, turn_index[sub], t[sub], keys[pos]))]
    return rows, keys


def _scatter(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Values computed in `order` (a permutation) back into row order."""
    out = np.empty_like(values)
    out[order] = values
    return out


def _dispatches(session: np.ndarray, tcode: np.ndarray, span: int, n_sessions: int,
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Dispatch keys (session, time) sorted, their order, and per row the count of
    dispatches of its session strictly earlier. Queries go in sorted order: numpy's
    binary search reuses the previous answer, much faster than random queries."""
    dkey = session * span + tcode
    dorder = np.argsort(dkey, kind="stable")
    dsorted = dkey[dorder]
    sess_first = np.searchsorted(dsorted, np.arange(n_sessions) * span, "left")
    earlier = np.searchsorted(dsorted, dsorted, "left") - sess_first[session[dorder]]
    return dsorted, dorder, _scatter(earlier, dorder)


def _assumed_ends(session: np.ndarray, t: np.ndarray, span: int, has_end: np.ndarray,
                  ecode: np.ndarray, end_ms: np.ndarray, dsorted: np.ndarray,
                  dorder: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unknown end -> the first dispatch of the same session strictly after t_j."""
    nxt = _scatter(np.searchsorted(dsorted, dsorted, "right"), dorder)
    base = session * span
    ok = ~has_end & (nxt < len(t))
    ok[ok] = dsorted[nxt[ok]] < base[ok] + span  # still inside the session
    ecode, end_ms = ecode.copy(), end_ms.copy()
    ecode[ok] = dsorted[nxt[ok]] - base[ok]
    end_ms[ok] = t[dorder[nxt[ok]]]
    return has_end | ok, ecode, end_ms


def _ewma_and_last(urows: np.ndarray, session: np.ndarray, completion: np.ndarray,
                   usage_before: np.ndarray, has_usage: np.ndarray, alpha: float,
                   ) -> tuple[np.ndarray, np.ndarray]:
    """EWMA and last value of completion tokens over usage events in completion order.

    urows: row ids of usage events, sorted. R reads the last usage event before
    its cut, whose rank among them is usage_before - 1 (in R's session iff has_usage).
    """
    useg = np.ones(len(urows), dtype=bool)
    useg[1:] = session[urows][1:] != session[urows][:-1]
    ewma_u = _segmented_ewma(completion[urows].astype(np.float64), useg, alpha)
    last_rank = np.maximum(usage_before - 1, 0)
    if len(urows) == 0:
        return np.full(len(usage_before), np.nan), np.zeros(len(usage_before), np.int64)
    ewma = np.where(has_usage, ewma_u[last_rank], np.nan)
    return ewma, np.where(has_usage, completion[urows][last_rank], 0)


def session_history(session: np.ndarray, t: np.ndarray, end: np.ndarray,
                    has_end: np.ndarray, turn_index: np.ndarray, request_id: np.ndarray,
                    completion: np.ndarray, usage: np.ndarray, censored: np.ndarray,
                    alpha: float, assume_ended_before_next: bool) -> dict[str, np.ndarray]:
    """History features of each request, from its session's turns that ended by dispatch.

    Inputs, all shape (n,): session codes (int64 >= 0), dispatch ms t (int64),
    end ms (int64, meaningful where has_end), turn_index (int64), request_id
    (object), completion tokens (int64, meaningful where usage), usage present
    (bool), censored (bool). Returns arrays of shape (n,), see `features.Projected`.
    """
    n = len(t)
    has_end = has_end & (end >= t)
    n_sessions = int(session.max()) + 1 if n else 0
    tcode, ecode, span = _time_axis(t, end, has_end, n_sessions)
    dsorted, dorder, dispatched = _dispatches(session, tcode, span, n_sessions)
    end_ms = np.where(has_end, end, 0)
    if assume_ended_before_next:
        has_end, ecode, end_ms = _assumed_ends(session, t, span, has_end, ecode, end_ms,
                                               dsorted, dorder)

    # Completion events sorted by (session, end, kind, tie-break); R sees [start, pos).
    c = np.flatnonzero(has_end)
    ckey = (session[c] * span + ecode[c]) * 4 + np.where(tcode[c] < ecode[c], 0, 2)
    rows, keys = _sorted_completions(ckey, c, t, turn_index, request_id)
    start = np.searchsorted(keys, np.arange(n_sessions) * span * 4, "left")[session]
    pos = _scatter(np.searchsorted(keys, dsorted * 4 + 1, "left"), dorder)

    u = usage[rows]
    cum_usage = np.concatenate([[0], np.cumsum(u)])
    cum_cens = np.concatenate([[0], np.cumsum(censored[rows])])
    cum_tokens = np.concatenate([[0], np.cumsum(np.where(u, completion[rows], 0))])
    ended = pos - start
    with_usage = cum_usage[pos] - cum_usage[start]
    has_usage = with_usage > 0
    mean = np.where(has_usage, (cum_tokens[pos] - cum_tokens[start]) / np.maximum(with_usage, 1),
                    np.nan)

    ewma, last_tokens = _ewma_and_last(rows[u], session, completion, cum_usage[pos],
                                       has_usage, alpha)
    any_end = ended > 0
    last_end = end_ms[rows][np.maximum(pos - 1, 0)] if len(rows) else np.zeros(n, np.int64)
    return {
        "dispatched": dispatched.astype(np.int64),
        "ended": ended.astype(np.int64),
        "with_usage": with_usage.astype(np.int64),
        "censored": (cum_cens[pos] - cum_cens[start]).astype(np.int64),
        "mean": mean,
        "ewma": ewma,
        "last_tokens": last_tokens.astype(np.int64),
        "last_tokens_known": has_usage,
        "ms_since_last_end": np.where(any_end, t - last_end, 0).astype(np.int64),
        "ms_since_last_end_known": any_end,
    }
