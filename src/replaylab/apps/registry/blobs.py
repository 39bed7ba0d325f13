"""Large files stored once, and the one route of an artifact folder of either kind
to its run.

`log_artifact_folder` is how every artifact folder (demand or router) reaches
MLflow: verified against its manifest, logged under its kind's path in the run
(`demand_artifact/`, `router_artifact/`, `replaylab.artifacts.kinds`). A file of
at least `export.registry.blob_min_bytes` (the router's encoder) goes to a
content-addressed location (`sha256/<2 hex>/<sha256>` in the one run of the
experiment `export.registry.blob_experiment`), uploaded only when that key is not
there yet; the logged folder then holds `blobs.json` in its place, and every
download puts the files back (`reassemble`) before the whole folder is verified.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from replaylab.apps.registry.signing import verify_signed
from replaylab.apps.registry.tags import ARTIFACT_PATH, KINDS, TAG
from replaylab.config import ConfigError
from replaylab.contracts.manifest import ManifestError, link_or_copy

BLOBS = "blobs.json"  # in a logged folder: its large files, stored once per sha256
BLOB_STORE_TAG = TAG + "blob_store"


def log_artifact_folder(c: Any, cfg: DictConfig, run_id: str, folder: Path) -> dict:
    """Verify an artifact folder of any kind and log it to run `run_id` under its kind's
    path (large files stored once); {"kind", "artifact_path", "blobs", "manifest"}."""
    # an old run's unsigned folder registers (tagged signed=false: promote and fetch then
    # need export.allow_unsigned=true); one signed with another key does not
    manifest, _ = verify_signed(folder, cfg, accept_unsigned=True)
    kind = manifest["kind"]
    if kind not in KINDS:
        raise ConfigError(f"{folder}: kind {kind!r} is not registered (one of {KINDS})")
    blobs = log_folder(c, cfg, run_id, Path(folder), ARTIFACT_PATH[kind], manifest)
    return {"kind": kind, "artifact_path": ARTIFACT_PATH[kind], "blobs": blobs,
            "manifest": manifest}


# ---------------------------------------------------------------- large files, once
def blob_store_run(c: Any, cfg: DictConfig) -> str:
    """The run holding the content-addressed large files (created on first use)."""
    name = str(cfg.export.registry.get("blob_experiment") or "replaylab-artifact-store")
    exp = c.get_experiment_by_name(name)
    exp_id = exp.experiment_id if exp is not None else c.create_experiment(name)
    found = c.search_runs([exp_id], filter_string=f"tags.`{BLOB_STORE_TAG}` = 'true'",
                          order_by=["attributes.start_time ASC"], max_results=1)
    if found:
        return found[0].info.run_id
    run = c.create_run(exp_id, run_name="artifact-store", tags={BLOB_STORE_TAG: "true"})
    c.set_terminated(run.info.run_id)
    return run.info.run_id


def blob_key(sha256: str) -> str:
    return f"sha256/{sha256[:2]}/{sha256}"


def log_folder(c: Any, cfg: DictConfig, run_id: str, folder: Path, path: str,
               manifest: dict) -> dict:
    """Log a verified folder under `path` of run `run_id`; files of at least
    `blob_min_bytes` are uploaded to the blob store only when their sha256 is not
    there yet, and listed in the logged folder's blobs.json instead."""
    limit = int(((cfg.get("export") or {}).get("registry") or {}).get("blob_min_bytes") or 0)
    big = [e for e in manifest["files"] if limit > 0 and int(e["size"]) >= limit]
    out = {"uploaded": 0, "reused": 0, "bytes_uploaded": 0}
    if not big:
        c.log_artifacts(run_id, str(folder), artifact_path=path)
        return out
    store = blob_store_run(c, cfg)
    # a temporary sibling: hard links stay on the folder's file system (no copy of the encoder)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}.log-") as tmp:
        stage, upload = Path(tmp) / "folder", Path(tmp) / "upload"
        shutil.copytree(folder, stage, copy_function=link_or_copy)
        upload.mkdir()
        entries = []
        for e in big:
            key = blob_key(e["sha256"])
            present = {f.path for f in c.list_artifacts(store, key.rsplit("/", 1)[0])}
            if key in present:
                out["reused"] += 1
            else:
                blob = upload / e["sha256"]
                link_or_copy(folder / e["path"], blob)
                c.log_artifact(store, str(blob), artifact_path=key.rsplit("/", 1)[0])
                blob.unlink()
                out["uploaded"] += 1
                out["bytes_uploaded"] += int(e["size"])
            (stage / e["path"]).unlink()
            entries.append({"path": e["path"], "sha256": e["sha256"], "size": int(e["size"]),
                            "run_id": store, "artifact": key})
        (stage / BLOBS).write_text(json.dumps({"files": entries}, indent=1))
        c.log_artifacts(run_id, str(stage), artifact_path=path)
    return out


def reassemble(folder: Path, cfg: DictConfig) -> None:
    """Put a downloaded folder's stored-once files (blobs.json) back in place; the caller
    verifies the folder against its manifest afterwards (a bad blob fails there)."""
    import mlflow

    listing = folder / BLOBS
    if not listing.is_file():
        return
    root = folder.resolve()
    for e in json.loads(listing.read_text()).get("files", []):
        target = (folder / str(e["path"])).resolve()
        if not target.is_relative_to(root) or target == root:
            raise ManifestError("path", f"{BLOBS}: {e['path']!r} leaves the folder")
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            try:
                got = mlflow.artifacts.download_artifacts(
                    run_id=str(e["run_id"]), artifact_path=str(e["artifact"]), dst_path=tmp,
                    tracking_uri=str(cfg.tracking.uri))
            except Exception as exc:  # MlflowException / OSError: the stored file is gone
                raise ManifestError("missing_file", f"{e['path']!r}: stored file "
                                    f"{e['artifact']} cannot be downloaded: {exc}") from None
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(got, target)
    listing.unlink()

