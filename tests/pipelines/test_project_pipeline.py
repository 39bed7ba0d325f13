"""pipeline=project, one pipeline on the compute engine: over a ledger dataset on DaskEngine
(the session's LocalCluster) it equals LocalEngine on the same rows: accounting, profile,
labels, split rows/sessions, every feature row, the fingerprint and the projection version;
the quarantine and features are written as Parquet where the partitions are."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from replaylab.compute import ComputeConfig, LocalEngine, engine
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.io import write_table
from replaylab.pipelines.project import LedgerInput, load_ledger, project_ledger
from replaylab.projection import ProjectionConfig, SplitConfig
from replaylab.sources.defects import inject_defects
from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger
from tests.conftest import REPO
from tests.helpers.dask import ENV, dask_processes


@pytest.fixture(scope="module")
def both(tmp_path_factory, dask_address):
    """The same defective ledger as one file (local path) and as a 3-way hive dataset, the
    dataset projected on both engines."""
    root = tmp_path_factory.mktemp("pd")
    frame = generate_synthetic_ledger(SyntheticLedgerConfig(n_requests=3000), seed=5)
    frame, _ = inject_defects(frame, rate=0.01, seed=5)
    single = write_table(frame, root / "one" / "ledger.parquet")
    n = len(frame) // 3
    for i, part in enumerate((frame.iloc[:n], frame.iloc[n:2 * n], frame.iloc[2 * n:])):
        write_table(part, root / "ds" / f"date=2026-12-0{i + 1}" / "part.parquet")
    projection, split = ProjectionConfig(), SplitConfig()
    local = project_ledger(load_ledger(LedgerInput(path=str(single))), projection, split,
                           root / "local", write_ledger=False)
    local_ds = project_ledger(str(root / "ds"), projection, split, root / "local_ds",
                              engine=LocalEngine())
    with engine(ComputeConfig(kind="dask", address=dask_address)) as eng:
        dist = project_ledger(str(root / "ds"), projection, split, root / "dask", engine=eng,
                              blocksize=40_000)
    return local, dist, frame, local_ds


@pytest.mark.slow
@pytest.mark.integration
def test_dask_project_equals_local(both):
    local, dist, _, local_ds = both
    for key in ("rows_read", "rows_valid", "rows_quarantined", "quarantine_by_reason",
                "labels", "splits"):
        assert dist[key] == local[key], key
    lp, dp = local["ledger"], dist["ledger"]
    for key in ("requests", "sessions", "time_window_ms", "lifecycle_state", "finish_reason",
                "category", "selected_model", "usage_absent"):
        assert dp[key] == lp[key], key
    assert dp["turns_per_session"]["max"] == lp["turns_per_session"]["max"]
    assert dp["turns_per_session"]["mean"] == pytest.approx(lp["turns_per_session"]["mean"])
    assert dist["rows_read"] == dist["rows_valid"] + dist["rows_quarantined"]
    assert dist["partitions"] > 1
    ours = pd.read_parquet(dist["artifacts"]["features"]).sort_values(L.REQUEST_ID)
    theirs = pd.read_parquet(local["artifacts"]["features"]).sort_values(L.REQUEST_ID)
    cols = [c for c in theirs.columns if c != "date"]
    pd.testing.assert_frame_equal(ours[cols].reset_index(drop=True),
                                  theirs[cols].reset_index(drop=True), check_dtype=False)
    q = pd.read_parquet(dist["artifacts"]["quarantine"])
    assert len(q) == dist["rows_quarantined"]
    from replaylab.projection.splits import split_boundaries

    # the exact pandas boundaries of the local features (no session straddles: equal labels)
    b = {k: v for k, v in dist["split_boundaries"].items() if k != "selection"}
    assert b == split_boundaries(theirs, SplitConfig())


@pytest.mark.slow
def test_one_fingerprint_version_and_features_on_both_engines(both):
    """The same dataset on LocalEngine (one partition) and DaskEngine (many): the same
    fingerprint and projection version (issue 44: they no longer depend on compute), the
    same rows and split in features, and each summary names its engine."""
    _, dist, _, local_ds = both
    assert dist["ledger_fingerprint"] == local_ds["ledger_fingerprint"]
    assert dist["projection"]["version"] == local_ds["projection"]["version"]
    assert dist["compute"]["kind"] == "dask" and local_ds["compute"] == {"kind": "local"}
    assert local_ds["partitions"] == 1 and dist["partitions"] > 1
    for key in ("rows_read", "rows_valid", "quarantine_by_reason", "labels", "splits",
                "split_boundaries"):
        a, b = dist[key], local_ds[key]
        if key == "split_boundaries":
            a, b = ({k: v for k, v in x.items() if k != "selection"} for x in (a, b))
        assert a == b, key
    ours = pd.read_parquet(dist["artifacts"]["features"]).sort_values(L.REQUEST_ID)
    theirs = pd.read_parquet(local_ds["artifacts"]["features"]).sort_values(L.REQUEST_ID)
    pd.testing.assert_frame_equal(ours.reset_index(drop=True), theirs.reset_index(drop=True))
    assert local_ds["artifacts"]["quarantine"].endswith("ledger.jsonl")
    assert set(dist["timings_s"]) == set(local_ds["timings_s"]) == {
        "read", "fingerprint", "project", "write", "aggregates"}


def test_the_synthetic_ledger_projects_as_the_recipe_on_one_partition(tmp_path):
    """pipeline=project on LocalEngine over the synthetic ledger: features.parquet is the
    pandas recipe's features and split in the ledger's row order; the figures are drawn
    from every row below SAMPLE_ROWS."""
    from replaylab.projection import project

    loaded = load_ledger(LedgerInput(synthetic=SyntheticLedgerConfig(n_requests=1500),
                                     defect_rate=0.01, seed=3))
    s = project_ledger(loaded, ProjectionConfig(), SplitConfig(), tmp_path)
    ref = project(loaded.result.valid, ProjectionConfig(), SplitConfig())
    got = pd.read_parquet(s["artifacts"]["features"])
    pd.testing.assert_frame_equal(got, ref.with_split_column().reset_index(drop=True))
    assert s["ledger_fingerprint"] == ref.fingerprint
    assert s["projection"]["version"] == ref.version
    assert s["figure_sample_rows"] == len(got) == s["labels"]["rows"]
    assert s["compute"] == {"kind": "local"} and s["rows_quarantined"] > 0
    assert s["injected_defects"] and s["ledger"]["requests"] == s["rows_valid"]


def test_the_local_pipeline_reads_a_dataset_as_the_file(tmp_path):
    """compute=local: a directory (hive partitions) reads as the single file's rows."""
    from replaylab.compute.ledger import read_ledger_dataset
    from replaylab.contracts import read_ledger

    frame = generate_synthetic_ledger(SyntheticLedgerConfig(n_requests=900), seed=3)
    frame, _ = inject_defects(frame, rate=0.02, seed=3)
    single = write_table(frame, tmp_path / "one.parquet")
    for i, part in enumerate((frame.iloc[:300], frame.iloc[300:600], frame.iloc[600:])):
        write_table(part, tmp_path / "ds" / f"date=2026-12-0{i + 1}" / "part.parquet")
    a, b = read_ledger(single), read_ledger_dataset(str(tmp_path / "ds"))
    assert (b.rows_read, b.rows_valid, b.by_reason()) == (a.rows_read, a.rows_valid, a.by_reason())
    key = L.REQUEST_ID
    cols = list(a.valid.columns)
    pd.testing.assert_frame_equal(
        b.valid[cols].sort_values(key).reset_index(drop=True),
        a.valid[cols].sort_values(key).reset_index(drop=True), check_dtype=False)
    assert read_ledger_dataset(single).rows_read == a.rows_read


