"""The three verdict words (replaylab.verdict): one vocabulary, `go` true only for GO."""

from __future__ import annotations

import math

from replaylab.verdict import (
    GO,
    NO_GO,
    NOT_ENOUGH_EVIDENCE,
    VERDICTS,
    decide,
    is_go,
    more_data_text,
)


def test_decide_gives_each_word_and_go_is_true_only_for_go():
    assert decide(True) == GO and decide(True, enough_evidence=False) == GO
    assert decide(False) == NO_GO
    assert decide(False, enough_evidence=False) == NOT_ENOUGH_EVIDENCE
    assert [is_go(v) for v in VERDICTS] == [True, False, False]
    assert VERDICTS == ("GO", "NO-GO", "NOT ENOUGH EVIDENCE")


def test_more_data_text_states_rows_and_days_where_traffic_is_known():
    assert more_data_text(2366.2, "explored sessions", 740) == (
        "~2367 more explored sessions (~3.2 days at 740 per day)")
    assert more_data_text(10, "test rows") == "~10 more test rows"
    assert more_data_text(-3, "test rows", 0) == "~0 more test rows"
    assert "unknown" in more_data_text(math.inf, "test rows")
