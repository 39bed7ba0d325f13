"""Every fleet experiment runs from a fresh clone: its default config names no file outside
the package, the default run reads only the package's data, and a public file that is named
but absent is one `error:` line (what it is, where to download it) with exit code 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from replaylab.data import PUBLIC_FILES, shipped
from tests.helpers.fleet import TINY, composed_config, experiment_config

SIX = ("energy", "stale_telemetry", "rollout", "overload", "hint_admission", "autoscaling")
DATA_SUFFIXES = (".csv", ".json", ".jsonl", ".parquet")
PACKAGE_DATA = shipped()

def strings(node) -> list[str]:
    if isinstance(node, dict):
        return [s for v in node.values() for s in strings(v)]
    if isinstance(node, list | tuple):
        return [s for v in node for s in strings(v)]
    return [node] if isinstance(node, str) else []


@pytest.mark.parametrize("name", SIX)
def test_default_config_names_no_file_outside_the_package(name):
    values = experiment_config(name)
    assert "shared_dir" not in values
    text = OmegaConf.to_yaml(OmegaConf.create(values))
    assert "shared" not in text and "paths." not in text
    for s in strings(values):
        # no path of this machine; every value naming a data file names a shipped one
        assert not s.startswith(("/", "./", "../", "~")), (name, s)
        if s.endswith(DATA_SUFFIXES):
            assert (PACKAGE_DATA / "fleet" / s).is_file(), (name, s)
    w = values["workload"]
    assert w["ledger"] is None and w["path"] is None
    assert w["source"] in ("azure_conv_slice", "cdf", "synthetic")
    if name == "autoscaling":
        assert values["trace"]["source"] == "synthetic" and values["trace"]["path"] is None


class Opened:
    """The data files (by suffix) a block of code opens, via an audit hook (installed once)."""

    active: list[str] | None = None
    installed = False

    @classmethod
    def hook(cls, event, args):
        if cls.active is not None and event == "open" and isinstance(args[0], str | Path):
            p = str(args[0])
            if p.endswith(DATA_SUFFIXES):
                cls.active.append(p)

    def __enter__(self):
        if not Opened.installed:
            sys.addaudithook(Opened.hook)
            Opened.installed = True
        Opened.active = []
        return Opened.active

    def __exit__(self, *exc):
        Opened.active = None


def outside(paths: list[str], *allowed: Path) -> list[str]:
    """The data files read from neither the package's data nor `allowed` folders nor the
    environment's own (installed packages, caches)."""
    roots = [PACKAGE_DATA, *allowed, Path(sys.prefix), Path(sys.base_prefix), Path.home()]
    return sorted({p for p in paths
                   if not any(Path(p).resolve().is_relative_to(r.resolve()) for r in roots)})


CASES = [pytest.param(n, marks=pytest.mark.slow if n == "hint_admission" else ()) for n in SIX]


@pytest.mark.parametrize("name", CASES)
def test_default_run_reads_only_the_packages_data(name, tmp_path, monkeypatch):
    """Each experiment at its default workload and pools (tiny sizes), from a folder with
    nothing beside it: every data file it opens is the package's (or its own outputs)."""
    from replaylab.fleet.experiments import run_fleet_experiment

    values = experiment_config(name, **TINY[name])
    run = tmp_path / "clone" / "run"
    run.mkdir(parents=True)
    monkeypatch.chdir(run)
    if name == "autoscaling":
        values["scenarios"] = {"steady": values["scenarios"]["steady"]}
    with Opened() as opened:
        s = run_fleet_experiment(name, values, run)
    assert s["conserved"] is True
    assert not outside(opened, run), outside(opened, run)
    assert any(Path(p).resolve().is_relative_to(PACKAGE_DATA.resolve()) for p in opened)
    w = s["workload"]
    if w["file"]:
        assert Path(w["file"]).is_relative_to(PACKAGE_DATA)


def test_named_but_absent_public_files_are_one_line_each(tmp_path):
    """In the library: each place a download can be named says what it is and where to get it."""
    from replaylab.apps.evaluate import run_experiment
    from replaylab.config import ConfigError

    gone = tmp_path / "nowhere"
    cases = [
        ("energy", ["fleet.workload.source=azure_conv",
                    f"fleet.workload.path={gone}/AzureLLMInferenceTrace_conv.csv"],
         FileNotFoundError, "azure_conv"),
        ("rollout", ["fleet.workload.source=azure_code"], ConfigError, "azure_code"),
        ("overload", [f"fleet.workload.cdf={gone}/my_cdf.json"], FileNotFoundError,
         "token_cdf"),
        ("stale_telemetry", [f"experiment.pools.h100.measurements={gone}/ml.csv"],
         FileNotFoundError, "mlenergy"),
        ("autoscaling", ["experiment.trace.source=servegen"], ConfigError, "servegen"),
        ("autoscaling", ["experiment.trace.source=servegen", f"experiment.trace.path={gone}"],
         FileNotFoundError, "servegen"),
        ("autoscaling", [f"experiment.profile.splitwise_measurements={gone}/sw.csv"],
         FileNotFoundError, "splitwise"),
    ]
    for name, overrides, error, key in cases:
        with pytest.raises(error) as e:
            run_experiment(composed_config(name, *overrides), tmp_path / "run")
        line = str(e.value)
        assert "\n" not in line and PUBLIC_FILES[key].url in line, (name, line)


@pytest.mark.parametrize("overrides, url", [
    (["experiment=energy", "fleet.workload.source=azure_conv",
      "fleet.workload.path=absent/AzureLLMInferenceTrace_conv.csv"], PUBLIC_FILES["azure_conv"].url),
    pytest.param(["experiment=autoscaling", "experiment.trace.source=servegen",
                  "experiment.trace.path=absent/m-large"], PUBLIC_FILES["servegen"].url,
                 marks=pytest.mark.slow),
])
def test_entry_point_named_but_absent_trace_is_one_line_and_exit_2(overrides, url, tmp_path):
    from tests.helpers.entrypoints import evaluate

    proc = evaluate(*overrides, "tracking=off", run_dir=tmp_path / "run", check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "absent/" in errors[0] and url in errors[0]
