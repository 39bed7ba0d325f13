"""Ledgers as datasets: a Parquet dataset or a set of JSON Lines files, read in pieces.

A ledger spec is a file, a directory (a Parquet dataset, hive partitions such as
`date=2026-12-01/` included, or a folder of `.jsonl` files) or a glob, as an fsspec
path: local, or an object-store URL when its fsspec package is installed.

Every piece (a run of Parquet row groups, or a byte block of a JSON Lines file cut
at line ends) is read and validated on its own by the pandas rules
(`validate_frame(LEDGER_SCHEMA)`, the function behind `validate_ledger`; nothing here
re-states a rule), so validation and quarantine run per partition:

- `read_ledger_dask(spec)`: a Dask graph; the valid rows as a dask DataFrame, the
  quarantined rows as another (written as one Parquet file per partition by
  `LedgerDataset.write_quarantine`), and the counts per partition as a third, whose
  sum is the accounting. The driver holds the graph and the sums, never a row.
- `read_ledger_blocks(spec, rows_per_block)`: the same pieces one at a time on this
  machine, each a `ValidationResult`; memory is one block (plus the set of request ids
  already kept, for the duplicate rule below).

Duplicate request ids across pieces. The pandas rule (`validate_frame`): among the
rows that pass every other check, the first of each `request_id` in file order is kept
and every later one is quarantined as `duplicate_request_id`. Each piece applies it to
its own rows, so at most one row per id is left valid in a piece; across pieces the
first piece holding an id keeps it. On Dask: the (request_id, piece) pairs of the valid
rows are grouped by request_id with a dask groupby (`split_out`: hash partitioned, no
partition holds all ids), ids held by more than one piece are kept with their first
piece (a small table: the duplicated ids only), and each piece then moves its rows
whose id belongs to an earlier piece to its quarantine. Locally: a set of the ids kept
so far. Either way the counts equal the pandas path on the concatenated rows, row for
row. A duplicate found across pieces is quarantined with its values as validated
(`record`, timestamps in epoch ms) on Dask, its raw values locally.

Accounting: rows_read = rows_valid + rows_quarantined, exactly, per piece and in total
(a malformed JSON line is read and quarantined as `malformed_json`).

Reading and validating one piece is `replaylab.contracts.ledger_pieces`. What stays here
(the files of a spec, the Dask driver, the local driver) is one unit: the two drivers
apply one duplicate rule and one accounting, which must agree row for row.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from glob import has_magic
from pathlib import PurePosixPath
from typing import Any

import numpy as np
import pandas as pd

from replaylab.contracts.columns import QUARANTINE_DETAIL, QUARANTINE_REASON, SOURCE_ROW
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.io import (
    FORMAT_BY_EXTENSION,
    jsonable,
    jsonl_frame,
    parse_jsonl_lines,
    warn_truncated,
)
from replaylab.contracts.ledger import LEDGER_SCHEMA
from replaylab.contracts.ledger_pieces import (
    Piece,
    count_lines,
    hive_values,
    line_starts,
    plan_pieces,
    read_piece,
    validate_piece,
    with_partition,
)
from replaylab.contracts.schema import ContractError, ValidationResult

SOURCE_FILE = "source_file"  # quarantine column: the file (URL) the row came from
QUARANTINE_RECORD = "record"  # quarantine column: the row as JSON (any value survives)
DEFAULT_BLOCKSIZE = 64 * 2**20  # bytes of a piece: JSON Lines bytes, Parquet uncompressed
_DUPLICATE = LEDGER_SCHEMA.duplicate_reason
_DUP_DETAIL = "+".join(LEDGER_SCHEMA.unique_key)
_IGNORED_PREFIXES = ("_", ".")  # pyarrow.dataset's: _SUCCESS, _metadata, .crc files
_PIECE = "piece"
_COUNT, _N = "count", "n"


# ---------------------------------------------------------------- which files


@dataclass(frozen=True)
class LedgerFiles:
    """The files of a ledger spec, in reading order (sorted paths)."""

    spec: str
    fs: Any  # an fsspec AbstractFileSystem (pickles to the workers)
    paths: tuple[str, ...]  # as `fs` names them (no protocol)
    format: str  # "parquet" or "jsonl"
    root: str | None  # the directory hive partitions are read under (None: none)

    def url(self, path: str) -> str:
        return path if _is_local(self.fs) else self.fs.unstrip_protocol(path)

    @property
    def urls(self) -> list[str]:
        return [self.url(p) for p in self.paths]


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocol or "local" in protocol


def ledger_paths(spec: str | os.PathLike, storage_options: dict | None = None) -> LedgerFiles:
    """Resolve a file, a directory or a glob (an fsspec path or URL) to its ledger files.

    A directory is read recursively: a Parquet dataset (hive `key=value/` folders are
    partition columns, see `read_ledger_dask`) or a folder of JSON Lines files. Files
    and folders starting with `_` or `.` are skipped (as pyarrow.dataset does:
    `_SUCCESS`, `_metadata`, `.crc`). The format is the extension's (`.parquet`, `.pq`;
    `.jsonl`, `.ndjson`, `.json`), or the magic bytes for a file without one. Raises
    ContractError when nothing is found, a file is of another kind (CSV, `.gz`, ...),
    or Parquet and JSON Lines files are mixed.
    """
    import fsspec

    text = os.fspath(spec)
    fs, path = fsspec.core.url_to_fs(text, **(storage_options or {}))
    root: str | None = None
    if has_magic(path):
        files: list[str] = []
        for p, info in sorted(fs.glob(path, detail=True).items()):
            if info.get("type") == "directory":
                files.extend(_files_under(fs, p))
            elif not PurePosixPath(p).name.startswith(_IGNORED_PREFIXES):
                files.append(p)
        root = _glob_root(path)
    elif fs.isdir(path):
        files, root = _files_under(fs, path), path.rstrip("/")
    elif fs.exists(path):
        files = [path]
    else:
        raise ContractError(f"{text}: no such file or directory")
    if not files:
        raise ContractError(f"{text}: no ledger files found (Parquet or JSON Lines)")
    formats: dict[str, str] = {}
    for p in files:
        formats.setdefault(_format_of(fs, p), p)
    if len(formats) > 1:
        shown = "; ".join(f"{fmt}: {p}" for fmt, p in sorted(formats.items()))
        raise ContractError(f"{text}: mixes Parquet and JSON Lines files ({shown}); "
                            "a ledger dataset is one format")
    return LedgerFiles(text, fs, tuple(sorted(files)), next(iter(formats)), root)


def _files_under(fs: Any, directory: str) -> list[str]:
    base = directory.rstrip("/")
    out = []
    for p in fs.find(base):
        rel = p[len(base):].lstrip("/") if p.startswith(base) else PurePosixPath(p).name
        if not any(part.startswith(_IGNORED_PREFIXES) for part in rel.split("/")):
            out.append(p)
    return sorted(out)


def _glob_root(path: str) -> str | None:
    parts = path.split("/")
    for i, part in enumerate(parts):
        if has_magic(part):
            return "/".join(parts[:i]) or None
    return None


def _format_of(fs: Any, path: str) -> str:
    ext = PurePosixPath(path).suffix.lower()
    fmt = FORMAT_BY_EXTENSION.get(ext)
    if fmt in ("parquet", "jsonl"):
        return fmt
    if ext == "":
        with fs.open(path, "rb") as fh:
            return "parquet" if fh.read(4) == b"PAR1" else "jsonl"
    raise ContractError(f"{path}: not a ledger file ({ext} is neither Parquet nor JSON Lines; "
                        "compressed JSON Lines are not read as a dataset)")


# ---------------------------------------------------------------- dask


_Q_DTYPES = {SOURCE_FILE: object, SOURCE_ROW: "int64", L.REQUEST_ID: object,
             QUARANTINE_REASON: object, QUARANTINE_DETAIL: object, QUARANTINE_RECORD: object}
_COUNT_DTYPES = {_PIECE: "int64", SOURCE_FILE: object, _COUNT: object, _N: "int64"}


def quarantine_arrow_schema() -> Any:
    """The schema of every quarantine Parquet file (the same for every partition)."""
    import pyarrow as pa

    return pa.schema([(SOURCE_FILE, pa.string()), (SOURCE_ROW, pa.int64()),
                      (L.REQUEST_ID, pa.string()), (QUARANTINE_REASON, pa.string()),
                      (QUARANTINE_DETAIL, pa.string()), (QUARANTINE_RECORD, pa.string())])


def _empty(dtypes: dict) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in dtypes.items()})


def _quarantine_table(rows: pd.DataFrame, url: str) -> pd.DataFrame:
    """Quarantined rows (raw, or as validated) in the fixed quarantine schema."""
    if len(rows) == 0:
        return _empty(_Q_DTYPES)
    payload = rows.drop(columns=[c for c in (SOURCE_ROW, QUARANTINE_REASON, QUARANTINE_DETAIL)
                                 if c in rows.columns])
    records = [json.dumps(jsonable(r), allow_nan=False)
               for r in payload.to_dict(orient="records")]
    rid = (rows[L.REQUEST_ID].map(jsonable).tolist() if L.REQUEST_ID in rows.columns
           else [None] * len(rows))
    ids = [v if v is None or isinstance(v, str) else json.dumps(v) for v in rid]
    return pd.DataFrame({
        SOURCE_FILE: np.full(len(rows), url, dtype=object),
        SOURCE_ROW: rows[SOURCE_ROW].to_numpy(dtype="int64"),
        L.REQUEST_ID: pd.Series(ids, dtype=object).to_numpy(),
        QUARANTINE_REASON: rows[QUARANTINE_REASON].astype(object).to_numpy(),
        QUARANTINE_DETAIL: rows[QUARANTINE_DETAIL].astype(object).to_numpy(),
        QUARANTINE_RECORD: np.asarray(records, dtype=object),
    })


def _canonical_dtype(name: str) -> object | None:
    """The dtype `validate_frame` gives a valid column of the contract (None: not one)."""
    try:
        f = LEDGER_SCHEMA.field(name)
    except KeyError:
        return None
    if f.kind in ("int", "timestamp"):
        return "Int64" if f.nullable else "int64"
    return {"float": "float64", "bool": "boolean"}.get(f.kind, object)


def _meta(files: LedgerFiles, pieces: list[Piece], sample: int) -> pd.DataFrame:
    """The valid frame's columns and dtypes, before any row is read.

    Parquet: the union of the files' columns (footers) and the hive keys; contract
    columns get their validated dtype, others pandas' dtype of their Arrow type (nullable
    Int64 / boolean for integers and booleans: a null in one file must not change the
    dtype), hive keys object strings. JSON Lines: every ledger-v1 column (absent ones all
    null, as `Schema.column` reads them) and the other keys of the first `sample` bytes.
    """
    names: dict[str, object] = {}
    hive = [k for k, _ in pieces[0].partition] if pieces else []
    if files.format == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        schemas = []
        for p in files.paths:
            with files.fs.open(p, "rb") as fh:
                schemas.append(pq.ParquetFile(fh).schema_arrow)
        try:
            unified = pa.unify_schemas(schemas, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise ContractError(f"{files.spec}: its Parquet files' schemas do not agree ({e})"
                                ) from e
        empty = unified.empty_table().to_pandas()
        for name in empty.columns:
            if name == SOURCE_ROW:
                continue
            canon = _canonical_dtype(name)
            if canon is None:
                t = unified.field(name).type
                canon = ("Int64" if pa.types.is_integer(t) else "boolean"
                         if pa.types.is_boolean(t) else empty[name].dtype)
            names[name] = canon
    else:
        for f in LEDGER_SCHEMA.fields:
            names[f.name] = _canonical_dtype(f.name)
        if pieces:
            with files.fs.open(pieces[0].path, "rb") as fh:
                head = fh.read(sample)
            head = head[:head.rfind(b"\n") + 1] if b"\n" in head else head
            text = io.TextIOWrapper(io.BytesIO(head), encoding="utf-8-sig", errors="replace")
            records, _, _ = parse_jsonl_lines(text, 0)
            for r in records:
                for k in r:
                    names.setdefault(k, object)
    for k in hive:
        names[k] = object
    return _empty(names)


def _conform(valid: pd.DataFrame, meta: pd.DataFrame, url: str) -> pd.DataFrame:
    """`valid` with exactly the meta's columns and dtypes (absent columns all null)."""
    extra = [c for c in valid.columns if c not in meta.columns]
    if extra:
        raise ContractError(f"{url}: column(s) {', '.join(extra[:5])} are not in the dataset's "
                            "columns (JSON Lines: sampled from its first file; pass "
                            "extra_columns=[...])")
    out = {}
    for c, dtype in meta.dtypes.items():
        if c in valid.columns:
            s = valid[c]
            out[c] = s if s.dtype == dtype else s.astype(dtype)
        else:
            out[c] = pd.Series(pd.NA if dtype in ("Int64", "boolean") else
                               (np.nan if dtype == "float64" else None),
                               index=valid.index, dtype=dtype)
    return pd.DataFrame(out, index=valid.index)


