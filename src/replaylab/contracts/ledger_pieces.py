"""A ledger dataset's pieces: cut its files into pieces, read one piece, validate it.

A piece is a run of Parquet row groups or a byte block of a JSON Lines file cut at line
ends; each is read (`read_piece`: raw rows with their row or line number in the file,
hive partition keys as columns) and validated by the pandas rules (`validate_piece`) on
its own. `replaylab.compute.ledger` drives them: on Dask one task per piece, locally
one block at a time, and it applies the duplicate rule across pieces. `files` below is
that module's `LedgerFiles` (the files of a spec, in reading order).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from replaylab.contracts.columns import SOURCE_ROW
from replaylab.contracts.io import jsonl_frame, parse_jsonl_lines
from replaylab.contracts.ledger import LEDGER_SCHEMA
from replaylab.contracts.schema import ContractError, ValidationResult, validate_frame


def hive_values(files: Any) -> list[dict[str, str | None]]:
    """Hive partition values of each file (`key=value` folders under the root), parsed by
    pyarrow's HivePartitioning as strings (URL-decoded; the default partition is null)."""
    if files.root is None:
        return [{} for _ in files.paths]
    dirs = []
    for p in files.paths:
        rel = p[len(files.root):].lstrip("/") if p.startswith(files.root) else p
        dirs.append([seg for seg in rel.split("/")[:-1] if "=" in seg])
    keys = {tuple(seg.split("=", 1)[0] for seg in d) for d in dirs}
    if keys == {()}:
        return [{} for _ in files.paths]
    if len(keys) > 1:
        raise ContractError(f"{files.spec}: inconsistent hive partitions (keys "
                            f"{' vs '.join('/'.join(k) or '(none)' for k in sorted(keys))})")
    import pyarrow as pa
    import pyarrow.dataset as ds

    names = next(iter(keys))
    part = ds.partitioning(pa.schema([(k, pa.string()) for k in names]), flavor="hive")
    out = []
    for d in dirs:
        found = ds.get_partition_keys(part.parse("".join(f"{seg}/" for seg in d)))
        out.append({k: found.get(k) for k in names})
    return out


@dataclass(frozen=True)
class Piece:
    index: int  # reading order over the whole dataset (the duplicate rule's order)
    path: str
    url: str
    fmt: str
    partition: tuple[tuple[str, str | None], ...]
    row_groups: tuple[int, ...] = ()  # parquet
    first_row: int = 0  # parquet: the file's row number of the first row
    offset: int = 0  # jsonl: byte block
    length: int = 0
    block: int = 0  # jsonl: block number in its file


def plan_pieces(files: Any, blocksize: int) -> list[Piece]:
    """Pieces in reading order: Parquet row groups gathered up to `blocksize` uncompressed
    bytes (footers only are read here), JSON Lines byte blocks of `blocksize`."""
    hive = hive_values(files)
    pieces: list[Piece] = []
    for path, values in zip(files.paths, hive, strict=True):
        part = tuple(values.items())
        url = files.url(path)
        if files.format == "parquet":
            import pyarrow.parquet as pq

            try:
                with files.fs.open(path, "rb") as fh:
                    meta = pq.ParquetFile(fh).metadata
            except Exception as e:  # noqa: BLE001 - any pyarrow failure means "not Parquet"
                raise ContractError(f"{url}: not a readable Parquet file "
                                    f"({type(e).__name__})") from e
            group, size, first, row = [], 0, 0, 0
            for i in range(meta.num_row_groups):
                rg = meta.row_group(i)
                if group and size + rg.total_byte_size > blocksize:
                    pieces.append(Piece(len(pieces), path, url, "parquet", part,
                                         tuple(group), first))
                    group, size, first = [], 0, row
                group.append(i)
                size += rg.total_byte_size
                row += rg.num_rows
            pieces.append(Piece(len(pieces), path, url, "parquet", part, tuple(group), first))
        else:
            total = files.fs.size(path)
            starts = range(0, max(total, 1), blocksize)
            for j, off in enumerate(starts):
                pieces.append(Piece(len(pieces), path, url, "jsonl", part, offset=off,
                                     length=min(blocksize, total - off), block=j))
    return pieces


def block_bytes(fs: Any, piece: Piece) -> bytes:
    from fsspec.utils import read_block

    if piece.length <= 0:
        return b""
    with fs.open(piece.path, "rb") as fh:
        return read_block(fh, piece.offset, piece.length, delimiter=b"\n")


def count_lines(fs: Any, piece: Piece) -> int:
    """Lines a text-mode reader (universal newlines) sees in the block: blocks end at a
    b"\\n", so a "\\r\\n" never straddles two of them."""
    data = block_bytes(fs, piece)
    n = data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")
    return n + (1 if data and data[-1:] not in (b"\n", b"\r") else 0)


def line_starts(counts: list[int]) -> list[int]:
    return [0, *np.cumsum(counts[:-1], dtype=np.int64).tolist()] if counts else []


def read_piece(fs: Any, piece: Piece, first_line: int | None = None,
                ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(raw rows with source_row = their row / line number in the file, lines that did not
    parse quarantined): the piece as `read_raw` reads a whole file."""
    if piece.fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            with fs.open(piece.path, "rb") as fh:
                raw = pq.ParquetFile(fh).read_row_groups(list(piece.row_groups)).to_pandas()
        except Exception as e:  # noqa: BLE001 - any pyarrow failure means "not Parquet"
            raise ContractError(f"{piece.url}: not a readable Parquet file "
                                f"({type(e).__name__})") from e
        if SOURCE_ROW not in raw.columns:
            raw[SOURCE_ROW] = np.arange(piece.first_row, piece.first_row + len(raw),
                                        dtype="int64")
        bad = pd.DataFrame()
    else:
        data = block_bytes(fs, piece)
        text = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8-sig" if piece.block == 0
                                else "utf-8")
        try:
            records, positions, bad_rows = parse_jsonl_lines(text, first_line or 0)
        except UnicodeDecodeError as e:
            raise ContractError(f"{piece.url}: not UTF-8 text, so not JSON Lines") from e
        if piece.block == 0 and not records and bad_rows:
            raise ContractError(f"{piece.url}: not JSON Lines (no line of its first block "
                                "parses as a JSON object)")
        raw, bad = jsonl_frame(records, positions, bad_rows)
    return with_partition(raw, piece), bad


def validate_piece(raw: pd.DataFrame, bad: pd.DataFrame, url: str,
              ) -> tuple[ValidationResult, np.ndarray] | None:
    """The pandas rules on one piece; (result, source_row of each valid row). None: an empty
    piece (a blank block or an empty file adds no row)."""
    if len(raw) == 0 and len(bad) == 0:
        return None
    res = validate_frame(raw, LEDGER_SCHEMA, source=url, pre_quarantined=bad)
    rows = raw[SOURCE_ROW].to_numpy() if len(raw) else np.zeros(0, dtype=np.int64)
    quarantined = res.quarantine[SOURCE_ROW].to_numpy() if len(res.quarantine) else rows[:0]
    return res, rows[~np.isin(rows, quarantined)]


def with_partition(raw: pd.DataFrame, piece: Piece) -> pd.DataFrame:
    for key, value in piece.partition:
        if key in raw.columns:
            raise ContractError(f"{piece.url}: {key} is both a hive partition key and a column")
        raw[key] = pd.Series(value, index=raw.index, dtype=object)
    return raw
