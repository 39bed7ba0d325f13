"""The forecast's go/no-go (replaylab.forecast.gate): paired MASE over origins, coverage band,
NOT ENOUGH EVIDENCE on a short backtest."""

from __future__ import annotations

import numpy as np
import pandas as pd

from replaylab.forecast.config import GateConfig
from replaylab.forecast.gate import NOT_ENOUGH, forecast_gate
from replaylab.forecast.panel import BacktestPlan

PLAN = BacktestPlan(horizon=6, step=6, n_windows=24, n_windows_requested=24)


def _origins(n: int, naive: float, other: float, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"cutoff": np.arange(n) * 6,
                         "seasonal_naive": naive + 0.05 * rng.standard_normal(n),
                         "auto_ets": other + 0.05 * rng.standard_normal(n),
                         "moving_window": naive + 0.1 + 0.05 * rng.standard_normal(n)})


def _scores(by: pd.DataFrame, coverage: float) -> dict:
    return {n: {"mase": float(by[n].mean()), "coverage_80": coverage}
            for n in ("seasonal_naive", "auto_ets", "moving_window")}


def test_go_when_the_best_beats_seasonal_naive_with_its_interval_and_covers():
    by = _origins(24, naive=1.0, other=0.7)
    g = forecast_gate(_scores(by, 0.8), by, PLAN, GateConfig(), seed=0)
    assert g["go"] is True and g["decision"] == "GO" and g["challenger"] == "auto_ets"
    lo, hi = g["mase_diff"]["ci"]
    assert lo < g["mase_diff"]["mean"] < hi < 0
    assert "beats it" in g["reasons"][0] and "within the target" in g["reasons"][1]


def test_no_go_when_coverage_is_outside_the_band_or_the_interval_reaches_zero():
    by = _origins(24, naive=1.0, other=0.7)
    g = forecast_gate(_scores(by, 0.6), by, PLAN, GateConfig(), seed=0)
    assert g["go"] is False and g["decision"] == "NO-GO" and "outside the target" in g["reasons"][1]
    tie = _origins(24, naive=1.0, other=1.0)
    g = forecast_gate(_scores(tie, 0.8), tie, PLAN, GateConfig(), seed=0)
    assert g["go"] is False and "does not beat it" in g["reasons"][0]


def test_not_enough_evidence_on_a_short_backtest():
    by = _origins(5, naive=1.0, other=0.5)
    g = forecast_gate(_scores(by, 0.8), by, PLAN, GateConfig(min_origins=12), seed=0)
    assert g["go"] is None and g["decision"] == NOT_ENOUGH and "5 backtest origins" in g["reasons"][0]


def test_overlapping_windows_are_resampled_together_and_count_once():
    by = _origins(24, naive=1.0, other=0.7)
    plan = BacktestPlan(horizon=6, step=2, n_windows=24, n_windows_requested=24)
    g = forecast_gate(_scores(by, 0.8), by, plan, GateConfig(), seed=0)
    assert g["block_origins"] == 3 and g["blocks"] == 8 and g["decision"] == NOT_ENOUGH
    assert "in 8 independent blocks (windows overlap: step 2 < horizon 6)" in g["reasons"][0]
    g = forecast_gate(_scores(by, 0.8), by, plan, GateConfig(min_origins=8), seed=0)
    assert g["go"] is True and g["blocks"] == 8
