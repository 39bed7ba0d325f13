"""Two rounds of the router's loop, as a deployment runs it (docs/results/router.md, "The loop").

    python scripts/router_loop.py OUT_DIR [--seed 0] [--rate 0.05] [--sessions-per-prompt 3]
        [--round1-sessions 4000] [--tier static] [--replay-selection planned|random]
        [--override KEY=VALUE ...]
    python scripts/router_loop.py OUT_DIR --ab-seeds 20 [--ab-candidates 4]
        [--ab-sessions-per-prompt 2] [--resume] ...

Round 0: the scenario rules (fitted on the shipped RouteLLM GSM8K table) are the logging
policy; `simulate_receipts` logs their sessions with session-scoped exploration, written
as a deployment writes them (OUT/round0/receipts.parquet) with offline replays of 25% of
the opening prompts (replays.parquet). `python -m training pipeline=router
data.ledger=...` trains on those files (OUT/train0). Round 1: the exported artifact is
loaded by `replaylab.runtime.Router` and served through `replaylab.runtime.SessionBinder`
(exploration `--rate`) over new sessions on the same table (`serve_sessions`): the
receipts it writes are OUT/round1/receipts.parquet; its replays (replays.parquet) are round
0's plan (`planned_replays`: the round-0 artifact ranks the logged round-1 openings by what a
replay would teach it; `--replay-selection random`: a seeded 25% as in round 0, which has no
head to plan with), and `python -m training` trains on them (OUT/train1). Each round's OPE is then checked against the table's truth
(`policy_truth` on the test decisions the run wrote). Prints and writes OUT/loop.json.

With --ab-seeds N: OPE checked against the A/B it predicts (`ab_check`, issue 45 item 5),
for traffic seeds 0..N-1: round 0 trains --ab-candidates candidates (seed s judges
candidate s % that); new sessions are split by a fair coin
between the logging policy and the candidate; the OPE interval from the logging half is
compared with the value the A/B half measured (docs/results/router.md, "OPE against the
A/B"). Writes OUT/ab.json and prints the table.
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
from replaylab.contracts.columns import Outcomes as O
from replaylab.router.config import (
    RouterCostConfig,
    RouterEvalConfig,
    RouterExplorationConfig,
    RouterRulesConfig,
)
from replaylab.router.exploration import (
    bandit_rows,
    deployment_ledger,
    policy_truth,
    replay_outcomes,
    serve_sessions,
    simulate_receipts,
)
from replaylab.router.ope import covers, logged_decisions, ope_estimates, policy_matrix
from replaylab.router.replay import Label, outcome_matrix
from replaylab.router.replay_plan import pair_priority, plan_prompts
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

    return {"go": summary["go"], "go_reason": summary["go_reason"], "splits": summary["splits"],
            "ope": {k: ope[k] for k in ("ips", "snips", "dr", "cost", "diff", "logging", "ess",
                                        "n", "sessions", "explored_sessions", "agreement")},
            "spread": summary.get("spread"), "truth": truth,
            "covers": {"dr_quality": covers(ope["dr"], truth["quality"]),
                       "diff_quality": covers(ope["diff"]["quality"], truth["diff_quality"]),
                       "cost": covers(ope["cost"], truth["cost"]),
                       "diff_cost": covers(ope["diff"]["cost"], truth["diff_cost"])}}


def table() -> tuple:
    """The shipped GSM8K outcome table (cheap, strong), its prompt texts and the rules."""
    outcomes = import_routellm_gsm8k(default_outcomes())
    m = outcome_matrix(outcomes, RouterCostConfig(call_cost_usd=COST), candidates=[CHEAP, STRONG])
    texts = outcomes.drop_duplicates("prompt_id").set_index("prompt_id")["prompt_text"].to_dict()
    return m, texts, ScenarioRules(RouterRulesConfig()).fit(m)


def round0(out: Path, m, texts: dict, rules: ScenarioRules, seed: int, rate: float, spp: int,
           tier: str, overrides: list[str], resume: bool = False) -> tuple:
    """Round 0: the rules' receipts (simulator) -> `python -m training` -> the loaded artifact.
    resume: a finished training already in OUT/train0 (same arguments) is reused."""
    sim0 = simulate_receipts(m, rules, RouterExplorationConfig(rate=rate, sessions_per_prompt=spp,
                                                               seed=seed))
    (out / "round0").mkdir(parents=True, exist_ok=True)
    led0, rep0 = out / "round0" / "receipts.parquet", out / "round0" / "replays.parquet"
    deployment_ledger(sim0, texts).to_parquet(led0, index=False)
    replay_outcomes(sim0, m, texts, share=0.25, seed=seed).to_parquet(rep0, index=False)
    done = out / "train0" / "summary.json"
    s0 = (json.loads(done.read_text()) if resume and done.exists()
          else train(led0, rep0, out / "train0", seed, tier, overrides))
    router = Router.load(out / "train0" / "artifacts" / "router")
    if not router.loaded:
        raise SystemExit(f"the round-0 artifact did not load: {router.reason}")
    return sim0, s0, router


def planned_replays(router: Router, sim, m, texts: dict, share: float, seed: int) -> tuple:
    """Round 1's replays are round 0's plan: the round-0 artifact (what the team has when
    round 1's receipts arrive) scores every logged round-1 opening, each opening is worth
    the sum of `pair_priority` (its P(success) near the served threshold) over the candidates
    its receipt did not observe, and the top `share` of the openings, spread over the
    categories (`plan_prompts`), are replayed. Never reads an outcome it has not logged.
    Returns (outcomes-v1 replay rows, a report)."""
    _, q = candidate_choices(router, m, texts)
    first = sim.ledger[sim.ledger[L.TURN_INDEX] == 0]
    row_of = pd.Series(sim.truth.prompt_row, index=sim.truth.session_id.astype(str))
    rows = row_of.reindex(first[L.SESSION_ID].astype(str)).to_numpy(np.int64)
    col = {c: j for j, c in enumerate(m.candidates)}
    logged = first[L.SELECTED_MODEL].map(col).to_numpy(np.int64)
    pair, _ = pair_priority(q[rows], float(router.threshold), router.rule)
    pair[np.arange(len(rows)), logged] = 0.0
    value = pair.sum(axis=1)
    pick = plan_prompts(value, int(round(share * len(first))),
                        first[L.CATEGORY].astype(str).to_numpy(), seed)
    sessions = first[L.SESSION_ID].to_numpy()[pick]
    report = {"selection": "planned", "plan": "round-0 artifact's P(success) near its threshold",
              "openings": int(len(first)), "replayed": int(len(pick)),
              "mean_value_replayed": float(value[pick].mean()) if len(pick) else 0.0,
              "mean_value_all": float(value.mean()) if len(value) else 0.0}
    return replay_outcomes(sim, m, texts, share=1.0, seed=seed, sessions=sessions), report


def run_loop(out: Path, seed: int, rate: float, spp: int, n1: int, tier: str,
             overrides: list[str], selection: str = "planned") -> dict:
    m, texts, rules = table()
    sim0, s0, router = round0(out, m, texts, rules, seed, rate, spp, tier, overrides)
    binder = SessionBinder(router, rate=rate, salt=f"round1-{seed}")
    start = int(sim0.ledger[L.TIMESTAMP].max()) + 3_600_000
    sim1 = serve_sessions(binder, m, texts, sessions=n1, seed=seed + 1000, start_ms=start)
    (out / "round1").mkdir(parents=True, exist_ok=True)
    led1, rep1 = out / "round1" / "receipts.parquet", out / "round1" / "replays.parquet"
    sim1.ledger.to_parquet(led1, index=False)
    if selection == "planned":
        replays1, replay_report = planned_replays(router, sim1, m, texts, 0.25, seed)
    else:
        replays1 = replay_outcomes(sim1, m, texts, share=0.25, seed=seed)
        replay_report = {"selection": "random", "share": 0.25}
    replays1.to_parquet(rep1, index=False)
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
                      "replays": replay_report,
                      **judged(s1, sim1, m, out / "train1")}}
    (out / "loop.json").write_text(json.dumps(doc, indent=1, default=str))
    return doc


def candidate_choices(router: Router, m, texts: dict) -> tuple[np.ndarray, np.ndarray]:
    """(n_prompts,) the served artifact's column for each prompt of the table and (n_prompts,
    K) its P(success) per candidate (the DR reward model; fitted on round 0, never on the
    sessions it evaluates), from the inputs a binder gives it (text, task, prompt length)."""
    task = m.meta[O.TASK].astype(str).to_numpy()
    length = m.meta[Label.PROMPT_LENGTH].to_numpy(float)
    col = {c: j for j, c in enumerate(m.candidates)}
    choice, q = np.zeros(m.n_prompts, np.int64), np.zeros((m.n_prompts, len(m.candidates)))
    for i, pid in enumerate(m.prompt_ids):
        d = router.route(texts.get(pid, ""), task[i], float(length[i]))
        choice[i] = col[d.candidate]
        q[i] = [d.scores[c] for c in m.candidates]
    return choice, q


def measured(rows: pd.DataFrame, column: str) -> dict:
    """The A/B arm's mean per opening decision (one per session) and its normal 95% interval."""
    v = rows.loc[rows[Label.POLICY_DECISION].astype(bool), column].to_numpy(float)
    half = 1.96 * v.std(ddof=1) / np.sqrt(len(v))
    return {"value": float(v.mean()), "ci": [float(v.mean() - half), float(v.mean() + half)],
            "n": int(len(v))}


