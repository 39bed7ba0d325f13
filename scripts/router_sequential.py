"""The receipts gate re-run on a growing ledger: false GO with and without alpha spending.

    python scripts/router_sequential.py [--null 200] [--better 50] [--looks 5]
        [--sessions-per-look 5000] [--rate 0.05] [--seed 0] [--out OUT.json]

Writes the markdown table of docs/results/router.md, "Valid under repeated looks"
(issue 45 item 4), and with --out the figures as JSON.

The world (seeded, full information, no training: the gate is what is tested). 60
context types opened uniformly; three candidates cheap / mid / strong with per-context
success probabilities and costs per call (lognormal noise around 0.0002, 0.002, 0.012
USD). The logging policy is a rules policy that opens every session on `strong` with
probability 1 - rate and explores the other two with rate / 2 each (session-scoped, as
the receipts are). The served router, fixed over the looks, opens the easiest quarter of the
contexts on `cheap` and the rest on `strong`; `cheap`'s success on those contexts is
shifted so that the true opening-quality difference served - logging is exactly
`-margin` (`null`: the least favourable router that is no better than the incumbent's
margin allows, GO is false) or `+better_by` (`better`); either way it is far cheaper.

A sequence: `looks` rounds; round k adds `sessions_per_look` sessions to the ledger, and
the gate is run on the ledger so far as the receipts pipeline runs it: the latest 20% of
sessions are the test window; GO iff the paired quality difference's lower bound is >=
-margin and the paired cost difference's upper bound is < 0. Methods: `fixed` (today:
the session-bootstrap 95% interval of `router.ope.paired_difference`, IPS, at every look)
and `spending` (`router.sequential`: O'Brien-Fleming- or Pocock-type alpha spending over
the looks, the betting bound at each look's alpha; alpha 0.05).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from replaylab.router.config import RouterEvalConfig
from replaylab.router.ope import LoggedDecisions, paired_difference, policy_matrix
from replaylab.router.sequential import SequentialConfig, sequential_diffs

MARGIN = 0.01
TEST_SHARE = 0.2
N_CONTEXTS, K = 60, 3
CHEAP_SHARE = 0.25  # the served router opens the easiest quarter of contexts on `cheap`
STRONG = K - 1


def world(seed: int, truth_diff: float, rate: float) -> dict:
    """Success probabilities (X, K), mean costs (K,), the served router's choice (X,) and
    the logging policy (X, K), with the true quality difference served - logging =
    truth_diff exactly (module doc)."""
    rng = np.random.default_rng(seed)
    strong = rng.uniform(0.55, 0.85, N_CONTEXTS)
    gap = np.sort(rng.uniform(0.0, 0.4, N_CONTEXTS))  # strong - cheap, easy contexts first
    p = np.stack([strong - gap, strong - gap / 2, strong], axis=1)
    choice = np.where(np.arange(N_CONTEXTS) < int(CHEAP_SHARE * N_CONTEXTS), 0, STRONG)
    log = np.full((N_CONTEXTS, K), rate / (K - 1))
    log[:, STRONG] = 1.0 - rate
    # shift cheap's success on the contexts the router sends there: the difference is
    # linear in the shift, with slope (share routed to cheap) x (1 - logging's cheap share)
    easy = choice == 0

    def diff(q: np.ndarray) -> float:
        return float(q[np.arange(N_CONTEXTS), choice].mean() - (log * q).sum(axis=1).mean())

    slope = easy.mean() * (1.0 - rate / (K - 1))
    p[easy, 0] += (truth_diff - diff(p)) / slope
    if not ((p >= 0) & (p <= 1)).all():
        raise ValueError("world: a success probability left [0, 1]; change the seed")
    assert abs(diff(p) - truth_diff) < 1e-12
    return {"p": p, "cost": np.array([0.0002, 0.002, 0.012]), "choice": choice, "log": log}


def sessions(w: dict, n: int, rng: np.random.Generator) -> dict:
    """n logged sessions: context, action, propensity, opening quality and cost per call."""
    x = rng.integers(0, N_CONTEXTS, n)
    u = rng.random(n)
    cum = np.cumsum(w["log"][x], axis=1)
    a = np.minimum((u[:, None] > cum).sum(axis=1), K - 1)
    prop = w["log"][x, a]
    r = (rng.random(n) < w["p"][x, a]).astype(float)
    c = w["cost"][a] * rng.lognormal(0.0, 0.5, n)
    return {"x": x, "a": a, "prop": prop, "r": r, "c": c}


def gate_fixed(d: dict, choice: np.ndarray, n_boot: int, seed: int) -> bool:
    """Today's gate at one look: session-bootstrap 95% intervals (IPS paired differences)."""
    n = len(d["a"])
    ev = RouterEvalConfig(n_boot=n_boot, level=0.95, seed=seed)
    target = policy_matrix(choice[d["x"]], K)
    cands = tuple(f"c{j}" for j in range(K))
    out = []
    for reward in (d["r"], d["c"]):
        b = LoggedDecisions(cands, d["a"], reward, d["prop"], np.arange(n), d["x"])
        out.append(paired_difference(b, target, config=ev, estimator="ips")["ci"])
    return bool(out[0][0] >= -MARGIN and out[1][1] < 0)


