"""pipeline=demand compute=dask on partitioned ledgers shaped like real ones (issue 41): a
ledger with none of ledger-v1's optional columns (the Azure and RAG traces' shape, whose
all-missing categorical features segfaulted LightGBM's distributed Dataset), a ledger
where one partition holds no training rows, and a worker that dies in a stage, whose
`error:` line names the signal, the stage and the library. Real LocalClusters of 2 worker
processes with their nannies."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from replaylab.compute import ComputeConfig, DaskEngine
from replaylab.compute.stages import DaskStages, StageFailed, describe_exit
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.io import write_table
from replaylab.contracts.ledger import LEDGER_SCHEMA
from replaylab.demand import DemandConfig, QuantileModelConfig
from replaylab.demand.config import CensoringConfig
from replaylab.pipelines.demand import train_demand
from replaylab.pipelines.project import LedgerInput, load_ledger
from replaylab.projection import ProjectionConfig, SplitConfig
from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger

CFG = DemandConfig(model=QuantileModelConfig(num_threads=1, n_estimators=60),
                   censoring=CensoringConfig(method="none"), min_group_size=100)
SPLIT = SplitConfig(embargo_ms=300_000)
N_BOOT = 20


def required_only(n_sessions: int = 900, seed: int = 11) -> pd.DataFrame:
    """A synthetic ledger with every optional ledger-v1 column dropped."""
    frame = generate_synthetic_ledger(
        SyntheticLedgerConfig(n_sessions=n_sessions, sessions_per_s=0.25), seed=seed)
    keep = list(LEDGER_SCHEMA.required_columns)
    assert set(frame.columns) - set(keep), "the generator's ledger has optional columns"
    return frame[keep]


def write_parts(frame: pd.DataFrame, folder: Path, n: int) -> Path:
    """frame in time order as n Parquet files (part-i.parquet) in folder."""
    frame = frame.sort_values(L.TIMESTAMP, kind="stable").reset_index(drop=True)
    for i, idx in enumerate(np.array_split(np.arange(len(frame)), n)):
        write_table(frame.iloc[idx], folder / f"part-{i}.parquet")
    return folder


@pytest.fixture
def cluster():
    import dask
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as lc, Client(lc) as client, \
            dask.config.set({"dataframe.convert-string": False,
                             "replaylab.lost-worker-wait": 60}):
        yield client


def on(client) -> DaskEngine:
    """The engine on a test's own cluster (these tests kill or crash its workers)."""
    return DaskEngine(ComputeConfig(kind="dask"), client)


def check_sane(dist: dict, local: dict | None, n_rows: int) -> None:
    """Counts conserved, figures finite and sane, the same verdict as local."""
    assert dist["rows_read"] == dist["rows_valid"] == n_rows
    assert sum(dist["splits"]["rows"].values()) == dist["projection"]["rows"] == n_rows
    lab = dist["labels"]
    assert lab["train"] + lab["calibration"] + lab["test"] + lab["embargo"] + \
        lab["censored"] + lab["absent_usage"] + lab["prompt_absent"] == n_rows
    model = dist["test"]["model"]
    assert dist["test"]["labelled_rows"] == lab["test"] > 0
    assert 0.7 <= model["coverage"] <= 0.9, model["coverage"]
    assert np.isfinite(model["mean_pinball"]) and model["mean_pinball"] > 0
    assert np.isfinite(model["mean_width"]) and model["mean_width"] > 0
    assert dist["model"]["workers"] == 2
    if local is not None:
        for key in ("rows_read", "splits", "labels", "time_window"):
            assert dist[key] == local[key], key
        lm = local["test"]["model"]
        assert abs(model["coverage"] - lm["coverage"]) <= 0.05
        assert model["mean_pinball"] == pytest.approx(lm["mean_pinball"], rel=0.1)
        assert dist["gate"]["go"] == local["gate"]["go"]


@pytest.mark.slow
@pytest.mark.integration
def test_a_ledger_without_any_optional_column_trains_on_two_workers(tmp_path, cluster):
    """No optional column: decision, slo_class and region are categorical features with no
    category (all missing); LightGBM's distributed Dataset segfaulted on them (issue 41).
    They are not binned as categorical now, the run completes, and matches local."""
    from replaylab.pipelines.demand_partitions import train_demand_partitions

    frame = required_only()
    ds = write_parts(frame, tmp_path / "ds", 4)
    one = write_table(frame, tmp_path / "one" / "ledger.parquet")
    local, local_run = train_demand(load_ledger(LedgerInput(path=str(one))), ProjectionConfig(),
                                    SPLIT, CFG, tmp_path / "local")
    dist, dist_run = train_demand_partitions(on(cluster), str(ds), CFG, ProjectionConfig(), SPLIT,
                                  tmp_path / "dask", n_boot=N_BOOT)
    check_sane(dist, local, len(frame))
    assert dist["partitions"] == 4
    cats = dist_run.model.categories_
    empty = sorted(c for c, v in cats.items() if not v)
    assert {L.DECISION, L.SLO_CLASS, L.REGION} <= set(empty)
    assert not set(empty) & set(dist["model"]["lightgbm_categorical"])
    assert dist["model"]["categorical_as_codes"] == []
    # the same rule locally: the design keeps the categorical dtype (the export's
    # vocabularies stay aligned), LightGBM bins only the features with a category
    assert local_run.model.lightgbm_categorical() == dist_run.model.lightgbm_categorical()
    assert len(dist_run.model.boosters_[0].pandas_categorical) == len(cats)


