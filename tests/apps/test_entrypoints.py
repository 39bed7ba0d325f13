"""`python -m training`: the smoke test runs the real Hydra app in a subprocess, as a user
runs it (`default_run`); the others run the same entry point in process
(tests/helpers/entrypoints.py), which is what they are about."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers.entrypoints import run_training, train


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run")
    run_training(f"hydra.run.dir={out}", "data.synthetic.n_sessions=300",
                 f"tracking.uri=sqlite:///{out}/mlflow.db")
    return out


def test_default_run_writes_summary_and_conserves_rows(default_run):
    s = json.loads((default_run / "summary.json").read_text())
    assert s["pipeline"] == "project"
    assert s["rows_valid"] + s["rows_quarantined"] == s["rows_read"] > 0
    # the default run corrupts a few rows on purpose: each must be found again
    assert s["quarantine_by_reason"] == s["injected_defects"]
    assert sum(s["splits"]["rows"].values()) == s["rows_valid"] == s["projection"]["rows"]
    assert len(s["projection"]["version"]) >= 12
    feats = pd.read_parquet(s["artifacts"]["features"])
    assert len(feats) == s["rows_valid"]
    q = [json.loads(x) for x in Path(s["artifacts"]["quarantine"]).read_text().splitlines()]
    assert len(q) == s["rows_quarantined"]
    assert Path(s["reports"]["html"]).is_file()
    assert s["mlflow"]["run_id"]


def test_bad_ledger_is_one_line_error_and_nonzero_exit(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"ledger_version": "1", "request_id": "a"}\n')
    proc = train(f"data.ledger={bad}", "tracking=off", run_dir=tmp_path / "r", check=False)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "bad.jsonl" in last and "missing required column" in last


def test_ledger_file_roundtrip_through_training(default_run, tmp_path):
    ledger = json.loads((default_run / "summary.json").read_text())["artifacts"]["ledger"]
    out = tmp_path / "r2"
    s = train(f"data.ledger={ledger}", "tracking=off", run_dir=out).summary
    first = json.loads((default_run / "summary.json").read_text())
    assert s["rows_valid"] == first["rows_valid"]
    assert s["projection"]["version"] == first["projection"]["version"]


def test_import_pipeline_writes_contract_table(tmp_path, test_data):
    src = test_data / "azure_llm_2023" / "AzureLLMInferenceTrace_conv_first200.csv"
    if not src.exists():
        pytest.skip("azure slice not present")
    out = tmp_path / "azure.parquet"
    s = train("pipeline=import", "source=azure_conv", f"source.path={src}", f"out={out}",
              "tracking=off", run_dir=tmp_path / "r").summary
    assert s["contract"] == "ledger-v1" and s["rows_valid"] == len(pd.read_parquet(out)) > 0


def test_bad_config_value_names_the_field(tmp_path):
    proc = train("split.train=-0.5", "tracking=off", run_dir=tmp_path, check=False)
    assert proc.returncode != 0
    assert "split" in proc.stderr and "-0.5" in proc.stderr


@pytest.mark.slow
@pytest.mark.integration
def test_compute_dask_gives_the_same_projection(default_run, dask_address, tmp_path):
    """compute=dask (the session's 2-worker LocalCluster) writes the same features as the
    pandas path."""
    ledger = json.loads((default_run / "summary.json").read_text())["artifacts"]["ledger"]
    out_local, out_dask = tmp_path / "local", tmp_path / "dask"
    train(f"data.ledger={ledger}", "tracking=off", run_dir=out_local)
    s = train(f"data.ledger={ledger}", "tracking=off", "compute=dask",
              f"compute.address={dask_address}", run_dir=out_dask).summary
    assert s["compute"]["kind"] == "dask"
    # one project pipeline on both engines: the same features.parquet (parts on Dask)
    assert s["artifacts"]["features"] == str(out_dask / "features.parquet")
    a = pd.read_parquet(out_local / "features.parquet").sort_values("request_id")
    b = pd.read_parquet(s["artifacts"]["features"]).sort_values("request_id")
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b[list(a.columns)].reset_index(drop=True))
