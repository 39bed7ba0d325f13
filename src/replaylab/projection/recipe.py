"""The one projection recipe: a ledger's fingerprint, version, features and splits.

`project(ledger, projection, split)` (a pandas ledger) and `project_on(engine, valid,
projection, split)` (the valid rows as an engine's partitions, `replaylab.compute`) are
what `pipeline=project`, `pipeline=demand` (training) and the re-scoring of an artifact
on a ledger (`replaylab.artifacts.rescore_demand.ledger_test_rows`) call, so they derive
the same rows, split and version from the same ledger and configs:

1. the ledger fingerprint (`compute.ops.ledger_fingerprint`: one digest for every engine
   and partitioning);
2. the projection version, from the configs, `version.RUN_CODE_VERSION` and the
   fingerprint;
3. the dispatch-time features and labels (`features.dispatch_time_features`; on an
   engine per session-whole partition, `partitioned.project_and_split`);
4. the time-ordered, session-grouped, embargoed split of every row
   (`splits.time_ordered_splits`; on an engine the exact boundaries by selection, the
   same rule).

Either way: the same features, the same split of every row, the same fingerprint and
version (by test, `tests/projection/test_projection_engines.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from replaylab.compute import ops
from replaylab.projection.config import ProjectionConfig, SplitConfig
from replaylab.projection.features import dispatch_time_features
from replaylab.projection.partitioned import SPLIT_COLUMN, project_and_split
from replaylab.projection.splits import time_ordered_splits
from replaylab.projection.version import (
    RUN_CODE_VERSION,
    ledger_fingerprint,
    projection_version,
)

COMPUTE = ("local", "dask")
Step = Callable[[str], AbstractContextManager]


@dataclass(frozen=True)
class Projection:
    """A projected ledger.

    features: the projection frame (keys, features, labels), one row per valid ledger
    row; `project`: a pandas frame without the split, in the ledger's row order;
    `project_on`: the engine's Frame WITH the `split` column, partitioned by session
    (persisted). splits: `project`: (n,) object array, train / calibration / test /
    embargo per row; `project_on`: the split facts (`partitioned.split_facts`: rows and
    sessions per split, boundaries). fingerprint, version: the ledger's fingerprint and
    the projection version. compute: "local" (`project`) or the engine's kind.
    timings: seconds per step (`project`: fingerprint, features, splits; `project_on`:
    fingerprint, project).
    """

    features: Any
    splits: Any
    fingerprint: str
    version: str
    compute: str = "local"
    timings: dict[str, float] = field(default_factory=dict)

    def with_split_column(self) -> Any:
        """The features with the `split` column (what features.parquet holds)."""
        if isinstance(self.splits, dict):  # `project_on`: the split is a column already
            return self.features
        return self.features.assign(**{SPLIT_COLUMN: self.splits})


def project(ledger: Any, projection: ProjectionConfig | None = None,
            split: SplitConfig | None = None, *, compute: str = "local",
            step: Step | None = None,
            features_fn: Callable[[Any, ProjectionConfig], Any] | None = None) -> Projection:
    """Fingerprint, version, features and splits of the valid ledger rows `ledger`.

    ledger: a validated ledger-v1 pandas frame (`validate_ledger(...).valid`); a dask
    frame with compute="dask" is `project_on(DaskEngine(), ...)` (the current client).
    step(name): a context manager around each step ("fingerprint", "features", "splits"),
    timed either way. features_fn(ledger, projection): the features by another function
    with the same output (default `dispatch_time_features`).
    """
    if compute not in COMPUTE:
        raise ValueError(f"compute={compute!r}: one of {COMPUTE}")
    if compute == "dask":
        from replaylab.compute import DaskEngine

        return project_on(DaskEngine(), ledger, projection, split, step=step)
    projection = projection or ProjectionConfig()
    split = split or SplitConfig()
    timings: dict[str, float] = {}
    timed = _timed(timings, step)
    with timed("fingerprint"):
        fingerprint = ledger_fingerprint(ledger)
        version = projection_version(projection, fingerprint, RUN_CODE_VERSION, split)
    with timed("features"):
        features = (features_fn or dispatch_time_features)(ledger, projection)
    with timed("splits"):
        splits = time_ordered_splits(features, split).to_numpy(dtype=object)
    return Projection(features, splits, fingerprint, version, compute, timings)


def project_on(engine: Any, valid: Any, projection: ProjectionConfig | None = None,
               split: SplitConfig | None = None, *, step: Step | None = None) -> Projection:
    """`project` over an engine's partitions (`replaylab.compute`): the same features,
    split, fingerprint and version on either engine and any partitioning.

    valid: the valid ledger rows as `engine`'s Frame (`engine.read_ledger(spec).valid`).
    step(name): a context manager around "fingerprint" and "project" (e.g. the engine's
    `stages`). Returns a Projection whose features carry the `split` column (persisted,
    partitioned by session) and whose splits are the facts {boundaries, rows, sessions}.
    """
    projection = projection or ProjectionConfig()
    split = split or SplitConfig()
    timings: dict[str, float] = {}
    timed = _timed(timings, step)
    with timed("fingerprint"):
        fingerprint = ops.ledger_fingerprint(engine, valid)
        version = projection_version(projection, fingerprint, RUN_CODE_VERSION, split)
    with timed("project"):
        features, facts = project_and_split(engine, valid, projection, split)
    return Projection(features, facts, fingerprint, version, engine.kind, timings)


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

