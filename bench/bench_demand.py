"""Benchmark: demand training on a --rows synthetic ledger (3 quantiles), local and Dask.

Ledger: `generate_synthetic_ledger(SyntheticLedgerConfig(n_requests=rows), seed=0)`,
validated (not timed). Timed, each with its peak RSS:

- local_pipeline: the whole `train_demand` (projection, splits, labels, the
  quantile model, the four baselines, conformal calibration, evaluation, the
  test predictions written), DemandConfig defaults; this process's RSS.
- local_fit / dask_fit: the model fit alone on the same train rows: locally
  (`QuantileDemandModel.fit`) and through lightgbm.dask on a LocalCluster of
  --workers processes x 1 thread (`demand.fit_partitions.fit_model` on a DaskEngine,
  the rows as --workers session partitions; partitioning included, cluster start
  not); for Dask the RSS is this process plus the worker processes, summed.
  Each fitted model is then calibrated and scored on the test split, so the
  two can be compared (coverage of the calibrated 80% interval, mean pinball).
- dask_pipeline: the whole pipeline over the ledger's partitions on the cluster
  (`pipelines.demand_partitions.train_demand_partitions`, the ledger partitioned from
  memory: what `compute=dask` runs on the synthetic ledger).

Peak RSS is sampled every 10 ms by a thread (bench_projection.PeakRSS).
Prints one JSON object on the last line and merges it into bench/results.json
under "demand" (other keys are kept).
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
from bench_projection import PeakRSS, merge_results

from replaylab.contracts import Ledger as L
from replaylab.contracts import validate_ledger
from replaylab.demand import DemandConfig
from replaylab.demand.conformal import GroupConformal
from replaylab.demand.metrics import interval_metrics
from replaylab.demand.model import QuantileDemandModel, request_cap
from replaylab.pipelines.demand import train_demand
from replaylab.pipelines.demand_model import prepare_data
from replaylab.pipelines.project import LoadedLedger
from replaylab.projection import ProjectionConfig, SplitConfig
from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger

HERE = Path(__file__).resolve().parent
GB = 2**30
SPLIT = SplitConfig(embargo_ms=300_000)  # conf/split/default.yaml


def _gb(n: float) -> float:
    return round(n / GB, 2)


def _test_scores(model: QuantileDemandModel, data, cfg: DemandConfig) -> dict:
    """Calibrate on the calibration split as the pipeline does; score the labelled test rows."""
    calib, test = data.frame("calibration"), data.frame("test")
    cq = model.predict_quantiles(calib)
    conformal = GroupConformal(cfg.interval, cfg.group_columns, cfg.min_group_size,
                               cfg.scale).fit(calib, cq[:, 0], cq[:, -1], data.y("calibration"))
    tq = model.predict_quantiles(test)
    lo, hi = conformal.predict_interval(test, tq[:, 0], tq[:, -1],
                                        request_cap(test) if cfg.clip_to_cap else None)
    usable = data.labels.usable[data.masks["test"]]
    y = data.labels.y_total[data.masks["test"]][usable]
    m = interval_metrics(y, tq[usable], lo[usable], hi[usable], cfg.quantiles)
    return {"test_rows": m["n"], "coverage": round(m["coverage"], 4),
            "mean_pinball": round(m["mean_pinball"], 3),
            "pinball": {k: round(v, 3) for k, v in m["pinball"].items()},
            "mean_width": round(m["mean_width"], 1)}


def bench_pipeline(loaded: LoadedLedger, cfg: DemandConfig, engine: object = None) -> dict:
    from replaylab.pipelines.demand_partitions import train_demand_partitions

    with tempfile.TemporaryDirectory() as tmp, PeakRSS(children=engine is not None) as mem:
        t0 = time.perf_counter()
        if engine is None:
            summary, _run = train_demand(loaded, ProjectionConfig(), SPLIT, cfg, Path(tmp))
        else:
            source = engine.from_validated(loaded.result,
                                           npartitions=engine.facts()["n_workers"])
            summary, _run = train_demand_partitions(engine, source, cfg, ProjectionConfig(),
                                                    SPLIT, Path(tmp))
        secs = time.perf_counter() - t0
    test = summary["test"]["model"]
    return {"seconds": round(secs, 1), "peak_rss_gb": _gb(mem.peak),
            "rss_at_start_gb": _gb(mem.start), "stages_s": summary["timings_s"],
            "best_iterations": summary["model"]["best_iterations"],
            "train_rows": summary["labels"].get("train"),
            "test": {"coverage": round(test["coverage"], 4),
                     "mean_pinball": round(test["mean_pinball"], 3)}}


def bench_fit(data, cfg: DemandConfig, engine: object = None) -> dict:
    from replaylab.contracts.columns import Ledger as L
    from replaylab.demand.censoring import NONE
    from replaylab.demand.fit_partitions import fit_model
    from replaylab.demand.labels import CLASS_COLUMN, LABEL

    train, y = data.frame("train"), data.y("train")
    model = QuantileDemandModel(cfg.quantiles, cfg.model, cfg.scale, cfg.clip_to_cap, cfg.seed)
    with PeakRSS(children=engine is not None) as mem:
        t0 = time.perf_counter()
        if engine is None:
            model.fit(train, y)
        else:
            rows = engine.from_pandas(train.assign(**{CLASS_COLUMN: LABEL}),
                                      npartitions=engine.facts()["n_workers"], by=L.SESSION_ID)
            model = fit_model(engine, rows, cfg, NONE)
        secs = time.perf_counter() - t0
    return {"seconds": round(secs, 1), "peak_rss_gb": _gb(mem.peak),
            "rss_at_start_gb": _gb(mem.start), "train_rows": len(train),
            "best_iterations": model.best_iterations_,
            "validation_rows": model.validation_rows_, **_test_scores(model, data, cfg)}


def bench_dask(loaded: LoadedLedger, data, cfg: DemandConfig, workers: int) -> dict:
    from replaylab.compute import ComputeConfig, engine

    t0 = time.perf_counter()
    with engine(ComputeConfig(kind="dask", n_workers=workers, threads_per_worker=1)) as eng:
        out: dict = {"workers": workers, "threads_per_worker": 1,
                     "cluster_start_seconds": round(time.perf_counter() - t0, 1)}
        out["fit"] = bench_fit(data, cfg, eng)
        out["pipeline"] = bench_pipeline(loaded, cfg, eng)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-dask", action="store_true")
    ap.add_argument("--json", action="store_true", help="(accepted for bench/run_all.py)")
    ap.add_argument("--out", default=str(HERE / "results.json"))
    args = ap.parse_args()
    cfg = DemandConfig()  # 3 quantiles (0.1, 0.5, 0.9), the defaults of conf/demand

    t0 = time.perf_counter()
    raw = generate_synthetic_ledger(SyntheticLedgerConfig(n_requests=args.rows), seed=0)
    loaded = LoadedLedger(validate_ledger(raw, source="synthetic"), origin="synthetic")
    del raw
    ledger = loaded.result.valid
    figures: dict = {
        "rows": len(ledger), "sessions": int(ledger[L.SESSION_ID].nunique()),
        "quantiles": list(cfg.quantiles), "ledger": "replaylab.sources.synthetic (validated)",
        "generate_seconds": round(time.perf_counter() - t0, 1),
        "ledger_rss_gb": _gb(psutil.Process().memory_info().rss),
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": len(psutil.Process().cpu_affinity() or []),
        "lightgbm_threads_local": cfg.model.num_threads,
    }
    del ledger
    figures["local_pipeline"] = bench_pipeline(loaded, cfg)
    t0 = time.perf_counter()
    data = prepare_data(loaded, ProjectionConfig(), SPLIT, cfg)
    figures["prepare_seconds"] = round(time.perf_counter() - t0, 1)
    figures["local_fit"] = bench_fit(data, cfg)
    # lifetime peak of this process so far (generation and validation included): exact
    figures["local_ru_maxrss_gb"] = round(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)  # KiB on Linux
    if not args.no_dask:
        figures["dask"] = bench_dask(loaded, data, cfg, args.workers)
        local, dask = figures["local_fit"], figures["dask"]["fit"]
        figures["dask_vs_local"] = {
            "coverage_diff": round(dask["coverage"] - local["coverage"], 4),
            "mean_pinball_rel_diff": round(
                float(np.divide(dask["mean_pinball"] - local["mean_pinball"],
                                local["mean_pinball"])), 4)}
    figures["targets"] = {"seconds": 600, "peak_rss_gb": 6}
    merge_results(Path(args.out), "demand", figures)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
