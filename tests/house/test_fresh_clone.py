"""The README's commands from a copy of the repository with nothing beside it.

A user takes the repository, not our folder. This test copies the tracked tree
(`git ls-files`, the working tree's content) into an empty temporary folder, so no
`../shared` is beside it and no file of the build machine is reachable, points
Python at the copy's own package (`PYTHONPATH=COPY/src`: the copy's package data,
not the editable install's) and runs, from there, each command that needs no file of
the user's, at tiny sizes:

- `python -m training` (pipeline=project) and the bare `pipeline=forecast`;
- `pipeline=demand`, then `python -m export run_dir=...` on the finished run and
  `python -m evaluation residuals` of that run's ledger through its artifact;
- each of the six fleet experiments.

Each must exit 0 and end with its verdict line: the console's last line equals the
`verdict` its summary.json carries. One copy, one module-scoped fixture; the runs are
independent tests so a failure names its command.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.helpers.fleet import TINY, tiny_overrides

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """The tracked tree copied into an empty folder (its parent holds nothing else)."""
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: the tracked tree is unknown")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")
    root = tmp_path_factory.mktemp("fresh") / "replaylab"
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():  # a tracked file deleted in the working tree is not copied
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / rel)
    assert not (root.parent / "shared").exists()
    return root


def run_here(clone: Path, label: str, *cmd: str, timeout: int = 600) -> dict:
    """Run `python -m <cmd>` in the copy (outputs in runs/<label>); assert exit 0 and the
    verdict as the console's last line."""
    out = clone.parent / "runs" / label
    env = {k: v for k, v in os.environ.items()
           if k not in ("REPLAYLAB_SHARED_DATA", "PYTHONPATH", "MLFLOW_TRACKING_URI")}
    env.update(PYTHONPATH=str(clone / "src"), HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", *cmd, f"hydra.run.dir={out}", "tracking=off"],
                          cwd=clone, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    summary = json.loads((out / "summary.json").read_text())
    last = proc.stdout.strip().splitlines()[-1]
    assert summary["verdict"] and last == summary["verdict"], (last, summary["verdict"])
    # the run read nothing outside the copy, its outputs and the installed packages
    text = json.dumps(summary)
    assert str(REPO) not in text, f"{cmd}: the summary names the source checkout"
    return summary


def test_the_copy_imports_its_own_package(clone):
    env = {**os.environ, "PYTHONPATH": str(clone / "src")}
    where = subprocess.run([sys.executable, "-c", "import replaylab; print(replaylab.__file__)"],
                           cwd=clone, env=env, capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(clone)


def test_project(clone):
    s = run_here(clone, "project", "training", "pipeline=project", "data.synthetic.n_sessions=300")
    assert s["rows_read"] == s["rows_valid"] + s["rows_quarantined"] > 0


def test_demand_then_export_then_residuals(clone):
    d = run_here(clone, "demand", "training", "pipeline=demand", "data.synthetic.n_sessions=600",
                 "demand.model.n_estimators=40")
    run_dir = Path(d["artifacts"]["demand"]).parents[1]
    assert (run_dir / "summary.json").is_file()
    e = run_here(clone, "export", "export", f"run_dir={run_dir}",
                 f"out={clone.parent / 'reexport' / 'demand'}")
    assert e["export"]["content_hash"].startswith("sha256:")
    ledger = run_dir / "ledger.parquet"
    r = run_here(clone, "residuals", "evaluation", "experiment=residuals", f"data.ledger={ledger}",
                 f"experiment.artifact={e['artifacts']['demand']}")
    assert r["overall"]["scored"] > 0 and 0 <= r["overall"]["coverage"] <= 1


def test_bare_forecast(clone):
    s = run_here(clone, "forecast", "training", "pipeline=forecast")
    assert s["pipeline"] == "forecast"


# Each fleet experiment at the tiny size of tests/fleet/test_fleet_defaults.py, on its
# shipped default workload (no path given).
@pytest.mark.parametrize("name", sorted(TINY))
def test_fleet_experiment(clone, name):
    s = run_here(clone, name, "evaluation", f"experiment={name}", *tiny_overrides(name))
    assert s["experiment"] == name
