"""pipeline=synthesize: the big synthetic ledger in seeded chunks, written in parallel.

Small sizes: 20,000 rows in chunks of 6,000 (four files, the last one 2,000 rows).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pytest

from replaylab.apps.verdicts import verdict_line
from replaylab.compute import ComputeConfig, LocalEngine, engine
from replaylab.config import ConfigError
from replaylab.contracts import read_ledger, validate_ledger
from replaylab.contracts.columns import Ledger as L
from replaylab.pipelines.synthesize import MANIFEST, SynthesizeConfig, synthesize_ledger
from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger
from replaylab.sources.synthetic.chunks import (
    chunk_duration_ms,
    chunk_layout,
    chunk_seed,
    decoded,
    ledger_table,
)
from replaylab.sources.synthetic.frame import ID_COLUMNS, ledger_columns
from replaylab.sources.synthetic.generator import draw_ledger
from tests.conftest import REPO

ROWS, CHUNK = 20_000, 6_000
CFG = SyntheticLedgerConfig(n_requests=ROWS)


def _write(out: Path, workers: int = 2, engine=None, defect_rate: float = 0.0,
           **options) -> dict:
    opts = SynthesizeConfig(chunk_rows=CHUNK, workers=workers, progress=False, **options)
    return synthesize_ledger(CFG, 3, out, opts, defect_rate=defect_rate, engine=engine)


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("part-*.parquet"))}


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("synth2")
    return out, _write(out, workers=2)


@pytest.fixture(scope="module")
def ledger(two_workers) -> pd.DataFrame:
    return ds.dataset(two_workers[0], format="parquet").to_table().to_pandas()


def test_layout_and_seeds():
    assert chunk_layout(ROWS, CHUNK) == [6000, 6000, 6000, 2000]
    assert chunk_layout(10, 10) == [10]
    with pytest.raises(ValueError):
        chunk_layout(0, 10)
    # chunk i's stream is the i-th child of SeedSequence(seed).spawn(n), for any n > i
    for n in (4, 9):
        kids = np.random.SeedSequence(3).spawn(n)
        for i in range(4):
            assert (kids[i].generate_state(4) == chunk_seed(3, i).generate_state(4)).all()


def test_same_files_for_one_and_two_workers(two_workers, tmp_path):
    out2, s2 = two_workers
    s1 = _write(tmp_path / "one", workers=1)
    assert _files(tmp_path / "one") == _files(out2)
    assert len(_files(out2)) == 4
    assert s1["rows"] == s2["rows"] == ROWS and s1["bytes"] == s2["bytes"]


def test_rows_ids_and_contract(two_workers, ledger):
    out, s = two_workers
    assert len(ledger) == ROWS == s["rows"]
    assert ledger[L.REQUEST_ID].is_unique
    chunk_of = ledger[L.REQUEST_ID].str.split("-").str[1]
    assert chunk_of.nunique() == 4
    # a session lives in one chunk: its id carries that chunk
    assert (ledger[L.SESSION_ID].str.split("-").str[1] == chunk_of).all()
    assert ledger[L.SESSION_ID].nunique() == s["sessions"]
    assert (ledger[L.BINDING_ID].str.rsplit("/", n=1).str[0] == ledger[L.SESSION_ID]).all()
    assert validate_ledger(ledger).rows_quarantined == 0
    one = read_ledger(sorted(out.glob("part-*.parquet"))[1])  # each file is a ledger-v1 file
    assert one.rows_read == CHUNK and one.rows_quarantined == 0
    # readers get the generator's frame types: nullable ints, strings (not categoricals)
    raw = pd.read_parquet(sorted(out.glob("part-*.parquet"))[1])
    assert str(raw[L.COMPLETION_TOKENS].dtype) == "Int64" and raw[L.CATEGORY].dtype == object
    assert ledger[L.FINISH_REASON].dtype == object


def test_chunks_cover_consecutive_time_ranges(two_workers):
    out, s = two_workers
    chunks = json.loads((out / MANIFEST).read_text())["chunks"]
    d = chunk_duration_ms(CFG, CHUNK)
    for i, c in enumerate(chunks):
        assert c["chunk"] == i and c["first_ms"] >= CFG.start_ms + i * d
        assert c["last_ms"] < CFG.start_ms + (i + 1.5) * d
    frame = pd.read_parquet(out / chunks[0]["file"])
    assert frame[L.TIMESTAMP].is_monotonic_increasing  # dispatch order inside a file
    assert s["time_window_ms"]["first"] == chunks[0]["first_ms"]


def test_a_chunk_is_the_generator_s_draw():
    """Same stream, same model: the chunk's columns are generate_synthetic_ledger's
    (ids apart), so the distribution is the existing generator's."""
    cfg = SyntheticLedgerConfig(n_requests=3000)
    table = ledger_table(ledger_columns(cfg, draw_ledger(cfg, np.random.default_rng(7))), 7, 0)
    mine = decoded(table).to_pandas()
    ref = generate_synthetic_ledger(cfg, seed=7)
    assert list(mine.columns) == list(ref.columns)
    rest = [c for c in ref.columns if c not in ID_COLUMNS]
    pd.testing.assert_frame_equal(mine[rest], ref[rest])
    for c in ID_COLUMNS:  # the same numbering, with the chunk in the prefix
        assert (mine[c].str.replace("7-00000-", "7-", regex=False) == ref[c]).all()


