"""The synthetic ledger in independent chunks: one seeded draw per chunk, one Parquet file each.

A big ledger of R rows is cut into C = ceil(R / chunk_rows) chunks; chunk i holds
chunk_rows rows (the last one the rest). Each chunk is one draw of the generator
(sources/synthetic/generator.py `draw_ledger`, the same model and parameters) with
`n_requests` = its rows, from its own stream: `SeedSequence(seed).spawn(C)[i]`,
which is `SeedSequence(seed, spawn_key=(i,))`, so any process can draw chunk i
alone and the dataset does not depend on how many workers drew it or in which order.

- ids carry the chunk: `r{seed}-{chunk:05d}-{row:08d}`, `s{seed}-{chunk:05d}-{n:07d}`,
  binding `<session>/b0|b1`; rows and sessions are numbered in dispatch order
  within the chunk, so ids are unique across chunks (and seeds);
- time: chunk i starts at `start_ms + i * D`, D = chunk_rows / the steady request
  rate (session starts per second x mean turns per session), the nominal duration
  of a chunk; chunks cover consecutive time ranges, each its own export window (a ramp-up
  of first turns at its start, sessions cut at its end), with a gap or an overlap of
  a few percent of D between neighbours (docs/design/synthetic-ledger.md "Big ledgers");
- rows are rendered straight into Arrow, not through object arrays: ids from
  fixed-width bytes, enum-like columns as dictionary arrays of their codes (Parquet
  writes those codes as they are); the draw, this and the Parquet encoding are the
  whole cost of a chunk.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from replaylab.contracts.columns import Ledger as L
from replaylab.sources.defects import inject_defects
from replaylab.sources.synthetic.config import SyntheticLedgerConfig
from replaylab.sources.synthetic.frame import (
    ID_COLUMNS,
    Coded,
    LedgerColumns,
    NullableInt,
    ledger_columns,
)
from replaylab.sources.synthetic.generator import draw_ledger, steady_request_rate

MAX_CHUNK_ROWS = 10_000_000  # ids hold 8 digits of row and 7 of session per chunk
CHUNK_DIGITS = 5  # at least; more when there are more than 100,000 chunks
FILE_PATTERN = "part-{chunk:0{width}d}.parquet"
# Columns of (nearly) unique values: a dictionary would be dropped after its first page anyway.
_NO_DICTIONARY = (*ID_COLUMNS, L.TIMESTAMP, L.ENDED_AT, L.DURATION_MS, L.ACTUAL_COST,
                  L.PROPENSITY, L.OUTCOME_SCORE)


@dataclass(frozen=True)
class ChunkSpec:
    """What a worker needs to draw and write chunk `index` (small: it travels to the worker)."""

    cfg: SyntheticLedgerConfig  # the ledger's config; n_requests = the whole ledger's rows
    seed: int
    index: int
    n_chunks: int
    chunk_rows: int  # rows of every chunk but the last
    out_dir: str
    defect_rate: float = 0.0
    compression: str = "zstd"
    row_group_rows: int = 131_072

    @property
    def rows(self) -> int:
        total = int(self.cfg.n_requests or 0)
        return min(self.chunk_rows, total - self.index * self.chunk_rows)

    @property
    def width(self) -> int:
        return max(CHUNK_DIGITS, len(str(self.n_chunks - 1)))

    @property
    def path(self) -> Path:
        return Path(self.out_dir) / FILE_PATTERN.format(chunk=self.index, width=self.width)


def chunk_layout(rows: int, chunk_rows: int) -> list[int]:
    """Rows of each chunk: chunk_rows each, the last one the rest."""
    if rows < 1 or not 1 <= chunk_rows <= MAX_CHUNK_ROWS:
        raise ValueError(f"rows={rows}, chunk_rows={chunk_rows}: need rows >= 1 and "
                         f"1 <= chunk_rows <= {MAX_CHUNK_ROWS}")
    n = -(-rows // chunk_rows)
    return [chunk_rows] * (n - 1) + [rows - chunk_rows * (n - 1)]


def chunk_seed(seed: int, index: int) -> np.random.SeedSequence:
    """Chunk `index`'s stream: SeedSequence(seed).spawn(n)[index], for any n > index."""
    return np.random.SeedSequence(seed, spawn_key=(index,))


def chunk_duration_ms(cfg: SyntheticLedgerConfig, chunk_rows: int) -> int:
    """D: the nominal wall time of `chunk_rows` rows at the steady request rate, ms."""
    return int(round(1000.0 * chunk_rows / steady_request_rate(cfg, chunk_rows)))


# ---------------------------------------------------------------- Arrow rendering


def digits(values: np.ndarray, width: int) -> np.ndarray:
    """ASCII decimal digits of non-negative ints, zero-padded: uint8 (n, width)."""
    if values.size and (int(values.min()) < 0 or int(values.max()) >= 10**width):
        raise ValueError(f"values outside [0, 10**{width}): cannot write them in {width} digits")
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    return (values.astype(np.int64)[:, None] // powers % 10 + 48).astype(np.uint8)


def fixed_width_strings(prefix: str, digit_bytes: np.ndarray, suffixes: tuple[str, ...] = (),
                        which: np.ndarray | None = None) -> pa.Array:
    """`prefix + digits (+ suffixes[which])` per row, as an Arrow string array built from one
    byte buffer (every string has the same length; suffixes must share a length)."""
    n = digit_bytes.shape[0]
    head = np.frombuffer(prefix.encode("ascii"), dtype=np.uint8)
    parts = [np.broadcast_to(head, (n, head.size)), digit_bytes]
    if suffixes:
        parts.append(np.array([list(s.encode("ascii")) for s in suffixes], dtype=np.uint8)[which])
    buf = np.ascontiguousarray(np.concatenate(parts, axis=1))
    offsets = np.arange(n + 1, dtype=np.int32) * buf.shape[1]
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(buf.reshape(-1)))


