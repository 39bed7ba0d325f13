"""The router pipeline: outcomes in; exploration labels, learned router, baselines, OPE, go/no-go out.

`train_router(outcomes, cfg, out_dir, embed)`:

1. the outcomes-v1 table becomes a full-information matrix (prompts x
   candidates: quality, cost); prompts are split train / calibration / test
   (seeded, by prompt; each prompt opens one session);
2. TRAIN is what production would have logged: the scenario rules (fitted on
   train, said so in the summary) bind each session once, a bounded share of
   sessions binds to another candidate at random (`simulate_receipts`), only
   the bound candidate's outcome is visible; a configured share of logged
   opening prompts is replayed offline against the other candidates;
3. prompt text goes through `embed` (the ONNX MiniLM encoder at run time too)
   and nowhere else: label tables hold ids, embeddings, labels and metadata;
4. the MLP head learns each candidate's success from the IPS-weighted logged
   decisions plus the replay labels (its clip, teachers and width chosen on the
   calibration split, `router.head_select`); kNN and LightGBM on the same rows;
5. CALIBRATION is replayed in full (offline replay of every candidate): Platt
   calibration of the head and the threshold of each scoring router;
6. TEST is scored against the full table (`truth`), and also re-logged by the
   rules with exploration so the off-policy estimates (IPS, SNIPS, DR) of the
   learned policy can be checked against that truth;
   The rules are reported twice: `rules`, fitted on train's full outcome table,
   and `rules_equal`, fitted only on the train prompts the learned router sees
   every candidate's outcome for (logged decision + offline replay);
7. the verdict (GO / NO-GO / NOT ENOUGH EVIDENCE, `router.gate`) on `router.objective`,
   the same objective the served threshold was chosen for on calibration (the incumbent
   is `go.baseline`: rules or rules_equal): by default the served router must save cost
   on test with a paired, prompt-bootstrap interval excluding zero and lose no more than
   `objective.margin` quality, with exploration within its cap; a learning curve refits
   on shares of the explored sessions.

The curves' statistics (the rules' curve, paired cost_ratio gaps) are
`pipelines/router_curves.py`. The rest is one unit: `train_router` and the steps only it
runs (labels from simulated receipts, the head and baselines fitted on them, OPE against
the full table, the gate whose learning curve refits the head), sharing its splits.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from replaylab.contracts import SOURCE_ATTR
from replaylab.contracts.columns import Outcomes as O
from replaylab.contracts.errors import InputError
from replaylab.jsonsafe import json_safe
from replaylab.pipelines.router_curves import cr95_gaps, rules_scores
from replaylab.pipelines.router_fit import ChosenHead, choose_head, fit_head, seed_spread
from replaylab.pipelines.router_run import RouterRun, golden_inputs
from replaylab.router.baselines import KnnRouter, LgbmRouter, OracleRouter, RandomRouter
from replaylab.router.exploration import bandit_rows, simulate_receipts
from replaylab.router.gate import objective_criteria, ope_gate, outcomes_gate
from replaylab.router.head import SuccessHead
from replaylab.router.inputs import TrainingRows, ips_weights, prompt_hash
from replaylab.router.metrics import (
    anchors,
    policy_summary,
)
from replaylab.router.objective import served_policy
from replaylab.router.ope import (
    feasible_interval,
    logged_decisions,
    ope_estimates,
    policy_matrix,
    policy_value,
    support_check,
)
from replaylab.router.ope_sums import ope_from_sums, ope_part, scored_rows
from replaylab.router.pipeline_config import RouterPipelineConfig
from replaylab.router.policy import (
    routing_scores,
    select_threshold,
)
from replaylab.router.replay import (
    Label,
    OutcomeMatrix,
    choose_replays,
    outcome_matrix,
    training_labels,
)
from replaylab.router.rules import ScenarioRules
from replaylab.runtime.routing import decision_margin

SPLITS = ("train", "calibration", "test")
SCORED = ("learned", "knn", "lgbm")  # routers with a threshold on predicted success


class RouterDataError(InputError, ValueError):
    """The outcomes cannot train a router (the message says why)."""


def prompt_hashes(texts: Sequence[str]) -> list[str]:
    """Sorted distinct `prompt_hash`es of texts."""
    return sorted({prompt_hash(t) for t in texts})


def _texts(outcomes: pd.DataFrame, prompt_ids: np.ndarray) -> list[str]:
    first = outcomes.drop_duplicates(O.PROMPT_ID).set_index(O.PROMPT_ID)[O.PROMPT_TEXT]
    return first.reindex(prompt_ids).fillna("").astype(str).tolist()


def seeded_split(n: int, shares: Sequence[float], seed: int) -> np.ndarray:
    """(n,) split name of each prompt: a seeded permutation cut at the `shares` of SPLITS."""
    order = np.random.default_rng(seed).permutation(n)
    cuts = np.round(np.cumsum(shares)[:-1] * n).astype(int)
    out = np.empty(n, dtype=object)
    for name, idx in zip(SPLITS, np.split(order, cuts), strict=True):
        out[idx] = name
    return out


def test_prompts(outcomes: pd.DataFrame, cfg: RouterPipelineConfig,
                 ) -> tuple[OutcomeMatrix, list[str], dict[str, np.ndarray]]:
    """The test split `train_router` scores (the same matrix and seeded split): its full
    outcome matrix, prompt texts and metadata (category, prompt tokens), for scoring
    another router artifact on the same prompts (`replaylab.artifacts.rescore_router`)."""
    m = outcome_matrix(outcomes, cfg.cost, candidates=cfg.candidates)
    te = m.take(seeded_split(m.n_prompts, cfg.split, cfg.seed) == "test")
    return te, _texts(outcomes, te.prompt_ids), prompt_meta(te)


def prompt_meta(m: OutcomeMatrix) -> dict[str, np.ndarray]:
    """The head's metadata of each prompt of `m`: its category and prompt tokens."""
    return {"category": m.meta[O.TASK].astype(str).to_numpy(),
            "prompt_tokens": m.meta[Label.PROMPT_LENGTH].to_numpy(float)}


