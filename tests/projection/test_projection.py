"""Dispatch-time features against a brute-force reference; splits; version; Dask parity."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaylab.contracts import Ledger as L
from replaylab.contracts import validate_ledger
from replaylab.contracts.columns import FEATURE_COLUMNS, LABEL_COLUMNS, Projected
from replaylab.projection import (
    ProjectionConfig,
    SplitConfig,
    dispatch_time_features,
    feature_columns,
    ledger_fingerprint,
    projection_version,
    split_counts,
    time_ordered_splits,
)
from tests.helpers.projection import (
    assert_history_equal,
    brute_force_history,
    check_splits,
    random_ledger,
    session_end,
)

P = Projected
NO_GUARD = ProjectionConfig(canary_checks=False)


# ---------------------------------------------------------------- ledgers


@st.composite
def ledgers(draw):
    """Tiny ledgers with overlapping turns, ties in time, and missing ends or usage."""
    n = draw(st.integers(1, 24))
    has_ended = draw(st.booleans())
    has_duration = draw(st.booleans())
    ids = draw(st.permutations([f"q{i:02d}" for i in range(n)]))
    rows = []
    for i in range(n):
        t = draw(st.integers(0, 40))
        # an end before dispatch (quarantined by validate_ledger) must count as unknown
        end = draw(st.none() | st.integers(max(0, t - 3), t + 30))
        row = {
            L.REQUEST_ID: ids[i], L.SESSION_ID: f"s{draw(st.integers(0, 3))}",
            L.TURN_INDEX: draw(st.integers(0, 4)), L.TIMESTAMP: t,
            L.PROMPT_TOKENS: draw(st.none() | st.integers(0, 50)),
            L.COMPLETION_TOKENS: draw(st.none() | st.integers(0, 500)),
            L.FINISH_REASON: draw(st.sampled_from(["stop", "length", "cancelled", None])),
            L.LIFECYCLE_STATE: draw(st.sampled_from(["completed", "aborted", "failed"])),
        }
        if has_ended:
            row[L.ENDED_AT] = end if draw(st.booleans()) else None
        if has_duration:
            row[L.DURATION_MS] = None if end is None else end - t
        rows.append(row)
    df = pd.DataFrame(rows)
    for col in (L.PROMPT_TOKENS, L.COMPLETION_TOKENS, L.ENDED_AT, L.DURATION_MS):
        if col in df.columns:
            df[col] = df[col].astype("Int64")
    return df


# ---------------------------------------------------------------- brute force


# ---------------------------------------------------------------- properties


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(df=ledgers(), alpha=st.sampled_from([0.5, 0.3, 1.0]), assume=st.booleans())
def test_history_matches_brute_force(df, alpha, assume):
    cfg = ProjectionConfig(ewma_alpha=alpha, assume_ended_before_next=assume, canary_checks=False)
    got = dispatch_time_features(df, cfg)
    assert list(got.index) == list(df.index)
    assert got[L.REQUEST_ID].tolist() == df[L.REQUEST_ID].tolist()
    assert_history_equal(got.reset_index(drop=True), brute_force_history(df, alpha, assume))


@settings(max_examples=150, deadline=None)
@given(df=ledgers(), pick=st.integers(0, 10_000), assume=st.booleans())
def test_turns_not_ended_by_dispatch_cannot_move_features(df, pick, assume):
    """Rewriting the outcome of every turn that had not ended by R's dispatch leaves R unchanged."""
    cfg = ProjectionConfig(assume_ended_before_next=assume, canary_checks=False)
    r = pick % len(df)
    t_r = df[L.TIMESTAMP].iloc[r]
    ends = [session_end(row) for row in df.to_dict("records")]
    unseen = np.array([e is None or e > t_r for e in ends]) | (df[L.TIMESTAMP] >= t_r).to_numpy()
    if assume:  # an assumed end is a later dispatch: keep such turns out of the rewrite
        unseen &= np.array([e is not None for e in ends]) | (df[L.TIMESTAMP] >= t_r).to_numpy()
    altered = df.copy()
    altered.loc[unseen, L.COMPLETION_TOKENS] = 99_999
    altered.loc[unseen, L.FINISH_REASON] = "length"
    a = dispatch_time_features(df, cfg)[list(FEATURE_COLUMNS)].iloc[r]
    b = dispatch_time_features(altered, cfg)[list(FEATURE_COLUMNS)].iloc[r]
    pd.testing.assert_series_equal(a, b)


