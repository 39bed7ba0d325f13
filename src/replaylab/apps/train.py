"""`python -m training pipeline=...`: one library call per pipeline (typed configs in, summary out)."""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from replaylab.apps.demand_runs import export_run, save_run_state
from replaylab.apps.inputs import ledger_input, plain
from replaylab.apps.recording import active_run_id, nested_trial_logger
from replaylab.config import ConfigError, from_mapping
from replaylab.contracts.errors import InputError

log = logging.getLogger("replaylab")


def project(cfg: DictConfig, run_dir: Path) -> dict:
    """pipeline=project: one pipeline on the engine `compute` names (where the partitions
    are processed); a ledger dataset is read by the engine, the synthetic one made here."""
    from replaylab.apps.inputs import compute_engine
    from replaylab.pipelines.project import load_ledger, project_ledger
    from replaylab.projection import ProjectionConfig, SplitConfig

    data = plain(cfg.data)
    inp = ledger_input(cfg)
    projection = from_mapping(ProjectionConfig, plain(cfg.projection), "projection")
    split = from_mapping(SplitConfig, plain(cfg.split), "split")
    with compute_engine(cfg) as engine:
        source = str(inp.path) if inp.path else load_ledger(inp)
        return project_ledger(source, projection, split, run_dir, engine=engine,
                              write_ledger=data["write_ledger"], seed=int(cfg.seed),
                              progress=log.info)


def demand(cfg: DictConfig, run_dir: Path) -> dict:
    """pipeline=demand: baselines, quantile LightGBM, conformal calibration, test scores, by
    the one pipeline over the engine's partitions
    (`pipelines.demand_partitions.train_demand_partitions`, HPO and the censoring choice
    included): compute=local in this process, compute=dask on the cluster, where a
    `data.ledger` dataset is read by the workers and never reaches the driver; the synthetic
    ledger is partitioned from memory (and written beside the run: data.write_ledger)."""
    from replaylab.apps.inputs import compute_config, compute_engine
    from replaylab.demand import DemandConfig
    from replaylab.demand.hpo import HPOConfig
    from replaylab.pipelines.demand import train_demand
    from replaylab.pipelines.demand_partitions import train_demand_partitions
    from replaylab.pipelines.project import load_ledger
    from replaylab.projection import ProjectionConfig, SplitConfig

    compute_config(cfg)  # a bad compute section is one line before anything is read
    inp = ledger_input(cfg)
    projection = from_mapping(ProjectionConfig, plain(cfg.projection), "projection")
    split = from_mapping(SplitConfig, plain(cfg.split), "split")
    demand_values = plain(cfg.demand)
    hpo = from_mapping(HPOConfig, demand_values.pop("hpo", None), "demand.hpo")
    demand_cfg = from_mapping(DemandConfig, demand_values, "demand")
    opts = {"hpo": hpo, "on_trial": nested_trial_logger(cfg), "progress": log.info}
    with compute_engine(cfg) as engine:
        if inp.path:  # read by the engine (by the workers under Dask)
            summary, run = train_demand_partitions(engine, str(inp.path), demand_cfg,
                                                   projection, split, run_dir, **opts)
            summary["artifacts"] = {"ledger": str(inp.path), **summary["artifacts"]}
        else:  # the synthetic ledger, partitioned from memory
            summary, run = train_demand(load_ledger(inp), projection, split, demand_cfg,
                                        run_dir, write_ledger=bool(cfg.data.write_ledger),
                                        engine=engine, **opts)
        summary["compute"] = engine.facts()
    return _save_and_export(cfg, run, summary, run_dir)


def _save_and_export(cfg: DictConfig, run, summary: dict, run_dir: Path) -> dict:
    """Keep the fitted run (re-export) and export the artifact (docs/specs/artifacts.md)."""

    summary["artifacts"]["demand_run"] = str(save_run_state(run, run_dir))
    if cfg.export.enabled:
        section = export_run(run, summary, run_dir / "artifacts" / "demand", cfg.export,
                             active_run_id())
        summary["artifacts"]["demand"] = section["path"]
        summary["export"] = section
    return summary