@pytest.mark.slow
@pytest.mark.integration
def test_a_partition_without_training_rows_is_left_out_of_the_fit(tmp_path, cluster):
    """One session partition (the projection shuffles sessions to partitions by a hash of
    session_id) holds only calibration and test sessions (its sessions starting before the
    80% time mark are dropped): the fit leaves it out (a LightGBM rank with no rows fails
    its Dataset and leaves the other on a dead socket) and the run completes with every
    row counted."""
    import dask.dataframe as dd

    from replaylab.compute.ledger import read_ledger_dask
    from replaylab.pipelines.demand_partitions import train_demand_partitions

    frame = required_only(n_sessions=1200, seed=5)
    n_parts = 4
    # the partition of each session, by the projection's own shuffle on session_id
    ids = pd.DataFrame({L.SESSION_ID: frame[L.SESSION_ID].drop_duplicates().to_numpy(object)})
    where = dd.from_pandas(ids, npartitions=n_parts).shuffle(
        on=L.SESSION_ID, npartitions=n_parts, shuffle_method="tasks")
    first = where.partitions[0].compute()[L.SESSION_ID]
    start = frame.groupby(L.SESSION_ID)[L.TIMESTAMP].min()
    late = start.quantile(0.8)  # every train session starts before this (60% of rows)
    drop = set(first[start.reindex(first).to_numpy() < late])
    frame = frame[~frame[L.SESSION_ID].isin(drop)]
    ds = write_parts(frame, tmp_path / "ds", n_parts)
    assert read_ledger_dask(str(ds)).npartitions == n_parts  # the shuffle's partition count
    dist, _ = train_demand_partitions(on(cluster), str(ds), CFG, ProjectionConfig(), SPLIT,
                                  tmp_path / "dask", n_boot=N_BOOT)
    assert dist["model"]["train_partitions_without_rows"] >= 1
    check_sane(dist, None, len(frame))


def segfault(x: int) -> int:
    os.kill(os.getpid(), signal.SIGSEGV)
    return x


@pytest.mark.slow
@pytest.mark.integration
def test_a_worker_killed_by_a_signal_is_named_in_one_line(cluster):
    """A task that SIGSEGVs its worker: the stage's one line names the stage, the signal
    (SIGSEGV, a native crash, not memory) and the task; no guess at memory."""
    lines: list[str] = []
    stages = DaskStages({"read": "read", "crash": "a native crash"}, lines.append,
                        client=cluster, bar=False)
    with pytest.raises(StageFailed) as got, stages:  # each retry kills a worker (allowed-failures)
        with stages("read"):
            assert cluster.submit(lambda v: v + 1, 1).result() == 2
        with stages("crash"):
            cluster.submit(segfault, 1, pure=False).result()
    text = str(got.value)
    print(text)
    assert "\n" not in text
    assert text.startswith("dask stage 2/2 (crash) stopped: a worker was lost")
    assert "killed by signal 11 (SIGSEGV: a crash in native code, not memory)" in text
    assert "task 'segfault'" in text and "memory and restarts" not in text
    assert describe_exit("signal", 9).startswith("killed by signal 9 (SIGKILL: the kernel's OOM")
    assert describe_exit("status", 3) == "exited with status 3"


@pytest.mark.slow
@pytest.mark.integration
def test_the_lightgbm_segfault_is_reported_as_such(tmp_path, cluster, monkeypatch):
    """The issue-41 crash itself, back on purpose: every categorical feature binned as
    categorical (the behaviour before the fix) on a ledger without optional columns. The
    worker binning decision/slo_class/region segfaults in LightGBM on the fit and again
    on the refit; the run stops with one line naming the model stage, SIGSEGV and
    LightGBM, and writes no summary."""
    from replaylab.compute import lgbm
    from replaylab.demand.model import QuantileDemandModel
    from replaylab.pipelines.demand_partitions import train_demand_partitions

    ds = write_parts(required_only(n_sessions=500), tmp_path / "ds", 2)
    monkeypatch.setattr(QuantileDemandModel, "lightgbm_categorical",
                        lambda self: list(self.categories_))
    monkeypatch.setattr(lgbm, "fit_layout",  # its per-rank guard would demote them
                        lambda X, cats, *a: (list(range(X.npartitions)), list(cats)))
    with pytest.raises(StageFailed) as got:
        train_demand_partitions(on(cluster), str(ds), CFG, ProjectionConfig(), SPLIT,
                                  tmp_path / "dask", n_boot=N_BOOT)
    text = str(got.value)
    print(text)
    assert "\n" not in text
    assert text.startswith("dask stage 3/6 (model) stopped: lightgbm.dask: lost worker")
    assert "signal 11 (SIGSEGV: a crash in native code, not memory) in LightGBM" in text
    assert "memory and restarts" not in text
    assert not (tmp_path / "dask" / "summary.json").exists()
