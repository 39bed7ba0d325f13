"""Data contracts: schemas, one validation entry point each, quarantine of bad rows."""

from replaylab.contracts.aggregates import (
    AGGREGATES_SCHEMA,
    AGGREGATES_VERSION,
    read_aggregates,
    validate_aggregates,
)
from replaylab.contracts.columns import Aggregates, Ledger, LedgerEnums, Outcomes
from replaylab.contracts.io import read_raw, write_quarantine, write_table
from replaylab.contracts.ledger import LEDGER_SCHEMA, LEDGER_VERSION, read_ledger, validate_ledger
from replaylab.contracts.outcomes import (
    OUTCOMES_SCHEMA,
    OUTCOMES_VERSION,
    read_outcomes,
    validate_outcomes,
)
from replaylab.contracts.schema import SOURCE_ATTR, ContractError, ValidationResult, has_values

__all__ = [
    "AGGREGATES_SCHEMA", "AGGREGATES_VERSION", "Aggregates", "ContractError", "LEDGER_SCHEMA",
    "LEDGER_VERSION", "Ledger", "LedgerEnums", "OUTCOMES_SCHEMA", "OUTCOMES_VERSION", "Outcomes",
    "SOURCE_ATTR", "ValidationResult", "has_values", "read_aggregates", "read_ledger",
    "read_outcomes", "read_raw", "validate_aggregates", "validate_ledger", "validate_outcomes",
    "write_quarantine", "write_table",
]
