"""Column names of the data contracts, declared once.

Code refers to these constants, never to string literals, so a rename in a
contract is a one-line change here (contracts extend, never rename). Enum values
are declared in contracts/enums.py. Standard library only (the runtime imports it).
"""

from __future__ import annotations


class Ledger:
    """ledger-v1 columns (docs/specs/data-contracts/ledger-v1.md)."""

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
    """outcomes-v1 columns (docs/specs/data-contracts/outcomes-v1.md)."""

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
    """aggregates-v1 columns (docs/specs/data-contracts/aggregates-v1.md)."""

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


class Projected:
    """Columns of a projected ledger (`replaylab.projection`): dispatch-time features and
    labels. The session-history and calendar names are also the fields a serving request
    carries (`replaylab.runtime.demand` reads them; the demand artifact's feature schema
    names them)."""

    HOUR_UTC = "hour_utc"  # 0..23, hour of the dispatch
    DAY_OF_WEEK = "day_of_week"  # 0 = Monday .. 6 = Sunday, of the dispatch (UTC)
    # session history known at dispatch (projection/history.py)
    TURNS_DISPATCHED = "hist_turns_dispatched"  # earlier dispatches (t_j < t_R), ended or not
    TURNS_ENDED = "hist_turns_ended"  # of those, ended at or before t_R
    TURNS_WITH_USAGE = "hist_turns_with_usage"  # of the ended, with completion_tokens present
    TURNS_CENSORED = "hist_turns_censored"  # of the ended, censored (length/cancelled/aborted)
    COMPLETION_MEAN = "hist_completion_mean"  # mean completion tokens of ended turns with usage
    COMPLETION_EWMA = "hist_completion_ewma"  # EWMA of the same, in completion order
    LAST_COMPLETION = "hist_last_completion"  # tokens of the last-ended turn with usage
    MS_SINCE_LAST_END = "hist_ms_since_last_end"  # t_R - latest end among ended turns, ms
    # labels: known only after the response
    LABEL_COMPLETION_TOKENS = "label_completion_tokens"  # output demand; null = usage absent
    LABEL_TOTAL_DEMAND = "label_total_demand"  # prompt + completion; null if either is null
    LABEL_CENSORED = "label_censored"  # true value >= completion_tokens (length/cancel/abort)
    LABEL_USAGE_ABSENT = "label_usage_absent"  # completion_tokens null (NOT zero)


# The projection's column groups (keys to join and split on, never features; the request's
# own pre-dispatch fields; calendar; session history; labels).
KEY_COLUMNS = (Ledger.REQUEST_ID, Ledger.SESSION_ID, Ledger.TIMESTAMP)
OWN_INT_COLUMNS = (Ledger.TURN_INDEX, Ledger.PROMPT_TOKENS, Ledger.MAX_TOKENS,
                   Ledger.CACHED_PROMPT_TOKENS)
OWN_BOOL_COLUMNS = (Ledger.STREAMING,)
OWN_CATEGORY_COLUMNS = (Ledger.CATEGORY, Ledger.DECISION, Ledger.SELECTED_MODEL,
                        Ledger.SLO_CLASS, Ledger.REGION)
CALENDAR_COLUMNS = (Projected.HOUR_UTC, Projected.DAY_OF_WEEK)
# the history counts (a first turn has 0 of each; the runtime fills a missing one)
HISTORY_COUNT_COLUMNS = (Projected.TURNS_DISPATCHED, Projected.TURNS_ENDED,
                         Projected.TURNS_WITH_USAGE)
HISTORY_COLUMNS = (*HISTORY_COUNT_COLUMNS, Projected.TURNS_CENSORED, Projected.COMPLETION_MEAN,
                   Projected.COMPLETION_EWMA, Projected.LAST_COMPLETION,
                   Projected.MS_SINCE_LAST_END)
FEATURE_COLUMNS = (OWN_INT_COLUMNS + OWN_BOOL_COLUMNS + OWN_CATEGORY_COLUMNS + CALENDAR_COLUMNS
                   + HISTORY_COLUMNS)
LABEL_COLUMNS = (Projected.LABEL_COMPLETION_TOKENS, Projected.LABEL_TOTAL_DEMAND,
                 Projected.LABEL_CENSORED, Projected.LABEL_USAGE_ABSENT)


# Columns the validators add to a quarantine frame.
QUARANTINE_REASON = "quarantine_reason"
QUARANTINE_DETAIL = "quarantine_detail"
SOURCE_ROW = "source_row"  # 0-based position of the row in the file as read
