"""`python -m training pipeline=import source=X` without its file, or with one that is not there:
one `error:` line naming the file and where to download it, exit code 2, no MLflow run."""

from __future__ import annotations

import pytest

from replaylab.sources.registry import SOURCES
from tests.helpers.entrypoints import train


@pytest.mark.parametrize("name, path", [("azure_conv", None), ("servegen", "absent/m-large")])
def test_import_without_its_file_is_one_line_and_exit_2(name, path, tmp_path):
    db = tmp_path / "mlflow.db"
    proc = train("pipeline=import", f"source={name}", f"out={tmp_path / 'x.parquet'}",
                 f"tracking.uri=sqlite:///{db}", *([f"source.path={path}"] if path else []),
                 run_dir=tmp_path / "run", check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: source={name}")
    assert SOURCES[name].file in lines[0] and SOURCES[name].url in lines[0]
    assert ("needs source.path=PATH" if path is None else "does not exist") in lines[0]
    assert not db.exists()  # refused before the run was opened
