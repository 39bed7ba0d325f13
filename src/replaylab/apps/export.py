"""`python -m export [export|register|promote|fetch|compare] ...`: re-export a finished demand
run, or work the MLflow Model Registry (`replaylab.apps.registry`, docs/mlflow.md)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from omegaconf import DictConfig

from replaylab.apps.demand_runs import RUN_STATE, export_run, load_run_state
from replaylab.apps.recording import active_run_id
from replaylab.config import ConfigError


def fetch_run(cfg: DictConfig, run_id: str, into: Path) -> Path:
    """The demand_run/ and summary.json artifacts of MLflow run `run_id`, under `into`."""
    import mlflow

    mlflow.set_tracking_uri(cfg.tracking.uri)
    try:
        mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="demand_run",
                                            dst_path=str(into))
        mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="summary.json",
                                            dst_path=str(into / "demand_run"))
    except Exception as e:  # MlflowException, OSError: an unknown run or missing artifacts
        raise FileNotFoundError(f"run_id={run_id}: cannot fetch demand_run/ and summary.json "
                                f"from {cfg.tracking.uri}: {e}") from None
    return into / "demand_run"


def export_demand_run(cfg: DictConfig, run_dir: Path) -> dict:
    """The job of `python -m export`: the artifact of `cfg.run_dir` or `cfg.run_id`."""
    if bool(cfg.run_dir) == bool(cfg.run_id):
        raise ConfigError("give exactly one of run_dir=DIR or run_id=<mlflow run id>")
    with tempfile.TemporaryDirectory() as tmp:
        if cfg.run_dir:
            source = Path(cfg.run_dir)
            out = Path(cfg.out) if cfg.out else source / "artifacts" / "demand"
        else:
            source = fetch_run(cfg, str(cfg.run_id), Path(tmp))
            out = Path(cfg.out) if cfg.out else Path("outputs/export") / str(cfg.run_id) / "demand"
        summary_path = source / "summary.json"
        if not summary_path.is_file():
            raise FileNotFoundError(f"{summary_path}: not a finished run (no summary.json)")
        trained = json.loads(summary_path.read_text())
        if trained.get("pipeline") != "demand":
            raise ConfigError(f"{source} is a pipeline={trained.get('pipeline')!r} run; "
                              "only demand runs export a demand artifact")
        run = load_run_state(source / RUN_STATE)
        source_run_id = (trained.get("mlflow") or {}).get("run_id") or cfg.run_id
        section = export_run(run, trained, out, cfg.export, source_run_id)
    return {"pipeline": "export", "source": str(cfg.run_dir or cfg.run_id),
            "export": section, "artifacts": {"demand": section["path"]},
            "exported_in_run": active_run_id()}


def export_job(cfg: DictConfig, run_dir: Path) -> dict:
    """The job of `python -m export`: the one `cfg.action` names."""
    from replaylab.apps import registry

    table = {"export": export_demand_run, "register": registry.registered_artifacts,
             "promote": registry.promote, "fetch": registry.fetch, "compare": registry.compare}
    if cfg.action not in table:
        raise ConfigError(f"action={cfg.action!r} is unknown; choose one of {sorted(table)}")
    if cfg.action != "export" and not cfg.tracking.enabled:
        raise ConfigError(f"{cfg.action} needs MLflow: tracking.enabled=true and tracking.uri")
    return table[cfg.action](cfg, run_dir)


def exit_code(summary: dict) -> int:
    """0, or 3 when the promotion gate refused to move the alias (the refusal is recorded)."""
    return 3 if (summary.get("promotion") or {}).get("decision") == "refused" else 0


def input_errors() -> tuple[type[BaseException], ...]:
    """A bad input or config (not a bug): one `error: ...` line and exit code 2."""
    from omegaconf.errors import ValidationError as OmegaConfValidationError

    from replaylab.apps.registry import FetchRefused
    from replaylab.artifacts.manifest import ManifestError

    return (ConfigError, FileNotFoundError, ImportError, OmegaConfValidationError, FetchRefused,
            ManifestError)
