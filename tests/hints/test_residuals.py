"""Residuals of emitted demand hints: statistics with known answers on constructed ledgers.

The ledgers are built directly as ledger-v1 frames with hint columns, so every
figure (coverage, censored and usage-absent counts, p90 exceedance, sizing
multipliers, drift buckets, groups) has an answer computed by hand. Two tests
run `python -m evaluation residuals` in process (marked slow).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from replaylab.contracts import validate_ledger
from replaylab.hints.residuals import (
    ALWAYS,
    ResidualDataError,
    residual_figures,
    residual_summary,
    row_residuals,
)

REPO = Path(__file__).resolve().parents[2]
HOUR_MS = 3_600_000
T0 = 472_248 * HOUR_MS  # 2023-11-16T00:00Z, on an hour boundary
PROMPT = 50
LO, P50, P90, HI = 100.0, 150.0, 190.0, 200.0
GROUPS = ("selected_model", "category", "slo_class")


def _ledger(totals, *, finish=None, lifecycle=None, hinted=None, fallback=None,
            timestamps=None, category=None, model=None, seed=0) -> pd.DataFrame:
    """A ledger-v1 frame, one row per total (prompt 50 + completion); NaN total = usage absent.

    Model hints are [lo, hi] = [100, 200], p50 150, p90 190, interval 0.8; a
    fallback row reserves prompt + 4096; an unhinted row has null hint columns
    and ack `unsupported`. Rows are shuffled (the statistics must not care).
    """
    totals = np.asarray(totals, dtype="float64")
    n = totals.size
    hinted = np.ones(n, bool) if hinted is None else np.asarray(hinted, bool)
    fallback = np.zeros(n, bool) if fallback is None else np.asarray(fallback, bool)
    comp = pd.array([None if np.isnan(t) else int(t) - PROMPT for t in totals], dtype="Int64")
    ts = np.asarray(timestamps if timestamps is not None else T0 + 1000 * np.arange(n), "int64")
    cap = PROMPT + 4096.0

    def hint(value: float) -> list:
        return [None if not h else (cap if f else value) for h, f in zip(hinted, fallback,
                                                                          strict=True)]

    frame = pd.DataFrame({
        "ledger_version": "1", "request_id": [f"r{i:05d}" for i in range(n)],
        "session_id": [f"s{i:05d}" for i in range(n)], "turn_index": 0, "timestamp": ts,
        "prompt_tokens": pd.array([PROMPT] * n, dtype="Int64"), "completion_tokens": comp,
        "lifecycle_state": lifecycle if lifecycle is not None else "completed",
        "selected_model": model if model is not None else "m-a",
        "finish_reason": finish if finish is not None else "stop",
        "category": category if category is not None else "chat",
        "hint_version": ["1" if h else None for h in hinted],
        "hint_model_version": [None if not h else ("baseline:max_tokens_cap" if f else "1.0.0+abc")
                               for h, f in zip(hinted, fallback, strict=True)],
        "hint_p50": hint(P50), "hint_p90": hint(P90),
        "hint_lo": [None if not h else (float(PROMPT) if f else LO)
                    for h, f in zip(hinted, fallback, strict=True)],
        "hint_hi": hint(HI),
        "hint_interval": [0.8 if h and not f else None for h, f in zip(hinted, fallback,
                                                                        strict=True)],
        "hint_age_ms": [60_000 if h else None for h in hinted],
        "hint_fallback": [bool(f) if h else None for h, f in zip(hinted, fallback, strict=True)],
        "ack_state": ["used" if h and not f else ("ignored" if h else "unsupported")
                      for h, f in zip(hinted, fallback, strict=True)],
        "ack_decision": "admitted",
    })
    for c in ("hint_p50", "hint_p90", "hint_lo", "hint_hi", "hint_interval"):
        frame[c] = frame[c].astype("float64")
    order = np.random.default_rng(seed).permutation(n)
    return frame.iloc[order].reset_index(drop=True)


def _known() -> tuple[pd.DataFrame, dict]:
    """1,000 uncensored rows (80% inside [lo, hi]), 60 censored, 40 usage absent, 30 unhinted."""
    exact = np.repeat([150.0, 195.0, 250.0, 80.0], [700, 100, 150, 50])
    censored = np.repeat([250.0, 150.0], 30)
    absent = np.full(40, np.nan)
    unhinted = np.full(30, 150.0)
    totals = np.concatenate([exact, censored, absent, unhinted])
    finish = ["stop"] * 1000 + ["length"] * 20 + ["cancelled"] * 20 + ["error"] * 20 + \
        ["stop"] * 70
    life = ["completed"] * 1000 + ["completed"] * 20 + ["aborted"] * 20 + ["failed"] * 20 + \
        ["completed"] * 70
    hinted = np.r_[np.ones(1100, bool), np.zeros(30, bool)]
    frame = _ledger(totals, finish=finish, lifecycle=life, hinted=hinted)
    res = exact - P50
    expected = {
        "rows": 1130, "hinted": 1100, "usage_absent": 40, "lower_bound": 60, "scored": 1000,
        "coverage": 0.8, "p90_exceedance": 0.25, "mean_width": HI - LO,
        "residual_mean": float(res.mean()),  # (100*45 + 150*100 - 50*70) / 1000 = 16
        "residual_q": np.quantile(res, (0.1, 0.5, 0.9)),
        "pinball_50": float(np.mean(0.5 * np.abs(res))),
        "pinball_90": float(np.mean(np.where(exact > P90, 0.9 * (exact - P90),
                                             0.1 * (P90 - exact)))),
        "sizing": np.quantile(exact / P90, (0.9, 0.95, 0.99)),
    }
    return frame, expected


# ---------------------------------------------------------------- known answers
def test_overall_statistics_have_the_constructed_answers():
    frame, exp = _known()
    assert validate_ledger(frame).rows_quarantined == 0  # a real ledger-v1 frame
    s = residual_summary(frame)
    assert s["rows"] == 1130 and s["nominal"] == 0.8
    o = s["overall"]
    for k in ("rows", "hinted", "usage_absent", "lower_bound", "scored"):
        assert o[k] == exp[k], k
    assert o["coverage"] == pytest.approx(0.8)
    assert o["coverage_ci95"][0] < 0.8 < o["coverage_ci95"][1] and not o["drift"]
    assert o["p90_exceedance"] == pytest.approx(0.25)
    assert o["mean_width"] == pytest.approx(100.0)
    assert o["residual_mean"] == pytest.approx(16.0) == exp["residual_mean"]
    np.testing.assert_allclose([o["residual_q"][k] for k in ("q10", "q50", "q90")],
                               exp["residual_q"])
    assert o["pinball"]["0.5"] == pytest.approx(exp["pinball_50"]) == pytest.approx(11.5)
    assert o["pinball"]["0.9"] == pytest.approx(exp["pinball_90"]) == pytest.approx(11.9)
    # sizing multipliers: quantiles of actual / hint_p90 over the uncensored rows
    np.testing.assert_allclose([o["sizing_multiplier"][k] for k in ("q90", "q95", "q99")],
                               exp["sizing"])
    assert o["sizing_multiplier"]["q90"] == pytest.approx(250 / 190)
    # no fallback rows here: the model figures are the overall ones
    assert s["model"]["scored"] == 1000 and s["model"]["coverage"] == pytest.approx(0.8)


def test_row_residuals_flag_censored_absent_and_unhinted_rows():
    frame, _ = _known()
    r = row_residuals(frame)
    assert len(r) == len(frame) and (r.index == frame.index).all()
    finish, life = frame["finish_reason"], frame["lifecycle_state"]
    censored = (finish.isin(["length", "cancelled", "error"])
                | life.isin(["aborted", "failed"])).to_numpy()
    absent = frame["completion_tokens"].isna().to_numpy()
    unhinted = frame["hint_p50"].isna().to_numpy()
    np.testing.assert_array_equal(r["lower_bound"], censored)
    np.testing.assert_array_equal(r["usage_known"], ~absent)
    np.testing.assert_array_equal(r["hinted"], ~unhinted)
    np.testing.assert_array_equal(r["exact"], ~censored & ~absent & ~unhinted)
    # censored, absent and unhinted rows claim no coverage; residual null without usage or hint
    assert r.loc[censored | absent | unhinted, "covered"].isna().all()
    assert r.loc[absent | unhinted, "residual"].isna().all()
    known = ~absent & ~unhinted
    np.testing.assert_allclose(r.loc[known, "residual"], r.loc[known, "actual_total"] - P50)
    assert r.loc[censored & ~absent, "residual"].notna().all()  # a lower-bound residual


def test_coverage_uses_inclusive_bounds_and_zero_p90_has_no_ratio():
    frame = _ledger([LO, HI, LO - 1, HI + 1])
    r = row_residuals(frame.sort_values("request_id").reset_index(drop=True))
    assert list(r["covered"]) == [1.0, 1.0, 0.0, 0.0]
    frame["hint_p90"] = 0.0
    assert row_residuals(frame)["ratio_p90"].isna().all()


# ---------------------------------------------------------------- drift over time
def _bucketed(covered_per_bucket: list[np.ndarray], seed: int = 0) -> pd.DataFrame:
    """One hour per bucket; a covered row's total is 150, an uncovered one's 250."""
    totals, ts = [], []
    for b, cov in enumerate(covered_per_bucket):
        totals.append(np.where(cov, 150.0, 250.0))
        ts.append(T0 + b * HOUR_MS + np.linspace(0, HOUR_MS - 1000, cov.size).astype("int64"))
    return _ledger(np.concatenate(totals), timestamps=np.concatenate(ts), seed=seed)


def _exactly(share: float, n: int = 200) -> np.ndarray:
    return np.arange(n) < round(share * n)


def test_drift_flags_the_under_covered_half_only():
    frame = _bucketed([_exactly(0.8)] * 6 + [_exactly(0.5)] * 6)
    s = residual_summary(frame, time_bucket_s=3600)
    buckets = s["time_series"]["buckets"]
    assert s["time_series"]["bucket_s"] == 3600
    assert [b["bucket_ms"] for b in buckets] == [T0 + i * HOUR_MS for i in range(12)]
    assert [b["scored"] for b in buckets] == [200] * 12
    assert [b["coverage"] for b in buckets] == pytest.approx([0.8] * 6 + [0.5] * 6)
    assert [b["drift"] for b in buckets] == [False] * 6 + [True] * 6
    assert s["drift"]["buckets"] == 12 and s["drift"]["flagged"] == 6
    assert s["drift"]["flagged_buckets_ms"] == [T0 + i * HOUR_MS for i in range(6, 12)]
    assert s["overall"]["coverage"] == pytest.approx(0.65) and s["overall"]["drift"]
    # default width: the span / 12 (at least 60 s)
    default = residual_summary(frame)
    span_s = (frame["timestamp"].max() - frame["timestamp"].min()) / 1000
    assert default["time_series"]["bucket_s"] == pytest.approx(max(span_s / 12, 60))


def test_a_calibrated_ledger_rarely_flags_drift():
    # each bucket's exact 95% interval contains the true 0.8 with probability >= 0.95
    flagged = []
    for seed in range(8):
        rng = np.random.default_rng(seed)
        frame = _bucketed([rng.random(200) < 0.8 for _ in range(12)], seed=seed)
        s = residual_summary(frame, time_bucket_s=3600)
        flagged.append(s["drift"]["flagged"])
    assert flagged[0] <= 2  # one seeded draw: P(> 2 of 12 | 5% each) ~ 2%
    assert max(flagged) <= 3 and sum(flagged) / (8 * 12) <= 0.08, flagged


def test_small_buckets_are_listed_but_never_flagged():
    frame = _bucketed([_exactly(0.8)] * 2 + [_exactly(0.0, n=20)])
    s = residual_summary(frame, time_bucket_s=3600, min_group_rows=30)
    last = s["time_series"]["buckets"][-1]
    assert last["scored"] == 20 and last["coverage"] == 0.0 and last["drift"]  # CI excludes
    assert s["drift"]["flagged"] == 0  # ... but too few rows to flag


def test_fallback_rows_are_excluded_from_the_model_series():
    n = 400
    fallback = np.arange(n) >= 300
    frame = _ledger(np.where(np.arange(n) % 5 == 0, 250.0, 150.0), fallback=fallback)
    s = residual_summary(frame, time_bucket_s=3600)
    assert s["overall"]["rows"] == n and s["model"]["rows"] == 300
    assert s["model"]["coverage"] == pytest.approx(0.8)
    assert s["overall"]["coverage"] == pytest.approx((240 + 100) / 400)  # fallback covers all
    assert sum(b["rows"] for b in s["time_series"]["buckets"]) == 300


# ---------------------------------------------------------------- groups
def test_groups_are_reported_per_column():
    cov_code, cov_chat = _exactly(0.8, 300), _exactly(0.5, 300)
    rare = np.zeros(10, bool)
    totals = np.where(np.r_[cov_code, cov_chat, rare], 150.0, 250.0)
    totals = np.r_[totals, np.full(40, 150.0)]
    category = ["code"] * 300 + ["chat"] * 300 + ["rare"] * 10 + [None] * 40
    model = ["m-a", "m-b"] * 325
    fallback = np.r_[np.zeros(610, bool), np.ones(40, bool)]
    frame = _ledger(totals, category=category, model=model, fallback=fallback)
    s = residual_summary(frame, min_group_rows=30)
    by: dict[str, dict[str, dict]] = {}
    for g in s["groups"]:
        by.setdefault(g["by"], {})[g["value"]] = g
    assert set(by) == {*GROUPS, *ALWAYS}
    for col, groups in by.items():  # every row in exactly one group of each column
        assert sum(g["rows"] for g in groups.values()) == len(frame), col
    cat = by["category"]
    assert set(cat) == {"code", "chat", "rare", "<none>"}
    assert cat["code"]["coverage"] == pytest.approx(0.8) and not cat["code"]["drift"]
    assert cat["chat"]["coverage"] == pytest.approx(0.5) and cat["chat"]["drift"]
    assert cat["rare"]["coverage"] == 0.0 and not cat["rare"]["drift"]  # 10 < 30 rows
    assert cat["<none>"]["rows"] == 40
    assert set(by["slo_class"]) == {"<none>"}  # a column the ledger lacks: one group
    assert set(by["selected_model"]) == {"m-a", "m-b"}
    assert set(by["hint_fallback"]) == {"False", "True"}
    assert by["hint_fallback"]["True"]["rows"] == 40
    assert set(by["hint_model_version"]) == {"1.0.0+abc", "baseline:max_tokens_cap"}
    assert set(by["ack_state"]) == {"used", "ignored"}
    assert "category=chat" in s["drift"]["groups_flagged"]
    assert not {"category=code", "category=rare"} & set(s["drift"]["groups_flagged"])


def test_group_columns_are_configurable():
    frame, _ = _known()
    s = residual_summary(frame, group_columns=("category",))
    assert {g["by"] for g in s["groups"]} == {"category", *ALWAYS}


# ---------------------------------------------------------------- errors, figures
def test_a_ledger_without_hints_is_a_clear_error():
    frame, _ = _known()
    plain = frame.drop(columns=[c for c in frame.columns if c.startswith(("hint_", "ack_"))])
    with pytest.raises(ResidualDataError, match="hint_p50.*replay it first"):
        residual_summary(plain)
    nulls = frame.assign(hint_p50=np.nan)
    with pytest.raises(ResidualDataError, match="no row carries a hint"):
        residual_summary(nulls)


def test_figures_are_written(tmp_path):
    frame = _bucketed([_exactly(0.8)] * 3 + [_exactly(0.5)] * 3)
    s = residual_summary(frame, time_bucket_s=3600)
    paths = residual_figures(s, frame, tmp_path / "fig")
    assert set(paths) == {"drift", "groups", "sizing"}
    for p in paths.values():
        assert p.is_file() and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- the entry point
def _evaluate(tmp_path: Path, *overrides: str) -> dict:
    """`python -m evaluation residuals ...`, in process (tests/helpers/entrypoints.py)."""
    from tests.helpers.entrypoints import evaluate

    return evaluate("residuals", *overrides, "tracking=off", run_dir=tmp_path / "run").summary


def _assert_figures(summary: dict, extra: frozenset = frozenset()) -> None:
    assert set(summary["reports"]) == {"drift", "groups", "sizing", *extra}
    for p in summary["reports"].values():
        assert Path(p).is_file() and Path(p).read_bytes()[:4] == b"\x89PNG"
    assert Path(summary["artifacts"]["by_group"]).is_file()


@pytest.mark.slow
def test_entry_point_on_a_hinted_ledger(tmp_path):
    frame, exp = _known()
    bad = frame.iloc[:1].assign(request_id="bad-row", completion_tokens=-5)  # quarantined
    path = tmp_path / "hinted.parquet"
    pd.concat([frame, bad], ignore_index=True).to_parquet(path, index=False)
    s = _evaluate(tmp_path, f"data.ledger={path}")
    assert s["pipeline"] == "residuals" and s["ledger"] == str(path)
    assert s["rows_read"] == 1131 and s["rows_quarantined"] == 1
    assert Path(s["artifacts"]["quarantine"]).is_file()
    assert s["replayed"] is None and s["rows"] == 1130 and s["nominal"] == 0.8
    o = s["overall"]
    for k in ("hinted", "usage_absent", "lower_bound", "scored"):
        assert o[k] == exp[k], k
    assert o["coverage"] == pytest.approx(0.8)
    assert o["p90_exceedance"] == pytest.approx(0.25)
    assert o["sizing_multiplier"]["q90"] == pytest.approx(250 / 190)
    assert {"buckets", "flagged", "flagged_buckets_ms", "groups_flagged"} <= set(s["drift"])
    assert s["time_series"]["buckets"]
    assert {g["by"] for g in s["groups"]} == {*GROUPS, *ALWAYS}
    _assert_figures(s)


@pytest.mark.slow
def test_entry_point_replays_an_unhinted_ledger_through_an_artifact(tmp_path):
    from replaylab.artifacts.demand_export import export_demand
    from replaylab.demand import DemandConfig
    from replaylab.pipelines.demand import train_demand
    from replaylab.pipelines.project import LedgerInput, load_ledger
    from replaylab.projection import ProjectionConfig, SplitConfig
    from replaylab.sources.synthetic import SyntheticLedgerConfig

    loaded = load_ledger(LedgerInput(
        synthetic=SyntheticLedgerConfig(n_sessions=400, sessions_per_s=0.25)))
    summary, run = train_demand(loaded, ProjectionConfig(), SplitConfig(embargo_ms=300_000),
                                DemandConfig(), tmp_path / "train")
    art = export_demand(run, summary, tmp_path / "art")
    ledger = loaded.result.valid
    assert not any(c.startswith("hint_") for c in ledger.columns)
    path = tmp_path / "plain.parquet"
    ledger.to_parquet(path, index=False)
    s = _evaluate(tmp_path, f"data.ledger={path}", f"experiment.artifact={art}")
    rep = s["replayed"]
    assert rep["loaded"] is True and rep["reason"] is None
    assert rep["artifact"] == str(art) and rep["version"].startswith("1.0.0+")
    out = pd.read_parquet(s["artifacts"]["replayed_ledger"])
    assert len(out) == len(ledger) == s["rows"]
    assert set(out["request_id"]) == set(ledger["request_id"])
    assert validate_ledger(out).rows_quarantined == 0
    o = s["overall"]
    assert o["hinted"] == len(ledger)  # every consumer supports hints here
    assert o["usage_absent"] == int(ledger["completion_tokens"].isna().sum())
    assert o["lower_bound"] > 0 and o["scored"] > 0
    assert 0.6 <= o["coverage"] <= 0.95  # the 0.8 interval, in-sample and out
    assert s["model"]["rows"] == len(ledger)  # no fallback: the artifact is fresh
    on = s["online"]  # online recalibration is on by default: frozen scored beside adaptive
    test_start = json.loads((art / "manifest.json").read_text())["training"]["time_window"][
        "test"]["first_ms"]
    assert on["online_from_ms"] == test_start
    assert 0 < on["rows_scored"] < len(ledger)
    for v in ("frozen", "adaptive"):
        assert 0.5 <= on[v]["coverage"] <= 1.0 and on[v]["mean_width"] > 0
    assert sum(on["drift"]["hints_by_state"].values()) == on["rows_scored"]
    assert out["feedback_at_ms"].notna().any()  # the analysed replay is the adaptive one
    _assert_figures(s, frozenset({"online"}))