def _rows(labels: pd.DataFrame, m: OutcomeMatrix, max_weight: float | None) -> TrainingRows:
    """Label table -> TrainingRows: logged decisions (IPS weights) and replay rows (weight 1).

    Escalation bindings are left out: they are chosen because the opening call
    failed, so their outcomes are not a sample of any policy's decisions.
    """
    keep = labels[labels[Label.POLICY_DECISION].astype(bool)
                  | (labels[Label.LABEL_SOURCE] == "replay")]
    row_of = pd.Series(np.arange(m.n_prompts), index=m.prompt_ids)
    col_of = {c: k for k, c in enumerate(m.candidates)}
    return TrainingRows(
        row=row_of.reindex(keep[Label.PROMPT_ID]).to_numpy(np.int64),
        action=keep[Label.CANDIDATE].map(col_of).to_numpy(np.int64),
        reward=keep[Label.REWARD].to_numpy(float),
        weight=ips_weights(pd.to_numeric(keep[Label.PROPENSITY], errors="coerce").to_numpy(float),
                           max_weight),
        cost=keep[Label.COST].to_numpy(float))


def _full_rows(m: OutcomeMatrix) -> TrainingRows:
    """Every (prompt, candidate) of a fully replayed split, weight 1."""
    n, k = m.score.shape
    return TrainingRows(row=np.repeat(np.arange(n), k), action=np.tile(np.arange(k), n),
                        reward=m.score.ravel(), weight=None, cost=m.cost.ravel())


def equal_information_matrix(rows: TrainingRows, m: OutcomeMatrix) -> OutcomeMatrix:
    """The training prompts whose outcome is observed for EVERY candidate in the learned
    router's own rows (`rows`: the logged decisions and the replay labels the head trains
    on; escalations are not in them), with the observed rewards and costs as the table.
    Exploration does not add a prompt: it observes the explored candidate instead of the
    rules' choice, one candidate per session; what completes a row is the offline replay
    of a logged opening prompt against the other candidates."""
    k = len(m.candidates)
    seen = pd.DataFrame({"row": rows.row, "action": rows.action, "reward": rows.reward,
                         "cost": rows.cost if rows.cost is not None else np.nan}
                        ).drop_duplicates(["row", "action"])
    full = seen.groupby("row")["action"].nunique()
    keep = np.sort(full.index[full.to_numpy() == k].to_numpy(np.int64))
    sub = m.take(keep)
    seen = seen[seen["row"].isin(keep)]
    at = pd.Series(np.arange(len(keep)), index=keep)[seen["row"]].to_numpy()
    score, cost = sub.score.copy(), sub.cost.copy()
    score[at, seen["action"].to_numpy()] = seen["reward"].to_numpy(float)
    observed_cost = seen["cost"].to_numpy(float)
    ok = np.isfinite(observed_cost)
    cost[at[ok], seen["action"].to_numpy()[ok]] = observed_cost[ok]
    return dataclasses.replace(sub, score=score, success=score >= 0.5, cost=cost,
                               report=dict(sub.report, equal_information=True))


