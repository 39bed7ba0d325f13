"""The interval serving serves, judged by the gate (issue 45, item 6), and the demand
gate's third verdict (item 2).

A drifting synthetic stream: the calibration window's noise differs from the test
window's, so the static (frozen) interval over- or under-covers; the runtime's online
recalibration replayed over the test window (`demand.served.served_band`) stays in the
band. A test set too small to check the band reads NOT ENOUGH EVIDENCE with the data
it needs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from replaylab.apps.verdicts import demand_line
from replaylab.demand.config import DemandConfig, ServedConfig
from replaylab.demand.conformal import GroupConformal
from replaylab.demand.gate import coverage_target, gate_from_rows, verdict_text, within_target
from replaylab.demand.served import end_ms_of, ledger_end_ms, rows_per_day, served_band
from replaylab.runtime.demand_math import conformal_band
from replaylab.runtime.online import OnlineConfig
from replaylab.verdict import GO, NO_GO, NOT_ENOUGH_EVIDENCE

LEVEL = 0.8
Z90 = 1.2816  # the model's 10% / 90% quantiles on the log scale: mu -+ Z90 * MODEL_SD
MODEL_SD = 0.8


def stream(n: int, sd: float, seed: int, t0_ms: float = 0.0):
    """n requests one second apart, each ending 30 s after dispatch; log output ~ N(6, sd)."""
    rng = np.random.default_rng(seed)
    prompt = np.full(n, 100.0)
    mu = rng.normal(6.0, 0.3, n)
    y = prompt + np.expm1(mu + sd * rng.normal(size=n))
    lo, hi = prompt + np.expm1(mu - Z90 * MODEL_SD), prompt + np.expm1(mu + Z90 * MODEL_SD)
    t = t0_ms + 1000.0 * np.arange(n)
    return {"t": t, "end": t + 30_000.0, "prompt": prompt, "y": y, "lo": lo, "hi": hi}


def calibrated(cal: dict) -> GroupConformal:
    features = pd.DataFrame({"prompt_tokens": cal["prompt"]})
    return GroupConformal(LEVEL, (), 200, "log1p").fit(features, cal["lo"], cal["hi"], cal["y"])


def replay(test: dict, cq: GroupConformal, cfg: ServedConfig | None = None):
    n, cfg = len(test["t"]), cfg or ServedConfig()
    return served_band(test["t"], test["end"], np.full(n, "*", dtype=object), cq.corrections_,
                       cq.global_correction_, LEVEL, test["lo"], test["hi"], test["prompt"],
                       None, test["y"], np.zeros(n, bool), "log1p", cfg)


def covered(y, lo, hi) -> float:
    return float(np.mean((y >= lo) & (y <= hi)))


@pytest.mark.parametrize("test_sd, static_side", [(0.9, "over"), (1.3, "under")])
def test_static_interval_misses_the_band_under_drift_and_the_served_one_holds_it(
        test_sd, static_side):
    """Calibrated on noise sd 1.0; the test window's sd 0.9 (static over-covers) or 1.3
    (static under-covers). The replayed online tracker brings coverage into 0.77-0.83."""
    cq = calibrated(stream(3000, 1.0, seed=1))
    test = stream(6000, test_sd, seed=2, t0_ms=4e6)
    q0 = np.full(6000, cq.global_correction_)
    flo, fhi = conformal_band(test["lo"], test["hi"], test["prompt"], q0, None, "log1p")
    static = covered(test["y"], flo, fhi)
    band = replay(test, cq)
    served = covered(test["y"], band.lo, band.hi)
    lo_t, hi_t = coverage_target(LEVEL)
    assert (static > hi_t) if static_side == "over" else (static < lo_t), static
    assert within_target(served, LEVEL), (static, served)
    # the served band is the frozen one moved by the tracker: narrower when over-covering
    width = np.mean(band.hi - band.lo) / np.mean(fhi - flo)
    assert (width < 1.0) if static_side == "over" else (width > 1.0)
    assert band.fed_back == 6000 - 30 and band.actuals == 6000  # the last 30 s end after it
    assert band.state["drift"] in ("ok", "retrain", "fallback")
    # the same band on the same calibration holds on exchangeable data too (no harm)
    same = replay(stream(6000, 1.0, seed=3, t0_ms=4e6), cq)
    assert within_target(covered(stream(6000, 1.0, seed=3)["y"], same.lo, same.hi), LEVEL)


def test_online_off_serves_the_frozen_band_and_actuals_wait_for_the_end():
    cq = calibrated(stream(2000, 1.0, seed=4))
    test = stream(1000, 1.3, seed=5, t0_ms=3e6)
    n = 1000
    q0 = np.full(n, cq.global_correction_)
    flo, fhi = conformal_band(test["lo"], test["hi"], test["prompt"], q0, None, "log1p")
    off = replay(test, cq, ServedConfig(online=False))
    assert np.array_equal(off.lo, flo) and np.array_equal(off.hi, fhi)
    # every request ends after the last dispatch: nothing is fed back, nothing moves
    late = dict(test, end=np.full(n, test["t"][-1] + 1.0))
    held = replay(late, cq)
    assert held.fed_back == 0 and np.array_equal(held.lo, flo)
    # usage absent (NaN) is served but never fed back; unknown ends are modeled and counted
    gaps = dict(test, y=np.where(np.arange(n) % 2 == 0, np.nan, test["y"]),
                end=np.full(n, np.nan))
    g = replay(gaps, cq)
    assert g.modeled_end == n // 2 and 0 < g.fed_back <= n // 2


def test_served_defaults_are_the_runtimes_and_bad_values_name_the_field():
    runtime = OnlineConfig()
    served = ServedConfig().online_config()
    assert served == runtime  # the gate judges what serving runs with by default
    assert DemandConfig().served == ServedConfig()
    with pytest.raises(ValueError, match=r"ServedConfig.step=-1"):
        ServedConfig(step=-1)
    with pytest.raises(ValueError, match=r"ServedConfig.online='yes'"):
        ServedConfig(online="yes")
    assert dataclasses.replace(ServedConfig(), online=False).online_config().enabled is False


def test_request_ends_come_from_the_ledger_by_request_id():
    ledger = pd.DataFrame({"request_id": ["a", "b", "c"], "timestamp": [1000, 2000, 3000],
                           "ended_at": [1500, None, None], "duration_ms": [9, 700, None]},
                          ).astype({"ended_at": "Int64", "duration_ms": "Int64"})
    assert np.allclose(ledger_end_ms(ledger), [1500, 2700, np.nan], equal_nan=True)
    features = pd.DataFrame({"request_id": ["c", "a", "zz"]})
    assert np.allclose(end_ms_of(features, ledger), [np.nan, 1500, np.nan], equal_nan=True)
    assert rows_per_day(np.array([0.0, 43_200_000.0])) == pytest.approx(4.0)
    assert rows_per_day(np.array([5.0])) is None


# ---------------------------------------------------------------- three verdicts
def gate_rows(n: int, sessions: int, seed: int = 0, width: float = 1.0):
    """Labelled rows with a calibrated interval (coverage ~0.8 at width 1) and a model far
    better than the one baseline."""
    rng = np.random.default_rng(seed)
    session = rng.integers(0, sessions, n)
    mu = rng.normal(5.5, 0.8, n)
    y = np.exp(mu + rng.normal(0, 0.7, n))
    z = np.array([-Z90, 0.0, Z90])
    q = np.exp(mu[:, None] + 0.7 * z[None, :])
    lo, hi = np.exp(mu - width * 0.7 * Z90), np.exp(mu + width * 0.7 * Z90)
    flat = np.exp(np.full((n, 1), 5.5) + 1.1 * z[None, :])
    return y, q, lo, hi, {"prompt_length": flat}, session


def test_a_tiny_test_set_reads_not_enough_evidence_with_the_data_it_needs():
    y, q, lo, hi, base, session = gate_rows(80, 40)
    g = gate_from_rows(LEVEL, y, q, lo, hi, base, (0.1, 0.5, 0.9), session, 400, 0,
                       rows_per_day=50.0)
    assert g["verdict"] == NOT_ENOUGH_EVIDENCE and g["go"] is False
    ev = g["evidence"]
    assert not ev["checkable"] and ev["ci_width"] > 0.06 and ev["reaches_band"]
    # the interval's width shrinks as 1/sqrt(n): n * (width / 0.06)^2 rows in all
    assert ev["more_rows"] == pytest.approx(80 * ((ev["ci_width"] / 0.06) ** 2 - 1), abs=1)
    assert ev["more_days"] == pytest.approx(ev["more_rows"] / 50.0)
    assert f"~{ev['more_rows']} more labelled test rows" in g["reasons"][-1]
    assert "days at 50 per day" in g["reasons"][-1] and "more sessions" in g["reasons"][-1]
    assert verdict_text(g).startswith("NOT ENOUGH EVIDENCE: ")
    line = demand_line({"gate": g})
    assert line.startswith("demand: NOT ENOUGH EVIDENCE (objective: served 80% interval")
    # the same rows, 40 times as many: the band can be checked and the model wins: GO
    y, q, lo, hi, base, session = gate_rows(3200, 1600)
    big = gate_from_rows(LEVEL, y, q, lo, hi, base, (0.1, 0.5, 0.9), session, 400, 0)
    assert big["evidence"]["checkable"] and big["verdict"] == GO and big["go"] is True
    assert demand_line({"gate": big}).startswith("demand: GO (objective: ")


def test_thin_evidence_that_already_fails_is_a_plain_no_go():
    # an interval far too narrow: even 80 rows put the whole coverage interval below the band
    y, q, lo, hi, base, session = gate_rows(80, 40, width=0.2)
    g = gate_from_rows(LEVEL, y, q, lo, hi, base, (0.1, 0.5, 0.9), session, 400, 0)
    assert not g["evidence"]["reaches_band"] and g["verdict"] == NO_GO and g["go"] is False
    # a model significantly worse than the baseline: NO-GO however thin the coverage evidence
    y, q, lo, hi, base, session = gate_rows(80, 40)
    worse = {"oracle": np.exp(np.log(y)[:, None] + np.array([-0.01, 0.0, 0.01])[None, :])}
    g = gate_from_rows(LEVEL, y, q, lo, hi, worse, (0.1, 0.5, 0.9), session, 400, 0)
    assert g["vs_best_baseline"]["ci"][0] > 0 and g["verdict"] == NO_GO


@pytest.mark.slow
def test_the_pipeline_on_a_tiny_ledger_says_not_enough_evidence_everywhere(tmp_path):
    """A 300-session ledger leaves ~90 labelled test rows: the run's gate, console line and
    report all say NOT ENOUGH EVIDENCE, go is false, and the served interval is on disk."""
    from replaylab.demand import QuantileModelConfig
    from replaylab.demand.config import CensoringConfig
    from replaylab.pipelines.demand import train_demand
    from replaylab.pipelines.project import LedgerInput, load_ledger
    from replaylab.projection import ProjectionConfig, SplitConfig
    from replaylab.sources.synthetic import SyntheticLedgerConfig

    loaded = load_ledger(LedgerInput(synthetic=SyntheticLedgerConfig(n_sessions=300,
                                                                     sessions_per_s=0.25)))
    cfg = DemandConfig(model=QuantileModelConfig(n_estimators=100, num_threads=1),
                       censoring=CensoringConfig(method="none"))
    s, _ = train_demand(loaded, ProjectionConfig(), SplitConfig(embargo_ms=300_000), cfg,
                        tmp_path)
    g = s["gate"]
    assert s["test"]["labelled_rows"] < 200
    assert g["verdict"] == NOT_ENOUGH_EVIDENCE and g["go"] is False
    assert g["coverage"]["value"] == s["test"]["served"]["coverage"]
    assert g["coverage"]["frozen"] == s["test"]["model"]["coverage"]
    assert g["evidence"]["more_rows"] > 0 and g["evidence"]["more_days"] > 0
    assert demand_line(s).startswith("demand: NOT ENOUGH EVIDENCE (objective: served 80%")
    html = open(s["reports"]["html"], encoding="utf-8").read()
    assert "gate-verdict thin'>NOT ENOUGH EVIDENCE</span>" in html
    served = pd.read_parquet(s["artifacts"]["served_test"])
    assert len(served) == s["test"]["rows"] and list(served.columns)[1:] == ["served-lo-80",
                                                                          "served-hi-80"]
    assert (served["served-lo-80"] <= served["served-hi-80"]).all()


@pytest.mark.slow
def test_the_gated_interval_is_what_the_exported_artifact_serves_in_a_replay(tmp_path):
    """Train, export, load the artifact in the runtime (online on, its defaults) and replay
    the test window through it (`hints.replay.replay_hints`, deployed at the first test
    dispatch): every hint's interval equals the served interval the gate judged."""
    from datetime import UTC, datetime

    from replaylab.artifacts.demand_export import export_demand
    from replaylab.demand import QuantileModelConfig
    from replaylab.demand.config import CensoringConfig
    from replaylab.hints.replay import replay_hints
    from replaylab.pipelines.demand import train_demand
    from replaylab.pipelines.project import LedgerInput, load_ledger
    from replaylab.projection import ProjectionConfig, SplitConfig
    from replaylab.runtime.demand import DemandPredictor
    from replaylab.sources.synthetic import SyntheticLedgerConfig

    loaded = load_ledger(LedgerInput(synthetic=SyntheticLedgerConfig(n_sessions=1500,
                                                                     sessions_per_s=0.25)))
    cfg = DemandConfig(model=QuantileModelConfig(n_estimators=100, num_threads=1),
                       censoring=CensoringConfig(method="none"), min_group_size=100)
    s, run = train_demand(loaded, ProjectionConfig(), SplitConfig(embargo_ms=300_000), cfg,
                          tmp_path)
    t0 = s["time_window"]["test"]["first_ms"]
    export_demand(run, s, tmp_path / "art", created=datetime.fromtimestamp(t0 / 1000, UTC))
    predictor = DemandPredictor.load(tmp_path / "art", clock=lambda: t0 / 1000 + 1)
    assert predictor.loaded and predictor.online_config == cfg.served.online_config()
    features = pd.read_parquet(s["artifacts"]["features"])
    test_ids = set(features.loc[features["split"] == "test", "request_id"])
    ledger = loaded.result.valid
    replay = replay_hints(ledger[ledger["request_id"].isin(test_ids)], predictor,
                          online_from_ms=t0).set_index("request_id")
    served = pd.read_parquet(s["artifacts"]["served_test"]).set_index("request_id")
    both = replay.join(served, how="inner")
    assert len(both) == len(served) == s["test"]["rows"]
    np.testing.assert_allclose(both["hint_lo"], both["served-lo-80"], rtol=1e-9)
    np.testing.assert_allclose(both["hint_hi"], both["served-hi-80"], rtol=1e-9)
    assert (replay["hint_correction_version"] > 0).mean() > 0.5  # the tracker moved
    pred = pd.read_parquet(s["artifacts"]["predictions_test"]).set_index("request_id")
    assert not np.allclose(pred.loc[served.index, "model-hi-80"], served["served-hi-80"])