def import_source(cfg: DictConfig, run_dir: Path) -> dict:
    from replaylab.pipelines.ingest import import_to_contract

    if cfg.get("source") is None:
        raise ConfigError("pipeline=import needs source=<name> (see conf/source/)")
    if not cfg.out:
        raise ConfigError("pipeline=import needs out=<path>.parquet|.jsonl|.csv")
    src = cfg.source
    options = plain(src.options)
    # source.uri / source.table / source.keep_prompt: the inputs and options of a source
    # that is not only a file (router_replay); null for the others
    extra = {k: src.get(k) for k in SOURCE_INPUT_KEYS if src.get(k) is not None}
    if extra and not source_takes_inputs(src.name):
        raise ConfigError(f"source={src.name} takes no {', '.join(f'source.{k}' for k in extra)}"
                          " (only source.path and source.options)")
    return import_to_contract(src.name, src.path, {**options, **extra}, Path(cfg.out), run_dir)


SOURCE_INPUT_KEYS = ("uri", "table", "keep_prompt")


def source_takes_inputs(name: str) -> bool:
    """Whether the importer `name` reads `source.uri`, `source.table`, `source.keep_prompt`."""
    from replaylab.sources.registry import SOURCES

    return name in SOURCES and SOURCES[name].chunks is not None


def synthesize(cfg: DictConfig, run_dir: Path) -> dict:
    """pipeline=synthesize out=DIR: data.synthetic.n_requests rows as Parquet chunk files,
    written in parallel where `compute` says (compute=dask: the cluster's workers, which
    keep glibc's malloc tuning; local: a process pool of synthesize.workers)."""
    from replaylab.apps.inputs import compute_config, compute_engine
    from replaylab.compute.malloc import glibc_malloc_defaults
    from replaylab.pipelines.synthesize import SynthesizeConfig, synthesize_ledger

    if not cfg.get("out"):
        raise ConfigError("pipeline=synthesize needs out=DIR (the folder the Parquet files go to)")
    if cfg.data.ledger is not None:
        raise ConfigError("pipeline=synthesize writes the synthetic ledger; leave data.ledger null")
    inp = ledger_input(cfg)
    options = from_mapping(SynthesizeConfig, plain(cfg.synthesize), "synthesize")
    with glibc_malloc_defaults(compute_config(cfg)), compute_engine(cfg) as engine:
        summary = synthesize_ledger(inp.synthetic, inp.seed, Path(cfg.out), options,
                                    inp.defect_rate, engine=engine)
        summary["compute"] = engine.facts()
    return summary


def run_pipeline(cfg: DictConfig, run_dir: Path) -> dict:
    """The job of `python -m training`: the pipeline `cfg.pipeline` names."""
    from replaylab.apps.forecast import forecast
    from replaylab.apps.router import router

    table = {"project": project, "import": import_source, "demand": demand,
             "forecast": forecast, "router": router, "synthesize": synthesize}
    if cfg.pipeline not in table:
        raise ConfigError(f"pipeline={cfg.pipeline!r} is unknown; choose one of {sorted(table)}")
    return table[cfg.pipeline](cfg, run_dir)


def precheck(cfg: DictConfig) -> None:
    """What can be refused before an MLflow run is opened: pipeline=import's file (not given,
    or not there: one line saying what it is and where to download it)."""
    from replaylab.sources.registry import SOURCES, source_file

    src = cfg.get("source")
    if cfg.get("pipeline") == "import" and src is not None and src.get("name") in SOURCES:
        source_file(src.name, src.get("path"))


def input_errors() -> tuple[type[BaseException], ...]:
    """A bad input or config (not a bug): one `error: ...` line and exit code 2. Every
    such error of the library is an `InputError` (a `StageFailed`, a Dask stage stopped
    by a lost worker, included); the others are a missing file, a missing optional
    dependency and a config that fails its schema."""
    from omegaconf.errors import ValidationError as OmegaConfValidationError

    return (InputError, FileNotFoundError, ImportError, OmegaConfValidationError)
