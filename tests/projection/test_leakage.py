"""The leakage guard: a feature derived from a label is detected and refused."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from replaylab.contracts import Ledger as L
from replaylab.contracts.columns import Projected
from replaylab.projection import (
    LeakageError,
    ProjectionConfig,
    check_no_label_leakage,
    dispatch_time_features,
    feature_columns,
)
from replaylab.projection.leakage import canary_self_test
from tests.helpers.projection import random_ledger

P = Projected


@pytest.fixture(scope="module")
def projected() -> tuple[pd.DataFrame, pd.DataFrame]:
    ledger = random_ledger(150, seed=11)
    return ledger, dispatch_time_features(ledger)  # the guard runs and passes


def _labels(f: pd.DataFrame) -> pd.DataFrame:
    return f[[P.LABEL_COMPLETION_TOKENS, P.LABEL_CENSORED, P.LABEL_USAGE_ABSENT]]


def test_real_features_pass_the_guard(projected):
    _, f = projected
    check_no_label_leakage(f[feature_columns(f)], _labels(f))
    assert canary_self_test(f[P.LABEL_COMPLETION_TOKENS], 0.99)


def test_monotone_canary_with_noise_is_refused(projected):
    _, f = projected
    rng = np.random.default_rng(0)
    feats = f[feature_columns(f)].copy()
    y = f[P.LABEL_COMPLETION_TOKENS].astype("float64")
    feats["resp_len_guess"] = y * 2 + rng.uniform(0, 0.5, len(f))
    with pytest.raises(LeakageError, match="resp_len_guess.*spearman"):
        check_no_label_leakage(feats, _labels(f))


def test_renamed_copy_and_censor_flag_are_refused(projected):
    _, f = projected
    feats = f[feature_columns(f)].copy()
    feats["n_out"] = f[P.LABEL_COMPLETION_TOKENS]
    feats["was_cut"] = f[P.LABEL_CENSORED]
    with pytest.raises(LeakageError) as err:
        check_no_label_leakage(feats, _labels(f))
    assert "'n_out' equals label" in str(err.value)
    assert "'was_cut' equals label" in str(err.value)


@pytest.mark.parametrize("name", ["label_x", "completion_tokens_copy", "ended_at", "duration_ms"])
def test_outcome_names_are_refused(projected, name):
    _, f = projected
    feats = f[feature_columns(f)].copy()
    feats[name] = 1.0
    with pytest.raises(LeakageError, match=name):
        check_no_label_leakage(feats, _labels(f))
    check_no_label_leakage(feats, _labels(f), allowed=[name])  # explicit allowance


def test_extra_ledger_columns_are_never_features_unless_whitelisted(projected):
    ledger, f = projected
    leaky = ledger.assign(resp_len=ledger[L.COMPLETION_TOKENS], region_hint="eu")
    plain = dispatch_time_features(leaky)
    assert "resp_len" not in plain.columns and "region_hint" not in plain.columns
    ok = dispatch_time_features(leaky, ProjectionConfig(extra_feature_columns=("region_hint",)))
    assert "region_hint" in feature_columns(ok)
    with pytest.raises(LeakageError, match="resp_len"):
        dispatch_time_features(leaky, ProjectionConfig(extra_feature_columns=("resp_len",)))
    with pytest.raises(LeakageError, match="duration_ms"):
        dispatch_time_features(leaky.assign(duration_ms=5),
                               ProjectionConfig(extra_feature_columns=("duration_ms",)))
    with pytest.raises(ValueError, match="not in the ledger"):
        dispatch_time_features(ledger, ProjectionConfig(extra_feature_columns=("nope",)))


def test_guard_off_lets_the_caller_decide(projected):
    ledger, _ = projected
    leaky = ledger.assign(resp_len=ledger[L.COMPLETION_TOKENS])
    cfg = ProjectionConfig(extra_feature_columns=("resp_len",), canary_checks=False)
    assert "resp_len" in dispatch_time_features(leaky, cfg).columns


def test_small_or_constant_data_does_not_false_alarm():
    f = pd.DataFrame({"a": [1, 2, 3], "flag": [False] * 3})
    labels = pd.DataFrame({"label_completion_tokens": [1, 2, 3], "label_censored": [False] * 3})
    check_no_label_leakage(f, labels)  # 3 rows < min_rows; constant columns carry nothing
    assert canary_self_test(labels["label_completion_tokens"], 0.99) is False


def test_synthetic_ledger_passes_the_guard_and_matches_brute_force():
    synthetic = pytest.importorskip("replaylab.sources.synthetic")
    from replaylab.contracts import validate_ledger
    from tests.helpers.projection import assert_history_equal, brute_force_history

    raw = synthetic.generate_synthetic_ledger(
        synthetic.SyntheticLedgerConfig(n_requests=1500), seed=3)
    ledger = validate_ledger(raw).valid
    f = dispatch_time_features(ledger)  # guard and canary self-test on realistic data
    assert f[P.TURNS_ENDED].sum() > 0
    some = ledger[ledger[L.SESSION_ID].isin(ledger[L.SESSION_ID].unique()[:150])]
    got = dispatch_time_features(some, ProjectionConfig(canary_checks=False))
    assert_history_equal(got.reset_index(drop=True), brute_force_history(some, 0.5, False))
