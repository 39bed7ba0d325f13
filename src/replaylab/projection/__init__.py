"""Leakage-safe projection of a replay ledger: dispatch-time features, labels, splits.

`project(ledger, projection, split)` (a pandas ledger) and `project_on(engine, valid,
projection, split)` (the rows as a compute engine's partitions) are the one recipe
(`projection.recipe`) every pipeline uses: fingerprint, version, features and splits,
the same on either engine. The per-partition steps (features on session-whole
partitions, the exact split boundaries by selection) are `projection.partitioned`. The
column names are declared in `replaylab.contracts.columns` (`Projected`,
`KEY_COLUMNS`, `FEATURE_COLUMNS`, `HISTORY_COLUMNS`, ...); a projected row becomes a
runtime request in `projection.requests`.
"""

from replaylab.projection.config import ProjectionConfig, SplitConfig
from replaylab.projection.features import dispatch_time_features, feature_columns
from replaylab.projection.leakage import LeakageError, check_no_label_leakage
from replaylab.projection.recipe import Projection, project, project_on
from replaylab.projection.splits import (
    SPLITS,
    assign_splits,
    split_boundaries,
    split_counts,
    time_ordered_splits,
)
from replaylab.projection.version import (
    PROJECTION_CODE_VERSION,
    RUN_CODE_VERSION,
    ledger_fingerprint,
    projection_version,
)

__all__ = [
    "LeakageError", "PROJECTION_CODE_VERSION", "Projection", "ProjectionConfig",
    "RUN_CODE_VERSION", "SPLITS", "SplitConfig", "assign_splits", "check_no_label_leakage",
    "dispatch_time_features", "feature_columns", "ledger_fingerprint", "project",
    "project_on", "projection_version", "split_boundaries", "split_counts",
    "time_ordered_splits",
]
