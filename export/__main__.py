"""python -m export run_dir=DIR | run_id=<mlflow run> [out=PATH] [export.version=1.2.0]

Re-export the demand artifact (model.onnx + manifest.json) of a finished
`python -m training pipeline=demand` run, from its folder or from MLflow, and
write DIR/summary.json (`replaylab.apps.export`). Nothing else lives here.
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

log = logging.getLogger("replaylab")


@hydra.main(config_path="../conf", config_name="export", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from replaylab.apps.export import export_demand_run, input_errors
    from replaylab.apps.recording import run_recorded

    log.info("wrote %s", run_recorded(cfg, export_demand_run, input_errors()))


if __name__ == "__main__":
    from replaylab.apps.schemas import register_schemas

    register_schemas()
    main()