def ab_check(out: Path, seed: int, rate: float, spp: int, new_spp: int, tier: str,
             overrides: list[str], n_boot: int = 1000, level: float = 0.95,
             trained: tuple | None = None) -> dict:
    """OPE checked against the A/B it predicts (issue 45 item 5).

    Round 0 trains the candidate as `run_loop` does (or `trained` = (sim0, summary,
    router, round-0 seed) is reused). New sessions (`new_spp` per prompt of the table,
    the rules' clock continued, seeded by `seed`) are split by a seeded fair coin: the
    logging half is served by the logging policy (the rules with exploration `rate`, the
    simulator), the A/B half by the candidate artifact through a `SessionBinder` without
    exploration. The OPE of the candidate's opening quality and cost per opening call (IPS,
    SNIPS, DR; the DR models are the artifact's P(success) and each candidate's mean cost
    on round 0, as the pipeline's) from the logging half's receipts, with session-bootstrap
    intervals at `level`, is compared with the value measured on the A/B half's receipts."""
    m, texts, rules = table()
    if trained is None:
        trained = (*round0(out, m, texts, rules, seed, rate, spp, tier, overrides), seed)
    sim0, s0, router, seed0 = trained
    choice, q = candidate_choices(router, m, texts)
    start = int(sim0.ledger[L.TIMESTAMP].max()) + 3_600_000
    new = simulate_receipts(m, rules, RouterExplorationConfig(
        rate=rate, sessions_per_prompt=new_spp, seed=seed + 2000, start_ms=start))
    sessions = new.truth.session_id.astype(str)
    to_ab = np.random.default_rng(seed + 3000).random(len(sessions)) < 0.5
    log_half = new.ledger[new.ledger[L.SESSION_ID].isin(sessions[~to_ab])]
    binder = SessionBinder(router, rate=0.0, salt=f"ab-{seed}")
    ab = serve_sessions(binder, m, texts, sessions=int(to_ab.sum()), seed=seed + 4000,
                        start_ms=start, prompt_rows=new.truth.prompt_row[to_ab],
                        session_prefix="ab-")
    ab_rows = bandit_rows(ab.ledger, validated=True)
    col = {c: j for j, c in enumerate(m.candidates)}
    opened = ab_rows[ab_rows[Label.POLICY_DECISION].astype(bool)]
    ab_prompt = pd.Series(ab.truth.prompt_row, index=ab.truth.session_id.astype(str))
    if not (opened[Label.CANDIDATE].map(col).to_numpy()
            == choice[ab_prompt.reindex(opened[Label.SESSION_ID].astype(str)).to_numpy()]).all():
        raise SystemExit("the A/B arm's openings are not the candidate's choices")

    rows = bandit_rows(log_half, validated=True)
    row_of = pd.Series(np.arange(m.n_prompts), index=m.prompt_ids.astype(str))
    ev = RouterEvalConfig(n_boot=n_boot, level=level, seed=seed)
    tag, k = ev.level_tag, len(m.candidates)
    doc: dict = {"seed": seed, "candidate_seed": seed0, "rate": rate, "level": level,
                 "logging_half_sessions": int((~to_ab).sum()),
                 "ab_half_sessions": int(to_ab.sum()),
                 "candidate_cheap_share": float((choice == 0).mean()),
                 "round0_verdict": s0.get("verdict", s0.get("go")),
                 "covers": {}, "ope": {}, "ab": {}}
    # the cost model of the pipeline's DR cost: each candidate's mean cost per opening call
    # on round 0's receipts (never on the sessions judged here)
    r0 = bandit_rows(sim0.ledger, validated=True)
    r0 = r0[r0[Label.POLICY_DECISION].astype(bool)]
    unit = r0.groupby(Label.CANDIDATE)[Label.COST].mean().reindex(list(m.candidates))
    doc["cost_model_usd"] = unit.to_dict()
    for what, reward, model in (("quality", Label.REWARD, q),
                                ("cost", Label.COST, np.tile(unit.to_numpy(float),
                                                             (m.n_prompts, 1)))):
        b = logged_decisions(rows, m.candidates, reward=reward)
        r = row_of.reindex(b.context_key.astype(str)).to_numpy(np.int64)
        est = ope_estimates(b, policy_matrix(choice[r], k), q_hat=model[r], config=ev)
        estimators = ("ips", "snips", "dr")
        doc["ab"][what] = got = measured(ab_rows, reward)
        values = m.score if what == "quality" else m.cost
        doc["ab"][what]["truth"] = float(values[np.arange(m.n_prompts), choice].mean())
        doc["ope"][what] = {e: {"estimate": est[e], "ci": [est[f"{e}-lo-{tag}"],
                                                           est[f"{e}-hi-{tag}"]]}
                            for e in estimators}
        doc["ope"][what]["ess"] = est["ess"]
        doc["covers"][what] = {e: bool(d["ci"][0] <= got["value"] <= d["ci"][1])
                               for e, d in doc["ope"][what].items() if e != "ess"}
        # the A/B value is itself a sample mean: beside the check (the OPE interval
        # covers the measured value), whether the OPE interval covers the table's truth,
        # and whether OPE - A/B is within both halves' widths (sqrt(h_ope^2 + h_ab^2))
        truth, h_ab = got["truth"], (got["ci"][1] - got["ci"][0]) / 2.0
        doc.setdefault("covers_truth", {})[what] = {
            e: bool(d["ci"][0] <= truth <= d["ci"][1])
            for e, d in doc["ope"][what].items() if e != "ess"}
        doc.setdefault("agrees_with_ab", {})[what] = {
            e: bool(abs(d["estimate"] - got["value"])
                    <= np.hypot((d["ci"][1] - d["ci"][0]) / 2.0, h_ab))
            for e, d in doc["ope"][what].items() if e != "ess"}
    return doc