def test_overlapping_session_by_hand():
    # s: a [0, 15], b [10, 12] (no usage, length), c at 20 (end unknown), d at 20.
    df = pd.DataFrame({
        L.REQUEST_ID: ["a", "b", "c", "d"], L.SESSION_ID: ["s"] * 4,
        L.TURN_INDEX: [0, 1, 2, 3], L.TIMESTAMP: [0, 10, 20, 20],
        L.ENDED_AT: pd.array([15, 12, None, 30], dtype="Int64"),
        L.COMPLETION_TOKENS: pd.array([100, None, 7, 9], dtype="Int64"),
        L.FINISH_REASON: ["stop", "length", "stop", "stop"],
    })
    f = dispatch_time_features(df, NO_GUARD)
    # b dispatched while a was running: a contributes nothing
    assert f[P.TURNS_DISPATCHED].tolist() == [0, 1, 2, 2]
    assert f[P.TURNS_ENDED].tolist() == [0, 0, 2, 2]
    assert f[P.TURNS_CENSORED].tolist() == [0, 0, 1, 1]
    assert f[P.LAST_COMPLETION].tolist()[2:] == [100, 100]  # b ended first, a last (usage)
    assert f[P.MS_SINCE_LAST_END].tolist()[2:] == [5, 5]
    assert f[P.LABEL_TOTAL_DEMAND].isna().all()  # no prompt_tokens column: unknown


def test_feature_and_label_columns_are_disjoint():
    f = dispatch_time_features(random_ledger(30, seed=1))
    cols = feature_columns(f)
    assert set(cols) == set(FEATURE_COLUMNS)
    assert not any(c.startswith("label_") for c in cols)
    assert set(LABEL_COLUMNS) <= set(f.columns)
    assert not set(cols) & set(LABEL_COLUMNS)


def test_missing_optional_columns_give_null_features():
    full = random_ledger(20, seed=2)
    required = [L.VERSION, L.REQUEST_ID, L.SESSION_ID, L.TURN_INDEX, L.TIMESTAMP,
                L.PROMPT_TOKENS, L.COMPLETION_TOKENS, L.LIFECYCLE_STATE, L.SELECTED_MODEL]
    f = dispatch_time_features(full[required])
    assert set(FEATURE_COLUMNS) <= set(f.columns)
    for col in (L.MAX_TOKENS, L.CACHED_PROMPT_TOKENS, L.STREAMING, L.CATEGORY, L.REGION):
        assert f[col].isna().all(), col
    # no end at all and no assumption: nothing is known to have ended
    assert (f[P.TURNS_ENDED] == 0).all()
    assert f[P.COMPLETION_MEAN].isna().all()
    assert f[P.LABEL_CENSORED].sum() == (full[L.LIFECYCLE_STATE] == "aborted").sum()


def test_validated_rfc3339_ledger_and_duration_only():
    raw = pd.DataFrame({
        L.VERSION: "1", L.REQUEST_ID: ["a", "b"], L.SESSION_ID: ["s", "s"],
        L.TURN_INDEX: [0, 1],
        L.TIMESTAMP: ["2024-05-06T10:00:00Z", "2024-05-06T10:00:05Z"],
        L.DURATION_MS: [4000, 1000], L.PROMPT_TOKENS: [5, 6], L.COMPLETION_TOKENS: [50, 60],
        L.LIFECYCLE_STATE: "completed", L.SELECTED_MODEL: "m",
    })
    f = dispatch_time_features(validate_ledger(raw).valid, NO_GUARD)
    assert f[P.HOUR_UTC].tolist() == [10, 10]
    assert f[P.DAY_OF_WEEK].tolist() == [0, 0]  # 2024-05-06 was a Monday
    assert f[P.LAST_COMPLETION].tolist()[1] == 50
    assert f[P.MS_SINCE_LAST_END].tolist()[1] == 1000
    assert f[P.LABEL_TOTAL_DEMAND].tolist() == [55, 66]


def test_assume_ended_before_next_changes_features_and_version():
    ledger = random_ledger(40, seed=3).drop(columns=[L.ENDED_AT])
    off = ProjectionConfig()
    on = ProjectionConfig(assume_ended_before_next=True)
    f_off, f_on = dispatch_time_features(ledger, off), dispatch_time_features(ledger, on)
    assert (f_off[P.TURNS_ENDED] == 0).all()
    # every earlier dispatch of the session ended by the next strictly later dispatch
    assert (f_on[P.TURNS_ENDED] == f_on[P.TURNS_DISPATCHED]).all()
    assert f_on[P.TURNS_ENDED].sum() > 0
    fp = ledger_fingerprint(ledger)
    assert projection_version(off, fp) != projection_version(on, fp)
    assert projection_version(off, fp) == projection_version(ProjectionConfig(), fp)


