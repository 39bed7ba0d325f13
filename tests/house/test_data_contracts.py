"""The data contracts ship with the repository (docs/specs/data-contracts/): a clone holds
what a valid input is. Every column a contract's tables name is declared in
contracts/columns.py, and the copies equal the team's shared contracts wherever those are
beside the data folder ($REPLAYLAB_SHARED_DATA/../contracts)."""

from __future__ import annotations

import re

import pytest

from replaylab.contracts.columns import Aggregates, Ledger, Outcomes
from tests.conftest import REPO

SPECS = REPO / "docs" / "specs" / "data-contracts"
DECLARED = {"ledger-v1.md": Ledger, "outcomes-v1.md": Outcomes,
            "aggregates-v1.md": Aggregates}


def table_columns(text: str) -> set[str]:
    """The backticked names in the first cell of every table row of a contract."""
    names = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            names |= set(re.findall(r"`([a-z_0-9]+)`", line.split("|")[1]))
    return names


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_every_contract_column_is_declared_once_in_code(name):
    declared = {v for k, v in vars(DECLARED[name]).items() if k.isupper() and isinstance(v, str)}
    named = table_columns((SPECS / name).read_text())
    assert len(named) >= 10, f"{name}: no column table found"
    assert named <= declared, f"{name}: not in contracts/columns.py: {sorted(named - declared)}"


def test_the_code_points_at_the_shipped_contracts():
    for path in (REPO / "src").rglob("*.py"):
        assert "shared/contracts" not in path.read_text(), path


def test_the_copies_equal_the_shared_contracts(shared_data):
    shared = shared_data.parent / "contracts"
    if not shared.is_dir():
        pytest.skip(f"no contracts/ beside {shared_data}")
    for name in DECLARED:
        assert (SPECS / name).read_bytes() == (shared / name).read_bytes(), name