def _fit_rules_equal(cfg: RouterPipelineConfig, rows: TrainingRows, tr: OutcomeMatrix
                     ) -> tuple[ScenarioRules | None, OutcomeMatrix | None, dict]:
    """`rules_equal`: the scenario rules fitted on `equal_information_matrix` (None with a
    note when no training prompt has every candidate's outcome, e.g. replay.share = 0)."""
    eq = equal_information_matrix(rows, tr)
    info = {"prompts": int(eq.n_prompts), "train_prompts": int(tr.n_prompts),
            "fitted_on": "training prompts with every candidate's outcome observed in the "
                         "learned router's rows (logged decision + offline replay)"}
    if eq.n_prompts == 0:
        info["note"] = "no training prompt has every candidate's outcome: rules_equal not fitted"
        return None, None, info
    rules = ScenarioRules(cfg.rules).fit(eq)
    return rules, eq, {**info, **rules.describe()}


def _ope(test: OutcomeMatrix, rules: ScenarioRules, cfg: RouterPipelineConfig,
         choice: np.ndarray, prob: np.ndarray, unit_cost: np.ndarray | None = None,
         fallback: int = -1) -> dict:
    """OPE of the learned policy on re-logged test sessions, beside the truth; with
    `unit_cost` (the train calls' mean cost per candidate, the DR cost model) also the OPE
    evidence the receipts gate reads (`ope_sums.ope_evidence`) and the verdict an OPE gate
    on these re-logged sessions would give (`ope_verdict`): a check of the receipts-mode
    gate against the full-information one (the incumbent here is the rules, which logged
    these sessions)."""
    exp = dataclasses.replace(cfg.exploration, seed=cfg.exploration.seed + 1)
    sim = simulate_receipts(test, rules, exp)
    bandit = bandit_rows(sim.ledger)
    b = logged_decisions(bandit, test.candidates)
    row_of = pd.Series(np.arange(test.n_prompts), index=test.prompt_ids.astype(str))
    rows = row_of.reindex(pd.Series(b.context_key).astype(str)).to_numpy()
    if np.isnan(rows.astype(float)).any():
        raise RouterDataError("OPE: a logged context does not map to a test prompt")
    rows = rows.astype(np.int64)
    k = len(test.candidates)
    est = ope_estimates(b, policy_matrix(choice[rows], k), q_hat=prob[rows],
                        config=cfg.evaluation)
    tag = cfg.evaluation.level_tag
    # quality is in [0, 1] (outcomes-v1): so is every policy's value, and its interval
    out = {name: feasible_interval(est, name, 0.0, 1.0, tag) for name in ("ips", "snips", "dr")}
    out["truth"] = policy_value(test.score[rows], policy_matrix(choice[rows], k))
    out["logging_policy_truth"] = float(test.score[rows, b.action].mean())
    out.update({k2: est[k2] for k2 in ("n", "sessions", "ess", "mean_weight", "support")
                if k2 in est})
    out["covers_truth"] = {n: out[n]["ci"][0] <= out["truth"] <= out[n]["ci"][1]
                           for n in ("ips", "snips", "dr")}
    out["warnings"] = support_check(est)
    if unit_cost is not None:
        out.update(_ope_evidence(cfg, test, bandit, b, rows, choice, prob, unit_cost, fallback))
    return out


def _ope_evidence(cfg: RouterPipelineConfig, test: OutcomeMatrix, bandit: pd.DataFrame,
                  b: Any, rows: np.ndarray, choice: np.ndarray, prob: np.ndarray,
                  unit_cost: np.ndarray, fallback: int) -> dict:
    """The receipts gate's OPE evidence and verdict on the re-logged test sessions (the
    same sums, `ope_sums.ope_part`, as a receipts run)."""
    cost = logged_decisions(bandit, test.candidates, reward=Label.COST).reward
    dec = bandit[bandit[Label.POLICY_DECISION].astype(bool)
                 & (bandit[Label.LABEL_SOURCE] != "replay")]
    k = len(test.candidates)
    frame = pd.DataFrame({"action": b.action, Label.REWARD: b.reward, Label.COST: cost,
                          Label.PROPENSITY: b.propensity,
                          Label.SESSION_ID: b.session.astype(str),
                          Label.SESSION_COST: np.nan,
                          Label.LABEL_SOURCE: dec[Label.LABEL_SOURCE].to_numpy()})
    ev = cfg.evaluation
    scored = scored_rows(frame, prob[rows], choice[rows])
    total = ope_part(scored, k, unit_cost, unit_cost, ev.n_boot, ev.seed, None, None,
                     fallback % k, cfg.policy.rule)
    o = cfg.objective
    fraction = o.fraction_of_strong if o.kind == "quality_floor" else None
    ope = ope_from_sums(total, test.candidates, b.n, ev.level, ev.level_tag, fraction)
    verdict = ope_gate(ope, o, float(cfg.go.sessions_per_day), incumbent="rules (logging)",
                       test_share=float(cfg.split[2]))
    return {"evidence": ope["evidence"],
            "ope_verdict": {"verdict": verdict["verdict"], "reason": verdict["go_reason"],
                            "what": "the receipts-mode gate (router/gate.py ope_gate) on "
                                    "these re-logged test sessions, against the rules that "
                                    "logged them: what a gate from receipts alone would say"}}


