"""Inject a workload-mix shift into a ledger, for drift evaluations (seeded, any ledger-v1 frame).

`inject_mix_shift(ledger, column=..., at_ms=..., weights=..., seed=...)` keeps
every session that starts before `at_ms` as it is. The sessions that start at
or after it are redrawn so that the mix of `column` (the value on a session's
first request) follows `weights`:

1. the post-shift sessions' start times are the slots (the arrival process is
   kept: as many sessions after the shift as before, at the same instants);
2. each slot draws a group from `weights`, then a session of that group from
   the post-shift sessions (with replacement, uniformly), seeded;
3. the drawn session is moved to its slot: every `timestamp` / `ended_at` of
   the session shifts by slot - its original start (durations, tokens and
   outcomes are the session's own), and its ids get a `~shift<k>` suffix so
   that a session drawn twice stays two sessions.

So only the mix changes: within a group, requests are real rows of that group,
and the request count after the shift is the number of rows of the drawn
sessions (not conserved exactly: sessions differ in length; the report says
both). A group with weight > 0 needs at least one post-shift session.

The frame's `attrs["mix_shift"]` records what was done (column, at_ms, the mix
before and after, rows and sessions before and after).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from replaylab.contracts.columns import Ledger as L

_ID_COLUMNS = (L.REQUEST_ID, L.SESSION_ID, L.BINDING_ID)
_TIME_COLUMNS = (L.TIMESTAMP, L.ENDED_AT)
_NONE = "<none>"


def reversed_mix(ledger: pd.DataFrame, column: str) -> dict[str, float]:
    """The session mix of `column` with its shares reversed (the rarest value becomes the commonest)."""
    first = ledger.sort_values([L.SESSION_ID, L.TURN_INDEX]).groupby(L.SESSION_ID)[column].first()
    shares = first.fillna(_NONE).astype(str).value_counts(normalize=True).sort_values(
        kind="stable")
    values = list(shares.index)
    return {v: float(s) for v, s in zip(values, shares.to_numpy()[::-1], strict=True)}


def inject_mix_shift(ledger: pd.DataFrame, *, column: str, at_ms: int,
                     weights: Mapping[str, float] | None = None, seed: int = 0) -> pd.DataFrame:
    """`ledger` with the session mix of `column` changed to `weights` from `at_ms` on.

    weights: group value -> share (normalised; `<none>` names null); None: the
    mix of the sessions that start after the shift, reversed (`reversed_mix`:
    the rarest group there becomes the commonest). Raises ValueError on an
    unknown column, a negative or all-zero weight, or a weighted group with no
    session after the shift.
    """
    for c in (column, L.SESSION_ID, L.TURN_INDEX, L.TIMESTAMP, L.REQUEST_ID):
        if c not in ledger.columns:
            raise ValueError(f"inject_mix_shift: the ledger has no column {c!r}")
    ts = ledger[L.TIMESTAMP].astype("int64")
    sess_start = ts.groupby(ledger[L.SESSION_ID]).min()
    start = ledger[L.SESSION_ID].map(sess_start)  # each row's session start
    if not (start >= at_ms).any():
        raise ValueError(f"inject_mix_shift: no session starts at or after at_ms={at_ms}")
    if weights is None:
        weights = reversed_mix(ledger[(start >= at_ms).to_numpy()], column)
    weights = dict(weights)
    if any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError(f"inject_mix_shift: weights {weights} must be >= 0 and not all zero")
    first = (ledger.assign(_t=ts).sort_values(["_t", L.TURN_INDEX], kind="stable")
             .groupby(L.SESSION_ID)[column].first().fillna(_NONE).astype(str))
    post = sess_start.index[sess_start.to_numpy() >= at_ms]
    groups = {g: np.asarray(sorted(post[first.loc[post].to_numpy() == g]), dtype=object)
              for g in weights if weights[g] > 0}
    empty = [g for g, s in groups.items() if len(s) == 0]
    if empty:
        raise ValueError(f"inject_mix_shift: no session of {column}={empty} starts after the "
                         f"shift; give them weight 0")
    names = list(groups)
    p = np.array([weights[g] for g in names], dtype=float)
    p /= p.sum()
    rng = np.random.default_rng(seed)
    slots = np.sort(sess_start.loc[post].to_numpy())
    drawn_group = rng.choice(len(names), size=len(slots), p=p)
    keep = ledger[(start < at_ms).to_numpy()]
    by_session = {s: f for s, f in ledger[(start >= at_ms).to_numpy()].groupby(L.SESSION_ID)}
    parts = [keep]
    for k, (slot, g) in enumerate(zip(slots, drawn_group, strict=True)):
        pool = groups[names[g]]
        sid = pool[rng.integers(len(pool))]
        part = by_session[sid].copy()
        delta = int(slot) - int(sess_start.loc[sid])
        for c in _TIME_COLUMNS:
            if c in part.columns:
                part[c] = part[c] + delta
        for c in _ID_COLUMNS:
            if c in part.columns:
                part[c] = part[c].where(part[c].isna(), part[c].astype(str) + f"~shift{k}")
        parts.append(part)
    out = pd.concat(parts, ignore_index=True)
    out = out.sort_values([L.TIMESTAMP, L.SESSION_ID, L.TURN_INDEX], kind="stable",
                          ignore_index=True)
    for c in ledger.columns:  # concat can widen an Int64 with no nulls; keep the input's dtypes
        if out[c].dtype != ledger[c].dtype:
            out[c] = out[c].astype(ledger[c].dtype)
    before = first.loc[post].value_counts(normalize=True)
    after = pd.Series([names[g] for g in drawn_group]).value_counts(normalize=True)
    out.attrs["mix_shift"] = {
        "column": column, "at_ms": int(at_ms), "seed": int(seed),
        "weights": {g: float(w) for g, w in zip(names, p, strict=True)},
        "mix_before": {str(k): float(v) for k, v in before.items()},
        "mix_after": {str(k): float(v) for k, v in after.items()},
        "sessions_after_shift": int(len(slots)),
        "rows_after_shift_before": int(len(ledger) - len(keep)),
        "rows_after_shift_after": int(len(out) - len(keep)),
    }
    return out


def inject_latent_shift(ledger: pd.DataFrame, *, at_ms: int, share: float = 0.3,
                        scale: float = 2.0, ms_per_token: float = 40.0,
                        seed: int = 0) -> pd.DataFrame:
    """`ledger` with a hidden population of verbose sessions from `at_ms` on.

    A mix shift the model cannot see in its features: from `at_ms`, a seeded
    `share` of the sessions that start then answer `scale` times longer
    (completion_tokens rounded; a row that now passes its `max_tokens` is cut
    there and becomes `finish_reason = length`, a lower bound, as a serving
    engine would). `duration_ms` and `ended_at` grow by `ms_per_token` per added
    token (a decode step, the `ModeledLatency` default). Prompts, the request
    count and every other column stay as they are: the visible mix is unchanged,
    only the share of the latent type moves from 0 to `share` (later turns'
    prompts would grow with their context in reality; they do not here).
    `attrs["latent_shift"]` records it. Raises ValueError on bad arguments.
    """
    if not 0 < share <= 1 or not scale > 0 or ms_per_token < 0:
        raise ValueError(f"inject_latent_shift: need 0 < share <= 1, scale > 0, "
                         f"ms_per_token >= 0 (got {share}, {scale}, {ms_per_token})")
    for c in (L.SESSION_ID, L.TIMESTAMP, L.COMPLETION_TOKENS):
        if c not in ledger.columns:
            raise ValueError(f"inject_latent_shift: the ledger has no column {c!r}")
    out = ledger.copy()
    ts = out[L.TIMESTAMP].astype("int64")
    start = ts.groupby(out[L.SESSION_ID]).min()
    post = np.asarray(sorted(start.index[start.to_numpy() >= at_ms]), dtype=object)
    if len(post) == 0:
        raise ValueError(f"inject_latent_shift: no session starts at or after at_ms={at_ms}")
    rng = np.random.default_rng(seed)
    verbose = post[rng.random(len(post)) < share]
    rows = out[L.SESSION_ID].isin(set(verbose)).to_numpy() & out[L.COMPLETION_TOKENS].notna(
        ).to_numpy()
    old = out.loc[rows, L.COMPLETION_TOKENS].astype("float64").to_numpy()
    new = np.rint(old * scale)
    if L.MAX_TOKENS in out.columns:
        cap = pd.to_numeric(out.loc[rows, L.MAX_TOKENS]).to_numpy(dtype="float64",
                                                                  na_value=np.nan)
        cut = np.isfinite(cap) & (new >= cap) & (old < cap)
        new = np.where(np.isfinite(cap), np.minimum(new, cap), new)
        if L.FINISH_REASON in out.columns:
            idx = out.index[rows][cut]
            out.loc[idx, L.FINISH_REASON] = "length"
    else:
        cut = np.zeros(len(new), dtype=bool)
    out.loc[rows, L.COMPLETION_TOKENS] = new.astype("int64")
    added = np.rint((new - old) * ms_per_token).astype("int64")
    for c in (L.DURATION_MS, L.ENDED_AT):
        if c in out.columns:
            v = out.loc[rows, c]
            out.loc[rows, c] = v.where(v.isna(), v + added)
    for c in ledger.columns:
        if out[c].dtype != ledger[c].dtype:
            out[c] = out[c].astype(ledger[c].dtype)
    out.attrs["latent_shift"] = {
        "at_ms": int(at_ms), "share": float(share), "scale": float(scale), "seed": int(seed),
        "sessions_after_shift": int(len(post)), "verbose_sessions": int(len(verbose)),
        "rows_verbose": int(rows.sum()), "rows_cut_at_cap": int(cut.sum())}
    return out


def inject_caps(ledger: pd.DataFrame, *, caps: tuple[int, ...] = (256, 512, 1024, 2048),
                seed: int = 0) -> pd.DataFrame:
    """`ledger` as if each session's client had set a `max_tokens` cap (seeded).

    The public traces record what was generated, never a cap. To measure
    censoring-aware training on real length distributions, each session draws
    one cap from `caps` (uniformly, seeded; a client keeps its cap); a request
    whose completion reaches it is cut there and becomes `finish_reason =
    length`, as a serving engine would end it, and its duration shrinks in
    proportion (cap / completion; the ledger does not split prefill from decode,
    so this keeps ended_at >= timestamp). Other rows keep their finish_reason
    (null when the column was absent). The true (uncut) completion is kept in
    `attrs["caps"]["true_completion"]` (request_id -> tokens) for evaluation only.
    Raises ValueError on bad arguments.
    """
    if not caps or any(int(c) != c or c < 1 for c in caps):
        raise ValueError(f"inject_caps: need caps of integers >= 1 (got {caps})")
    for c in (L.SESSION_ID, L.COMPLETION_TOKENS):
        if c not in ledger.columns:
            raise ValueError(f"inject_caps: the ledger has no column {c!r}")
    out = ledger.copy()
    sessions = np.asarray(sorted(out[L.SESSION_ID].astype(str).unique()), dtype=object)
    rng = np.random.default_rng(seed)
    by_session = dict(zip(sessions, rng.choice(np.asarray(caps, dtype="int64"), len(sessions)),
                          strict=True))
    cap = out[L.SESSION_ID].astype(str).map(by_session).to_numpy(dtype="int64")
    old = pd.to_numeric(out[L.COMPLETION_TOKENS]).to_numpy(dtype="float64", na_value=np.nan)
    cut = np.isfinite(old) & (old >= cap)
    out[L.MAX_TOKENS] = pd.array(cap, dtype="Int64")
    finish = (out[L.FINISH_REASON].astype(object) if L.FINISH_REASON in out.columns
              else pd.Series(None, index=out.index, dtype=object))
    finish[cut] = "length"
    out[L.FINISH_REASON] = finish
    true = dict(zip(out.loc[cut, L.REQUEST_ID].astype(str), old[cut].astype("int64").tolist(),
                    strict=True))
    out[L.COMPLETION_TOKENS] = pd.array(np.where(cut, cap, old), dtype="Float64").astype("Int64")
    kept = cap[cut] / old[cut]  # share of the answer kept
    if L.DURATION_MS in out.columns:
        d = pd.to_numeric(out.loc[cut, L.DURATION_MS]).astype("float64")
        out.loc[cut, L.DURATION_MS] = np.floor(d * kept).where(d.notna())
    if L.ENDED_AT in out.columns:
        start = out.loc[cut, L.TIMESTAMP].astype("int64")
        span = pd.to_numeric(out.loc[cut, L.ENDED_AT]).astype("float64") - start
        out.loc[cut, L.ENDED_AT] = (start + np.floor(span * kept)).where(span.notna())
    for c in ledger.columns:
        if out[c].dtype != ledger[c].dtype:
            out[c] = out[c].astype(ledger[c].dtype)
    out.attrs["caps"] = {"caps": [int(c) for c in caps], "seed": int(seed),
                         "sessions": int(len(sessions)), "rows_cut_at_cap": int(cut.sum()),
                         "true_completion": true}
    return out
