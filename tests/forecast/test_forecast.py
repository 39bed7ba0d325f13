"""Forecast: taxonomy, aggregation, backtest without look-ahead, metrics, summary, glue.

Tiny seeded data (seasonal Poisson aggregates, the synthetic ledger); every
forecaster runs on a few short series, so the whole file takes well under a minute.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from replaylab.config import ConfigError
from replaylab.contracts import validate_aggregates
from replaylab.contracts.columns import Aggregates as A
from replaylab.contracts.columns import Ledger as L
from replaylab.forecast import (
    AggregationConfig,
    BacktestConfig,
    ForecastConfig,
    LightGBMConfig,
    assign_archetypes,
    get_taxonomy,
)
from replaylab.forecast.aggregate import ledger_to_aggregates
from replaylab.forecast.backtest import band, run_backtest, score_backtest
from replaylab.forecast.drift import archetype_mix_drift, js_divergence
from replaylab.forecast.panel import (
    ForecastDataError,
    build_panel,
    choose_seasons,
    plan_backtest,
)
from replaylab.forecast.synthetic import seasonal_poisson_aggregates
from replaylab.pipelines.forecast import aggregate_ledger, run_forecast
from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger

# sha256 of arch-1's vocabulary, one label a line: relabelling arch-1 in place fails here
# (a new taxonomy is a new version; docs/design/archetypes.md).
ARCH_1_SHA256 = "c2f0fc1c8a237d86760feb5088a361eb9aad4408d7ff281903ba8101b39598a6"


def _cfg(**kw) -> ForecastConfig:
    base = dict(backtest=BacktestConfig(horizon_buckets=6, n_windows=8, min_train_buckets=36,
                                        conformal_windows=12),
                lightgbm=LightGBMConfig(n_estimators=40), include_total=False)
    base.update(kw)
    return ForecastConfig(**base)


def _prepare(agg: pd.DataFrame, cfg: ForecastConfig):
    panel = build_panel(validate_aggregates(agg).valid, cfg)
    plan = plan_backtest(panel.n_buckets, cfg.backtest)
    seasons = choose_seasons(cfg.seasonalities_s, panel.bucket_seconds,
                             panel.n_buckets - plan.test_size())
    return panel, plan, seasons


@pytest.fixture(scope="module")
def ledger() -> pd.DataFrame:
    return generate_synthetic_ledger(SyntheticLedgerConfig(n_requests=6000), seed=3)


# ---------------------------------------------------------------- taxonomy
def test_arch_1_vocabulary_is_frozen():
    tax = get_taxonomy("arch-1")
    vocab = tax.vocabulary
    assert len(vocab) == 5 * 4 * 3 == len(set(vocab))
    assert vocab[0] == "pS.oS.d1" and vocab[-1] == "pU.oU.d3"
    digest = hashlib.sha256("\n".join(vocab).encode()).hexdigest()
    assert digest == ARCH_1_SHA256, "arch-1 changed in place: make a new taxonomy version"
    assert tax.version == "arch-1" and tax.prompt_edges == (0, 1024, 4096, 16384)


def test_assign_archetypes_bands_and_fixed_categories():
    frame = pd.DataFrame({
        L.PROMPT_TOKENS: pd.array([100, 1024, 5000, 20000, None], dtype="Int64"),
        L.COMPLETION_TOKENS: pd.array([50, 128, 2000, None, 10], dtype="Int64"),
        L.TURN_INDEX: [0, 1, 4, 9, 0]})
    labels = assign_archetypes(frame)
    assert list(labels) == ["pS.oS.d1", "pM.oM.d2", "pL.oL.d3", "pX.oU.d3", "pU.oS.d1"]
    assert list(labels.cat.categories) == list(get_taxonomy().vocabulary)
    with pytest.raises(ValueError, match="taxonomy_version"):
        assign_archetypes(frame, "arch-99")
    with pytest.raises(ValueError, match="turn_index"):
        assign_archetypes(frame.drop(columns=[L.TURN_INDEX]))


# ---------------------------------------------------------------- aggregation
def test_aggregation_conserves_requests_and_tokens(ledger):
    cfg = AggregationConfig(bucket_seconds=300, k_min=1, trim_edges=False)
    out = ledger_to_aggregates(ledger, cfg)
    agg = out.aggregates
    assert validate_aggregates(agg).rows_quarantined == 0
    assert agg[A.REQUESTS].sum() == len(ledger) == out.report["requests_kept"]
    for col, src in ((A.PROMPT_TOKENS_SUM, L.PROMPT_TOKENS),
                     (A.COMPLETION_TOKENS_SUM, L.COMPLETION_TOKENS)):
        assert int(agg[col].sum()) == int(ledger[src].sum())
    assert (agg[A.PROMPT_TOKENS_P50] <= agg[A.PROMPT_TOKENS_P90]).all()
    assert out.report["suppressed_cells"] == 0


def test_k_min_suppression_is_counted_and_conserves(ledger):
    for mode in ("merge", "drop"):
        cfg = AggregationConfig(bucket_seconds=300, k_min=10, suppression=mode)
        out = ledger_to_aggregates(ledger, cfg)
        rep, agg = out.report, out.aggregates
        assert rep["suppressed_cells"] > 0
        assert (agg[A.REQUESTS] >= 10).all()
        assert agg[A.REQUESTS].sum() + rep["dropped_requests"] + rep["edge_requests"] \
            == len(ledger)
        if mode == "drop":
            assert rep["dropped_requests"] == rep["suppressed_requests"]
            assert "other" not in set(agg[A.ARCHETYPE])
        else:
            assert rep["merged_requests"] + rep["dropped_requests"] == rep["suppressed_requests"]
            other = agg.loc[agg[A.ARCHETYPE] == "other", A.REQUESTS].sum()
            assert other == rep["merged_requests"]


def test_suppressed_cell_merges_into_other():
    # bucket 0: 12 short requests, 3 long ones, 3 very long ones; bucket 1: one request
    ts = np.r_[np.arange(18) * 1000, 700_000]
    frame = pd.DataFrame({L.TIMESTAMP: ts, L.TURN_INDEX: 0,
                          L.PROMPT_TOKENS: np.r_[[10] * 12, [9000] * 3, [20000] * 3, 10],
                          L.COMPLETION_TOKENS: 5})
    cfg = dict(trim_edges=False, slo_classes=None, regions=None)
    out = ledger_to_aggregates(frame, AggregationConfig(k_min=2, **cfg))
    assert out.report["suppressed_cells"] == 1  # the single request in bucket 1
    assert out.report["dropped_requests"] == 1 and out.report["merged_requests"] == 0
    out = ledger_to_aggregates(frame, AggregationConfig(k_min=5, **cfg))
    agg = out.aggregates.set_index(A.ARCHETYPE)
    # the two 3-request cells merge into one `other` cell of 6 (kept); the single
    # request's `other` cell is still under k_min (dropped)
    assert out.report["suppressed_cells"] == 3
    assert out.report["dropped_requests"] == 1 and out.report["merged_requests"] == 6
    assert agg.loc["other", A.REQUESTS] == 6 and agg.loc["pS.oS.d1", A.REQUESTS] == 12
    assert agg[A.REQUESTS].sum() + 1 == len(frame)


def test_edges_are_trimmed_and_counted(ledger):
    out = ledger_to_aggregates(ledger, AggregationConfig(bucket_seconds=600, k_min=1))
    assert out.report["edge_buckets_trimmed"] == 2
    assert out.report["requests_kept"] + out.report["edge_requests"] == len(ledger)


# ---------------------------------------------------------------- backtest
@pytest.fixture(scope="module")
def small_agg() -> pd.DataFrame:
    return seasonal_poisson_aggregates(n_series=3, days=3, seed=1, weekend_factor=1.0)


@pytest.mark.parametrize("refit", [0, 3])
def test_backtest_has_no_look_ahead(small_agg, refit):
    cfg = _cfg(backtest=BacktestConfig(horizon_buckets=6, n_windows=8, min_train_buckets=36,
                                       conformal_windows=12, refit_every_windows=refit))
    panel, plan, seasons = _prepare(small_agg, cfg)
    assert seasons.naive == 144 and seasons.mstl == (144,)
    base = run_backtest(panel, cfg, plan, seasons)
    assert set(base.forecasters) == set(cfg.forecasters), base.skipped
    cut = plan.origins(panel.n_buckets)[3]
    panel.y[:, cut:] = panel.y[:, cut:] * 3 + 50  # the future changes ...
    moved = run_backtest(panel, cfg, plan, seasons)
    cols = [c for n in base.forecasters for c in band(n)]
    early = base.predictions["cutoff"] < cut  # ... origins at or before `cut` must not
    a = base.predictions[early].sort_values(["unique_id", "ds", "cutoff"])[cols].to_numpy()
    b = moved.predictions[moved.predictions["cutoff"] < cut].sort_values(
        ["unique_id", "ds", "cutoff"])[cols].to_numpy()
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)
    late = moved.predictions["cutoff"] >= cut
    assert not np.allclose(base.predictions[late][cols].to_numpy(),
                           moved.predictions[late][cols].to_numpy())


def test_quantiles_do_not_cross_and_are_non_negative(small_agg):
    cfg = _cfg()
    panel, plan, seasons = _prepare(small_agg, cfg)
    p = run_backtest(panel, cfg, plan, seasons).predictions
    for name in cfg.forecasters:
        lo, mid, hi = (p[c].to_numpy() for c in band(name))
        assert (lo >= 0).all() and (lo <= mid + 1e-9).all() and (mid <= hi + 1e-9).all(), name


def test_seasonal_naive_mase_is_one_ish_and_coverage_in_tolerance():
    agg = seasonal_poisson_aggregates(n_series=4, days=4, seed=7, weekend_factor=1.0,
                                      base_rate=60)
    cfg = _cfg(backtest=BacktestConfig(horizon_buckets=6, n_windows=24, conformal_windows=24),
               forecasters=("seasonal_naive", "auto_ets", "lightgbm"))
    panel, plan, seasons = _prepare(agg, cfg)
    bt = run_backtest(panel, cfg, plan, seasons)
    scores = score_backtest(bt, panel, seasons)
    # out of sample, seasonal naive's error is the same kind of seasonal difference as
    # its in-sample scale: MASE ~ 1 on a stationary seasonal series
    assert 0.85 <= scores["seasonal_naive"]["mase"] <= 1.15
    for name in ("auto_ets", "lightgbm"):  # 4 series x 144 buckets: sd of coverage ~0.02
        assert 0.70 <= scores[name]["coverage_80"] <= 0.90, (name, scores[name])
        assert scores[name]["mase"] < scores["seasonal_naive"]["mase"], name


def test_plan_reduces_windows_and_errors_when_too_short():
    plan = plan_backtest(100, BacktestConfig(horizon_buckets=6, n_windows=24,
                                             min_train_buckets=40))
    assert plan.n_windows == (100 - 40 - 6) // 6 + 1 and plan.n_windows_requested == 24
    assert plan.origins(100)[0] >= 40
    with pytest.raises(ForecastDataError, match="min_train_buckets"):
        plan_backtest(20, BacktestConfig(min_train_buckets=36))
    s = choose_seasons((86_400, 604_800), 600, 300)
    assert s.naive == 144 and s.mstl == (144,)
    assert choose_seasons((86_400,), 600, 200).naive == 1


def test_mixed_bucket_widths_are_refused(small_agg):
    other = small_agg.head(5).assign(**{A.BUCKET_SECONDS: 300})
    with pytest.raises(ForecastDataError, match="bucket_seconds"):
        build_panel(pd.concat([small_agg, other]), _cfg())


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="k_min"):
        AggregationConfig(k_min=0)
    with pytest.raises(ValueError, match="regions"):
        AggregationConfig(regions=["Some Free Text"])
    with pytest.raises(ValueError, match="forecasters"):
        ForecastConfig(forecasters=["prophet"])
    cfg = ForecastConfig(forecasters=["lightgbm"], backtest={"horizon_buckets": 3})
    assert cfg.forecasters == ("seasonal_naive", "lightgbm") and cfg.backtest.step == 3


# ---------------------------------------------------------------- drift
def test_js_divergence_bounds_and_mix_drift():
    assert js_divergence([1, 1], [1, 1]) == pytest.approx(0.0)
    assert js_divergence([1, 0], [0, 1]) == pytest.approx(1.0)
    rows = []
    for day in range(3):
        for arch, n in (("pS.oS.d1", 100 if day < 2 else 20), ("pL.oL.d1", 100)):
            for b in range(144):
                rows.append({A.VERSION: "1", A.BUCKET_START: (day * 144 + b) * 600_000,
                             A.BUCKET_SECONDS: 600, A.ARCHETYPE: arch,
                             A.TAXONOMY_VERSION: "arch-1", A.SLO_CLASS: "all",
                             A.REGION: "all", A.REQUESTS: n})
    drift = archetype_mix_drift(pd.DataFrame(rows))
    assert drift["window_s"] == 86_400 and drift["windows"] == 3
    assert drift["js_consecutive"][0] == pytest.approx(0.0)
    assert drift["js_consecutive"][1] > 0.05


# ---------------------------------------------------------------- pipeline + glue
SUMMARY_KEYS = {"pipeline", "series", "buckets", "suppressed_buckets", "horizon_buckets",
                "taxonomy_version", "backtest", "best", "beats_seasonal_naive", "drift",
                "artifacts", "reports", "targets", "plan", "seasons"}


def _check_summary(summary: dict, out: Path) -> None:
    assert SUMMARY_KEYS <= set(summary)
    assert summary["pipeline"] == "forecast"
    for name, s in summary["backtest"].items():
        assert {"mase", "pinball_mean", "coverage_80"} <= set(s), name
    assert summary["best"] in summary["backtest"]
    json.dumps(summary)  # serialisable as summary.json
    fc = pd.read_parquet(summary["artifacts"]["forecast"])
    assert {"requests_q10", "requests_q50", "requests_q90", "forecaster", "forecast_origin",
            "horizon_buckets", A.ARCHETYPE, A.BUCKET_START}.issubset(fc.columns)
    assert (fc["requests_q10"] <= fc["requests_q50"]).all()
    assert (fc["requests_q50"] <= fc["requests_q90"]).all()
    assert sorted(fc["horizon_buckets"].unique()) == list(range(1, summary["horizon_buckets"] + 1))
    assert (out / "report.html").is_file()
    assert all(Path(p).is_file() for p in summary["reports"].values())


def test_run_forecast_summary_and_artifacts(small_agg, tmp_path):
    summary = run_forecast(small_agg, _cfg(include_total=True), tmp_path)
    _check_summary(summary, tmp_path)
    assert summary["series"] == 4 and summary["buckets"] == 432  # 3 series + the total
    assert summary["suppressed_buckets"] == 0 and summary["input"]["from"] == "aggregates"


def test_run_forecast_from_a_ledger(ledger, tmp_path):
    cfg = _cfg(aggregation=AggregationConfig(bucket_seconds=60),
               backtest=BacktestConfig(horizon_buckets=3, n_windows=4, min_train_buckets=24),
               forecasters=("seasonal_naive", "moving_window", "auto_ets"),
               min_nonzero_fraction=0.3)
    agg = aggregate_ledger(ledger, cfg.aggregation)
    summary = run_forecast(agg, cfg, tmp_path)
    _check_summary(summary, tmp_path)
    assert summary["suppressed_buckets"] == agg.report["suppressed_cells"] > 0
    assert "mstl" not in summary["backtest"]  # an hour of data has no usable season
    assert Path(summary["artifacts"]["aggregates"]).is_file()


def test_glue_runs_on_a_composed_config(small_agg, tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from replaylab.apps.forecast import forecast

    path = tmp_path / "agg.csv"
    small_agg.to_csv(path, index=False)
    conf = Path(__file__).resolve().parents[2] / "conf"
    overrides = ["tracking=off", "forecast.backtest.n_windows=4",
                 "forecast.lightgbm.n_estimators=20", "forecast.forecasters=[seasonal_naive,"
                 "moving_window,lightgbm]"]
    from replaylab.apps.schemas import register_schemas

    register_schemas()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["pipeline=forecast", *overrides])
    with open_dict(cfg):
        cfg.data.aggregates = str(path)
    summary = forecast(cfg, tmp_path / "run")
    _check_summary(summary, tmp_path / "run")
    assert summary["input"]["path"] == str(path)
    with open_dict(cfg):
        cfg.data.ledger = "x.parquet"
    with pytest.raises(ConfigError, match="not both"):
        forecast(cfg, tmp_path / "run2")
