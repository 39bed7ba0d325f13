"""The stage lines and task bar of the Dask pipelines (`compute.stages.DaskStages`) and the
dashboard line of `compute.engines.dask_client`."""

from __future__ import annotations

import logging

import pytest

from replaylab.compute.stages import DaskStages, StageFailed, is_lost_worker

STAGES = {"read": "read the rows", "sum": "sum them"}


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as c:
        yield c


def test_one_line_as_each_stage_starts_and_one_as_it_ends(client):
    import dask

    lines: list[str] = []
    with DaskStages(STAGES, lines.append, client=client, bar=False) as stage:
        with stage("read"):
            x = dask.delayed(sum)(list(range(10)))
        with stage("sum"):
            assert x.compute() == 45
    assert lines[0] == "dask stage 1/2: read the rows"
    assert lines[2] == "dask stage 2/2: sum them"
    assert lines[1].startswith("dask stage 1/2 done in ") and lines[1].endswith(" s: read")
    assert lines[3].startswith("dask stage 2/2 done in ") and lines[3].endswith(" s: sum")
    assert len(lines) == 4 and set(stage.timings) == {"read", "sum"}


def test_the_task_bar_counts_the_stage_tasks_and_leaves_the_lines(client, capsys):
    import dask.bag as db

    lines: list[str] = []
    with DaskStages(STAGES, lines.append, client=client, bar=True) as stage:
        with stage("sum"):
            assert db.from_sequence(range(200), npartitions=20).map(
                lambda v: v + 1).sum().compute() == 20100
            bar = stage.bar
    assert bar is True and len(lines) == 2  # the bar drew on stderr, no extra line
    assert "stage 2/2 sum" in capsys.readouterr().err
    assert "replaylab-task-counter" not in client.run_on_scheduler(
        lambda dask_scheduler: list(dask_scheduler.plugins))


def test_a_lost_worker_is_one_line_naming_the_stage_and_other_errors_pass():
    from types import SimpleNamespace

    from distributed import KilledWorker

    lines: list[str] = []
    stages = DaskStages(STAGES, lines.append, bar=False)
    with pytest.raises(StageFailed) as got:
        with stages("sum"):
            raise KilledWorker(("sum-abc", 0), SimpleNamespace(address="tcp://127.0.0.1:1"), 3)
    text = str(got.value)
    assert "\n" not in text and text.startswith("dask stage 2/2 (sum) stopped: a worker was lost")
    assert "rerun" in text and is_lost_worker(got.value.__cause__)
    with pytest.raises(ValueError):
        with stages("read"):
            raise ValueError("a bug keeps its traceback")
    assert "sum" not in stages.timings


def test_the_dashboard_link_is_one_line(caplog):
    from replaylab.compute import ComputeConfig
    from replaylab.compute.engines import dask_client

    compute = ComputeConfig(kind="dask", n_workers=1, threads_per_worker=1)
    with caplog.at_level(logging.INFO, logger="replaylab"), dask_client(compute) as c:
        link = c.dashboard_link
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dask: ")]
    assert lines == [f"dask: dashboard {link}"] and link.startswith("http://127.0.0.1:")


def test_no_bokeh_is_one_line_and_no_dashboard(caplog, monkeypatch):
    import importlib.util

    from replaylab.compute import engines as inputs

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "bokeh" else real(name, *a))
    with caplog.at_level(logging.INFO, logger="replaylab"):
        assert inputs.dashboard_address() is None
    assert [r.getMessage() for r in caplog.records] == [
        "dask: no dashboard (bokeh is not installed: pip install 'bokeh>=3.1')"]
