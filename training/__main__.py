"""python -m training [pipeline=project|demand|forecast|import|router] [overrides...]

Compose the config, seed, open the MLflow run, call one library pipeline,
write DIR/summary.json and log what it returns. Nothing else lives here.
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig
from omegaconf.errors import ValidationError as OmegaConfValidationError

from replaylab.artifacts.golden import ParityError
from replaylab.config import ConfigError
from replaylab.contracts import ContractError
from replaylab.demand.labels import DemandDataError
from replaylab.pipelines.router import RouterDataError

log = logging.getLogger("replaylab")


def _pipeline(cfg: DictConfig, run_dir: Path) -> dict:
    from training import forecast_glue, pipelines, router_glue

    table = {"project": pipelines.project, "import": pipelines.import_source,
             "demand": pipelines.demand, "forecast": forecast_glue.forecast,
             "router": router_glue.router}
    if cfg.pipeline not in table:
        raise ConfigError(f"pipeline={cfg.pipeline!r} is unknown; choose one of {sorted(table)}")
    return table[cfg.pipeline](cfg, run_dir)


INPUT_ERRORS = (ContractError, ConfigError, DemandDataError, RouterDataError, FileNotFoundError,
                ImportError, OmegaConfValidationError, ParityError)


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from training.tracking import run_recorded

    path = run_recorded(cfg, _pipeline, INPUT_ERRORS)
    log.info("wrote %s", path)


if __name__ == "__main__":
    main()
