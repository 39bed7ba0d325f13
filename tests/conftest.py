"""Shared fixtures: paths to the real public data and tiny seeded ledgers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TEST_DATA = REPO / "tests" / "data"


def _shared_data() -> Path:
    env = os.environ.get("REPLAYLAB_SHARED_DATA")
    if env:
        return Path(env)
    # ../shared/data beside the checkout; the workplace's fixed location for other clones
    for candidate in (REPO.parent / "shared" / "data", Path("/work/shared/data")):
        if candidate.is_dir():
            return candidate
    return REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (or $REPLAYLAB_SHARED_DATA); tests that need full files skip without it."""
    path = _shared_data()
    if not path.is_dir():
        pytest.skip(f"real data folder not found at {path} (set REPLAYLAB_SHARED_DATA)")
    return path


@pytest.fixture(scope="session")
def test_data() -> Path:
    """Small slices of real files committed under tests/data (see tests/data/README.md)."""
    return TEST_DATA


def edit_golden(folder: Path, edit, name: str = "golden.json") -> Path:
    """Apply `edit(doc)` to `folder/name` and rebuild the manifests so every hash verifies
    again (the edit is then only visible to a golden-vector check). For a router folder
    whose encoder's golden file is edited, the encoder manifest is rebuilt and the router
    manifest re-pins its content hash."""
    import json

    from replaylab.artifacts.manifest import build_manifest, write_manifest

    path = folder / name
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))

    def rebuild(f: Path, patch=None) -> dict:
        m = json.loads((f / "manifest.json").read_text())
        keep = {k: m[k] for k in ("contracts", "features", "outputs", "calibration", "training",
                                  "runtime", "fallback")}
        if patch:
            patch(keep)
        new = build_manifest(f, kind=m["kind"], version=m["version"], valid_days=30, **keep)
        write_manifest(f, new)
        return new

    if path.parent == folder / "encoder":  # a router's encoder: rebuild it, then re-pin it
        new = rebuild(path.parent)
        rebuild(folder, lambda k: k["features"][0].update(
            encoder_content_hash=new["content_hash"]))
    else:
        rebuild(folder)
    return folder
