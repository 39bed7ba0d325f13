"""The walkthrough's receipts ledger: a seeded teaching world where a learned router
honestly beats the logging policy (src/replaylab/data/README.md, "walkthrough/").

    python scripts/walkthrough_data.py            # (re)write src/replaylab/data/walkthrough/
    python scripts/walkthrough_data.py --check    # rebuild in memory, compare with the shipped files

The world: 30 recurring opening prompts of a support and engineering assistant (a help
desk sees the same questions again and again), each opening `SESSIONS_PER_PROMPT`
sessions in a seeded random order (so each recurs in train, calibration and test).
Every (prompt, candidate) has one outcome: the easy prompts are answered by both
candidates, the hard ones only by the strong one, two unanswerable ones by neither. The logging policy sends every session to the strong candidate except an
explored `RATE` of them (`simulate_receipts`: propensities exact, escalation after a
failed turn); it is what `replaylab.router.exploration.deployment_ledger` writes
(`category`, `prompt_text` on opening turns, opaque ids), plus offline replays of a
quarter of the opening prompts. The text says which prompts are hard; the category does
not (each category holds both kinds), so rules by category cannot beat the logging
policy and a router that reads the text can.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.columns import Outcomes as O
from replaylab.router.config import RouterCostConfig, RouterExplorationConfig, RouterRulesConfig
from replaylab.router.exploration import deployment_ledger, replay_outcomes, simulate_receipts
from replaylab.router.replay import outcome_matrix
from replaylab.router.rules import ScenarioRules

CHEAP, STRONG = "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"
# USD per call, as conf/router/default.yaml prices them ($0.24 / $24.70 per M tokens)
CALL_COST = {CHEAP: 0.00012, STRONG: 0.01235}
SEED = 43
RATE = 0.08                 # explored share of new sessions (router.exploration.cap is 0.10)
SESSIONS_PER_PROMPT = 150   # 30 prompts -> 4,500 sessions, ~37 h at one session per 30 s
REPLAY_SHARE = 0.25
OUT = Path(__file__).resolve().parents[1] / "src" / "replaylab" / "data" / "walkthrough"

# (category, kind, text); kind: easy (both candidates succeed), hard (only the strong
# one), none (neither: the answer cannot be known). Each category holds every kind.
PROMPTS: tuple[tuple[str, str, str], ...] = (
    ("support", "easy", "What are your opening hours on Saturday?"),
    ("support", "easy", "How do I reset my password?"),
    ("support", "easy", "Where can I download my latest invoice?"),
    ("support", "easy", "Can I change the email address on my account?"),
    ("support", "easy", "Do you ship to Canada?"),
    ("support", "easy", "How do I cancel my subscription?"),
    ("support", "easy", "What payment methods do you accept?"),
    ("support", "easy", "Translate 'thank you for your patience' into Spanish."),
    ("support", "easy", "Is there a student discount?"),
    ("support", "easy", "How long does a refund take to arrive?"),
    ("support", "easy", "Fix the typos in: 'we apologise for the inconvenence and will "
                        "responde shortly'."),
    ("support", "easy", "Which plan includes priority support?"),
    ("engineering", "easy", "What does HTTP status code 404 mean?"),
    ("engineering", "easy", "Convert 3.5 gigabytes to megabytes."),
    ("engineering", "easy", "How do I list the hidden files of a directory with ls?"),
    ("engineering", "easy", "What is the difference between git pull and git fetch?"),
    ("engineering", "easy", "Give a regular expression that matches a five-digit US ZIP "
                            "code."),
    ("engineering", "easy", "Format this date as ISO 8601: March 4, 2025."),
    ("engineering", "easy", "What does the Python expression len('hello') return?"),
    ("engineering", "easy", "How do I undo the last git commit but keep the changes?"),
    ("engineering", "easy", "Rename the variable tmp to total in: tmp = a + b; print(tmp)"),
    ("engineering", "easy", "What port does HTTPS use by default?"),
    ("engineering", "easy", "Write a SQL query that counts the rows of the table orders."),
    ("engineering", "easy", "Write the JSON list of the numbers one to three."),
    ("support", "hard", "A customer was billed twice in March, refunded once in April at a "
                        "different exchange rate, then upgraded mid-cycle with proration: "
                        "reconstruct every charge and state exactly what they are owed."),
    ("support", "hard", "Read our refund policy and the customer's eleven-message complaint "
                        "thread, decide which of the policy's exceptions apply, and draft a "
                        "reply that cites the clauses."),
    ("engineering", "hard", "Prove that this lock-free queue is linearizable under concurrent "
                            "enqueue and dequeue, or give an interleaving that breaks it."),
    ("engineering", "hard", "Our p99 latency doubled after a deploy that only changed the "
                            "connection pool size: reason through the queueing effects and "
                            "design an experiment that isolates the cause."),
    ("support", "none", "What will the EUR/USD exchange rate be next Friday?"),
    ("engineering", "none", "Which line of the file I forgot to attach has the bug?"),
)
SUCCESS = {"easy": (True, True), "hard": (False, True), "none": (False, False)}


def outcomes_table() -> pd.DataFrame:
    """The full-information outcomes-v1 table, one row per (session, candidate): session k
    opens with prompt `order[k]` (each prompt SESSIONS_PER_PROMPT times, in a seeded
    random order, so every prompt recurs all along the ledger's time, in train,
    calibration and test alike), and every candidate's outcome on it is its prompt's."""
    order = np.random.default_rng(SEED).permutation(
        np.repeat(np.arange(len(PROMPTS)), SESSIONS_PER_PROMPT))
    rows = []
    for k, i in enumerate(order):
        category, kind, text = PROMPTS[i]
        for cand, ok in zip((CHEAP, STRONG), SUCCESS[kind], strict=True):
            rows.append({O.VERSION: "1", O.PROMPT_ID: f"wt-{i:02d}-{k:05d}", O.PROMPT_TEXT: text,
                         O.TASK: category, O.CANDIDATE: cand, O.SCORE: float(ok),
                         O.SUCCESS: ok, O.COST: CALL_COST[cand]})
    return pd.DataFrame(rows)


def opaque_ids(ledger: pd.DataFrame) -> dict[str, dict[str, str]]:
    """Session and request ids a deployment would write: numbered in opening order, with
    nothing of the prompt in them (the simulator's ids name the prompt)."""
    first = ledger.sort_values([L.TIMESTAMP, L.SESSION_ID], kind="stable").drop_duplicates(
        L.SESSION_ID)
    session = {s: f"ws-{n:05d}" for n, s in enumerate(first[L.SESSION_ID])}
    request = {r: f"{session[s]}/t{t}" for r, s, t in zip(
        ledger[L.REQUEST_ID], ledger[L.SESSION_ID], ledger[L.TURN_INDEX], strict=True)}
    return {"session": session, "request": request}


def build() -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(receipts ledger, replays, facts) of the teaching world; the same every call."""
    full = outcomes_table()
    matrix = outcome_matrix(full, RouterCostConfig(call_cost_usd=CALL_COST),
                            candidates=(CHEAP, STRONG))
    # the logging policy: everything to the strong candidate (a cautious deployment)
    rules = ScenarioRules(RouterRulesConfig(default_candidate=STRONG, fit_tasks=False)).fit(matrix)
    sim = simulate_receipts(matrix, rules, RouterExplorationConfig(
        rate=RATE, cap=0.10, mean_turns=2.0, max_turns=4, sessions_per_prompt=1, seed=SEED))
    texts = full.drop_duplicates(O.PROMPT_ID).set_index(O.PROMPT_ID)[O.PROMPT_TEXT].to_dict()
    ledger = deployment_ledger(sim, texts)
    replays = replay_outcomes(sim, matrix, texts, share=REPLAY_SHARE, seed=SEED)
    ids = opaque_ids(ledger)
    ledger[L.SESSION_ID] = ledger[L.SESSION_ID].map(ids["session"])
    ledger[L.BINDING_ID] = ledger[L.SESSION_ID] + "/b" + ledger[L.BINDING_ID].str.rsplit(
        "/b", n=1).str[1]
    ledger[L.REQUEST_ID] = ledger[L.REQUEST_ID].map(ids["request"])
    replays[O.PROMPT_ID] = replays[O.PROMPT_ID].map(ids["request"])
    ledger = ledger.sort_values([L.TIMESTAMP, L.REQUEST_ID], kind="stable").reset_index(drop=True)
    replays = replays.sort_values([O.PROMPT_ID, O.CANDIDATE], kind="stable").reset_index(drop=True)
    facts = {k: sim.stats[k] for k in ("sessions", "turns", "exploration_sessions",
                                       "opening_by_candidate", "logged_opening_quality",
                                       "escalations")}
    return ledger, replays, facts


def frames_equal(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Same columns and values (dtypes as Parquet gives them back)."""
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return False
    return all(a[c].astype(object).where(a[c].notna(), None).tolist()
               == b[c].astype(object).where(b[c].notna(), None).tolist() for c in a.columns)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the shipped files")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    ledger, replays, facts = build()
    paths = {"receipts.parquet": ledger, "replays.parquet": replays}
    if args.check:
        bad = [n for n, f in paths.items()
               if not frames_equal(f.reset_index(drop=True), pd.read_parquet(args.out / n))]
        print("walkthrough data: " + (f"DIFFERS: {bad}" if bad else "identical to the shipped files"))
        return 1 if bad else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, frame in paths.items():
        frame.to_parquet(args.out / name, index=False, compression="zstd")
    print(f"wrote {args.out}: {facts}; {len(replays)} replays; "
          f"{sum((args.out / n).stat().st_size for n in paths) / 1e3:.0f} kB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
