"""The fitted demand run, shared by `python -m training pipeline=demand` and `python -m export`.

Saves the fitted DemandRun next to the run (so a finished run can be
re-exported) and exports the artifact with the provenance the library must not
look up itself (`replaylab.apps.provenance`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import joblib

from replaylab.apps.provenance import git_commit, hmac_key

RUN_STATE = "demand_run.joblib"  # the fitted DemandRun (trusted, internal: pickle)


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
