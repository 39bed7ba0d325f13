"""A 3-candidate receipts ledger with 5% exploration and 2,844 sessions: thin evidence.

The shipped RouteLLM GSM8K outcomes (Mixtral, GPT-4) plus a seeded middle candidate
(`mid`: per prompt, GPT-4's outcome with probability 0.7 else Mixtral's; 0.003 USD per
call) give a 3-candidate full-information table; its first 948 prompts, 3 sessions each
(2,844 sessions), are logged by the scenario rules with 5% session-scoped exploration by
the router's simulator (`simulate_receipts`, `deployment_ledger`, 25% of openings
replayed), and `python -m training pipeline=router data.ledger=...` judges the router from
the files alone (static encoder tier). docs/results/router.md "Thin evidence".

    python scripts/router_thin_evidence.py OUT [--seed 0] [--override KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

# short names: Hydra's override grammar takes no '/' in a dict key
CHEAP, STRONG, MID = "mixtral", "gpt4", "mid"
NAMES = {"mistralai/Mixtral-8x7B-Instruct-v0.1": CHEAP, "gpt-4-1106-preview": STRONG}
COSTS = {CHEAP: 0.00012, MID: 0.003, STRONG: 0.01235}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=948)
    ap.add_argument("--override", action="append", default=[],
                    help="extra Hydra overrides, e.g. router.head_select.enabled=false")
    args = ap.parse_args()
    from replaylab.apps.inputs import default_outcomes
    from replaylab.router.config import RouterCostConfig, RouterExplorationConfig, RouterRulesConfig
    from replaylab.router.exploration import deployment_ledger, replay_outcomes, simulate_receipts
    from replaylab.router.replay import outcome_matrix
    from replaylab.router.rules import ScenarioRules
    from replaylab.sources.routellm import import_routellm_gsm8k

    base = import_routellm_gsm8k(default_outcomes())
    base["candidate"] = base["candidate"].map(NAMES)
    ids = base["prompt_id"].drop_duplicates().to_numpy()[: args.prompts]
    base = base[base["prompt_id"].isin(ids)]
    rng = np.random.default_rng(args.seed)
    strong = base[base["candidate"] == STRONG].set_index("prompt_id")
    cheap = base[base["candidate"] == CHEAP].set_index("prompt_id")
    take = rng.random(len(strong)) < 0.7
    mid = strong.copy()
    mid["candidate"] = MID
    for col in ("score", "success"):
        mid[col] = np.where(take, strong[col], cheap.reindex(strong.index)[col])
    outcomes = pd.concat([base, mid.reset_index()], ignore_index=True)
    if "cost" in outcomes:
        outcomes["cost"] = outcomes["candidate"].map(COSTS)
    m = outcome_matrix(outcomes, RouterCostConfig(call_cost_usd=COSTS),
                       candidates=(CHEAP, MID, STRONG))
    rules = ScenarioRules(RouterRulesConfig()).fit(m)
    sim = simulate_receipts(m, rules, RouterExplorationConfig(rate=0.05, sessions_per_prompt=3,
                                                              seed=args.seed + 3))
    texts = outcomes.drop_duplicates("prompt_id").set_index("prompt_id")["prompt_text"].to_dict()
    args.out.mkdir(parents=True, exist_ok=True)
    led, rep = deployment_ledger(sim, texts), replay_outcomes(sim, m, texts, share=0.25, seed=0)
    led.to_parquet(args.out / "receipts.parquet", index=False)
    rep.to_parquet(args.out / "replays.parquet", index=False)
    cmd = [sys.executable, "-m", "training", "pipeline=router",
           f"data.ledger={args.out / 'receipts.parquet'}",
           f"data.replays={args.out / 'replays.parquet'}", "router.encoder.tier=static",
           f"router.candidates=[{CHEAP},{MID},{STRONG}]",
           *[f"+router.cost.call_cost_usd.{k}={v}" for k, v in COSTS.items()], "tracking=off", f"seed={args.seed}",
           f"hydra.run.dir={args.out / 'run'}", *args.override]
    res = subprocess.run(cmd, capture_output=True, text=True)
    print(res.stdout[-3000:], res.stderr[-3000:] if res.returncode else "")
    s = json.loads((args.out / "run" / "summary.json").read_text())
    print(json.dumps({"sessions": s["receipts"]["sessions"], "verdict": s["go_detail"],
                      "evidence": s["ope"]["evidence"]["weights"],
                      "auto_clip": {k: v["clip"] for k, v in
                                    s["ope"]["evidence"]["auto_clip"].items()},
                      "hclb": s["ope"]["evidence"]["hclb"],
                      "variants": {k: {f: v[f] for f in ("diff_quality", "diff_cost")}
                                   for k, v in s["ope"]["evidence"]["variants"].items()}},
                     indent=1, default=str))


if __name__ == "__main__":
    main()