@dataclass
class _Checked:
    """One piece validated: what the cross-piece duplicate step needs."""

    valid: pd.DataFrame
    valid_rows: np.ndarray  # source_row of each valid row
    quarantine: pd.DataFrame  # fixed quarantine schema
    rows_read: int
    by_reason: dict[str, int]


def _check_piece(fs: Any, piece: Piece, starts: list[int] | None, meta: pd.DataFrame,
                 ) -> _Checked:
    first = starts[piece.block] if starts is not None else None
    raw, bad = read_piece(fs, piece, first)
    out = validate_piece(raw, bad, piece.url)
    if out is None:
        return _Checked(meta.iloc[0:0].copy(), np.zeros(0, np.int64), _empty(_Q_DTYPES), 0, {})
    res, rows = out
    return _Checked(_conform(res.valid, meta, piece.url), rows,
                    _quarantine_table(res.quarantine, piece.url), res.rows_read, res.by_reason())


def _ids(checked: _Checked, index: int) -> pd.DataFrame:
    return pd.DataFrame({L.REQUEST_ID: checked.valid[L.REQUEST_ID].to_numpy(dtype=object),
                         _PIECE: np.full(len(checked.valid), index, dtype="int64")})


def _first_piece(parts: list[pd.Series]) -> pd.Series:
    """request_id -> first piece holding it, for the ids held by several pieces."""
    return pd.concat(parts) if parts else pd.Series(dtype="int64")


