"""Signatures the registry checks: an artifact folder's manifest, and the signed record a
promotion writes (docs/howto/mlflow.md, "What the MLflow UI can and cannot do").

Manifests are signed by default (`replaylab.apps.provenance.hmac_key`: REPLAYLAB_HMAC_KEY,
else the project's key file). `promote` and `fetch` refuse a manifest that is unsigned or
signed with another key unless `export.allow_unsigned=true`, which still checks the
content hash (the files and the training section, so the verdict) and prints one
`UNSIGNED:` line. Registering accepts an unsigned folder (an old run's; tagged
signed=false, so promoting it needs allow_unsigned) but not a mis-signed one.

A promotion record is the proof that the gate (or a forced promotion with its reason)
placed an alias: {name, version, alias, content_hash, decision, verdict, reasons, ...},
HMAC-signed with the same key and logged as `PROMOTION_RECORD` of the promote run.
`fetch` reads it from the run the version's `replaylab.promoted.<alias>` tag names and
checks its signature and every field against the version and its verified manifest;
tags, aliases and runs made by hand carry no valid record.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from replaylab.apps.provenance import hmac_key
from replaylab.contracts.manifest import (
    SIGNATURE_PREFIX,
    ManifestError,
    hmac_sha256,
    hmac_sha256_matches,
    verify_manifest,
)

PROMOTION_RECORD = "promotion/record.json"  # in the promote run's artifacts
RECORD_SCHEMA = "replaylab.promotion/1"
_SIGNATURE_REASONS = ("missing_signature", "bad_signature")
log = logging.getLogger("replaylab")


def export_section(cfg: Any) -> Any:
    return cfg.get("export") or {}


def signing_key(cfg: Any) -> bytes:
    """This project's signing key (`export.hmac_key_env`, else the key file)."""
    return hmac_key(export_section(cfg).get("hmac_key_env", "REPLAYLAB_HMAC_KEY"))


def verify_signed(folder: Path, cfg: Any, required_kind: str | None = None, *,
                  accept_unsigned: bool = False) -> tuple[dict, bool]:
    """(manifest, signed) of an artifact folder, verified with this project's key.

    An unsigned or mis-signed manifest is a ManifestError unless
    `export.allow_unsigned=true` (then verified without the key: one `UNSIGNED:` line,
    signed False). `accept_unsigned`: a manifest with no signature at all is accepted
    (registration of an old run's folder), a wrong signature still is not."""
    key = signing_key(cfg)
    try:
        return verify_manifest(folder, hmac_key=key, required_kind=required_kind), True
    except ManifestError as e:
        if e.reason not in _SIGNATURE_REASONS:
            raise
        allowed = bool(export_section(cfg).get("allow_unsigned", False))
        if not (allowed or (accept_unsigned and e.reason == "missing_signature")):
            raise ManifestError(e.reason, f"{e.message}: refused (export.allow_unsigned=true "
                                "accepts it, marked UNSIGNED)") from None
        manifest = verify_manifest(folder, hmac_key=None, required_kind=required_kind)
        if allowed:
            log.warning("UNSIGNED: %s (%s) is %s; accepted with export.allow_unsigned=true",
                        Path(folder).name, manifest["content_hash"][:19],
                        "unsigned" if e.reason == "missing_signature" else
                        "signed with another key")
        return manifest, False


def sign_record(record: dict, cfg: Any) -> dict:
    """{"record": record, "signature": "hmac-sha256:<hex>"} with this project's key."""
    body = {"schema": RECORD_SCHEMA, **record}
    return {"record": body, "signature": SIGNATURE_PREFIX + hmac_sha256(body, signing_key(cfg))}


def read_record(c: Any, run_id: str, cfg: Any, into: Path) -> tuple[dict | None, str | None]:
    """(record, None) when run `run_id` holds a promotion record signed with this project's
    key; (None, why) otherwise."""
    try:
        local = c.download_artifacts(run_id, PROMOTION_RECORD, str(into))
        doc = json.loads(Path(local).read_text(encoding="utf-8"))
    except Exception:  # MlflowException / OSError / ValueError: none, or not JSON
        return None, f"run {run_id} holds no signed promotion record ({PROMOTION_RECORD})"
    sig = doc.get("signature") if isinstance(doc, dict) else None
    body = doc.get("record") if isinstance(doc, dict) else None
    if not (isinstance(sig, str) and sig.startswith(SIGNATURE_PREFIX) and isinstance(body, dict)
            and body.get("schema") == RECORD_SCHEMA and hmac_sha256_matches(
                body, signing_key(cfg), sig[len(SIGNATURE_PREFIX):])):
        return None, (f"the promotion record of run {run_id} does not verify with this "
                      "project's key (edited, or not written by promote)")
    return body, None