# How far a decision must sit from the threshold to survive another machine's kernels:
# fp32 embeddings differ by float rounding (P(success) by ~1e-6), int8 ones by its kernels
# (P(success) by up to ~1e-2, docs/results/int8-cpus.md). Reported as shares of test decisions.
STABILITY_MARGINS = {"fp32": 1e-4, "int8": 2e-2}


def _decisions(te: OutcomeMatrix, prob: np.ndarray, policy: Any, rule: str) -> pd.DataFrame:
    """The learned router's test decisions as training reports them (and the runtime makes
    them): prompt id, P(success) per candidate, the chosen candidate, its margin."""
    choice = policy.choose(prob)
    out = pd.DataFrame({"prompt_id": te.prompt_ids.astype(str),
                        "candidate": np.asarray(te.candidates, dtype=object)[choice],
                        "margin": decision_margin(prob, policy.threshold,
                                                  fallback=policy.fallback, rule=rule)})
    for k, c in enumerate(te.candidates):
        out[f"p_{c}"] = prob[:, k]
    return out


def _stability(decisions: pd.DataFrame) -> dict:
    """Share of test decisions within each variant's margin of flipping on another CPU."""
    margin = decisions["margin"].to_numpy(float)
    return {f"{v}_near_threshold_share": float((margin <= m).mean()) if len(margin) else None
            for v, m in STABILITY_MARGINS.items()} | {"margins": dict(STABILITY_MARGINS)}


def _choose_head(cfg: RouterPipelineConfig, labels: pd.DataFrame, tr: OutcomeMatrix,
                 fit: dict, ca: OutcomeMatrix, k: int, head_scorer: str,
                 say: Callable[[str], None]) -> tuple[RouterPipelineConfig, ChosenHead]:
    """The head's clip, teachers and width chosen on CALIBRATION (`router_fit.choose_head`,
    the receipts mode's choice): the criterion is the figure the threshold is picked with
    (`select_threshold` on the full calibration replay). fit: {"E", "meta"} of train and
    calibration. Returns (cfg with the chosen head, the choice)."""
    budget = cfg.policy.cost_budget
    name = ("cost ratio (cost of the threshold the objective chooses on calibration / "
            f"strong-only cost; {cfg.objective.label(cfg.go.baseline)})" if budget is None else
            f"-quality at the best threshold within cost {budget:g}")
    Eca, mca = fit["E"]["calibration"], fit["meta"]["calibration"]

    def replay_point(dep: Any) -> tuple[bool, float, dict, Any]:
        ch = select_threshold(dep.predict_proba(Eca, mca), ca.score, ca.cost, cfg.policy)
        strong = ch.curve.strong_cost
        ratio = ch.cost / strong if strong > 0 else float("nan")
        crit = (ratio if strong > 0 else ch.cost) if budget is None else -ch.quality
        figures = {"cost_ratio": ratio, "quality": ch.quality,
                   "quality_vs_strong": (ch.quality / ch.curve.strong_quality
                                         if ch.curve.strong_quality > 0 else None),
                   "cost": ch.cost, "strong_share": ch.strong_share,
                   "threshold": ch.threshold}
        return ch.met, crit, figures, ch

    chosen = choose_head(cfg, fit["E"], fit["meta"], _rows_for(labels, tr, ca), k,
                         head_scorer, replay_point, name, say)
    return dataclasses.replace(cfg, head=chosen.config), chosen


def _fit_head(E: np.ndarray, meta: dict, rows: TrainingRows, k: int, cfg: RouterPipelineConfig,
              calib: tuple[np.ndarray, dict, TrainingRows]) -> SuccessHead:
    """The configured head fitted on `rows` and calibrated on `calib` (not as served: the
    replay selection's round-0 and judge heads)."""
    head = SuccessHead(cfg.head, seed=cfg.seed).fit(E, meta, rows, k)
    return head.calibrate(*calib)


