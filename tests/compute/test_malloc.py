"""`compute.malloc.glibc_malloc_defaults`: a LocalCluster started inside it spawns workers
without distributed's MALLOC_TRIM_THRESHOLD_ (glibc keeps its dynamic mmap threshold);
a local run or a remote scheduler leaves Dask's config as it was."""

from __future__ import annotations

import dask

from replaylab.compute import ComputeConfig
from replaylab.compute.malloc import glibc_malloc_defaults

KEY = "distributed.nanny.pre-spawn-environ"


def test_a_local_cluster_keeps_glibc_malloc_tuning():
    import distributed  # noqa: F401 (loads distributed's defaults into dask.config)

    assert "MALLOC_TRIM_THRESHOLD_" in dask.config.get(KEY)  # what distributed sets
    before = dict(dask.config.get(KEY))
    with glibc_malloc_defaults(ComputeConfig(kind="dask")):
        inside = dict(dask.config.get(KEY))
    assert "MALLOC_TRIM_THRESHOLD_" not in inside
    assert inside == {k: v for k, v in before.items() if k != "MALLOC_TRIM_THRESHOLD_"}
    assert dict(dask.config.get(KEY)) == before  # restored on exit
    for cfg in (ComputeConfig(), ComputeConfig(kind="dask", address="tcp://127.0.0.1:8786")):
        with glibc_malloc_defaults(cfg):
            assert dict(dask.config.get(KEY)) == before
