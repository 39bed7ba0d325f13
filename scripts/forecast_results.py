"""The runs behind docs/results/forecast.md: import each trace, backtest every forecaster.

    python scripts/forecast_results.py --out outputs/forecast-results [--shared DIR]

DIR: the folder of downloaded public files (default $REPLAYLAB_SHARED_DATA; the files and
where to get them: docs/howto/import-data.md); each import names its file in it.

Each step is the user command (`python -m training pipeline=import ...`, then
`python -m training pipeline=forecast ... tracking=off`) with the overrides listed
in RUNS; the combined Azure ledger is the two imported ledgers concatenated.
Writes OUT/<run>/summary.json (and the rest of each run), OUT/results.json (per
run: the best forecaster, the comparison and each forecaster's MASE, pinball and
cov80) and prints the per-forecaster table the document shows.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

from replaylab.apps.shared_data import add_shared_argument, shared_data_or_exit

REPO = Path(__file__).resolve().parents[1]
# the imported files, inside the shared folder
SERVEGEN_LANGUAGE = "traces/servegen/language/m-large"
SERVEGEN_REASON = "traces/servegen/reason/deepseek-r1"
AZURE_FILES = {"azure_code": "traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv",
               "azure_conv": "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"}
AZURE = ["forecast.aggregation.bucket_seconds=60", "forecast.backtest.horizon_buckets=5",
         "forecast.backtest.step_buckets=1", "forecast.backtest.min_train_buckets=24"]
# name -> (input override, forecast overrides); inputs are written by IMPORTS below
RUNS: dict[str, tuple[str, list[str]]] = {
    "servegen_language": ("data.aggregates={data}/servegen_language.parquet",
                          ["forecast.backtest.n_windows=96"]),
    "servegen_language_last_day": ("data.aggregates={data}/servegen_language.parquet", []),
    "servegen_reason": ("data.aggregates={data}/servegen_reason.parquet",
                        ["forecast.backtest.n_windows=12"]),
    "azure_code+conv": ("data.ledger={data}/azure_code+conv.parquet", AZURE),
    "azure_code": ("data.ledger={data}/azure_code.parquet", AZURE),
    "azure_conv": ("data.ledger={data}/azure_conv.parquet", AZURE),
}


def training(*overrides: str) -> None:
    """`python -m training <overrides>` in the repo root; exit with its error on failure."""
    proc = subprocess.run([sys.executable, "-m", "training", *overrides], cwd=REPO,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"python -m training {' '.join(overrides)}: exit {proc.returncode}\n"
                 + (proc.stderr or proc.stdout)[-2000:])


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def import_inputs(data: Path, shared: Path) -> None:
    data.mkdir(parents=True, exist_ok=True)
    training("pipeline=import", "source=servegen", f"source.path={shared / SERVEGEN_LANGUAGE}",
             f"out={data}/servegen_language.parquet")
    training("pipeline=import", "source=servegen", f"source.path={shared / SERVEGEN_REASON}",
             f"out={data}/servegen_reason.parquet")
    for name, rel in AZURE_FILES.items():
        training("pipeline=import", f"source={name}", f"source.path={shared / rel}",
                 f"out={data}/{name}.parquet")
    pd.concat([pd.read_parquet(data / "azure_code.parquet"),
               pd.read_parquet(data / "azure_conv.parquet")]).to_parquet(
        data / "azure_code+conv.parquet")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "forecast-results")
    add_shared_argument(ap)
    args = ap.parse_args()
    shared = shared_data_or_exit(args.shared)
    out, data = args.out.resolve(), args.out.resolve() / "data"
    import_inputs(data, shared)
    results, lines = {}, ["| dataset | forecaster | MASE | pinball | cov80 |", "|---|---|---|---|---|"]
    for name, (source, extra) in RUNS.items():
        training("pipeline=forecast", source.format(data=data), *extra,
                 f"hydra.run.dir={out / name}", "tracking=off")
        s = json.loads((out / name / "summary.json").read_text())
        results[name] = {k: s[k] for k in ("best", "beats_seasonal_naive", "targets", "backtest")}
        for f, b in s["backtest"].items():
            lines.append(f"| {name} | {f}{' **best**' if f == s['best'] else ''} "
                         f"| {fmt(b['mase'], '.3f')} | {fmt(b['pinball_mean'], ',.2f')} "
                         f"| {fmt(b['coverage_80'] and 100 * b['coverage_80'], '.1f')}% |")
        print(lines[-1].split(" | ")[0], "done", flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
