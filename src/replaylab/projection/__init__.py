"""Leakage-safe projection of a replay ledger: dispatch-time features, labels, splits.

`project(ledger, projection, split, compute="local"|"dask")` (`projection.recipe`) is
the one recipe every pipeline uses: fingerprint, version, features and splits. The
column names are declared in `replaylab.contracts.columns` (`Projected`, `KEY_COLUMNS`,
`FEATURE_COLUMNS`, `HISTORY_COLUMNS`, ...); a projected row becomes a runtime request
in `projection.requests`.

`dispatch_time_features_dask` and `project_dask` live in
`replaylab.projection.distributed`, the split steps on Dask (`split_boundaries_dask`,
`assign_splits_dask`, `split_summary_dask`, `project_and_split_dask`) in
`replaylab.projection.splits_dask` (they need dask, an optional dependency); the
names are imported lazily from here.
"""

from replaylab.contracts.lazy import lazy_exports
from replaylab.projection.config import ProjectionConfig, SplitConfig
from replaylab.projection.features import dispatch_time_features, feature_columns
from replaylab.projection.leakage import LeakageError, check_no_label_leakage
from replaylab.projection.recipe import Projection, project
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
    ledger_fingerprint_dask,
    projection_version,
)

__all__ = [
    "LeakageError", "PROJECTION_CODE_VERSION", "Projection", "ProjectionConfig",
    "RUN_CODE_VERSION", "SPLITS", "SplitConfig", "assign_splits",
    "assign_splits_dask", "check_no_label_leakage", "dispatch_time_features",
    "dispatch_time_features_dask", "feature_columns", "ledger_fingerprint",
    "ledger_fingerprint_dask",
    "project", "project_and_split_dask", "project_dask", "projection_version", "split_boundaries",
    "split_boundaries_dask", "split_counts", "split_summary_dask", "time_ordered_splits",
]

_LAZY = {"dispatch_time_features_dask": ".distributed", "project_dask": ".distributed",
         "split_boundaries_dask": ".splits_dask", "assign_splits_dask": ".splits_dask",
         "split_summary_dask": ".splits_dask", "project_and_split_dask": ".splits_dask"}

# lazy: keep dask out of `import replaylab.projection`
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
