"""Frozen vs online-recalibrated demand hints on time-ordered replays; tabulate for docs/results/demand.md.

    python scripts/demand_online_results.py --out outputs/demand-online [--shared DIR]
        [--only NAME ...] [--reuse] [--step 0.005] [--max-narrowing 0.15]

Datasets: the real traces azure_conv and azure_code+conv (`replaylab.demand.real_traces`,
the overrides of docs/results/demand.md), the embedded synthetic ledger as it is
(`synthetic`) and with an injected mix shift halfway through its test window
(`synthetic+mix`: `replaylab.sources.shift.inject_mix_shift`, the category mix of
the post-shift sessions reversed, seed 0) and with a hidden verbose population
from there on (`synthetic+latent`: `inject_latent_shift`, 30% of the sessions
answer twice as long, seed 0); the model is the one trained on the UNSHIFTED
ledger, so the shift is news to it.

Each model is trained with the user command (`python -m training pipeline=demand
data.ledger=... tracking=off`, seed 0); `--reuse` keeps a run folder that already
has an artifact. The artifact is deployed at the first dispatch of its test
window: `replaylab.hints.online_eval.compare_online` replays the whole ledger in
time order frozen and adaptive, feeding actuals back only after each request
ended and only from the deployment on, and scores both on the test window's
exact rows. Writes OUT/<name>/online.json and online_coverage.png, and
OUT/online_results.json (all of them). DIR: the folder of downloaded public files the
real traces are imported from (default $REPLAYLAB_SHARED_DATA; docs/howto/import-data.md);
the synthetic datasets need none.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from replaylab.apps.shared_data import add_shared_argument, shared_data_or_exit
from replaylab.demand.real_traces.datasets import TRACE_DATASETS, import_trace_ledger, ledger_name
from replaylab.jsonsafe import json_safe

REPO = Path(__file__).resolve().parents[1]
REAL = ("azure_conv", "azure_code+conv")
NAMES = (*REAL, "synthetic", "synthetic+mix", "synthetic+latent")


def train(ledger: Path | None, run_dir: Path, extra: list[str], reuse: bool) -> Path:
    """The run's artifact folder, training it with the user command unless reused."""
    art = run_dir / "artifacts" / "demand"
    if reuse and (art / "manifest.json").is_file():
        return art
    cmd = [sys.executable, "-m", "training", "pipeline=demand", f"hydra.run.dir={run_dir}",
           "tracking=off", *([f"data.ledger={ledger}"] if ledger else []), *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    print(f"  trained in {time.perf_counter() - t0:.0f} s", flush=True)
    return art


def ledger_of(name: str, out: Path, shared: Path | None, reuse: bool) -> tuple[pd.DataFrame, Path, Path]:
    """(the replayed ledger, the ledger file trained on, the run folder)."""
    from replaylab.contracts import read_ledger

    if name in REAL:
        path = out / "ledgers" / f"{ledger_name(name)}.parquet"
        if not path.is_file():
            assert shared is not None, "main resolves --shared for the real traces"
            path.parent.mkdir(parents=True, exist_ok=True)
            import_trace_ledger(name, shared, 0).valid.to_parquet(path, index=False)
        run = out / "runs" / ledger_name(name)
        train(path, run, TRACE_DATASETS[name].overrides, reuse)
        return read_ledger(path).valid, path, run
    run = out / "runs" / "synthetic"
    train(None, run, [], reuse)
    path = run / "ledger.parquet"
    return read_ledger(path).valid, path, run


def evaluate(name: str, out: Path, shared: Path | None, reuse: bool, online) -> dict:
    from replaylab.hints.online_eval import compare_online, deployment_start_ms, online_figure
    from replaylab.runtime.demand import DemandPredictor
    from replaylab.sources.shift import inject_latent_shift, inject_mix_shift

    print(f"[{name}]", flush=True)
    ledger, path, run = ledger_of(name, out, shared, reuse)
    predictor = DemandPredictor.load(run / "artifacts" / "demand")
    if not predictor.loaded:
        raise RuntimeError(f"{name}: artifact did not load: {predictor.reason}")
    window = predictor.manifest["training"]["time_window"]
    halfway = (window["test"]["first_ms"] + window["test"]["last_ms"]) // 2
    if name == "synthetic+mix":
        ledger = inject_mix_shift(ledger, column="category", at_ms=halfway, seed=0)
    elif name == "synthetic+latent":
        ledger = inject_latent_shift(ledger, at_ms=halfway, share=0.3, scale=2.0, seed=0)
    t0 = time.perf_counter()
    cmp = compare_online(ledger, predictor, online=online,
                         online_from_ms=deployment_start_ms(predictor.manifest))
    wall = time.perf_counter() - t0
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    online_figure(cmp, d / "online_coverage.png", title=f"{name}: frozen vs online recalibration")
    s = {"dataset": name, "ledger": str(path), "replay_wall_s": round(wall, 1),
         "test_window_ms": window.get("test"), **cmp.summary}
    (d / "online.json").write_text(json.dumps(json_safe(s), indent=2))
    f, a = s["frozen"], s["adaptive"]
    print(f"  scored {s['rows_scored']:,}: coverage frozen {f['coverage']:.3f} adaptive "
          f"{a['coverage']:.3f}; blocks in band {f['blocks_in_band']} / {a['blocks_in_band']}; "
          f"width ratio where frozen covers {s['width_ratio_where_frozen_covers']}", flush=True)
    return s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "demand-online")
    add_shared_argument(ap)
    ap.add_argument("--only", nargs="*", default=None, choices=NAMES)
    ap.add_argument("--reuse", action="store_true")
    ap.add_argument("--step", type=float, default=None)
    ap.add_argument("--max-narrowing", type=float, default=None)
    args = ap.parse_args()
    from replaylab.runtime.online import OnlineConfig

    kw = {k: v for k, v in (("step", args.step), ("max_narrowing", args.max_narrowing))
          if v is not None}
    online = OnlineConfig(**kw) if kw else None
    names = args.only or NAMES
    shared = shared_data_or_exit(args.shared) if set(names) & set(REAL) else None
    results = [evaluate(n, args.out, shared, args.reuse, online) for n in names]
    (args.out / "online_results.json").write_text(json.dumps(json_safe(results), indent=2))
    print(f"wrote {args.out / 'online_results.json'}")


if __name__ == "__main__":
    main()
