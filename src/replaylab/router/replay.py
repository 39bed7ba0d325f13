"""Full-information outcomes as arrays, and offline replay labels.

An outcomes-v1 table (one row per prompt x candidate) is the full-information
ground truth: for every prompt i and candidate a it holds the quality r(i, a) in
[0, 1] and the call cost c(i, a). `outcome_matrix` turns it into aligned arrays
(n prompts x K candidates) that the simulator, the rules baseline, the metrics
and the truth of the off-policy estimates all share.

Cost of a call, in the order of the outcomes-v1 contract:
1. the table's `cost` (measured, e.g. RouterArena's inference_cost);
2. prompt_tokens x input price + completion_tokens x output price (per million
   tokens, `RouterCostConfig.prices`) when both counts are known;
3. a per-call cost `RouterCostConfig.call_cost_usd` (MODELED; RouteLLM has no tokens).
The report counts the calls priced each way, per candidate.

Replay labels. Production logs only the bound candidate's outcome. An offline
replay sends a logged opening prompt to the other candidates as well; the
answers are judged like the logged one. Here the replayed outcomes are read
from the outcomes table for a seeded share of the distinct logged opening
prompts, one label row per (prompt, other candidate), marked
`label_source = "replay"` and carrying no propensity: they are full-information
labels for the reward model, not bandit samples, and are never fed to IPS.

Optional columns (`cost`, `currency`, `prompt_tokens`, `completion_tokens`) may be
absent from a valid table: absent reads as all null, so a table with `cost` on
every row and no token columns is priced as measured, like one whose token
columns are empty. A table that cannot be priced, or lacks the configured
candidates, is an input error naming the file and the column (`ConfigError`),
never a KeyError.

Privacy: prompt text is read only to estimate a prompt's length when token
counts are missing; no array or frame built here holds text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from replaylab.config import ConfigError
from replaylab.contracts import OUTCOMES_SCHEMA, SOURCE_ATTR, ContractError, validate_outcomes
from replaylab.contracts.columns import Outcomes as O
from replaylab.router.config import RouterCostConfig, RouterReplayConfig
from replaylab.router.replay_plan import (
    coverage_strata,
    expected_gain,
    pair_priority,
    plan_prompts,
)

logger = logging.getLogger(__name__)


class Label:
    """Columns of a label table: one row per observed (context, candidate) outcome."""

    SESSION_ID = "session_id"
    BINDING_ID = "binding_id"
    CONTEXT_KEY = "context_key"  # prompt_id when known, else the binding's first request_id
    PROMPT_ID = "prompt_id"
    TASK = "task"
    CANDIDATE = "candidate"  # the action
    REWARD = "reward"  # quality in [0, 1] of the binding's first turn
    SUCCESS = "success"
    COST = "cost"  # USD of the binding's first call
    PROPENSITY = "propensity"  # logging probability of the action; NaN for replay rows
    LABEL_SOURCE = "label_source"  # "logged" | "exploration" | "replay"
    POLICY_DECISION = "policy_decision"  # chosen by the logging policy (not an escalation)
    BINDING_TURNS = "binding_turns"
    BINDING_COST = "binding_cost"  # USD over the binding's turns
    SESSION_COST = "session_cost"  # USD over the whole session (all bindings)
    PROMPT_LENGTH = "prompt_length"  # tokens (known or estimated)


LABEL_SOURCES = ("logged", "exploration", "replay")
PROMPT_LENGTH_SOURCE = "prompt_length_source"  # "tokens" | "chars_estimate"


@dataclass(frozen=True)
class OutcomeMatrix:
    """Outcomes of n prompts x K candidates; row i of every array is `meta` row i.

    meta: prompt_id, task, prompt_length, prompt_length_source and the importer's
        extra columns (split, contaminated, ...); never prompt text.
    score: (n, K) quality in [0, 1]; success: (n, K) bool; cost: (n, K) USD per call;
    prompt_tokens, completion_tokens: (n, K) float, NaN where unknown.
    """

    candidates: tuple[str, ...]
    meta: pd.DataFrame
    score: np.ndarray
    success: np.ndarray
    cost: np.ndarray
    prompt_tokens: np.ndarray
    completion_tokens: np.ndarray
    report: dict = field(default_factory=dict)

    @property
    def n_prompts(self) -> int:
        return len(self.meta)

    @property
    def prompt_ids(self) -> np.ndarray:
        return self.meta[O.PROMPT_ID].to_numpy()

    def index(self, candidate: str) -> int:
        """Column of `candidate`; a ValueError names the known candidates."""
        if candidate not in self.candidates:
            raise ValueError(f"unknown candidate {candidate!r}; known: {', '.join(self.candidates)}")
        return self.candidates.index(candidate)

    def take(self, rows: np.ndarray | Sequence[int] | pd.Series) -> OutcomeMatrix:
        """The prompts at positions (or a boolean mask) `rows`, e.g. one split."""
        idx = np.asarray(rows)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        return OutcomeMatrix(self.candidates, self.meta.iloc[idx].reset_index(drop=True),
                             self.score[idx], self.success[idx], self.cost[idx],
                             self.prompt_tokens[idx], self.completion_tokens[idx],
                             dict(self.report, prompts=len(idx)))

    def mean_score(self) -> pd.Series:
        return pd.Series(self.score.mean(axis=0), index=list(self.candidates))

    def mean_cost(self) -> pd.Series:
        return pd.Series(self.cost.mean(axis=0), index=list(self.candidates))


def _priced(frame: pd.DataFrame, cost: RouterCostConfig) -> pd.Series:
    p_in = frame[O.CANDIDATE].map({k: v["input_usd_per_million"] for k, v in cost.prices.items()})
    p_out = frame[O.CANDIDATE].map({k: v["output_usd_per_million"] for k, v in cost.prices.items()})
    return (frame[O.PROMPT_TOKENS].astype("float64") * p_in
            + frame[O.COMPLETION_TOKENS].astype("float64") * p_out) / 1e6


# The optional columns this module reads; absent ones are made all null once, up front.
_OPTIONAL = (O.COST, O.CURRENCY, O.PROMPT_TOKENS, O.COMPLETION_TOKENS)


def resolve_cost(frame: pd.DataFrame, cost: RouterCostConfig, where: str, *,
                 strict: bool = True) -> tuple[pd.Series, pd.Series]:
    """Per-row USD and how it was obtained (measured | priced_tokens | per_call_config).

    Absent optional columns read as null. strict: a call that cannot be priced is a
    ConfigError naming the fix; else its cost is NaN and its source `unpriced`."""
    frame = frame.assign(**{c: OUTCOMES_SCHEMA.column(frame, c) for c in _OPTIONAL})
    usd = pd.to_numeric(frame[O.COST], errors="coerce").astype("float64")
    how = pd.Series(np.where(usd.notna(), "measured", ""), index=frame.index, dtype=object)
    priced = _priced(frame, cost)
    use = usd.isna() & priced.notna()
    usd, how = usd.where(~use, priced), how.where(~use, "priced_tokens")
    per_call = frame[O.CANDIDATE].map(cost.call_cost_usd).astype("float64")
    use = usd.isna() & per_call.notna()
    usd, how = usd.where(~use, per_call), how.where(~use, "per_call_config")
    if usd.isna().any() and not strict:
        return usd, how.where(usd.notna(), "unpriced")
    if usd.isna().any():
        cands = sorted(frame.loc[usd.isna(), O.CANDIDATE].unique())
        raise ConfigError(
            f"{where}: no cost for {int(usd.isna().sum())} calls of {', '.join(cands)}: column "
            f"{O.COST} is null or absent, {O.PROMPT_TOKENS}/{O.COMPLETION_TOKENS} are not both "
            "known or not priced in router.cost.prices, and router.cost.call_cost_usd has no "
            f"entry for them (set e.g. router.cost.call_cost_usd.{cands[0]})")
    return usd, how


def _prompt_meta(valid: pd.DataFrame, order: pd.Index, chars_per_token: float) -> pd.DataFrame:
    """Per prompt: task, length (median known prompt tokens, else chars / chars_per_token)."""
    contract = {O.VERSION, O.PROMPT_TEXT, O.CANDIDATE, O.SCORE, O.SUCCESS, O.COST, O.CURRENCY,
                O.PROMPT_TOKENS, O.COMPLETION_TOKENS}
    extras = [c for c in valid.columns if c not in contract]
    first = valid.drop_duplicates(O.PROMPT_ID).set_index(O.PROMPT_ID).reindex(order)
    meta = first[[c for c in extras if c != O.PROMPT_ID]].reset_index()
    tokens = valid.groupby(O.PROMPT_ID)[O.PROMPT_TOKENS].median().reindex(order).to_numpy(float)
    chars = first[O.PROMPT_TEXT].astype(str).str.len().to_numpy(float)
    known = np.isfinite(tokens)
    meta[Label.PROMPT_LENGTH] = np.where(known, tokens, np.ceil(chars / chars_per_token))
    meta[PROMPT_LENGTH_SOURCE] = np.where(known, "tokens", "chars_estimate")
    return meta


def outcome_matrix(outcomes: pd.DataFrame, cost: RouterCostConfig | None = None, *,
                   candidates: Sequence[str] | None = None,
                   chars_per_token: float = 4.0) -> OutcomeMatrix:
    """outcomes-v1 frame -> OutcomeMatrix over the prompts scored by every candidate.

    The frame is validated first (quarantined rows are counted, not used). A
    prompt lacking a score for some candidate is left out and counted per
    candidate in `report["incomplete_prompts"]`, never filled in.
    """
    cost = cost or RouterCostConfig()
    where = str(outcomes.attrs.get(SOURCE_ATTR) or "outcome_matrix")
    checked = validate_outcomes(outcomes, source=where)
    valid = checked.valid
    if valid.empty:
        raise ContractError(f"{where}: no valid outcomes-v1 rows "
                            f"(quarantined by reason: {checked.by_reason()})")
    cands = tuple(candidates) if candidates is not None else tuple(sorted(valid[O.CANDIDATE].unique()))
    unknown = sorted(set(cands) - set(valid[O.CANDIDATE]))
    if unknown or len(cands) < 2:
        raise ConfigError(f"{where}: router.candidates {list(cands)}: need >= 2 candidates "
                          f"present in column {O.CANDIDATE} (absent: {unknown})")
    valid = valid[valid[O.CANDIDATE].isin(cands)]
    valid = valid.assign(**{c: OUTCOMES_SCHEMA.column(valid, c) for c in _OPTIONAL})
    usd, how = resolve_cost(valid, cost, where)
    valid[O.COST] = usd.to_numpy()
    order = pd.Index(pd.unique(valid[O.PROMPT_ID]), name=O.PROMPT_ID)

    def wide(col: str) -> pd.DataFrame:
        return valid.pivot(index=O.PROMPT_ID, columns=O.CANDIDATE, values=col).reindex(
            index=order, columns=list(cands))

    score = wide(O.SCORE).astype("float64")
    complete = score.notna().all(axis=1).to_numpy()
    incomplete = {c: int(score[c].isna().sum()) for c in cands if score[c].isna().any()}
    keep = order[complete]
    meta = _prompt_meta(valid[valid[O.PROMPT_ID].isin(keep)], keep, chars_per_token)
    arrays = {col: wide(col).to_numpy(dtype="float64", na_value=np.nan)[complete]
              for col in (O.SCORE, O.SUCCESS, O.COST, O.PROMPT_TOKENS, O.COMPLETION_TOKENS)}
    report = {
        "rows_read": checked.rows_read, "rows_quarantined": checked.rows_quarantined,
        "quarantine_by_reason": checked.by_reason(), "prompts": int(complete.sum()),
        "incomplete_prompts": int((~complete).sum()), "missing_scores_by_candidate": incomplete,
        "candidates": list(cands),
        "cost_source": {c: how[valid[O.CANDIDATE] == c].value_counts().to_dict() for c in cands},
        "prompt_length_source": meta[PROMPT_LENGTH_SOURCE].value_counts().to_dict(),
    }
    if incomplete:
        logger.warning("outcome_matrix: %d prompts lack a score for some candidate and were left "
                       "out (%s)", report["incomplete_prompts"], incomplete)
    return OutcomeMatrix(cands, meta, arrays[O.SCORE], arrays[O.SUCCESS] > 0.5, arrays[O.COST],
                         arrays[O.PROMPT_TOKENS], arrays[O.COMPLETION_TOKENS], report)


def logged_openings(labels: pd.DataFrame, matrix: OutcomeMatrix) -> tuple[np.ndarray, np.ndarray,
                                                                          np.ndarray]:
    """The distinct logged opening prompts a replay can choose from: (m,) prompt ids (sorted),
    (m,) their rows of `matrix` and (m, K) which candidates the receipts already observed
    for each. labels: bandit rows (`exploration.bandit_rows`), needing prompt_id."""
    if Label.PROMPT_ID not in labels.columns:
        raise ValueError("replay_labels: the bandit rows carry no prompt_id (a real receipts "
                         "ledger needs a prompt_id column to be matched to replayed outcomes)")
    opening = labels[labels[Label.POLICY_DECISION].astype(bool)]
    row_of = pd.Series(np.arange(matrix.n_prompts), index=matrix.prompt_ids)
    known = opening[opening[Label.PROMPT_ID].isin(row_of.index)]
    prompts = np.sort(pd.unique(known[Label.PROMPT_ID]).astype(str))
    seen = np.zeros((len(prompts), len(matrix.candidates)), bool)
    pos = pd.Series(np.arange(len(prompts)), index=prompts)
    col = {c: k for k, c in enumerate(matrix.candidates)}
    seen[pos.reindex(known[Label.PROMPT_ID].astype(str)).to_numpy(np.int64),
         known[Label.CANDIDATE].map(col).to_numpy(np.int64)] = True
    return prompts, row_of.reindex(prompts).to_numpy(np.int64), seen


def random_prompts(prompts: np.ndarray, share: float, seed: int) -> np.ndarray:
    """A seeded uniform draw of round(share x m) of the logged opening prompts (sorted)."""
    n_pick = int(round(share * len(prompts)))
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(prompts, size=n_pick, replace=False)) if n_pick else prompts[:0]


# The planned selections and the criterion each ranks a (prompt, candidate) pair by:
# `planned` the plan's priority p (1 - p) exp(-|q - t| / 0.1) (`replay_plan.pair_priority`),
# `planned_gain` the expected gain of the replay to the routing decision
# (`replay_plan.expected_gain`, the value of perfect information on that one score).
PLANNED_CRITERIA = {"planned": "priority", "planned_gain": "expected_gain"}


def planned_prompts(labels: pd.DataFrame, matrix: OutcomeMatrix, prob: np.ndarray,
                    threshold: float, rule: str, share: float, seed: int,
                    embedding: np.ndarray | None = None,
                    criterion: str = "priority", *, exclude: np.ndarray | None = None,
                    n_pick: int | None = None) -> tuple[np.ndarray, dict]:
    """The top of the replay plan: round(share x m) of the m logged opening prompts.

    prob: (n_prompts, K) P(success) of a head fitted on the receipts alone (no replay),
    rows as `matrix`; threshold, rule: its routing threshold. A prompt's value is the sum,
    over the candidates the receipts did not observe for it, of the criterion:
    `replay_plan.pair_priority` ("priority") or `replay_plan.expected_gain`
    ("expected_gain"); the share is spread over categories x embedding cells
    (`coverage_strata`; embedding None: categories only) and spent on the highest values
    in each. exclude: prompt ids already replayed, never picked again (the strata stay
    those of all m prompts); n_pick: how many to pick (None: round(share x m)). Reads the
    receipts (`labels`), `prob` and the prompts' categories, never `matrix`'s outcomes.
    Returns the picked prompt ids (ranked) and a report."""
    prompts, rows, seen = logged_openings(labels, matrix)
    p = np.asarray(prob, float)[rows]
    if criterion == "priority":
        pair = pair_priority(p, threshold, rule)[0]
    elif criterion == "expected_gain":
        pair = expected_gain(p, threshold, rule)
    else:
        raise ValueError(f"planned_prompts: criterion {criterion!r}: must be priority or "
                         "expected_gain")
    value = np.where(seen, 0.0, pair).sum(axis=1)
    task = matrix.meta[O.TASK].to_numpy(dtype=object)[rows]
    strata = (coverage_strata(np.asarray(embedding)[rows], task, seed) if embedding is not None
              else pd.factorize(pd.Series(task).fillna(""))[0])
    n_pick = int(round(share * len(prompts))) if n_pick is None else int(n_pick)
    open_ = (np.flatnonzero(~np.isin(prompts, np.asarray(exclude).astype(str)))
             if exclude is not None else np.arange(len(prompts)))
    pick = open_[plan_prompts(value[open_], n_pick, strata[open_], seed)]
    report = {"criterion": criterion, "strata": int(len(np.unique(strata))),
              "picked": int(len(pick)), "plan_value_picked": float(value[pick].sum()),
              "plan_value_all": float(value[open_].sum()),
              "mean_value_picked": float(value[pick].mean()) if len(pick) else 0.0,
              "mean_value_all": float(value[open_].mean()) if len(open_) else 0.0}
    return prompts[pick], report


def replay_labels(labels: pd.DataFrame, matrix: OutcomeMatrix,
                  config: RouterReplayConfig | None = None,
                  picked: np.ndarray | None = None) -> pd.DataFrame:
    """Replay logged opening prompts against the other candidates.

    labels: bandit rows (`exploration.bandit_rows`), needing prompt_id; picked: the prompt
    ids to replay (`planned_prompts`); None: a seeded uniform `config.share` of them
    (`random_prompts`). Returns one row per (replayed prompt, candidate not logged for
    it), label columns as the bandit rows, `label_source = "replay"`, propensity NaN,
    outcomes and costs read from `matrix`. `attrs["replay_report"]` counts prompts and rows.
    """
    config = config or RouterReplayConfig()
    prompts = logged_openings(labels, matrix)[0]  # refuses rows without prompt_id
    opening = labels[labels[Label.POLICY_DECISION].astype(bool)]
    row_of = pd.Series(np.arange(matrix.n_prompts), index=matrix.prompt_ids)
    known = opening[opening[Label.PROMPT_ID].isin(row_of.index)]
    if picked is None:
        picked = random_prompts(prompts, config.share, config.seed)
    picked = np.asarray(picked).astype(str)
    n_pick = len(picked)
    first = known.drop_duplicates(Label.PROMPT_ID).set_index(Label.PROMPT_ID)
    seen = known.groupby(Label.PROMPT_ID)[Label.CANDIDATE].agg(set)
    rows = []
    for pid in picked:
        i = int(row_of[pid])
        for k, cand in enumerate(matrix.candidates):
            if cand in seen[pid]:
                continue
            rows.append({
                Label.SESSION_ID: first.at[pid, Label.SESSION_ID], Label.BINDING_ID: None,
                Label.CONTEXT_KEY: pid, Label.PROMPT_ID: pid,
                Label.TASK: matrix.meta[O.TASK].iat[i], Label.CANDIDATE: cand,
                Label.REWARD: float(matrix.score[i, k]), Label.SUCCESS: bool(matrix.success[i, k]),
                Label.COST: float(matrix.cost[i, k]), Label.PROPENSITY: np.nan,
                Label.LABEL_SOURCE: "replay", Label.POLICY_DECISION: False,
                Label.PROMPT_LENGTH: float(matrix.meta[Label.PROMPT_LENGTH].iat[i]),
            })
    out = pd.DataFrame(rows, columns=[Label.SESSION_ID, Label.BINDING_ID, Label.CONTEXT_KEY,
                                      Label.PROMPT_ID, Label.TASK, Label.CANDIDATE, Label.REWARD,
                                      Label.SUCCESS, Label.COST, Label.PROPENSITY,
                                      Label.LABEL_SOURCE, Label.POLICY_DECISION,
                                      Label.PROMPT_LENGTH])
    out.attrs["replay_report"] = {"logged_prompts": len(prompts), "replayed_prompts": n_pick,
                                  "share": config.share, "rows": len(out),
                                  "prompts_not_in_table": int(opening[Label.PROMPT_ID].nunique()
                                                              - len(prompts))}
    return out


def planned_halves(bandit: pd.DataFrame, matrix: OutcomeMatrix, config: RouterReplayConfig,
                   plan: Callable[[], tuple[np.ndarray, float, str]],
                   replan: Callable[[pd.DataFrame], tuple[np.ndarray, float, str]],
                   embedding: np.ndarray | None = None) -> tuple[pd.DataFrame, dict]:
    """`router.replay.selection=planned_halves`: a replay plan refreshed once, half way.

    First half: `planned_prompts` at share/2 on `plan()` (the round-0 head on the receipts
    alone), i.e. exactly what `planned` picks at share/2. Those prompts are replayed, and
    `replan(first half's replay rows)` refits the same head on the receipts plus them and
    gives its P(success), threshold and rule. Second half: `planned_prompts` again, same
    criterion and strata, for the remaining round(share x m) - first among the prompts not
    yet replayed. Each half reads only what the team holds at that moment (the receipts,
    then the first half's revealed outcomes), never an outcome before its replay. Returns
    both halves' replay rows and a report of each half's size and plan value."""
    prompts = logged_openings(bandit, matrix)[0]
    total = int(round(config.share * len(prompts)))
    halves = []
    prob, threshold, rule = plan()
    first, rep1 = planned_prompts(bandit, matrix, prob, threshold, rule, config.share / 2,
                                  config.seed, embedding)
    halves.append({**rep1, "threshold": float(threshold), "rule": rule})
    replay1 = replay_labels(bandit, matrix, config, picked=first)
    prob, threshold, rule = replan(replay1)
    second, rep2 = planned_prompts(bandit, matrix, prob, threshold, rule, config.share,
                                   config.seed, embedding, exclude=first,
                                   n_pick=total - len(first))
    halves.append({**rep2, "threshold": float(threshold), "rule": rule})
    out = replay_labels(bandit, matrix, config, picked=np.concatenate([first, second]))
    return out, {"halves": halves, "first_half": first.tolist(), "second_half": second.tolist()}


def choose_replays(bandit: pd.DataFrame, matrix: OutcomeMatrix, config: RouterReplayConfig,
                   plan: Callable[[], tuple[np.ndarray, float, str]],
                   judge: Callable[[pd.DataFrame], float],
                   embedding: np.ndarray | None = None,
                   replan: Callable[[pd.DataFrame], tuple[np.ndarray, float, str]] | None = None,
                   ) -> tuple[pd.DataFrame, dict]:
    """The replay rows of `config.selection` and what was chosen and why.

    random: `random_prompts`; planned: `planned_prompts` on `plan()` = (P(success) of the
    round-0 head, fitted on the receipts alone, over `matrix`'s rows; its threshold; its
    rule); planned_gain: the same ranked by the expected gain (`PLANNED_CRITERIA`);
    planned_halves: `planned_halves`, with `replan(replay rows)` = the same head refitted
    on the receipts plus those replays (required then); auto: random and planned, and the
    one whose `judge(replay rows)` (a head fitted with them, its cost ratio on the
    calibration split, lower is better) is lower; a tie keeps random.
    The report (the run summary's `replay`) says which selection ran and why."""
    sel = config.selection
    report: dict = {"selection": sel, "share": float(config.share)}
    if sel == "random" or config.share <= 0.0:
        out = replay_labels(bandit, matrix, config)
        report.update(chosen="random", why="router.replay.selection=random" if sel == "random"
                      else "share 0: nothing to plan")
        return out, {**report, **out.attrs["replay_report"]}
    if sel == "planned_halves":
        if replan is None:
            raise ValueError("choose_replays: selection planned_halves needs replan (the "
                             "round-0 head refitted on the receipts plus the first half)")
        out, halves = planned_halves(bandit, matrix, config, plan, replan, embedding)
        h1, h2 = halves["halves"]
        report.update(chosen=sel, halves=halves["halves"],
                      plan={**h1, "round0_threshold": h1["threshold"]},
                      why=(f"router.replay.selection={sel}: first half {h1['picked']} prompts "
                           f"(plan value {h1['plan_value_picked']:.3f}), second half "
                           f"{h2['picked']} (plan value {h2['plan_value_picked']:.3f} after "
                           "the refit)"))
        return out, {**report, **out.attrs["replay_report"]}
    prob, threshold, rule = plan()
    picked, plan_report = planned_prompts(bandit, matrix, prob, threshold, rule, config.share,
                                          config.seed, embedding,
                                          PLANNED_CRITERIA.get(sel, "priority"))
    planned = replay_labels(bandit, matrix, config, picked=picked)
    report["plan"] = {**plan_report, "round0_threshold": float(threshold), "rule": rule}
    if sel in PLANNED_CRITERIA:
        report.update(chosen=sel, why=f"router.replay.selection={sel}")
        return planned, {**report, **planned.attrs["replay_report"]}
    random = replay_labels(bandit, matrix, config)
    crit = {"random": float(judge(random)), "planned": float(judge(planned))}
    won = "planned" if crit["planned"] < crit["random"] else "random"
    report.update(chosen=won, calibration_cost_ratio=crit,
                  why=(f"auto: {won} is cheaper on calibration at the served quality "
                       f"(cost ratio planned {crit['planned']:.3f}, random {crit['random']:.3f})"
                       if crit["planned"] != crit["random"] else
                       "auto: a tie on calibration keeps random"))
    out = planned if won == "planned" else random
    return out, {**report, **out.attrs["replay_report"]}


def training_labels(bandit: pd.DataFrame, replay: pd.DataFrame | None = None) -> pd.DataFrame:
    """Logged + exploration bandit rows and replay rows in one label table (no text)."""
    parts = [bandit] if replay is None or replay.empty else [bandit, replay]
    out = pd.concat(parts, ignore_index=True, sort=False)
    bad = sorted(set(out[Label.LABEL_SOURCE].unique()) - set(LABEL_SOURCES))
    if bad:
        raise ValueError(f"training_labels: unknown label_source {bad}; known {LABEL_SOURCES}")
    if O.PROMPT_TEXT in out.columns:
        raise ValueError("training_labels: a prompt_text column reached the label table")
    return out
