"""Projection version: a short hash of what a projection depends on.

projection_version = hash(ProjectionConfig [+ SplitConfig], code version, ledger
fingerprint). It changes when any of them does, e.g. when
`assume_ended_before_next` is flipped, so a run records which choice it made.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

import numpy as np
import pandas as pd

from replaylab.projection.config import ProjectionConfig, SplitConfig

# Bump when the meaning of a feature, label or split changes.
PROJECTION_CODE_VERSION = "projection-1"


def ledger_fingerprint(ledger: pd.DataFrame) -> str:
    """sha256 hex of a ledger's content, independent of row and column order.

    Each row is hashed (pandas `hash_pandas_object`, columns in sorted-name
    order, index ignored); the sorted row hashes, the column names and the row
    count are digested. Two frames with the same rows in another order, or the
    same columns in another order, get the same fingerprint.
    """
    cols = sorted(map(str, ledger.columns))
    h = hashlib.sha256()
    h.update(json.dumps({"columns": cols, "rows": len(ledger)}).encode())
    if len(ledger) and cols:
        frame = ledger[cols]
        try:
            rows = pd.util.hash_pandas_object(frame, index=False).to_numpy()
        except TypeError:  # unhashable cells (e.g. embeddings as lists): hash their repr
            frame = frame.apply(lambda s: s.map(repr) if s.dtype == object else s)
            rows = pd.util.hash_pandas_object(frame, index=False).to_numpy()
        h.update(np.sort(rows.astype(np.uint64)).tobytes())
    return h.hexdigest()


def projection_version(cfg: ProjectionConfig, ledger_fingerprint: str,
                       code_version: str = PROJECTION_CODE_VERSION,
                       split_cfg: SplitConfig | None = None) -> str:
    """16-hex-digit id of a projection: config (+ split config), code and ledger."""
    payload = {
        "projection": asdict(cfg),
        "splits": asdict(split_cfg) if split_cfg is not None else None,
        "code": code_version,
        "ledger": ledger_fingerprint,
    }
    blob = json.dumps(payload, sort_keys=True, default=list).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
