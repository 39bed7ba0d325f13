"""Contract validation: every reason code, file-level errors, and properties under random garbage."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaylab.contracts import (
    LEDGER_SCHEMA,
    ContractError,
    LedgerEnums,
    read_aggregates,
    read_ledger,
    read_outcomes,
    validate_aggregates,
    validate_ledger,
    validate_outcomes,
    write_quarantine,
)
from replaylab.contracts import enums as E
from replaylab.contracts.columns import QUARANTINE_REASON


def good_row(i: int, **over) -> dict:
    row = {
        "ledger_version": "1", "request_id": f"r{i}", "session_id": f"s{i // 3}",
        "turn_index": i % 3, "timestamp": 1_700_000_000_000 + 1000 * i, "prompt_tokens": 100 + i,
        "completion_tokens": 20 + i, "lifecycle_state": "completed", "selected_model": "m-small",
    }
    row.update(over)
    return row


BAD_ROWS = {
    "missing_required_field": {"session_id": None},
    "negative_tokens": {"completion_tokens": -3},
    "unknown_enum_value": {"lifecycle_state": "exploded"},
    "bad_timestamp": {"timestamp": "yesterday at noon"},
    "unknown_ledger_version": {"ledger_version": "7"},
    "bad_type": {"prompt_tokens": "many"},
    "end_before_dispatch": {"ended_at": 1_600_000_000_000},
    "out_of_range": {"propensity": 0.0},
}


@pytest.mark.parametrize("reason", sorted(BAD_ROWS))
def test_each_defect_is_quarantined_with_its_reason(reason):
    rows = [good_row(i) for i in range(5)] + [good_row(99, **BAD_ROWS[reason])]
    r = validate_ledger(pd.DataFrame(rows))
    assert r.rows_read == 6 and r.rows_valid == 5 and r.rows_quarantined == 1
    assert r.by_reason() == {reason: 1}
    assert r.quarantine["request_id"].tolist() == ["r99"]


def test_duplicate_request_id_keeps_first_and_quarantines_the_rest():
    rows = [good_row(0), good_row(1), good_row(0, prompt_tokens=5), good_row(0, prompt_tokens=6)]
    r = validate_ledger(pd.DataFrame(rows))
    assert r.by_reason() == {"duplicate_request_id": 2}
    assert r.valid.set_index("request_id").loc["r0", "prompt_tokens"] == 100


def test_canonical_types_and_extra_columns_carried():
    rows = [good_row(0, timestamp="2023-11-16T18:17:03.979Z", extra_col={"k": 1}),
            good_row(1, completion_tokens=None, extra_col=None)]
    r = validate_ledger(pd.DataFrame(rows))
    assert r.rows_valid == 2
    v = r.valid
    assert v["timestamp"].dtype == np.int64
    assert v.loc[0, "timestamp"] == pd.Timestamp("2023-11-16T18:17:03.979Z").value // 1_000_000
    assert pd.isna(v.loc[1, "completion_tokens"])  # absent usage stays null, not zero
    assert v.loc[0, "extra_col"] == {"k": 1}


def test_file_level_errors_are_one_line_and_name_the_file(tmp_path):
    p = tmp_path / "no_model.jsonl"
    p.write_text("\n".join(json.dumps({k: v for k, v in good_row(i).items()
                                       if k != "selected_model"}) for i in range(3)))
    with pytest.raises(ContractError, match=r"no_model\.jsonl: missing required column.*selected_model"):
        read_ledger(p)
    v2 = tmp_path / "v2.jsonl"
    v2.write_text(json.dumps(good_row(0, ledger_version="2")) + "\n")
    with pytest.raises(ContractError, match="ledger_version 2 is not supported"):
        read_ledger(v2)
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"this is not parquet at all")
    with pytest.raises(ContractError, match="not a readable Parquet file"):
        read_ledger(garbage)
    with pytest.raises(ContractError, match="no such file"):
        read_ledger(tmp_path / "missing.parquet")
    csv = tmp_path / "ledger.csv"
    csv.write_text("a,b\n1,2\n")
    with pytest.raises(ContractError, match="csv is not an accepted format"):
        read_ledger(csv)


def test_jsonl_bad_lines_are_quarantined_not_lost(tmp_path):
    p = tmp_path / "l.jsonl"
    lines = [json.dumps(good_row(i)) for i in range(4)] + ["{not json", "[1, 2]", ""]
    p.write_text("\n".join(lines) + "\n")
    r = read_ledger(p)
    assert r.rows_read == 6 and r.rows_valid == 4
    assert r.by_reason() == {"malformed_json": 1, "not_an_object": 1}
    out = write_quarantine(r, tmp_path / "q" / "ledger.jsonl")
    written = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(w[QUARANTINE_REASON] for w in written) == ["malformed_json", "not_an_object"]


def test_a_jsonl_file_cut_mid_line_warns_and_is_marked_truncated(tmp_path, caplog):
    """Only a file's last line lacks its newline: when it does not parse, the file was cut
    there. One warning names the file, the line and the bytes left; the summary lists it
    (`truncated`, what export reads to refuse registration). A bad line with its newline is
    a plain malformed line, and an intact last line without a newline is a row."""
    p = tmp_path / "l.jsonl"
    whole = [json.dumps(good_row(i)) for i in range(5)]
    cut = whole[4][:-7]  # the last line lost its last 7 characters
    p.write_text("\n".join(whole[:4] + [cut]))
    with caplog.at_level("WARNING", logger="replaylab"):
        r = read_ledger(p)
    assert (r.rows_read, r.rows_valid) == (5, 4) and r.by_reason() == {"malformed_json": 1}
    said = [rec.getMessage() for rec in caplog.records if "is cut" in rec.getMessage()]
    assert len(said) == 1 and str(p) in said[0] and "line 4" in said[0]
    assert f"{len(cut.encode())} bytes left" in said[0]
    assert r.summary()["truncated"] == [f"{r.source or 'ledger'} line 4: truncated: the file "
                                        f"ends mid-line, {len(cut.encode())} bytes left"]
    p.write_text("\n".join(whole[:2] + ["{not json"] + whole[2:]))  # no newline at the end
    r = read_ledger(p)
    assert (r.rows_read, r.rows_valid) == (6, 5) and "truncated" not in r.summary()


def test_parquet_roundtrip(tmp_path):
    rows = [good_row(i) for i in range(10)] + [good_row(3)]
    df = pd.DataFrame(rows)
    df["timestamp"] = pd.to_datetime(df["timestamp"], unit="ms", utc=True)  # a timestamp dtype
    p = tmp_path / "l.parquet"
    df.to_parquet(p)
    r = read_ledger(p)
    assert (r.rows_valid, r.rows_quarantined) == (10, 1)
    assert r.valid["timestamp"].iloc[0] == 1_700_000_000_000


def outcome_row(i: int, **over) -> dict:
    row = {"outcomes_version": "1", "prompt_id": f"p{i // 2}", "prompt_text": "2+2?",
           "task": "gsm8k", "candidate": ["cheap", "strong"][i % 2], "score": 1.0,
           "success": True, "cost": 0.001}
    row.update(over)
    return row


def test_outcomes_rules(tmp_path):
    rows = [outcome_row(i) for i in range(6)]
    rows += [outcome_row(0), outcome_row(10, score=1.5), outcome_row(12, success="yes"),
             outcome_row(14, cost=-1.0)]
    r = validate_outcomes(pd.DataFrame(rows))
    assert r.rows_valid == 6
    assert r.by_reason() == {"bad_type": 1, "duplicate_prompt_candidate": 1, "out_of_range": 2}
    p = tmp_path / "o.jsonl"
    pd.DataFrame(rows).to_json(p, orient="records", lines=True)
    assert read_outcomes(p).rows_valid == 6


def agg_row(i: int, **over) -> dict:
    row = {"aggregates_version": "1", "bucket_start": 1_700_000_000_000 + 600_000 * i,
           "bucket_seconds": 600, "archetype": "chat", "taxonomy_version": "t1",
           "slo_class": "all", "region": "all", "requests": 10 * i}
    row.update(over)
    return row


def test_aggregates_rules_and_privacy(tmp_path):
    rows = [agg_row(i) for i in range(5)] + [agg_row(0), agg_row(9, requests=-2),
                                            agg_row(10, bucket_seconds=0)]
    p = tmp_path / "a.csv"
    pd.DataFrame(rows).to_csv(p, index=False)
    r = read_aggregates(p)
    assert r.rows_valid == 5
    assert r.by_reason() == {"duplicate_bucket": 1, "negative_count": 1, "out_of_range": 1}
    with pytest.raises(ContractError, match="session_id are not allowed"):
        validate_aggregates(pd.DataFrame([agg_row(0, session_id="s1")]))


# ------------------------------------------------------------------ properties

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-10**15, 10**15), st.floats(allow_nan=True),
    st.text(max_size=12), st.sampled_from(["1", "completed", "stop", "2023-11-16T18:17:03Z",
                                           "aborted", "length", "exploration", "nan"]),
    st.lists(st.integers(0, 5), max_size=3), st.dictionaries(st.text(max_size=3),
                                                             st.integers(), max_size=2),
)
LEDGER_KEYS = list(good_row(0)) + ["ended_at", "finish_reason", "max_tokens", "streaming",
                                   "propensity", "routing_source", "outcome_score", "extra"]


@st.composite
def mutated_rows(draw):
    n = draw(st.integers(1, 12))
    rows = []
    for _i in range(n):
        row = good_row(draw(st.integers(0, 6)))
        for key in draw(st.lists(st.sampled_from(LEDGER_KEYS), max_size=4)):
            if draw(st.booleans()):
                row[key] = draw(SCALARS)
            else:
                row.pop(key, None)
        rows.append(row)
    return rows


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_rows())
def test_property_frames_conserve_rows(rows):
    try:
        r = validate_ledger(pd.DataFrame(rows))
    except ContractError:
        return  # the documented error: a column missing from every row, or a foreign version
    assert r.rows_valid + r.rows_quarantined == r.rows_read == len(rows)
    assert r.valid["request_id"].is_unique
    if r.rows_valid:
        assert (r.valid["prompt_tokens"].dropna() >= 0).all()
        assert r.valid["timestamp"].dtype == np.int64


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(mutated_rows(), st.lists(st.sampled_from(["{", "[]", "null", "\x00", "{}", "1"]),
                                max_size=3))
def test_property_jsonl_files_conserve_rows(tmp_path, rows, junk):
    p = tmp_path / "prop.jsonl"
    lines = [json.dumps(r, default=str) for r in rows] + junk
    p.write_text("\n".join(lines) + "\n")
    try:
        r = read_ledger(p)
    except ContractError:
        return
    non_empty = sum(1 for x in lines if x.strip())
    assert r.rows_valid + r.rows_quarantined == r.rows_read == non_empty


@settings(max_examples=60, deadline=None)
@given(st.lists(st.fixed_dictionaries({}, optional={
    "outcomes_version": SCALARS, "prompt_id": SCALARS, "prompt_text": SCALARS, "task": SCALARS,
    "candidate": SCALARS, "score": SCALARS, "success": SCALARS, "cost": SCALARS}), min_size=1,
    max_size=8))
def test_property_outcomes_conserve_rows(rows):
    full = [{**outcome_row(i), **r} for i, r in enumerate(rows)]
    try:
        r = validate_outcomes(pd.DataFrame(full))
    except ContractError:
        return
    assert r.rows_valid + r.rows_quarantined == r.rows_read == len(full)
    assert ((r.valid["score"] >= 0) & (r.valid["score"] <= 1)).all()


def test_enum_values_follow_ledger_v1_and_the_schema_checks_them():
    assert E.LifecycleState.ALL == ("completed", "aborted", "failed", "unknown")
    assert E.FinishReason.ALL == ("stop", "length", "cancelled", "error", "unknown")
    assert E.RoutingSource.ALL == ("sticky_binding", "classifier", "heuristic", "fixed",
                                   "exploration")
    assert E.RebindReason.ALL == ("credential_lost", "route_error", "provider_retired",
                                  "user_override", "escalation")
    assert E.OutcomeStatus.ALL == ("success", "failure", "cancelled", "unknown")
    assert E.AckState.ALL == ("used", "ignored", "unsupported", "absent")
    enum_fields = {f.name: f.values for f in LEDGER_SCHEMA.fields if f.kind == "enum"}
    assert enum_fields == {name.lower(): getattr(LedgerEnums, name) for name in (
        "LIFECYCLE_STATE", "FINISH_REASON", "ROUTING_SOURCE", "REBIND_REASON", "OUTCOME_STATUS",
        "ACK_STATE")}


def test_censored_is_narrower_than_lower_bound_on_purpose():
    # ledger-v1 "Censoring": cap hit or cancellation; a failure's partial output is a lower
    # bound of the desired length too, but not a censored label of the projection.
    assert set(E.CENSORED_FINISH) == {"length", "cancelled"}
    assert set(E.CENSORED_LIFECYCLE) == {"aborted"}
    assert set(E.LOWER_BOUND_FINISH) == {"length", "cancelled", "error"}
    assert set(E.LOWER_BOUND_LIFECYCLE) == {"aborted", "failed"}


def test_columns_and_enums_import_without_pandas():
    code = """
import sys
import replaylab.contracts.columns, replaylab.contracts.enums
from replaylab.contracts import Ledger, LifecycleState
print(sorted(m for m in sys.modules if m.split(".")[0] in {"pandas", "numpy", "pyarrow"}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
