"""Seeded ledgers, a brute-force feature reference and split checks for the projection tests."""

from __future__ import annotations

import numpy as np
import pandas as pd

from replaylab.contracts import Ledger as L
from replaylab.contracts import validate_ledger
from replaylab.contracts.columns import Projected as P
from replaylab.projection import (
    SplitConfig,
    split_counts,
)


def random_ledger(n_sessions: int, seed: int, *, t0: int = 1_700_000_000_000) -> pd.DataFrame:
    """Sessions of 1-8 turns whose responses overlap the next dispatches (epoch ms)."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(n_sessions):
        start = t0 + int(rng.integers(0, 6 * 3_600_000))
        t = start
        for k in range(int(rng.integers(1, 9))):
            dur = int(rng.integers(0, 20_000))
            comp = int(rng.integers(1, 800))
            rows.append({
                L.VERSION: "1", L.REQUEST_ID: f"r{s:05d}-{k}", L.SESSION_ID: f"s{s:05d}",
                L.TURN_INDEX: k, L.TIMESTAMP: t, L.ENDED_AT: t + dur,
                L.PROMPT_TOKENS: int(rng.integers(10, 4000)),
                L.COMPLETION_TOKENS: comp if rng.random() > 0.05 else None,
                L.LIFECYCLE_STATE: "aborted" if rng.random() < 0.03 else "completed",
                L.FINISH_REASON: "length" if rng.random() < 0.1 else "stop",
                L.SELECTED_MODEL: rng.choice(["small", "large"]),
                L.MAX_TOKENS: 1024, L.CATEGORY: rng.choice(["code", "chat"]),
            })
            t += int(rng.integers(0, 15_000))  # often before the previous turn ended
    return validate_ledger(pd.DataFrame(rows)).valid


def session_end(row: dict) -> int | None:
    end = row.get(L.ENDED_AT)
    if end is None or pd.isna(end):
        dur = row.get(L.DURATION_MS)
        end = None if dur is None or pd.isna(dur) else row[L.TIMESTAMP] + int(dur)
    return None if end is None or end < row[L.TIMESTAMP] else int(end)



def brute_force_history(df: pd.DataFrame, alpha: float, assume: bool) -> pd.DataFrame:
    """The definition, one request at a time (history.py docstring)."""
    rows = df.to_dict("records")
    ends = [session_end(r) for r in rows]
    if assume:
        for i, r in enumerate(rows):
            later = [q[L.TIMESTAMP] for q in rows
                     if q[L.SESSION_ID] == r[L.SESSION_ID] and q[L.TIMESTAMP] > r[L.TIMESTAMP]]
            if ends[i] is None and later:
                ends[i] = min(later)
    out = []
    for r in rows:
        same = [(j, q) for j, q in enumerate(rows) if q[L.SESSION_ID] == r[L.SESSION_ID]
                and q[L.TIMESTAMP] < r[L.TIMESTAMP]]
        hist = sorted(((ends[j], q[L.TIMESTAMP], q[L.TURN_INDEX], q[L.REQUEST_ID], q)
                       for j, q in same if ends[j] is not None and ends[j] <= r[L.TIMESTAMP]),
                      key=lambda x: x[:4])
        toks = [int(h[4][L.COMPLETION_TOKENS]) for h in hist
                if not pd.isna(h[4][L.COMPLETION_TOKENS])]
        ewma = None
        for x in toks:
            ewma = x if ewma is None else alpha * x + (1 - alpha) * ewma
        out.append({
            P.TURNS_DISPATCHED: len(same), P.TURNS_ENDED: len(hist),
            P.TURNS_WITH_USAGE: len(toks),
            P.TURNS_CENSORED: sum(h[4].get(L.FINISH_REASON) in ("length", "cancelled")
                                  or h[4][L.LIFECYCLE_STATE] == "aborted" for h in hist),
            P.COMPLETION_MEAN: sum(toks) / len(toks) if toks else np.nan,
            P.COMPLETION_EWMA: np.nan if ewma is None else ewma,
            P.LAST_COMPLETION: toks[-1] if toks else pd.NA,
            P.MS_SINCE_LAST_END: r[L.TIMESTAMP] - hist[-1][0] if hist else pd.NA,
        })
    return pd.DataFrame(out)


def assert_history_equal(got: pd.DataFrame, want: pd.DataFrame) -> None:
    for col in (P.TURNS_DISPATCHED, P.TURNS_ENDED, P.TURNS_WITH_USAGE, P.TURNS_CENSORED):
        assert got[col].tolist() == want[col].tolist(), col
    for col in (P.LAST_COMPLETION, P.MS_SINCE_LAST_END):
        g = got[col].astype("Int64")
        w = want[col].astype("Int64")
        assert g.isna().tolist() == w.isna().tolist(), col
        assert g.dropna().tolist() == w.dropna().tolist(), col
    np.testing.assert_array_equal(got[P.COMPLETION_MEAN].to_numpy(),
                                  want[P.COMPLETION_MEAN].to_numpy())
    np.testing.assert_allclose(got[P.COMPLETION_EWMA].to_numpy(),
                               want[P.COMPLETION_EWMA].to_numpy(), rtol=1e-12, atol=0)


def check_splits(f: pd.DataFrame, s: pd.Series, cfg: SplitConfig) -> None:
    counts = split_counts(s)
    assert sum(counts.values()) == len(f)
    assert s.notna().all() and set(s) <= set(counts)
    kept = s != "embargo"
    per_session = s[kept].groupby(f[L.SESSION_ID][kept]).nunique()
    assert (per_session == 1).all(), "a session appears in two splits"
    if cfg.purge == "sessions":
        assert (s.groupby(f[L.SESSION_ID]).nunique() == 1).all(), "a session was cut"
    t = f[L.TIMESTAMP]
    first = t.groupby(f[L.SESSION_ID]).transform("min")
    present = [k for k in ("train", "calibration", "test") if counts[k] > 0]
    for i, early in enumerate(present):
        for late in present[i + 1:]:
            # every kept row of the earlier split is dispatched more than the embargo
            # before any row of the later one; sessions are ordered by start
            assert t[s == early].max() + cfg.embargo_ms < t[s == late].min()
            assert first[s == early].max() <= first[s == late].min()
