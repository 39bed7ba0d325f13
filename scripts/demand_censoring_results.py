"""Censoring-aware demand training: none vs realized vs censored pinball; tabulate for docs/results/demand.md.

    python scripts/demand_censoring_results.py --out outputs/demand-censoring [--shared DIR]
        [--seeds 0 1 2] [--only NAME ...] [--reuse]

Datasets: the synthetic ledger at 4,000 sessions (its requests carry caps and some are
cut there), and the real traces azure_conv and azure_code+conv with caps imposed
(`replaylab.sources.shift.inject_caps`: each session draws max_tokens from
256/512/1024/2048, a completion that reaches it is cut and becomes finish_reason=length;
no public trace records caps, so the cut is the only synthetic part). Each (dataset,
seed) is one `python -m training pipeline=demand` run with the default
`demand.censoring.method=auto`: it fits every variant, chooses on the calibration
split and reports every variant's test figures beside the choice (`censoring` in
summary.json). Writes OUT/censoring_results.json and prints a markdown table. DIR: the
folder of downloaded public files the real traces are imported from (default
$REPLAYLAB_SHARED_DATA; docs/howto/import-data.md); the synthetic ledger needs none.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from replaylab.apps.shared_data import add_shared_argument, shared_data_or_exit

REPO = Path(__file__).resolve().parents[1]
REAL = ("azure_conv", "azure_code+conv")
NAMES = ("synthetic", *REAL)


def run(name: str, seed: int, out: Path, shared: Path | None, reuse: bool) -> dict:
    from replaylab.demand.real_traces.datasets import TRACE_DATASETS, import_trace_ledger
    from replaylab.sources.shift import inject_caps

    run_dir = out / "runs" / f"{name}-s{seed}"
    if not (reuse and (run_dir / "summary.json").is_file()):
        extra = [f"seed={seed}"]
        if name in REAL:
            path = out / "ledgers" / f"{name}-caps-s{seed}.parquet"
            if not path.is_file():
                assert shared is not None, "main resolves --shared for the real traces"
                path.parent.mkdir(parents=True, exist_ok=True)
                ledger = import_trace_ledger(name, shared, 0).valid
                inject_caps(ledger, seed=seed).to_parquet(path, index=False)
            extra += [f"data.ledger={path}", *TRACE_DATASETS[name].overrides]
        else:
            extra += ["data.synthetic.n_sessions=4000"]
        cmd = [sys.executable, "-m", "training", "pipeline=demand", f"hydra.run.dir={run_dir}",
               "tracking=off", "export.enabled=false", *extra]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
        print(f"  {name} seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)
    s = json.loads((run_dir / "summary.json").read_text())
    return {"dataset": name, "seed": seed, "censoring": s["censoring"],
            "model_fit_s": s["timings_s"]["model_fit"],
            "test": {k: s["test"]["model"][k] for k in ("coverage", "mean_pinball", "mean_width")}}


def table(rows: list[dict]) -> str:
    """One row per (dataset, seed): the choice, and none / realized / the chosen pinball
    round count (or the largest when pinball was not chosen) on the test rows."""
    head = ("| dataset | seed | chosen (calibration) | cut rows cal / test | test capped hi >= obs: "
            "none / realized / pinball | test label-row pinball vs none: realized / pinball | "
            "width vs none: realized / pinball | consumption pinball vs none: realized / "
            "pinball |")
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        c = r["censoring"]
        cand = c.get("candidates")
        if not cand:
            lines.append(f"| {r['dataset']} | {r['seed']} | {c['method']} ({c['reason']}) | "
                         f"{c['calibration_censored_rows']} / - | - | - | - | - |")
            continue
        pin = c["candidate"] if c["candidate"].startswith("pinball") else \
            max((k for k in cand if k.startswith("pinball")), key=lambda k: int(k.split("@")[1]))
        t = {"none": cand["none"]["test_report_only"],
             "realized": cand["realized"]["test_report_only"], "pinball": cand[pin]["test_report_only"]}

        def rel(k: str, f: str, t: dict = t) -> str:
            return f"{t[k][f] / t['none'][f] - 1:+.1%}"

        hit = " / ".join(f"{t[k]['capped_hi_ge_obs']:.3f}" for k in ("none", "realized", "pinball"))
        lines.append(f"| {r['dataset']} | {r['seed']} | {c['candidate']} | "
                     f"{cand['none']['calibration']['capped_n']} / {t['none']['capped_n']} | "
                     f"{hit} ({pin}) | "
                     f"{rel('realized', 'mean_pinball')} / {rel('pinball', 'mean_pinball')} | "
                     f"{rel('realized', 'mean_width')} / {rel('pinball', 'mean_width')} | "
                     f"{rel('realized', 'consumption_mean_pinball')} / "
                     f"{rel('pinball', 'consumption_mean_pinball')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "demand-censoring")
    add_shared_argument(ap)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--only", nargs="+", choices=NAMES)
    ap.add_argument("--reuse", action="store_true")
    args = ap.parse_args()
    names = args.only or NAMES
    shared = shared_data_or_exit(args.shared) if set(names) & set(REAL) else None
    rows = [run(name, seed, args.out, shared, args.reuse) for name in names for seed in args.seeds]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "censoring_results.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
