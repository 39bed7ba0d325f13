"""python -m evaluation experiment=<name> [overrides...]   (or: python -m evaluation <name> ...)

Compose the config (conf_eval/), open the MLflow run, call one library
experiment, write DIR/summary.json and log what it returns. Nothing else lives here.
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ValidationError as OmegaConfValidationError

from replaylab.config import ConfigError
from replaylab.contracts import ContractError
from replaylab.hints.residuals import ResidualDataError

log = logging.getLogger("replaylab")


def _autoscaling(cfg: DictConfig, run_dir: Path) -> dict:
    from replaylab.forecast.experiments import run_autoscaling_experiment

    return run_autoscaling_experiment(OmegaConf.to_container(cfg.experiment, resolve=True),
                                      run_dir)


def _residuals(cfg: DictConfig, run_dir: Path) -> dict:
    from evaluation.residuals import residuals

    return residuals(cfg, run_dir)


def _fleet(cfg: DictConfig, run_dir: Path) -> dict:
    from evaluation.fleet import fleet

    return fleet(cfg, run_dir)


EXPERIMENTS = {"autoscaling": _autoscaling, "residuals": _residuals,
               **dict.fromkeys(("energy", "hint_admission", "stale_telemetry", "rollout",
                                "overload"), _fleet)}


def _positional_experiment(argv: list[str]) -> list[str]:
    """`python -m evaluation residuals k=v` -> `experiment=residuals k=v` (Hydra wants k=v)."""
    if len(argv) > 1 and "=" not in argv[1] and not argv[1].startswith("-"):
        return [argv[0], f"experiment={argv[1]}", *argv[2:]]
    return argv


def _experiment(cfg: DictConfig, run_dir: Path) -> dict:
    name = cfg.experiment.name
    if name not in EXPERIMENTS:
        raise ConfigError(f"experiment={name!r} is unknown; choose one of {sorted(EXPERIMENTS)}")
    return EXPERIMENTS[name](cfg, run_dir)


# A bad input or config (not a bug): one `error: ...` line and exit code 2. ContractError:
# a ledger file that cannot be read as ledger-v1; ResidualDataError: one with no hints.
INPUT_ERRORS = (ContractError, ConfigError, ResidualDataError, FileNotFoundError, ImportError,
                OmegaConfValidationError)


@hydra.main(config_path="../conf_eval", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from training.tracking import run_recorded

    path = run_recorded(cfg, _experiment, INPUT_ERRORS)
    log.info("wrote %s", path)


if __name__ == "__main__":
    import sys

    sys.argv = _positional_experiment(sys.argv)
    main()
