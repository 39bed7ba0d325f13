"""The three verdicts every gate speaks, written once (issue 45).

    GO                    the gate's objective is met with the stated confidence
    NO-GO                 it is not, and the evidence is enough to say so
    NOT ENOUGH EVIDENCE   the evidence cannot tell yet (an interval straddles the decision
                          line with failing overlap diagnostics, a test set too small to
                          check the band); it states how much more data would decide it

The summary carries `verdict` (one of VERDICTS) beside the boolean `go`, which is true only
for GO: the registry treats NOT ENOUGH EVIDENCE like NO-GO for promotion but tags it
differently. The console line, the summary, the report box and the MLflow tags carry the
same word.
"""

from __future__ import annotations

import math

GO = "GO"
NO_GO = "NO-GO"
NOT_ENOUGH_EVIDENCE = "NOT ENOUGH EVIDENCE"
VERDICTS = (GO, NO_GO, NOT_ENOUGH_EVIDENCE)


def decide(go: bool, enough_evidence: bool = True) -> str:
    """GO when `go`; else NOT ENOUGH EVIDENCE when the evidence could not decide; else NO-GO."""
    if go:
        return GO
    return NO_GO if enough_evidence else NOT_ENOUGH_EVIDENCE


def is_go(verdict: str | None) -> bool:
    """The boolean `go` of a verdict word: true only for GO."""
    return verdict == GO


def more_data_text(more: float, unit: str, per_day: float | None = None) -> str:
    """'~2367 more explored sessions (~3.2 days at 740 per day)': how much more data would
    decide a NOT ENOUGH EVIDENCE; the days only where the traffic per day is known."""
    if more is None or not math.isfinite(float(more)):
        return f"an unknown number of more {unit}"
    n = max(0, math.ceil(float(more)))
    text = f"~{n} more {unit}"
    if per_day is not None and math.isfinite(float(per_day)) and float(per_day) > 0:
        text += f" (~{n / float(per_day):.1f} days at {float(per_day):.0f} per day)"
    return text
