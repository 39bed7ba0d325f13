"""Router Replay records for the tests, written from the JSON keys of vLLM Semantic Router's
`store.Record` (src/semantic-router/pkg/routerreplay/store/store.go at commit
3d48f8c9cc0d5b15067ce324a03ec6cc25f192c3), and a throwaway PostgreSQL server holding them in
the table layout of its PostgreSQL backend (store/postgres.go's documented columns).

Records are hand-written facts of the schema: what the router writes (Go's `omitempty`:
a false, 0 or "" field is left out; usage and cost are pointers, left out when unknown).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

T0 = dt.datetime(2026, 8, 3, 9, 0, 0, tzinfo=dt.UTC)


def rfc3339(t: dt.datetime) -> str:
    """Go's RFC3339Nano as encoding/json writes a UTC time.Time (trailing zeros trimmed)."""
    s = t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    frac = f"{t.microsecond:06d}".rstrip("0")
    return s + (f".{frac}" if frac else "") + "Z"


def record(n: int, *, at: dt.datetime | None = None, state: str = "completed",
           **fields: Any) -> dict[str, Any]:
    """A full record (capture on) of a completed, non-streaming chat turn; `fields`
    override or add keys (a value None removes the key, as omitempty would)."""
    at = at or T0 + dt.timedelta(seconds=7 * n, microseconds=1234 * n)
    rec: dict[str, Any] = {
        "id": f"rr-{n:05d}",
        "timestamp": rfc3339(at),
        "request_id": f"req-{n:05d}",
        "session_id": f"sess-{n // 3:04d}",
        "turn_index": n % 3,
        "recipe": "default",
        "decision": "math_route" if n % 2 else "general_route",
        "decision_tier": 1,
        "decision_priority": 10,
        "category": "math" if n % 2 else "other",
        "original_model": "auto",
        "selected_model": "qwen3-8b" if n % 2 else "llama-3.1-70b",
        "confidence_score": 0.82,
        "selection_method": "static",
        "route_diagnostics": {"decision": "math_route" if n % 2 else "general_route",
                              "selection_method": "static", "selected_model":
                              "qwen3-8b" if n % 2 else "llama-3.1-70b",
                              "original_model": "auto"},
        "signals": {"domain": ["math" if n % 2 else "other"], "keyword": ["solve"]},
        "projections": ["latency_sensitive"],
        "projection_scores": {"latency_sensitive": 0.4},
        "signal_confidences": {"domain:math": 0.91},
        "request_body": json.dumps({"model": "auto", "messages": [
            {"role": "user", "content": f"question {n}"}]}),
        "response_body": json.dumps({"choices": [{"message": {"content": f"answer {n}"}}]}),
        "response_status": 200,
        "lifecycle_state": state,
        "ended_at": rfc3339(at + dt.timedelta(milliseconds=850 + 10 * n)),
        "duration_ms": 850 + 10 * n,
        "terminal_reason": "response_complete",
        "guardrails_enabled": True,
        "prompt": f"question {n}: what is {n} + {n}?",
        "rag_similarity_score": 0.85,
        "cache_similarity": 0.3,
        "context_token_count": 40 + n,
        "prompt_tokens": 40 + n,
        "completion_tokens": 120 + 3 * n,
        "total_tokens": 160 + 4 * n,
        "actual_cost": 0.000123 * (n + 1),
        "baseline_cost": 0.0004 * (n + 1),
        "cost_savings": 0.0004 * (n + 1) - 0.000123 * (n + 1),
        "currency": "USD",
        "baseline_model": "gpt-4o",
    }
    for k, v in fields.items():
        if v is None:
            rec.pop(k, None)
        else:
            rec[k] = v
    return rec


def outcome(verdict: str, source: str = "user", score: float | None = None,
            at: dt.datetime | None = None) -> dict[str, Any]:
    o: dict[str, Any] = {"timestamp": rfc3339(at or T0), "source": source, "target": "model",
                         "verdict": verdict}
    if score:
        o["score"] = score
    return o


def no_usage(rec: dict[str, Any]) -> dict[str, Any]:
    for k in ("prompt_tokens", "cached_prompt_tokens", "completion_tokens", "total_tokens",
              "actual_cost", "baseline_cost", "cost_savings", "currency", "baseline_model"):
        rec.pop(k, None)
    return rec


def summary_record(rec: dict[str, Any]) -> dict[str, Any]:
    """What GET /v1/router_replay lists (list_summary_record.go): prompt, bodies, tool
    definitions and the projection trace blanked (left out by omitempty)."""
    out = dict(rec)
    for k in ("request_body", "response_body", "prompt", "tool_definitions", "projection_trace"):
        out.pop(k, None)
    return out


