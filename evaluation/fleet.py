"""Glue of the fleet experiments (`python -m evaluation experiment=energy|hint_admission|...`).

The composed `experiment` section goes to `replaylab.fleet.experiments.run_fleet_experiment`
as a plain mapping; the library writes the figures and returns the summary.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf


def fleet(cfg: DictConfig, run_dir: Path) -> dict:
    from replaylab.fleet.experiments import run_fleet_experiment

    values = OmegaConf.to_container(cfg.experiment, resolve=True)
    summary = run_fleet_experiment(str(cfg.experiment.name), values, run_dir)
    return {"pipeline": "fleet", **summary}
