"""What each row can teach the demand model: a label, a lower bound, or nothing.

Target: total demand = prompt_tokens + completion_tokens, predicted at dispatch
(docs/design/demand-target.md). Every valid ledger row falls in exactly one class:

- `label`: usage present, prompt known, output not cut: a regression label;
- `length`: finish_reason=length: the output hit the cap; the observed total is a
  lower bound of the desired demand (the cap itself is never a label);
- `cancelled`: finish_reason=cancelled or lifecycle aborted: a lower bound;
- `failed`: lifecycle failed or finish_reason=error (an upstream error or a
  deadline cut it): a lower bound, when `failed_is_censored` (default);
- `absent_usage`: completion_tokens null (NOT zero): no label, counted;
- `prompt_absent`: usage present but prompt_tokens null: no total, counted.

An optional column that is absent reads as all null (finish_reason, max_tokens):
the classes never depend on whether a column is there, only on its values.
`check_trainable`'s errors name the ledger file (the validated frame's
`attrs[SOURCE_ATTR]`) and the column that leaves nothing to learn from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from replaylab.contracts import LEDGER_SCHEMA, SOURCE_ATTR
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.columns import Projected as P
from replaylab.contracts.enums import FinishReason, LifecycleState
from replaylab.contracts.errors import InputError

LABEL, LENGTH, CANCELLED, FAILED = "label", "length", "cancelled", "failed"
CLASS_COLUMN = "label_class"  # a row's label class in a frame (label_ prefix: never a feature)
ABSENT_USAGE, PROMPT_ABSENT = "absent_usage", "prompt_absent"
LOWER_BOUND_CLASSES = (LENGTH, CANCELLED, FAILED)
LABEL_CLASSES = (LABEL, *LOWER_BOUND_CLASSES, ABSENT_USAGE, PROMPT_ABSENT)


class DemandDataError(InputError, ValueError):
    """The ledger cannot train a demand model; the message says why (one line)."""


@dataclass(frozen=True)
class DemandLabels:
    """Per-row label arrays, aligned with the projection frame (n,) each.

    y_total: float64 observed total tokens; NaN where usage or prompt is absent.
        For lower-bound rows it is the observed (censored) total.
    label_class: object array of LABEL_CLASSES.
    prompt: float64 prompt tokens, 0 where unknown (what a prediction adds to output).
    cap: float64 max_tokens, NaN where the request set none.
    source: where the ledger came from (its file), named in `check_trainable`'s errors.
    """

    y_total: np.ndarray
    label_class: np.ndarray
    prompt: np.ndarray
    cap: np.ndarray
    source: str | None = None

    @property
    def usable(self) -> np.ndarray:
        """Rows with a regression label (bool (n,))."""
        return self.label_class == LABEL

    @property
    def lower_bound(self) -> np.ndarray:
        """Rows whose observed total is only a lower bound (bool (n,))."""
        return np.isin(self.label_class, LOWER_BOUND_CLASSES)


def demand_labels(features: pd.DataFrame, ledger: pd.DataFrame,
                  failed_is_censored: bool = True) -> DemandLabels:
    """Classify every row of a projection frame (see the module docstring).

    features: (n, *) output of `dispatch_time_features(ledger)`, same index as `ledger`.
    ledger: the validated ledger it came from (finish_reason and lifecycle_state).
    """
    if not features.index.equals(ledger.index):
        raise ValueError("features and ledger must share the index (one row per request)")
    finish = LEDGER_SCHEMA.column(ledger, L.FINISH_REASON)
    state = LEDGER_SCHEMA.column(ledger, L.LIFECYCLE_STATE)
    absent = features[P.LABEL_USAGE_ABSENT].to_numpy(dtype=bool)
    prompt_known = features[L.PROMPT_TOKENS].notna().to_numpy()
    length = (finish == FinishReason.LENGTH).to_numpy(dtype=bool)
    cancelled = ((finish == FinishReason.CANCELLED)
                 | (state == LifecycleState.ABORTED)).to_numpy(dtype=bool)
    failed = ((state == LifecycleState.FAILED) | (finish == FinishReason.ERROR)).to_numpy(dtype=bool)
    failed &= failed_is_censored
    # The projection's own censoring flag (length / cancelled / aborted) always counts.
    censored = features[P.LABEL_CENSORED].to_numpy(dtype=bool)
    cls = np.full(len(features), LABEL, dtype=object)
    cls[failed] = FAILED
    cls[censored & ~length] = CANCELLED
    cls[cancelled] = CANCELLED
    cls[length] = LENGTH
    cls[~prompt_known] = PROMPT_ABSENT
    cls[absent] = ABSENT_USAGE
    prompt = features[L.PROMPT_TOKENS].to_numpy(dtype="float64", na_value=0.0)
    cap = features[L.MAX_TOKENS].to_numpy(dtype="float64", na_value=np.nan)
    y = features[P.LABEL_TOTAL_DEMAND].to_numpy(dtype="float64", na_value=np.nan)
    source = ledger.attrs.get(SOURCE_ATTR)
    return DemandLabels(y_total=y, label_class=cls, prompt=prompt, cap=cap,
                        source=None if source is None else str(source))


def label_counts(labels: DemandLabels, splits: np.ndarray) -> dict:
    """Usable labels per split, lower-bound rows by reason, rows without a label."""
    cls = labels.label_class
    out: dict = {s: int((labels.usable & (splits == s)).sum())
                 for s in ("train", "calibration", "test", "embargo")}
    out["censored"] = int(labels.lower_bound.sum())
    out["censored_by_reason"] = {c: int((cls == c).sum()) for c in LOWER_BOUND_CLASSES}
    out["absent_usage"] = int((cls == ABSENT_USAGE).sum())
    out["prompt_absent"] = int((cls == PROMPT_ABSENT).sum())
    return out


def check_trainable(labels: DemandLabels, splits: np.ndarray, sessions: int,
                    min_train_rows: int, min_calibration_rows: int) -> None:
    """Raise DemandDataError when nothing honest can be trained, saying why."""
    cls = labels.label_class
    n = len(cls)
    at = f"{labels.source}: " if labels.source else ""
    if n == 0:
        raise DemandDataError(f"{at}no valid ledger rows: nothing to train a demand model on")
    with_usage = int((cls != ABSENT_USAGE).sum())
    if with_usage == 0:
        raise DemandDataError(f"{at}no usable labels: all {n} rows have completion_tokens null "
                              "(usage absent is not zero)")
    if not labels.usable.any():
        lb = int(labels.lower_bound.sum())
        if lb == with_usage:
            raise DemandDataError(
                f"{at}no usable labels: all {lb} rows with usage are censored (finish_reason "
                "length/cancelled/error or aborted/failed): their output is only a lower bound")
        raise DemandDataError(f"{at}no usable labels: of {n} rows, {lb} are censored, "
                              f"{n - with_usage} lack usage, the rest lack prompt_tokens")
    if sessions < 3:
        raise DemandDataError(
            f"{at}the ledger holds {'a single session' if sessions == 1 else f'{sessions} sessions'}"
            ": time-ordered session splits need sessions in train, calibration and test")
    usable = int(labels.usable.sum())
    for split, need, field in (("train", min_train_rows, "demand.min_train_rows"),
                               ("calibration", min_calibration_rows,
                                "demand.min_calibration_rows"),
                               ("test", 1, "at least one")):
        have = int((labels.usable & (splits == split)).sum())
        if have < need:
            raise DemandDataError(
                f"{at}too few usable labels in the {split} split: {have} < {need} ({field}; "
                f"{usable} usable of {n} rows): add sessions or change the split fractions")
