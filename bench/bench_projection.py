"""Benchmark: dispatch-time projection of a --rows ledger, pandas path and Dask path.

Ledger: `replaylab.sources.synthetic.generate_synthetic_ledger` when available
(validated first, not timed), else the fallback below (sessions of ~5 turns whose
responses overlap the next dispatches). Timed: `dispatch_time_features` (guard
on) and the same features on the compute engine's DaskEngine (a LocalCluster of 2 worker
processes x 1 thread: `projection.partitioned.project_and_split`, the features and
their split), shuffle and transfer of the ledger included.

Peak RSS is sampled every 10 ms by a thread: this process alone for pandas; this
process plus all its child processes (the Dask workers) summed for Dask.
Prints one JSON object on the last line and merges it into bench/results.json
under "projection" (other keys are kept).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil

from replaylab.contracts import Ledger as L
from replaylab.projection import (
    ProjectionConfig,
    SplitConfig,
    dispatch_time_features,
    ledger_fingerprint,
    split_counts,
    time_ordered_splits,
)

HERE = Path(__file__).resolve().parent
GB = 2**30


def fallback_ledger(rows: int, seed: int = 0) -> pd.DataFrame:
    """Sessions with geometric turn counts (mean 5); turns overlap; 5% usage absent."""
    rng = np.random.default_rng(seed)
    sizes = rng.geometric(0.2, size=rows // 2 + 10)
    sizes = sizes[: np.searchsorted(np.cumsum(sizes), rows) + 1]
    sizes[-1] -= sizes.sum() - rows
    session = np.repeat(np.arange(len(sizes)), sizes)
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    turn = np.arange(rows) - np.repeat(first, sizes)
    start = 1_700_000_000_000 + rng.integers(0, 7 * 86_400_000, len(sizes))
    gap = rng.exponential(20_000, rows).astype(np.int64)
    gap[first] = 0
    ts = np.repeat(start, sizes) + (np.cumsum(gap) - np.repeat(np.cumsum(gap)[first], sizes))
    dur = rng.lognormal(9.0, 1.0, rows).astype(np.int64)  # median ~8 s: often overlaps
    comp = np.minimum(rng.lognormal(5.5, 1.0, rows).astype(np.int64), 4096)
    usage = rng.random(rows) > 0.05
    finish = np.where(comp >= 4096, "length", "stop").astype(object)
    return pd.DataFrame({
        L.VERSION: "1",
        L.REQUEST_ID: pd.Series(np.arange(rows)).map("r{:08d}".format).to_numpy(object),
        L.SESSION_ID: pd.Series(session).map("s{:07d}".format).to_numpy(object),
        L.TURN_INDEX: turn, L.TIMESTAMP: ts,
        L.ENDED_AT: pd.array(ts + dur, dtype="Int64"),
        L.PROMPT_TOKENS: pd.array(rng.integers(10, 8000, rows), dtype="Int64"),
        L.COMPLETION_TOKENS: pd.arrays.IntegerArray(comp, ~usage),
        L.LIFECYCLE_STATE: np.where(rng.random(rows) < 0.02, "aborted", "completed").astype(object),
        L.FINISH_REASON: finish,
        L.SELECTED_MODEL: rng.choice(np.array(["small", "medium", "large"], dtype=object), rows),
        L.MAX_TOKENS: pd.array(np.full(rows, 4096), dtype="Int64"),
        L.CATEGORY: rng.choice(np.array(["code", "chat", "math", "rag"], dtype=object), rows),
        L.STREAMING: pd.array(rng.random(rows) < 0.7, dtype="boolean"),
    })


def make_ledger(rows: int) -> tuple[pd.DataFrame, str]:
    try:
        from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger
    except ImportError:
        return fallback_ledger(rows), "bench fallback generator"
    from replaylab.contracts import validate_ledger

    raw = generate_synthetic_ledger(SyntheticLedgerConfig(n_requests=rows), seed=0)
    return validate_ledger(raw).valid, "replaylab.sources.synthetic (validated)"


class PeakRSS:
    """Samples RSS (bytes) of this process, optionally plus its children, every 10 ms."""

    def __init__(self, children: bool) -> None:
        self.children, self.peak, self._stop = children, 0, threading.Event()
        self._proc = psutil.Process()

    def _now(self) -> int:
        procs = [self._proc] + (self._proc.children(recursive=True) if self.children else [])
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._now())
            time.sleep(0.01)

    def __enter__(self) -> PeakRSS:
        self.peak = self.start = self._now()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._now())


def bench_pandas(ledger: pd.DataFrame) -> tuple[dict, pd.DataFrame]:
    dispatch_time_features(ledger.head(1000))  # warm imports and caches
    with PeakRSS(children=False) as mem:
        t0 = time.perf_counter()
        out = dispatch_time_features(ledger, ProjectionConfig())
        secs = time.perf_counter() - t0
    return {"seconds": round(secs, 2), "rows_per_s": round(len(ledger) / secs),
            "peak_rss_gb": round(mem.peak / GB, 2),
            "rss_at_start_gb": round(mem.start / GB, 2)}, out


def bench_splits_and_version(ledger: pd.DataFrame, projected: pd.DataFrame) -> dict:
    t0 = time.perf_counter()
    counts = split_counts(time_ordered_splits(projected, SplitConfig()))
    t1 = time.perf_counter()
    ledger_fingerprint(ledger)
    t2 = time.perf_counter()
    return {"splits_seconds": round(t1 - t0, 2), "split_rows": counts,
            "fingerprint_seconds": round(t2 - t1, 2)}


def frame_digest(frame: pd.DataFrame) -> str:
    """sha256 of a frame's values, index, column names and dtypes (row-order sensitive)."""
    h = hashlib.sha256(repr([(c, str(d)) for c, d in frame.dtypes.items()]).encode())
    h.update(pd.util.hash_pandas_object(frame, index=True).to_numpy().tobytes())
    return h.hexdigest()


