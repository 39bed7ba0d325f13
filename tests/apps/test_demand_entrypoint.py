"""`python -m training pipeline=demand`, in process (tests/helpers/entrypoints.py); the
re-export by `python -m export run_dir=` is the export entry point's subprocess smoke test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from replaylab.runtime import DemandPredictor
from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger
from tests.conftest import REPO
from tests.helpers.entrypoints import export, train


def test_demand_pipeline_writes_the_summary_keys(tmp_path):
    out = tmp_path / "run"
    s = train("pipeline=demand", "tracking=off", "data.synthetic.n_sessions=800",
              "demand.model.n_estimators=100", run_dir=out).summary
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
    # exported at the end of training; python -m export re-exports from the finished run
    art = Path(s["artifacts"]["demand"])
    # signed by default (the tests' key file, conftest); the runtime loads it with or without
    assert art == out / "artifacts" / "demand" and s["export"]["signed"] is True
    first = DemandPredictor.load(art)
    assert first.loaded and first.version == f"1.0.0+{s['export']['content_hash'][7:19]}"
    again = tmp_path / "re"
    proc = subprocess.run([sys.executable, "-m", "export", f"run_dir={out}", "tracking=off",
                           f"out={again / 'demand'}", "export.version=1.0.1",
                           f"hydra.run.dir={again}"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    e = json.loads((again / "summary.json").read_text())
    second = DemandPredictor.load(e["artifacts"]["demand"])
    assert second.loaded and second.version.startswith("1.0.1+")
    row = {"prompt_tokens": 700, "max_tokens": 2000, "category": "code", "turn_index": 1}
    assert first.predict(row).hint_p90 == second.predict(row).hint_p90
    bad = export("tracking=off", run_dir=tmp_path / "bad")
    assert bad.returncode == 2 and "exactly one of run_dir" in bad.stderr


def test_demand_pipeline_without_labels_is_one_line_error(tmp_path):
    frame = generate_synthetic_ledger(SyntheticLedgerConfig(n_sessions=100), seed=0)
    frame["completion_tokens"] = pd.array([pd.NA] * len(frame), dtype="Int64")
    ledger = tmp_path / "no_usage.parquet"
    frame.to_parquet(ledger, index=False)
    proc = train("pipeline=demand", f"data.ledger={ledger}", "tracking=off",
                 run_dir=tmp_path / "r", check=False)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "no usable labels" in last


@pytest.mark.slow
@pytest.mark.integration
def test_demand_compute_dask_entrypoint(dask_address, dask_client, tmp_path):
    """compute=dask trains the boosters on a real 2-worker cluster (the session's);
    calibration holds. Run in this process while the session's `dask_client` is current:
    the run's client is made current for its length (`compute.engines.dask_client`; before
    that the run's persists went through the session's client and lightgbm.dask's fit was
    cancelled for "lost dependencies", twice in five full runs and in CI)."""
    from distributed import default_client

    s = train("pipeline=demand", "compute=dask", f"compute.address={dask_address}",
              "tracking=off", "data.synthetic.n_sessions=1500",
              run_dir=tmp_path / "dask").summary
    assert default_client() is dask_client
    assert s["compute"]["kind"] == "dask"
    assert 0.72 <= s["test"]["model"]["coverage"] <= 0.88
