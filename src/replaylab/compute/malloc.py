"""Worker processes that keep glibc's malloc tuning (a LocalCluster started for a run).

distributed sets MALLOC_TRIM_THRESHOLD_=65536 on the workers it spawns (to hand freed
memory back to the OS); setting it turns off glibc's dynamic mmap threshold, so every
array of more than 128 KiB is a fresh mmap whose pages fault in again: a synthetic
ledger chunk costs ~50% more CPU (1.05 -> 1.55 CPU s per 500,000 rows measured,
`pipeline=synthesize`). Workers keep their peak memory instead (~1 GB per 500,000-row
chunk). Moved here from pipelines/synthesize.py: only this package imports Dask.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from replaylab.compute.config import ComputeConfig


@contextmanager
def glibc_malloc_defaults(cfg: ComputeConfig) -> Iterator[None]:
    """Dask config under which the workers of a LocalCluster that `compute.engine(cfg)`
    starts inside this block keep glibc's malloc tuning. Nothing to do (and no Dask
    import) when `cfg` runs locally or on the scheduler at `cfg.address`: workers started
    elsewhere keep their own environment."""
    if cfg.kind != "dask" or cfg.address:
        yield
        return
    import dask

    env = dict(dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {})
    env.pop("MALLOC_TRIM_THRESHOLD_", None)
    with dask.config.set({"distributed.nanny.pre-spawn-environ": env}):
        yield
