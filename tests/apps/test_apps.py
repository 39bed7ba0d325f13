"""replaylab.apps: what the entry points share, and how the package installs.

The shipped default outcomes are a package resource (found without path arithmetic),
and the built wheel holds the library and its data, not the generic top-level
`training`, `export` and `evaluation` packages (those run from a checkout).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from replaylab.apps.evaluate import EXPERIMENTS, positional_experiment
from replaylab.apps.inputs import default_outcomes

REPO = Path(__file__).resolve().parents[2]


def test_the_default_outcomes_are_a_package_resource():
    path = default_outcomes()
    assert path.is_file() and path.stat().st_size > 100_000
    import replaylab

    assert Path(replaylab.__file__).parent in path.parents
    header = path.read_text(encoding="utf-8").splitlines()[0].split(",")
    assert header == ["prompt", "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"]


def test_positional_experiment_name():
    assert positional_experiment(["x", "residuals", "a=1"]) == ["x", "experiment=residuals", "a=1"]
    assert positional_experiment(["x", "experiment=energy"]) == ["x", "experiment=energy"]
    assert positional_experiment(["x", "--help"]) == ["x", "--help"]
    assert {"energy", "autoscaling", "residuals"} <= set(EXPERIMENTS)


@pytest.mark.slow
def test_the_wheel_holds_the_library_and_its_data_not_the_entry_points(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path), str(REPO)],
                   check=True, capture_output=True, timeout=300)
    wheel = next(tmp_path.glob("replaylab-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "replaylab/data/routellm_gsm8k/gsm8k_responses.csv" in names
    assert "replaylab/data/routellm_gsm8k/NOTICE.md" in names
    assert "replaylab/apps/recording.py" in names
    tops = {n.split("/")[0] for n in names}
    assert not tops & {"training", "export", "evaluation"}, sorted(tops)
