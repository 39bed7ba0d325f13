"""The MLflow Model Registry: register verified artifact folders, gate aliases, fetch by alias.

A registered version is the artifact folder itself (model.onnx / router.json /
encoder/ ... and manifest.json), logged as a plain run artifact and registered
from there; its tags carry what a reviewer and the promotion gate read (the
manifest's content hash, the data fingerprint, the projection version, the
headline metrics, the go/no-go verdict, the test window). docs/howto/mlflow.md says
why it is not an `mlflow.pyfunc` model. Every artifact kind (demand, router) is
declared once in `replaylab.artifacts.kinds` (exporter, loader, scorer) and takes
the same routes here.

Verification is the manifest's (`replaylab.contracts.manifest.verify_manifest`),
before a version is registered, before an alias moves, and after every fetch.

The modules, by role:

- `tags`: what a version says (its tags, signature and description, from its manifest);
- `blobs`: the one route of an artifact folder of either kind to its run
  (`log_artifact_folder`), large files stored once per content;
- `versions`: the client, registering a folder, downloading a version back verified;
- `rescore`: a champion scored on the challenger's own test rows, one driver for
  both kinds (`rescore_against(kind, ...)`);
- `gate`: the promotion gate;
- `actions`: the hook at the end of a recorded run and `python -m export register |
  promote | fetch | compare`.
"""

from __future__ import annotations

from replaylab.apps.registry.actions import (
    FetchRefused,
    alias_provenance,
    compare,
    compare_versions,
    fetch,
    promote,
    register_outcome,
    registered_artifacts,
    run_rescore_rows,
    run_summary,
)
from replaylab.apps.registry.blobs import (
    BLOB_STORE_TAG,
    BLOBS,
    blob_key,
    blob_store_run,
    log_artifact_folder,
    log_folder,
    reassemble,
)
from replaylab.apps.registry.gate import gate
from replaylab.apps.registry.rescore import (
    challenger_ledger_rows,
    record_rescore,
    recorded_rescore,
    rescore_against,
    rescore_json,
    router_test_rows,
    vs_prefix,
)
from replaylab.apps.registry.tags import (
    ARTIFACT_PATH,
    KINDS,
    NO_GATE,
    TAG,
    TAG_MAX,
    data_fingerprint,
    demand_gate,
    signature,
    test_window,
    version_description,
    version_tags,
)
from replaylab.apps.registry.versions import (
    alias_version,
    client,
    download_version,
    log_run_artifacts,
    model_name,
    register_folder,
    verified_version,
)

__all__ = [
    "ARTIFACT_PATH", "BLOBS", "BLOB_STORE_TAG", "KINDS", "NO_GATE", "TAG", "TAG_MAX",
    "FetchRefused", "alias_provenance", "alias_version", "blob_key", "blob_store_run",
    "challenger_ledger_rows", "client", "compare", "compare_versions", "data_fingerprint",
    "demand_gate", "download_version", "fetch", "gate", "log_artifact_folder", "log_folder",
    "log_run_artifacts", "model_name", "promote", "reassemble", "record_rescore",
    "recorded_rescore", "register_folder", "register_outcome", "registered_artifacts",
    "rescore_against", "rescore_json", "router_test_rows", "run_rescore_rows", "run_summary",
    "signature", "test_window", "verified_version", "version_description", "version_tags",
    "vs_prefix",
]
