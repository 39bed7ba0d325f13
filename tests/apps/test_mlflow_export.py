"""`python -m export run_id=...` re-exports either kind: a router run, through a real
`mlflow server` on loopback (docs/howto/mlflow.md).

A finished router run folder (a router-kind folder whose stand-in encoder is over the
store-once size, and a summary) is logged and registered by `python -m export register`
(the one logging route: `router_artifact/`, the encoder stored once). `python -m export
run_id=<that run>` reads the run's kind off its tags, downloads the logged folder (the
encoder put back from the store), and publishes it again: the same files and content
hash, this export's version, verified, logged the same way and registered as the next
version. `run_dir=` does the same from the folder.

The session's one server (tests/conftest.py `mlflow_server`), under this file's own model
name; the entry point runs in process (tests/helpers/entrypoints.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from replaylab.apps.provenance import hmac_key
from replaylab.contracts.manifest import build_manifest, verify_manifest, write_manifest
from tests.helpers import entrypoints

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROUTER = "it-export-router"  # this file's own name on the session's server


def export(url: str, *args: str, run_dir: Path) -> tuple[entrypoints.EntryRun, dict]:
    run = entrypoints.export(*args, f"tracking.uri={url}", "tracking.experiment=it-export",
                             "export.registry.blob_min_bytes=1000",
                             f"export.registry.names.router={ROUTER}", run_dir=run_dir)
    return run, run.summary


def router_run(folder: Path) -> Path:
    """A finished router run folder: artifacts/router (a manifest over router.json and a
    stand-in encoder of 4000 bytes) and its summary."""
    art = folder / "artifacts" / "router"
    (art / "encoder").mkdir(parents=True)
    (art / "router.json").write_text(json.dumps({"threshold": 0.5}))
    (art / "encoder" / "encoder.onnx").write_bytes(
        np.random.default_rng(5).integers(0, 256, 4000, dtype=np.uint8).tobytes())
    m = build_manifest(art, kind="router", version="1.0.0", contracts={"outcomes": "1"},
                       valid_days=30, features=[{"name": "text"}], outputs={}, calibration={},
                       training={"go": True, "go_reasons": ["seeded"], "prompts": 400},
                       runtime={}, fallback={})
    write_manifest(art, m, hmac_key=hmac_key())  # signed with the tests' key (conftest)
    (folder / "summary.json").write_text(json.dumps({"pipeline": "router", "go": True}))
    return folder


def test_a_router_run_is_exported_again_by_run_id_and_by_run_dir(mlflow_server, tmp_path):
    from mlflow.tracking import MlflowClient

    source = router_run(tmp_path / "router-run")
    art = source / "artifacts" / "router"
    before = verify_manifest(art)
    url, _store = mlflow_server
    c = MlflowClient(tracking_uri=url, registry_uri=url)
    proc, reg = export(url, "register", f"run_dir={source}", run_dir=tmp_path / "reg")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [(r["name"], r["version"], r["artifact_path"]) for r in reg["registry"]] == [
        (ROUTER, 1, "router_artifact")]
    assert reg["registry"][0]["blobs"]["uploaded"] == 1  # the encoder, stored once
    run_id = reg["mlflow"]["run_id"]

    out = tmp_path / "again"
    # the same content (same hash) would reuse v1; allow_duplicate registers it again
    proc, s = export(url, f"run_id={run_id}", f"out={out}", "export.version=1.1.0",
                     "export.allow_duplicate=true", run_dir=tmp_path / "exp")
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = verify_manifest(out, required_kind="router")
    assert s["export"]["kind"] == "router" and s["artifacts"] == {"router": str(out)}
    assert m["content_hash"] == before["content_hash"] == s["export"]["content_hash"]
    assert m["version"] == "1.1.0" and s["verdict"].startswith("export: ")
    assert (out / "encoder" / "encoder.onnx").read_bytes() == \
        (art / "encoder" / "encoder.onnx").read_bytes()  # put back from the store
    # logged and registered the same way as every artifact folder
    r = s["registry"][0]
    assert (r["name"], r["version"], r["artifact_path"]) == (ROUTER, 2, "router_artifact")
    assert r["blobs"] == {"uploaded": 0, "reused": 1, "bytes_uploaded": 0}
    mv = c.get_model_version(ROUTER, "2")
    assert mv.tags["replaylab.content_hash"] == before["content_hash"]
    assert mv.tags["replaylab.artifact_version"] == "1.1.0"
    assert mv.source.endswith("/router_artifact") and mv.run_id == s["mlflow"]["run_id"]
    logged = {f.path for f in c.list_artifacts(mv.run_id, "router_artifact")}
    assert "router_artifact/blobs.json" in logged

    # run_dir=: the run folder's own artifact, published again in place
    proc, s = export(url, f"run_dir={source}", "export.version=2.0.0",
                     run_dir=tmp_path / "exp-dir")
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = verify_manifest(art, required_kind="router")
    assert m["version"] == "2.0.0" and m["content_hash"] == before["content_hash"]

    # an export run (pipeline=export): its kind is the one artifact folder it logged
    proc, s = export(url, f"run_id={s['mlflow']['run_id']}", f"out={tmp_path / 'third'}",
                     run_dir=tmp_path / "exp-of-exp")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert s["export"]["kind"] == "router"
    assert s["export"]["content_hash"] == before["content_hash"]
