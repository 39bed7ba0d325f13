"""python -m training [pipeline=project|demand|forecast|import|router] [overrides...]

Compose the config, open the MLflow run, call one library pipeline, write
DIR/summary.json and log what it returns (`replaylab.apps`). Nothing else lives here.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig


@hydra.main(config_path="../conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from replaylab.apps.recording import run_recorded
    from replaylab.apps.train import input_errors, precheck, run_pipeline

    run_recorded(cfg, run_pipeline, input_errors(), precheck)


if __name__ == "__main__":
    from replaylab.apps.schemas import register_schemas

    register_schemas()
    main()