def _replays(cfg: RouterPipelineConfig, bandit: pd.DataFrame, rules: ScenarioRules,
             train: tuple, calib: tuple, k: int) -> tuple[pd.DataFrame, dict]:
    """The replay rows of `router.replay.selection` (router/replay.py `choose_replays`).

    The plan's round-0 head and the judge's heads are the configured head with one teacher
    (a cheaper fit; the served head is chosen later by `_choose_head`), calibrated and
    thresholded on the calibration split at the objective's point against the rules."""
    Etr, mtr, tr = train
    Eca, mca, ca = calib
    cal_rows = (Eca, mca, _full_rows(ca))
    rules_q = float(ca.score[np.arange(ca.n_prompts), rules.predict_index(ca)].mean())
    policy = served_policy(cfg.objective, cfg.policy, rules_q)
    c1 = dataclasses.replace(cfg, head=dataclasses.replace(cfg.head, teachers=1))

    def fitted(labels: pd.DataFrame) -> tuple[SuccessHead, Any]:
        head = _fit_head(Etr, mtr, _rows(labels, tr, cfg.head.max_weight), k, c1, cal_rows)
        return head, select_threshold(head.predict_proba(Eca, mca), ca.score, ca.cost, policy)

    def plan(replay: pd.DataFrame | None = None) -> tuple[np.ndarray, float, str]:
        # the round-0 head on the receipts alone; planned_halves' replan: the same head (same
        # config, same seed) refitted on the receipts plus the first half's replays
        head, ch = fitted(training_labels(bandit, replay))
        return head.predict_proba(Etr, mtr), float(ch.threshold), policy.rule

    def judge(replay: pd.DataFrame) -> float:
        ch = fitted(training_labels(bandit, replay))[1]
        return ch.cost / ch.curve.strong_cost if ch.curve.strong_cost > 0 else ch.cost

    return choose_replays(bandit, tr, cfg.replay, plan, judge, embedding=Etr, replan=plan)


def _rows_for(labels: pd.DataFrame, tr: OutcomeMatrix, ca: OutcomeMatrix
              ) -> Callable[[float | None], dict]:
    """max_weight -> the head's {"train", "calibration"} rows: the logged decisions and
    replays of train at that clip, every (prompt, candidate) of the calibration replay."""
    return lambda clip: {"train": _rows(labels, tr, clip), "calibration": _full_rows(ca)}


SPREAD_KEYS = ("quality", "cost", "cost_ratio_at_95", "apgr")
SPREAD_WHAT = ("the chosen head refitted with each seed on the same rows and split; "
               "threshold chosen again on calibration; the same test prompts")


def _spread(cfg: RouterPipelineConfig, headline: dict, fit: dict, rows: dict,
            ca: OutcomeMatrix, test: tuple, k: int, head_scorer: str,
            say: Callable[[str], None]) -> dict:
    """The learned router's test figures over head seeds (`router_fit.seed_spread`): the
    chosen head refitted with seeds seed + 1 .. seed + spread_seeds - 1 on the same rows
    and split, its threshold chosen again on calibration, scored on the same test prompts
    (`router.spread_seeds`)."""
    Ete, mte, te = test
    ev = dataclasses.replace(cfg.evaluation, n_boot=0)

    def row_of(seed: int) -> dict:
        _, dep = fit_head(cfg.head, seed, fit["E"], fit["meta"], rows, k, head_scorer)
        ch = select_threshold(dep.predict_proba(fit["E"]["calibration"],
                                                fit["meta"]["calibration"]),
                              ca.score, ca.cost, cfg.policy)
        prob = dep.predict_proba(Ete, mte)
        s = policy_summary(te, ch.choose(prob), routing_scores(prob, cfg.policy.rule), ev)
        return {"seed": seed, **{key: s[key] for key in SPREAD_KEYS},
                "threshold": float(ch.threshold)}

    first = {"seed": cfg.seed, **{key: headline[key] for key in SPREAD_KEYS},
             "threshold": headline["threshold"]["threshold"]}
    return seed_spread(first, cfg.seed, cfg.spread_seeds, row_of,
                       {key: (lambda r, key=key: r[key]) for key in SPREAD_KEYS}, SPREAD_WHAT,
                       say)