def project_summary(out: Path, ledger: Path, *extra: str) -> dict:
    """`python -m training pipeline=project data.ledger=LEDGER` into out; its summary."""
    proc = subprocess.run([sys.executable, "-m", "training", "pipeline=project", *extra,
                           f"data.ledger={ledger}", "tracking=off", f"hydra.run.dir={out}"],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


@pytest.mark.slow
@pytest.mark.integration
def test_a_separately_started_scheduler_and_two_workers_run_the_pipeline(tmp_path):
    """`dask scheduler` + 2 `dask worker` processes started apart; `python -m training
    pipeline=project compute=dask compute.address=...` over a dataset equals the local run."""
    frame = generate_synthetic_ledger(SyntheticLedgerConfig(n_requests=2000), seed=8)
    for i, part in enumerate((frame.iloc[:700], frame.iloc[700:1400], frame.iloc[1400:])):
        write_table(part, tmp_path / "ds" / f"part-{i}.parquet")
    with dask_processes(tmp_path) as (address, _):
        d = project_summary(tmp_path / "dask", tmp_path / "ds", "compute=dask",
                            f"compute.address={address}")
    loc = project_summary(tmp_path / "local", tmp_path / "ds")
    assert d["compute"]["scheduler"] == address and d["compute"]["n_workers"] == 2
    for key in ("rows_read", "rows_valid", "rows_quarantined", "labels", "splits"):
        assert d[key] == loc[key], key
    assert d["verdict"] == loc["verdict"]


@pytest.mark.slow
@pytest.mark.integration
def test_python_m_training_demand_on_dask_over_a_dataset_exports_a_loadable_artifact(tmp_path):
    """pipeline=demand compute=dask data.ledger=DIR: trained on the cluster, the artifact
    exported and served (HPO under Dask: tests/pipelines/test_demand_partitions.py)."""
    from replaylab.runtime import DemandPredictor

    frame = generate_synthetic_ledger(SyntheticLedgerConfig(n_requests=6000), seed=4)
    for i in range(3):
        write_table(frame.iloc[i * 2000:(i + 1) * 2000], tmp_path / "ds" / f"part-{i}.parquet")
    cmd = [sys.executable, "-m", "training", "pipeline=demand", "compute=dask",
           f"data.ledger={tmp_path / 'ds'}", "tracking=off", "demand.model.n_estimators=40",
           f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run(cmd, cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["compute"]["kind"] == "dask" and s["compute"]["n_workers"] == 2
    assert s["rows_read"] == 6000 and proc.stdout.strip().splitlines()[-1] == s["verdict"]
    p = DemandPredictor.load(Path(s["artifacts"]["demand"]))
    assert p.loaded and p.predict({"prompt_tokens": 300, "max_tokens": 800}).hint_p50 > 300


@pytest.mark.slow
@pytest.mark.integration
def test_a_worker_killed_mid_run_costs_a_retry_not_the_result(tmp_path):
    """One of two `dask worker`s is killed while pipeline=project runs on them: Dask
    recomputes its tasks on the other; the run completes with the local run's counts
    (or stops with one line), and never leaves a half summary."""
    frame = generate_synthetic_ledger(SyntheticLedgerConfig(n_requests=120_000), seed=9)
    for i in range(4):
        write_table(frame.iloc[i * 30_000:(i + 1) * 30_000], tmp_path / "ds" / f"p{i}.parquet")
    out = tmp_path / "dask"
    with dask_processes(tmp_path) as (address, workers):
        run = subprocess.Popen(
            [sys.executable, "-m", "training", "pipeline=project", "compute=dask",
             f"compute.address={address}", f"data.ledger={tmp_path / 'ds'}", "tracking=off",
             f"hydra.run.dir={out}"], cwd=REPO, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=ENV)
        deadline = time.time() + 120
        log = ""
        while "dask stage 3/5" not in log and time.time() < deadline and run.poll() is None:
            time.sleep(0.5)
            log = (out / "__main__.log").read_text() if (out / "__main__.log").is_file() else ""
        os.killpg(workers[0].pid, signal.SIGKILL)  # mid-run, with work on it
        stdout, stderr = run.communicate(timeout=600)
    print(f"killed a worker at stage 3/5 ({'seen' if 'stage 3/5' in log else 'not seen'}); "
          f"the run ended with {run.returncode}")
    if run.returncode == 0:
        s = json.loads((out / "summary.json").read_text())
        ref = project_summary(tmp_path / "local", tmp_path / "ds")
        for key in ("rows_read", "rows_valid", "labels", "splits"):
            assert s[key] == ref[key], key
    else:
        lines = [x for x in stderr.splitlines() if x.strip()]
        assert run.returncode == 2 and len(lines) == 1, stderr[-2000:]
        assert not (out / "summary.json").exists()
