"""Ledgers as datasets (compute/ledger.py): the same seeded ledger as one Parquet file,
a hive-partitioned Parquet dataset and three JSON Lines files, read per partition on a
LocalCluster of 2 processes and in local blocks, against the pandas path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from replaylab.compute.ledger import (
    SOURCE_FILE,
    accounting_of,
    ledger_paths,
    read_ledger_blocks,
    read_ledger_dask,
)
from replaylab.contracts import ContractError, read_ledger, validate_ledger
from replaylab.contracts.columns import QUARANTINE_DETAIL, QUARANTINE_REASON, SOURCE_ROW
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.io import read_raw, write_table
from replaylab.contracts.ledger import LEDGER_SCHEMA
from replaylab.contracts.schema import validate_frame
from replaylab.sources.defects import inject_defects
from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger

DATES = ("2026-12-01", "2026-12-02", "2026-12-03")
MALFORMED = '{"ledger_version": "1", "request_id": "broken"'  # planted in the 2nd JSONL file


@pytest.fixture(scope="module")
def ledger() -> tuple[pd.DataFrame, str]:
    """2,400 synthetic rows, 2% defects, and one duplicate id planted across thirds."""
    frame = generate_synthetic_ledger(SyntheticLedgerConfig(n_requests=2400), seed=11)
    frame, _ = inject_defects(frame, rate=0.02, seed=11)
    ok = set(validate_ledger(frame).valid[L.REQUEST_ID])
    third = len(frame) // 3
    a = next(i for i in range(third) if frame.at[i, L.REQUEST_ID] in ok)
    b = next(i for i in range(2 * third + 5, len(frame)) if frame.at[i, L.REQUEST_ID] in ok)
    frame.at[b, L.REQUEST_ID] = frame.at[a, L.REQUEST_ID]
    return frame, frame.at[a, L.REQUEST_ID]


def _thirds(frame: pd.DataFrame) -> list[pd.DataFrame]:
    third = len(frame) // 3
    return [frame.iloc[:third], frame.iloc[third:2 * third], frame.iloc[2 * third:]]


@pytest.fixture(scope="module")
def layouts(ledger, tmp_path_factory) -> dict[str, dict]:
    frame, _ = ledger
    root = tmp_path_factory.mktemp("layouts")
    single = write_table(frame, root / "single" / "ledger.parquet")
    hive_files = []
    for date, part in zip(DATES, _thirds(frame), strict=True):
        hive_files.append(write_table(part.reset_index(drop=True),
                                      root / "hive" / f"date={date}" / "part-0.parquet"))
    (root / "hive" / "_SUCCESS").write_text("")
    jsonl_files = []
    for i, part in enumerate(_thirds(frame)):
        path = write_table(part.reset_index(drop=True), root / "jsonl" / f"ledger-{i}.jsonl")
        if i == 1:
            lines = path.read_text().splitlines(keepends=True)
            lines.insert(17, MALFORMED + "\n")
            lines.insert(30, "\n")
            path.write_text("".join(lines))
        jsonl_files.append(path)
    return {
        "parquet": {"spec": str(single), "files": [single], "hive": [{}]},
        "hive": {"spec": str(root / "hive"), "files": hive_files,
                 "hive": [{"date": d} for d in DATES]},
        "jsonl": {"spec": str(root / "jsonl" / "*.jsonl"), "files": jsonl_files,
                  "hive": [{}, {}, {}]},
    }


def _reference(layout: dict) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """The pandas path on the concatenated rows of the files (in order): (valid, quarantine
    keyed by file/row, by_reason)."""
    raws, bads = [], []
    for path, hive in zip(layout["files"], layout["hive"], strict=True):
        raw, bad = read_raw(path, ("parquet", "jsonl"))
        if SOURCE_ROW not in raw.columns:
            raw[SOURCE_ROW] = np.arange(len(raw), dtype="int64")
        for k, v in hive.items():
            raw[k] = pd.Series(v, index=raw.index, dtype=object)
        raws.append(raw.assign(**{SOURCE_FILE: str(path)}))
        if len(bad):
            bads.append(bad.assign(**{SOURCE_FILE: str(path)}))
    res = validate_frame(pd.concat(raws, ignore_index=True), LEDGER_SCHEMA, source="ref",
                         pre_quarantined=pd.concat(bads, ignore_index=True) if bads else None)
    return res.valid.drop(columns=[SOURCE_FILE]), res.quarantine, res.by_reason()


def _keys(q: pd.DataFrame) -> list[tuple]:
    return sorted(zip(q[SOURCE_FILE].astype(str), q[SOURCE_ROW].astype(int),
                      q[QUARANTINE_REASON], q[QUARANTINE_DETAIL], strict=True))


def _same_valid(got: pd.DataFrame, want: pd.DataFrame) -> None:
    got = got.sort_values(L.REQUEST_ID, ignore_index=True)
    want = want.sort_values(L.REQUEST_ID, ignore_index=True)
    absent = [c for c in got.columns if c not in want.columns]
    assert all(got[c].isna().all() for c in absent), absent  # JSONL: absent contract columns
    pd.testing.assert_frame_equal(got[list(want.columns)], want)


def test_reference_is_the_pandas_path(ledger, layouts):
    """The reference equals read_ledger of the one file holding every row."""
    frame, dup = ledger
    single = read_ledger(layouts["parquet"]["spec"])
    valid, quarantine, by_reason = _reference(layouts["hive"])
    _same_valid(valid.drop(columns=["date"]), single.valid)
    assert by_reason == single.by_reason()
    assert by_reason["duplicate_request_id"] >= 2
    assert (quarantine[L.REQUEST_ID] == dup).sum() == 1  # the planted one, in the 3rd third


def test_ledger_paths_layouts_and_errors(layouts, tmp_path):
    hive = ledger_paths(layouts["hive"]["spec"])
    assert hive.format == "parquet" and len(hive.paths) == 3  # _SUCCESS skipped
    assert ledger_paths(layouts["jsonl"]["spec"]).format == "jsonl"
    assert len(ledger_paths(str(Path(layouts["jsonl"]["spec"]).parent)).paths) == 3
    assert ledger_paths("file://" + layouts["parquet"]["spec"]).paths[0].endswith(
        "ledger.parquet")
    with pytest.raises(ContractError, match="no such file"):
        ledger_paths(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ContractError, match="no ledger files"):
        ledger_paths(tmp_path / "empty")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for f in (layouts["parquet"]["files"][0], layouts["jsonl"]["files"][0]):
        (mixed / f.name).write_bytes(f.read_bytes())
    with pytest.raises(ContractError, match="mixes Parquet and JSON Lines"):
        ledger_paths(mixed)
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "a.csv").write_text("a\n1\n")
    with pytest.raises(ContractError, match="neither Parquet nor JSON Lines"):
        ledger_paths(tmp_path / "csv")


@pytest.mark.parametrize("name", ["parquet", "hive", "jsonl"])
@pytest.mark.parametrize("rows", [97, 10_000])
def test_blocks_equal_the_pandas_path(layouts, ledger, name, rows):
    layout = layouts[name]
    want_valid, want_q, want_reasons = _reference(layout)
    blocks = list(read_ledger_blocks(layout["spec"], rows_per_block=rows))
    assert all(b.rows_read == b.rows_valid + b.rows_quarantined for b in blocks)
    acc = accounting_of(blocks)
    assert acc.rows_read == acc.rows_valid + acc.rows_quarantined == len(want_valid) + len(want_q)
    assert acc.by_reason == want_reasons
    if name == "jsonl":
        assert acc.by_reason["malformed_json"] == 1
    _same_valid(pd.concat([b.valid for b in blocks], ignore_index=True), want_valid)
    got_q = pd.concat([b.quarantine.assign(**{SOURCE_FILE: b.source}) for b in blocks],
                      ignore_index=True)
    assert _keys(got_q) == _keys(want_q)
    dup = ledger[1]
    assert got_q.loc[got_q[L.REQUEST_ID] == dup, QUARANTINE_REASON].tolist() == [
        "duplicate_request_id"]


def test_blocks_bounded_by_rows_per_block(layouts):
    sizes = [b.rows_read for b in read_ledger_blocks(layouts["jsonl"]["spec"], 50)]
    assert max(sizes) <= 50 and len(sizes) >= 48


@pytest.fixture(scope="module")
def client():
    from dask.distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as c:
        yield c


@pytest.mark.slow
@pytest.mark.parametrize("name,blocksize", [("parquet", "64MiB"), ("hive", "64MiB"),
                                            ("jsonl", 40_000)])
def test_dask_equals_the_pandas_path(client, layouts, ledger, tmp_path, name, blocksize):
    import dask

    layout = layouts[name]
    want_valid, want_q, want_reasons = _reference(layout)
    ds = read_ledger_dask(layout["spec"], blocksize=blocksize)
    if name == "jsonl":
        assert ds.npartitions > 3  # files cut in blocks
    acc = ds.write_quarantine(str(tmp_path / "q"))
    assert acc.rows_read == acc.rows_valid + acc.rows_quarantined == len(want_valid) + len(want_q)
    assert acc.by_reason == want_reasons
    assert acc == ds.accounting()
    with dask.config.set({"dataframe.convert-string": False}):
        valid = ds.valid.compute()
    _same_valid(valid, want_valid)
    files = sorted((tmp_path / "q").glob("part-*.parquet"))
    assert len(files) == ds.npartitions  # one per partition, empty ones too
    got_q = pd.read_parquet(tmp_path / "q")
    assert _keys(got_q) == _keys(want_q)
    assert got_q.loc[got_q[L.REQUEST_ID] == ledger[1], QUARANTINE_REASON].tolist() == [
        "duplicate_request_id"]
    assert got_q["record"].notna().all()
