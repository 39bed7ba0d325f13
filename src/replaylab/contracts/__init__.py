"""Data contracts: schemas, one validation entry point each, quarantine of bad rows.

Names are imported lazily, so that `replaylab.contracts.columns` and
`replaylab.contracts.enums` (standard library only) can be imported by the serving
runtime without pulling in pandas through the validators.
"""

from __future__ import annotations

from replaylab.contracts.lazy import lazy_exports

_LAZY = {
    "AGGREGATES_SCHEMA": ".aggregates", "AGGREGATES_VERSION": ".aggregates",
    "read_aggregates": ".aggregates", "validate_aggregates": ".aggregates",
    "Aggregates": ".columns", "Ledger": ".columns", "Outcomes": ".columns",
    "AckState": ".enums", "FinishReason": ".enums", "LedgerEnums": ".enums",
    "LifecycleState": ".enums", "OutcomeStatus": ".enums", "RebindReason": ".enums",
    "RoutingSource": ".enums",
    "Piece": ".ledger_pieces", "plan_pieces": ".ledger_pieces", "read_piece": ".ledger_pieces",
    "validate_piece": ".ledger_pieces",
    "read_jsonl_lines": ".io", "read_raw": ".io", "write_quarantine": ".io", "write_table": ".io",
    "LEDGER_SCHEMA": ".ledger", "LEDGER_VERSION": ".ledger", "read_ledger": ".ledger",
    "validate_ledger": ".ledger",
    "OUTCOMES_SCHEMA": ".outcomes", "OUTCOMES_VERSION": ".outcomes", "read_outcomes": ".outcomes",
    "validate_outcomes": ".outcomes",
    "SOURCE_ATTR": ".schema", "ContractError": ".schema", "ValidationResult": ".schema",
    "has_values": ".schema",
    "InputError": ".errors",
    "Acknowledgement": ".hints", "DemandHint": ".hints", "HINT_VERSION": ".hints",
    "SUPPORTED_HINT_VERSIONS": ".hints", "ledger_record": ".hints", "negotiate": ".hints",
    "FIELD_SPECS": ".observation", "FieldSpec": ".observation", "FieldStatus": ".observation",
    "FieldValue": ".observation", "Freshness": ".observation", "Health": ".observation",
    "LOAD_FIELDS": ".observation", "LatencySummary": ".observation",
    "OBSERVATION_KIND": ".observation", "OBSERVATION_SCHEMA_VERSION": ".observation",
    "ObsField": ".observation", "Observation": ".observation",
    "ObservationSchemaError": ".observation", "Source": ".observation",
    "freshness": ".observation",
    "ACTUATION_STATUSES": ".events", "Actuation": ".events", "EVENTS_SCHEMA_VERSION": ".events",
    "EVENT_TYPES": ".events", "Event": ".events", "EventLinkError": ".events",
    "EventLog": ".events", "EventSchemaError": ".events", "OUTCOME_SOURCES": ".events",
    "Outcome": ".events", "REFUSALS": ".events", "Recommendation": ".events",
    "RecommendationDecision": ".events", "event_from_dict": ".events",
    "event_from_json": ".events", "event_to_dict": ".events", "event_to_json": ".events",
    "recommendation_problem": ".events", "sign_recommendation": ".events",
    "signature_problem": ".events", "verify_recommendation": ".events",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