def _cross_duplicates(checked: _Checked, owners: pd.Series, piece: Piece,
                      ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Move the valid rows whose id an earlier piece keeps to the quarantine."""
    valid = checked.valid
    if len(owners) == 0 or len(valid) == 0:
        return valid, checked.quarantine
    owner = valid[L.REQUEST_ID].map(owners)
    later = (owner.notna() & (owner < piece.index)).to_numpy(dtype=bool)
    if not later.any():
        return valid, checked.quarantine
    moved = valid[later].assign(**{SOURCE_ROW: checked.valid_rows[later],
                                   QUARANTINE_REASON: _DUPLICATE,
                                   QUARANTINE_DETAIL: _DUP_DETAIL})
    table = _quarantine_table(moved, piece.url)
    quarantine = pd.concat([checked.quarantine, table], ignore_index=True)
    quarantine = quarantine.sort_values(SOURCE_ROW, kind="stable", ignore_index=True)
    return valid[~later].reset_index(drop=True), quarantine


def _final(checked: _Checked, owners: pd.Series, piece: Piece,
           ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    valid, quarantine = _cross_duplicates(checked, owners, piece)
    reasons = quarantine[QUARANTINE_REASON].value_counts().sort_index()
    rows = [("rows_read", checked.rows_read), ("rows_valid", len(valid)),
            *((f"quarantine:{k}", int(v)) for k, v in reasons.items())]
    counts = pd.DataFrame({_PIECE: np.full(len(rows), piece.index, dtype="int64"),
                           SOURCE_FILE: np.full(len(rows), piece.url, dtype=object),
                           _COUNT: np.asarray([k for k, _ in rows], dtype=object),
                           _N: np.asarray([n for _, n in rows], dtype="int64")})
    if checked.rows_read != len(valid) + len(quarantine):  # the accounting, per piece
        raise AssertionError(f"{piece.url}: rows_read {checked.rows_read} != valid "
                             f"{len(valid)} + quarantined {len(quarantine)}")
    return valid, quarantine, counts


@dataclass(frozen=True)
class LedgerAccounting:
    """The counts of a ledger dataset (a small aggregate of per-partition counts)."""

    source: str
    rows_read: int
    rows_valid: int
    rows_quarantined: int
    by_reason: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rows_read != self.rows_valid + self.rows_quarantined:
            raise AssertionError(f"{self.source}: rows_read {self.rows_read} != rows_valid "
                                 f"{self.rows_valid} + rows_quarantined {self.rows_quarantined}")

    @classmethod
    def from_counts(cls, source: str, totals: pd.Series) -> LedgerAccounting:
        """From `count -> n` sums (LedgerDataset.counts summed over partitions)."""
        t = {str(k): int(v) for k, v in totals.items()}
        reasons = {k.split(":", 1)[1]: v for k, v in sorted(t.items())
                   if k.startswith("quarantine:") and v}
        return cls(source, t.get("rows_read", 0), t.get("rows_valid", 0),
                   sum(reasons.values()), reasons)

    def summary(self) -> dict:
        """The counts every pipeline puts in summary.json (as `ValidationResult.summary`)."""
        return {"contract": LEDGER_SCHEMA.name, "source": self.source,
                "rows_read": self.rows_read, "rows_valid": self.rows_valid,
                "rows_quarantined": self.rows_quarantined,
                "quarantine_by_reason": dict(self.by_reason)}


@dataclass
class LedgerDataset:
    """A ledger read and validated per partition on Dask (nothing computed yet).

    valid: the valid rows (dask DataFrame, one partition per piece, unknown divisions,
    object strings). quarantine: the quarantined rows, one partition per piece, in the
    fixed schema `quarantine_arrow_schema()` (source_file, source_row, request_id,
    quarantine_reason, quarantine_detail, record: the row as JSON). counts: per
    partition, `count` ("rows_read", "rows_valid", "quarantine:<reason>") -> `n`.
    Each compute of these reads the files again; `persist()` to read them once.
    """

    files: LedgerFiles
    valid: Any
    quarantine: Any
    counts: Any

    @property
    def npartitions(self) -> int:
        return self.valid.npartitions

    def _totals(self) -> Any:
        return self.counts.groupby(_COUNT)[_N].sum()

    def accounting(self) -> LedgerAccounting:
        """Compute the counts (the driver receives one number per count key)."""
        return LedgerAccounting.from_counts(self.files.spec, self._totals().compute())

    def write_quarantine(self, path: str, storage_options: dict | None = None,
                         ) -> LedgerAccounting:
        """Write the quarantine as Parquet, `part-00000.parquet` per partition (empty ones
        too), with `dask.dataframe.to_parquet`; the accounting is computed in the same
        pass and returned. Rows go from the workers to the files, never to the driver."""
        import dask

        with dask.config.set({"dataframe.convert-string": False}):
            write = self.quarantine.to_parquet(
                path, write_index=False, schema=quarantine_arrow_schema(), compute=False,
                name_function=lambda i: f"part-{i:05d}.parquet",
                storage_options=storage_options, write_metadata_file=False)
            _, totals = dask.compute(write, self._totals())
        return LedgerAccounting.from_counts(self.files.spec, totals)

    def persist(self) -> LedgerDataset:
        """Read and validate once; valid, quarantine and counts stay on the workers."""
        import dask

        valid, quarantine, counts = dask.persist(self.valid, self.quarantine, self.counts)
        return LedgerDataset(self.files, valid, quarantine, counts)


def read_ledger_dask(spec: str | os.PathLike, blocksize: int | str = DEFAULT_BLOCKSIZE, *,
                     storage_options: dict | None = None, extra_columns: tuple[str, ...] = (),
                     sample: int = 2**20) -> LedgerDataset:
    """A ledger dataset (see `ledger_paths`) as a Dask graph, validated per partition.

    blocksize: bytes per partition (int or "64MiB"): JSON Lines byte blocks cut at line
    ends (`fsspec.utils.read_block`, dask's reader primitive), never a whole file;
    Parquet row groups gathered up to that many uncompressed bytes (a row group is never
    split). Hive partition keys (`date=2026-12-01/`) are kept as columns of object
    strings (the contract carries extra columns through untouched; a key that names a
    contract column is validated as that column). JSON Lines line numbers (source_row)
    are exact: each block's first line number is the sum of the lines of the blocks
    before it, counted by a cheap per-block task.

    Valid columns: see `_meta` (Parquet: the files' columns; JSON Lines: every ledger-v1
    column plus the other keys of the first `sample` bytes and `extra_columns`; a key
    found later raises ContractError). The graph is built and must be computed with
    dataframe.convert-string off (done here and in `write_quarantine`), so that strings
    stay the object strings of the pandas path.

    Driver work: listing files, Parquet footers, the JSON sample. Everything else runs on
    the workers; see the module docstring for the duplicate rule across partitions.
    """
    import dask
    import dask.dataframe as dd
    from dask import delayed
    from dask.base import tokenize
    from dask.utils import parse_bytes

    size = parse_bytes(blocksize) if isinstance(blocksize, str) else int(blocksize)
    if size <= 0:
        raise ValueError(f"blocksize={blocksize!r}: must be > 0")
    files = ledger_paths(spec, storage_options)
    pieces = plan_pieces(files, size)
    meta = _meta(files, pieces, sample)
    for c in extra_columns:
        if c not in meta.columns:
            meta[c] = pd.Series(dtype=object)
    fs = files.fs
    token = tokenize(files.spec, files.paths, files.format, size, list(meta.columns),
                     [fs.ukey(p) for p in files.paths[:1000]], str(fs.protocol))
    starts: dict[str, Any] = {}
    if files.format == "jsonl":
        by_file: dict[str, list[Piece]] = {}
        for p in pieces:
            by_file.setdefault(p.path, []).append(p)
        for path, ps in by_file.items():
            counts = [delayed(count_lines, pure=True)(fs, p, dask_key_name=(
                f"ledger-lines-{token}", p.index)) for p in ps]
            starts[path] = delayed(line_starts, pure=True)(
                counts, dask_key_name=(f"ledger-starts-{token}", ps[0].index))
    with dask.config.set({"dataframe.convert-string": False}):
        checked = [delayed(_check_piece, pure=True)(
            fs, p, starts.get(p.path), meta, dask_key_name=(f"ledger-check-{token}", p.index))
            for p in pieces]
        ids = dd.from_delayed(
            [delayed(_ids, pure=True)(c, p.index, dask_key_name=(f"ledger-ids-{token}", p.index))
             for c, p in zip(checked, pieces, strict=True)],
            meta=_empty({L.REQUEST_ID: object, _PIECE: "int64"}), verify_meta=False)
        # a tree reduction up to 32 pieces, hash-partitioned outputs above (task shuffle)
        split_out = max(1, math.ceil(len(pieces) / 32))
        agg = ids.groupby(L.REQUEST_ID)[_PIECE].agg(["min", "count"], split_out=split_out,
                                                    shuffle_method="tasks")
        owners = delayed(_first_piece, pure=True)(
            agg[agg["count"] > 1]["min"].to_delayed(optimize_graph=False),
            dask_key_name=f"ledger-owners-{token}")
        final = [delayed(_final, pure=True, nout=3)(
            c, owners, p, dask_key_name=(f"ledger-final-{token}", p.index))
            for c, p in zip(checked, pieces, strict=True)]
        valid = dd.from_delayed([f[0] for f in final], meta=meta, verify_meta=False)
        quarantine = dd.from_delayed([f[1] for f in final], meta=_empty(_Q_DTYPES),
                                     verify_meta=False)
        counts = dd.from_delayed([f[2] for f in final], meta=_empty(_COUNT_DTYPES),
                                 verify_meta=False)
    return LedgerDataset(files, valid, quarantine, counts)


# ---------------------------------------------------------------- local blocks


def read_ledger_blocks(spec: str | os.PathLike, rows_per_block: int = 250_000, *,
                       storage_options: dict | None = None) -> Iterator[ValidationResult]:
    """The ledger dataset in blocks on this machine, each validated as `read_ledger` does.

    Parquet: each file's record batches of at most `rows_per_block` rows
    (`ParquetFile.iter_batches`, row group by row group); JSON Lines: runs of
    `rows_per_block` lines of a text stream. A block never spans two files; its
    `source` is the file, its quarantine's `source_row` the row/line in that file.
    Hive keys are columns, as in `read_ledger_dask`. Duplicate request ids across blocks
    are quarantined by a set of the ids kept so far (memory: one block of rows and one
    set entry per valid row). Summed over the blocks, rows_read = rows_valid +
    rows_quarantined and every count equals `read_ledger` on the concatenated rows;
    `accounting_of(blocks)` sums them.
    """
    if rows_per_block <= 0:
        raise ValueError(f"rows_per_block={rows_per_block!r}: must be > 0")
    files = ledger_paths(spec, storage_options)
    seen: set = set()
    for path, values in zip(files.paths, hive_values(files), strict=True):
        part = tuple(values.items())
        url = files.url(path)
        for raw, bad in _file_blocks(files, path, url, part, rows_per_block):
            out = validate_piece(raw, bad, url)
            if out is None:
                continue
            res, rows = out
            yield _drop_seen(res, raw, rows, seen)


def _file_blocks(files: LedgerFiles, path: str, url: str,
                 part: tuple[tuple[str, str | None], ...], rows_per_block: int,
                 ) -> Iterator[tuple[pd.DataFrame, pd.DataFrame]]:
    piece = Piece(0, path, url, files.format, part)
    if files.format == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        first = 0
        with files.fs.open(path, "rb") as fh:
            try:
                pf = pq.ParquetFile(fh)
                batches = pf.iter_batches(batch_size=rows_per_block, use_pandas_metadata=True)
                for batch in batches:
                    table = pa.Table.from_batches([batch], schema=batch.schema)
                    raw = table.to_pandas()
                    raw[SOURCE_ROW] = np.arange(first, first + len(raw), dtype="int64")
                    first += len(raw)
                    yield with_partition(raw, piece), pd.DataFrame()
            except ContractError:
                raise
            except Exception as e:  # noqa: BLE001 - any pyarrow failure means "not Parquet"
                raise ContractError(f"{url}: not a readable Parquet file "
                                    f"({type(e).__name__})") from e
        return
    with files.fs.open(path, "rb") as fh:
        text = io.TextIOWrapper(fh, encoding="utf-8-sig")
        pos = 0
        while True:
            lines = []
            try:
                for line in text:
                    lines.append(line)
                    if len(lines) == rows_per_block:
                        break
            except UnicodeDecodeError as e:
                raise ContractError(f"{url}: not UTF-8 text, so not JSON Lines") from e
            if not lines:
                return
            records, positions, bad = parse_jsonl_lines(lines, pos)
            if pos == 0 and not records and bad:
                raise ContractError(f"{url}: not JSON Lines (no line of its first block "
                                    "parses as a JSON object)")
            pos += len(lines)
            warn_truncated(str(url), bad)
            raw, bad_frame = jsonl_frame(records, positions, bad)
            yield with_partition(raw, piece), bad_frame


def _drop_seen(res: ValidationResult, raw: pd.DataFrame, rows: np.ndarray,
               seen: set) -> ValidationResult:
    """Quarantine (raw row, `duplicate_request_id`) the valid rows whose id an earlier block
    kept; add the rest to `seen`."""
    ids = res.valid[L.REQUEST_ID].tolist()
    later = np.fromiter((i in seen for i in ids), dtype=bool, count=len(ids))
    seen.update(ids)  # the later ones are in it already
    if not later.any():
        return res
    moved = raw.set_index(SOURCE_ROW, drop=False).loc[rows[later]].reset_index(drop=True)
    moved[QUARANTINE_REASON] = _DUPLICATE
    moved[QUARANTINE_DETAIL] = _DUP_DETAIL
    quarantine = pd.concat([res.quarantine, moved], ignore_index=True, sort=False)
    quarantine = quarantine.sort_values(SOURCE_ROW, kind="stable", ignore_index=True)
    valid = res.valid[~later].reset_index(drop=True)
    valid.attrs.update(res.valid.attrs)
    return ValidationResult(contract=res.contract, valid=valid, quarantine=quarantine,
                            rows_read=res.rows_read, source=res.source)


def accounting_of(blocks: Iterator[ValidationResult] | list[ValidationResult],
                  source: str = "") -> LedgerAccounting:
    """Sum the counts of blocks (e.g. `read_ledger_blocks`); the blocks are not kept."""
    read = valid = 0
    reasons: dict[str, int] = {}
    for b in blocks:
        read += b.rows_read
        valid += b.rows_valid
        for k, v in b.by_reason().items():
            reasons[k] = reasons.get(k, 0) + v
    return LedgerAccounting(source, read, valid, sum(reasons.values()), dict(sorted(reasons.items())))


def read_ledger_dataset(spec: str | os.PathLike, rows_per_block: int = 250_000, *,
                        storage_options: dict | None = None) -> ValidationResult:
    """The whole ledger dataset as one `ValidationResult` on this machine (compute=local:
    the local pipelines hold the ledger in memory anyway); a single file is `read_ledger`'s
    result exactly. The blocks' accounting adds up (`accounting_of`'s check)."""
    from replaylab.contracts.ledger import read_ledger

    if os.path.isfile(spec):
        return read_ledger(spec)
    blocks = list(read_ledger_blocks(spec, rows_per_block, storage_options=storage_options))
    accounting_of(blocks, str(spec))  # raises when a block's counts do not add up
    valid = pd.concat([b.valid for b in blocks], ignore_index=True) if blocks else pd.DataFrame()
    quarantine = (pd.concat([b.quarantine for b in blocks], ignore_index=True) if blocks
                  else pd.DataFrame())
    return ValidationResult(LEDGER_SCHEMA.name, valid, quarantine,
                            sum(b.rows_read for b in blocks), str(spec))
