"""python -m export [ACTION] key=value ...

  python -m export run_dir=DIR | run_id=<mlflow run> [out=PATH]   re-export a run (either kind)
  python -m export register run_dir=DIR                           register a run's artifacts
  python -m export promote name=M version=N alias=champion [force=true reason=...]
  python -m export fetch name=M alias=champion out=DIR            download + verify
  python -m export compare name=M version=N [alias=champion]      challenger vs champion

The first word, when it is not a key=value override, is `action=<word>`
(`replaylab.apps.export`, `replaylab.apps.registry`, docs/howto/mlflow.md). Nothing
else lives here. A refused promotion exits 3 (it is recorded as an MLflow run).
"""

from __future__ import annotations

import json
import sys

import hydra
from omegaconf import DictConfig


@hydra.main(config_path="../conf", config_name="export", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from replaylab.apps.export import check_request, exit_code, export_job, input_errors
    from replaylab.apps.recording import run_recorded

    path = run_recorded(cfg, export_job, input_errors(), precheck=check_request)
    sys.exit(exit_code(json.loads(path.read_text())))


if __name__ == "__main__":
    from replaylab.apps.schemas import register_schemas

    if len(sys.argv) > 1 and "=" not in sys.argv[1] and not sys.argv[1].startswith("-"):
        sys.argv[1] = f"action={sys.argv[1]}"
    register_schemas()
    main()
