"""MLflow logging for the entry points (the library never calls MLflow).

A run carries: params (the flattened resolved config), metrics (numeric leaves
of summary.json), the resolved config as YAML, summary.json, and every report
file the pipeline wrote; a readable name (`demand seed=0`), a `go` tag and the
verdict line the console ends with (`replaylab.apps.verdicts`).

A tracking fault costs seconds, never the run's work (docs/howto/mlflow.md):
- before anything runs, `preflight` checks the store answers (an HTTP server:
  its /health within `tracking.preflight_timeout_s`; SQLite: its folder exists)
  and a dead store is one line and exit 2;
- MLflow's HTTP client retries `tracking.http_retries` times with a
  `tracking.http_timeout_s` timeout (its defaults, 7 retries and 120 s, turn one
  lost server into minutes of retries);
- a store lost after the job ran leaves the local outputs complete: summary.json
  says `mlflow.status: not logged`, the run is marked FAILED when the store can
  still be told, and one line gives the command that logs everything again
  (`python -m export register run_dir=DIR`, `replaylab.apps.export.relog_run`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from omegaconf import DictConfig, OmegaConf

_MAX_PARAM_LEN = 6000  # MLflow's limit on a param value


class TrackingUnavailable(Exception):
    """The tracking store cannot be reached (an input error: one line, exit 2)."""


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


# ---------------------------------------------------------------- the store
def tracking_errors() -> tuple[type[BaseException], ...]:
    """What a lost or refusing store raises through MLflow's client."""
    import requests
    from mlflow.exceptions import MlflowException

    return (MlflowException, requests.RequestException, OSError)


def short_reason(e: BaseException) -> str:
    """A one-line reason out of a (chained, multi-line) client error."""
    text = f"{type(e).__name__}: {e}"
    for needle, say in (("Connection refused", "connection refused"),
                        ("Max retries exceeded", "no answer"),
                        ("timed out", "timed out"), ("Name or service not known", "unknown host")):
        if needle in text:
            return say
    return text.splitlines()[0][:200]


def configure_client(cfg: DictConfig) -> None:
    """MLflow's HTTP retries and timeout from `cfg.tracking` (set before any call)."""
    t = cfg.tracking
    # urllib3 logs every retry as a WARNING with the whole chained error: the one line
    # this module prints says it instead
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(int(t.get("http_retries", 2)))
    os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] = "1"
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(int(t.get("http_timeout_s", 10)))


def preflight(cfg: DictConfig) -> None:
    """TrackingUnavailable (one line, naming the URI) when the store cannot answer."""
    uri = str(cfg.tracking.uri or "")
    if not uri:
        raise TrackingUnavailable("tracking.enabled=true needs tracking.uri (or "
                                  "MLFLOW_TRACKING_URI); or run with tracking=off")
    scheme = urlparse(uri).scheme
    if scheme in ("http", "https"):
        import requests

        timeout = float(cfg.tracking.get("preflight_timeout_s", 5))
        try:
            requests.get(uri.rstrip("/") + "/health", timeout=timeout)
        except requests.RequestException as e:
            raise TrackingUnavailable(
                f"tracking server {uri} did not answer ({short_reason(e)} within {timeout:g} s): "
                "start it, point tracking.uri (or MLFLOW_TRACKING_URI) at one, or run with "
                "tracking=off") from None
    elif scheme == "sqlite":
        path = Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None
        if path is not None and not path.parent.is_dir():
            raise TrackingUnavailable(f"tracking store {uri}: folder {path.parent} does not "
                                      "exist")


def recover_command(run_dir: Path, cfg: DictConfig) -> str:
    """The one command that logs a finished run folder again (metrics, reports, artifacts,
    registration)."""
    return f"python -m export register run_dir={run_dir} tracking.uri={cfg.tracking.uri}"


def end_run_quietly(status: str) -> str | None:
    """End the open run with `status`; the error's one-line reason when the store refused
    (the run is off MLflow's stack either way, so nothing retries at exit)."""
    import mlflow

    if mlflow.active_run() is None:
        return None
    try:
        mlflow.end_run(status)
    except tracking_errors() as e:
        return short_reason(e)
    return None


