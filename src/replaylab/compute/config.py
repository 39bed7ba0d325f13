"""`compute`: WHERE the partitions of a pipeline are processed (its one meaning).

`kind="local"`: in this process, the ledger as one (or a few) pandas partitions;
`kind="dask"`: on a Dask cluster, the scheduler at `address`, or a LocalCluster of
`n_workers` processes started for the run. Every pipeline honours it the same way
(`replaylab.compute.engine(cfg)`), and its summary records which engine ran
(`summary["compute"] = engine.facts()`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

KINDS = ("local", "dask")
ROWS_PER_PARTITION = 250_000  # rows per partition when a frame in memory is partitioned


@dataclass(frozen=True)
class ComputeConfig:
    """conf/compute/{local,dask}.yaml (a registered schema: a key not here fails at compose).

    kind: "local" | "dask". address: the scheduler (tcp://host:8786); None starts a
    LocalCluster of `n_workers` processes x `threads_per_worker` threads.
    rows_per_partition: rows per partition when a frame held in memory (the synthetic
    ledger) is partitioned for the cluster; a ledger dataset is read in its own blocks.
    """

    kind: Literal["local", "dask"] = "local"
    address: str | None = None
    n_workers: int = 2
    threads_per_worker: int = 1
    rows_per_partition: int = ROWS_PER_PARTITION

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"compute.kind={self.kind!r}; choose local or dask")
        for name in ("n_workers", "threads_per_worker", "rows_per_partition"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"compute.{name}={value!r}: must be an integer >= 1")
        if self.address is not None and not isinstance(self.address, str):
            raise ValueError(f"compute.address={self.address!r}: a scheduler address string")
