"""Smoke test of `python -m training pipeline=demand`: the real Hydra app in a subprocess."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger
from tests.test_entrypoints import run_training


def test_demand_pipeline_writes_the_summary_keys(tmp_path):
    out = tmp_path / "run"
    run_training("pipeline=demand", f"hydra.run.dir={out}", "tracking=off",
                 "data.synthetic.n_sessions=800", "demand.model.n_estimators=100")
    s = json.loads((out / "summary.json").read_text())
    assert s["pipeline"] == "demand"
    assert s["rows_valid"] + s["rows_quarantined"] == s["rows_read"] > 0
    assert "quarantine_by_reason" in s and s["ledger_fingerprint"] and s["projection"]["version"]
    assert {"train", "calibration", "test", "censored", "absent_usage"} <= set(s["labels"])
    assert s["interval"] == 0.8
    t = s["test"]
    for m in [t["model"], *t["baselines"].values()]:
        assert set(m["pinball"]) == {"0.1", "0.5", "0.9"}
        assert {"mean_pinball", "coverage", "mean_width", "mae_p50"} <= set(m)
    assert set(t["baselines"]) == {"prompt_length", "max_tokens_cap", "category_bucket",
                                   "session_ewma"}
    assert t["groups"] and {"by", "value", "n", "coverage", "pinball"} <= set(t["groups"][0])
    assert {"n", "hi_at_least_observed"} <= set(t["censored"])
    assert [r["nominal"] for r in t["reliability"]] == [0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
    pred = pd.read_parquet(s["artifacts"]["predictions_test"])
    assert {"model-q0.5", "model-lo-80", "model-hi-80", "max_tokens_cap-hi-80"} <= set(pred)


def test_demand_pipeline_without_labels_is_one_line_error(tmp_path):
    frame = generate_synthetic_ledger(SyntheticLedgerConfig(n_sessions=100), seed=0)
    frame["completion_tokens"] = pd.array([pd.NA] * len(frame), dtype="Int64")
    ledger = tmp_path / "no_usage.parquet"
    frame.to_parquet(ledger, index=False)
    proc = run_training("pipeline=demand", f"data.ledger={ledger}", "tracking=off",
                        f"hydra.run.dir={tmp_path / 'r'}", check=False)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "no usable labels" in last


@pytest.mark.slow
@pytest.mark.integration
def test_demand_compute_dask_entrypoint(tmp_path):
    """compute=dask trains the boosters on a real 2-worker LocalCluster; calibration holds."""

    out = tmp_path / "dask"
    run_training("pipeline=demand", "compute=dask", f"hydra.run.dir={out}", "tracking=off",
                 "data.synthetic.n_sessions=1500")
    s = json.loads((out / "summary.json").read_text())
    assert s["compute"]["kind"] == "dask"
    assert 0.72 <= s["test"]["model"]["coverage"] <= 0.88