# ---------------------------------------------------------------- names and tags
def run_name(cfg: DictConfig) -> str:
    """A readable run name: `demand seed=1`, `router seed=0 ledger=receipts.parquet`,
    `evaluate overload`, `promote replaylab-router v1->champion` (the decision is added
    when known, `replaylab.apps.verdicts.run_tags`)."""
    if cfg.tracking.get("run_name"):
        return str(cfg.tracking.run_name)
    pipeline = str(cfg.get("pipeline", ""))
    if pipeline == "export":
        action = str(cfg.get("action") or "export")
        if action == "promote":
            return f"promote {cfg.name} v{cfg.version}->{cfg.alias}"
        if action in ("fetch", "compare"):
            target = f"v{cfg.version}" if cfg.get("version") else f"@{cfg.alias}"
            return f"{action} {cfg.name} {target}"
        return f"{action} {Path(str(cfg.get('run_dir') or cfg.get('run_id') or '')).name}".strip()
    if cfg.get("experiment") is not None and "name" in cfg.experiment:
        return f"evaluate {cfg.experiment.name}"
    name = f"{pipeline} seed={cfg.get('seed', 0)}"
    data = cfg.get("data")
    if data is not None:
        for key in ("ledger", "outcomes", "aggregates"):
            if data.get(key):
                name += f" {key}={Path(str(data[key])).name}"
                break
    return name


REGISTRY_ACTIONS = ("promote", "fetch", "compare")
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"  # read by the MLflow 3 UI
CLASSIC_KIND = "custom_model_development"


def experiment_name(cfg: DictConfig) -> str:
    """The experiment a run logs to: `tracking.experiment`, except the registry's actions
    (promote, fetch, compare), which go to `export.registry.experiment`
    (`replaylab-registry`) so the training experiment's runs list holds training runs.
    `register` stays with the training runs: it logs a finished run again."""
    if str(cfg.get("pipeline", "")) == "export" and cfg.get("action") in REGISTRY_ACTIONS:
        reg = (cfg.get("export") or {}).get("registry") or {}
        return str(reg.get("experiment") or "replaylab-registry")
    return str(cfg.tracking.experiment)


def start_run(cfg: DictConfig, run_dir: Path) -> Any:
    """Open the MLflow run per `cfg.tracking` with its params and tags; None when off."""
    if not cfg.tracking.enabled:
        return None
    import mlflow

    uri = cfg.tracking.uri
    try:
        mlflow.set_tracking_uri(uri)
        exp = mlflow.set_experiment(experiment_name(cfg))
        if (exp.tags or {}).get(EXPERIMENT_KIND_TAG) is None:
            # MLflow 3's UI opens an experiment of no recorded kind in its GenAI view (the
            # traces tab): these are model-development runs, shown on the classic run page
            mlflow.set_experiment_tag(EXPERIMENT_KIND_TAG, CLASSIC_KIND)
        run = mlflow.start_run(run_name=run_name(cfg))
        params = {k: str(v)[:_MAX_PARAM_LEN]
                  for k, v in flatten(OmegaConf.to_container(cfg, resolve=True)).items()}
        mlflow.log_params(params)
        mlflow.set_tags({"pipeline": str(cfg.pipeline), "run_dir": str(run_dir)})
    except tracking_errors() as e:
        end_run_quietly("FAILED")
        raise TrackingUnavailable(f"tracking store {uri}: cannot open a run "
                                  f"({short_reason(e)})") from None
    return run


# ---------------------------------------------------------------- what a run logs
def log_outcome(run: Any, summary: dict, run_dir: Path, cfg: DictConfig) -> dict[str, dict]:
    """Log metrics, the resolved config, summary.json, report files and the artifact folders
    of every kind to the open run; kind -> what was logged (for the registry hook)."""
    from replaylab.apps.registry import log_run_artifacts

    if run is None:
        return {}
    import mlflow

    mlflow.log_metrics(numeric_metrics(summary))
    relogged = (summary.get("relogged") or {}).get("config")  # the run's own config is there
    mlflow.log_text(OmegaConf.to_yaml(cfg, resolve=True),
                    "config/export.yaml" if relogged else "config/resolved.yaml")
    log_files(summary)
    # the deployable artifacts, demand and router alike (one route: verified, large files
    # stored once; replaylab.apps.registry.blobs)
    return log_run_artifacts(run, summary, cfg)


def log_files(summary: dict) -> None:
    """summary.json, the report files and the plain files a summary names, to the open run
    (the artifact folders go by `log_outcome`)."""
    import mlflow

    mlflow.log_text(json.dumps(summary, indent=2, default=str), "summary.json")
    log_reports(summary)
    arts = summary.get("artifacts", {})
    if arts.get("demand_run") and Path(arts["demand_run"]).is_dir():  # for python -m export
        mlflow.log_artifacts(arts["demand_run"], artifact_path="demand_run")  # plain files
    q = summary.get("artifacts", {}).get("quarantine")
    if q and Path(q).is_file():
        mlflow.log_artifact(q, artifact_path="quarantine")


def log_reports(summary: dict) -> int:
    """The report files a summary names, under `reports/` of the open run; how many."""
    import mlflow

    n = 0
    for rel in (summary.get("reports") or {}).values():
        path = Path(str(rel))
        if path.is_file():
            mlflow.log_artifact(str(path), artifact_path="reports")
            n += 1
    return n


