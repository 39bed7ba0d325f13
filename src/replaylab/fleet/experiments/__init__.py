"""Fleet experiments: `python -m evaluation experiment=<name>` for each of

    energy           least-loaded vs static efficient pool vs energy-aware, J per success and
                     per output token beside SLO, cost and capacity; again under +-20 %
                     power-model error (does the ranking hold?)                 energy.py
    hint_admission   admission without a hint / with the demand artifact's hint / with the
                     true length                                         hint_admission/
    stale_telemetry  telemetry-aware least-loaded through a scrape outage  stale_telemetry.py
    rollout          shadow, canary shares 0/25/50/100 % and a rollback          rollout.py
    overload         arrivals at 1x, 1.5x, 2x the fleet's capacity, with and without
                     admission                                                  overload.py
    autoscaling      static vs HPA vs forecast-driven controllers over a day (steady, burst,
                     mix drift, under-forecast) and a target sweep          autoscaling/

Each experiment (a module, or a package: hint_admission/, autoscaling/) exposes
`run(cfg, run_dir, runner=None) -> dict` and its config dataclass, which extends the
harness's `ExperimentConfig` (YAML: conf/experiment/base/), and imports only the harness
(`harness/`: the base config, pools, policies, simulation, replicate statistics, and the
fan-out of its (policy x window/load x seed) cells, a local loop or Dask tasks, same
results; `workloads.py`: the shared `fleet.workload` section and its loading), never
another experiment. `run_fleet_experiment(name, cfg, run_dir)` imports the module by name
when it runs; nothing is imported here at import time.

`cfg` is the plain experiment mapping as Hydra composes it (conf/experiment/<name>.yaml)
with `workload` = the composed `fleet.workload`. The summary the entry point writes to
summary.json:

    {"experiment": name, "workload": {description, source, file, fingerprint, rows_read,
     rows_quarantined, rows_used, rows_skipped, ..., requests_simulated, windows, time_scale},
     "policies": {"<policy>": {SUMMARY_KEYS..., "conserved": bool}, ...},
     "conserved": bool, <experiment sections>, "reports": {figure: path}}
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FLEET_EXPERIMENTS = ("energy", "hint_admission", "stale_telemetry", "rollout", "overload",
                     "autoscaling")


def run_fleet_experiment(name: str, cfg: Mapping[str, Any], run_dir: Path,
                         runner: Any = None) -> dict[str, Any]:
    """Run fleet experiment `name` with its plain config; returns the JSON-safe summary.

    runner: how the experiment's grid of cells runs (`harness.LocalGrid`, the default: a loop
    here; `harness.EngineGrid(engine)`: where the run's compute engine works, on Dask one
    task per cell); the summary is the same."""
    from replaylab.config import ConfigError

    if name not in FLEET_EXPERIMENTS:
        raise ConfigError(f"fleet experiment {name!r} unknown; one of {sorted(FLEET_EXPERIMENTS)}")
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    module = importlib.import_module(f"{__name__}.{name}")
    return module.run(cfg, Path(run_dir), runner=runner)
