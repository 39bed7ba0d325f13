"""The fleet experiments' (policy x window/load x seed) cells as Dask tasks equal the local loop.

`replaylab.fleet.experiments.harness`: `LocalGrid` maps the cells in a loop; `EngineGrid` runs
them on the run's compute engine: on the local engine as `LocalGrid`, on Dask one task per
cell (`Engine.submit_all`), gathered in cell order. Each
experiment runs at a tiny size both ways (2 windows or 2 seeds) on a real LocalCluster
of two worker processes, and the summaries agree key by key (timings and figure paths
aside); `python -m evaluation experiment=overload compute=dask` runs end to end.
"""

from __future__ import annotations

import json
import math

import pytest

from replaylab.compute import ComputeConfig, LocalEngine, engine
from replaylab.fleet.experiments import run_fleet_experiment
from replaylab.fleet.experiments.harness import EngineGrid, LocalGrid
from tests.helpers.fleet import experiment_config

# what differs between two runs of the same cells: wall time, where the figures went, and
# whether overload's saturation run was computed or found in this process's memory cache
TIMINGS = {"speed", "wall_s", "reports", "path", "cache"}

SMALL = {
    "overload": {"fleet.workload.duration_s": 15.0, "fleet.workload.seeds": [0, 1],
                 "experiment.load_factors": [1.0, 2.0]},
    "stale_telemetry": {"fleet.workload.windows": 2, "fleet.workload.window_s": 600.0},
    "rollout": {"fleet.workload.windows": 2, "fleet.workload.max_requests": 300},
    "energy": {"fleet.workload.windows": 2, "fleet.workload.max_requests": 200},
}


def differences(a, b, path: str = "") -> list[str]:
    """Paths where two summaries differ (NaN equals NaN; TIMINGS keys skipped)."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = (set(a) | set(b)) - TIMINGS
        out = []
        for k in sorted(keys, key=str):
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in one")
            else:
                out += differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def square(shared, cell):
    """A cell function for the runner tests: top level, so Dask pickles it by reference."""
    if cell == "boom":
        raise ValueError("cell boom failed")
    return (shared["offset"] + cell) ** 2


@pytest.fixture(scope="module")
def dask_engine(dask_address):
    """A DaskEngine on the session's LocalCluster (tests/conftest.py `dask_address`)."""
    with engine(ComputeConfig(kind="dask", address=dask_address)) as eng:
        yield eng


def test_local_grid_maps_in_cell_order():
    cells = [3, 1, 2]
    assert LocalGrid().map(square, cells, shared={"offset": 1}) == [16, 4, 9]
    assert LocalGrid(progress=False).map(square, [], shared={"offset": 1}) == []
    # autoscaling's own `workers` option: forked processes, same order
    assert LocalGrid().map(square, cells, shared={"offset": 1}, workers=2) == [16, 4, 9]
    # the local engine's grid is that loop (and that pool)
    grid = EngineGrid(LocalEngine())
    assert grid.kind == "local"
    assert grid.map(square, cells, shared={"offset": 1}) == [16, 4, 9]
    assert grid.map(square, cells, shared={"offset": 1}, workers=2) == [16, 4, 9]


@pytest.mark.slow
@pytest.mark.integration
def test_dask_grid_gathers_in_cell_order_and_raises_a_cells_error(dask_engine):
    cells = list(range(12))[::-1]
    assert EngineGrid(dask_engine).kind == "dask"
    assert EngineGrid(dask_engine).map(square, cells, shared={"offset": 2}) == \
        [(2 + c) ** 2 for c in cells]
    assert EngineGrid(dask_engine).map(square, [], shared={"offset": 2}) == []
    with pytest.raises(ValueError, match="cell boom failed"):
        EngineGrid(dask_engine, progress=False).map(square, [1, "boom"], shared={"offset": 0})


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(SMALL))
def test_dask_summary_equals_local(name, dask_engine, tmp_path):
    cfg = experiment_config(name, **SMALL[name])
    local = run_fleet_experiment(name, cfg, tmp_path / "local")
    dist = run_fleet_experiment(name, cfg, tmp_path / "dask", runner=EngineGrid(dask_engine))
    assert differences(local, dist) == []
    assert local["conserved"] is True
    # the same policy numbers, also as the JSON the entry point writes (NaN as null)
    assert json.dumps(local["policies"], sort_keys=True) == \
        json.dumps(dist["policies"], sort_keys=True)


@pytest.mark.slow
@pytest.mark.integration
def test_autoscaling_jobs_on_dask_equal_local(dask_engine, tmp_path):
    from replaylab.fleet.experiments.autoscaling.experiment import (
        autoscaling_config,
        run_autoscaling_experiment,
    )

    cfg = autoscaling_config({
        "seeds": [0, 1], "workers": 1,
        "trace": {"source": "synthetic", "hours": 0.25, "scale": 0.1},
        "policies": ["static", "reactive", "forecast"],
        "scenarios": {"burst": {"kind": "burst", "factor": 3.0, "minutes": 5.0}},
        "sweep": {"scenario": "burst", "reactive_targets": [0.3], "forecast_targets": [0.6]}})
    local = run_autoscaling_experiment(cfg, tmp_path / "local")
    dist = run_autoscaling_experiment(cfg, tmp_path / "dask", EngineGrid(dask_engine))
    assert differences(local, dist) == []
    assert dist["speed"]["jobs"] == local["speed"]["jobs"] == 2 + 2 * 2   # + the sweep


@pytest.mark.slow
@pytest.mark.integration
def test_entry_point_overload_on_dask(dask_address, tmp_path):
    """`python -m evaluation experiment=overload compute=dask`, in process on the session's
    cluster (tests/helpers/entrypoints.py)."""
    from tests.helpers.entrypoints import evaluate

    small = ["fleet.workload.duration_s=15", "fleet.workload.seeds=[0,1]",
             "experiment.load_factors=[1.0,2.0]"]
    s = evaluate("experiment=overload", "compute=dask", f"compute.address={dask_address}",
                 "tracking=off", *small, run_dir=tmp_path / "run").summary
    assert s["pipeline"] == "fleet" and s["experiment"] == "overload"
    assert s["compute"]["kind"] == "dask" and s["compute"]["n_workers"] == 2
    # the library's sections hold the numbers of the local loop on the same config (the
    # entry point adds its own: pipeline, compute, verdict, ...)
    cfg = experiment_config("overload", **SMALL["overload"])
    local = json.loads(json.dumps(run_fleet_experiment("overload", cfg, tmp_path / "local")))
    assert differences(local, {k: s[k] for k in local if k in s}) == []
    assert set(local) <= set(s)
