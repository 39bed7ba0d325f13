"""Does the receipts-mode OPE cover the truth? The table behind docs/results/router.md
"From your receipts: coverage over seeds".

    python scripts/router_receipts_coverage.py OUT.json [DATA_DIR | --shared DIR] [--seeds 0 1 ... 19]
        [--sets gsm8k mmlu] [--tier static|minilm] [--rate 0.05] [--sessions-per-prompt 3]
        [--override head.teachers=1 ...]

For each outcome set and seed: the scenario rules fitted on the whole table are the
logging policy; `simulate_receipts` logs `sessions_per_prompt` sessions per prompt with
session-scoped exploration at `rate`, written as a deployment writes them
(`deployment_ledger`: category, prompt_text on opening turns, no benchmark ids), plus
offline replays of 25% of the opening prompts (`replay_outcomes`). `train_router_receipts`
trains and judges on those files alone; the simulator's full table then gives the truth
of the served router's test decisions (`policy_truth`). One JSON line per run, all rows in
OUT.json, and a summary: the share of seeds whose DR interval (quality, paired quality
difference, cost) covers the truth, and every GO checked against the truth (never GO
when the truth is worse than the margin or not cheaper).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from router_results import (  # noqa: E402
    add_outcomes_arguments,
    apply_overrides,
    load_tier_encoder,
    outcomes_root,
    router_values,
)

from replaylab.apps.inputs import default_outcomes  # noqa: E402
from replaylab.contracts import validate_ledger  # noqa: E402
from replaylab.pipelines.router_receipts import train_router_receipts  # noqa: E402
from replaylab.router.config import RouterExplorationConfig  # noqa: E402
from replaylab.router.embed_cache import cached_embed  # noqa: E402
from replaylab.router.exploration import (  # noqa: E402
    deployment_ledger,
    policy_truth,
    replay_outcomes,
    simulate_receipts,
)
from replaylab.router.ope import covers  # noqa: E402
from replaylab.router.pipeline_config import router_config  # noqa: E402
from replaylab.router.public_sets import SETS, public_outcome_sets  # noqa: E402
from replaylab.router.replay import outcome_matrix  # noqa: E402
from replaylab.router.rules import ScenarioRules  # noqa: E402


def one_run(outcomes, vals: dict, seed: int, rate: float, spp: int, embed, encoder_id: str,
            scorer: str, out: Path) -> dict:
    cfg = router_config(vals)
    m = outcome_matrix(outcomes, cfg.cost, candidates=cfg.candidates)
    rules = ScenarioRules(cfg.rules).fit(m)
    sim = simulate_receipts(m, rules, RouterExplorationConfig(
        rate=rate, cap=cfg.exploration.cap, sessions_per_prompt=spp, seed=seed))
    texts = outcomes.drop_duplicates("prompt_id").set_index("prompt_id")["prompt_text"].to_dict()
    led = deployment_ledger(sim, texts)
    rep = replay_outcomes(sim, m, texts, share=0.25, seed=seed)
    t = time.perf_counter()
    s, run = train_router_receipts(validate_ledger(led), rep, cfg, out, embed, encoder_id,
                                   head_scorer=scorer)
    truth = policy_truth(sim, m, run.test_sessions, run.test_choice)
    ope = s["ope"]

    margin = float(cfg.objective.margin)  # the default objective: incumbent
    truly_ok = truth["diff_quality"] >= -margin and truth["diff_cost"] < 0
    return {"seed": seed, "sessions": int(sim.stats["sessions"]), "turns": int(len(led)),
            "test_sessions": int(ope["sessions"]), "explored_test": int(ope["explored_sessions"]),
            "ess": ope["ess"], "dr": ope["dr"], "ips": ope["ips"], "snips": ope["snips"],
            "cost": ope["cost"], "diff": ope["diff"], "logging": ope["logging"],
            "truth": truth, "covers": {"dr_quality": covers(ope["dr"], truth["quality"]),
                                       "ips_quality": covers(ope["ips"], truth["quality"]),
                                       "snips_quality": covers(ope["snips"], truth["quality"]),
                                       "diff_quality": covers(ope["diff"]["quality"],
                                                              truth["diff_quality"]),
                                       "cost": covers(ope["cost"], truth["cost"]),
                                       "diff_cost": covers(ope["diff"]["cost"], truth["diff_cost"])},
            "go": s["go"], "truth_says_go": bool(truly_ok),
            "wrong_go": bool(s["go"] and not truly_ok), "go_reason": s["go_reason"],
            "seconds": round(time.perf_counter() - t, 2)}


def summarize(rows: list[dict]) -> dict:
    out = {}
    for name in sorted({r["data"] for r in rows}):
        rs = [r for r in rows if r["data"] == name and "error" not in r]
        if not rs:
            continue
        out[name] = {"runs": len(rs),
                     "coverage": {k: float(np.mean([r["covers"][k] for r in rs]))
                                  for k in rs[0]["covers"]},
                     "go": int(sum(r["go"] for r in rs)),
                     "truth_says_go": int(sum(r["truth_says_go"] for r in rs)),
                     "wrong_go": int(sum(r["wrong_go"] for r in rs)),
                     "diff_quality_dr": [min(r["diff"]["quality"]["estimate"] for r in rs),
                                         max(r["diff"]["quality"]["estimate"] for r in rs)],
                     "diff_quality_truth": [min(r["truth"]["diff_quality"] for r in rs),
                                            max(r["truth"]["diff_quality"] for r in rs)],
                     "diff_cost_dr": [min(r["diff"]["cost"]["estimate"] for r in rs),
                                      max(r["diff"]["cost"]["estimate"] for r in rs)],
                     "mean_ess": float(np.mean([r["ess"] for r in rs]))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    add_outcomes_arguments(ap)  # DATA_DIR or --shared DIR; gsm8k alone needs neither
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(20)))
    ap.add_argument("--sets", nargs="+", choices=SETS, default=["gsm8k"])
    ap.add_argument("--tier", choices=("static", "minilm"), default="static")
    ap.add_argument("--rate", type=float, default=0.05)
    ap.add_argument("--sessions-per-prompt", type=int, default=3)
    ap.add_argument("--override", nargs="*", default=[], metavar="KEY=VALUE")
    ap.add_argument("--runs-dir", default="outputs/router_receipts_coverage")
    args = ap.parse_args()
    base0 = router_values(0)
    enc = base0["encoder"]
    cache = Path(enc["cache_dir"])
    encoder = load_tier_encoder(args.tier, cache, enc)
    embed, _ = cached_embed(encoder, cache / "embeddings")
    scorer = "numpy" if args.tier == "static" else "onnx"
    rows = []
    for name, outcomes, over in public_outcome_sets(outcomes_root(args), default_outcomes(),
                                                    tuple(args.sets)):
        for seed in args.seeds:
            vals = router_values(seed)
            vals.pop("encoder")
            vals = apply_overrides({**copy.deepcopy(vals), **copy.deepcopy(over)}, args.override)
            try:
                row = one_run(outcomes, vals, seed, args.rate, args.sessions_per_prompt, embed,
                              encoder.encoder_id, scorer,
                              Path(args.runs_dir) / f"{name}_{args.tier}_s{seed}")
            except Exception as exc:  # noqa: BLE001 - record and go on
                row = {"seed": seed, "error": str(exc)[:300]}
            row = {"data": name, "tier": args.tier, "rate": args.rate, **row}
            rows.append(row)
            with args.out.with_suffix(".rows.jsonl").open("a") as f:  # kept if a later run dies
                f.write(json.dumps(row, default=str) + "\n")
            print(json.dumps({k: row.get(k) for k in ("data", "seed", "covers", "go",
                                                      "truth_says_go", "error")}), flush=True)
    doc = {"command": " ".join(sys.argv), "summary": summarize(rows), "rows": rows}
    args.out.write_text(json.dumps(doc, indent=1, default=str))
    print(json.dumps(doc["summary"], indent=1))


if __name__ == "__main__":
    main()