def train_router(outcomes: pd.DataFrame, cfg: RouterPipelineConfig, out_dir: Path,
                 embed: Callable[[list[str]], np.ndarray],
                 progress: Callable[[str], None] | None = None,
                 head_scorer: str = "onnx") -> tuple[dict, RouterRun]:
    """Train, calibrate, test and gate the router; write tables; return the summary and run.

    outcomes: an outcomes-v1 frame (every candidate scored on every prompt);
    embed: texts -> (n, d) float32 L2-normalized embeddings (the encoder the
    runtime uses); head_scorer: how the runtime scores the head, `onnx` (MiniLM tier) or
    `numpy` (static tier, `replaylab.runtime.router_head.HeadScorer` of kind numpy): every reported learned
    decision is made by it. Raises RouterDataError when the table cannot train a router.
    """
    say = progress or (lambda _msg: None)
    out_dir.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    m = outcome_matrix(outcomes, cfg.cost, candidates=cfg.candidates)
    if m.n_prompts < 50:
        where = outcomes.attrs.get(SOURCE_ATTR) or "outcomes"
        raise RouterDataError(f"{where}: {m.n_prompts} prompts scored by every candidate "
                              f"{list(m.candidates)}: need >= 50")
    say(f"embedding {m.n_prompts} prompts")
    E = np.asarray(embed(_texts(outcomes, m.prompt_ids)), dtype=np.float32)
    timings["embed"] = time.perf_counter() - t0
    split = seeded_split(m.n_prompts, cfg.split, cfg.seed)
    tr, ca, te = (m.take(split == s) for s in SPLITS)
    Etr, Eca, Ete = (E[split == s] for s in SPLITS)
    mtr, mca, mte = prompt_meta(tr), prompt_meta(ca), prompt_meta(te)
    k = len(m.candidates)

    t0 = time.perf_counter()
    rules = ScenarioRules(cfg.rules).fit(tr)
    sim = simulate_receipts(tr, rules, cfg.exploration)
    bandit = bandit_rows(sim.ledger)
    replay, replay_choice = _replays(cfg, bandit, rules, (Etr, mtr, tr), (Eca, mca, ca), k)
    say(f"replay selection: {replay_choice['chosen']} ({replay_choice['why']})")
    labels = training_labels(bandit, replay)
    rows = _rows(labels, tr, cfg.head.max_weight)  # the baselines' rows: the configured clip
    rules_eq, tr_eq, rules_eq_info = _fit_rules_equal(cfg, rows, tr)
    if cfg.go.baseline == "rules_equal" and rules_eq is None:
        raise RouterDataError(f"go.baseline=rules_equal: {rules_eq_info['note']} "
                              f"(replay.share={cfg.replay.share:g})")
    # the objective's operating point: the incumbent (go.baseline's rules) on calibration
    incumbent = rules_eq if cfg.go.baseline == "rules_equal" else rules
    incumbent_q_cal = float(ca.score[np.arange(ca.n_prompts), incumbent.predict_index(ca)].mean())
    cfg = dataclasses.replace(cfg, policy=served_policy(cfg.objective, cfg.policy,
                                                        incumbent_q_cal))
    timings["labels"] = time.perf_counter() - t0

    say("training the head and the baselines")
    t0 = time.perf_counter()
    fit = {"E": {"train": Etr, "calibration": Eca}, "meta": {"train": mtr, "calibration": mca}}
    cfg, picked = _choose_head(cfg, labels, tr, fit, ca, k, head_scorer, say)
    head, deployed, selection = picked.head, picked.deployed, picked.selection
    timings["head"] = time.perf_counter() - t0
    scorers: dict[str, Any] = {
        "learned": deployed,
        "knn": KnnRouter(n_neighbors=cfg.knn_neighbors).fit(Etr, mtr, rows, k),
        "lgbm": LgbmRouter(n_estimators=cfg.lgbm_estimators).fit(Etr, mtr, rows, k),
    }
    prob_ca = {n: s.predict_proba(Eca, mca) for n, s in scorers.items()}
    prob_te = {n: s.predict_proba(Ete, mte) for n, s in scorers.items()}
    chosen = {n: select_threshold(prob_ca[n], ca.score, ca.cost, cfg.policy) for n in SCORED}
    choice = {n: chosen[n].choose(prob_te[n]) for n in SCORED}
    fallback = chosen["learned"].fallback  # the strongest on the calibration replay

    rules_te = rules.predict_index(te)
    rng = np.random.default_rng(cfg.seed)
    random = RandomRouter.matching(choice["learned"], k, seed=cfg.seed, strong=fallback)
    oracle = OracleRouter(cfg.policy.success_cutoff)
    choice.update({"rules": rules_te, "random": random.choose(Ete),
                   "cheap_only": np.zeros(te.n_prompts, np.int64),
                   "strong_only": np.full(te.n_prompts, fallback, np.int64),
                   "oracle": oracle.choose(te.score, fallback=fallback)})
    rule = cfg.policy.rule
    curves = {**{n: routing_scores(p, rule) for n, p in prob_te.items()},
              "rules": routing_scores(rules_scores(rules, tr, te), rule),
              "random": rng.random((te.n_prompts, k)),
              "oracle": oracle.predict_proba(te.score)}
    if rules_eq is not None:
        choice["rules_equal"] = rules_eq.predict_index(te)
        curves["rules_equal"] = routing_scores(rules_scores(rules_eq, tr_eq, te), rule)
    ev = cfg.evaluation
    test = {}
    for name, ch in choice.items():
        s = policy_summary(te, ch, curves.get(name), ev)
        test[name] = {key: s[key] for key in ("quality", "cost", "strong_share", "apgr", "cpt50",
                                               "cpt80", "cost_ratio_at_95")}
        test[name]["ci"] = {key: [s.get(f"{key}-lo-{ev.level_tag}"),
                                  s.get(f"{key}-hi-{ev.level_tag}")]
                            for key in ("quality", "cost")}
    for n in SCORED:
        test[n]["threshold"] = chosen[n].summary()
    weak_, strong_ = anchors(te, ev, allow_same=True)
    gaps, gap_reps = cr95_gaps(te, curves, [("learned", "rules"), ("learned", "rules_equal")],
                               ev)
    baseline = cfg.go.baseline
    base_rules = rules_eq if baseline == "rules_equal" else rules
    t0 = time.perf_counter()
    spread = _spread(cfg, test["learned"], fit, _rows_for(labels, tr, ca)(cfg.head.max_weight),
                     ca, (Ete, mte, te), k, head_scorer, say)
    timings["spread"] = time.perf_counter() - t0

    say("off-policy evaluation and the go/no-go gate")
    t0 = time.perf_counter()
    ope = _ope(te, rules, cfg, choice["learned"], prob_te["learned"],
               unit_cost=tr.cost.mean(axis=0), fallback=fallback)
    timings["ope"] = time.perf_counter() - t0
    gate, curve = _gate(cfg, base_rules, (prob_ca["learned"], prob_te["learned"]), fit,
                        (tr, labels), ca, (Ete, mte, te), choice[baseline], sim.stats,
                        head_scorer, served=chosen["learned"])
    timings["learning_curve"] = gate.pop("_seconds")

    from replaylab.router.metrics import cost_quality_curve

    curve_rows, note = [], None
    weak, strong = weak_, strong_
    if weak == strong:  # e.g. RouterArena: the cheapest candidate is also the best on average
        note = (f"{te.candidates[weak]} is both the cheapest and the best on average: there "
                "is no cost/quality trade-off to sweep, curve metrics are undefined")
    else:
        for name, pred in curves.items():
            c = cost_quality_curve(te, pred, ev).frame()
            c["policy"] = name
            curve_rows.append(c)
    curves_path = out_dir / "router_curves_test.parquet"
    (pd.concat(curve_rows, ignore_index=True) if curve_rows else pd.DataFrame(
        columns=["threshold", "strong_share", "quality", "cost", "policy"])).to_parquet(
        curves_path, index=False)
    decisions_path = out_dir / "router_decisions_test.parquet"
    decisions = _decisions(te, prob_te["learned"], chosen["learned"], rule)
    decisions.to_parquet(decisions_path, index=False)  # ids, scores, decisions: no text
    labels_path = out_dir / "router_labels.parquet"
    labels.to_parquet(labels_path, index=False)  # ids, labels, metadata: no text

    summary = {
        "pipeline": "router", "candidates": list(m.candidates), "prompts": int(m.n_prompts),
        "outcomes": m.report,
        "splits": {s: int((split == s).sum()) for s in SPLITS},
        "exploration": {"rate": float(cfg.exploration.rate),
                        "cap": float(cfg.exploration.cap),
                        "sessions": int(sim.stats["sessions"]),
                        "explored_sessions": int(sim.stats["exploration_sessions"]),
                        **{k2: v for k2, v in sim.stats.items()
                           if k2 not in ("sessions", "exploration_sessions")}},
        "labels": labels[Label.LABEL_SOURCE].value_counts().to_dict(),
        "replay": replay_choice,
        "rules": rules.describe(), "rules_equal": rules_eq_info, "go_baseline": baseline,
        "head": deployed.report(), "head_selection": selection, "spread": spread,
        "test": test, "test_gaps": gaps, "test_note": note, "ope": ope, **gate, "learning_curve": curve,
        "artifacts": {"curves": str(curves_path), "labels": str(labels_path),
                      "test_decisions": str(decisions_path)},
        "decision_stability": _stability(decisions),
        "timings_s": {k2: round(v, 3) for k2, v in timings.items()},
    }
    summary["served_threshold"] = float(chosen["learned"].threshold)
    summary["headline"] = served_headline(test, baseline, gate)
    summary = json_safe(summary)
    run = RouterRun(cfg, m.candidates, head, float(chosen["learned"].threshold), rules, summary,
                    rule=rule, fallback=int(chosen["learned"].fallback),
                    deployed=deployed if hasattr(deployed, "served_") else None,
                    golden_inputs=golden_inputs(_texts(outcomes, te.prompt_ids),
                                                mte["category"], mte["prompt_tokens"]),
                    rules_equal=rules_eq,
                    gap_replicates=gap_reps,
                    fit_prompts={s_: prompt_hashes(_texts(outcomes, x.prompt_ids))
                                 for s_, x in (("train", tr), ("calibration", ca))})
    return summary, run


