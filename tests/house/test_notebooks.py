"""Execute every notebook against a fresh small run, so none can rot."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import REPO
from tests.helpers.entrypoints import run_training

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("nb-run")
    run_training(f"hydra.run.dir={out}", "data.synthetic.n_sessions=200", "tracking=off")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path, small_run, monkeypatch):
    monkeypatch.setenv("REPLAYLAB_RUN_DIR", str(small_run))
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(REPO)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    assert os.environ["REPLAYLAB_RUN_DIR"] == str(small_run)


def test_there_is_a_notebook():
    assert NOTEBOOKS, "notebooks/ must hold at least one notebook"
