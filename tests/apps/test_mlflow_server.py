"""Integration: a real `mlflow server` on loopback (the session's, tests/conftest.py); a
training run logs through it (in process, tests/helpers/entrypoints.py); read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.entrypoints import export, train

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_training_run_logs_through_a_real_server(mlflow_server, tmp_path):
    url, _store = mlflow_server
    summary = train("data.synthetic.n_sessions=150", f"tracking.uri={url}",
                    "tracking.experiment=it-test", run_dir=tmp_path / "run").summary
    run_id = summary["mlflow"]["run_id"]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=url)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["pipeline"] == "project"
    assert run.data.params["data.synthetic.n_sessions"] == "150"
    assert run.data.metrics["rows_valid"] == summary["rows_valid"]
    names = {a.path for a in client.list_artifacts(run_id)}
    assert {"summary.json", "config", "reports"} <= names
    local = client.download_artifacts(run_id, "summary.json", str(tmp_path))
    assert json.loads(Path(local).read_text())["rows_read"] == summary["rows_read"]


def test_python_m_export_by_run_id_from_the_server(mlflow_server, logged_demand_run, tmp_path):
    """A demand run logs its fitted state (the session's logged demand run,
    tests/apps/conftest.py); `python -m export run_id=...` rebuilds the artifact."""
    from mlflow.tracking import MlflowClient

    from replaylab.runtime import DemandPredictor

    url, _store = mlflow_server
    summary = logged_demand_run
    run_id = summary["mlflow"]["run_id"]
    names = {a.path for a in MlflowClient(tracking_uri=url).list_artifacts(run_id)}
    assert {"demand_artifact", "demand_run"} <= names
    again = tmp_path / "export"
    proc = export(f"run_id={run_id}", f"tracking.uri={url}", "tracking.experiment=it-export",
                  "export.registry.names.demand=it-server-demand", f"out={again / 'demand'}",
                  run_dir=again)
    assert proc.returncode == 0, proc.stderr[-2000:]
    p = DemandPredictor.load(proc.summary["artifacts"]["demand"])
    assert p.loaded and p.manifest["training"]["mlflow_run_id"] == run_id
    original = DemandPredictor.load(Path(summary["dir"]) / "artifacts" / "demand")
    row = {"prompt_tokens": 300, "max_tokens": 800, "category": "chat"}
    assert p.predict(row).hint_p50 == original.predict(row).hint_p50
