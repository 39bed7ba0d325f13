"""Fuzzing the contract readers (ledger, outcomes, aggregates) and the manifest parser.

Whatever a file holds (random bytes, wrong types, NaN / Infinity, 1e308, 2**80 and
10**400 as JSON integers, 100,000 nested arrays, a 100 MB line) a reader either
raises its documented error (`ContractError` for a file that is not the contract
at all, `ManifestError` with a reason code for an artifact manifest) or returns
the rows split into valid and quarantined ones with
rows_read == rows_valid + rows_quarantined. Never another exception (a
RecursionError, OverflowError, TypeError, pyarrow's own) and never a hang: every
test is bounded by a timeout, the 100 MB cases run in a subprocess with one.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
import tempfile
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from replaylab.contracts import (
    AGGREGATES_SCHEMA,
    LEDGER_SCHEMA,
    OUTCOMES_SCHEMA,
    ContractError,
    read_aggregates,
    read_ledger,
    read_outcomes,
    write_quarantine,
)
from replaylab.contracts.manifest import (
    REASON_CODES,
    ManifestError,
    build_manifest,
    canonical_json,
    content_hash,
    verify_manifest,
    write_manifest,
)

# 60 examples a test keeps the file under a minute; REPLAYLAB_FUZZ_EXAMPLES=5000 digs deeper
# (each example is bounded by the deadline, each test by TIMEOUT seconds).
EXAMPLES = int(os.environ.get("REPLAYLAB_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=timedelta(seconds=5),
                suppress_health_check=[HealthCheck.too_slow])
TIMEOUT = max(60, EXAMPLES)

GOOD_LEDGER = {"ledger_version": "1", "request_id": "r0", "session_id": "s0", "turn_index": 0,
               "timestamp": 1_700_000_000_000, "prompt_tokens": 10, "completion_tokens": 20,
               "lifecycle_state": "completed", "selected_model": "m"}
GOOD_OUTCOMES = {"outcomes_version": "1", "prompt_id": "p0", "prompt_text": "hi", "task": "t",
                 "candidate": "c", "score": 0.5, "success": True}
GOOD_AGGREGATES = {"aggregates_version": "1", "bucket_start": 1_700_000_000_000,
                   "bucket_seconds": 60, "archetype": "a", "taxonomy_version": "1",
                   "slo_class": "s", "region": "r", "requests": 3}

READERS = {"ledger": (read_ledger, LEDGER_SCHEMA, GOOD_LEDGER),
           "outcomes": (read_outcomes, OUTCOMES_SCHEMA, GOOD_OUTCOMES),
           "aggregates": (read_aggregates, AGGREGATES_SCHEMA, GOOD_AGGREGATES)}

# JSON integers a double cannot hold, or int64 cannot, or that are 400 digits long
HUGE_INTS = [2**62, 2**63 - 1, 2**63, 2**64, 2**80, -(2**80), 10**400, -(10**400)]
ODD_FLOATS = [math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, 0.5, -0.0, 1e19]

json_scalars = (st.none() | st.booleans() | st.integers() | st.sampled_from(HUGE_INTS)
                | st.floats() | st.sampled_from(ODD_FLOATS) | st.text(max_size=12)
                | st.sampled_from(["", "1", "2024-05-01T00:00:00Z", "9999-99-99", "NaN",
                                   "completed", "\ud800", "0" * 30]))
json_values = st.recursive(json_scalars,
                           lambda c: st.lists(c, max_size=3)
                           | st.dictionaries(st.text(max_size=4), c, max_size=3),
                           max_leaves=6)


def _dumps(obj: object) -> str:
    # NaN / Infinity as Python writes them (JSON Lines files in the wild hold them);
    # lone surrogates stay as \\ud800 escapes
    return json.dumps(obj, allow_nan=True)


def _outcome(read, path: Path) -> str:
    """Read `path`; the only allowed outcomes are ContractError or a consistent split."""
    try:
        result = read(path)
    except ContractError as exc:
        assert str(exc).startswith(str(path)), exc  # the one-line message names the file
        return "error"
    assert result.rows_read == result.rows_valid + result.rows_quarantined
    assert result.rows_read > 0
    summary = result.summary()
    assert sum(summary["quarantine_by_reason"].values()) == result.rows_quarantined
    if result.rows_quarantined:
        out = write_quarantine(result, path.with_name(path.name + ".quarantine.jsonl"))
        assert sum(1 for _ in out.open(encoding="utf-8")) == result.rows_quarantined
    return "read"


def _manifest_outcome(folder: Path, **kw) -> str:
    kw.setdefault("now", T0 + timedelta(days=1))
    try:
        verify_manifest(folder, **kw)
    except ManifestError as exc:
        assert exc.reason in REASON_CODES, exc.reason
        return exc.reason
    return "ok"


@pytest.fixture
def tmp():
    with tempfile.TemporaryDirectory(prefix="fuzz-") as d:
        yield Path(d)


def _tmpdir() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="fuzz-")


# ---------------------------------------------------------------- random bytes


@pytest.mark.timeout(TIMEOUT)
@FUZZ
@given(data=st.binary(max_size=400), suffix=st.sampled_from([".jsonl", ".parquet", ".csv", ""]),
       head=st.sampled_from([b"", b"PAR1", b"{", b"\xef\xbb\xbf"]),
       reader=st.sampled_from(sorted(READERS)))
def test_random_bytes(data, suffix, head, reader):
    with _tmpdir() as d:
        path = Path(d) / f"f{suffix}"
        path.write_bytes(head + data + (b"PAR1" if head == b"PAR1" else b""))
        read = READERS[reader][0]
        _outcome(read, path)


# ---------------------------------------------------------------- JSON Lines


def _records(contract: str):
    _, schema, good = READERS[contract]
    names = [f.name for f in schema.fields] + ["extra", "source_row", "quarantine_reason"]
    override = st.dictionaries(st.sampled_from(names), json_values, max_size=4)
    drop = st.sets(st.sampled_from(sorted(good)), max_size=2)
    return st.builds(lambda o, dr: {k: v for k, v in {**good, **o}.items() if k not in dr},
                     override, drop)


def _lines(contract: str):
    garbage = st.sampled_from(["", "   ", "{", "[1, 2]", "null", '"x"', "NaN", "{}",
                               '{"a": 1, "a": 2}', "1" * 5000, "[" * 5000, "\x00"])
    record = _records(contract).map(_dumps)
    return st.lists(st.one_of(record, record, record, garbage), min_size=1, max_size=8)


@pytest.mark.timeout(TIMEOUT)
@FUZZ
@given(lines=_lines("ledger"))
@example(lines=[_dumps({**GOOD_LEDGER, "prompt_tokens": 2**80})])
@example(lines=[_dumps({**GOOD_LEDGER, "timestamp": 2**80})])
@example(lines=[_dumps({**GOOD_LEDGER, "turn_index": 2**63})])  # a uint64 column
@example(lines=[_dumps({**GOOD_LEDGER, "actual_cost": 10**400})])
@example(lines=[_dumps(GOOD_LEDGER), '{"turn_index": ' + "9" * 5000 + "}"])
@example(lines=[_dumps({**GOOD_LEDGER, "actual_cost": 1e308, "propensity": math.nan,
                        "hint_p50": math.inf})])
@example(lines=["\ufeff" + _dumps(GOOD_LEDGER)])
def test_ledger_jsonl(lines):
    with _tmpdir() as d:
        path = Path(d) / "ledger.jsonl"
        path.write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
        _outcome(read_ledger, path)


@pytest.mark.timeout(TIMEOUT)
@FUZZ
@given(lines=_lines("outcomes"))
@example(lines=[_dumps({**GOOD_OUTCOMES, "prompt_tokens": 2**80, "score": 10**400})])
@example(lines=[_dumps({**GOOD_OUTCOMES, "score": math.nan, "cost": math.inf})])
@example(lines=[_dumps({**GOOD_OUTCOMES, "prompt_id": 2**80})])
def test_outcomes_jsonl(lines):
    with _tmpdir() as d:
        path = Path(d) / "outcomes.jsonl"
        path.write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
        _outcome(read_outcomes, path)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("contract", ["ledger", "outcomes"])
def test_deeply_nested_json(tmp, contract):
    read, _, good = READERS[contract]
    deep = "[" * 100_000 + "]" * 100_000
    deep_obj = '{"a":' * 100_000 + "1" + "}" * 100_000
    path = tmp / "deep.jsonl"
    path.write_text("\n".join([_dumps(good), deep, deep_obj,
                               _dumps(good)[:-1] + ', "extra": ' + deep + "}"]))
    result = read(path)
    assert result.rows_read == 4 and result.rows_valid == 1 and result.rows_quarantined == 3
    assert result.by_reason() == {"malformed_json": 3}
    path.write_text(deep)
    with pytest.raises(ContractError, match="not JSON Lines"):
        read(path)


@pytest.mark.timeout(60)
def test_jsonl_crashes_found_are_quarantines(tmp):
    """The crashes this fuzzing found, each now one quarantined row (its reason)."""
    rows = [
        (GOOD_LEDGER, None),
        ({**GOOD_LEDGER, "prompt_tokens": 2**80}, "bad_type"),  # was OverflowError
        ({**GOOD_LEDGER, "timestamp": 2**80}, "bad_timestamp"),  # was OverflowError
        ({**GOOD_LEDGER, "actual_cost": 2**1000}, None),  # a double; was TypeError (isfinite)
        # was OverflowError in pandas; now malformed_json when pandas cannot build the
        # column, bad_type when it can (here: next to 2**1000, an object column)
        ({**GOOD_LEDGER, "actual_cost": 10**400}, "bad_type"),
        ({**GOOD_LEDGER, "session_id": "\ud800"}, "malformed_json"),  # was UnicodeEncodeError
        ({**GOOD_LEDGER, "hint_p50": 1e308}, None),
        # alone in its column: uint64, was TypeError (uint64 -> Int64)
        ({**GOOD_LEDGER, "hint_age_ms": 2**63}, "bad_type"),
    ]
    lines = [_dumps({**rec, "request_id": f"r{i}"}) for i, (rec, _) in enumerate(rows)]
    lines.append('{"turn_index": ' + "9" * 5000 + "}")  # was ValueError (4300 digits)
    path = tmp / "ledger.jsonl"
    path.write_text("\ufeff" + "\n".join(lines))  # a byte order mark: not a bad line 0
    result = read_ledger(path)
    assert result.rows_read == len(lines)
    assert result.valid["request_id"].tolist() == ["r0", "r3", "r6"]
    assert result.valid["hint_age_ms"].isna().all()
    assert result.valid["actual_cost"][1] == float(2**1000)
    got = dict(zip(result.quarantine["source_row"], result.quarantine["quarantine_reason"],
                   strict=True))
    want = {i: reason for i, (_, reason) in enumerate(rows) if reason}
    assert got == {**want, len(rows): "malformed_json"}
    path.write_text(_dumps({**GOOD_LEDGER, "actual_cost": 10**400}) + "\n"
                    + _dumps({**GOOD_LEDGER, "request_id": "r1", "actual_cost": 1.5}))
    result = read_ledger(path)
    assert result.valid["request_id"].tolist() == ["r1"]
    assert result.quarantine["quarantine_reason"].tolist() == ["malformed_json"]
    assert result.quarantine["quarantine_detail"].tolist() == [
        "integer beyond a double's range: actual_cost"]
    out = write_quarantine(result, tmp / "q.jsonl")
    assert len(out.read_text(encoding="utf-8").splitlines()) == result.rows_quarantined


@pytest.mark.timeout(60)
def test_parquet_crashes_found_are_quarantines(tmp):
    ts = pa.array([1_700_000_000_000, 9_223_372_036_854, None], pa.int64()).cast(
        pa.timestamp("ms", tz="UTC"))  # past 2262: was OutOfBoundsDatetime (via ns)
    table = pa.table({**{k: [v] * 3 for k, v in GOOD_LEDGER.items() if k != "timestamp"},
                      "request_id": ["a", "b", "c"], "timestamp": ts,
                      "extra": pa.array([b"\xff", b"", None], pa.binary())})
    pq.write_table(table, tmp / "l.parquet")
    result = read_ledger(tmp / "l.parquet")
    assert result.rows_valid == 1 and result.by_reason() == {
        "bad_timestamp": 1, "missing_required_field": 1}
    # uint64 past int64: was TypeError (uint64 -> Int64)
    pq.write_table(pa.table({**{k: [v] * 2 for k, v in GOOD_LEDGER.items()},
                             "request_id": ["a", "b"],
                             "duration_ms": pa.array([5, 2**64 - 1], pa.uint64())}),
                   tmp / "u.parquet")
    u = read_ledger(tmp / "u.parquet")
    assert u.valid["duration_ms"].tolist() == [5] and u.by_reason() == {"bad_type": 1}
    # binary that is not UTF-8 in a quarantined row: was UnicodeDecodeError in pandas' writer
    out = write_quarantine(result, tmp / "q.jsonl")
    assert [json.loads(line)["request_id"] for line in out.open()] == ["b", "c"]


@pytest.mark.timeout(60)
def test_csv_one_bad_cell_quarantines_its_row_only(tmp):
    path = tmp / "agg.csv"
    rows = [{**GOOD_AGGREGATES, "archetype": f"a{i}"} for i in range(3)]
    rows[1]["requests"] = "many"
    rows[2]["rate_cv"] = "1e400"
    pd.DataFrame(rows).to_csv(path, index=False)
    result = read_aggregates(path)
    assert result.valid["archetype"].tolist() == ["a0"]
    assert result.valid["requests"].tolist() == [3]
    assert result.by_reason() == {"bad_type": 2}


# ---------------------------------------------------------------- Parquet

_N = 3
_ARROW = {  # arrow type -> strategy for one value of it
    "int64": (pa.int64(), st.none() | st.integers(-(2**63), 2**63 - 1)),
    "uint64": (pa.uint64(), st.none() | st.integers(0, 2**64 - 1)),
    "int8": (pa.int8(), st.none() | st.integers(-128, 127)),
    "float64": (pa.float64(), st.none() | st.floats() | st.sampled_from(ODD_FLOATS)),
    "float32": (pa.float32(), st.none() | st.floats(width=32)),
    "string": (pa.string(), st.none() | st.text(max_size=6)
               | st.sampled_from(["1", "2024-05-01T00:00:00Z", "completed", "9" * 30])),
    "large_string": (pa.large_string(), st.none() | st.text(max_size=6)),
    "bool": (pa.bool_(), st.none() | st.booleans()),
    "binary": (pa.binary(), st.none() | st.binary(max_size=6)),
    "ts_ms_utc": (pa.timestamp("ms", tz="UTC"),
                  st.none() | st.integers(-(2**62), 2**62)),
    "ts_s": (pa.timestamp("s"), st.none() | st.integers(-(2**40), 2**40)),
    "date32": (pa.date32(), st.none() | st.integers(-(2**30), 2**30)),
    "decimal": (pa.decimal128(38, 0), st.none() | st.decimals(
        min_value=-(10**37), max_value=10**37, places=0, allow_nan=False)),
    "list_int": (pa.list_(pa.int64()), st.none() | st.lists(st.integers(-5, 5), max_size=3)),
    "list_float": (pa.list_(pa.float64()), st.none() | st.lists(st.floats(), max_size=3)),
    "struct": (pa.struct([("a", pa.int64())]),
               st.none() | st.builds(lambda a: {"a": a}, st.integers(-5, 5))),
    "null": (pa.null(), st.none()),
    "duration": (pa.duration("ms"), st.none() | st.integers(-(2**40), 2**40)),
}


_VIA = {"ts_s": pa.int64(), "ts_ms_utc": pa.int64(), "duration": pa.int64(),
        "date32": pa.int32()}  # built from integers, then cast


def _arrow_column(kind: str):
    typ, value = _ARROW[kind]
    via = _VIA.get(kind)
    return st.lists(value, min_size=_N, max_size=_N).map(
        lambda vals: pa.array(vals, type=typ) if via is None
        else pa.array(vals, type=via).cast(typ))


def _parquet_tables(contract: str):
    _, schema, good = READERS[contract]
    good_cols = {k: pa.array([v] * _N) for k, v in good.items()}
    # keep the version column valid most of the time, so the rows reach the coercers
    names = [f.name for f in schema.fields] + ["extra"]
    override = st.dictionaries(st.sampled_from(names),
                               st.sampled_from(sorted(_ARROW)).flatmap(_arrow_column),
                               max_size=5)
    return override.map(lambda o: pa.table({**good_cols, **o}))


@pytest.mark.timeout(TIMEOUT)
@FUZZ
@given(contract=st.sampled_from(sorted(READERS)), data=st.data())
def test_parquet_wrong_types(contract, data):
    table = data.draw(_parquet_tables(contract))
    with _tmpdir() as d:
        path = Path(d) / "f.parquet"
        pq.write_table(table, path)
        _outcome(READERS[contract][0], path)


@pytest.mark.timeout(TIMEOUT)
@FUZZ
@given(contract=st.sampled_from(sorted(READERS)), cut=st.integers(0, 10_000),
       flip=st.integers(0, 10_000))
def test_parquet_truncated_or_flipped(contract, cut, flip):
    _, _, good = READERS[contract]
    with _tmpdir() as d:
        path = Path(d) / "f.parquet"
        pq.write_table(pa.table({k: [v] * 5 for k, v in good.items()}), path)
        data = bytearray(path.read_bytes())
        data[flip % len(data)] ^= 0xFF
        path.write_bytes(bytes(data[: len(data) - cut % len(data)]))
        _outcome(READERS[contract][0], path)


# ---------------------------------------------------------------- CSV (aggregates)

csv_cells = (st.text(max_size=8) | st.sampled_from(
    ["", "NaN", "inf", "-inf", "1e308", "1e400", str(2**80), "9" * 400, "True", "null",
     "2024-05-01T00:00:00Z", '"', '""', "\r", "a,b", "1.5", "-1", "0x10"]))


@pytest.mark.timeout(TIMEOUT)
@FUZZ
@given(overrides=st.dictionaries(st.sampled_from([f.name for f in AGGREGATES_SCHEMA.fields]),
                                 st.lists(csv_cells, min_size=2, max_size=2), max_size=5),
       junk=st.lists(st.text(max_size=20), max_size=2))
def test_aggregates_csv(overrides, junk):
    cols = {k: [str(v)] * 2 for k, v in GOOD_AGGREGATES.items()}
    cols.update(overrides)
    with _tmpdir() as d:
        path = Path(d) / "agg.csv"
        pd.DataFrame(cols).to_csv(path, index=False)
        with path.open("a", encoding="utf-8", errors="surrogatepass", newline="") as f:
            for line in junk:
                f.write(line + "\n")
        _outcome(read_aggregates, path)


# ---------------------------------------------------------------- the manifest parser

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
KEY = b"fuzz-key"


def _artifact(folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(b"model-bytes")
    (folder / "sub").mkdir(exist_ok=True)
    (folder / "sub" / "vocab.json").write_text("{}")
    return build_manifest(folder, kind="demand", version="1.2.3", contracts={"ledger": "1"},
                          valid_days=30, features=[{"name": "x", "dtype": "float64"}],
                          outputs={"quantiles": [0.5, 0.9]}, calibration={"g": 0.25},
                          training={"rows": 1}, runtime={"opset": 21},
                          fallback={"name": "median"}, created=T0)


MANIFEST_KEYS = ["schema_version", "kind", "version", "content_hash", "created_at",
                 "valid_until", "contracts", "features", "outputs", "calibration", "training",
                 "runtime", "fallback", "files", "signature", "extra"]
FILE_KEYS = ["path", "sha256", "size"]
manifest_scalars = json_scalars | st.sampled_from(
    ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "2024-05-01T12:00:00",
     "2024-05-01T12:00:00Z", "é", "../x", "/etc/passwd", "a" * 5000, "a/" * 3000 + "b",
     "sub", "sub/", "model.onnx\n", "0" * 64, "0" * 64 + "\n", "sha256:é", "hmac-sha256:é"])
manifest_values = st.recursive(manifest_scalars,
                               lambda c: st.lists(c, max_size=3)
                               | st.dictionaries(st.sampled_from(FILE_KEYS) | st.text(max_size=3),
                                                 c, max_size=3),
                               max_leaves=6)


@st.composite
def manifest_edits(draw):
    """(edits to the top level, edits to files[0], reseal the content_hash, sign)."""
    top = draw(st.dictionaries(st.sampled_from(MANIFEST_KEYS), manifest_values, max_size=3))
    entry = draw(st.dictionaries(st.sampled_from(FILE_KEYS), manifest_values, max_size=2))
    return top, entry, draw(st.booleans()), draw(st.booleans())


def _write_raw_manifest(folder: Path, manifest: dict, sign: bool) -> None:
    body = {k: v for k, v in manifest.items() if k != "signature"}
    if sign:
        try:
            write_manifest(folder, body, hmac_key=KEY)
            return
        except (ValueError, TypeError):  # not canonical-encodable: write it anyway, unsigned
            pass
    (folder / "manifest.json").write_text(_dumps(manifest), encoding="utf-8",
                                          errors="surrogatepass")


@pytest.mark.timeout(TIMEOUT)
@FUZZ
@given(edits=manifest_edits(), key=st.sampled_from([None, KEY]))
def test_manifest_edits(edits, key):
    top, entry, reseal, sign = edits
    with _tmpdir() as d:
        folder = Path(d) / "a"
        m = copy.deepcopy(_artifact(folder))
        m.update(top)
        if entry and isinstance(m.get("files"), list) and m["files"]:
            if isinstance(m["files"][0], dict):
                m["files"][0].update(entry)
        if reseal:
            try:
                m["content_hash"] = content_hash(m)
            except (KeyError, ValueError, TypeError):
                pass
        _write_raw_manifest(folder, m, sign)
        _manifest_outcome(folder, hmac_key=key)


@pytest.mark.timeout(TIMEOUT)
@FUZZ
@given(data=st.binary(max_size=300),
       head=st.sampled_from([b"", b"{", b'{"schema_version": "1", ', b"\xef\xbb\xbf{"]))
def test_manifest_random_bytes(data, head):
    with _tmpdir() as d:
        folder = Path(d)
        (folder / "manifest.json").write_bytes(head + data)
        assert _manifest_outcome(folder) in ("unreadable", "invalid_json", "schema_version",
                                             "malformed")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("text, reason", [
    ("[" * 100_000 + "]" * 100_000, "invalid_json"),
    ('{"a":' * 100_000 + "1" + "}" * 100_000, "invalid_json"),
    ('{"schema_version": "1", "x": 1e400}', "invalid_json"),
    ('{"schema_version": "1", "x": -1e400}', "invalid_json"),
    ('{"schema_version": "1", "x": ' + "9" * 5000 + "}", "invalid_json"),
    ('{"schema_version": "1", "x": "\\ud800"}', "invalid_json"),
    ('{"schema_version": "1", "x": NaN}', "invalid_json"),
])
def test_manifest_hostile_json(tmp, text, reason):
    (tmp / "manifest.json").write_text(text)
    assert _manifest_outcome(tmp) == reason


@pytest.mark.timeout(60)
@pytest.mark.parametrize("edit, reason", [
    ({"valid_until": "0001-01-01T00:00:00+14:00"}, "malformed"),
    ({"created_at": "9999-12-31T23:59:59-14:00"}, "malformed"),
    ({"signature": "hmac-sha256:é"}, "bad_signature"),
    ({"content_hash": "sha256:é"}, "content_hash"),
    ({"files": [{"path": "a" * 5000, "sha256": "0" * 64, "size": 1}]}, "not_a_file"),
    ({"files": [{"path": "a/" * 3000 + "b", "sha256": "0" * 64, "size": 1}]}, "not_a_file"),
    ({"files": [{"path": "model.onnx", "sha256": "0" * 64 + "\n", "size": 11}]}, "malformed"),
    ({"files": [{"path": "model.onnx", "sha256": "é" * 64, "size": 11}]}, "malformed"),
    ({"files": [{"path": "model.onnx", "sha256": "0" * 64, "size": 2**80}]}, "size_mismatch"),
    ({"files": [{"path": "model.onnx", "sha256": "0" * 64, "size": 11.0}]}, "malformed"),
])
def test_manifest_hostile_fields(tmp, edit, reason):
    """Sealed and signed edits, so that each reaches the check it is aimed at."""
    folder = tmp / "a"
    m = {**_artifact(folder), **edit}
    if "content_hash" not in edit:
        m["content_hash"] = content_hash(m)
    write_manifest(folder, m, hmac_key=KEY)
    if "signature" in edit:
        raw = json.loads((folder / "manifest.json").read_text())
        raw["signature"] = edit["signature"]
        (folder / "manifest.json").write_bytes(canonical_json(raw))
    assert _manifest_outcome(folder, hmac_key=KEY) == reason


@pytest.mark.timeout(60)
def test_manifest_symlink_loop(tmp):
    folder = tmp / "a"
    m = _artifact(folder)
    os.symlink("y", folder / "x")
    os.symlink("x", folder / "y")
    m["files"].append({"path": "x", "sha256": "0" * 64, "size": 1})
    m["content_hash"] = content_hash(m)
    write_manifest(folder, m)
    assert _manifest_outcome(folder) == "not_a_file"


# ---------------------------------------------------------------- 100 MB lines

_BIG = 100 * 1024 * 1024

_SUBPROCESS = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from replaylab.contracts.manifest import ManifestError, verify_manifest
    from replaylab.contracts import ContractError, read_aggregates, read_ledger, read_outcomes
    kind, path = sys.argv[1], Path(sys.argv[2])
    try:
        if kind == "manifest":
            verify_manifest(path)
            print(json.dumps({"outcome": "ok"}))
        else:
            read = {"ledger": read_ledger, "outcomes": read_outcomes,
                    "aggregates": read_aggregates}[kind]
            r = read(path)
            assert r.rows_read == r.rows_valid + r.rows_quarantined
            print(json.dumps({"outcome": "read", "valid": r.rows_valid,
                              "quarantined": r.by_reason()}))
    except ContractError as exc:
        print(json.dumps({"outcome": "ContractError", "message": str(exc)[:300]}))
    except ManifestError as exc:
        print(json.dumps({"outcome": "ManifestError", "reason": exc.reason}))
""")