def ab_seeds(out: Path, seeds: int, candidates: int, rate: float, spp: int, new_spp: int,
             tier: str, overrides: list[str], resume: bool = False) -> list[dict]:
    """`ab_check` for traffic seeds 0..seeds-1; `candidates` round-0 trainings (seeds
    0..candidates-1, each a `python -m training` run), traffic seed s judging candidate
    s % candidates: the A/B's randomness is the new traffic, split and exploration."""
    m, texts, rules = table()
    trained = [(*round0(out / f"candidate{c}", m, texts, rules, c, rate, spp, tier, overrides,
                        resume), c) for c in range(candidates)]
    return [ab_check(out, s, rate, spp, new_spp, tier, overrides,
                     trained=trained[s % candidates]) for s in range(seeds)]


def ab_table(docs: list[dict]) -> str:
    """The markdown table of `ab_check` over seeds: one row per seed, then the coverage."""
    head = ("| seed | candidate (cheap share) | OPE ESS | A/B quality (n) | DR quality CI | "
            "covers (IPS/SNIPS/DR) | A/B cost/call, mUSD | DR cost CI | covers (IPS/SNIPS/DR) |"
            "\n|---|---|---|---|---|---|---|---|---|\n")
    yes = {True: "y", False: "**n**"}
    lines = []
    for d in docs:
        q, c = d["ope"]["quality"], d["ope"]["cost"]
        lines.append(
            f"| {d['seed']} | {d['candidate_seed']} ({d['candidate_cheap_share']:.2f}) | "
            f"{q['ess']:.0f} | {d['ab']['quality']['value']:.4f} ({d['ab']['quality']['n']}) | "
            f"[{q['dr']['ci'][0]:.4f}, {q['dr']['ci'][1]:.4f}] | "
            + "/".join(yes[d["covers"]["quality"][e]] for e in ("ips", "snips", "dr"))
            + f" | {1e3 * d['ab']['cost']['value']:.3f} | "
            f"[{1e3 * c['dr']['ci'][0]:.3f}, {1e3 * c['dr']['ci'][1]:.3f}] | "
            + "/".join(yes[d["covers"]["cost"][e]] for e in ("ips", "snips", "dr")) + " |")
    share = {f"{w} {e}": float(np.mean([d["covers"][w][e] for d in docs]))
             for w in ("quality", "cost") for e in ("ips", "snips", "dr")}
    foot = "\n\ncoverage over seeds: " + ", ".join(f"{k} {v:.2f}" for k, v in share.items())
    for key, what in (("covers_truth", "the table's truth"),
                      ("agrees_with_ab", "A/B within both widths")):
        if all(key in d for d in docs):
            foot += f"\n{what}: " + ", ".join(
                f"{w} {e} {np.mean([d[key][w][e] for d in docs]):.2f}"
                for w in ("quality", "cost") for e in ("ips", "snips", "dr"))
    return head + "\n".join(lines) + foot + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float, default=0.05)
    ap.add_argument("--sessions-per-prompt", type=int, default=3)
    ap.add_argument("--round1-sessions", type=int, default=4000)
    ap.add_argument("--tier", choices=("static", "minilm"), default="static")
    ap.add_argument("--replay-selection", choices=("planned", "random"), default="planned",
                    help="round 1's replays: round 0's plan (default) or a seeded 25%%")
    ap.add_argument("--override", nargs="*", default=[], metavar="KEY=VALUE",
                    help="extra `python -m training` overrides, e.g. router.head.teachers=1")
    ap.add_argument("--ab-seeds", type=int, default=0, metavar="N",
                    help="instead of the two rounds: the A/B check (`ab_check`) for seeds "
                         "0..N-1, written to OUT/ab.json and printed as a table")
    ap.add_argument("--ab-candidates", type=int, default=4,
                    help="round-0 candidates trained for the A/B check (seed s judges s %% N)")
    ap.add_argument("--resume", action="store_true",
                    help="--ab-seeds: reuse round-0 trainings finished in OUT (same arguments)")
    ap.add_argument("--ab-sessions-per-prompt", type=int, default=2,
                    help="new sessions per prompt of the table, split half logging, half A/B")
    args = ap.parse_args()
    if args.ab_seeds:
        docs = ab_seeds(args.out, args.ab_seeds, args.ab_candidates, args.rate,
                        args.sessions_per_prompt, args.ab_sessions_per_prompt, args.tier,
                        args.override, args.resume)
        (args.out / "ab.json").write_text(json.dumps(docs, indent=1, default=str))
        print(ab_table(docs))
        return
    doc = run_loop(args.out, args.seed, args.rate, args.sessions_per_prompt,
                   args.round1_sessions, args.tier, args.override, args.replay_selection)
    print(json.dumps({r: {k: doc[r][k] for k in ("go", "covers", "truth")}
                      for r in ("round0", "round1")}, indent=1, default=str))


if __name__ == "__main__":
    main()
