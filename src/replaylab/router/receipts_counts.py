"""The receipts' additive counts: exploration support and the logging policy, per partition.

Each count here is a plain dict or frame that sums over partitions of the opening
decisions (`add_counts`, or a frame's group sums), so the receipts pipeline
(`replaylab.pipelines.router_receipts`) reads the same figures on either engine: the exploration section and its refusals (`exploration_facts`), the logging
policy's propensities (`policy_counts`) and its observed rules (`rule_counts`,
`logging_rules_from_counts`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from replaylab.router.replay import Label
from replaylab.stats import binomial_ci


def exploration_counts(decisions: pd.DataFrame, candidates: Sequence[str]) -> dict:
    """The additive counts `exploration_facts` reads (sums over partitions of the opening
    decisions give the whole ledger's): explored sessions, the propensities of the logging
    policy's own choices by value, explored and randomized sessions by candidate."""
    explored = decisions[Label.LABEL_SOURCE] == "exploration"
    own = pd.to_numeric(decisions.loc[~explored, Label.PROPENSITY], errors="coerce").dropna()
    prop = pd.to_numeric(decisions[Label.PROPENSITY], errors="coerce")
    return {"explored": int(explored.sum()),
            "own_propensity": {float(k): int(v) for k, v in own.value_counts().items()},
            "explored_by_candidate": {str(k): int(v) for k, v in decisions.loc[
                explored, Label.CANDIDATE].value_counts().items()},
            "randomized_by_candidate": {str(k): int(v) for k, v in decisions.loc[
                prop < 1.0, Label.CANDIDATE].value_counts().items()}}


def add_counts(a: dict, b: dict) -> dict:
    """Two count dicts (numbers, or nested dicts of numbers) summed key by key."""
    out = dict(a)
    for k, v in b.items():
        if isinstance(v, dict):
            out[k] = add_counts(out.get(k, {}), v)
        else:
            out[k] = out.get(k, 0) + v
    return out


def median_of_counts(counts: dict[float, int]) -> float | None:
    """The median (pandas' and numpy's: the mean of the two middle values when even) of the
    multiset {value: multiplicity}; None when empty."""
    n = int(sum(counts.values()))
    if n == 0:
        return None
    values = sorted(counts)
    cum = np.cumsum([counts[v] for v in values])
    lo = values[int(np.searchsorted(cum, (n - 1) // 2 + 1))]
    hi = values[int(np.searchsorted(cum, n // 2 + 1))]
    return float(np.mean([lo, hi]))


def exploration_facts(counts: dict, candidates: Sequence[str], cap: float, minimum: int,
                      sessions: int) -> tuple[dict, list[str], str | None]:
    """The exploration section of the report and its refusals, from `exploration_counts`:
    (facts, the cap refusals, the support refusal or None: too little exploration, which a
    caller judging on something else than OPE may waive)."""
    n_explored = int(counts["explored"])
    share = float(n_explored) / max(sessions, 1)
    lo, hi = binomial_ci(n_explored, max(sessions, 1))
    # the rate the logging policy says it ran: 1 - the propensity of its own choices
    median = median_of_counts(counts["own_propensity"])
    logged_rate = None if median is None else float(1.0 - median)
    per = {str(c): int(counts["explored_by_candidate"].get(str(c), 0)) for c in candidates}
    facts = {"explored_sessions": n_explored, "explored_share": share,
             "explored_share_ci": [lo, hi], "logged_rate": logged_rate, "cap": cap,
             "explored_by_candidate": per,
             "min_explored_per_candidate": int(minimum),
             "support_rule": "every candidate opens >= min_explored_per_candidate sessions "
                             "with a propensity < 1, and >= that many sessions are explored",
             "cap_rule": "refused when the logged rate (1 - propensity of the logging policy's "
                         "own choices) is above the cap, or the explored share's 95% binomial "
                         "interval lies above it"}
    errors = []
    if (logged_rate is not None and logged_rate > cap + 1e-9) or lo > cap:
        errors.append(f"the explored share of sessions {share:.4f} (95% CI [{lo:.4f}, {hi:.4f}], "
                      f"logged rate {logged_rate if logged_rate is None else round(logged_rate, 6)}"
                      f") is above router.exploration.cap={cap:g}: refused (exploration beyond "
                      "the cap is not a bounded experiment)")
    # support of a candidate: sessions it opened under the randomized logging policy
    # (propensity < 1), as its exploration arm or as the logging policy's own choice; a
    # candidate the deterministic rules always pick is never an exploration arm in that task
    support = {str(c): int(counts["randomized_by_candidate"].get(str(c), 0)) for c in candidates}
    facts["randomized_sessions_by_candidate"] = support
    few = {k: v for k, v in support.items() if v < minimum}
    short = None
    if n_explored < minimum or few:
        what = (f"candidate(s) {few} opened fewer than {minimum} sessions under the randomized "
                "logging policy" if few else
                f"only {n_explored} explored sessions in all")
        short = (f"too little exploration: {what} (need >= {minimum}, "
                 "router.receipts.min_explored_per_candidate): the off-policy estimates "
                 "would have no support there; log more explored traffic")
    return facts, errors, short


def policy_counts(dec: pd.DataFrame) -> dict:
    """The report's `logging_policy` counts of kept decisions (additive over partitions)."""
    return {"opening_by_candidate": {str(k): int(v) for k, v in
                                     dec[Label.CANDIDATE].value_counts().items()},
            "propensities": {f"{p:.6g}": int(c) for p, c in
                             dec[Label.PROPENSITY].round(12).value_counts().sort_index().items()}}


def rule_counts(decisions: pd.DataFrame) -> pd.DataFrame:
    """(scope, category, candidate, n) counts of non-explored opening decisions, scope
    "train" (train split) or "all" (every split); category "" counts every row. Additive
    over partitions: `logging_rules_from_counts` reads their sums."""
    d = decisions[decisions[Label.LABEL_SOURCE] != "exploration"]
    parts = []
    for scope, rows in (("train", d[d["split"] == "train"]), ("all", d)):
        cats = rows["category"].where(rows["category"].notna(), None)
        by = pd.DataFrame({"category": cats.map(lambda v: None if v is None else str(v)),
                           "candidate": rows[Label.CANDIDATE].astype(str)})
        per = by.dropna(subset=["category"]).value_counts(["category", "candidate"]).reset_index()
        tot = by["candidate"].value_counts().rename_axis("candidate").reset_index()
        tot.insert(0, "category", "")
        parts += [per.assign(scope=scope), tot.assign(scope=scope)]
    out = pd.concat(parts, ignore_index=True)
    out.columns = [str(c) for c in out.columns]
    out = out.rename(columns={"count": "n"})
    return out[["scope", "category", "candidate", "n"]].astype({"n": "int64"})


def logging_rules_from_counts(counts: pd.DataFrame, candidates: tuple[str, ...]) -> dict:
    """The logging policy as observed on train (`rule_counts` summed): per category the
    candidate it chose most often outside exploration, and its overall most frequent
    choice as the default (all splits when train has none); ties go to the candidate
    listed first (the cheaper). The rules the served router falls back to
    (`ScenarioRules.from_choices`)."""
    c = counts.groupby(["scope", "category", "candidate"], as_index=False)["n"].sum()
    scope = "train" if (c[(c["scope"] == "train") & (c["category"] == "")]["n"].sum() > 0) \
        else "all"
    c = c[c["scope"] == scope]
    order = {name: i for i, name in enumerate(candidates)}

    def most(rows: pd.DataFrame) -> str:
        r = rows.assign(o=rows["candidate"].map(order).fillna(len(order)))
        return str(r.sort_values(["n", "o"], ascending=[False, True]).iloc[0]["candidate"])

    tot = c[c["category"] == ""]
    fitted_on = int(tot["n"].sum())
    default = most(tot) if fitted_on else candidates[-1]
    by_cat = {str(cat): most(g) for cat, g in c[c["category"] != ""].groupby("category")}
    return {"task_candidate": dict(sorted(by_cat.items())), "default_candidate": default,
            "fitted_on": fitted_on,
            "note": "the logging policy's most frequent non-explored choice per category on "
                    "the train sessions (observed, not fitted on outcomes)"}
