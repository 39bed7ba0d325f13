"""Two rounds of the router's loop, as a deployment runs it (docs/results/router.md, "The loop").

    python scripts/router_loop.py OUT_DIR [--seed 0] [--rate 0.05] [--sessions-per-prompt 3]
        [--round1-sessions 4000] [--tier static] [--override KEY=VALUE ...]

Round 0: the scenario rules (fitted on the shipped RouteLLM GSM8K table) are the logging
policy; `simulate_receipts` logs their sessions with session-scoped exploration, written
as a deployment writes them (OUT/round0/receipts.parquet) with offline replays of 25% of
the opening prompts (replays.parquet). `python -m training pipeline=router
data.ledger=...` trains on those files (OUT/train0). Round 1: the exported artifact is
loaded by `replaylab.runtime.Router` and served through `replaylab.runtime.SessionBinder`
(exploration `--rate`) over new sessions on the same table (`serve_sessions`): the
receipts it writes are OUT/round1/receipts.parquet, and `python -m training` trains on
them (OUT/train1). Each round's OPE is then checked against the table's truth
(`policy_truth` on the test decisions the run wrote). Prints and writes OUT/loop.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from replaylab.apps.inputs import default_outcomes
from replaylab.contracts import validate_ledger
from replaylab.contracts.columns import Ledger as L
from replaylab.router.config import RouterCostConfig, RouterExplorationConfig, RouterRulesConfig
from replaylab.router.exploration import (
    deployment_ledger,
    policy_truth,
    replay_outcomes,
    serve_sessions,
    simulate_receipts,
)
from replaylab.router.replay import outcome_matrix
from replaylab.router.rules import ScenarioRules
from replaylab.runtime import Router, SessionBinder
from replaylab.sources.routellm import import_routellm_gsm8k

REPO = Path(__file__).resolve().parents[1]
CHEAP, STRONG = "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"
COST = {CHEAP: 0.00012, STRONG: 0.01235}  # conf/router/default.yaml call_cost_usd


def train(ledger: Path, replays: Path | None, out: Path, seed: int, tier: str,
          overrides: list[str]) -> dict:
    """`python -m training pipeline=router data.ledger=...`, as a user runs it."""
    cmd = [sys.executable, "-m", "training", "pipeline=router", f"data.ledger={ledger}",
           f"router.encoder.tier={tier}", "tracking=off", f"seed={seed}",
           f"hydra.run.dir={out}", *overrides]
    if replays is not None:
        cmd.append(f"data.replays={replays}")
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if res.returncode != 0:
        raise SystemExit(f"training failed ({res.returncode}): {res.stderr[-2000:]}")
    return json.loads((out / "summary.json").read_text())


def judged(summary: dict, sim, matrix, run_dir: Path) -> dict:
    """The run's OPE beside the truth of the test decisions it wrote."""
    dec = pd.read_parquet(run_dir / "router_decisions_test.parquet")
    col = {c: j for j, c in enumerate(matrix.candidates)}
    truth = policy_truth(sim, matrix, dec["session_id"].to_numpy(),
                         dec["candidate"].map(col).to_numpy(np.int64))
    ope = summary["ope"]

    def covers(d: dict, v: float) -> bool:
        # a degenerate interval (every replicate equal, e.g. all sessions routed to one
        # candidate of fixed cost) and its truth differ by float rounding only
        tol = 1e-12 * max(1.0, abs(v))
        return bool(d["ci"][0] - tol <= v <= d["ci"][1] + tol)

    return {"go": summary["go"], "go_reason": summary["go_reason"], "splits": summary["splits"],
            "ope": {k: ope[k] for k in ("ips", "snips", "dr", "cost", "diff", "logging", "ess",
                                        "n", "sessions", "explored_sessions", "agreement")},
            "spread": summary.get("spread"), "truth": truth,
            "covers": {"dr_quality": covers(ope["dr"], truth["quality"]),
                       "diff_quality": covers(ope["diff"]["quality"], truth["diff_quality"]),
                       "cost": covers(ope["cost"], truth["cost"]),
                       "diff_cost": covers(ope["diff"]["cost"], truth["diff_cost"])}}