def gate_spending(d: dict, choice: np.ndarray, cfg: SequentialConfig) -> bool:
    """The sequential gate at look cfg.look: betting bounds at the look's spent alpha."""
    w = (d["a"] == choice[d["x"]]) / d["prop"]
    s = sequential_diffs(w, d["r"], d["c"], cfg)
    return bool(s["quality"]["ci"][0] >= -MARGIN and s["cost"]["ci"][1] < 0)


def run_sequence(w: dict, seed: int, looks: int, per_look: int, n_boot: int,
                 methods: dict[str, SequentialConfig | None]) -> dict[str, list[bool]]:
    """GO at each look, per method, for one growing ledger (module doc)."""
    rng = np.random.default_rng(seed)
    ledger: dict[str, np.ndarray] = {}
    said: dict[str, list[bool]] = {m: [] for m in methods}
    for look in range(1, looks + 1):
        new = sessions(w, per_look, rng)
        ledger = {k: np.concatenate([ledger[k], v]) if ledger else v for k, v in new.items()}
        n = len(ledger["a"])
        test = {k: v[n - int(round(TEST_SHARE * n)):] for k, v in ledger.items()}  # latest
        for name, cfg in methods.items():
            if cfg is None:
                said[name].append(gate_fixed(test, w["choice"], n_boot, seed * 100 + look))
            else:
                cfg = SequentialConfig(kind="spending", alpha=cfg.alpha, look=look,
                                       looks=looks, spending=cfg.spending)
                said[name].append(gate_spending(test, w["choice"], cfg))
    return said


METHODS = {"fixed 95% bootstrap (today)": None,
           "spending, O'Brien-Fleming": SequentialConfig(kind="spending"),
           "spending, Pocock": SequentialConfig(kind="spending", spending="pocock")}


def simulate(n_null: int, n_better: int, looks: int, per_look: int, rate: float, seed: int,
             n_boot: int = 1000, methods: dict | None = None, better_by: float = 0.03) -> dict:
    """Share of sequences with any GO (null) and with a GO by the last look (better)."""
    methods = METHODS if methods is None else methods
    out: dict = {"looks": looks, "sessions_per_look": per_look, "rate": rate, "margin": MARGIN,
                 "better_by": better_by, "seed": seed, "methods": {}}
    for case, n_seq, diff in (("null", n_null, -MARGIN), ("better", n_better, better_by)):
        w = world(seed, diff, rate)
        runs = [run_sequence(w, seed * 10_000 + i + (0 if case == "null" else 5_000), looks,
                             per_look, n_boot, methods) for i in range(n_seq)]
        for name in methods:
            go = np.array([r[name] for r in runs], dtype=bool).reshape(n_seq, looks)
            m = out["methods"].setdefault(name, {})
            m[case] = {"sequences": n_seq, "any_go": int(go.any(axis=1).sum()),
                       "share_any_go": float(go.any(axis=1).mean()) if n_seq else float("nan"),
                       "go_by_look": go.mean(axis=0).tolist() if n_seq else [],
                       "first_go_look": (float(np.mean([np.argmax(g) + 1 for g in go
                                                        if g.any()]))
                                         if go.any() else None)}
    return out


def table(res: dict) -> str:
    """The markdown table of docs/results/router.md."""
    rows = ["| method | null: sequences with any GO | better: sequences that say GO | "
            "better: GO share at looks 1..5 |", "|---|---|---|---|"]
    for name, m in res["methods"].items():
        nl, bt = m["null"], m["better"]
        rows.append(f"| {name} | {nl['any_go']}/{nl['sequences']} = {nl['share_any_go']:.3f} | "
                    f"{bt['any_go']}/{bt['sequences']} = {bt['share_any_go']:.2f} | "
                    + " / ".join(f"{v:.2f}" for v in bt["go_by_look"]) + " |")
    return "\n".join(rows) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--null", type=int, default=200)
    ap.add_argument("--better", type=int, default=50)
    ap.add_argument("--looks", type=int, default=5)
    ap.add_argument("--sessions-per-look", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=0.10)
    ap.add_argument("--better-by", type=float, default=0.03,
                    help="true quality difference served - logging of the `better` router")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    t0 = time.perf_counter()
    res = simulate(args.null, args.better, args.looks, args.sessions_per_look, args.rate,
                   args.seed, args.n_boot, better_by=args.better_by)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    print(table(res))
    print(f"({res['seconds']} s)")


if __name__ == "__main__":
    main()
