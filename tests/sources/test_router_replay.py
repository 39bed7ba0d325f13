"""source=router_replay: vLLM Semantic Router's Router Replay records (JSON exports and the
PostgreSQL store) into ledger-v1. Fixtures: tests/helpers/router_replay.py, hand-written
from the Go struct's JSON keys."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest

from replaylab.contracts import read_ledger
from replaylab.contracts.columns import Ledger as L
from replaylab.pipelines.ingest import import_to_contract
from replaylab.sources.registry import SOURCES
from replaylab.sources.router_replay import (
    FIELDS,
    MAPPING,
    OUTCOME_SOURCE,
    OUTCOME_VERDICT,
    OUTCOMES,
    REPLAY_ID,
    RouterReplayError,
    epoch_ms,
    fallback_session_id,
    mapping_table,
    record_to_row,
)
from tests.conftest import REPO
from tests.helpers.entrypoints import train
from tests.helpers.router_replay import (
    T0,
    as_read_from_postgres,
    fixture_records,
    load_table,
    outcome,
    postgres_binaries,
    postgres_server,
    record,
    summary_record,
    synthetic_records,
)

TABLE = "router_replay_records"


def _import(tmp_path: Path, path=None, out="rr.parquet", **options):
    summary = import_to_contract("router_replay", None if path is None else str(path),
                                 options, tmp_path / out, tmp_path / "run")
    return summary


def _ledger(summary: dict) -> pd.DataFrame:
    return read_ledger(summary["artifacts"]["table"]).valid.set_index(L.REQUEST_ID)


@pytest.fixture
def fixture_file(tmp_path):
    path = tmp_path / "export.json"
    path.write_text(json.dumps(fixture_records()))
    return path


# ---------------------------------------------------------------- the mapping table
def test_the_howto_holds_the_mapping_table():
    assert mapping_table() in (REPO / "docs" / "howto" / "import-data.md").read_text()


def test_every_record_key_is_mapped_once():
    keys = [f.key for f in MAPPING]
    assert len(keys) == len(set(keys)) == 80  # the JSON keys of store.Record at 3d48f8c
    used = set().union(*(r.keys() for r in fixture_records()))
    assert used <= set(FIELDS)
    for f in MAPPING:
        assert f.note or f.kind == "carried"
        assert (f.kind == "dropped") == (f.becomes == "")


# ---------------------------------------------------------------- every row accounted for
def test_fixtures_every_row_accounted_for(fixture_file, tmp_path):
    s = _import(tmp_path, fixture_file, chunk_rows=5)
    assert s["rows_read"] == 16 == s["rows_valid"] + s["rows_quarantined"]
    assert s["quarantine_by_reason"] == {"duplicate_record_id": 1, "in_progress": 2}
    assert s["chunks"] == 4
    q = [json.loads(x) for x in (tmp_path / "run" / "quarantine" / "router_replay.jsonl")
         .read_text().splitlines()]
    assert sorted((r["quarantine_reason"], r[REPLAY_ID]) for r in q) == [
        ("duplicate_record_id", "rr-00000"), ("in_progress", "rr-00004"),
        ("in_progress", "rr-00013")]
    got = _ledger(s)
    assert len(got) == 13
    assert got.loc["req-00000", L.PROMPT_TOKENS] == 40  # the first copy of rr-00000 kept
    assert got.loc["req-00013", L.LIFECYCLE_STATE] == "completed"  # the ended copy kept


def test_fixture_field_mapping(fixture_file, tmp_path):
    got = _ledger(_import(tmp_path, fixture_file, keep_prompt=True))
    r0 = got.loc["req-00000"]
    assert r0[L.SESSION_ID] == "sess-0000" and r0[L.TURN_INDEX] == 0
    assert r0[L.TIMESTAMP] == epoch_ms(T0) and r0[L.ENDED_AT] == r0[L.TIMESTAMP] + 850
    assert r0[L.DURATION_MS] == 850 and r0[L.TERMINAL_REASON] == "response_complete"
    assert (r0[L.PROMPT_TOKENS], r0[L.COMPLETION_TOKENS]) == (40, 120)
    assert r0[L.ACTUAL_COST] == pytest.approx(0.000123) and r0[L.CURRENCY] == "USD"
    assert r0[L.SELECTED_MODEL] == "llama-3.1-70b" and r0[L.ORIGINAL_MODEL] == "auto"
    assert (r0[L.DECISION], r0[L.CATEGORY]) == ("general_route", "other")
    assert r0["selection_method"] == "static" and r0["confidence_score"] == 0.82
    assert json.loads(r0["route_diagnostics"])["selected_model"] == "llama-3.1-70b"
    assert r0[REPLAY_ID] == "rr-00000" and r0["total_tokens"] == 160
    assert r0[L.PROMPT_TEXT] == "question 0: what is 0 + 0?"
    assert not r0[L.STREAMING] and pd.isna(r0[L.CACHED_PROMPT_TOKENS])
    # streaming, cached tokens
    assert bool(got.loc["req-00001", L.STREAMING])
    assert got.loc["req-00001", L.CACHED_PROMPT_TOKENS] == 32
    # aborted and failed keep their terminal reason; failed has no usage: null, not 0
    ab, fa = got.loc["req-00002"], got.loc["req-00003"]
    assert (ab[L.LIFECYCLE_STATE], ab[L.TERMINAL_REASON]) == ("aborted", "client_canceled")
    assert ab[L.COMPLETION_TOKENS] == 17 and ab[L.DURATION_MS] == 300
    assert (fa[L.LIFECYCLE_STATE], fa[L.TERMINAL_REASON]) == ("failed", "upstream_error_response")
    assert pd.isna(fa[L.PROMPT_TOKENS]) and pd.isna(fa[L.COMPLETION_TOKENS])
    assert pd.isna(fa[L.ACTUAL_COST]) and fa["response_status"] == 502
    # usage absent on a completed row: null, never zero
    assert pd.isna(got.loc["req-00007", L.COMPLETION_TOKENS])
    assert pd.isna(got.loc["req-00007", "total_tokens"])
    # several outcomes: the last appended wins, all are kept
    o5 = got.loc["req-00005"]
    assert (o5[L.OUTCOME_STATUS], o5[OUTCOME_VERDICT], o5[OUTCOME_SOURCE]) == (
        "failure", "failed", "operator")
    assert pd.isna(o5[L.OUTCOME_SCORE])
    assert [o["verdict"] for o in json.loads(o5[OUTCOMES])] == [
        "underpowered", "good_fit", "failed"]
    assert (got.loc["req-00006", L.OUTCOME_STATUS], got.loc["req-00006", L.OUTCOME_SCORE]) == (
        "success", 0.75)
    assert got.loc["req-00011", L.OUTCOME_STATUS] == "success"  # overprovisioned
    assert got[L.OUTCOME_STATUS].notna().sum() == 3
    # a summary record: no prompt, even with keep_prompt
    assert pd.isna(got.loc["req-00008", L.PROMPT_TEXT])
    # no session: the router's own fallback id; no request id either: the record id
    assert got.loc["req-00009", L.SESSION_ID] == fallback_session_id("req-00009")
    assert got.loc["rr-00010", L.SESSION_ID] == fallback_session_id("rr-00010")
    assert fallback_session_id("req-00009").startswith("rid-") and len(
        fallback_session_id("x")) == 20
    # a record written before lifecycles: unknown
    assert got.loc["req-00012", L.LIFECYCLE_STATE] == "unknown"
    # no body or content column is carried
    assert not {"request_body", "response_body", "tool_trace", "prompt",
                "hallucination_span_details"} & set(got.columns)


def test_no_prompt_text_without_keep_prompt(fixture_file, tmp_path):
    s = _import(tmp_path, fixture_file)
    assert _ledger(s)[L.PROMPT_TEXT].isna().all()
    assert "replays: no `prompt_text`" in s["readiness"]["line"]


def test_times_truncate_to_ms_from_any_offset():
    assert epoch_ms("2026-08-03T09:00:00.123999999Z") == epoch_ms(T0) + 123
    assert epoch_ms("2026-08-03T17:00:00.5+08:00") == epoch_ms(T0) + 500
    assert epoch_ms("0001-01-01T00:00:00Z") < 0  # Go's zero time: the contract refuses it
    row = record_to_row(record(0, timestamp="not a time"))
    assert row[L.TIMESTAMP] == "not a time"  # left for validate_ledger: bad_timestamp


def test_bad_values_go_through_the_contracts_quarantine(tmp_path):
    recs = [record(0), record(1, timestamp="yesterday"), record(2, prompt_tokens=-3),
            record(3, selected_model=""), record(4, outcomes=[outcome("good_fit", score=1.5)])]
    path = tmp_path / "e.json"
    path.write_text(json.dumps(recs))
    s = _import(tmp_path, path)
    assert s["rows_valid"] == 1 and s["rows_read"] == 5
    assert s["quarantine_by_reason"] == {"bad_timestamp": 1, "missing_required_field": 1,
                                         "negative_tokens": 1, "out_of_range": 1}


# ---------------------------------------------------------------- input shapes
def test_jsonl_pages_single_records_and_folders_read_alike(tmp_path):
    recs = [r for i, r in enumerate(fixture_records()) if i not in (13, 14)]
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps(recs))
    folder = tmp_path / "exports"
    folder.mkdir()
    (folder / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs[:4]))
    (folder / "b.json").write_text(json.dumps({"object": "router_replay.list", "count": 4,
                                               "data": recs[4:8], "has_more": True}, indent=2))
    (folder / "c.json").write_text(json.dumps(recs[8], indent=2))  # GET /{id}
    (folder / "d.ndjson").write_text("\n".join(json.dumps(r) for r in recs[9:]))
    a = _import(tmp_path / "a", whole)
    b = _import(tmp_path / "b", folder, chunk_rows=3)
    assert a["rows_read"] == b["rows_read"] == len(recs)
    pd.testing.assert_frame_equal(_ledger(a), _ledger(b))


def test_a_line_that_is_not_json_is_quarantined(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_text(json.dumps(record(0)) + "\n{not json\n" + json.dumps(record(1)) + "\n")
    s = _import(tmp_path, path)
    assert (s["rows_read"], s["rows_valid"]) == (3, 2)
    assert s["quarantine_by_reason"] == {"malformed_json": 1}


def test_inputs_named_wrong_are_one_line(tmp_path):
    with pytest.raises(RouterReplayError, match="needs source.path"):
        _import(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(RouterReplayError, match="no .json"):
        _import(tmp_path, tmp_path / "empty")
    with pytest.raises(RouterReplayError, match="not a table name"):
        _import(tmp_path, uri="postgresql://x@127.0.0.1:1/db", table="t; drop table x")
    assert SOURCES["router_replay"].path_optional


def test_a_folder_out_is_a_dataset_of_parts(fixture_file, tmp_path):
    s = _import(tmp_path, fixture_file, out="rr", chunk_rows=5)
    parts = sorted((tmp_path / "rr").glob("part-*.parquet"))
    assert len(parts) == 4
    total = sum(len(read_ledger(p).valid) for p in parts)
    assert total == s["rows_valid"] == 13


def test_import_entrypoint_ends_with_the_readiness_line(fixture_file, tmp_path):
    proc = train("pipeline=import", "source=router_replay", f"source.path={fixture_file}",
                 f"out={tmp_path / 'rr.parquet'}", "tracking=off", run_dir=tmp_path / "run")
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("import: 16 rows read, 13 valid, 3 quarantined; ready: demand: "
                           "usage on 90% of 10 completed rows; router from receipts: no "
                           "`propensity`")
    assert "replaylab.runtime.SessionBinder" in last and "replays: no `prompt_text`" in last
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["verdict"] == last and s["readiness"]["completed_with_usage"] == 9


def test_uri_is_refused_by_sources_that_read_files(tmp_path):
    trace = tmp_path / "conversation_trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 5, "output_length": 7, "hash_ids": [1]}\n')
    proc = train("pipeline=import", "source=mooncake", f"source.path={trace}",
                 "source.uri=postgresql://a@b/c", f"out={tmp_path / 'x.parquet'}",
                 "tracking=off", run_dir=tmp_path / "run", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: source=mooncake takes no source.uri (only source.path and source.options)")


# ---------------------------------------------------------------- the PostgreSQL store
def _postgres_or_skip():
    if postgres_binaries() is None:
        pytest.skip("no PostgreSQL binaries (initdb, postgres): apt-get install postgresql "
                    "(make test does)")
    pytest.importorskip("psycopg", reason="psycopg is not installed (replaylab[postgres])")


def _stored() -> list[dict]:
    """The fixtures a table can hold: one row per record id (the backend updates in place)."""
    return [r for i, r in enumerate(fixture_records()) if i not in (13, 14)]


def test_postgres_table_and_json_export_import_to_identical_bytes(tmp_path):
    _postgres_or_skip()
    stored = _stored()
    export = tmp_path / "export.json"  # as a PostgreSQL-backed router lists them: newest first
    export.write_text(json.dumps([as_read_from_postgres(r) for r in stored][::-1]))
    with postgres_server() as uri:
        load_table(uri, TABLE, stored)
        secret = uri.replace("replay@", "replay:s3cret@")  # trust auth: never asked for
        pg = _import(tmp_path / "pg", uri=secret, table=TABLE, chunk_rows=4)
        pg_parts = _import(tmp_path / "pgparts", uri=uri, table=TABLE, out="rr", chunk_rows=4)
    js = _import(tmp_path / "js", export, chunk_rows=5)
    for s in (pg, js):
        assert s["rows_read"] == 14 == s["rows_valid"] + s["rows_quarantined"]
        assert s["quarantine_by_reason"] == {"in_progress": 2}  # r4, and r12's '' in a table
    assert pg["chunks"] == 4 and pg["source_table"] == TABLE
    assert pg["source_uri"] == uri.replace("replay@", "replay:***@")  # no password kept
    a, b = Path(pg["artifacts"]["table"]), Path(js["artifacts"]["table"])
    assert hashlib.sha256(a.read_bytes()).hexdigest() == hashlib.sha256(b.read_bytes()).hexdigest()
    pd.testing.assert_frame_equal(pd.read_parquet(a), pd.read_parquet(b))
    assert pg_parts["rows_valid"] == 12
    got = _ledger(pg)
    assert pd.isna(got.loc["req-00003", L.COMPLETION_TOKENS])  # NULL usage stays null
    assert got.loc["req-00005", L.OUTCOME_STATUS] == "failure"
    assert got.loc["req-00000", "selection_method"] == "static"  # from route_diagnostics
    assert got["confidence_score"].eq(0).all()  # not a column of the table
    assert got.loc["req-00000", "rag_similarity_score"] == pytest.approx(0.85, abs=1e-7)


def test_a_missing_table_is_one_line(tmp_path):
    _postgres_or_skip()
    with postgres_server() as uri, pytest.raises(RouterReplayError, match="source.table=nope"):
        _import(tmp_path, uri=uri, table="nope")


def test_a_server_that_does_not_answer_is_one_line(tmp_path):
    pytest.importorskip("psycopg", reason="psycopg is not installed (replaylab[postgres])")
    with pytest.raises(RouterReplayError, match="cannot connect") as e:
        _import(tmp_path, uri="postgresql://nobody:secret@127.0.0.1:1/db?connect_timeout=2")
    assert "\n" not in str(e.value)


def test_every_outcome_verdict_maps_to_a_status():
    def status(*outcomes):
        return record_to_row(record(0, outcomes=list(outcomes) or None))[L.OUTCOME_STATUS]

    assert status() is None  # no outcome: null, not unknown
    assert [status(outcome(v)) for v in ("good_fit", "overprovisioned", "underpowered",
                                         "failed", "thumbs_sideways")] == [
        "success", "success", "failure", "failure", "unknown"]
    assert status(outcome("failed"), outcome("good_fit")) == "success"  # the last appended
    row = record_to_row(record(0, outcomes=json.dumps([outcome("good_fit", score=0.5)])))
    assert (row[L.OUTCOME_STATUS], row[L.OUTCOME_SCORE]) == ("success", 0.5)  # JSON text too


def test_summary_record_drops_what_the_list_api_blanks():
    s = summary_record(record(0))
    assert "prompt" not in s and "request_body" not in s
    assert record_to_row(s, keep_prompt=True)[L.PROMPT_TEXT] is None


# ---------------------------------------------------------------- the pipelines on the result
@pytest.mark.slow
def test_demand_runs_on_an_imported_router_replay_ledger_and_router_says_what_is_missing(
        tmp_path):
    export = tmp_path / "export.jsonl"
    export.write_text("".join(json.dumps(r) + "\n" for r in synthetic_records(400, seed=3)))
    ledger = tmp_path / "rr.parquet"
    train("pipeline=import", "source=router_replay", f"source.path={export}", f"out={ledger}",
          "tracking=off", run_dir=tmp_path / "import")
    train("pipeline=demand", f"data.ledger={ledger}", "tracking=off", "export.enabled=false",
          "demand.model.n_estimators=50", run_dir=tmp_path / "demand")
    s = json.loads((tmp_path / "demand" / "summary.json").read_text())
    assert s["rows_read"] == s["rows_valid"] == 400
    assert s["labels"]["absent_usage"] > 0 and s["verdict"].startswith("demand: ")
    proc = train("pipeline=router", f"data.ledger={ledger}", "tracking=off",
                 "export.enabled=false", "router.encoder.tier=static",
                 run_dir=tmp_path / "router", check=False)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and L.ROUTING_SOURCE in last
