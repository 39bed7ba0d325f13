"""python -m evaluation experiment=<name> [overrides...]   (or: python -m evaluation <name> ...)

Compose the config, open the MLflow run, call one library experiment, write
DIR/summary.json and log what it returns (`replaylab.apps`). Nothing else lives here.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig


@hydra.main(config_path="../conf", config_name="evaluate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from replaylab.apps.evaluate import input_errors, run_experiment
    from replaylab.apps.recording import run_recorded

    run_recorded(cfg, run_experiment, input_errors())


if __name__ == "__main__":
    import sys

    from replaylab.apps.evaluate import positional_experiment
    from replaylab.apps.schemas import register_schemas

    register_schemas()
    sys.argv = positional_experiment(sys.argv)
    main()
