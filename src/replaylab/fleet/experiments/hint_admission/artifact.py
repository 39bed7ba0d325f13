"""The demand artifact the hints come from: the training ledger (synthetic or a ledger-v1
file), `train_demand` + `export_demand`, loaded back through the runtime
(`DemandPredictor`); `window_rows` cuts a ledger to one window of the demand split.

Part of the hint_admission experiment (`hint_admission/__init__.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from replaylab.config import from_mapping
from replaylab.fleet.experiments.hint_admission.config import HintConfig
from replaylab.fleet.experiments.workloads import read_workload_ledger


def synthetic_ledger(c: HintConfig, seed: int):
    from replaylab.pipelines.project import LedgerInput, load_ledger

    return load_ledger(LedgerInput(synthetic=c.workload.synthetic, seed=seed))


def training_ledger(c: HintConfig):
    """(LoadedLedger to train on, the ReplayedLedger of a file or None for synthetic)."""
    if not c.workload.replays_ledger:
        return synthetic_ledger(c, c.ledger.train_seed), None
    from replaylab.pipelines.project import LoadedLedger

    led = read_workload_ledger(c.workload)
    return LoadedLedger(led.result, origin=led.file), led


def train_and_export(c: HintConfig, run_dir: Path, loaded) -> dict[str, Any]:
    """Train on `loaded` (the training ledger), export, load through the runtime;
    facts + predictor."""
    from replaylab.artifacts.demand_export import export_demand
    from replaylab.demand import DemandConfig
    from replaylab.pipelines.demand import train_demand
    from replaylab.projection import ProjectionConfig, SplitConfig
    from replaylab.runtime.demand import DemandPredictor

    demand = from_mapping(DemandConfig, dict(c.demand), "experiment.demand")
    split = SplitConfig(embargo_ms=int(c.ledger.embargo_ms))
    dsum, run = train_demand(loaded, ProjectionConfig(), split, demand, run_dir / "demand_run")
    art = export_demand(run, dsum, run_dir / "artifacts" / "demand")
    predictor = DemandPredictor.load(art)
    if not predictor.loaded:
        raise RuntimeError(f"the exported demand artifact did not load: {predictor.reason}")
    test = dsum.get("test") or {}
    return {"loaded": loaded, "predictor": predictor, "windows": run.time_window,
            "artifact": str(art), "version": predictor.version,
            "demand_test": {"rows": test.get("rows"), "model_beats": test.get("model_beats")},
            "rows": int(len(loaded.result.valid))}


def window_rows(frame: pd.DataFrame, win: Mapping[str, int]) -> pd.DataFrame:
    ts = frame["timestamp"].to_numpy("int64")
    return frame[(ts >= int(win["first_ms"])) & (ts <= int(win["last_ms"]))]
