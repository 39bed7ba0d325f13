"""Demand: baselines, quantile model, conformal calibration, metrics, bad input.

Statistical properties on tiny seeded data; one pipeline run on a synthetic ledger
of a few thousand sessions shared by the pipeline-level tests.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from replaylab.config import ConfigError, from_mapping
from replaylab.contracts import validate_ledger
from replaylab.demand import DemandConfig, DemandDataError, QuantileModelConfig
from replaylab.demand.baselines import (
    CategoryBucketBaseline,
    MaxTokensCapBaseline,
    PromptLengthBaseline,
    SessionEwmaBaseline,
    make_baselines,
)
from replaylab.demand.conformal import GroupConformal, conformal_quantile, cqr_scores
from replaylab.demand.metrics import interval_metrics
from replaylab.demand.model import QuantileDemandModel
from replaylab.pipelines.demand import train_demand
from replaylab.pipelines.project import LedgerInput, LoadedLedger, load_ledger
from replaylab.projection import ProjectionConfig, SplitConfig, dispatch_time_features
from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger

QS = (0.1, 0.5, 0.9)
SPLIT = SplitConfig(embargo_ms=300_000)


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def small_features() -> pd.DataFrame:
    """Projection of a small seeded synthetic ledger, labelled rows only, with y."""
    ledger = validate_ledger(generate_synthetic_ledger(
        SyntheticLedgerConfig(n_sessions=400, sessions_per_s=0.25), seed=3)).valid
    f = dispatch_time_features(ledger, ProjectionConfig(canary_checks=False))
    f = f[f["label_total_demand"].notna() & ~f["label_censored"]].reset_index(drop=True)
    return f


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory):
    """One demand run on a synthetic ledger of 3,000 sessions (~6k rows)."""
    out = tmp_path_factory.mktemp("demand")
    loaded = load_ledger(LedgerInput(
        synthetic=SyntheticLedgerConfig(n_sessions=3000, sessions_per_s=0.25), defect_rate=0.002))
    summary, run = train_demand(loaded, ProjectionConfig(), SPLIT, DemandConfig(), out)
    return summary, run, None


def _loaded(frame: pd.DataFrame) -> LoadedLedger:
    return LoadedLedger(validate_ledger(frame, source="test"), origin="test")


def _ledger(n_sessions: int = 200, seed: int = 1) -> pd.DataFrame:
    return generate_synthetic_ledger(
        SyntheticLedgerConfig(n_sessions=n_sessions, sessions_per_s=0.25), seed=seed)


# ---------------------------------------------------------------- config
def test_config_names_the_bad_field():
    with pytest.raises(ValueError, match="quantiles"):
        DemandConfig(quantiles=(0.1, 0.9))  # no median
    with pytest.raises(ValueError, match="interval"):
        DemandConfig(interval=1.0)
    with pytest.raises(ConfigError, match="num_leaves"):
        from_mapping(DemandConfig, {"model": {"num_leaves": 0}}, "demand")
    with pytest.raises(ConfigError, match="unknown field"):
        from_mapping(DemandConfig, {"model": {"leaves": 3}}, "demand")
    cfg = from_mapping(DemandConfig, {"quantiles": [0.05, 0.5, 0.95], "model": {"num_threads": 1}},
                       "demand")
    assert cfg.quantiles == (0.05, 0.5, 0.95) and cfg.model == QuantileModelConfig(num_threads=1)


# ---------------------------------------------------------------- baselines
@pytest.mark.parametrize("name", ["prompt_length", "max_tokens_cap", "category_bucket",
                                  "session_ewma"])
def test_baseline_quantiles_have_shape_n_by_3_and_are_monotone(small_features, name):
    f = small_features
    b = make_baselines(QS, 4096, ("category", "decision"), 30)[name]
    pred = b.fit(f, f["label_total_demand"].to_numpy(float)).predict_quantiles(f)
    assert pred.shape == (len(f), 3)
    assert np.isfinite(pred).all()
    assert (np.diff(pred, axis=1) >= 0).all()
    prompt = f["prompt_tokens"].to_numpy(float)
    assert (pred >= prompt[:, None] - 1e-9).all()  # output >= 0
    assert any(k.endswith("_") for k in vars(b))  # learned state


def test_max_tokens_baseline_uses_the_default_when_the_cap_is_absent():
    f = pd.DataFrame({"prompt_tokens": pd.array([100, 200, 300], dtype="Int64"),
                      "max_tokens": pd.array([256, pd.NA, 1024], dtype="Int64")})
    b = MaxTokensCapBaseline(QS, default_max_tokens=777).fit(f, np.array([150.0, 260, 400]))
    pred = b.predict_quantiles(f)
    np.testing.assert_array_equal(pred[:, 0], [100, 200, 300])  # lower levels: prompt only
    np.testing.assert_array_equal(pred[:, 1], [356, 977, 1324])  # prompt + cap (or default)
    np.testing.assert_array_equal(pred[:, 2], pred[:, 1])
    learned = MaxTokensCapBaseline(QS, default_max_tokens=None).fit(f, np.array([150.0, 260, 400]))
    assert learned.default_max_tokens_ == 1024  # the largest cap seen in train


def test_category_bucket_falls_back_for_small_and_unseen_buckets():
    rng = np.random.default_rng(0)
    cat = np.array(["a"] * 200 + ["b"] * 200 + ["c"] * 5)
    out = np.where(cat == "a", 10.0, np.where(cat == "b", 1000.0, 5.0)) + rng.random(cat.size)
    f = pd.DataFrame({"prompt_tokens": np.zeros(cat.size), "category": cat})
    b = CategoryBucketBaseline(QS, ("category",), min_bucket_size=30).fit(f, out)
    test = pd.DataFrame({"prompt_tokens": np.zeros(4), "category": ["a", "b", "c", "zzz"]})
    pred = b.predict_quantiles(test)
    assert 10 <= pred[0, 1] <= 11 and 1000 <= pred[1, 1] <= 1001
    np.testing.assert_allclose(pred[2], b.global_quantiles_)  # 5 rows < 30: global
    np.testing.assert_allclose(pred[3], b.global_quantiles_)  # unseen: global


def test_session_ewma_scales_the_history_and_falls_back_on_first_turns():
    n = 400
    ewma = np.where(np.arange(n) % 2 == 0, np.nan, 100.0)
    f = pd.DataFrame({"prompt_tokens": np.full(n, 50.0), "category": "a",
                      "hist_completion_ewma": ewma})
    out = np.where(np.isnan(ewma), 7.0, 2 * 101.0 - 1)  # ratio (out+1)/(ewma+1) = 2 exactly
    b = SessionEwmaBaseline(QS, ("category",), 30).fit(f, 50.0 + out)
    np.testing.assert_allclose(b.ratio_quantiles_, [2, 2, 2])
    test = pd.DataFrame({"prompt_tokens": [10.0, 10.0], "category": "a",
                         "hist_completion_ewma": [np.nan, 49.0]})
    pred = b.predict_quantiles(test)
    np.testing.assert_allclose(pred[1], 10 + (49 + 1) * 2 - 1)
    np.testing.assert_allclose(pred[0], b.fallback_.predict_quantiles(test)[0])


def test_prompt_length_adds_global_output_quantiles():
    f = pd.DataFrame({"prompt_tokens": np.arange(101.0)})
    b = PromptLengthBaseline(QS).fit(f, f["prompt_tokens"].to_numpy() + np.arange(101.0))
    np.testing.assert_allclose(b.output_quantiles_, [10, 50, 90])


# ---------------------------------------------------------------- model
def test_model_quantiles_never_cross_and_respect_prompt_and_cap(small_features):
    f = small_features
    y = f["label_total_demand"].to_numpy(float)
    # close levels and a tiny model: raw boosters cross; outputs must not
    m = QuantileDemandModel((0.45, 0.5, 0.55), QuantileModelConfig(
        n_estimators=30, num_leaves=4, min_child_samples=5, early_stopping_rounds=0,
        num_threads=1)).fit(f, y)
    raw = np.column_stack([b.predict(m.design(f)) for b in m.boosters_])
    assert (np.diff(raw, axis=1) < 0).any()  # the boosters alone do cross here
    pred = m.predict_quantiles(f)
    assert pred.shape == (len(f), 3)
    assert (np.diff(pred, axis=1) >= 0).all()
    prompt = f["prompt_tokens"].to_numpy(float)
    cap = f["max_tokens"].to_numpy(float, na_value=np.nan)
    assert (pred >= prompt[:, None]).all()
    capped = np.isfinite(cap)
    assert (pred[capped] <= (prompt + cap)[capped, None] + 1e-6).all()
    # and the sort is what makes it so: crossing raw predictions are reordered
    crossing = np.array([[3.0, 1.0, 2.0]])
    one = f.iloc[:1].assign(max_tokens=pd.array([pd.NA], dtype="Int64"))
    np.testing.assert_allclose(m.to_total(one, crossing)[0],
                               prompt[0] + np.expm1([1.0, 2.0, 3.0]))


def test_model_handles_unseen_categories_and_early_stops_on_train_tail(small_features):
    f = small_features
    y = f["label_total_demand"].to_numpy(float)
    m = QuantileDemandModel(QS, QuantileModelConfig(n_estimators=200, num_threads=1)).fit(f, y)
    assert m.validation_rows_ > 0 and all(1 <= k <= 200 for k in m.best_iterations_)
    assert set(m.validation_pinball_) == {"0.1", "0.5", "0.9"}
    assert "category" in m.categories_ and "session_id" not in m.feature_names_
    odd = f.iloc[:5].copy()
    odd["category"] = "never-seen"
    assert np.isfinite(m.predict_quantiles(odd)).all()


# ---------------------------------------------------------------- conformal
def _iid(n: int, rng: np.random.Generator, groups: bool = False):
    """Heteroscedastic iid data and a deliberately too-narrow base band (prompt 0)."""
    x = rng.random(n)
    g = rng.integers(0, 2, n) if groups else np.zeros(n, dtype=int)
    scale = (1.0 + 3.0 * x) * np.where(g == 1, 4.0, 1.0)
    y = 100.0 * (1 + x) * np.exp(0.5 * scale * rng.standard_normal(n))
    center = 100.0 * (1 + x)
    lo, hi = center * np.exp(-0.3 * (1 + 3 * x)), center * np.exp(0.3 * (1 + 3 * x))
    frame = pd.DataFrame({"prompt_tokens": np.zeros(n), "grp": np.where(g == 1, "B", "A")})
    return frame, lo, hi, y


@pytest.mark.parametrize("scale", ["log1p", "linear"])
def test_cqr_guarantee_on_exchangeable_data(scale):
    rng = np.random.default_rng(42)
    cal, test = _iid(3000, rng), _iid(20000, rng)
    for level in (0.5, 0.7, 0.8, 0.9, 0.95):
        cq = GroupConformal(level, (), 200, scale).fit(*cal)
        lo, hi = cq.predict_interval(*test[:3])
        cover = np.mean((test[3] >= lo) & (test[3] <= hi))
        assert abs(cover - level) < 0.025, (scale, level, cover)


def test_group_cqr_covers_each_group_where_global_does_not():
    rng = np.random.default_rng(7)
    cal, test = _iid(4000, rng, groups=True), _iid(20000, rng, groups=True)
    grp = test[0]["grp"].to_numpy()
    glob = GroupConformal(0.8, (), 200).fit(*cal)
    mond = GroupConformal(0.8, ("grp",), 200).fit(*cal)
    for cq, ok in ((glob, False), (mond, True)):
        lo, hi = cq.predict_interval(*test[:3])
        inside = (test[3] >= lo) & (test[3] <= hi)
        per = [np.mean(inside[grp == v]) for v in ("A", "B")]
        assert all(abs(c - 0.8) < 0.03 for c in per) == ok, per


def test_group_below_min_size_uses_the_global_correction():
    rng = np.random.default_rng(0)
    n_a, n_b = 300, 50
    frame = pd.DataFrame({"prompt_tokens": np.zeros(n_a + n_b),
                          "grp": ["A"] * n_a + ["B"] * n_b})
    lo, hi = np.full(n_a + n_b, 10.0), np.full(n_a + n_b, 20.0)
    y = np.concatenate([rng.uniform(5, 25, n_a), rng.uniform(0, 100, n_b)])
    cq = GroupConformal(0.8, ("grp",), min_group_size=200, scale="linear").fit(frame, lo, hi, y)
    scores = cqr_scores(lo, hi, y, np.zeros_like(y), "linear")
    assert cq.corrections_ == {"A": pytest.approx(conformal_quantile(scores[:n_a], 0.2))}
    assert cq.global_correction_ == pytest.approx(conformal_quantile(scores, 0.2))
    q = cq.correction(pd.DataFrame({"grp": ["A", "B", "unseen"], "prompt_tokens": 0.0}))
    np.testing.assert_allclose(q, [cq.corrections_["A"], cq.global_correction_,
                                   cq.global_correction_])
    assert [c["applied"] for c in cq.cells()] == ["group", "global"]


class _Column:
    """A prefit 'regressor' that returns one column of X (MAPIE's prefit contract)."""

    def __init__(self, j: int) -> None:
        self.j = j

    def fit(self, X, y):  # pragma: no cover - prefit
        return self

    def predict(self, X):
        return np.asarray(X)[:, self.j]


def test_hand_written_correction_equals_mapie_on_one_group():
    mapie = pytest.importorskip("mapie.regression")
    rng = np.random.default_rng(5)
    n_cal, n_test = 997, 50
    lo = rng.normal(0, 1, n_cal + n_test)
    hi = lo + rng.uniform(0.5, 2, lo.size)
    y = lo + rng.normal(0.5, 1.2, lo.size) * (hi - lo)
    X = np.column_stack([lo, hi, (lo + hi) / 2])
    ests = [_Column(0), _Column(1), _Column(2)]
    for e in ests:
        e.n_features_in_ = 3
    cqr = mapie.ConformalizedQuantileRegressor(ests, confidence_level=0.8, prefit=True)
    cqr.conformalize(X[:n_cal], y[:n_cal])
    _, bands = cqr.predict_interval(X[n_cal:], symmetric_correction=True)
    ours = GroupConformal(0.8, (), 200, scale="linear")
    # linear scale, prompt 0: g is the identity on the shifted values (g clamps at 0)
    shift = 10.0 - lo.min()
    frame = pd.DataFrame({"prompt_tokens": np.zeros(lo.size)})
    ours.fit(frame.iloc[:n_cal], lo[:n_cal] + shift, hi[:n_cal] + shift, y[:n_cal] + shift)
    got_lo, got_hi = ours.predict_interval(frame.iloc[n_cal:], lo[n_cal:] + shift,
                                           hi[n_cal:] + shift)
    np.testing.assert_allclose(got_lo - shift, bands[:, 0, 0], atol=1e-9)
    np.testing.assert_allclose(got_hi - shift, bands[:, 1, 0], atol=1e-9)


def test_conformal_quantile_rank_and_unbounded():
    scores = np.arange(1.0, 11.0)  # n = 10
    assert conformal_quantile(scores, 0.2) == 9.0  # ceil(11 * 0.8) = 9
    assert conformal_quantile(scores, 0.05) == np.inf  # ceil(11 * 0.95) = 11 > 10


def test_metrics_on_a_hand_example():
    y = np.array([10.0, 20.0])
    q = np.array([[5.0, 10.0, 15.0], [5.0, 10.0, 15.0]])
    m = interval_metrics(y, q, q[:, 0], q[:, 2], QS)
    assert m["pinball"]["0.5"] == pytest.approx((0 + 0.5 * 10) / 2)
    assert m["pinball"]["0.9"] == pytest.approx((0.1 * 5 + 0.9 * 5) / 2)
    assert m["coverage"] == 0.5 and m["mean_width"] == 10 and m["mae_p50"] == 5


# ---------------------------------------------------------------- pipeline
def test_pipeline_coverage_near_nominal_on_synthetic(synthetic_run):
    s, _, _ = synthetic_run
    assert s["interval"] == 0.8
    assert 0.74 <= s["test"]["model"]["coverage"] <= 0.86
    rel = {r["nominal"]: r["observed"] for r in s["test"]["reliability"]}
    assert set(rel) == {0.5, 0.6, 0.7, 0.8, 0.9, 0.95}
    assert rel[0.8] == pytest.approx(s["test"]["model"]["coverage"])
    assert all(abs(obs - nom) < 0.07 for nom, obs in rel.items())
    for g in s["test"]["groups"]:
        if g["n"] >= 200:
            assert 0.70 <= g["coverage"] <= 0.90, g


def test_model_beats_prompt_length_on_synthetic(synthetic_run):
    s, _, _ = synthetic_run
    t = s["test"]
    assert t["model"]["mean_pinball"] < t["baselines"]["prompt_length"]["mean_pinball"]
    assert t["model"]["pinball"]["0.9"] < t["baselines"]["prompt_length"]["pinball"]["0.9"]


def test_pipeline_summary_and_predictions(synthetic_run):
    s, run, _ = synthetic_run
    for key in ("rows_read", "rows_valid", "rows_quarantined", "quarantine_by_reason",
                "ledger_fingerprint"):
        assert key in s
    assert s["projection"]["version"]
    lab = s["labels"]
    assert lab["train"] > lab["calibration"] > 0 and lab["test"] > 0
    assert lab["censored"] > 0 and lab["absent_usage"] > 0
    t = s["test"]
    assert set(t["baselines"]) == {"prompt_length", "max_tokens_cap", "category_bucket",
                                   "session_ewma"}
    for m in [t["model"], *t["baselines"].values()]:
        assert set(m["pinball"]) == {"0.1", "0.5", "0.9"}
        assert {"mean_pinball", "coverage", "mean_width", "mae_p50"} <= set(m)
        assert m["n"] == lab["test"]
    assert {g["by"] for g in t["groups"]} == {"selected_model", "category", "slo_class"}
    assert t["censored"]["n"] > 0 and 0 <= t["censored"]["hi_at_least_observed"] <= 1
    pred = pd.read_parquet(s["artifacts"]["predictions_test"])
    assert len(pred) == s["splits"]["rows"]["test"]
    for p in ("model", "prompt_length", "max_tokens_cap", "category_bucket", "session_ewma"):
        for c in ("q0.1", "q0.5", "q0.9", "lo-80", "hi-80"):
            assert f"{p}-{c}" in pred.columns
    assert {"request_id", "y", "censored", "absent_usage"} <= set(pred.columns)
    assert pred.loc[pred["absent_usage"], "y"].isna().all()
    assert (pred["model-lo-80"] <= pred["model-hi-80"]).all()
    assert run.model.boosters_ and run.calibrator.n_calibration_ == lab["calibration"]
    # the figures a search is judged on before the test split: the validation tail's and
    # the calibration split's mean pinball per level
    assert np.isfinite(s["model"]["validation"]["mean_pinball"])
    assert set(s["calibration"]["pinball"]) == {"0.1", "0.5", "0.9"}


# ---------------------------------------------------------------- bad input
def test_no_usable_labels_is_a_clear_error(tmp_path):
    frame = _ledger()
    frame["completion_tokens"] = pd.array([pd.NA] * len(frame), dtype="Int64")
    with pytest.raises(DemandDataError, match="no usable labels.*completion_tokens null"):
        train_demand(_loaded(frame), ProjectionConfig(), SPLIT, DemandConfig(), tmp_path)


def test_all_censored_is_a_clear_error(tmp_path):
    frame = _ledger()
    frame["finish_reason"] = "length"
    with pytest.raises(DemandDataError, match="censored.*lower bound"):
        train_demand(_loaded(frame), ProjectionConfig(), SPLIT, DemandConfig(), tmp_path)


def test_single_session_is_a_clear_error(tmp_path):
    frame = _ledger(n_sessions=50)
    frame = frame.sort_values("timestamp").reset_index(drop=True)
    frame["session_id"] = "only-session"
    frame["turn_index"] = np.arange(len(frame))
    with pytest.raises(DemandDataError, match="single session"):
        train_demand(_loaded(frame), ProjectionConfig(), SPLIT, DemandConfig(), tmp_path)


def test_too_few_calibration_rows_is_a_clear_error(tmp_path):
    with pytest.raises(DemandDataError, match="calibration split"):
        train_demand(_loaded(_ledger()), ProjectionConfig(), SPLIT,
                     DemandConfig(min_calibration_rows=100_000), tmp_path)
