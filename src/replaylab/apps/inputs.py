"""From the composed Hydra config to the library's typed inputs, shared by the pipelines."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from replaylab.config import ConfigError, from_mapping


def plain(node: Any) -> dict:
    """A config node as a plain dict with interpolations resolved ({} for None)."""
    return OmegaConf.to_container(node, resolve=True) if node is not None else {}


def dashboard_address() -> str | None:
    """Where a LocalCluster's dashboard listens: a free port on loopback, or None (and one
    line saying so) when bokeh, which the dashboard needs, is not installed."""
    import logging
    from importlib.util import find_spec

    if find_spec("bokeh") is None:
        logging.getLogger("replaylab").info(
            "dask: no dashboard (bokeh is not installed: pip install 'bokeh>=3.1')")
        return None
    return "127.0.0.1:0"


def log_dashboard(client: Any) -> None:
    """One line: the Dask dashboard's link, or that there is none."""
    import logging

    log = logging.getLogger("replaylab")
    try:
        link = client.dashboard_link if (client.scheduler_info().get("services") or {}).get(
            "dashboard") else None
    except Exception:  # a link the client cannot format: not worth stopping a run
        link = None
    if link:
        log.info("dask: dashboard %s", link)
    else:
        log.info("dask: no dashboard (the scheduler serves none)")


@contextmanager
def dask_client(compute: DictConfig):
    """A Dask client for compute=dask: the given scheduler, or a LocalCluster of processes
    (its dashboard on a free loopback port when bokeh is installed); logs the dashboard link."""
    import logging

    from dask.distributed import Client, LocalCluster

    log = logging.getLogger("replaylab")
    if compute.address:
        client = Client(compute.address)
        log.info("dask: scheduler %s, %d workers", compute.address,
                 len(client.scheduler_info().get("workers", {})))
        log_dashboard(client)
        try:
            yield client
        finally:
            client.close()
        return
    address = dashboard_address()
    with LocalCluster(n_workers=compute.n_workers, threads_per_worker=compute.threads_per_worker,
                      processes=True, dashboard_address=address) as cluster, \
            Client(cluster) as client:
        if address is not None:
            log_dashboard(client)
        yield client


def compute_facts(compute: DictConfig, client: Any) -> dict:
    """What summary.json says of the cluster a run used (workers as the scheduler saw them)."""
    import resource

    info = client.scheduler_info()
    # this process alone (the workers are other processes): the driver's peak memory so far
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"kind": "dask", "driver_peak_rss_mb": round(peak_mb, 1), "address": compute.address or "LocalCluster",
            "scheduler": info.get("address"), "n_workers": len(info.get("workers", {})),
            "dashboard": (info.get("services") or {}).get("dashboard")}


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


def default_outcomes() -> Path:
    """The shipped RouteLLM GSM8K outcomes (Apache-2.0), a package resource of replaylab.data."""
    from importlib.resources import files

    return Path(str(files("replaylab.data") / "routellm_gsm8k" / "gsm8k_responses.csv"))


def load_outcomes(cfg: DictConfig) -> tuple[Any, str]:
    """(outcomes-v1 frame, where it came from)."""
    from replaylab.contracts import read_outcomes
    from replaylab.sources.registry import SOURCES, import_source

    path, source = cfg.data.get("outcomes"), cfg.data.get("outcomes_source")
    if path is None and source is None:
        path, source = default_outcomes(), "routellm_gsm8k"
    if source is not None:
        if source not in SOURCES or SOURCES[source].contract != "outcomes":
            names = sorted(k for k, v in SOURCES.items() if v.contract == "outcomes")
            raise ConfigError(f"data.outcomes_source={source!r}: choose one of {names}")
        # a path not given or not there: one line naming the file and where to download it
        _, frame = import_source(source, None if path is None else str(path), "data.outcomes")
        return frame, f"{source}:{path}"
    if not Path(path).is_file():
        raise FileNotFoundError(f"data.outcomes={path}: no such file")
    result = read_outcomes(path)
    return result.valid, str(path)
