"""Censoring-aware demand training: the censored pinball loss, the auto rule, the base band,
the variants on seeded data with a known latent demand, the exact export, the pipeline section."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from replaylab.config import ConfigError, from_mapping
from replaylab.contracts import validate_ledger
from replaylab.demand import DemandConfig, QuantileModelConfig
from replaylab.demand.censoring import (
    NONE,
    PINBALL,
    REALIZED,
    censored_pinball_gradient,
    censored_pinball_loss,
    select_censoring,
)
from replaylab.demand.model import QuantileDemandModel, base_band
from replaylab.pipelines.demand import train_demand
from replaylab.pipelines.project import LedgerInput, LoadedLedger, load_ledger
from replaylab.projection import ProjectionConfig, SplitConfig
from replaylab.runtime.demand_math import conformal_band, total_and_band, total_and_band_row
from replaylab.sources.shift import inject_caps
from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger

QS = (0.1, 0.5, 0.9)
SPLIT = SplitConfig(embargo_ms=300_000)


# ---------------------------------------------------------------- the loss
def test_gradient_is_the_derivative_of_the_censored_pinball_loss():
    rng = np.random.default_rng(0)
    y = rng.normal(size=400)
    pred = y + rng.choice([-1.0, 1.0], 400) * rng.uniform(0.1, 2.0, 400)  # away from the kink
    censored = rng.random(400) < 0.4
    for alpha in (0.1, 0.5, 0.9):
        grad, hess = censored_pinball_gradient(pred, y, censored, alpha)
        h = 1e-6
        for i in range(0, 400, 37):
            up, dn = pred.copy(), pred.copy()
            up[i] += h
            dn[i] -= h
            num = (censored_pinball_loss(y, up, censored, alpha)
                   - censored_pinball_loss(y, dn, censored, alpha)) * len(y) / (2 * h)
            assert grad[i] == pytest.approx(num, abs=1e-6)
        assert (hess == 1.0).all()
        # a bound met or exceeded costs nothing; falling short costs alpha per token
        assert (grad[censored & (pred >= y)] == 0).all()
        assert (grad[censored & (pred < y)] == -alpha).all()


def test_censored_loss_equals_pinball_on_label_rows():
    from sklearn.metrics import mean_pinball_loss

    rng = np.random.default_rng(1)
    y, q = rng.normal(size=200), rng.normal(size=200)
    no = np.zeros(200, dtype=bool)
    assert censored_pinball_loss(y, q, no, 0.9) == pytest.approx(mean_pinball_loss(y, q, alpha=0.9))
    # over-predicting a lower bound is free
    assert censored_pinball_loss(y, y + 5.0, ~no, 0.9) == 0.0


# ---------------------------------------------------------------- the auto rule
def _cand(pinball: float, hit: float | None, n: int = 40) -> dict:
    return {"mean_pinball": pinball, "capped_n": n, "capped_hi_ge_obs": hit}


def test_select_keeps_none_when_too_few_rows_or_pinball_worse():
    method, reason = select_censoring(
        {NONE: _cand(10.0, 0.0, n=5), REALIZED: _cand(9.0, 1.0, n=5)}, 20, 0.01)
    assert method == NONE and "too few" in reason
    method, reason = select_censoring(
        {NONE: _cand(10.0, 0.1), REALIZED: _cand(10.2, 0.9), PINBALL: _cand(10.0, 0.1)}, 20, 0.01)
    assert method == NONE and "realized" in reason and "+2.00%" in reason


def test_select_takes_the_largest_capped_gain_within_the_pinball_limit():
    cands = {NONE: _cand(10.0, 0.2), REALIZED: _cand(10.04, 0.5), PINBALL: _cand(10.09, 0.7)}
    assert select_censoring(cands, 20, 0.01)[0] == PINBALL
    assert select_censoring(cands, 20, 0.005)[0] == REALIZED
    assert select_censoring(cands, 20, 0.0)[0] == NONE
    # a gain below min_capped_gain is noise, not a win
    assert select_censoring(cands, 20, 0.01, min_capped_gain=0.4)[0] == PINBALL
    assert select_censoring(cands, 20, 0.01, min_capped_gain=0.6)[0] == NONE


def test_select_needs_the_pinball_limit_on_both_halves_of_the_window():
    base = {**_cand(10.0, 0.1), "halves_mean_pinball": [12.0, 8.0]}
    drift = {**_cand(10.0, 0.9), "halves_mean_pinball": [11.6, 8.4]}  # later half +5%
    steady = {**_cand(10.05, 0.6), "halves_mean_pinball": [12.05, 8.05]}
    method, reason = select_censoring({NONE: base, REALIZED: drift, PINBALL: steady}, 20, 0.01)
    assert method == PINBALL and "+5.00%" in reason
    assert select_censoring({NONE: base, REALIZED: drift}, 20, 0.01)[0] == NONE


def test_censoring_config_names_the_bad_field():
    with pytest.raises(ConfigError, match="method"):
        from_mapping(DemandConfig, {"censoring": {"method": "tobit"}}, "demand")
    with pytest.raises(ConfigError, match="classes"):
        from_mapping(DemandConfig, {"censoring": {"classes": ["absent_usage"]}}, "demand")
    with pytest.raises(ConfigError, match="rounds"):
        from_mapping(DemandConfig, {"censoring": {"rounds": 0}}, "demand")
    cfg = from_mapping(DemandConfig, {"censoring": {"method": "pinball", "classes": ["length"]}},
                       "demand")
    assert cfg.censoring.method == "pinball" and cfg.censoring.classes == ("length",)


# ---------------------------------------------------------------- the base band
def test_band_before_the_clip_reaches_the_cap_where_the_clipped_band_cannot():
    prompt, cap = np.array([100.0, 100.0]), np.array([256.0, 256.0])
    raw = np.log1p(np.array([[50.0, 200.0, 600.0], [20.0, 60.0, 120.0]]))
    total, lo_u, hi_u = total_and_band(raw, prompt, cap, "log1p", clipped_band=False)
    _, lo_c, hi_c = total_and_band(raw, prompt, cap, "log1p", clipped_band=True)
    assert total[0, -1] == 356.0 and hi_u[0] == pytest.approx(700.0) and hi_c[0] == 356.0
    narrow = np.full(2, -0.3)  # a correction that narrows the band
    _, h_u = conformal_band(lo_u, hi_u, prompt, narrow, cap, "log1p")
    _, h_c = conformal_band(lo_c, hi_c, prompt, narrow, cap, "log1p")
    assert h_u[0] == 356.0 > h_c[0]  # 600 * e^-0.3 > cap: still at the cap
    assert h_u[1] == pytest.approx(h_c[1])  # a band under the cap: the same either way
    # one-row path, same numbers
    t1, l1, h1 = total_and_band_row(raw[0].tolist(), 100.0, 256.0, "log1p", False)
    assert t1 == pytest.approx(total[0].tolist()) and (l1, h1) == pytest.approx((lo_u[0], hi_u[0]))


def test_clipping_after_the_correction_never_changes_an_uncensored_rows_coverage():
    rng = np.random.default_rng(2)
    n = 5000
    prompt = rng.integers(10, 500, n).astype(float)
    cap = rng.choice([64.0, 256.0, 1024.0], n)
    out = np.minimum(rng.lognormal(4.5, 1.0, n), cap - 1)  # uncensored: below the cap
    y = prompt + out
    raw = np.column_stack([np.log1p(out) + d for d in (-0.8, 0.0, 0.8)]) + rng.normal(0, 0.5, (n, 1))
    _, lo, hi = total_and_band(raw, prompt, None, "log1p", clipped_band=False)
    corr = rng.normal(0, 0.3, n)
    a = conformal_band(lo, hi, prompt, corr, None, "log1p")
    b = conformal_band(lo, hi, prompt, corr, cap, "log1p")
    assert np.array_equal((y >= a[0]) & (y <= a[1]), (y >= b[0]) & (y <= b[1]))
    assert (b[1] <= prompt + cap).all()


# ---------------------------------------------------------------- the variants
@pytest.fixture(scope="module")
def latent():
    """Seeded requests with a known latent output: log-normal by category, cut at a cap."""
    rng = np.random.default_rng(7)
    n = 6000
    cat = rng.choice(["short", "long"], n)
    cap = rng.choice([256.0, 512.0, 1024.0], n)
    mu = np.where(cat == "long", 5.3, 4.7)
    latent_out = np.rint(np.exp(mu + rng.normal(0, 0.8, n)))
    censored = latent_out >= cap
    out = np.minimum(latent_out, cap)
    prompt = rng.integers(20, 200, n).astype(float)
    f = pd.DataFrame({
        "session_id": [f"s{i // 3}" for i in range(n)], "timestamp": np.arange(n) * 1000,
        "prompt_tokens": pd.array(prompt.astype(int), dtype="Int64"),
        "max_tokens": pd.array(cap.astype(int), dtype="Int64"), "category": cat})
    return f, prompt + out, censored, prompt + latent_out


def _fit(f, y, censored, method, rounds=60):
    cfg = QuantileModelConfig(n_estimators=150, num_threads=1, early_stopping_rounds=0,
                              refit_full_train=False)
    return QuantileDemandModel(QS, cfg, seed=0, censoring=method, censored_rounds=rounds).fit(
        f, y, censored=censored)


def test_censored_variants_lift_the_top_quantile_where_requests_hit_their_cap(latent):
    f, y, censored, true_total = latent
    tr, te = slice(0, 4000), slice(4000, None)
    c_te = censored[te]
    hit, latent_pinball = {}, {}
    for method in (NONE, REALIZED, PINBALL):
        m = _fit(f[tr], y[tr], censored[tr], method)
        q, lo, hi = base_band(m, f[te])
        hit[method] = float(np.mean(q[c_te, -1] >= y[te][c_te] - 1e-6))
        # the none model was trained on label rows alone: biased low near the cap
        latent_pinball[method] = censored_pinball_loss(y[te], q[:, -1], c_te, 0.9)
    assert c_te.sum() > 150
    assert hit[NONE] < 0.5 and hit[PINBALL] > hit[NONE] + 0.2 and hit[REALIZED] > hit[NONE] + 0.2
    assert latent_pinball[PINBALL] < latent_pinball[NONE]


def test_pinball_variant_keeps_every_tree_and_exports_exactly(latent):
    from replaylab.artifacts.onnx_lgbm import booster_to_onnx, design_to_matrix

    ort = pytest.importorskip("onnxruntime")
    f, y, censored, _ = latent
    m = _fit(f[:3000], y[:3000], censored[:3000], PINBALL)
    native = _fit(f[:3000], y[:3000], censored[:3000], NONE)
    assert m.best_iterations_ == [k + 60 for k in native.best_iterations_]
    for b, k in zip(m.boosters_, m.best_iterations_, strict=True):
        assert b.num_trees() == k
    # the first trees are the native model's: same raw scores at its round count
    X = m.design(f[3000:])  # the design matrix LightGBM sees
    assert np.array_equal(m.boosters_[2].predict(X, num_iteration=native.best_iterations_[2]),
                          native.boosters_[2].predict(X, num_iteration=native.best_iterations_[2]))
    onnx_model = booster_to_onnx(m.boosters_[2], m.feature_names_)
    sess = ort.InferenceSession(onnx_model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"X": design_to_matrix(X, m.boosters_[2].pandas_categorical)})[0][:, 0]
    want = m.boosters_[2].predict(X, raw_score=True)
    assert np.max(np.abs(got - want)) < 1e-12


def test_fewer_censored_rounds_of_one_fit_are_the_model_fitted_with_fewer(latent):
    f, y, censored, _ = latent
    m60 = _fit(f[:2000], y[:2000], censored[:2000], PINBALL)
    m20 = _fit(f[:2000], y[:2000], censored[:2000], PINBALL, rounds=20)
    cut = m60.with_censored_rounds(20)
    assert cut.best_iterations_ == m20.best_iterations_ and cut.censored_rounds_ == 20
    assert np.allclose(cut.predict_quantiles(f[2000:3000]), m20.predict_quantiles(f[2000:3000]),
                       rtol=0, atol=1e-9)
    assert m60.best_iterations_ == [k + 60 for k in m20.native_iterations_]  # m60 untouched
    with pytest.raises(ValueError, match="rounds"):
        m60.with_censored_rounds(61)


def test_none_drops_censored_rows_and_realized_keeps_them(latent):
    f, y, censored, _ = latent
    none = _fit(f[:2000], y[:2000], censored[:2000], NONE)
    plain = QuantileDemandModel(QS, QuantileModelConfig(
        n_estimators=150, num_threads=1, early_stopping_rounds=0, refit_full_train=False),
        seed=0).fit(f[:2000][~censored[:2000]], y[:2000][~censored[:2000]])
    assert np.array_equal(none.predict_quantiles(f[2000:3000]), plain.predict_quantiles(f[2000:3000]))
    assert none.censored_rows_ == 0
    assert _fit(f[:2000], y[:2000], censored[:2000], REALIZED).censored_rows_ == censored[:2000].sum()


# ---------------------------------------------------------------- the pipeline
def _loaded(frame: pd.DataFrame) -> LoadedLedger:
    return LoadedLedger(validate_ledger(frame, source="test"), origin="test")


@pytest.fixture(scope="module")
def auto_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("censoring")
    # seed 2: 28 censored calibration rows (>= censoring.min_rows), so the variants are
    # fitted and judged (with fewer, none is fitted: `fit_partitions.choose_censoring`)
    loaded = load_ledger(LedgerInput(
        synthetic=SyntheticLedgerConfig(n_sessions=2500, sessions_per_s=0.25), seed=2))
    return train_demand(loaded, ProjectionConfig(), SPLIT, DemandConfig(), out)


@pytest.mark.slow
def test_auto_reports_every_variant_and_chooses_on_calibration(auto_run):
    summary, run = auto_run
    c = summary["censoring"]
    assert c["configured"] == "auto" and c["classes"] == ["length"]
    assert set(c["candidates"]) == {NONE, REALIZED, "pinball@10", "pinball@30", "pinball@100"}
    cal = {k: v["calibration"] for k, v in c["candidates"].items()}
    assert (c["candidate"], c["reason"]) == select_censoring(cal, 20, 0.01, 0.05)
    assert run.model.censoring == c["method"] == c["candidate"].split("@")[0]
    if c["method"] == PINBALL:
        assert c["candidate"] == f"pinball@{c['pinball_rounds']}"
    for v in c["candidates"].values():
        assert v["calibration"]["capped_n"] == c["calibration_censored_rows"] > 0
        assert 0.7 < v["test_report_only"]["coverage"] < 0.9
    # the test section's lower-bound figures are the chosen model's
    chosen = c["candidates"][c["candidate"]]["test_report_only"]
    assert summary["test"]["censored"]["by_reason"]["length"]["hi_at_least_observed"] == \
        pytest.approx(chosen["capped_hi_ge_obs"])
    # the unclipped base band alone lifts capped rows off zero (0 of 49 before it)
    assert c["candidates"][NONE]["test_report_only"]["capped_hi_ge_obs"] > 0.0
    # the report shows the choice and one row per candidate and split
    from pathlib import Path

    html = Path(summary["reports"]["html"]).read_text()
    section = html[html.index("Censoring-aware training"):]
    assert f"Trained: <b>{c['method']}</b>" in section
    assert section.count("<td class='l'>test</td>") == 5


@pytest.mark.slow
def test_chosen_model_exports_and_serves_with_the_unclipped_band(auto_run, tmp_path):
    from replaylab.artifacts.demand_export import export_demand
    from replaylab.runtime.demand import DemandPredictor

    summary, run = auto_run
    export_demand(run, summary, tmp_path / "art")
    import json

    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert manifest["calibration"]["base_band"] == "unclipped"
    pred = DemandPredictor.load(tmp_path / "art")  # checks the golden vectors at load
    assert pred.loaded, pred.reason


def test_a_ledger_without_caps_trains_on_labels_and_says_why(tmp_path):
    ledger = generate_synthetic_ledger(SyntheticLedgerConfig(n_sessions=300, sessions_per_s=0.25),
                                       seed=2)
    ledger = ledger.drop(columns=["max_tokens", "finish_reason"])
    summary, run = train_demand(_loaded(ledger), ProjectionConfig(), SPLIT, DemandConfig(),
                                tmp_path)
    c = summary["censoring"]
    assert c["method"] == NONE and c["train_censored_rows"] == 0 and "min_rows" in c["reason"]
    assert "candidates" not in c and run.model.censoring == NONE


# ---------------------------------------------------------------- imposed caps
def test_inject_caps_cuts_at_the_cap_and_keeps_a_valid_ledger():
    ledger = generate_synthetic_ledger(SyntheticLedgerConfig(n_sessions=200, sessions_per_s=0.25),
                                       seed=4).drop(columns=["max_tokens", "finish_reason"])
    a = inject_caps(ledger, caps=(64, 256), seed=1)
    b = inject_caps(ledger, caps=(64, 256), seed=1)
    pd.testing.assert_frame_equal(a, b)
    v = validate_ledger(a, source="caps")
    assert v.rows_quarantined == 0 and len(v.valid) == len(ledger)
    old = ledger["completion_tokens"].astype("float64").to_numpy()
    cap = a["max_tokens"].astype("float64").to_numpy()
    new = a["completion_tokens"].astype("float64").to_numpy()
    cut = (a["finish_reason"] == "length").to_numpy()
    known = np.isfinite(old)
    assert np.array_equal(cut[known], old[known] >= cap[known]) and cut.sum() > 0
    assert (new[known] <= cap[known]).all() and np.array_equal(new[known & ~cut], old[known & ~cut])
    assert a.groupby("session_id")["max_tokens"].nunique().max() == 1  # one cap per client
    assert a.attrs["caps"]["rows_cut_at_cap"] == int(cut.sum())
    true = a.attrs["caps"]["true_completion"]
    assert len(true) == cut.sum() and all(t >= 64 for t in true.values())
    with pytest.raises(ValueError, match="caps"):
        inject_caps(ledger, caps=(0,))


@pytest.mark.slow
def test_auto_fits_no_variant_when_too_few_censored_calibration_rows_can_judge_one(tmp_path):
    """26 censored train rows (enough to fit a variant) but 2 in calibration (< min_rows):
    select_censoring could only answer none, so no variant is fitted and the section says
    why, with the label-rows model trained."""
    frame = generate_synthetic_ledger(
        SyntheticLedgerConfig(n_sessions=1500, sessions_per_s=0.25), seed=5)
    summary, run = train_demand(LoadedLedger(validate_ledger(frame, source="test"),
                                             origin="test"), ProjectionConfig(), SPLIT,
                                DemandConfig(), tmp_path)
    c = summary["censoring"]
    assert c["train_censored_rows"] >= 20 > c["calibration_censored_rows"]
    assert c["method"] == c["candidate"] == NONE and "candidates" not in c
    assert c["reason"] == (f"{c['calibration_censored_rows']} censored calibration rows < "
                           "censoring.min_rows=20: too few to judge a variant (none fitted)")
    assert run.model.censoring == NONE and run.model.censored_rows_ == 0