def fixture_records() -> list[dict[str, Any]]:
    """Every lifecycle state and outcome shape: complete, streaming with cached tokens,
    aborted, failed, in progress, several outcomes, one outcome with a score, usage
    absent, a summary record, a record without a session (and one without a request id),
    a duplicated record id, the same request exported twice (in progress, then done)."""
    r = [record(i) for i in range(14)]
    r[1].update(streaming=True, cached_prompt_tokens=32)
    r[2].update(lifecycle_state="aborted", terminal_reason="client_canceled",
                completion_tokens=17, duration_ms=300,
                ended_at=rfc3339(T0 + dt.timedelta(seconds=14, milliseconds=300)))
    r[3].update(lifecycle_state="failed", terminal_reason="upstream_error_response",
                response_status=502)
    no_usage(r[3])
    r[4] = record(4, state="in_progress", terminal_reason=None, ended_at=None, duration_ms=None)
    no_usage(r[4])
    r[5]["outcomes"] = [outcome("underpowered", "user"), outcome("good_fit", "eval", 0.9),
                        outcome("failed", "operator")]
    r[6]["outcomes"] = [outcome("good_fit", "eval", 0.75)]
    no_usage(r[7])
    r[8] = summary_record(r[8])
    r[9].pop("session_id")
    r[10].pop("session_id")
    r[10].pop("request_id")
    r[11]["outcomes"] = [outcome("overprovisioned", "router")]
    r[12].update(lifecycle_state="", terminal_reason=None)  # an old record: no lifecycle yet
    dup = dict(r[0], prompt_tokens=999)  # the same record id again
    # request 13 exported while running, then again when done: the finished copy is kept
    running = record(13, state="in_progress", terminal_reason=None, ended_at=None,
                     duration_ms=None)
    no_usage(running)
    return [*r[:13], dup, running, r[13]]


