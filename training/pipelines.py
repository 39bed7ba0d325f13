"""Glue between the Hydra config and the library pipelines (typed configs in, summary out)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from replaylab.config import ConfigError, from_mapping


def _plain(node: Any) -> dict:
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


def _ledger_input(cfg: DictConfig):
    """The typed ledger input of `cfg.data` (a file, or the seeded synthetic ledger)."""
    from replaylab.pipelines.project import LedgerInput
    from replaylab.sources.synthetic import SyntheticLedgerConfig

    data = _plain(cfg.data)
    generator = dict(data["synthetic"])
    defect_rate = generator.pop("defect_rate")
    synthetic = from_mapping(SyntheticLedgerConfig, generator, "data.synthetic")
    return from_mapping(LedgerInput, {"path": data["ledger"], "synthetic": synthetic,
                                      "defect_rate": defect_rate, "seed": cfg.seed}, "data")


def project(cfg: DictConfig, run_dir: Path) -> dict:
    from replaylab.pipelines.project import load_ledger, project_ledger
    from replaylab.projection import ProjectionConfig, SplitConfig

    data = _plain(cfg.data)
    inp = _ledger_input(cfg)
    projection = from_mapping(ProjectionConfig, _plain(cfg.projection), "projection")
    split = from_mapping(SplitConfig, _plain(cfg.split), "split")
    loaded = load_ledger(inp)
    if cfg.compute.kind == "local":
        return project_ledger(loaded, projection, split, run_dir, write_ledger=data["write_ledger"])
    if cfg.compute.kind != "dask":
        raise ConfigError(f"compute.kind={cfg.compute.kind!r}; choose local or dask")
    from replaylab.projection.distributed import dispatch_time_features_dask

    with dask_client(cfg.compute) as client:
        def features_fn(ledger, projection_cfg):
            return dispatch_time_features_dask(ledger, projection_cfg, client=client)

        summary = project_ledger(loaded, projection, split, run_dir, features_fn=features_fn,
                                 write_ledger=data["write_ledger"])
    summary["compute"] = {"kind": "dask", "address": cfg.compute.address,
                          "n_workers": cfg.compute.n_workers}
    return summary


def demand(cfg: DictConfig, run_dir: Path) -> dict:
    """pipeline=demand: baselines, quantile LightGBM, conformal calibration, test scores."""
    from replaylab.demand import DemandConfig
    from replaylab.demand.hpo import HPOConfig
    from replaylab.pipelines.demand import train_demand
    from replaylab.pipelines.project import load_ledger
    from replaylab.projection import ProjectionConfig, SplitConfig

    if cfg.compute.kind not in ("local", "dask"):
        raise ConfigError(f"compute.kind={cfg.compute.kind!r}; choose local or dask")
    inp = _ledger_input(cfg)
    projection = from_mapping(ProjectionConfig, _plain(cfg.projection), "projection")
    split = from_mapping(SplitConfig, _plain(cfg.split), "split")
    demand_values = _plain(cfg.demand)
    hpo = from_mapping(HPOConfig, demand_values.pop("hpo", None), "demand.hpo")
    demand_cfg = from_mapping(DemandConfig, demand_values, "demand")
    loaded = load_ledger(inp)
    kwargs = {"hpo": hpo, "on_trial": _nested_trial_logger(cfg),
              "write_ledger": bool(cfg.data.write_ledger)}
    if cfg.compute.kind == "local":
        summary, run = train_demand(loaded, projection, split, demand_cfg, run_dir, **kwargs)
    else:
        with dask_client(cfg.compute) as client:
            summary, run = train_demand(loaded, projection, split, demand_cfg, run_dir,
                                        client=client, **kwargs)
        summary["compute"] = {"kind": "dask", "address": cfg.compute.address,
                              "n_workers": cfg.compute.n_workers}
    return _save_and_export(cfg, run, summary, run_dir)


def _save_and_export(cfg: DictConfig, run, summary: dict, run_dir: Path) -> dict:
    """Keep the fitted run (re-export) and export the artifact (docs/artifacts.md)."""
    from export.glue import active_run_id, export_run, save_run_state

    summary["artifacts"]["demand_run"] = str(save_run_state(run, run_dir))
    if cfg.export.enabled:
        section = export_run(run, summary, run_dir / "artifacts" / "demand", cfg.export,
                             active_run_id())
        summary["artifacts"]["demand"] = section["path"]
        summary["export"] = section
    return summary


def _nested_trial_logger(cfg: DictConfig):
    """Each finished Optuna trial as a nested MLflow run under the open run (None: no MLflow)."""
    if not cfg.tracking.enabled:
        return None
    import mlflow

    def on_trial(number: int, params: dict, value: float) -> None:
        with mlflow.start_run(run_name=f"hpo-trial-{number:03d}", nested=True):
            mlflow.log_params(params)
            mlflow.log_metric("validation_mean_pinball", value)
            mlflow.set_tag("optuna_trial", number)

    return on_trial


def import_source(cfg: DictConfig, run_dir: Path) -> dict:
    from replaylab.pipelines.ingest import import_to_contract

    if cfg.get("source") is None:
        raise ConfigError("pipeline=import needs source=<name> (see conf/source/)")
    if not cfg.out:
        raise ConfigError("pipeline=import needs out=<path>.parquet|.jsonl|.csv")
    src = cfg.source
    return import_to_contract(src.name, src.path, _plain(src.options), Path(cfg.out), run_dir)
