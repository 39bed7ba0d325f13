"""`python -m evaluation experiment=<name>`: one library experiment per name, summary out."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from replaylab.config import ConfigError


def autoscaling(cfg: DictConfig, run_dir: Path) -> dict:
    """experiment=autoscaling: static, HPA-like and forecast-driven controllers of the fleet
    simulator (docs/autoscaling.md)."""
    from replaylab.fleet.autoscaling_experiment import (
        autoscaling_config,
        run_autoscaling_experiment,
    )

    values = OmegaConf.to_container(cfg.experiment, resolve=True)
    return run_autoscaling_experiment(autoscaling_config(values), run_dir)


def fleet(cfg: DictConfig, run_dir: Path) -> dict:
    """The fleet experiments: the composed `experiment` section goes to
    `replaylab.fleet.experiments.run_fleet_experiment` as a plain mapping; the library
    writes the figures and returns the summary."""
    from replaylab.fleet.experiments import run_fleet_experiment

    values = OmegaConf.to_container(cfg.experiment, resolve=True)
    summary = run_fleet_experiment(str(cfg.experiment.name), values, run_dir)
    return {"pipeline": "fleet", **summary}


def residuals(cfg: DictConfig, run_dir: Path) -> dict:
    """experiment=residuals: residuals of a hinted ledger by group, calibration drift."""
    from replaylab.apps.residuals import residuals as run_residuals

    return run_residuals(cfg, run_dir)


EXPERIMENTS = {"autoscaling": autoscaling, "residuals": residuals,
               **dict.fromkeys(("energy", "hint_admission", "stale_telemetry", "rollout",
                                "overload"), fleet)}


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
    """A bad input or config (not a bug): one `error: ...` line and exit code 2.
    ContractError: a ledger that cannot be read as ledger-v1; ResidualDataError: one
    with no hints."""
    from omegaconf.errors import ValidationError as OmegaConfValidationError

    from replaylab.contracts import ContractError
    from replaylab.hints.residuals import ResidualDataError

    return (ContractError, ConfigError, ResidualDataError, FileNotFoundError, ImportError,
            OmegaConfValidationError)