def served_headline(test: dict, baseline: str, gate: dict) -> dict:
    """The headline: the SERVED point's test figures (what router.json ships), beside the
    incumbent's; cost_ratio_at_95 stays a labelled curve figure, a point nobody serves."""
    served, inc = test.get("learned") or {}, test.get(baseline) or {}
    strong = test.get("strong_only") or {}
    sc = strong.get("cost")
    return {"what": "the served threshold's test figures (router.json's operating point)",
            "objective": gate["objective"]["label"], "verdict": gate["verdict"],
            "threshold": gate["go_detail"]["threshold"],
            "quality": served.get("quality"), "cost": served.get("cost"),
            "strong_share": served.get("strong_share"),
            "cost_vs_strong_only": (served.get("cost") / sc if sc else None),
            "incumbent": baseline, "incumbent_quality": inc.get("quality"),
            "incumbent_cost": inc.get("cost"),
            "cost_vs_incumbent": (served.get("cost") / inc["cost"] if inc.get("cost") else None),
            "curve_figures": {"cost_ratio_at_95": served.get("cost_ratio_at_95"),
                              f"{baseline}_cost_ratio_at_95": inc.get("cost_ratio_at_95"),
                              "what": "curve figure: the cheapest point of each test cost/quality "
                                      "curve at 95% of strong-only quality, not a served point"}}


