"""docs/results/demand.md holds each run to the band on the interval serving serves (issue 45):
the scoring reads `test.served` and the served columns, and the table shows both."""

from __future__ import annotations

import numpy as np
import pandas as pd

from replaylab.demand.real_traces.markdown import served_cell
from replaylab.demand.real_traces.scoring import assess_run, paired_session_bootstrap

LEVELS = [0.1, 0.5, 0.9]
NAMES = ("model", "prompt_length", "max_tokens_cap", "category_bucket", "session_ewma")


def predictions(n: int = 400, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    y = rng.lognormal(5, 0.5, n)
    out = {"y": y, "session_id": rng.integers(0, 80, n).astype(str), "label_class": "label"}
    for name in NAMES:
        for lv, z in zip(LEVELS, (-1.28, 0.0, 1.28), strict=True):
            out[f"{name}-q{lv:g}"] = np.exp(5 + 0.5 * z) * (1.0 if name == "model" else 1.2)
    out["model-lo-80"], out["model-hi-80"] = np.full(n, 1.0), np.full(n, 1e9)  # covers all
    out["served-lo-80"], out["served-hi-80"] = np.exp(5 - 0.64), np.exp(5 + 0.64)
    return pd.DataFrame(out)


def summary(frozen: float, served: float) -> dict:
    metrics = {"mean_pinball": 1.0, "pinball": {"0.9": 1.0}, "coverage": frozen}
    base = {"mean_pinball": 2.0, "pinball": {"0.9": 2.0}, "coverage": 0.8}
    return {"test": {"model": metrics, "baselines": {b: base for b in NAMES[1:]}, "groups": [],
                     "rows": 400, "labelled_rows": 400, "censored": {}, "reliability": [],
                     "served": {"coverage": served}},
            "gate": {"verdict": "GO"}, "quantiles": LEVELS, "interval": 0.8, "rows_valid": 400,
            "rows_quarantined": 0, "labels": {}, "splits": {}, "ledger_fingerprint": "x",
            "projection": {"feature_columns": [], "version": "v", "split_config": {}},
            "model": {}, "calibration": {"cells": []}}


def test_the_band_is_held_on_the_served_interval_and_both_are_shown():
    boot = paired_session_bootstrap(predictions(), LEVELS, "80", n_boot=200)
    assert boot["coverage_ci"] == [1.0, 1.0]  # the frozen columns cover every row here
    lo, hi = boot["served_coverage_ci"]
    assert 0.6 < lo < hi < 0.95  # the served columns' coverage, ~0.8
    r = assess_run("x", summary(frozen=0.87, served=0.80), boot, pinball_target=False)
    assert r["verdict"]["coverage_in_band"] and not r["verdict"]["frozen_coverage_in_band"]
    assert r["verdict"]["meets_targets"] and r["gate"]["verdict"] == "GO"
    assert served_cell(r).startswith("0.800 [")
    r = assess_run("x", summary(frozen=0.80, served=0.86), boot, pinball_target=False)
    assert r["verdict"]["fails"] == ["coverage 0.860 outside 0.77..0.83"]
