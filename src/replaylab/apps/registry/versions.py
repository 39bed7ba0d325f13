"""Registered versions: the MLflow client, registering a verified folder as a new
version, and downloading a version back (reassembled and verified against its
manifest and its registered content hash)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from replaylab.apps.registry.blobs import log_artifact_folder, reassemble
from replaylab.apps.registry.signing import verify_signed
from replaylab.apps.registry.tags import (
    KINDS,
    TAG,
    signature,
    version_description,
    version_tags,
)
from replaylab.config import ConfigError
from replaylab.contracts.manifest import ManifestError


def client(cfg: DictConfig) -> Any:
    from mlflow.tracking import MlflowClient

    if not cfg.tracking.uri:
        raise ConfigError("the registry needs tracking.uri (e.g. sqlite:///mlflow.db)")
    return MlflowClient(tracking_uri=cfg.tracking.uri, registry_uri=cfg.tracking.uri)


def model_name(cfg: DictConfig, kind: str) -> str:
    return str(cfg.export.registry.names[kind])



def log_run_artifacts(run: Any, summary: dict, cfg: DictConfig) -> dict[str, dict]:
    """Every artifact folder a finished run's summary names (summary["artifacts"]["demand" |
    "router"]), logged to the open run by `log_artifact_folder`; kind -> what it logged."""
    arts = summary.get("artifacts") or {}
    folders = {k: Path(str(arts[k])) for k in KINDS if arts.get(k) and Path(str(arts[k])).is_dir()}
    if run is None or not folders:
        return {}
    c = client(cfg)
    return {k: log_artifact_folder(c, cfg, run.info.run_id, f) for k, f in folders.items()}


def register_folder(c: Any, run_id: str, folder: Path, name: str, cfg: DictConfig,
                    logged: dict | None = None) -> dict:
    """Register the artifact folder `folder` as a new version of `name`, from run `run_id`;
    `logged`: what `log_artifact_folder` returned when the run logged it already (else it
    is verified and logged here, the same way). {name, version, content_hash, go,
    artifact_path, blobs}."""
    from mlflow.exceptions import MlflowException

    if logged is None:
        logged = log_artifact_folder(c, cfg, run_id, Path(folder))
    manifest, kind, path = logged["manifest"], logged["kind"], logged["artifact_path"]
    blobs = logged["blobs"]
    try:
        c.create_registered_model(name, description=f"replaylab {kind} artifact folders "
                                  "(manifest-verified; docs/howto/mlflow.md)")
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    same = same_content(c, name, manifest["content_hash"])
    if same is not None and not bool((cfg.get("export") or {}).get("allow_duplicate", False)):
        logging.getLogger("replaylab").warning(
            "register: %s v%s holds the same content (%s); reused, no new version "
            "(export.allow_duplicate=true registers it again)", name, same.version,
            manifest["content_hash"][:19])
        return {"name": name, "version": int(same.version),
                "content_hash": manifest["content_hash"], "go": same.tags.get(TAG + "go"),
                "artifact_path": path, "blobs": blobs, "reused": True}
    tags = version_tags(manifest, cfg.export.registry)
    tags[TAG + "signature"] = json.dumps(signature(manifest))
    tags[TAG + "registered_by_run"] = run_id
    tags[TAG + "blobs"] = f"uploaded {blobs['uploaded']}, reused {blobs['reused']}"
    run = c.get_run(run_id)
    source = f"{run.info.artifact_uri.rstrip('/')}/{path}"
    mv = c.create_model_version(name, source, run_id=run_id, tags=tags,
                                description=version_description(manifest, tags, run.info))
    return {"name": name, "version": int(mv.version), "content_hash": manifest["content_hash"],
            "go": tags[TAG + "go"], "artifact_path": path, "blobs": blobs}


def same_content(c: Any, name: str, content_hash: str) -> Any | None:
    """The newest version of `name` registered with `content_hash` (None: none)."""
    found = [v for v in c.search_model_versions(f"name='{name}'")
             if (v.tags or {}).get(TAG + "content_hash") == content_hash]
    return max(found, key=lambda v: int(v.version)) if found else None


def download_version(c: Any, cfg: DictConfig, name: str, version: int | str,
                     into: Path) -> Path:
    """The files of a version (its artifact folder) downloaded under `into`."""
    import mlflow

    mv = c.get_model_version(name, str(version))
    folder = Path(mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=str(into),
                                                      tracking_uri=str(cfg.tracking.uri)))
    reassemble(folder, cfg)
    return folder


def verified_version(c: Any, cfg: DictConfig, name: str, version: int | str,
                     into: Path) -> tuple[Any, dict, Path]:
    """(model version, verified manifest, local folder); ManifestError when the downloaded
    files do not verify, are not signed with this project's key (unless
    export.allow_unsigned=true: `replaylab.apps.registry.signing.verify_signed`) or are
    not the registered content."""
    mv = c.get_model_version(name, str(version))
    folder = download_version(c, cfg, name, version, into)
    manifest, _ = verify_signed(folder, cfg, required_kind=mv.tags.get(TAG + "kind"))
    if manifest["content_hash"] != mv.tags.get(TAG + "content_hash"):
        raise ManifestError("content_hash", f"{name} v{version}: the store holds content "
                            f"{manifest['content_hash'][:19]}, registered "
                            f"{str(mv.tags.get(TAG + 'content_hash'))[:19]}")
    return mv, manifest, folder


def alias_version(c: Any, name: str, alias: str) -> Any | None:
    from mlflow.exceptions import MlflowException

    try:
        return c.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None
