"""Entry-point glue shared by `python -m training pipeline=demand` and `python -m export`.

Saves the fitted DemandRun next to the run (so a finished run can be
re-exported), exports the artifact, and gathers what the library must not look
up itself: the signing key (from an environment variable named in the config),
the git commit and the MLflow run id.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import joblib

from replaylab.config import ConfigError

RUN_STATE = "demand_run.joblib"  # the fitted DemandRun (trusted, internal: pickle)


def git_commit() -> str | None:
    """HEAD of the working tree (`-dirty` when it has changes), None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}-dirty" if dirty else head


def hmac_key(env_name: str | None) -> bytes | None:
    """The signing key from environment variable `env_name` (None: unsigned)."""
    if not env_name:
        return None
    value = os.environ.get(str(env_name))
    if not value:
        raise ConfigError(f"export.hmac_key_env={env_name!r}: that environment variable is unset")
    return value.encode("utf-8")


def save_run_state(run: Any, run_dir: Path) -> Path:
    path = Path(run_dir) / RUN_STATE
    joblib.dump(run, path)
    return path


def load_run_state(path: Path) -> Any:
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no fitted demand run here (was it a pipeline=demand "
                                "run of this version?)")
    return joblib.load(path)


def export_run(run: Any, summary: dict, out: Path, export_cfg: Any,
               mlflow_run_id: str | None) -> dict:
    """Export `run` to `out`; returns the summary's `export` section."""
    from replaylab.artifacts.demand_export import export_demand
    from replaylab.artifacts.manifest import verify_manifest

    key = hmac_key(export_cfg.get("hmac_key_env"))
    path = export_demand(run, summary, out, version=str(export_cfg.version),
                         valid_days=float(export_cfg.valid_days), hmac_key=key,
                         mlflow_run_id=mlflow_run_id, git_commit=git_commit())
    m = verify_manifest(path, hmac_key=key, required_kind="demand")
    return {"path": str(path), "version": m["version"], "content_hash": m["content_hash"],
            "created_at": m["created_at"], "valid_until": m["valid_until"],
            "signed": key is not None,
            "files": {e["path"]: e["size"] for e in m["files"]}}


def active_run_id() -> str | None:
    try:
        import mlflow
    except ImportError:
        return None
    run = mlflow.active_run()
    return run.info.run_id if run is not None else None