def bench_dask(ledger: pd.DataFrame, want_digest: str, want_columns: list[str],
               workers: int) -> dict:
    from replaylab.compute import ComputeConfig, engine
    from replaylab.projection.partitioned import project_and_split

    n_parts = max(2, -(-len(ledger) // 250_000))
    with engine(ComputeConfig(kind="dask", n_workers=workers)) as eng:
        with PeakRSS(children=True) as mem:
            t0 = time.perf_counter()
            features, _ = project_and_split(eng, eng.from_pandas(ledger, n_parts),
                                            ProjectionConfig())
            got = eng.collect(features).drop(columns="split")
            secs = time.perf_counter() - t0
    # the engine's rows come partition by partition: compare in the ledger's row order
    got = got.set_index(L.REQUEST_ID).loc[ledger[L.REQUEST_ID].to_numpy()].reset_index()
    got = got[list(want_columns)]
    got.index = ledger.index
    return {"seconds": round(secs, 2), "rows_per_s": round(len(ledger) / secs),
            "peak_rss_gb_client_plus_workers": round(mem.peak / GB, 2),
            "rss_at_start_gb": round(mem.start / GB, 2),
            "workers": workers, "partitions": n_parts,
            "equals_pandas": frame_digest(got) == want_digest}


def merge_results(path: Path, key: str, figures: dict) -> None:
    try:
        results = json.loads(path.read_text()) if path.exists() else {}
    except json.JSONDecodeError:
        results = {}
    results[key] = figures
    path.write_text(json.dumps(results, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-dask", action="store_true")
    ap.add_argument("--json", action="store_true", help="(accepted for bench/run_all.py)")
    ap.add_argument("--out", default=str(HERE / "results.json"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    ledger, source = make_ledger(args.rows)
    figures: dict = {"rows": len(ledger), "sessions": int(ledger[L.SESSION_ID].nunique()),
                     "ledger": source, "generate_seconds": round(time.perf_counter() - t0, 2),
                     "ledger_rss_gb": round(psutil.Process().memory_info().rss / GB, 2),
                     "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "cpus": len(psutil.Process().cpu_affinity() or [])}
    figures["pandas"], want = bench_pandas(ledger)
    figures["pandas"].update(bench_splits_and_version(ledger, want))
    # lifetime peak of this process so far (generation and validation included): exact
    import resource

    figures["pandas"]["ru_maxrss_gb"] = round(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)  # KiB on Linux
    want_digest = frame_digest(want)
    want_columns = list(want.columns)
    del want  # not held while the Dask path is measured
    if not args.no_dask:
        figures["dask"] = bench_dask(ledger, want_digest, want_columns, args.workers)
    merge_results(Path(args.out), "projection", figures)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
