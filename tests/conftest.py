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
