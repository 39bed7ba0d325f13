"""Benchmark: `pipeline=router compute=dask` over receipts ledger datasets vs the local run.

Ledgers: `simulate_receipts` on the shipped RouteLLM GSM8K outcomes (5% exploration,
escalations; the GSM8K prompts reused across sessions, so the embedding cache serves
most openings after the first), written as a deployment writes them
(`deployment_ledger`) into Parquet files of at most 500,000 rows under
`--root/receipts-<rows>/`, with replays of 25% of the opening prompts, of which the runs
read a seeded `REPLAY_ROWS` (an offline-replay file is bounded by the replay plan's
budget, not by the ledger, and is read on the driver). Made once per size in a child
process (not timed) and reused.

Each run is `python -m training pipeline=router ...` in its own process, the static
encoder tier, the default router config except a single head (`head_select.enabled=false`,
`teachers=1`, `spread_seeds=1`: the head's fits are bounded by
`receipts.max_train_decisions` in both modes and are not what this measures). The
driver's peak RSS is sampled (psutil, 20 ms) on the `python -m training` process ONLY:
under compute=dask the LocalCluster's workers are other processes. Prints one JSON object
on the last line (--out writes it too).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
MB = 2**20
ROWS_PER_FILE = 500_000
REPLAY_ROWS = 20_000
QUICK = ["router.head_select.enabled=false", "router.head.teachers=1", "router.spread_seeds=1",
         "router.encoder.tier=static"]


def make_ledger(rows: int, folder: Path) -> None:
    """The receipts dataset and its replays (child process: the generator's memory is not
    the pipeline's)."""
    import numpy as np

    from replaylab.apps.inputs import default_outcomes
    from replaylab.router.config import RouterExplorationConfig
    from replaylab.router.exploration import deployment_ledger, replay_outcomes, simulate_receipts
    from replaylab.router.pipeline_config import router_config
    from replaylab.router.replay import outcome_matrix
    from replaylab.router.rules import ScenarioRules
    from replaylab.sources.routellm import import_routellm_gsm8k

    sys.path.insert(0, str(REPO / "scripts"))
    from router_results import router_values

    outcomes = import_routellm_gsm8k(default_outcomes())
    values = router_values(0)
    values.pop("encoder")
    cfg = router_config(values)
    m = outcome_matrix(outcomes, cfg.cost, candidates=cfg.candidates)
    rules = ScenarioRules(cfg.rules).fit(m)
    per = max(1, math.ceil(rows / (m.n_prompts * 2.9)))  # ~2.9 turns a session
    sim = simulate_receipts(m, rules, RouterExplorationConfig(sessions_per_prompt=per, seed=0,
                                                              mean_session_gap_s=1.0))
    texts = outcomes.drop_duplicates("prompt_id").set_index("prompt_id")["prompt_text"].to_dict()
    led = deployment_ledger(sim, texts)
    rep = replay_outcomes(sim, m, texts, share=0.25, seed=0)
    tmp = folder.with_suffix(".tmp")
    (tmp / "ledger").mkdir(parents=True, exist_ok=True)
    for i, lo in enumerate(range(0, len(led), ROWS_PER_FILE)):
        led.iloc[lo:lo + ROWS_PER_FILE].to_parquet(tmp / "ledger" / f"part-{i:04d}.parquet",
                                                    index=False)
    rep.to_parquet(tmp / "replays.parquet", index=False)
    (tmp / "facts.json").write_text(json.dumps({
        "rows": int(len(led)), "sessions": int(sim.stats["sessions"]),
        "files": int(np.ceil(len(led) / ROWS_PER_FILE))}))
    tmp.rename(folder)


class PidPeak:
    """Peak RSS of one process (not its children), sampled every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.proc, self.peak, self.stop = psutil.Process(pid), 0, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.02)


def replay_file(data: Path) -> Path:
    """The replays the runs read: a seeded REPLAY_ROWS of the generated ones."""
    import pandas as pd

    path = data / f"replays-{REPLAY_ROWS}.parquet"
    if not path.exists():
        rep = pd.read_parquet(data / "replays.parquet")
        rep.sample(n=min(REPLAY_ROWS, len(rep)), random_state=0).to_parquet(path, index=False)
    return path


def run_router(data: Path, out: Path, cache: Path, dask: bool, workers: int) -> dict:
    cmd = [sys.executable, "-m", "training", "pipeline=router", f"data.ledger={data / 'ledger'}",
           f"data.replays={replay_file(data)}", f"router.encoder.cache_dir={cache}",
           "tracking=off", f"hydra.run.dir={out}", *QUICK]
    if dask:
        cmd += ["compute=dask", f"compute.n_workers={workers}"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = PidPeak(proc.pid)
    log, _ = proc.communicate()
    wall = time.perf_counter() - t0
    peak.stop.set()
    if proc.returncode != 0:
        return {"rc": proc.returncode, "wall_s": round(wall, 1),
                "driver_peak_rss_mb": round(peak.peak / MB), "log_tail": log[-2000:]}
    s = json.loads((out / "summary.json").read_text())
    return {"rc": 0, "wall_s": round(wall, 1), "driver_peak_rss_mb": round(peak.peak / MB),
            "verdict": s.get("verdict"), "stages_s": s.get("timings_s"),
            "test_sessions": s["ope"]["sessions"],
            "dr_quality": s["ope"]["dr"], "diff_quality": s["ope"]["diff"]["quality"],
            "diff_cost": s["ope"]["diff"]["cost"], "threshold": s["operating_point"]["threshold"],
            "driver_rows": (s.get("compute") or {}).get("driver_rows"),
            "partitions": (s.get("compute") or {}).get("partitions"),
            "served_check": s.get("served_check", {}).get("agreement")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000000,5000000")
    ap.add_argument("--local-max", type=int, default=1_000_000)
    ap.add_argument("--root", default="/tmp/replaylab-router-scale")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--modes", default="dask,local", help="which runs: dask, local or both")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    cache = REPO / "outputs" / "cache"
    result: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "cpus": os.cpu_count(), "load_avg_start": os.getloadavg(), "runs": []}
    for rows in (int(x) for x in args.sizes.split(",")):
        data = root / f"receipts-{rows}"
        if not data.exists():
            p = mp.get_context("spawn").Process(target=make_ledger, args=(rows, data))
            p.start()
            p.join()
            if p.exitcode != 0:
                raise SystemExit(f"making the {rows}-row ledger failed ({p.exitcode})")
        facts = json.loads((data / "facts.json").read_text())
        for dask in (True, False):
            if (not dask and rows > args.local_max) or \
                    ("dask" if dask else "local") not in args.modes.split(","):
                continue
            out = root / f"run-{rows}-{'dask' if dask else 'local'}-{int(time.time())}"
            got = run_router(data, out, cache, dask, args.workers)
            got.update(mode="dask" if dask else "local", **facts,
                       rows_per_s=round(facts["rows"] / got["wall_s"]),
                       load_avg_end=os.getloadavg())
            result["runs"].append(got)
            print(json.dumps(got), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