def run_loop(out: Path, seed: int, rate: float, spp: int, n1: int, tier: str,
             overrides: list[str]) -> dict:
    outcomes = import_routellm_gsm8k(default_outcomes())
    m = outcome_matrix(outcomes, RouterCostConfig(call_cost_usd=COST), candidates=[CHEAP, STRONG])
    texts = outcomes.drop_duplicates("prompt_id").set_index("prompt_id")["prompt_text"].to_dict()
    rules = ScenarioRules(RouterRulesConfig()).fit(m)
    sim0 = simulate_receipts(m, rules, RouterExplorationConfig(rate=rate, sessions_per_prompt=spp,
                                                               seed=seed))
    (out / "round0").mkdir(parents=True, exist_ok=True)
    led0, rep0 = out / "round0" / "receipts.parquet", out / "round0" / "replays.parquet"
    deployment_ledger(sim0, texts).to_parquet(led0, index=False)
    replay_outcomes(sim0, m, texts, share=0.25, seed=seed).to_parquet(rep0, index=False)
    s0 = train(led0, rep0, out / "train0", seed, tier, overrides)

    router = Router.load(out / "train0" / "artifacts" / "router")
    if not router.loaded:
        raise SystemExit(f"the round-0 artifact did not load: {router.reason}")
    binder = SessionBinder(router, rate=rate, salt=f"round1-{seed}")
    start = int(sim0.ledger[L.TIMESTAMP].max()) + 3_600_000
    sim1 = serve_sessions(binder, m, texts, sessions=n1, seed=seed + 1000, start_ms=start)
    (out / "round1").mkdir(parents=True, exist_ok=True)
    led1, rep1 = out / "round1" / "receipts.parquet", out / "round1" / "replays.parquet"
    sim1.ledger.to_parquet(led1, index=False)
    replay_outcomes(sim1, m, texts, share=0.25, seed=seed).to_parquet(rep1, index=False)
    checked = validate_ledger(pd.read_parquet(led1), source=str(led1))
    first = checked.valid[checked.valid[L.TURN_INDEX] == 0]
    explored = first[L.ROUTING_SOURCE] == "exploration"
    k = len(m.candidates)
    s1 = train(led1, rep1, out / "train1", seed, tier, overrides)
    doc = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "seed": seed, "rate": rate,
           "outcomes": "RouteLLM GSM8K (shipped)", "tier": tier, "overrides": overrides,
           "round0": {"sessions": int(sim0.stats["sessions"]), "turns": int(len(sim0.ledger)),
                      "logging": "scenario rules + session-scoped exploration (simulator)",
                      **judged(s0, sim0, m, out / "train0")},
           "round1": {"sessions": n1, "turns": int(len(checked.valid)),
                      "rows_quarantined": checked.rows_quarantined,
                      "logging": "the round-0 artifact through the runtime SessionBinder",
                      "explored_share": float(explored.mean()),
                      "propensities_explored": sorted(set(first.loc[explored, L.PROPENSITY]
                                                          .round(12))),
                      "propensities_own": sorted(set(first.loc[~explored, L.PROPENSITY]
                                                     .round(12))),
                      "expected": {"explored": rate / (k - 1), "own": 1.0 - rate},
                      "binder": sim1.stats.get("binder"),
                      **judged(s1, sim1, m, out / "train1")}}
    (out / "loop.json").write_text(json.dumps(doc, indent=1, default=str))
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float, default=0.05)
    ap.add_argument("--sessions-per-prompt", type=int, default=3)
    ap.add_argument("--round1-sessions", type=int, default=4000)
    ap.add_argument("--tier", choices=("static", "minilm"), default="static")
    ap.add_argument("--override", nargs="*", default=[], metavar="KEY=VALUE",
                    help="extra `python -m training` overrides, e.g. router.head.teachers=1")
    args = ap.parse_args()
    doc = run_loop(args.out, args.seed, args.rate, args.sessions_per_prompt,
                   args.round1_sessions, args.tier, args.override)
    print(json.dumps({r: {k: doc[r][k] for k in ("go", "covers", "truth")}
                      for r in ("round0", "round1")}, indent=1, default=str))


if __name__ == "__main__":
    main()
