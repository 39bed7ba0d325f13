"""vLLM Semantic Router's Router Replay records -> ledger-v1.

Source: vLLM Semantic Router (vllm-project/semantic-router, Apache-2.0), the Router
Replay store: `src/semantic-router/pkg/routerreplay/store/store.go` (`Record`, its JSON
keys), the PostgreSQL backend (`store/postgres.go`: table `router_replay_records`, one
column per scalar field, JSONB for the nested ones) and the list API's summary records
(`routerreplay/list_summary_record.go`: prompt, bodies, tool definitions and the
projection trace blanked). Read at upstream commit 3d48f8c9cc0d5b15067ce324a03ec6cc25f192c3.

Inputs, each read in bounded chunks of `chunk_rows` records:

- a file of records as the replay API returns them: a JSON array, one record
  (`GET /v1/router_replay/{id}`), a list page (`GET /v1/router_replay`: `{"object",
  "data": [...], ...}`), or JSON Lines of any of these; full or summary records alike;
- a folder of such files (`*.json`, `*.jsonl`, `*.ndjson`, sorted by name);
- a table of the PostgreSQL backend (`uri=postgresql://...`, `table=...`), read through a
  server-side cursor ordered by (`timestamp`, `id`): never the whole table in memory.

The mapping of every field is `MAPPING` (rendered into docs/howto/import-data.md by
`mapping_table()`, tested equal). Rows the source itself marks as not a ledger row are
quarantined here with a reason before the contract's validation (`REFUSED`): a record
still `in_progress` and a repeated record `id`. A JSON array file is parsed whole (the
API's pages are bounded by its `limit`); JSON Lines are streamed.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from replaylab.contracts.columns import QUARANTINE_DETAIL, QUARANTINE_REASON, SOURCE_ROW
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.enums import LifecycleState, OutcomeStatus
from replaylab.contracts.errors import InputError
from replaylab.contracts.ledger import LEDGER_VERSION

UPSTREAM_COMMIT = "3d48f8c9cc0d5b15067ce324a03ec6cc25f192c3"
DEFAULT_TABLE = "router_replay_records"  # store.DefaultPostgresTableName
CHUNK_ROWS = 10_000
FILE_SUFFIXES = (".json", ".jsonl", ".ndjson")
IN_PROGRESS = "in_progress"  # store.LifecycleInProgress: the request had not ended

# Carried-through columns that are not ledger-v1's: the record's own id, and the winning
# outcome's verdict and source beside the whole outcomes[] list.
REPLAY_ID = "replay_id"
OUTCOME_VERDICT = "outcome_verdict"
OUTCOME_SOURCE = "outcome_source"
OUTCOMES = "outcomes"

# outcomes[].verdict (routerruntime.RouterOutcomeVerdict) -> ledger-v1 outcome_status
VERDICT_STATUS = {
    "good_fit": OutcomeStatus.SUCCESS,
    "overprovisioned": OutcomeStatus.SUCCESS,  # answered well, on more model than needed
    "underpowered": OutcomeStatus.FAILURE,
    "failed": OutcomeStatus.FAILURE,
}

Kind = Literal["ledger", "carried", "dropped"]
Type = Literal["str", "int", "float", "float32", "bool", "json", "-"]


class RouterReplayError(InputError, ValueError):
    """A Router Replay input that cannot be read: one line naming it."""


@dataclass(frozen=True)
class ReplayField:
    """One Router Replay JSON key and what it becomes.

    kind: `ledger` (a ledger-v1 column, `column`), `carried` (an extra column of the same
    name unless `column` says otherwise, typed `type`) or `dropped`; note: the rule, or why
    it is dropped.
    """

    key: str
    kind: Kind
    column: str = ""
    type: Type = "-"
    note: str = ""

    @property
    def becomes(self) -> str:
        return self.column or (self.key if self.kind == "carried" else "")


def _f(key: str, kind: Kind, column: str = "", typ: Type = "-", note: str = "") -> ReplayField:
    if kind == "carried" and typ == "str" and "empty" not in note:
        note = "; ".join(x for x in ("as is; empty: null", note) if x)
    return ReplayField(key, kind, column, typ, note)


_CONTENT = "content; summary records blank it, and only `prompt` may become text (keep_prompt)"
_ZERO = "Go's zero value when absent (the JSON omits it, the table defaults to it)"
_ZERO_JSON = "Go's zero value when absent (the JSON omits it)"
_PG_NONE = "; not a column of the PostgreSQL table: Go's zero value on a table import"
_PG_NULL = "not a column of the PostgreSQL table: null on a table import"

# Every JSON key of store.Record, in the struct's order. The one home of the mapping.
MAPPING: tuple[ReplayField, ...] = (
    _f("id", "carried", REPLAY_ID, "str", "the record's own id (`x-vsr-replay-id`); also "
       "`request_id` when the record has none; a repeated id is quarantined "
       "(`duplicate_record_id`)"),
    _f("timestamp", "ledger", L.TIMESTAMP, note="RFC 3339 (nanoseconds) or the table's "
       "zone-less TIMESTAMP, read as UTC -> epoch ms, truncated"),
    _f("request_id", "ledger", L.REQUEST_ID, note="renamed as is; empty: the record `id`"),
    _f("session_id", "ledger", L.SESSION_ID, note="renamed as is; empty: the router's own "
       "fallback, `rid-` + the first 16 hex of sha256(`rid:` + request id) "
       "(extproc `deriveSessionIDFromRequestID`), so the request is its own session"),
    _f("turn_index", "ledger", L.TURN_INDEX, note="as is (0 when the table holds null)"),
    _f("previous_response_id", "carried", typ="str"),
    _f("conversation_id", "carried", typ="str"),
    _f("recipe", "carried", typ="str"),
    _f("decision", "ledger", L.DECISION, note="as is (routing field)"),
    _f("decision_tier", "carried", typ="int", note=_ZERO),
    _f("decision_priority", "carried", typ="int", note=_ZERO),
    _f("category", "ledger", L.CATEGORY, note="as is (routing field)"),
    _f("original_model", "ledger", L.ORIGINAL_MODEL, note="as is (routing field)"),
    _f("selected_model", "ledger", L.SELECTED_MODEL, note="as is; empty: quarantined "
       "(`missing_required_field`)"),
    _f("reasoning_mode", "carried", typ="str"),
    _f("confidence_score", "carried", typ="float", note="routing field; " + _ZERO_JSON + _PG_NONE),
    _f("selection_method", "carried", typ="str", note="routing field; empty: "
       "`route_diagnostics.selection_method` (the table keeps it only there)"),
    _f("route_diagnostics", "carried", typ="json", note="canonical JSON text (keys sorted)"),
    _f("learning", "carried", typ="json", note="canonical JSON text; no propensity in it"),
    _f("outcomes", "ledger", L.OUTCOME_STATUS, note="the LAST outcome appended wins: "
       "`verdict` good_fit/overprovisioned -> `success`, underpowered/failed -> `failure`, "
       "other -> `unknown`; its `score` -> `outcome_score` (absent: null); its verdict and "
       "source -> `outcome_verdict`, `outcome_source`; the whole list -> `outcomes` "
       "(canonical JSON text)"),
    _f("session_policy", "carried", typ="json", note="canonical JSON text"),
    _f("signals", "carried", typ="json", note="canonical JSON text (empty: null)"),
    _f("projections", "carried", typ="json", note="canonical JSON text"),
    _f("projection_scores", "carried", typ="json", note="canonical JSON text"),
    _f("projection_trace", "dropped", note="a per-request debug trace; summary records "
       "blank it"),
    _f("signal_confidences", "carried", typ="json", note="canonical JSON text"),
    _f("signal_values", "carried", typ="json", note="canonical JSON text"),
    _f("tool_trace", "dropped", note="tool arguments and outputs: " + _CONTENT),
    _f("request_body", "dropped", note=_CONTENT),
    _f("response_body", "dropped", note=_CONTENT),
    _f("response_status", "carried", typ="int", note=_ZERO),
    _f("lifecycle_state", "ledger", L.LIFECYCLE_STATE, note="completed/aborted/failed/"
       "unknown as is; empty -> `unknown`; `in_progress` is quarantined (`in_progress`)"),
    _f("ended_at", "ledger", L.ENDED_AT, note="as `timestamp`; absent: null"),
    _f("duration_ms", "ledger", L.DURATION_MS, note="as is when > 0; 0 or absent: null "
       "(the JSON omits 0, the table defaults to 0)"),
    _f("terminal_reason", "ledger", L.TERMINAL_REASON, note="as is (aborted and failed "
       "rows keep it)"),
    _f("from_cache", "carried", typ="bool", note=_ZERO),
    _f("streaming", "ledger", L.STREAMING, note="as is (absent: false, Go's zero value)"),
    _f("request_body_truncated", "dropped", note="about a dropped body"),
    _f("response_body_truncated", "dropped", note="about a dropped body"),
    _f("guardrails_enabled", "carried", typ="bool", note=_ZERO),
    _f("jailbreak_enabled", "carried", typ="bool", note=_ZERO),
    _f("pii_enabled", "carried", typ="bool", note=_ZERO),
    _f("jailbreak_detected", "carried", typ="bool", note=_ZERO_JSON + _PG_NONE),
    _f("jailbreak_type", "carried", typ="str", note=_PG_NULL),
    _f("jailbreak_confidence", "carried", typ="float32", note=_ZERO_JSON + _PG_NONE),
    _f("response_jailbreak_detected", "carried", typ="bool", note=_ZERO_JSON + _PG_NONE),
    _f("response_jailbreak_type", "carried", typ="str", note=_PG_NULL),
    _f("response_jailbreak_confidence", "carried", typ="float32", note=_ZERO_JSON + _PG_NONE),
    _f("pii_detected", "carried", typ="bool", note=_ZERO_JSON + _PG_NONE),
    _f("pii_entities", "carried", typ="json", note="entity types, canonical JSON text; "
       + _PG_NULL),
    _f("pii_blocked", "carried", typ="bool", note=_ZERO_JSON + _PG_NONE),
    _f("prompt", "ledger", L.PROMPT_TEXT, note="ONLY with `source.keep_prompt=true` and "
       "present (capture on, not a summary record); else null"),
    _f("prompt_truncated", "carried", typ="bool", note=_ZERO),
    _f("tool_definitions", "dropped", note=_CONTENT),
    _f("tool_definitions_truncated", "dropped", note="about a dropped field"),
    _f("rag_enabled", "carried", typ="bool", note=_ZERO),
    _f("rag_backend", "carried", typ="str"),
    _f("rag_context_length", "carried", typ="int", note=_ZERO),
    _f("rag_similarity_score", "carried", typ="float32", note=_ZERO),
    _f("cache_similarity", "carried", typ="float32", note=_ZERO),
    _f("cache_hit_kind", "carried", typ="str", note=_PG_NULL),
    _f("cache_source", "carried", typ="str", note=_PG_NULL),
    _f("cache_entry_age_seconds", "carried", typ="float", note=_ZERO_JSON + _PG_NONE),
    _f("cache_ttl_seconds", "carried", typ="int", note=_ZERO_JSON + _PG_NONE),
    _f("context_token_count", "carried", typ="int", note=_ZERO),
    _f("hallucination_enabled", "carried", typ="bool", note=_ZERO),
    _f("hallucination_detected", "carried", typ="bool", note=_ZERO),
    _f("hallucination_confidence", "carried", typ="float32", note=_ZERO),
    _f("hallucination_spans", "dropped", note="spans of response text: " + _CONTENT),
    _f("hallucination_span_details", "dropped", note="spans of response text: " + _CONTENT),
    _f("prompt_tokens", "ledger", L.PROMPT_TOKENS, note="as is; absent stays null"),
    _f("cached_prompt_tokens", "ledger", L.CACHED_PROMPT_TOKENS, note="as is; absent "
       "stays null"),
    _f("cache_write_tokens", "carried", typ="int", note="absent stays null"),
    _f("completion_tokens", "ledger", L.COMPLETION_TOKENS, note="as is; absent stays null "
       "(usage absent is not zero)"),
    _f("total_tokens", "carried", typ="int", note="absent stays null"),
    _f("actual_cost", "ledger", L.ACTUAL_COST, note="as is; absent stays null"),
    _f("baseline_cost", "carried", typ="float", note="absent stays null"),
    _f("cost_savings", "carried", typ="float", note="absent stays null"),
    _f("currency", "ledger", L.CURRENCY, note="as is"),
    _f("baseline_model", "carried", typ="str"),
)
FIELDS = {f.key: f for f in MAPPING}
# Go pointers (`*int`, `*float64`, `*string`): absent is null, never Go's zero value.
_NULLABLE = {"prompt_tokens", "cached_prompt_tokens", "cache_write_tokens",
             "completion_tokens", "total_tokens", "actual_cost", "baseline_cost",
             "cost_savings", "currency", "baseline_model"}

# Reasons this importer quarantines with, ahead of the contract's own (docs/specs/contracts.md).
REFUSED = {IN_PROGRESS: "the record is still `in_progress`: the request had not ended when "
                        "it was exported (no usage, no terminal state yet)",
           "duplicate_record_id": "a record `id` seen earlier in the input (the first is kept)"}

# The ledger columns this importer writes, in order; then the carried ones (MAPPING order).
LEDGER_COLUMNS = (L.VERSION, L.REQUEST_ID, L.SESSION_ID, L.TURN_INDEX, L.TIMESTAMP,
                  L.PROMPT_TOKENS, L.COMPLETION_TOKENS, L.LIFECYCLE_STATE, L.SELECTED_MODEL,
                  L.ENDED_AT, L.DURATION_MS, L.TERMINAL_REASON, L.STREAMING,
                  L.CACHED_PROMPT_TOKENS, L.DECISION, L.CATEGORY, L.ORIGINAL_MODEL,
                  L.ACTUAL_COST, L.CURRENCY, L.OUTCOME_STATUS, L.OUTCOME_SCORE, L.PROMPT_TEXT)
CARRIED: dict[str, Type] = {
    **{f.becomes: f.type for f in MAPPING if f.kind == "carried"},
    OUTCOME_VERDICT: "str", OUTCOME_SOURCE: "str", OUTCOMES: "json"}
_DTYPES = {"str": object, "json": object, "int": "Int64", "float": "float64",
           "float32": "float64", "bool": "boolean"}
_LEDGER_DTYPES = {L.TURN_INDEX: "Int64", L.TIMESTAMP: "Int64", L.PROMPT_TOKENS: "Int64",
                  L.COMPLETION_TOKENS: "Int64", L.ENDED_AT: "Int64", L.DURATION_MS: "Int64",
                  L.STREAMING: "boolean", L.CACHED_PROMPT_TOKENS: "Int64",
                  L.ACTUAL_COST: "float64", L.OUTCOME_SCORE: "float64"}


def mapping_table() -> str:
    """The Markdown table of docs/howto/import-data.md "Router Replay" (tested equal)."""
    rows = ["| Router Replay field | becomes | rule |", "|---|---|---|"]
    for f in MAPPING:
        if f.kind == "ledger":
            becomes = f"`{f.column}`"
        elif f.kind == "carried":
            becomes = f"carried through as `{f.becomes}`"
        else:
            becomes = "dropped"
        rows.append(f"| `{f.key}` | {becomes} | {f.note} |")
    return "\n".join(rows)


# ---------------------------------------------------------------- one record -> one row
def fallback_session_id(request_id: str) -> str:
    """The router's own session id for a request without one: `rid-` + 16 hex of
    sha256(`rid:` + request id) (extproc/memory_helpers.go `deriveSessionIDFromRequestID`)."""
    return "rid-" + hashlib.sha256(f"rid:{request_id}".encode()).hexdigest()[:16]


def _text(v: Any) -> str | None:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    s = v if isinstance(v, str) else str(v)
    return s if s != "" else None


def epoch_ms(v: Any) -> Any:
    """A Router Replay time as int epoch ms UTC, truncated: an RFC 3339 string (up to
    nanoseconds, any offset) or a datetime (the table's zone-less TIMESTAMP is UTC).
    Anything else is returned as it is, for the contract to quarantine (`bad_timestamp`)."""
    if isinstance(v, dt.datetime):
        t = v if v.tzinfo is not None else v.replace(tzinfo=dt.UTC)
    elif isinstance(v, str) and v:
        s = v.strip()
        head, dot, frac = s.partition(".")
        if dot:  # at most 6 fractional digits (fromisoformat), offset kept
            digits = len(frac) - len(frac.lstrip("0123456789"))
            s = f"{head}.{frac[:min(digits, 6)]}{frac[digits:]}"
        try:
            t = dt.datetime.fromisoformat(s.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            return v
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.UTC)
    else:
        return None if v is None or v == "" else v
    delta = t - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000)


def _canonical_json(v: Any) -> str | None:
    if isinstance(v, str):  # a JSONB column read as text, or an API that nests JSON text
        try:
            v = json.loads(v)
        except ValueError:
            return v or None
    if v is None or v == {} or v == [] or v == "":
        return None
    return json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _carried(v: Any, type_: Type, nullable: bool) -> Any:
    absent = v is None or (isinstance(v, float) and math.isnan(v))
    if type_ == "str":
        return _text(v)
    if type_ == "json":
        return _canonical_json(v)
    if absent:
        return None if nullable else {"int": 0, "float": 0.0, "float32": 0.0,
                                      "bool": False}[type_]
    if type_ == "int":
        return v if isinstance(v, bool) or not isinstance(v, float | int) else int(v)
    if type_ == "float":
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else v
    if type_ == "float32":  # a float32 field: the same value from JSON text and a REAL column
        return float(np.float32(v)) if isinstance(v, int | float) and not isinstance(v, bool) \
            else v
    return v  # bool


def _winning_outcome(outcomes: Any) -> dict | None:
    if isinstance(outcomes, str):
        try:
            outcomes = json.loads(outcomes)
        except ValueError:
            return None
    if not isinstance(outcomes, list):
        return None
    objs = [o for o in outcomes if isinstance(o, dict)]
    return objs[-1] if objs else None


def record_to_row(record: dict[str, Any], keep_prompt: bool = False) -> dict[str, Any]:
    """One Router Replay record (JSON object, or a table row as a dict) as one ledger-v1
    row, by `MAPPING`; values the contract will refuse are passed on for it to quarantine."""
    g = record.get
    replay_id = _text(g("id"))
    request_id = _text(g("request_id")) or replay_id
    session_id = _text(g("session_id"))
    if session_id is None and request_id is not None:
        session_id = fallback_session_id(request_id)
    turn = g("turn_index")
    state = _text(g("lifecycle_state")) or LifecycleState.UNKNOWN
    duration = g("duration_ms")
    diag = g("route_diagnostics")
    if isinstance(diag, str):
        try:
            diag = json.loads(diag)
        except ValueError:
            diag = None
    outcome = _winning_outcome(g("outcomes"))
    verdict = _text(outcome.get("verdict")) if outcome else None
    score = outcome.get("score") if outcome else None
    prompt = _text(g("prompt")) if keep_prompt else None
    row: dict[str, Any] = {
        L.VERSION: LEDGER_VERSION,
        L.REQUEST_ID: request_id,
        L.SESSION_ID: session_id,
        L.TURN_INDEX: 0 if turn is None else turn,
        L.TIMESTAMP: epoch_ms(g("timestamp")),
        L.PROMPT_TOKENS: g("prompt_tokens"),
        L.COMPLETION_TOKENS: g("completion_tokens"),
        L.LIFECYCLE_STATE: state,
        L.SELECTED_MODEL: _text(g("selected_model")),
        L.ENDED_AT: epoch_ms(g("ended_at")),
        L.DURATION_MS: duration if isinstance(duration, int) and duration > 0 else None,
        L.TERMINAL_REASON: _text(g("terminal_reason")),
        L.STREAMING: bool(g("streaming") or False),
        L.CACHED_PROMPT_TOKENS: g("cached_prompt_tokens"),
        L.DECISION: _text(g("decision")),
        L.CATEGORY: _text(g("category")),
        L.ORIGINAL_MODEL: _text(g("original_model")),
        L.ACTUAL_COST: _carried(g("actual_cost"), "float", True),
        L.CURRENCY: _text(g("currency")),
        L.OUTCOME_STATUS: (VERDICT_STATUS.get(verdict, OutcomeStatus.UNKNOWN)
                           if outcome is not None else None),
        L.OUTCOME_SCORE: score if isinstance(score, int | float) and score != 0 else None,
        L.PROMPT_TEXT: prompt,
    }
    for f in MAPPING:
        if f.kind == "carried":
            row[f.becomes] = _carried(g(f.key), f.type, f.key in _NULLABLE)
    if row["selection_method"] is None and isinstance(diag, dict):
        row["selection_method"] = _text(diag.get("selection_method"))
    row[OUTCOME_VERDICT] = verdict
    row[OUTCOME_SOURCE] = _text(outcome.get("source")) if outcome else None
    row[OUTCOMES] = _canonical_json(g("outcomes"))
    return row


def rows_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows of `record_to_row` as a frame with the same columns and dtypes for any chunk
    (so chunks concatenate, and a JSON and a table import give the same bytes). A value
    that does not fit its dtype is left in an object column for the contract to refuse."""
    cols = [*LEDGER_COLUMNS, *CARRIED]
    frame = pd.DataFrame.from_records(rows, columns=cols) if rows else \
        pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
    wanted = {**_LEDGER_DTYPES, **{c: _DTYPES[t] for c, t in CARRIED.items()}}
    for c, dtype in wanted.items():
        if dtype is object:
            frame[c] = frame[c].astype(object).where(frame[c].notna(), None)
            continue
        try:
            frame[c] = frame[c].astype(dtype)
        except (TypeError, ValueError):
            frame[c] = frame[c].astype(object)
    for c in (L.VERSION, L.REQUEST_ID, L.SESSION_ID, L.LIFECYCLE_STATE, L.SELECTED_MODEL,
              L.TERMINAL_REASON, L.DECISION, L.CATEGORY, L.ORIGINAL_MODEL, L.CURRENCY,
              L.OUTCOME_STATUS, L.PROMPT_TEXT):
        frame[c] = frame[c].astype(object).where(frame[c].notna(), None)
    return frame


# ---------------------------------------------------------------- reading records
def _records_of(obj: Any, where: str) -> list[dict]:
    if isinstance(obj, list):
        return [r for r in obj]
    if isinstance(obj, dict) and isinstance(obj.get("data"), list):
        return list(obj["data"])  # a list page of GET /v1/router_replay
    if isinstance(obj, dict):
        return [obj]
    raise RouterReplayError(f"{where}: not Router Replay records (a JSON array, an object "
                            "or a list page with `data`)")


def _iter_file(path: Path) -> Iterator[Any]:
    with open(path, encoding="utf-8") as fh:
        first = ""
        while True:
            ch = fh.read(1)
            if ch == "" or not ch.isspace():
                first = ch
                break
        fh.seek(0)
        if first == "[":
            try:
                yield from _records_of(json.load(fh), str(path))
            except json.JSONDecodeError as e:
                raise RouterReplayError(f"{path}: not JSON ({e.msg} at line {e.lineno})") \
                    from None
            return
        parsed_any = False
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                if n == 1 and first == "{":  # one pretty-printed object, not JSON Lines
                    fh.seek(0)
                    try:
                        yield from _records_of(json.load(fh), str(path))
                    except json.JSONDecodeError as e:
                        raise RouterReplayError(f"{path}: not JSON ({e.msg} at line "
                                                f"{e.lineno})") from None
                    return
                yield _Malformed(line[:2000])
                continue
            parsed_any = True
            yield from _records_of(obj, str(path)) if isinstance(obj, dict) and "data" in obj \
                else [obj]
        if not parsed_any and first == "":
            raise RouterReplayError(f"{path}: empty file")


@dataclass(frozen=True)
class _Malformed:
    line: str


def json_files(path: str | Path) -> list[Path]:
    """The files a path names: itself, or the Router Replay files of a folder (sorted)."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file()
                       and f.suffix.lower() in FILE_SUFFIXES)
        if not files:
            raise RouterReplayError(f"{p}: no {', '.join(FILE_SUFFIXES)} files in this folder")
        return files
    if not p.exists():
        raise RouterReplayError(f"{p}: no such file or folder")
    return [p]


def iter_json_records(path: str | Path) -> Iterator[Any]:
    """Every record of a file or folder, in file order (a line that is not JSON as a
    `_Malformed` marker, quarantined as `malformed_json`)."""
    for f in json_files(path):
        yield from _iter_file(f)


def _sql_ident(name: str) -> str:
    parts = name.split(".")
    if not all(p and p.replace("_", "a").isalnum() for p in parts) or len(parts) > 2:
        raise RouterReplayError(f"source.table={name!r}: not a table name ([schema.]name of "
                                "letters, digits and _)")
    return ".".join(f'"{p}"' for p in parts)


def iter_postgres_records(uri: str, table: str = DEFAULT_TABLE,
                          chunk_rows: int = CHUNK_ROWS) -> Iterator[dict]:
    """The rows of a Router Replay PostgreSQL table as dicts (column -> value; JSONB as
    Python values), through a server-side cursor, `chunk_rows` rows at a time, ordered by
    (`timestamp`, `id`)."""
    try:
        import psycopg
    except ImportError as e:
        raise ImportError("source.uri=postgresql://... needs psycopg: pip install "
                          "'replaylab[postgres]'") from e
    ident = _sql_ident(table)
    try:
        conn = psycopg.connect(uri)
    except psycopg.Error as e:
        raise RouterReplayError(f"source.uri: cannot connect ({str(e).strip().splitlines()[0]})"
                                ) from None
    with conn:
        try:
            with conn.cursor(name="replaylab_router_replay") as cur:
                cur.itersize = chunk_rows
                cur.execute(f"SELECT * FROM {ident} ORDER BY timestamp, id")  # noqa: S608
                names: list[str] | None = None
                while True:
                    batch = cur.fetchmany(chunk_rows)
                    if names is None and cur.description is not None:
                        names = [d.name for d in cur.description]
                    if not batch:
                        break
                    for values in batch:
                        yield dict(zip(names or [], values, strict=True))
        except psycopg.Error as e:
            raise RouterReplayError(f"source.table={table}: {str(e).strip().splitlines()[0]}"
                                    ) from None


# ---------------------------------------------------------------- chunks for the pipeline
@dataclass
class Chunk:
    """One chunk: its ledger rows (for the contract's validation) and the rows refused
    here (`REFUSED` reasons, and lines that are not JSON)."""

    rows: pd.DataFrame
    refused: pd.DataFrame


def _chunked(items: Iterable[Any], n: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for x in items:
        batch.append(x)
        if len(batch) >= n:
            yield batch
            batch = []
    if batch:
        yield batch


def router_replay_chunks(path: str | Path | None = None, *, uri: str | None = None,
                         table: str | None = None, keep_prompt: bool = False,
                         chunk_rows: int = CHUNK_ROWS) -> Iterator[Chunk]:
    """Router Replay records from a file or folder (`path`) or a PostgreSQL table (`uri`,
    `table`) as chunks of ledger-v1 rows, `chunk_rows` records at a time. Each row carries
    `source_row` (its 0-based position in the input as read). A record still
    `in_progress`, then a repeated record `id` (over the whole input) are refused here."""
    if (path is None) == (uri is None):
        raise RouterReplayError("source=router_replay needs source.path=FILE|DIR (a Router "
                                "Replay export) or source.uri=postgresql://... (with "
                                "source.table, default router_replay_records), not both")
    if chunk_rows < 1:
        raise RouterReplayError(f"source.chunk_rows={chunk_rows}: must be >= 1")
    records = (iter_json_records(path) if path is not None
               else iter_postgres_records(str(uri), table or DEFAULT_TABLE, chunk_rows))
    seen: set[str] = set()
    pos = 0
    for batch in _chunked(records, chunk_rows):
        rows, refused = [], []
        for rec in batch:
            if isinstance(rec, _Malformed) or not isinstance(rec, dict):
                refused.append({SOURCE_ROW: pos, "raw_line": rec.line if isinstance(
                    rec, _Malformed) else json.dumps(rec, default=str)[:2000],
                    QUARANTINE_REASON: "malformed_json" if isinstance(rec, _Malformed)
                    else "not_an_object", QUARANTINE_DETAIL: None})
                pos += 1
                continue
            row = record_to_row(rec, keep_prompt)
            row[SOURCE_ROW] = pos
            pos += 1
            rid = row[REPLAY_ID]
            if row[L.LIFECYCLE_STATE] == IN_PROGRESS:
                refused.append({**row, QUARANTINE_REASON: IN_PROGRESS,
                                QUARANTINE_DETAIL: f"{L.LIFECYCLE_STATE}='{IN_PROGRESS}'"})
            elif rid is not None and rid in seen:
                refused.append({**row, QUARANTINE_REASON: "duplicate_record_id",
                                QUARANTINE_DETAIL: f"id={rid!r}"[:200]})
            else:
                if rid is not None:
                    seen.add(rid)
                rows.append(row)
        frame = rows_frame(rows)
        frame[SOURCE_ROW] = pd.array([r[SOURCE_ROW] for r in rows], dtype="int64")
        yield Chunk(frame, pd.DataFrame(refused))


def import_router_replay(path: str | Path | None = None, *, uri: str | None = None,
                         table: str | None = None, keep_prompt: bool = False,
                         chunk_rows: int = CHUNK_ROWS) -> pd.DataFrame:
    """The whole input as one frame of ledger-v1 rows (what `import_source` returns), the
    refused rows left out and counted in `attrs["import_report"]`. The pipeline reads
    chunk by chunk instead (`router_replay_chunks`)."""
    frames, report = [], {"refused": {}}
    for chunk in router_replay_chunks(path, uri=uri, table=table, keep_prompt=keep_prompt,
                                      chunk_rows=chunk_rows):
        frames.append(chunk.rows.drop(columns=[SOURCE_ROW]))
        if len(chunk.refused):
            for reason, n in chunk.refused[QUARANTINE_REASON].value_counts().items():
                report["refused"][str(reason)] = report["refused"].get(str(reason), 0) + int(n)
    frame = pd.concat(frames, ignore_index=True) if frames else rows_frame([])
    frame.attrs["import_report"] = report
    return frame


# ---------------------------------------------------------------- what the ledger is ready for
@dataclass
class Readiness:
    """Counts over the valid rows, added chunk by chunk, and the line they make."""

    rows: int = 0
    completed: int = 0
    completed_with_usage: int = 0
    propensity: int = 0
    prompt_text: int = 0
    outcome_status: int = 0

    def add(self, valid: pd.DataFrame) -> None:
        def present(col: str) -> pd.Series:
            return valid[col].notna() if col in valid.columns else \
                pd.Series(False, index=valid.index)

        done = (valid[L.LIFECYCLE_STATE] == LifecycleState.COMPLETED) if len(valid) else \
            pd.Series(False, index=valid.index)
        self.rows += len(valid)
        self.completed += int(done.sum())
        usage = present(L.PROMPT_TOKENS) & present(L.COMPLETION_TOKENS)
        self.completed_with_usage += int((done & usage).sum())
        self.propensity += int(present(L.PROPENSITY).sum())
        self.prompt_text += int(present(L.PROMPT_TEXT).sum())
        self.outcome_status += int(present(L.OUTCOME_STATUS).sum())

    def summary(self) -> dict[str, Any]:
        share = self.completed_with_usage / self.completed if self.completed else None
        demand = (f"demand: usage on {share:.0%} of {self.completed} completed rows"
                  if share is not None else "demand: no completed rows (nothing to label)")
        router = (f"router from receipts: `propensity` on {self.propensity} rows"
                  if self.propensity else
                  "router from receipts: no `propensity` (Router Replay logs none): route "
                  "with `replaylab.runtime.SessionBinder` to log it"
                  ) + f" ({self.outcome_status} rows with `outcome_status`)"
        replays = (f"replays: `prompt_text` on {self.prompt_text} rows" if self.prompt_text
                   else "replays: no `prompt_text` (capture off, summary records, or "
                        "source.keep_prompt=false)")
        return {"rows": self.rows, "completed": self.completed,
                "completed_with_usage": self.completed_with_usage,
                "usage_share_completed": None if share is None else round(share, 4),
                "propensity_rows": self.propensity, "prompt_text_rows": self.prompt_text,
                "outcome_rows": self.outcome_status,
                "line": f"ready: {demand}; {router}; {replays}"}
