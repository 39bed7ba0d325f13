"""pipeline=synthesize: a big synthetic ledger-v1 written in parallel as Parquet chunk files.

The ledger is cut into chunks (sources/synthetic/chunks.py: seeding, ids, time layout);
each worker draws a chunk and writes `OUT/part-<chunk>.parquet` itself, so the driver
only sees a few numbers per chunk. Workers: where the compute engine works
(`replaylab.compute`): on the local engine (or with none) a process pool of
`synthesize.workers` here, on Dask one engine task per chunk on the cluster's workers. The
files are the same for any number and kind of workers. `OUT/_ledger.json`
records the config, the seed and every chunk (rows, sessions, bytes, time window);
readers skip names starting with `_` (pyarrow.dataset, dask.dataframe.read_parquet).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from replaylab.compute import Engine
from replaylab.config import ConfigError, fail_field
from replaylab.contracts.ledger import LEDGER_VERSION
from replaylab.sources.synthetic.chunks import (
    MAX_CHUNK_ROWS,
    ChunkSpec,
    chunk_duration_ms,
    chunk_layout,
    write_chunk,
)
from replaylab.sources.synthetic.config import SyntheticLedgerConfig

MANIFEST = "_ledger.json"
_COMPRESSIONS = ("zstd", "snappy", "lz4", "gzip", "none")


@dataclass(frozen=True)
class SynthesizeConfig:
    """How the ledger is written (what it holds is data.synthetic: SyntheticLedgerConfig)."""

    chunk_rows: int = 500_000  # rows per chunk = per file = per task
    workers: int = 2  # processes of the local pool (compute=local); 1 = in this process
    compression: str = "zstd"
    row_group_rows: int = 131_072  # Parquet row groups (each carries min/max statistics)
    overwrite: bool = False  # replace an earlier ledger in `out` (its part files, manifest)
    progress: bool = True  # a progress bar over chunks (stderr, when it is a terminal)

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not 1 <= self.chunk_rows <= MAX_CHUNK_ROWS:
            fail_field(name, "chunk_rows", self.chunk_rows, f"must be in [1, {MAX_CHUNK_ROWS}]")
        if self.workers < 1:
            fail_field(name, "workers", self.workers, "must be >= 1")
        if self.compression not in _COMPRESSIONS:
            fail_field(name, "compression", self.compression, f"choose one of {_COMPRESSIONS}")
        if self.row_group_rows < 1:
            fail_field(name, "row_group_rows", self.row_group_rows, "must be >= 1")


def _prepare(out: Path, overwrite: bool) -> None:
    """Make `out`; refuse one holding an earlier ledger unless `overwrite` (then remove it)."""
    out.mkdir(parents=True, exist_ok=True)
    old = [*out.glob("part-*.parquet"), *out.glob(".part-*.tmp"), *out.glob(MANIFEST)]
    if old and not overwrite:
        raise ConfigError(f"out={out} already holds a ledger ({len(old)} files); set "
                          f"synthesize.overwrite=true to replace it, or choose another out")
    for p in old:
        p.unlink()


def _local(specs: list[ChunkSpec], workers: int) -> Iterator[dict]:
    if workers == 1:
        yield from map(write_chunk, specs)
        return
    with ProcessPoolExecutor(max_workers=min(workers, len(specs))) as pool:
        for fut in as_completed([pool.submit(write_chunk, s) for s in specs]):
            yield fut.result()


def _chunks(specs: list[ChunkSpec], workers: int, engine: Engine | None) -> Iterator[dict]:
    """Each chunk's facts once it is written: in this process's pool of `workers` (no
    engine, or the local engine: its partitions are processed here), else one engine task
    per chunk (Dask: the cluster's workers draw and write; one engine stage, the task bar)."""
    if engine is None or engine.kind == "local":
        yield from _local(specs, workers)
        return
    with engine.stage("synthesize: the workers draw and write the chunks"):
        done = engine.submit_all(write_chunk, specs)
    yield from done


def synthesize_ledger(cfg: SyntheticLedgerConfig, seed: int, out: str | Path,
                      options: SynthesizeConfig | None = None, defect_rate: float = 0.0,
                      engine: Engine | None = None) -> dict[str, Any]:
    """Write `cfg.n_requests` rows of the synthetic ledger to `out` as chunk files.

    `engine`: where the chunks are drawn and written (`_chunks`: on Dask the cluster's
    workers, so `out` must be a path they can write; else a local process pool of
    `options.workers`). Returns the summary:
    rows, files, bytes, rows/s, seconds, the time window and the chunks' gaps, defects.
    """
    from tqdm.auto import tqdm

    options = options or SynthesizeConfig()
    if cfg.n_requests is None:
        raise ConfigError("pipeline=synthesize needs data.synthetic.n_requests=N (the rows)")
    if not 0.0 <= defect_rate < 1.0:
        raise ConfigError(f"data.synthetic.defect_rate={defect_rate!r}: must be in [0, 1)")
    out = Path(out)
    layout = chunk_layout(cfg.n_requests, options.chunk_rows)
    _prepare(out, options.overwrite)
    specs = [ChunkSpec(cfg=cfg, seed=seed, index=i, n_chunks=len(layout),
                       chunk_rows=options.chunk_rows, out_dir=str(out), defect_rate=defect_rate,
                       compression=options.compression, row_group_rows=options.row_group_rows)
             for i in range(len(layout))]
    t0 = time.perf_counter()
    done = _chunks(specs, options.workers, engine)
    chunks = []
    with tqdm(total=cfg.n_requests, unit="row", unit_scale=True, desc="synthesize",
              disable=None if options.progress else True) as bar:
        for info in done:
            chunks.append(info)
            bar.update(info["rows"])
    seconds = time.perf_counter() - t0
    chunks.sort(key=lambda c: c["chunk"])
    return _finish(cfg, seed, out, options, defect_rate, chunks, seconds,
                   engine.kind if engine is not None else "local")


def _finish(cfg: SyntheticLedgerConfig, seed: int, out: Path, options: SynthesizeConfig,
            defect_rate: float, chunks: list[dict], seconds: float, kind: str) -> dict:
    rows, cpu = sum(c["rows"] for c in chunks), sum(c["cpu_seconds"] for c in chunks)
    size = sum(c["bytes"] for c in chunks)
    gaps = [(b["first_ms"] - a["last_ms"]) / 1000 for a, b in zip(chunks, chunks[1:], strict=False)]
    defects: dict[str, int] = {}
    for c in chunks:
        for reason, n in c["defects"].items():
            defects[reason] = defects.get(reason, 0) + n
    manifest = {"contract": f"ledger-v{LEDGER_VERSION}", "rows": rows, "files": len(chunks),
                "seed": seed, "chunk_rows": options.chunk_rows,
                "chunk_duration_ms": chunk_duration_ms(cfg, options.chunk_rows),
                "defect_rate": defect_rate, "defects": defects, "generator": asdict(cfg),
                "chunks": chunks}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, default=str))
    return {
        "pipeline": "synthesize",
        "out": str(out),
        "rows": rows,
        "files": len(chunks),
        "bytes": size,
        "bytes_per_million_rows": round(size / rows * 1e6),
        "sessions": sum(c["sessions"] for c in chunks),
        "seconds": round(seconds, 3),
        "rows_per_s": round(rows / seconds) if seconds > 0 else None,
        # CPU the workers spent drawing and writing: rows_per_cpu_s x cores is what the
        # machine gives when nothing else runs on it
        "cpu_seconds": round(cpu, 3),
        "rows_per_cpu_s": round(rows / cpu) if cpu > 0 else None,
        "workers": {"kind": kind, "n": options.workers if kind == "local" else None},
        "chunk_rows": options.chunk_rows,
        "seed": seed,
        "time_window_ms": {"first": min(c["first_ms"] for c in chunks),
                           "last": max(c["last_ms"] for c in chunks)},
        "chunk_gap_s": {"min": round(min(gaps), 1), "max": round(max(gaps), 1)} if gaps else None,
        "defects": defects,
        "artifacts": {"ledger": str(out), "manifest": str(out / MANIFEST)},
    }
