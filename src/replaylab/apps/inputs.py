"""From the composed Hydra config to the library's typed inputs, shared by the pipelines."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

from omegaconf import DictConfig, OmegaConf

from replaylab.config import from_mapping


def plain(node: Any) -> dict:
    """A config node as a plain dict with interpolations resolved ({} for None)."""
    return OmegaConf.to_container(node, resolve=True) if node is not None else {}


@contextmanager
def dask_client(compute: DictConfig):
    """A Dask client for compute=dask: the given scheduler, or a LocalCluster of processes."""
    from dask.distributed import Client, LocalCluster

    if compute.address:
        client = Client(compute.address)
        try:
            yield client
        finally:
            client.close()
        return
    with LocalCluster(n_workers=compute.n_workers, threads_per_worker=compute.threads_per_worker,
                      processes=True, dashboard_address=None) as cluster, Client(cluster) as client:
        yield client


def ledger_input(cfg: DictConfig):
    """The typed ledger input of `cfg.data` (a file, or the seeded synthetic ledger)."""
    from replaylab.pipelines.project import LedgerInput
    from replaylab.sources.synthetic import SyntheticLedgerConfig

    data = plain(cfg.data)
    generator = dict(data["synthetic"])
    defect_rate = generator.pop("defect_rate")
    synthetic = from_mapping(SyntheticLedgerConfig, generator, "data.synthetic")
    return from_mapping(LedgerInput, {"path": data["ledger"], "synthetic": synthetic,
                                      "defect_rate": defect_rate, "seed": cfg.seed}, "data")