def test_fingerprint_content_not_order():
    ledger = random_ledger(15, seed=4)
    shuffled = ledger.sample(frac=1.0, random_state=0)[list(reversed(ledger.columns))]
    assert ledger_fingerprint(ledger) == ledger_fingerprint(shuffled)
    changed = ledger.copy()
    changed.loc[0, L.COMPLETION_TOKENS] = 12345
    assert ledger_fingerprint(changed) != ledger_fingerprint(ledger)
    fp = ledger_fingerprint(ledger)
    assert projection_version(ProjectionConfig(), fp, "projection-1") != projection_version(
        ProjectionConfig(), fp, "projection-2")


def test_row_order_does_not_change_features():
    ledger = random_ledger(60, seed=5)
    a = dispatch_time_features(ledger)
    shuffled = ledger.sample(frac=1.0, random_state=1)
    b = dispatch_time_features(shuffled).loc[ledger.index]
    pd.testing.assert_frame_equal(a, b)


# ---------------------------------------------------------------- splits


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10_000), n_sessions=st.integers(1, 60),
       embargo_min=st.sampled_from([0, 1, 30, 120]), purge=st.sampled_from(["rows", "sessions"]),
       fr=st.sampled_from([(0.6, 0.2, 0.2), (0.8, 0.1, 0.1), (0.5, 0.0, 0.5), (1.0, 0.0, 0.0)]))
def test_splits_are_session_whole_time_ordered_and_counted(seed, n_sessions, embargo_min,
                                                           purge, fr):
    f = dispatch_time_features(random_ledger(n_sessions, seed), NO_GUARD)
    cfg = SplitConfig.from_minutes(embargo_min, train=fr[0], calibration=fr[1], test=fr[2],
                                   purge=purge)
    s = time_ordered_splits(f, cfg)
    assert s.index.equals(f.index)
    check_splits(f, s, cfg)


@pytest.mark.parametrize("purge", ["rows", "sessions"])
def test_embargo_rows_are_counted(purge):
    f = dispatch_time_features(random_ledger(300, seed=6), NO_GUARD)
    cfg = SplitConfig(embargo_ms=20 * 60_000, purge=purge)
    s = time_ordered_splits(f, cfg)
    counts = split_counts(s)
    assert counts["embargo"] > 0
    assert counts["train"] > counts["calibration"] > 0 and counts["test"] > 0
    assert sum(counts.values()) == len(f)
    check_splits(f, s, cfg)
    no_gap = time_ordered_splits(f, SplitConfig(embargo_ms=0, purge=purge))
    # a wider gap only adds rows to the embargo; the later split is never moved
    assert set(f.index[no_gap == "embargo"]) <= set(f.index[s == "embargo"])
    assert (s[no_gap == "test"] == "test").all()
    whole = time_ordered_splits(f, SplitConfig(embargo_ms=20 * 60_000, purge="sessions"))
    assert set(f.index[s == "embargo"]) <= set(f.index[whole == "embargo"])


def test_split_config_rejects_bad_values():
    with pytest.raises(ValueError, match="sum to 1"):
        SplitConfig(train=0.5, calibration=0.2, test=0.2)
    with pytest.raises(ValueError, match="embargo_ms"):
        SplitConfig(embargo_ms=-1)
    with pytest.raises(ValueError, match="purge"):
        SplitConfig(purge="turns")
    with pytest.raises(ValueError, match="ewma_alpha"):
        ProjectionConfig(ewma_alpha=0.0)


def test_empty_ledger_gives_empty_frame_with_all_columns():
    ledger = random_ledger(3, seed=9).iloc[:0]
    f = dispatch_time_features(ledger)
    assert len(f) == 0
    assert set(FEATURE_COLUMNS) | set(LABEL_COLUMNS) <= set(f.columns)
    assert split_counts(time_ordered_splits(f)) == dict.fromkeys(
        ("train", "calibration", "test", "embargo"), 0)


@pytest.mark.parametrize("assume", [False, True])
def test_dense_time_ranks_give_the_same_history(monkeypatch, assume):
    """The fallback for key overflow (time span x sessions too wide) changes nothing."""
    from replaylab.projection import history

    ledger = random_ledger(80, seed=10)
    ledger = ledger.assign(**{L.ENDED_AT: ledger[L.ENDED_AT].mask(ledger.index % 3 == 0)})
    cfg = ProjectionConfig(assume_ended_before_next=assume)
    want = dispatch_time_features(ledger, cfg)
    monkeypatch.setattr(history, "_KEY_LIMIT", 1)
    pd.testing.assert_frame_equal(dispatch_time_features(ledger, cfg), want)
