"""The demand pipeline's in-memory front door.

`train_demand` runs THE demand pipeline (`pipelines.demand_partitions.
train_demand_partitions`, written once against `compute.Engine`) on a `LocalEngine` over a
ledger already read and validated in memory (`pipelines.project.LoadedLedger`): what
`python -m training pipeline=demand` runs for compute=local, for callers that hold a
ledger frame (tests, benchmarks, the fleet's hint experiment, the Rust fixtures).
What a run fitted (`DemandRun`) and the outputs the stages share:
`pipelines.demand_outputs`.
The rules for censored, cancelled and absent-usage rows: docs/design/demand-target.md;
how the model trains on rows cut at their cap (`demand.censoring`, chosen on the
calibration split by default): `replaylab.demand.censoring`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from replaylab.compute import LocalEngine
from replaylab.demand.config import DemandConfig
from replaylab.demand.hpo import HPOConfig, OnTrial
from replaylab.pipelines.demand_outputs import DemandRun
from replaylab.pipelines.demand_partitions import train_demand_partitions
from replaylab.pipelines.project import LoadedLedger, ledger_artifact
from replaylab.projection import ProjectionConfig, SplitConfig


def train_demand(loaded: LoadedLedger, projection: ProjectionConfig, split: SplitConfig,
                 demand: DemandConfig, out_dir: Path, *, hpo: HPOConfig | None = None,
                 on_trial: OnTrial | None = None, write_ledger: bool = False,
                 engine: Any = None, progress: Callable[[str], None] | None = None,
                 ) -> tuple[dict, DemandRun]:
    """THE demand pipeline (`train_demand_partitions`) over `loaded`'s valid rows, on
    `engine` (default a `LocalEngine`: one partition); returns (summary, `DemandRun`).
    hpo/on_trial: the Optuna search before the final fit; write_ledger: the synthetic
    ledger written beside the run (`summary.artifacts.ledger`); progress: the stage lines.
    Raises DemandDataError when the ledger cannot train a model (no usable labels, a single
    session, everything censored, too few calibration rows)."""
    engine = engine or LocalEngine()
    out_dir = Path(out_dir)
    summary, run = train_demand_partitions(
        engine, engine.from_validated(loaded.result), demand, projection, split, out_dir,
        injected_defects=loaded.injected_defects, hpo=hpo, on_trial=on_trial,
        progress=progress)
    summary["artifacts"] = {**ledger_artifact(loaded, out_dir, write_ledger),
                            **summary["artifacts"]}
    return summary, run
