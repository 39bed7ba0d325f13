"""python -m training [pipeline=project|import|demand] [overrides...]

Compose the config, seed, open the MLflow run, call one library pipeline,
write DIR/summary.json and log what it returns. Nothing else lives here.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from omegaconf.errors import ValidationError as OmegaConfValidationError

from replaylab.config import ConfigError
from replaylab.contracts import ContractError
from replaylab.demand.labels import DemandDataError

log = logging.getLogger("replaylab")


def _pipeline(cfg: DictConfig, run_dir: Path) -> dict:
    from training import pipelines

    table = {"project": pipelines.project, "import": pipelines.import_source,
             "demand": pipelines.demand}
    if cfg.pipeline not in table:
        raise ConfigError(f"pipeline={cfg.pipeline!r} is unknown; choose one of {sorted(table)}")
    return table[cfg.pipeline](cfg, run_dir)


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from training.tracking import log_outcome, mlflow_run

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    started = time.perf_counter()
    try:
        with mlflow_run(cfg, run_dir) as run:
            summary = _pipeline(cfg, run_dir)
            summary["wall_seconds"] = round(time.perf_counter() - started, 3)
            if run is not None:
                summary["mlflow"] = {"run_id": run.info.run_id, "tracking_uri": cfg.tracking.uri,
                                     "experiment": cfg.tracking.experiment}
            path = run_dir / "summary.json"
            path.write_text(json.dumps(summary, indent=2, default=str))
            log_outcome(run, summary, run_dir, cfg)
    except (ContractError, ConfigError, DemandDataError, FileNotFoundError, ImportError,
            OmegaConfValidationError) as e:
        # A bad input is a one-line error and a non-zero exit, not a traceback.
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    log.info("wrote %s", path)


if __name__ == "__main__":
    main()
