"""Tracking faults cost seconds and lose nothing (a real `mlflow server` on loopback).

- the server is down at start: one line, exit 2, in under 10 s, nothing run;
- the server is killed mid-run: the local outputs are complete, summary.json says
  `not logged`, one line names the recovery command, and that command (after the
  server is back) logs the metrics, config and reports again, registers the artifact
  and marks the lost run FAILED;
- a misspelt `+group.key=` and an unknown registered model are one line, exit 2, and
  leave no MLflow run behind.

The run killed mid-way is a real `python -m training` subprocess (its server is killed under
it); the other entry-point runs are in process (tests/helpers/entrypoints.py).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, mlflow_server_process
from tests.helpers.entrypoints import export, train

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.strip()]


def test_a_server_down_at_start_is_one_line_and_exit_2_within_10_s(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    t0 = time.perf_counter()
    proc = train(f"tracking.uri={url}", run_dir=tmp_path / "run", check=False)
    took = time.perf_counter() - t0
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: ") and url in lines[0], lines
    assert took < 10.0, took
    assert not (tmp_path / "run" / "summary.json").exists()  # nothing ran


def test_mlflow_tracking_uri_is_honoured(tmp_path, monkeypatch):
    """No tracking.uri given: the environment's store is used (no stray ./mlflow.db)."""
    url = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    proc = train(run_dir=tmp_path / "run", check=False)
    assert proc.returncode == 2 and url in proc.stderr, proc.stderr[-2000:]
    db = tmp_path / "store.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    proc = train("data.synthetic.n_sessions=150", run_dir=tmp_path / "run2", check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads((tmp_path / "run2" / "summary.json").read_text())
    assert s["mlflow"]["tracking_uri"] == f"sqlite:///{db}" and db.is_file()


def test_a_misspelt_added_key_is_refused(tmp_path):
    proc = train("+data.ledgr=my.parquet", "tracking=off", run_dir=tmp_path / "run",
                 check=False)
    assert proc.returncode == 2
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and "ledgr" in lines[0] and "ledger" in lines[0], lines
    assert not (tmp_path / "run" / "summary.json").exists()


def test_a_server_killed_mid_run_loses_nothing(tmp_path):
    from mlflow.tracking import MlflowClient

    from replaylab.apps.recording import numeric_metrics

    port, store = free_port(), tmp_path / "store"
    store.mkdir()
    url = f"http://127.0.0.1:{port}"
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "training", "pipeline=demand", f"hydra.run.dir={out}",
           "data.synthetic.n_sessions=700", "demand.model.n_estimators=80",
           f"tracking.uri={url}", "tracking.experiment=it-faults"]
    with mlflow_server_process(store, port=port) as (_, pid):
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        c = MlflowClient(tracking_uri=url)
        deadline = time.time() + 120
        run_id = None
        while run_id is None and time.time() < deadline and proc.poll() is None:
            exp = c.get_experiment_by_name("it-faults")
            runs = c.search_runs([exp.experiment_id]) if exp is not None else []
            run_id = runs[0].info.run_id if runs and runs[0].data.params else None
            time.sleep(0.2)
        assert run_id is not None and proc.poll() is None, "the run did not start in time"
        os.killpg(pid, signal.SIGKILL)  # the server is lost while the job runs
        killed = time.perf_counter()
    stdout, stderr = proc.communicate(timeout=300)
    after_kill = time.perf_counter() - killed
    assert proc.returncode == 0, stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    m = summary["mlflow"]
    assert m["status"] == "not logged" and m["run_id"] == run_id and url in m["recover"]
    # the local outputs are complete: report, artifact, fitted state
    assert Path(summary["reports"]["html"]).is_file()
    assert (Path(summary["artifacts"]["demand"]) / "manifest.json").is_file()
    lost = [ln for ln in stderr.splitlines() if ln.startswith("mlflow: not logged")]
    assert len(lost) == 1 and m["recover"] in lost[0]
    assert len(error_lines(stderr)) < 25, stderr  # not hundreds of retry lines
    assert after_kill < 120, after_kill  # seconds of retries, not minutes
    print(f"after the kill: {after_kill:.1f} s, {len(error_lines(stderr))} stderr lines")
    assert stdout.strip().splitlines()[-1].startswith("demand: ")  # the verdict still printed

    with mlflow_server_process(store, port=port):  # the server is back, same store
        args = shlex.split(m["recover"])
        assert args[:3] == ["python", "-m", "export"]
        rec = export(*args[3:], run_dir=tmp_path / "recover")
        assert rec.returncode == 0, rec.stderr[-3000:]
        again = json.loads((tmp_path / "recover" / "summary.json").read_text())
        c = MlflowClient(tracking_uri=url)
        new = c.get_run(again["mlflow"]["run_id"])
        assert new.info.status == "FINISHED"
        want = numeric_metrics({k: v for k, v in summary.items() if k not in ("mlflow",)})
        for key in ("test.model.mean_pinball", "rows_valid", "calibration.coverage"):
            if key in want:
                assert new.data.metrics[key] == pytest.approx(want[key])
        assert len(set(want) & set(new.data.metrics)) >= 0.9 * len(want)
        names = {a.path for a in c.list_artifacts(new.info.run_id, "reports")}
        assert any(n.endswith(".html") for n in names)
        assert {"config", "source_run"} <= {a.path for a in c.list_artifacts(new.info.run_id)}
        assert again["registry"] and again["registry"][0]["version"] >= 1
        old = c.get_run(run_id)
        assert old.info.status == "FAILED"
        assert old.data.tags["replaylab.recovered_in"] == new.info.run_id


def test_an_unknown_model_or_version_is_one_line_and_leaves_no_run(tmp_path):
    from mlflow.tracking import MlflowClient

    db = f"sqlite:///{tmp_path / 'reg.db'}"
    c = MlflowClient(tracking_uri=db)
    c.create_registered_model("replaylab-demand")
    for args in (("fetch", "name=nope", "alias=champion", f"out={tmp_path / 'x'}"),
                 ("promote", "name=replaylab-demand", "version=7", "alias=champion"),
                 ("fetch", "name=replaylab-demand", "alias=champion", f"out={tmp_path / 'x'}"),
                 ("promote", "name=replaylab-demand")):
        proc = export(*args, f"tracking.uri={db}", run_dir=tmp_path / "e")
        assert proc.returncode == 2, (args, proc.stderr[-2000:])
        lines = error_lines(proc.stderr)
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, lines)
    exp = c.get_experiment_by_name("replaylab")
    assert exp is None or not c.search_runs([exp.experiment_id])  # no FAILED runs left