def _run_big(kind: str, path: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", _SUBPROCESS, kind, str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _write_big_line(path: Path, before: str, chunk: str, after: str) -> None:
    with path.open("w", encoding="utf-8") as f:
        f.write(before)
        for _ in range(_BIG // len(chunk)):
            f.write(chunk)
        f.write(after)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("contract", ["ledger", "outcomes"])
@pytest.mark.parametrize("line", ["string", "garbage", "nested", "digits"])
def test_100mb_jsonl_line(tmp, contract, line):
    _, _, good = READERS[contract]
    path = tmp / "big.jsonl"
    head = _dumps(good) + "\n"
    if line == "string":  # a valid record whose prompt_text is 100 MB
        rec = _dumps({**good, "request_id" if contract == "ledger" else "prompt_id": "big"})
        _write_big_line(path, head + rec[:-1] + ', "prompt_text": "', "x" * 4096, '"}\n')
        assert _run_big(contract, path) == {"outcome": "read", "valid": 2, "quarantined": {}}
        return
    chunk = {"garbage": "x" * 4096, "nested": "[" * 4096, "digits": "9" * 4096}[line]
    _write_big_line(path, head, chunk, "\n")
    assert _run_big(contract, path) == {"outcome": "read", "valid": 1,
                                        "quarantined": {"malformed_json": 1}}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_100mb_csv_line(tmp):
    """A 100 MB region cell (text): read like any other; a 100 MB count: quarantined."""
    path = tmp / "big.csv"
    header = ",".join(GOOD_AGGREGATES) + "\n"
    row = ",".join(str(v) for v in GOOD_AGGREGATES.values()) + "\n"
    before, after = row.replace(",r,", ",\0,").split("\0")
    _write_big_line(path, header + row + before, "x" * 4096, after)
    assert _run_big("aggregates", path) == {"outcome": "read", "valid": 2, "quarantined": {}}
    _write_big_line(path, header + row + row[: -len("3\n")], "9" * 4096, "\n")
    assert _run_big("aggregates", path) == {"outcome": "read", "valid": 1,
                                            "quarantined": {"bad_type": 1}}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_100mb_parquet_cell(tmp):
    path = tmp / "big.parquet"
    rec = {**GOOD_OUTCOMES, "prompt_text": "x" * _BIG}
    pq.write_table(pa.table({k: [v] for k, v in rec.items()}), path)
    del rec
    assert _run_big("outcomes", path) == {"outcome": "read", "valid": 1, "quarantined": {}}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("chunk", ["x" * 4096, "[" * 4096, " " * 4096])
def test_100mb_manifest(tmp, chunk):
    _write_big_line(tmp / "manifest.json", '{"schema_version": "1", "x": ', chunk, "1}")
    assert _run_big("manifest", tmp) == {"outcome": "ManifestError", "reason": "unreadable"}
