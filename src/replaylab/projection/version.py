"""Projection version and ledger fingerprints: a short hash of what a projection depends on.

projection_version = hash(ProjectionConfig [+ SplitConfig], code version, ledger
fingerprint). It changes when any of them does, e.g. when
`assume_ended_before_next` is flipped, so a run records which choice it made.

The ledger fingerprint is one digest for every engine and partitioning
(`compute.ops.ledger_fingerprint`: the valued column names, the row count and the
sorted row hashes); `ledger_fingerprint` here is it on one pandas frame.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

import pandas as pd

from replaylab import __version__
from replaylab.compute.ops import frame_fingerprint
from replaylab.projection.config import ProjectionConfig, SplitConfig

# Bump when the meaning of a feature, label or split changes.
PROJECTION_CODE_VERSION = "projection-1"
# What a run's projection version is built with: the projection code and the package.
RUN_CODE_VERSION = f"{PROJECTION_CODE_VERSION}+replaylab-{__version__}"


def ledger_fingerprint(ledger: pd.DataFrame) -> str:
    """sha256 hex of a ledger's content, independent of row and column order, partitioning
    and engine (`compute.ops.ledger_fingerprint`, here on one pandas frame): the names of
    the columns holding a value, the row count and the sorted row hashes."""
    return frame_fingerprint(ledger)


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