def test_defects_are_counted(tmp_path):
    s = _write(tmp_path / "bad", workers=1, defect_rate=0.01)
    frame = ds.dataset(tmp_path / "bad", format="parquet").to_table().to_pandas()
    r = validate_ledger(frame)
    assert sum(s["defects"].values()) == 3 * 60 + 20 == r.rows_quarantined  # 1% of each chunk
    assert r.by_reason() == s["defects"]
    assert verdict_line(s).endswith("; 200 rows with injected defects")


def test_summary_verdict_and_refusals(two_workers, tmp_path):
    out, s = two_workers
    assert s["files"] == 4 and s["bytes"] == sum(len(b) for b in _files(out).values())
    assert s["rows_per_s"] > 0 and s["seconds"] > 0 and s["bytes_per_million_rows"] > 0
    line = verdict_line(s)
    assert line.startswith(f"synthesize: {ROWS} rows in 4 files (") and line.endswith(f"-> {out}")
    with pytest.raises(ConfigError, match="already holds a ledger"):
        _write(out)
    with pytest.raises(ConfigError, match="n_requests"):
        synthesize_ledger(SyntheticLedgerConfig(), 0, tmp_path / "x")
    with pytest.raises(ValueError, match="chunk_rows"):
        SynthesizeConfig(chunk_rows=0)


def test_dask_reads_the_folder(two_workers):
    import dask.dataframe as dd

    frame = dd.read_parquet(two_workers[0])
    assert frame.npartitions >= 4 and len(frame) == ROWS


@pytest.mark.slow
@pytest.mark.integration
def test_dask_workers_write_the_same_files(two_workers, tmp_path, dask_address):
    with engine(ComputeConfig(kind="dask", address=dask_address)) as eng:
        s = _write(tmp_path / "dask", engine=eng)
    assert s["workers"] == {"kind": "dask", "n": None}
    assert _files(tmp_path / "dask") == _files(two_workers[0])
    # the local engine's chunks are this process's pool of `workers`
    s = _write(tmp_path / "local", workers=2, engine=LocalEngine())
    assert s["workers"] == {"kind": "local", "n": 2}
    assert _files(tmp_path / "local") == _files(two_workers[0])


@pytest.mark.slow
def test_entry_point(tmp_path):
    out, run = tmp_path / "ledger", tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "training", "pipeline=synthesize", f"out={out}",
         f"data.synthetic.n_requests={ROWS}", f"synthesize.chunk_rows={CHUNK}",
         f"hydra.run.dir={run}", "tracking=off"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rows"] == ROWS and summary["files"] == 4
    assert summary["compute"] == {"kind": "local"} and summary["workers"]["kind"] == "local"
    assert proc.stdout.strip().splitlines()[-1] == summary["verdict"]
    assert summary["verdict"].startswith(f"synthesize: {ROWS} rows in 4 files")
    proc = subprocess.run(
        [sys.executable, "-m", "training", "pipeline=synthesize", f"out={out}",
         f"hydra.run.dir={run}", "tracking=off"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "already holds a ledger" in proc.stderr
