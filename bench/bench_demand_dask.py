"""pipeline=demand: compute=dask (`train_demand_partitions` on a DaskEngine) vs local
(`train_demand`) on the same rows.

Writes a seeded synthetic ledger of about --rows rows as a dataset of Parquet parts,
runs the local pipeline on the single file and the Dask pipeline on the dataset
(LocalCluster, --workers processes x 1 thread), and prints one JSON document: wall
times, the model's and every baseline's test figures side by side with their
differences, whether the baselines' fitted state is equal, and the gate of each.

    .venv/bin/python bench/bench_demand_dask.py --rows 1000000 --out /tmp/bdd
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--parts", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-estimators", type=int, default=500)
    ap.add_argument("--local-threads", type=int, default=1,
                    help="LightGBM threads of the local fit (the Dask workers use --threads)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    from replaylab.compute import ComputeConfig, engine
    from replaylab.contracts.io import write_table
    from replaylab.demand import DemandConfig, QuantileModelConfig
    from replaylab.demand.config import CensoringConfig
    from replaylab.pipelines.demand import train_demand
    from replaylab.pipelines.demand_partitions import train_demand_partitions
    from replaylab.pipelines.project import LedgerInput, load_ledger
    from replaylab.projection import ProjectionConfig, SplitConfig
    from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    sessions = max(100, int(args.rows / 1.85))
    frame = generate_synthetic_ledger(
        SyntheticLedgerConfig(n_sessions=sessions, sessions_per_s=max(0.25, sessions / 2.6e6)),
        seed=11)
    single = write_table(frame, out / "one" / "ledger.parquet")
    for i, idx in enumerate(np.array_split(np.arange(len(frame)), args.parts)):
        write_table(frame.iloc[idx], out / "ds" / f"part-{i:03d}.parquet")
    rows = len(frame)
    del frame
    gen_s = time.perf_counter() - t0
    cfg = DemandConfig(model=QuantileModelConfig(num_threads=args.local_threads,
                                                 n_estimators=args.n_estimators),
                       censoring=CensoringConfig(method="none"))
    projection, split = ProjectionConfig(), SplitConfig()

    t0 = time.perf_counter()
    local, lr = train_demand(load_ledger(LedgerInput(path=str(single))), projection, split,
                             cfg, out / "local")
    local_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    compute = ComputeConfig(kind="dask", n_workers=args.workers,
                            threads_per_worker=args.threads)
    with engine(compute) as eng:
        dist, dr = train_demand_partitions(eng, str(out / "ds"), cfg, projection, split,
                                           out / "dask")
    dask_s = time.perf_counter() - t0

    def figs(t: dict) -> dict:
        return {k: t[k] for k in ("mean_pinball", "pinball", "coverage", "mean_width",
                                  "mae_p50")} | {"ci_mean_pinball": t["ci"]["mean_pinball"],
                                                 "ci_coverage": t["ci"]["coverage"]}

    names = ["model", *local["test"]["baselines"]]

    def get(s: dict, name: str) -> dict:
        return s["test"]["model"] if name == "model" else s["test"]["baselines"][name]

    report = {"rows": rows, "generate_s": round(gen_s, 1), "local_s": round(local_s, 1),
              "dask_s": round(dask_s, 1), "workers": args.workers, "threads": args.threads,
              "equal": {k: dist[k] == local[k] for k in ("rows_valid", "splits", "labels",
                                                         "time_window")},
              "figures": {}, "gate": {"local": local["gate"]["reasons"],
                                      "dask": dist["gate"]["reasons"]},
              "timings_local": local["timings_s"], "timings_dask": dist["timings_s"]}
    for name in names:
        a, b = get(local, name), get(dist, name)
        report["figures"][name] = {
            "local": figs(a), "dask": figs(b),
            "rel_diff_mean_pinball": (b["mean_pinball"] - a["mean_pinball"]) / a["mean_pinball"],
            "diff_coverage": b["coverage"] - a["coverage"],
            "rel_diff_mean_width": (b["mean_width"] - a["mean_width"]) / a["mean_width"]}
    bq = {n: bool(np.array_equal(getattr(lr.baselines[n], "global_quantiles_", np.nan),
                                 getattr(dr.baselines[n], "global_quantiles_", np.nan),
                                 equal_nan=True)) for n in lr.baselines}
    report["baseline_global_quantiles_equal"] = bq
    tables = lr.baselines["category_bucket"].tables_, dr.baselines["category_bucket"].tables_
    report["bucket_tables_equal"] = all(
        ta.equals(tb) for ta, tb in zip(*tables, strict=True))
    pd.set_option("display.width", 200)
    text = json.dumps(report, indent=1, default=str)
    (out / "report.json").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
