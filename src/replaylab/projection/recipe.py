"""The one projection recipe: a ledger's fingerprint, version, features and splits.

`project(ledger, projection, split, compute=...)` is what `pipeline=project`,
`pipeline=demand` (training) and the re-scoring of an artifact on a ledger
(`replaylab.artifacts.rescore_demand.ledger_test_rows`) all call, so the three derive the same
rows, split and version from the same ledger and configs:

1. the ledger fingerprint (`version.ledger_fingerprint`; under `compute="dask"` the
   multiset scheme `version.ledger_fingerprint_dask`, no row hash on the driver);
2. the projection version, from the configs, `version.RUN_CODE_VERSION` and the
   fingerprint;
3. the dispatch-time features and labels (`features.dispatch_time_features`; on Dask
   `splits_dask.project_and_split_dask`, sessions whole in one partition);
4. the time-ordered, session-grouped, embargoed split of every row
   (`splits.time_ordered_splits`; on Dask the exact distributed boundaries, the same
   rule).

The two modes mean the same: the same features and the same split of every row (by
test, `tests/projection/test_projection_dask.py`); only the fingerprint's scheme differs (the
version follows its fingerprint).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from replaylab.projection.config import ProjectionConfig, SplitConfig
from replaylab.projection.features import dispatch_time_features
from replaylab.projection.splits import time_ordered_splits
from replaylab.projection.version import (
    RUN_CODE_VERSION,
    ledger_fingerprint,
    ledger_fingerprint_dask,
    projection_version,
)

COMPUTE = ("local", "dask")
SPLIT_COLUMN = "split"  # the split of each row, as features.parquet stores it
Step = Callable[[str], AbstractContextManager]


@dataclass(frozen=True)
class Projection:
    """A projected ledger.

    features: the projection frame (keys, features, labels), one row per valid ledger
    row; local: a pandas frame without the split, in the ledger's row order; dask: a
    persisted dask frame WITH the `split` column (the workers write it as is).
    splits: local: (n,) object array, train / calibration / test / embargo per row;
    dask: the split facts (`splits_dask.split_summary_dask`: rows and sessions per
    split, boundaries). fingerprint, version: the ledger's fingerprint (the scheme of
    the mode) and the projection version. timings: seconds per step (local:
    fingerprint, features, splits; dask: fingerprint, project).
    """

    features: Any
    splits: Any
    fingerprint: str
    version: str
    compute: str = "local"
    timings: dict[str, float] = field(default_factory=dict)

    def with_split_column(self) -> Any:
        """The features with the `split` column (what features.parquet holds)."""
        if self.compute == "dask":
            return self.features
        return self.features.assign(**{SPLIT_COLUMN: self.splits})


def project(ledger: Any, projection: ProjectionConfig | None = None,
            split: SplitConfig | None = None, *, compute: str = "local",
            step: Step | None = None,
            features_fn: Callable[[Any, ProjectionConfig], Any] | None = None) -> Projection:
    """Fingerprint, version, features and splits of the valid ledger rows `ledger`.

    ledger: a validated ledger-v1 frame (`validate_ledger(...).valid`), pandas for
    compute="local", dask for compute="dask" (`LedgerDataset.valid`). step(name): a
    context manager around each step ("fingerprint", "project": e.g. a
    `pipelines.stages.DaskStages`), timed either way. features_fn(ledger, projection):
    the local mode's features on a pandas ledger by another engine with the same output
    (`distributed.dispatch_time_features_dask` on a client; default
    `dispatch_time_features`).
    """
    if compute not in COMPUTE:
        raise ValueError(f"compute={compute!r}: one of {COMPUTE}")
    projection = projection or ProjectionConfig()
    split = split or SplitConfig()
    timings: dict[str, float] = {}
    timed = _timed(timings, step)
    with timed("fingerprint"):
        fingerprint = (ledger_fingerprint(ledger) if compute == "local"
                       else ledger_fingerprint_dask(ledger))
        version = projection_version(projection, fingerprint, RUN_CODE_VERSION, split)
    if compute == "dask":
        from replaylab.projection.splits_dask import project_and_split_dask

        with timed("project"):
            features, splits = project_and_split_dask(ledger, projection, split)
        return Projection(features, splits, fingerprint, version, compute, timings)
    with timed("features"):
        features = (features_fn or dispatch_time_features)(ledger, projection)
    with timed("splits"):
        splits = time_ordered_splits(features, split).to_numpy(dtype=object)
    return Projection(features, splits, fingerprint, version, compute, timings)


def _timed(timings: dict[str, float], step: Step | None) -> Callable[[str], Any]:
    @contextmanager
    def timed(name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        if step is None:
            yield
        else:
            with step(name):
                yield
        timings[name] = time.perf_counter() - t0

    return timed

