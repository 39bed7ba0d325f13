"""`python -m evaluation experiment=<name>`: one library experiment per name, summary out."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from replaylab.config import ConfigError
from replaylab.contracts.errors import InputError


def fleet_values(cfg: DictConfig) -> dict:
    """What a fleet experiment receives: the composed `experiment` section as a plain
    mapping, with the shared `fleet.workload` section as its `workload`."""
    return {**OmegaConf.to_container(cfg.experiment, resolve=True),
            "workload": OmegaConf.to_container(cfg.fleet.workload, resolve=True)}


def fleet(cfg: DictConfig, run_dir: Path) -> dict:
    """The fleet experiments: `fleet_values(cfg)` goes to
    `replaylab.fleet.experiments.run_fleet_experiment`; the library writes the figures
    and returns the summary. The experiment's grid of cells runs where `compute` says
    (`harness.EngineGrid`): compute=local (the default) in a loop here, compute=dask one
    task per cell (a LocalCluster, or the scheduler at compute.address), with the same
    numbers; the summary says which engine ran (`compute`)."""
    from replaylab.apps.inputs import compute_engine
    from replaylab.fleet.experiments import run_fleet_experiment
    from replaylab.fleet.experiments.harness import EngineGrid

    name, values = str(cfg.experiment.name), fleet_values(cfg)
    with compute_engine(cfg) as engine:
        summary = run_fleet_experiment(name, values, run_dir, runner=EngineGrid(engine))
        summary["compute"] = engine.facts()
    return {"pipeline": "fleet", **summary}


def residuals(cfg: DictConfig, run_dir: Path) -> dict:
    """experiment=residuals: residuals of a hinted ledger by group, calibration drift."""
    from replaylab.apps.residuals import residuals as run_residuals

    return run_residuals(cfg, run_dir)


def experiments() -> dict:
    """experiment name -> its job: residuals, and every fleet experiment (one package)."""
    from replaylab.fleet.experiments import FLEET_EXPERIMENTS

    return {"residuals": residuals, **dict.fromkeys(FLEET_EXPERIMENTS, fleet)}


EXPERIMENTS = experiments()


def run_experiment(cfg: DictConfig, run_dir: Path) -> dict:
    """The job of `python -m evaluation`: the experiment `cfg.experiment.name` names."""
    name = cfg.experiment.name
    if name not in EXPERIMENTS:
        raise ConfigError(f"experiment={name!r} is unknown; choose one of {sorted(EXPERIMENTS)}")
    return EXPERIMENTS[name](cfg, run_dir)


def positional_experiment(argv: list[str]) -> list[str]:
    """`python -m evaluation residuals k=v` -> `experiment=residuals k=v` (Hydra wants k=v)."""
    if len(argv) > 1 and "=" not in argv[1] and not argv[1].startswith("-"):
        return [argv[0], f"experiment={argv[1]}", *argv[2:]]
    return argv


def input_errors() -> tuple[type[BaseException], ...]:
    """A bad input or config (not a bug): one `error: ...` line and exit code 2. Every
    such error of the library is an `InputError`: a ContractError (a ledger that cannot
    be read as ledger-v1), a ResidualDataError (one with no hints), a DemandDataError
    (one that cannot train the demand model: experiment=hint_admission on
    fleet.workload.ledger)...; the others are a missing file, a missing optional
    dependency and a config that fails its schema."""
    from omegaconf.errors import ValidationError as OmegaConfValidationError

    return (InputError, FileNotFoundError, ImportError, OmegaConfValidationError)
