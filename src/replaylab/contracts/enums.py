"""Enum values of the data contracts, declared once (docs/specs/data-contracts/ledger-v1.md).

Standard library only: the serving runtime imports this module, so it stays free of
pandas. Values are plain strings (they go into numpy and pandas columns as they are);
`ALL` lists a field's values in contract order, which is also the order of the integer
codes a generator draws (sources/synthetic: lifecycle code 0 = completed, ...).
Contracts extend, never rename: a new value goes at the end of `ALL`.
"""

from __future__ import annotations


class LifecycleState:
    """ledger-v1 `lifecycle_state`."""

    COMPLETED = "completed"
    ABORTED = "aborted"
    FAILED = "failed"
    UNKNOWN = "unknown"
    ALL = (COMPLETED, ABORTED, FAILED, UNKNOWN)


class FinishReason:
    """ledger-v1 `finish_reason`."""

    STOP = "stop"
    LENGTH = "length"  # hit the cap: output is right-censored
    CANCELLED = "cancelled"
    ERROR = "error"
    UNKNOWN = "unknown"
    ALL = (STOP, LENGTH, CANCELLED, ERROR, UNKNOWN)


class RoutingSource:
    """ledger-v1 `routing_source`: what chose `selected_model` for this turn."""

    STICKY_BINDING = "sticky_binding"
    CLASSIFIER = "classifier"
    HEURISTIC = "heuristic"
    FIXED = "fixed"
    EXPLORATION = "exploration"
    ALL = (STICKY_BINDING, CLASSIFIER, HEURISTIC, FIXED, EXPLORATION)


class RebindReason:
    """ledger-v1 `rebind_reason`, set on the first turn after a rebind."""

    CREDENTIAL_LOST = "credential_lost"
    ROUTE_ERROR = "route_error"
    PROVIDER_RETIRED = "provider_retired"
    USER_OVERRIDE = "user_override"
    ESCALATION = "escalation"
    ALL = (CREDENTIAL_LOST, ROUTE_ERROR, PROVIDER_RETIRED, USER_OVERRIDE, ESCALATION)


class OutcomeStatus:
    """ledger-v1 `outcome_status`, the receipted turn outcome."""

    SUCCESS = "success"
    FAILURE = "failure"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"
    ALL = (SUCCESS, FAILURE, CANCELLED, UNKNOWN)


class AckState:
    """ledger-v1 `ack_state`: what the consumer of a demand hint did with it."""

    USED = "used"
    IGNORED = "ignored"
    UNSUPPORTED = "unsupported"  # no hint version in common: no hint was sent
    ABSENT = "absent"  # no acknowledgement came back
    ALL = (USED, IGNORED, UNSUPPORTED, ABSENT)


class LedgerEnums:
    """Allowed values of each ledger-v1 enum column, as LEDGER_SCHEMA checks them."""

    LIFECYCLE_STATE = LifecycleState.ALL
    FINISH_REASON = FinishReason.ALL
    ROUTING_SOURCE = RoutingSource.ALL
    REBIND_REASON = RebindReason.ALL
    OUTCOME_STATUS = OutcomeStatus.ALL
    ACK_STATE = AckState.ALL


# Two sets, two meanings; they differ on purpose.
# CENSORED_*: right-censored output as ledger-v1 "Censoring" defines it: the cap was hit
# (finish_reason length) or the request was cancelled (finish_reason cancelled, lifecycle
# aborted). The projection's `label_censored` and history counts use these.
CENSORED_FINISH = (FinishReason.LENGTH, FinishReason.CANCELLED)
CENSORED_LIFECYCLE = (LifecycleState.ABORTED,)
# LOWER_BOUND_*: the observed output is only a lower bound of the desired length: censored,
# or a failure that kept the partial output (finish_reason error, lifecycle failed). The
# runtime's residual columns (`residual_is_lower_bound`) use these.
LOWER_BOUND_FINISH = (*CENSORED_FINISH, FinishReason.ERROR)
LOWER_BOUND_LIFECYCLE = (*CENSORED_LIFECYCLE, LifecycleState.FAILED)
