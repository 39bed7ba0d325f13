"""Typed configs of the projection: what the features may see, how the rows are split.

Both are frozen dataclasses (Hydra structured-config friendly: YAML carries the
values). A bad value fails at construction with a message naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass

from replaylab.config import fail_field as _fail


@dataclass(frozen=True)
class ProjectionConfig:
    """How `dispatch_time_features` builds features.

    ewma_alpha: weight of the newest completed turn in the session EWMA of
        completion tokens, in (0, 1]; ewma_k = a * x_k + (1 - a) * ewma_{k-1}.
    assume_ended_before_next: for a turn whose end is unknown (no `ended_at`,
        no `duration_ms`), assume it ended at the next (strictly later) dispatch
        of its session, as in interactive chat. Default False: such a turn
        never contributes to a later turn's history (ledger-v1, "Dispatch time
        is the cut"). Part of the projection version.
    canary_checks: run the label-leakage guard on every projection (and a
        canary self-test proving the guard fires on this data).
    leakage_threshold: |Spearman| between a feature and an unknown-at-dispatch
        label above which the feature is refused, in (0, 1].
    extra_feature_columns: ledger columns (beyond the standard features) to carry
        as features. Nothing else from the ledger becomes a feature; names that
        look like outcomes (label_*, completion*, ended*, duration*, ...) are refused.
    """

    ewma_alpha: float = 0.5
    assume_ended_before_next: bool = False
    canary_checks: bool = True
    leakage_threshold: float = 0.99
    extra_feature_columns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not 0.0 < float(self.ewma_alpha) <= 1.0:
            _fail(name, "ewma_alpha", self.ewma_alpha, "must be in (0, 1]")
        if not 0.0 < float(self.leakage_threshold) <= 1.0:
            _fail(name, "leakage_threshold", self.leakage_threshold, "must be in (0, 1]")
        if not isinstance(self.assume_ended_before_next, bool):
            _fail(name, "assume_ended_before_next", self.assume_ended_before_next, "must be a bool")
        extra = self.extra_feature_columns
        if isinstance(extra, str) or not all(isinstance(c, str) for c in extra):
            _fail(name, "extra_feature_columns", extra, "must be a sequence of column names")
        object.__setattr__(self, "extra_feature_columns", tuple(extra))


@dataclass(frozen=True)
class SplitConfig:
    """How `time_ordered_splits` cuts the sessions, in session-start order.

    train, calibration, test: fractions of ROWS (requests), each in [0, 1],
        summing to 1. The cut falls between whole sessions.
    embargo_ms: the last dispatch of every session kept in an earlier split is
        more than embargo_ms before the first dispatch of any session of a
        later split; rows of the earlier split dispatched within embargo_ms of
        the boundary are labelled `embargo` (counted, not used).
    purge: "rows" (default) embargoes only the late turns of a session still
        active at a boundary; "sessions" embargoes such a session wholly.
    """

    train: float = 0.6
    calibration: float = 0.2
    test: float = 0.2
    embargo_ms: int = 30 * 60 * 1000
    purge: str = "rows"

    def __post_init__(self) -> None:
        name = type(self).__name__
        for f in ("train", "calibration", "test"):
            v = float(getattr(self, f))
            if not 0.0 <= v <= 1.0:
                _fail(name, f, v, "must be in [0, 1]")
        total = float(self.train) + float(self.calibration) + float(self.test)
        if abs(total - 1.0) > 1e-9:
            _fail(name, "train+calibration+test", total, "fractions must sum to 1")
        if int(self.embargo_ms) != self.embargo_ms or self.embargo_ms < 0:
            _fail(name, "embargo_ms", self.embargo_ms, "must be an integer >= 0 (milliseconds)")
        if self.purge not in ("rows", "sessions"):
            _fail(name, "purge", self.purge, "must be 'rows' or 'sessions'")

    @classmethod
    def from_minutes(cls, embargo_minutes: float, **fields: object) -> SplitConfig:
        """A config with the embargo given in minutes (rounded to whole ms)."""
        return cls(embargo_ms=int(round(embargo_minutes * 60_000)), **fields)
