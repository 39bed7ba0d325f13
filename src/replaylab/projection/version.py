"""Projection version and ledger fingerprints: a short hash of what a projection depends on.

projection_version = hash(ProjectionConfig [+ SplitConfig], code version, ledger
fingerprint). It changes when any of them does, e.g. when
`assume_ended_before_next` is flipped, so a run records which choice it made.

The ledger fingerprint has two schemes over the same row hashes: `ledger_fingerprint`
(local: the sorted row hashes) and `ledger_fingerprint_dask` (compute=dask: a multiset
digest of per-partition sums, `fingerprint_parts` + `combine_fingerprint`, so no row
hash travels to the driver). They are different digests of the same content.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd

from replaylab import __version__
from replaylab.compute.ops import frame_fingerprint, row_hashes
from replaylab.projection.config import ProjectionConfig, SplitConfig

# Bump when the meaning of a feature, label or split changes.
PROJECTION_CODE_VERSION = "projection-1"
# What a run's projection version is built with: the projection code and the package.
RUN_CODE_VERSION = f"{PROJECTION_CODE_VERSION}+replaylab-{__version__}"
FINGERPRINT_SCHEME_DASK = "multiset-v1 (Dask: order- and partition-independent)"


def ledger_fingerprint(ledger: pd.DataFrame) -> str:
    """sha256 hex of a ledger's content, independent of row and column order, partitioning
    and engine (`compute.ops.ledger_fingerprint`, here on one pandas frame): the names of
    the columns holding a value, the row count and the sorted row hashes."""
    return frame_fingerprint(ledger)


def fingerprint_parts(frame: pd.DataFrame) -> pd.DataFrame:
    """One row of a partition's multiset digest: rows, and the sum, xor and sum of
    squares (mod 2**64) of its row hashes (`row_hashes`, as `ledger_fingerprint`)."""
    h = row_hashes(frame)
    with np.errstate(over="ignore"):
        return pd.DataFrame({"rows": [int(h.size)], "sum": [np.add.reduce(h, dtype=np.uint64)],
                             "xor": [np.bitwise_xor.reduce(h) if h.size else np.uint64(0)],
                             "sum2": [np.add.reduce(h * h, dtype=np.uint64)]})


def combine_fingerprint(columns: list[str], parts: pd.DataFrame) -> str:
    """sha256 hex of the multiset of rows from `fingerprint_parts` rows: the same rows in
    any order and any partitioning give the same digest (not the local fingerprint's)."""
    with np.errstate(over="ignore"):
        body = {"scheme": "multiset-v1", "columns": sorted(map(str, columns)),
                "rows": int(parts["rows"].sum()),
                "sum": int(np.add.reduce(parts["sum"].to_numpy(np.uint64), dtype=np.uint64)),
                "xor": int(np.bitwise_xor.reduce(parts["xor"].to_numpy(np.uint64))
                           if len(parts) else 0),
                "sum2": int(np.add.reduce(parts["sum2"].to_numpy(np.uint64), dtype=np.uint64))}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def ledger_fingerprint_dask(valid: Any) -> str:
    """The multiset fingerprint of a dask frame of ledger rows (one row per partition
    travels to the driver)."""
    meta = pd.DataFrame({"rows": pd.Series(dtype="int64"), "sum": pd.Series(dtype="uint64"),
                         "xor": pd.Series(dtype="uint64"), "sum2": pd.Series(dtype="uint64")})
    parts = valid.map_partitions(fingerprint_parts, meta=meta).compute()
    return combine_fingerprint(list(valid.columns), parts)


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