def write_summary(path: Path, summary: dict) -> None:
    """Whole or not at all: written beside, then renamed over `path` (a run killed while
    writing leaves no half summary.json)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(summary, indent=2, default=str))
    tmp.replace(path)


def record(run: Any, summary: dict, run_dir: Path, cfg: DictConfig) -> str | None:
    """Log the finished run and register its artifacts; None, or the one-line reason the
    store did not take it (the local outputs are complete either way)."""
    from replaylab.apps.registry import register_outcome
    from replaylab.apps.verdicts import run_tags, verdict_line, verdict_word

    if run is None:
        return None
    import mlflow

    try:
        logged = log_outcome(run, summary, run_dir, cfg)
        # export.register (docs/howto/mlflow.md)
        registered = register_outcome(run, summary, cfg, logged=logged)
        if registered:
            summary["registry"] = registered
            summary["verdict"] = verdict_line(summary)  # says what it registered
            write_summary(run_dir / "summary.json", summary)
            mlflow.log_text(json.dumps(summary, indent=2, default=str), "summary.json")
        tags = run_tags(summary)
        word = verdict_word(summary)
        if word is not None and "mlflow.runName" not in tags:  # `GO demand seed=0`
            tags["mlflow.runName"] = f"{word} {run.info.run_name or run_name(cfg)}"
        mlflow.set_tags(tags)
    except tracking_errors() as e:
        return short_reason(e)
    return None


def run_recorded(cfg: DictConfig, job: Callable[[DictConfig, Path], dict],
                 input_errors: tuple[type[BaseException], ...],
                 precheck: Callable[[DictConfig], None] | None = None) -> Path:
    """The body of every entry point: check the request and the store, run `job` inside the
    MLflow run, write summary.json, stamp the reports, log, end with the verdict line.

    An exception of `input_errors` (a bad input or config, not a bug), a refused override
    or an unreachable store becomes one `error: ...` line on stderr and exit code 2,
    before any MLflow run is opened when it can be known then (`precheck`); anything
    else keeps its traceback (and the run is marked FAILED).
    """
    from hydra.core.hydra_config import HydraConfig

    from replaylab.apps.schemas import refuse_added_keys
    from replaylab.apps.verdicts import stamp_reports, verdict_line

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    started = time.perf_counter()
    run = None
    try:
        refuse_added_keys(list(hydra_cfg.overrides.task))
        if cfg.tracking.enabled:
            configure_client(cfg)
            preflight(cfg)
        if precheck is not None:
            precheck(cfg)
        run = start_run(cfg, run_dir)
        try:
            summary = job(cfg, run_dir)
        except BaseException:
            end_run_quietly("FAILED")
            raise
        summary["wall_seconds"] = round(time.perf_counter() - started, 3)
        if run is not None:
            summary["mlflow"] = {"run_id": run.info.run_id, "tracking_uri": cfg.tracking.uri,
                                 "experiment": experiment_name(cfg),
                                 "experiment_id": run.info.experiment_id}
        summary["verdict"] = verdict_line(summary)
        stamp_reports(summary)
        path = run_dir / "summary.json"
        write_summary(path, summary)
        lost = record(run, summary, run_dir, cfg)
        if lost is not None:
            failed = end_run_quietly("FAILED")
            summary["mlflow"] = {**summary["mlflow"], "status": "not logged", "error": lost,
                                 "marked_failed": failed is None,
                                 "recover": recover_command(run_dir, cfg)}
            write_summary(path, summary)
            print(f"mlflow: not logged ({cfg.tracking.uri}: {lost}); the outputs in {run_dir} "
                  f"are complete; log them with: {recover_command(run_dir, cfg)}",
                  file=sys.stderr)
        else:
            end_run_quietly("FINISHED")
    except (*input_errors, TrackingUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    logging.getLogger("replaylab").info("wrote %s", path)
    print(summary["verdict"], flush=True)  # the console's last line
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
    """Each finished Optuna trial as a nested MLflow run under the open run (None: no MLflow).
    A store lost during the search stops the trial logging (one warning), not the search."""
    if not cfg.tracking.enabled:
        return None
    import mlflow

    lost: list[str] = []

    def on_trial(number: int, params: dict, value: float) -> None:
        if lost:
            return
        try:
            with mlflow.start_run(run_name=f"hpo-trial-{number:03d}", nested=True):
                mlflow.log_params(params)
                mlflow.log_metric("validation_mean_pinball", value)
                mlflow.set_tag("optuna_trial", number)
        except tracking_errors() as e:
            lost.append(short_reason(e))
            logging.getLogger(__name__).warning(
                "mlflow: trial logging stopped (%s: %s); the search goes on",
                cfg.tracking.uri, lost[0])

    return on_trial