def _gate(cfg: RouterPipelineConfig, rules: ScenarioRules, learned: tuple[np.ndarray, np.ndarray],
          fit: dict, train: tuple, ca: OutcomeMatrix, test: tuple, rules_te: np.ndarray,
          stats: dict, head_scorer: str = "onnx", served: Any = None) -> tuple[dict, list[dict]]:
    """The verdict at the served threshold (`router.gate.outcomes_gate`), and the learning
    curve over explored sessions.

    The learned router is judged at exactly the operating point router.json ships:
    `served` (the `select_threshold` choice on calibration for `router.objective`), its
    test decisions `served.choose`, on the objective's own criteria
    (`router.gate.objective_criteria`). Each learning-curve refit is judged at its own
    `select_threshold` choice, as it would be served. rules: the incumbent (`go.baseline`:
    the full-information rules or rules_equal), rules_te its test choices; learned: the
    fitted head's (calibration, test) success probabilities; fit: {"E", "meta"} of train
    and calibration.
    """
    t_start = time.perf_counter()
    tr, labels = train
    Ete, mte, te = test
    Eca, mca = fit["E"]["calibration"], fit["meta"]["calibration"]
    g = cfg.go
    k = len(tr.candidates)
    rules_q_cal = float(ca.score[np.arange(ca.n_prompts), rules.predict_index(ca)].mean())

    def compare(prob_cal: np.ndarray, prob_test: np.ndarray, point: Any = None) -> dict:
        point = point or select_threshold(prob_cal, ca.score, ca.cost, cfg.policy)
        ch = point.choose(prob_test)
        crit, fig = objective_criteria(cfg.objective, g.baseline, g.n_boot, te, ch, rules_te,
                                       int(point.fallback), cfg.seed)
        return {"threshold": float(point.threshold), "operating_point": point.goal,
                "objective_met_on_calibration": bool(point.met),
                "learned_calibration_quality": float(point.quality), **fig,
                "rules_cost": float(te.cost[np.arange(te.n_prompts), rules_te].mean()),
                "learned_cost": float(te.cost[np.arange(te.n_prompts), ch].mean()),
                "_criteria": crit}

    main = compare(*learned, point=served)
    explored = labels[labels[Label.LABEL_SOURCE] == "exploration"]
    sessions = np.sort(explored[Label.SESSION_ID].unique())
    curve = []
    rng = np.random.default_rng(cfg.seed)
    perm = rng.permutation(sessions)
    rows_for = _rows_for(labels, tr, ca)
    for f in g.curve_fractions:
        keep = set(perm[: int(round(f * len(perm)))])
        sub = labels[(labels[Label.LABEL_SOURCE] != "exploration")
                     | labels[Label.SESSION_ID].isin(keep)]
        h = main if f == 1.0 else None
        if h is None:
            rows = dict(rows_for(cfg.head.max_weight), train=_rows(sub, tr, cfg.head.max_weight))
            _, fitted = fit_head(cfg.head, cfg.seed, fit["E"], fit["meta"], rows, k, head_scorer)
            h = compare(fitted.predict_proba(Eca, mca), fitted.predict_proba(Ete, mte))
        n = len(keep)
        curve.append({"fraction": f, "explored_sessions": n,
                      "days_of_live_exploration": n / (float(cfg.exploration.rate)
                                                       * g.sessions_per_day),
                      "cost_saving": h["cost_saving"], "quality_delta": h["quality_delta"],
                      "significant": bool(all(c.passed() for c in h["_criteria"]))})
    gate = outcomes_gate(cfg.objective, g.baseline, main, main.pop("_criteria"), te.n_prompts,
                         g.sessions_per_day, float(stats["exploration_share"]),
                         float(cfg.exploration.cap), float(cfg.split[2]),
                         cfg.policy.rule, curve, {"rules_calibration_quality": rules_q_cal})
    gate["_seconds"] = time.perf_counter() - t_start
    return gate, curve
