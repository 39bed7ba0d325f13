"""One base class for a bad input: every error the entry points report as one
`error: ...` line with exit code 2 is a `replaylab.contracts.errors.InputError`.

The CLI end of it (a bad ledger through `python -m training`: exit code 2, one line)
is `tests/apps/test_entrypoints.py::test_bad_ledger_is_one_line_error_and_nonzero_exit`;
here `run_recorded` is driven in process with a job that raises.
"""

from __future__ import annotations

import importlib

import pytest
from omegaconf import OmegaConf

from replaylab.contracts.errors import InputError

# (module, class, the built-in base it keeps): every class the three apps' input_errors()
# tuples listed by name before they became (InputError, FileNotFoundError, ImportError,
# OmegaConf's ValidationError).
LISTED = [
    ("replaylab.config", "ConfigError", ValueError),
    ("replaylab.contracts.schema", "ContractError", ValueError),
    ("replaylab.demand.labels", "DemandDataError", ValueError),
    ("replaylab.pipelines.router", "RouterDataError", ValueError),
    ("replaylab.contracts.golden", "ParityError", ValueError),
    ("replaylab.compute.stages", "StageFailed", RuntimeError),
    ("replaylab.apps.registry", "FetchRefused", Exception),
    ("replaylab.contracts.manifest", "ManifestError", Exception),
    ("replaylab.demand.state", "RunStateError", ValueError),
    ("replaylab.hints.residuals", "ResidualDataError", ValueError),
]
APPS = ("replaylab.apps.train", "replaylab.apps.export", "replaylab.apps.evaluate")


def _cls(module: str, name: str) -> type[BaseException]:
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize(("module", "name", "base"), LISTED, ids=[n for _, n, _ in LISTED])
def test_each_listed_error_is_an_input_error_and_keeps_its_base(module, name, base):
    cls = _cls(module, name)
    assert issubclass(cls, InputError) and issubclass(cls, base)
    if base is Exception:  # not turned into a ValueError: `except ValueError` sees the same
        assert not issubclass(cls, ValueError)


@pytest.mark.parametrize("app", APPS)
def test_every_app_reports_every_listed_error(app):
    from omegaconf.errors import ValidationError

    caught = importlib.import_module(app).input_errors()
    assert caught == (InputError, FileNotFoundError, ImportError, ValidationError)
    for module, name, _ in LISTED:
        assert issubclass(_cls(module, name), caught), (app, name)


def test_subclasses_of_listed_errors_are_input_errors_too():
    from replaylab.contracts.golden import GoldenError
    from replaylab.forecast.panel import ForecastDataError
    from replaylab.projection.leakage import LeakageError
    from replaylab.runtime.encoder_base import EncoderArtifactError

    for cls in (GoldenError, ForecastDataError, LeakageError, EncoderArtifactError):
        assert issubclass(cls, InputError), cls


def _hydra(monkeypatch, tmp_path):
    """A Hydra run with no overrides (the override check is tests/apps/test_conf_schemas.py's)."""
    from hydra.core.hydra_config import HydraConfig

    from replaylab.apps import schemas

    fake = OmegaConf.create({"runtime": {"output_dir": str(tmp_path)},
                             "overrides": {"task": []}})
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: fake))
    monkeypatch.setattr(schemas, "refuse_added_keys", lambda overrides: None)


@pytest.mark.parametrize(("module", "name"), [
    ("replaylab.compute.stages", "StageFailed"),
    ("replaylab.apps.registry", "FetchRefused"),
    ("replaylab.contracts.schema", "ContractError"),
])
def test_an_input_error_is_one_line_and_exit_code_2(monkeypatch, tmp_path, capsys, module, name):
    from replaylab.apps.recording import run_recorded
    from replaylab.apps.train import input_errors

    _hydra(monkeypatch, tmp_path)
    cfg = OmegaConf.create({"tracking": {"enabled": False}})
    cls = _cls(module, name)

    def job(cfg, run_dir):
        raise cls("stage 'fit' stopped: a worker was lost; rerun")

    with pytest.raises(SystemExit) as got:
        run_recorded(cfg, job, input_errors())
    assert got.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: stage 'fit' stopped: a worker was lost; rerun"]


def test_a_bug_keeps_its_traceback(monkeypatch, tmp_path):
    from replaylab.apps.recording import run_recorded
    from replaylab.apps.train import input_errors

    _hydra(monkeypatch, tmp_path)
    cfg = OmegaConf.create({"tracking": {"enabled": False}})

    def job(cfg, run_dir):
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        run_recorded(cfg, job, input_errors())