def _arrow(col: np.ndarray | Coded | NullableInt) -> pa.Array:
    if isinstance(col, Coded):  # a dictionary column: Parquet writes its codes as they are
        none = np.array([v is None for v in col.values])
        codes = pa.array(col.codes.astype(np.int32), mask=none[col.codes] if none.any() else None)
        values = pa.array(["" if v is None else v for v in col.values], type=pa.string())
        return pa.DictionaryArray.from_arrays(codes, values)
    if isinstance(col, NullableInt):
        return pa.array(col.values.astype(np.int64), mask=col.null.astype(bool))
    return pa.array(col)


def decoded(table: pa.Table) -> pa.Table:
    """`table` with its dictionary columns as plain strings (what a reader of the file gets)."""
    return pa.table({f.name: table.column(f.name).cast(f.type.value_type)
                     if pa.types.is_dictionary(f.type) else table.column(f.name)
                     for f in table.schema}).replace_schema_metadata(table.schema.metadata)


def _pandas_metadata(table: pa.Table, nullable: list[str]) -> dict[bytes, bytes]:
    """The pandas metadata `DataFrame.to_parquet` writes, so that readers get the frame
    generate_synthetic_ledger makes (nullable ints as Int64, not float; strings as object)."""
    head = decoded(table.slice(0, 1000)).to_pandas()  # a few rows: the value kinds
    for name in nullable:
        head[name] = head[name].astype("Int64")
    return pa.Schema.from_pandas(head, preserve_index=False).metadata


def ledger_table(lc: LedgerColumns, seed: int, chunk: int, width: int = CHUNK_DIGITS) -> pa.Table:
    """The ledger-v1 Arrow table of one chunk's columns, ids prefixed by seed and chunk."""
    n = lc.session.size
    tag = f"{seed}-{chunk:0{width}d}-"
    session = digits(lc.session, 7)
    ids = {L.REQUEST_ID: fixed_width_strings(f"r{tag}", digits(np.arange(n), 8)),
           L.SESSION_ID: fixed_width_strings(f"s{tag}", session),
           L.BINDING_ID: fixed_width_strings(f"s{tag}", session, ("/b0", "/b1"), lc.binding)}
    arrays = {k: ids[k] if v is None else _arrow(v) for k, v in lc.columns.items()}
    table = pa.table(arrays)
    nullable = [k for k, v in lc.columns.items() if isinstance(v, NullableInt)]
    return table.replace_schema_metadata(_pandas_metadata(table, nullable))


def draw_chunk(spec: ChunkSpec) -> tuple[pa.Table, int, dict[str, int]]:
    """Chunk `spec.index` as an Arrow table (dispatch order, times shifted to its slot), its
    sessions, and the defects injected into it ({reason: rows}; empty when defect_rate is 0)."""
    # drawn on its slot's clock (start_ms + offset), so a daily / weekly profile of session
    # starts (`start_rate`) follows the wall clock across chunks
    offset = spec.index * chunk_duration_ms(spec.cfg, spec.chunk_rows)
    cfg = dataclasses.replace(spec.cfg, n_requests=spec.rows, start_ms=spec.cfg.start_ms + offset)
    ss = chunk_seed(spec.seed, spec.index)
    draw_rng, defect_ss = (np.random.default_rng(s) for s in ss.spawn(2))
    d = draw_ledger(cfg, draw_rng)
    lc = ledger_columns(cfg, d)
    table = ledger_table(lc, spec.seed, spec.index, spec.width)
    if spec.defect_rate <= 0:
        return table, lc.n_sessions, {}
    frame, intended = inject_defects(decoded(table).to_pandas(), rate=spec.defect_rate,
                                     seed=int(defect_ss.integers(2**31)))
    return pa.Table.from_pandas(frame, preserve_index=False), lc.n_sessions, intended


def write_chunk(spec: ChunkSpec) -> dict:
    """Draw chunk `spec.index` and write it to `spec.path` (atomically: a temporary name,
    then a rename). Returns its facts: rows, sessions, bytes, first and last dispatch,
    seconds (wall and CPU of this process), defects. Runs in a worker; the caller never holds the rows."""
    t0, c0 = time.perf_counter(), time.process_time()
    table, sessions, defects = draw_chunk(spec)
    path = spec.path
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    names = table.column_names
    # store_schema=False: the file holds no Arrow schema, so readers see the dictionary
    # columns as the plain strings they are (not categoricals); the pandas metadata (Int64
    # for the nullable ints) is added back by hand, as that flag drops it too
    with pq.ParquetWriter(tmp, table.schema, compression=spec.compression,
                          use_dictionary=[c for c in names if c not in _NO_DICTIONARY],
                          write_statistics=[c for c in names if c not in ID_COLUMNS],
                          store_schema=False) as writer:
        writer.write_table(table, row_group_size=spec.row_group_rows)
        writer.add_key_value_metadata(dict(table.schema.metadata or {}))
    os.replace(tmp, path)
    ts = table.column(L.TIMESTAMP)
    return {"chunk": spec.index, "file": path.name, "rows": table.num_rows,
            "sessions": sessions, "bytes": path.stat().st_size,
            "first_ms": int(pc.min(ts).as_py()), "last_ms": int(pc.max(ts).as_py()),
            "seconds": round(time.perf_counter() - t0, 3),
            "cpu_seconds": round(time.process_time() - c0, 3), "defects": defects}
