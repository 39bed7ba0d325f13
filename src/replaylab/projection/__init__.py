"""Leakage-safe projection of a replay ledger: dispatch-time features, labels, splits.

`dispatch_time_features_dask` lives in `replaylab.projection.distributed` (it
needs dask, an optional dependency) and is imported lazily from here.
"""

from replaylab.projection.config import ProjectionConfig, SplitConfig
from replaylab.projection.features import (
    FEATURE_COLUMNS,
    KEY_COLUMNS,
    LABEL_COLUMNS,
    Projected,
    dispatch_time_features,
    feature_columns,
)
from replaylab.projection.leakage import LeakageError, check_no_label_leakage
from replaylab.projection.splits import SPLITS, split_counts, time_ordered_splits
from replaylab.projection.version import (
    PROJECTION_CODE_VERSION,
    ledger_fingerprint,
    projection_version,
)

__all__ = [
    "FEATURE_COLUMNS", "KEY_COLUMNS", "LABEL_COLUMNS", "LeakageError", "PROJECTION_CODE_VERSION",
    "ProjectionConfig", "Projected", "SPLITS", "SplitConfig", "check_no_label_leakage",
    "dispatch_time_features", "dispatch_time_features_dask", "feature_columns",
    "ledger_fingerprint", "projection_version", "split_counts", "time_ordered_splits",
]


def __getattr__(name: str):  # lazy: keep dask out of `import replaylab.projection`
    if name == "dispatch_time_features_dask":
        from replaylab.projection.distributed import dispatch_time_features_dask

        return dispatch_time_features_dask
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
