"""Markdown tables of docs/results/router.md from scripts/router_results.py's rows, both tiers.

    python scripts/router_results_tables.py ROWS.json [ROWS.json ...] --runs-dir DIR \
        [--replicates REPS.json ...]

ROWS.json: the OUT.json of `scripts/router_results.py` (one per tier and replay
share); DIR: its `--runs-dir`, where each run wrote `router_decisions_test.parquet`
(for the decision agreement between tiers: same seed, same split, same test
prompts). REPS.json: its `--replicates` file; with it each gap also gets a paired
95% interval of its mean over seeds (replicate i of every seed averaged: the
prompts are resampled within each seed's own test split, the same draw for both
policies), and a gap is marked significant only when that interval excludes zero.
Prints the tables on stdout.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

NAMES = {"gsm8k": "GSM8K", "mmlu": "MMLU", "llmrouter": "LLMRouter", "routerarena": "RouterArena"}


def _f(x: float | None, nd: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.{nd}f}"


def agreement(runs: Path, name: str, share: float, seed: int) -> float | None:
    paths = [runs / f"{name}_{tier}_{share}_s{seed}" / "router_decisions_test.parquet"
             for tier in ("minilm", "static")]
    if not all(p.is_file() for p in paths):
        return None
    a, b = (pd.read_parquet(p)[["prompt_id", "candidate"]] for p in paths)
    m = a.merge(b, on="prompt_id", suffixes=("_m", "_s"))
    return float((m.candidate_m == m.candidate_s).mean()) if len(m) else None


def mean_interval(reps: dict, rows: pd.DataFrame, gap: str) -> tuple[float, float] | None:
    """Paired 95% interval of the mean gap over the rows' seeds, from their replicates."""
    keys = [(r.data, r.tier, r.replay, r.seed) for r in rows.itertuples()]
    if not all(k in reps and gap in reps[k] for k in keys):
        return None
    n = min(len(reps[k][gap]) for k in keys)
    m = np.mean([np.asarray(reps[k][gap][:n], dtype=float) for k in keys], axis=0)
    if not np.isfinite(m).any():
        return None
    lo, hi = np.nanpercentile(m, [2.5, 97.5])
    return float(lo), float(hi)


def gap_cell(rows: pd.DataFrame, key: str, reps: dict, gap: str) -> str:
    """Mean gap over seeds [min, max]; its paired interval and significance where known."""
    gaps = [g for g in rows[key] if isinstance(g, list)]
    if not gaps:
        return "n/a"
    means = np.array([g[0] for g in gaps], dtype=float)
    cell = f"{means.mean():+.3f} [{means.min():+.3f}, {means.max():+.3f}]"
    ci = mean_interval(reps, rows, gap)
    if ci is None:
        wins = sum(1 for g in gaps if g[1][1] < 0)
        losses = sum(1 for g in gaps if g[1][0] > 0)
        return cell + f"; per seed sig. better {wins}/{len(gaps)}, worse {losses}/{len(gaps)}"
    sig = " **significant**" if ci[1] < 0 or ci[0] > 0 else ""
    return cell + f"; paired 95% [{ci[0]:+.3f}, {ci[1]:+.3f}]{sig}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", nargs="+", type=Path)
    ap.add_argument("--runs-dir", type=Path, required=True)
    ap.add_argument("--replicates", type=Path, nargs="*", default=[])
    args = ap.parse_args()
    reps = {(r["data"], r["tier"], r["replay"], r["seed"]): r
            for p in args.replicates for r in json.loads(p.read_text())}
    rows = pd.DataFrame([r for p in args.rows for r in json.loads(p.read_text())])
    rows = rows[rows.get("error").isna()] if "error" in rows else rows
    print("| set | replay | tier | learned | rules | rules_equal | kNN | LightGBM | random | oracle |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (name, share, tier), g in rows.groupby(["data", "replay", "tier"], sort=False):
        if g["learned_cr95"].isna().all():
            continue
        g = g.sort_values("seed")
        cells = [" / ".join(_f(v) for v in g[f"{p}_cr95"])
                 for p in ("learned", "rules", "rules_equal", "knn", "lgbm", "random", "oracle")]
        print(f"| {NAMES[name]} | {share:g} | {tier} | " + " | ".join(cells) + " |")
    print()
    print("| set | replay | tier | learned (mean) | rules | rules_equal | learned - rules_equal "
          "(mean [min, max] over seeds) | learned - rules (same) |")
    print("|---|---|---|---|---|---|---|---|")
    for (name, share, tier), g in rows.groupby(["data", "replay", "tier"], sort=False):
        if g["learned_cr95"].isna().all():
            continue
        print(f"| {NAMES[name]} | {share:g} | {tier} | {_f(g.learned_cr95.mean())} | "
              f"{_f(g.rules_cr95.mean())} | {_f(g.rules_equal_cr95.mean())} | "
              f"{gap_cell(g, 'gap_learned_vs_rules_equal_cr95', reps, 'learned-rules_equal')} | "
              f"{gap_cell(g, 'gap_learned_vs_rules_cr95', reps, 'learned-rules')} |")
    print()
    print("| set | replay | learned static - minilm (per seed) | mean | decision agreement "
          "static vs minilm (per seed) |")
    print("|---|---|---|---|---|")
    for (name, share), g in rows.groupby(["data", "replay"], sort=False):
        m = g[g.tier == "minilm"].set_index("seed")
        s = g[g.tier == "static"].set_index("seed")
        seeds = sorted(set(m.index) & set(s.index))
        if not seeds:
            continue
        agree = [agreement(args.runs_dir, name, share, sd) for sd in seeds]
        if m.learned_cr95.isna().all():
            diff, mean = "(no trade-off)", "n/a"
        else:
            d = [s.learned_cr95[sd] - m.learned_cr95[sd] for sd in seeds]
            diff, mean = " / ".join(f"{x:+.3f}" for x in d), f"{np.mean(d):+.3f}"
        print(f"| {NAMES[name]} | {share:g} | {diff} | {mean} | "
              + " / ".join(_f(a) for a in agree) + " |")


if __name__ == "__main__":
    main()
