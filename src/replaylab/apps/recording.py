"""MLflow logging for the entry points (the library never calls MLflow).

A run carries: params (the flattened resolved config), metrics (numeric leaves
of summary.json), the resolved config as YAML, summary.json, and every report
file the pipeline wrote.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

_MAX_PARAM_LEN = 6000  # MLflow's limit on a param value


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists are kept as leaves."""
    out: dict[str, Any] = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}{k}." if prefix or k else ""))
        return out
    out[prefix.rstrip(".")] = tree
    return out


def numeric_metrics(summary: dict) -> dict[str, float]:
    """Numeric leaves of a summary as MLflow metrics (keys sanitized)."""
    metrics = {}
    for k, v in flatten(summary).items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            continue
        key = "".join(c if c.isalnum() or c in "_-./ " else "_" for c in k)
        metrics[key] = float(v)
    return metrics


@contextmanager
def mlflow_run(cfg: DictConfig, run_dir: Path) -> Iterator[Any]:
    """Open an MLflow run per `cfg.tracking`; yields the run (or None when disabled)."""
    if not cfg.tracking.enabled:
        yield None
        return
    import mlflow

    mlflow.set_tracking_uri(cfg.tracking.uri)
    mlflow.set_experiment(cfg.tracking.experiment)
    with mlflow.start_run(run_name=cfg.tracking.run_name) as run:
        params = {k: str(v)[:_MAX_PARAM_LEN]
                  for k, v in flatten(OmegaConf.to_container(cfg, resolve=True)).items()}
        mlflow.log_params(params)
        mlflow.set_tags({"pipeline": str(cfg.pipeline), "run_dir": str(run_dir)})
        yield run


def log_outcome(run: Any, summary: dict, run_dir: Path, cfg: DictConfig) -> None:
    """Log metrics, the resolved config, summary.json and report files to the open run."""
    if run is None:
        return
    import mlflow

    mlflow.log_metrics(numeric_metrics(summary))
    mlflow.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config/resolved.yaml")
    mlflow.log_text(json.dumps(summary, indent=2, default=str), "summary.json")
    for rel in summary.get("reports", {}).values():
        path = Path(rel)
        if path.is_file():
            mlflow.log_artifact(str(path), artifact_path="reports")
    arts = summary.get("artifacts", {})
    if arts.get("demand") and Path(arts["demand"]).is_dir():  # the deployable artifact
        mlflow.log_artifacts(arts["demand"], artifact_path="demand_artifact")
    if arts.get("demand_run") and Path(arts["demand_run"]).is_file():  # for python -m export
        mlflow.log_artifact(arts["demand_run"], artifact_path="demand_run")
    q = summary.get("artifacts", {}).get("quarantine")
    if q and Path(q).is_file():
        mlflow.log_artifact(q, artifact_path="quarantine")


def run_recorded(cfg: DictConfig, job: Callable[[DictConfig, Path], dict],
                 input_errors: tuple[type[BaseException], ...]) -> Path:
    """The body of every entry point: run `job` inside the MLflow run, write summary.json.

    An exception of `input_errors` (a bad input or config, not a bug) becomes one
    `error: ...` line on stderr and exit code 2; anything else keeps its traceback.
    """
    from hydra.core.hydra_config import HydraConfig

    from replaylab.apps.registry import register_outcome

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    started = time.perf_counter()
    try:
        with mlflow_run(cfg, run_dir) as run:
            summary = job(cfg, run_dir)
            summary["wall_seconds"] = round(time.perf_counter() - started, 3)
            if run is not None:
                summary["mlflow"] = {"run_id": run.info.run_id, "tracking_uri": cfg.tracking.uri,
                                     "experiment": cfg.tracking.experiment}
            path = run_dir / "summary.json"
            path.write_text(json.dumps(summary, indent=2, default=str))
            log_outcome(run, summary, run_dir, cfg)
            registered = register_outcome(run, summary, cfg)  # export.register (docs/mlflow.md)
            if registered:
                summary["registry"] = registered
                path.write_text(json.dumps(summary, indent=2, default=str))
                import mlflow

                mlflow.log_text(json.dumps(summary, indent=2, default=str), "summary.json")
    except input_errors as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    return path


def active_run_id() -> str | None:
    """The id of the open MLflow run (None: no run, or MLflow not installed)."""
    try:
        import mlflow
    except ImportError:
        return None
    run = mlflow.active_run()
    return run.info.run_id if run is not None else None


def nested_trial_logger(cfg: DictConfig):
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