def synthetic_records(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """`n` records in sessions of 1-6 turns over ~2 days, from `record`, seeded: enough
    for pipeline=demand. Token counts depend on the category (a learnable signal);
    8% aborted, 3% failed, 5% with usage absent."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    t = T0
    i = 0
    sess = 0
    cats = [("math", "qwen3-8b", 60, 220), ("code", "llama-3.1-70b", 200, 600),
            ("chat", "qwen3-8b", 30, 90), ("rag", "llama-3.1-70b", 900, 150)]
    while i < n:
        turns = rng.randint(1, 6)
        cat, model, p0, c0 = rng.choice(cats)
        start = t
        prompt = int(p0 * rng.lognormvariate(0, 0.3))
        for k in range(turns):
            if i >= n:
                break
            comp = max(1, int(c0 * rng.lognormvariate(0, 0.5)))
            dur = int(20 * comp + rng.randint(50, 400))
            at = start + dt.timedelta(milliseconds=rng.randint(0, 999), microseconds=
                                      rng.randint(0, 999))
            rec = record(i, at=at, session_id=f"s{seed}-{sess:05d}", turn_index=k,
                         category=cat, selected_model=model, decision=f"{cat}_route",
                         prompt_tokens=prompt, completion_tokens=comp,
                         total_tokens=prompt + comp, duration_ms=dur,
                         ended_at=rfc3339(at + dt.timedelta(milliseconds=dur)),
                         actual_cost=round((prompt + 4 * comp) * 1e-6, 9),
                         prompt=f"{cat} question {i}")
            u = rng.random()
            if u < 0.08:
                rec.update(lifecycle_state="aborted", terminal_reason="client_canceled",
                           completion_tokens=max(1, comp // 3))
            elif u < 0.11:
                rec.update(lifecycle_state="failed", terminal_reason="upstream_error_response")
                no_usage(rec)
            elif u < 0.16:
                no_usage(rec)
            out.append(rec)
            i += 1
            prompt += comp + int(p0 * rng.lognormvariate(0, 0.3))
            start = at + dt.timedelta(milliseconds=dur + rng.randint(2000, 60000))
        sess += 1
        t += dt.timedelta(seconds=rng.expovariate(1 / 300))
    return out


# ---------------------------------------------------------------- the PostgreSQL backend
# The backend's table, from postgres.go's documented columns (name, SQL type), in its
# CREATE TABLE order followed by the columns its migrations add.
PG_COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "VARCHAR(255) PRIMARY KEY"), ("timestamp", "TIMESTAMP NOT NULL"),
    ("request_id", "VARCHAR(255)"), ("recipe", "TEXT"), ("decision", "VARCHAR(255)"),
    ("decision_tier", "INTEGER DEFAULT 0"), ("decision_priority", "INTEGER DEFAULT 0"),
    ("category", "VARCHAR(255)"), ("original_model", "VARCHAR(255)"),
    ("selected_model", "VARCHAR(255)"), ("reasoning_mode", "VARCHAR(255)"),
    ("signals", "JSONB"), ("projections", "JSONB"), ("projection_scores", "JSONB"),
    ("signal_confidences", "JSONB"), ("signal_values", "JSONB"), ("tool_trace", "JSONB"),
    ("projection_trace", "JSONB"), ("session_policy", "JSONB"), ("route_diagnostics", "JSONB"),
    ("learning", "JSONB"), ("outcomes", "JSONB"), ("request_body", "TEXT"),
    ("response_body", "TEXT"), ("response_status", "INTEGER"),
    ("lifecycle_state", "VARCHAR(32) NOT NULL DEFAULT 'unknown'"), ("ended_at", "TIMESTAMP"),
    ("duration_ms", "BIGINT DEFAULT 0"), ("terminal_reason", "TEXT"),
    ("from_cache", "BOOLEAN DEFAULT FALSE"), ("streaming", "BOOLEAN DEFAULT FALSE"),
    ("request_body_truncated", "BOOLEAN DEFAULT FALSE"),
    ("response_body_truncated", "BOOLEAN DEFAULT FALSE"),
    ("guardrails_enabled", "BOOLEAN DEFAULT FALSE"), ("jailbreak_enabled", "BOOLEAN DEFAULT FALSE"),
    ("pii_enabled", "BOOLEAN DEFAULT FALSE"), ("prompt", "TEXT"),
    ("prompt_truncated", "BOOLEAN DEFAULT FALSE"), ("tool_definitions", "TEXT"),
    ("tool_definitions_truncated", "BOOLEAN DEFAULT FALSE"), ("rag_enabled", "BOOLEAN DEFAULT FALSE"),
    ("rag_backend", "VARCHAR(255)"), ("rag_context_length", "INTEGER DEFAULT 0"),
    ("rag_similarity_score", "REAL DEFAULT 0"), ("hallucination_enabled", "BOOLEAN DEFAULT FALSE"),
    ("hallucination_detected", "BOOLEAN DEFAULT FALSE"),
    ("hallucination_confidence", "REAL DEFAULT 0"), ("hallucination_spans", "JSONB"),
    ("prompt_tokens", "INTEGER"), ("cached_prompt_tokens", "INTEGER"),
    ("cache_write_tokens", "INTEGER"), ("completion_tokens", "INTEGER"),
    ("total_tokens", "INTEGER"), ("actual_cost", "DOUBLE PRECISION"),
    ("baseline_cost", "DOUBLE PRECISION"), ("cost_savings", "DOUBLE PRECISION"),
    ("currency", "VARCHAR(32)"), ("baseline_model", "VARCHAR(255)"),
    ("created_at", "TIMESTAMP DEFAULT NOW()"),
    # added by the backend's ALTER TABLE ... ADD COLUMN IF NOT EXISTS
    ("session_id", "VARCHAR(255)"), ("turn_index", "INTEGER"),
    ("previous_response_id", "VARCHAR(255)"), ("conversation_id", "VARCHAR(255)"),
    ("cache_similarity", "REAL DEFAULT 0"), ("context_token_count", "INTEGER DEFAULT 0"),
    ("hallucination_span_details", "JSONB"),
)
PG_STORED = tuple(c for c, _ in PG_COLUMNS if c != "created_at")
# columns the backend writes as SQL NULL when empty (emptyStringSQL) or when the pointer is nil
_NULL_WHEN_EMPTY = {"session_id", "previous_response_id", "conversation_id", "recipe"}
_JSON = {c for c, t in PG_COLUMNS if t == "JSONB"}
_ALWAYS_MARSHALLED = {"signals": {}, "projections": None, "projection_scores": None,
                      "signal_confidences": None, "signal_values": None,
                      "hallucination_spans": None, "hallucination_span_details": None}
_DEFAULT = {c: (False if "BOOLEAN" in t else 0 if ("INTEGER" in t or "BIGINT" in t or
                                                   "REAL" in t) else "")
            for c, t in PG_COLUMNS}


def create_table_sql(table: str) -> str:
    cols = ",\n  ".join(f"{c} {t}" for c, t in PG_COLUMNS)
    return f"CREATE TABLE {table} (\n  {cols}\n)"


def _go_time(s: str | None) -> dt.datetime | None:
    if not s:
        return None
    return dt.datetime.fromisoformat(s.replace("Z", "+00:00")).astimezone(dt.UTC).replace(
        tzinfo=None)


def postgres_row(rec: dict[str, Any]) -> dict[str, Any]:
    """The values the backend's INSERT writes for `rec` (postgres_record_row.go args()):
    a scalar as Go holds it (its zero value when left out), usage and cost NULL when
    absent, the nested fields as JSON (`signals` always an object), times zone-less UTC."""
    row: dict[str, Any] = {}
    for c in PG_STORED:
        v = rec.get(c)
        if c in _JSON:
            v = v if v is not None else _ALWAYS_MARSHALLED.get(c)
            row[c] = None if v is None else json.dumps(v)
        elif c in ("timestamp", "ended_at"):
            row[c] = _go_time(v)
        elif c in ("prompt_tokens", "cached_prompt_tokens", "cache_write_tokens",
                   "completion_tokens", "total_tokens", "actual_cost", "baseline_cost",
                   "cost_savings", "currency", "baseline_model"):
            row[c] = v
        elif c in _NULL_WHEN_EMPTY:
            row[c] = v or None
        elif c == "lifecycle_state":
            row[c] = v or "in_progress"  # preparePostgresInsertRecord's default
        else:
            row[c] = _DEFAULT[c] if v is None else v
    return row


def as_read_from_postgres(rec: dict[str, Any]) -> dict[str, Any]:
    """The record as a PostgreSQL-backed router returns it from its API: only the fields
    the table stores, with omitempty's zero values left out."""
    out = {}
    for c in ("id", "timestamp", *PG_STORED[2:]):
        if c in rec and rec[c] not in (None, "", False, 0, {}, []):
            out[c] = rec[c]
    out["turn_index"] = rec.get("turn_index", 0)
    out["decision_tier"] = rec.get("decision_tier", 0)
    out["decision_priority"] = rec.get("decision_priority", 0)
    out["lifecycle_state"] = rec.get("lifecycle_state") or "in_progress"
    out["signals"] = rec.get("signals") or {}
    return out


def postgres_binaries() -> Path | None:
    """The folder of initdb/pg_ctl/postgres (Debian's postgresql package), or None."""
    for cand in ([os.environ["REPLAYLAB_PG_BIN"]] if os.environ.get("REPLAYLAB_PG_BIN") else []) \
            + sorted(map(str, Path("/usr/lib/postgresql").glob("*/bin")), reverse=True):
        if (Path(cand) / "initdb").exists() and (Path(cand) / "postgres").exists():
            return Path(cand)
    found = shutil.which("initdb")
    if found and shutil.which("postgres"):
        return Path(found).resolve().parent
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def postgres_server() -> Iterator[str]:
    """A PostgreSQL server on loopback in a temporary folder, for the length of the block:
    yields its URI (`postgresql://replay@127.0.0.1:PORT/postgres`, trust auth on loopback).
    As root it runs as the `postgres` user (the server refuses root). Stopped on exit."""
    bin_dir = postgres_binaries()
    assert bin_dir is not None
    as_user: list[str] = []
    tmp = Path(tempfile.mkdtemp(prefix="replaylab-pg-"))
    if os.geteuid() == 0:
        import pwd

        user = pwd.getpwnam("postgres")
        os.chown(tmp, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = tmp / "data", _free_port()
    env = {**os.environ, "LC_ALL": "C", "TZ": "UTC"}

    def run(*args: str) -> None:
        subprocess.run([*as_user, *args], check=True, capture_output=True, env=env, cwd=tmp)

    run(str(bin_dir / "initdb"), "-D", str(data), "-U", "replay", "--auth=trust", "-E", "UTF8")
    run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(tmp / "log"), "-w", "-t", "60",
        "-o", f"-h 127.0.0.1 -p {port} -k {tmp} -c fsync=off -c timezone=UTC", "start")
    try:
        yield f"postgresql://replay@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate",
                        "-w", "stop"], capture_output=True, env=env, cwd=tmp)
        time.sleep(0.1)
        shutil.rmtree(tmp, ignore_errors=True)


def load_table(uri: str, table: str, records: list[dict[str, Any]]) -> None:
    """Create the backend's table and insert `records` as the backend writes them."""
    import psycopg

    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(create_table_sql(table))
        cols = ", ".join(PG_STORED)
        marks = ", ".join(["%s"] * len(PG_STORED))
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {table} ({cols}) VALUES ({marks})",
                            [tuple(postgres_row(r)[c] for c in PG_STORED) for r in records])
