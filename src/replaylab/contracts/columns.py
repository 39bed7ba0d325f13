"""Column names of the data contracts, declared once.

Code refers to these constants, never to string literals, so a rename in a
contract is a one-line change here (contracts extend, never rename). Enum values
are declared in contracts/enums.py. Standard library only (the runtime imports it).
"""

from __future__ import annotations


class Ledger:
    """ledger-v1 columns (../shared/contracts/ledger-v1.md)."""

    VERSION = "ledger_version"
    REQUEST_ID = "request_id"
    SESSION_ID = "session_id"
    TURN_INDEX = "turn_index"
    TIMESTAMP = "timestamp"
    PROMPT_TOKENS = "prompt_tokens"
    COMPLETION_TOKENS = "completion_tokens"
    LIFECYCLE_STATE = "lifecycle_state"
    SELECTED_MODEL = "selected_model"
    # optional
    ENDED_AT = "ended_at"
    DURATION_MS = "duration_ms"
    TERMINAL_REASON = "terminal_reason"
    FINISH_REASON = "finish_reason"
    MAX_TOKENS = "max_tokens"
    STREAMING = "streaming"
    CACHED_PROMPT_TOKENS = "cached_prompt_tokens"
    DECISION = "decision"
    CATEGORY = "category"
    ORIGINAL_MODEL = "original_model"
    SLO_CLASS = "slo_class"
    REGION = "region"
    ACTUAL_COST = "actual_cost"
    CURRENCY = "currency"
    ROUTING_SOURCE = "routing_source"
    BINDING_ID = "binding_id"
    REBIND_REASON = "rebind_reason"
    PROPENSITY = "propensity"
    OUTCOME_STATUS = "outcome_status"
    OUTCOME_SCORE = "outcome_score"
    HINT_VERSION = "hint_version"
    HINT_MODEL_VERSION = "hint_model_version"
    HINT_P50 = "hint_p50"
    HINT_P90 = "hint_p90"
    HINT_LO = "hint_lo"
    HINT_HI = "hint_hi"
    HINT_INTERVAL = "hint_interval"
    HINT_AGE_MS = "hint_age_ms"
    HINT_FALLBACK = "hint_fallback"
    ACK_STATE = "ack_state"
    ACK_DECISION = "ack_decision"
    PROMPT_TEXT = "prompt_text"
    PROMPT_EMBEDDING = "prompt_embedding"
    EMBEDDING_MODEL = "embedding_model"


class Outcomes:
    """outcomes-v1 columns (../shared/contracts/outcomes-v1.md)."""

    VERSION = "outcomes_version"
    PROMPT_ID = "prompt_id"
    PROMPT_TEXT = "prompt_text"
    TASK = "task"
    CANDIDATE = "candidate"
    SCORE = "score"
    SUCCESS = "success"
    COST = "cost"
    CURRENCY = "currency"
    PROMPT_TOKENS = "prompt_tokens"
    COMPLETION_TOKENS = "completion_tokens"


class Aggregates:
    """aggregates-v1 columns (../shared/contracts/aggregates-v1.md)."""

    VERSION = "aggregates_version"
    BUCKET_START = "bucket_start"
    BUCKET_SECONDS = "bucket_seconds"
    ARCHETYPE = "archetype"
    TAXONOMY_VERSION = "taxonomy_version"
    SLO_CLASS = "slo_class"
    REGION = "region"
    REQUESTS = "requests"
    PROMPT_TOKENS_SUM = "prompt_tokens_sum"
    COMPLETION_TOKENS_SUM = "completion_tokens_sum"
    PROMPT_TOKENS_P50 = "prompt_tokens_p50"
    PROMPT_TOKENS_P90 = "prompt_tokens_p90"
    COMPLETION_TOKENS_P50 = "completion_tokens_p50"
    COMPLETION_TOKENS_P90 = "completion_tokens_p90"
    RATE_CV = "rate_cv"


# Columns the validators add to a quarantine frame.
QUARANTINE_REASON = "quarantine_reason"
QUARANTINE_DETAIL = "quarantine_detail"
SOURCE_ROW = "source_row"  # 0-based position of the row in the file as read
