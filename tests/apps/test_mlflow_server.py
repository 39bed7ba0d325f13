"""Integration: a real `mlflow server` on loopback; a training run logs through it; read back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, mlflow_server_process
from tests.helpers.entrypoints import run_training

pytestmark = [pytest.mark.integration, pytest.mark.slow]



@pytest.fixture
def mlflow_server(tmp_path):
    with mlflow_server_process(tmp_path) as (url, pid):
        yield url, pid


def test_training_run_logs_through_a_real_server(mlflow_server, tmp_path):
    url, pid = mlflow_server
    out = tmp_path / "run"
    run_training(f"hydra.run.dir={out}", "data.synthetic.n_sessions=150", f"tracking.uri={url}",
                 "tracking.experiment=it-test")
    summary = json.loads((out / "summary.json").read_text())
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
    assert pid > 0 and REPO.exists()


def test_python_m_export_by_run_id_from_the_server(mlflow_server, tmp_path):
    """A demand run logs its fitted state; `python -m export run_id=...` rebuilds the artifact."""
    from replaylab.runtime import DemandPredictor

    url, _ = mlflow_server
    out = tmp_path / "run"
    run_training("pipeline=demand", f"hydra.run.dir={out}", "data.synthetic.n_sessions=600",
                 "demand.model.n_estimators=60", f"tracking.uri={url}",
                 "tracking.experiment=it-export")
    summary = json.loads((out / "summary.json").read_text())
    run_id = summary["mlflow"]["run_id"]
    from mlflow.tracking import MlflowClient

    names = {a.path for a in MlflowClient(tracking_uri=url).list_artifacts(run_id)}
    assert {"demand_artifact", "demand_run"} <= names
    again = tmp_path / "export"
    proc = subprocess.run([sys.executable, "-m", "export", f"run_id={run_id}",
                           f"tracking.uri={url}", "tracking.experiment=it-export",
                           f"out={again / 'demand'}", f"hydra.run.dir={again}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    e = json.loads((again / "summary.json").read_text())
    p = DemandPredictor.load(e["artifacts"]["demand"])
    assert p.loaded and p.manifest["training"]["mlflow_run_id"] == run_id
    original = DemandPredictor.load(out / "artifacts" / "demand")
    row = {"prompt_tokens": 300, "max_tokens": 800, "category": "chat"}
    assert p.predict(row).hint_p50 == original.predict(row).hint_p50
