"""The demand pipeline's rows in memory, for model-level experiments (benchmarks, tests).

`prepare_data` projects the valid ledger rows by the one projection recipe
(`projection.project`), labels them (`demand.labels`) and checks they can train a
model, as the pipeline's project stage does per partition
(`pipelines.demand_partitions`); `DemandData` holds the rows, the split of each and the
train / calibration / test selections. The pipeline itself (every stage, HPO and the
censoring choice) runs on engine partitions: `pipelines.demand.train_demand` in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from replaylab.contracts import Ledger as L
from replaylab.demand.config import DemandConfig
from replaylab.demand.labels import (
    DemandDataError,
    DemandLabels,
    check_trainable,
    demand_labels,
)
from replaylab.pipelines.project import LoadedLedger
from replaylab.projection import ProjectionConfig, SplitConfig, project


@dataclass
class DemandData:
    """The projected ledger, its labels and the row selections every stage shares."""

    features: pd.DataFrame
    splits: np.ndarray  # (n,) train / calibration / test / embargo
    labels: DemandLabels
    masks: dict[str, np.ndarray]  # labelled rows of train and calibration; all test rows
    fingerprint: str
    version: str
    _frames: dict[str, pd.DataFrame] = field(default_factory=dict)

    def frame(self, split: str) -> pd.DataFrame:
        if split not in self._frames:  # one copy per split
            self._frames[split] = self.features[self.masks[split]]
        return self._frames[split]

    def y(self, split: str) -> np.ndarray:
        return self.labels.y_total[self.masks[split]]


def prepare_data(loaded: LoadedLedger, projection: ProjectionConfig, split: SplitConfig,
                 demand: DemandConfig) -> DemandData:
    """Project, split and label the valid rows; DemandDataError when nothing can be trained."""
    ledger = loaded.result.valid
    if len(ledger) == 0:
        raise DemandDataError(f"{loaded.origin}: no valid ledger rows "
                              f"({loaded.result.rows_quarantined} "
                              "quarantined, see quarantine/ledger.jsonl): nothing to train on")
    projected = project(ledger, projection, split)
    features, splits = projected.features, projected.splits
    labels = demand_labels(features, ledger, demand.failed_is_censored)
    check_trainable(labels, splits, int(features[L.SESSION_ID].nunique()),
                    demand.min_train_rows, demand.min_calibration_rows)
    masks = {s: labels.usable & (splits == s) for s in ("train", "calibration")}
    masks["test"] = splits == "test"
    return DemandData(features, splits, labels, masks, projected.fingerprint, projected.version)
