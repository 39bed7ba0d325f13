"""The router from a full-information outcome table: receipts simulated, the receipts pipeline run, the truth added.

`train_router(outcomes, cfg, out_dir, embed)`:

1. the outcomes-v1 table becomes a full-information matrix (prompts x candidates:
   quality, cost); prompts are split train / calibration / test (seeded, by prompt);
2. what production would have logged (`log_receipts`): the scenario rules (fitted on
   train, said so in the summary) bind each session once, a bounded share of sessions
   binds to another candidate at random (`simulate_receipts`), split after split in time;
   only the bound candidate's outcome reaches the ledger. The offline replays
   (`replay_table`): the train openings `router.replay.selection` picks (`_replays`), and
   every calibration opening against every other candidate;
3. the receipts pipeline (`pipelines/router_receipts.py`, on the compute engine) trains on
   that ledger and those replays, as it would on a team's own files: the head from the
   IPS-weighted train decisions plus the train replays, its clip, teachers and width and
   its threshold chosen on CALIBRATION for `router.objective` against `go.baseline`
   (`router_fit.CalibrationView`: the split is fully replayed, so DR reads its observed
   values), its OPE of the test sessions the rules logged; prompt text goes through `embed`
   once (`_lookup_encoder`);
4. what only full information adds: the served decisions, kNN and LightGBM (fitted on the
   same rows, thresholds chosen the same way), the rules (`rules`, on train's full table,
   and `rules_equal`, on the train prompts the learned router sees every candidate's
   outcome for), random, cheap/strong-only and the oracle, all scored on the test truth
   with intervals and curves; the receipts run's OPE beside the truth of the same
   decisions (`_ope_beside_truth`); the seed spread on the truth;
5. the verdict (GO / NO-GO / NOT ENOUGH EVIDENCE, `router.gate.outcomes_gate`) on
   `router.objective` at the served threshold on the test truth, with paired
   prompt-bootstrap intervals against `go.baseline`; a learning curve refits on shares of
   the explored sessions. The receipts gate's verdict on the same test sessions sits in
   `ope.ope_verdict`: what receipts alone would have said.

The curves' statistics (the rules' curve, paired cost_ratio gaps) are
`pipelines/router_curves.py`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from replaylab.contracts import SOURCE_ATTR, validate_ledger
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.columns import Outcomes as O
from replaylab.contracts.errors import InputError
from replaylab.jsonsafe import json_safe
from replaylab.pipelines.router_curves import cr95_gaps, rules_scores
from replaylab.pipelines.router_fit import (
    CalibrationView,
    FittedRouter,
    operating_point,
    seed_spread,
)
from replaylab.pipelines.router_receipts import FunctionEncoder, train_router_receipts
from replaylab.pipelines.router_run import RouterRun, golden_inputs
from replaylab.router.baselines import KnnRouter, LgbmRouter, OracleRouter, RandomRouter
from replaylab.router.exploration import (
    ReceiptsSimulation,
    bandit_rows,
    deployment_ledger,
    policy_truth,
    replay_outcomes,
    simulate_receipts,
)
from replaylab.router.gate import objective_criteria, outcomes_gate
from replaylab.router.head import SuccessHead
from replaylab.router.inputs import TrainingRows, ips_weights, prompt_hash
from replaylab.router.metrics import anchors, cost_quality_curve, policy_summary
from replaylab.router.objective import served_policy
from replaylab.router.ope import covers
from replaylab.router.pipeline_config import RouterPipelineConfig
from replaylab.router.policy import routing_scores, select_threshold
from replaylab.router.receipts import ReceiptsError
from replaylab.router.replay import (
    Label,
    OutcomeMatrix,
    choose_replays,
    outcome_matrix,
    training_labels,
)
from replaylab.router.rules import ScenarioRules
from replaylab.runtime.routing import choose_by_threshold, decision_margin

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
    outcome matrix, prompt texts and metadata as the run's head read them (`logged_meta`
    of the same simulated test receipts), for scoring another router artifact on the same
    prompts (`replaylab.artifacts.rescore_router`)."""
    m = outcome_matrix(outcomes, cfg.cost, candidates=cfg.candidates)
    split = seeded_split(m.n_prompts, cfg.split, cfg.seed)
    te = m.take(split == "test")
    rules = ScenarioRules(cfg.rules).fit(m.take(split == "train"))
    sim = log_split(te, "test", rules, cfg.exploration)  # as train_router logs it
    return te, _texts(outcomes, te.prompt_ids), logged_meta(sim, te)


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


# the receipts of each split are simulated with their own exploration seed (train: the
# configured one; test: + 1, as the re-logged test sessions always were; calibration: + 2)
LOG_SEED_OFFSET = {"train": 0, "calibration": 2, "test": 1}


@dataclass(frozen=True)
class Served:
    """An operating point as it is served: threshold, fallback column and rule (the runtime's
    `choose_by_threshold`), with what calibration said of it (`router_fit.operating_point`)."""

    threshold: float
    fallback: int
    rule: str
    point: dict

    @classmethod
    def of(cls, point: dict, fallback: int, rule: str) -> Served:
        return cls(float(point["threshold"]), int(fallback), rule, point)

    def choose(self, prob: np.ndarray) -> np.ndarray:
        return choose_by_threshold(prob, self.threshold, fallback=self.fallback, rule=self.rule)

    @property
    def goal(self) -> str:
        """What calibration chose it for: the quality floor or the budget, then the objective."""
        p = self.point
        if p.get("target_quality") is not None:
            return f"quality >= {p['target_quality']:.6g} ({p.get('objective')})"
        return f"best quality with cost <= {p.get('cost_budget')} ({p.get('objective')})"

    def summary(self) -> dict:
        keep = ("threshold", "met", "target_quality", "cost_budget", "dr_quality", "dr_cost",
                "incumbent", "incumbent_quality", "objective")
        return {key: self.point[key] for key in keep if key in self.point} | {
            "fallback": int(self.fallback), "rule": self.rule, "goal": self.goal}


def log_split(part: OutcomeMatrix, name: str, rules: ScenarioRules, config: Any,
              start_ms: int | None = None) -> ReceiptsSimulation:
    """One split's simulated receipts (`simulate_receipts` with the split's exploration seed,
    `LOG_SEED_OFFSET`; opening from `start_ms`), `prompt_tokens` filled
    (`with_prompt_length`)."""
    over = {"seed": int(config.seed) + LOG_SEED_OFFSET[name]}
    if start_ms is not None:
        over["start_ms"] = int(start_ms)
    return with_prompt_length(simulate_receipts(part, rules, dataclasses.replace(config, **over)),
                              part)


def log_receipts(m: OutcomeMatrix, split: np.ndarray, rules: ScenarioRules,
                 config: Any, texts: dict[str, str]
                 ) -> tuple[dict[str, ReceiptsSimulation], pd.DataFrame]:
    """What production would have logged, split after split in time: the rules bind each
    session once with the configured exploration (`simulate_receipts`, seeds
    `LOG_SEED_OFFSET`), each split's sessions opening after the previous split's last turn,
    so the receipts pipeline's time split (no embargo needed) is the seeded prompt split.
    Returns the simulations per split and the ledger as a deployment writes it
    (`deployment_ledger`: prompt text on opening turns, no benchmark ids; `prompt_tokens`
    as `with_prompt_length` fills it)."""
    sims, frames, start = {}, [], int(config.start_ms)
    for s in SPLITS:
        sims[s] = sim = log_split(m.take(split == s), s, rules, config, start)
        frames.append(deployment_ledger(sim, texts))
        start = int(pd.to_numeric(sim.ledger[L.TIMESTAMP]).max()) + 1_000
    return sims, pd.concat(frames, ignore_index=True)


def replay_table(replay: pd.DataFrame, train: ReceiptsSimulation, ca_sim: ReceiptsSimulation,
                 ca: OutcomeMatrix, texts: dict[str, str], seed: int) -> pd.DataFrame:
    """The offline replays as outcomes-v1 rows keyed by the logged opening's request id (the
    receipts-mode join): the train replays `router.replay.selection` chose, and every other
    candidate of every calibration opening (the calibration split is replayed in full)."""
    first = train.ledger[train.ledger[L.TURN_INDEX] == 0]
    opening = pd.Series(first[L.REQUEST_ID].astype(str).to_numpy(),
                        index=first[L.SESSION_ID].astype(str).to_numpy())
    task = train.ledger.drop_duplicates(O.PROMPT_ID).set_index(O.PROMPT_ID)[O.TASK]
    pid = replay[Label.PROMPT_ID].astype(str)
    rows = pd.DataFrame({
        O.VERSION: "1", O.PROMPT_ID: opening.reindex(replay[Label.SESSION_ID].astype(str)).to_numpy(),
        O.PROMPT_TEXT: pid.map(texts).fillna("").to_numpy(),
        O.TASK: pid.map(task).astype(str).to_numpy(),
        O.CANDIDATE: replay[Label.CANDIDATE].astype(str).to_numpy(),
        O.SCORE: replay[Label.REWARD].to_numpy(float),
        O.SUCCESS: replay[Label.REWARD].to_numpy(float) >= 0.5,
        O.COST: replay[Label.COST].to_numpy(float)})
    full = replay_outcomes(ca_sim, ca, texts, share=1.0, seed=seed)
    return pd.concat([rows, full], ignore_index=True)


def with_prompt_length(sim: ReceiptsSimulation, m: OutcomeMatrix) -> ReceiptsSimulation:
    """The simulated ledger with `prompt_tokens` filled where the table has none (RouteLLM,
    LLMRouter) by the prompt's length the matrix estimates from its text
    (`Label.PROMPT_LENGTH`): a deployment logs every call's prompt tokens, a benchmark
    table may not, and the head reads the logged value."""
    led = sim.ledger
    length = pd.Series(m.meta[Label.PROMPT_LENGTH].to_numpy(float), index=m.prompt_ids)
    fill = length.reindex(led[O.PROMPT_ID]).round().to_numpy()
    tokens = led[L.PROMPT_TOKENS]
    missing = tokens.isna().to_numpy() & np.isfinite(fill)
    if not missing.any():
        return sim
    tokens = tokens.copy()
    tokens[missing] = fill[missing].astype(np.int64)
    return dataclasses.replace(sim, ledger=led.assign(**{L.PROMPT_TOKENS: tokens}))


def logged_meta(sim: ReceiptsSimulation, m: OutcomeMatrix) -> dict[str, np.ndarray]:
    """The head's metadata of each prompt of `m` as its logged opening turn carries it
    (what the receipts pipeline reads, `receipts.finish_decisions`): the category (the
    task) and the opening call's prompt tokens (NaN where the table has none); a prompt
    opening several sessions: its first."""
    led = sim.ledger
    first = led[led[L.TURN_INDEX] == 0].drop_duplicates(O.PROMPT_ID).set_index(O.PROMPT_ID)
    first = first.reindex(m.prompt_ids)
    return {"category": first[O.TASK].astype(str).to_numpy(dtype=object),
            "prompt_tokens": pd.to_numeric(first[L.PROMPT_TOKENS], errors="coerce"
                                           ).to_numpy(float)}


def _lookup_encoder(texts: list[str], E: np.ndarray, embed: Callable[[list[str]], np.ndarray],
                    encoder_id: str) -> FunctionEncoder:
    """The run's embeddings as the receipts pipeline's encoder: a text embedded once is
    looked up (the same vector the encoder gave), any other text embedded by `embed`."""
    at = {t: i for i, t in enumerate(texts)}

    def fn(batch: list[str]) -> np.ndarray:
        idx = np.array([at.get(t, -1) for t in batch], dtype=np.int64)
        out = np.zeros((len(batch), E.shape[1]), dtype=np.float32)
        out[idx >= 0] = E[idx[idx >= 0]]
        miss = np.flatnonzero(idx < 0)
        if len(miss):
            out[miss] = np.asarray(embed([batch[i] for i in miss]), dtype=np.float32)
        return out

    return FunctionEncoder(fn, encoder_id, dimension=int(E.shape[1]))


SPREAD_KEYS = ("quality", "cost", "cost_ratio_at_95", "apgr")
SPREAD_WHAT = ("the chosen head refitted with each seed on the same rows and split; "
               "threshold chosen again on calibration; the same test prompts")


def train_router(outcomes: pd.DataFrame, cfg: RouterPipelineConfig, out_dir: Path,
                 embed: Callable[[list[str]], np.ndarray],
                 progress: Callable[[str], None] | None = None,
                 head_scorer: str = "onnx", engine: Any = None,
                 encoder_id: str = "outcomes") -> tuple[dict, RouterRun]:
    """Train, calibrate, test and gate the router from a full-information table (module
    docstring); write tables; return the summary and run.

    outcomes: an outcomes-v1 frame (every candidate scored on every prompt); embed: texts
    -> (n, d) float32 L2-normalized embeddings (the encoder the runtime uses); head_scorer:
    how the runtime scores the head, `onnx` (MiniLM tier) or `numpy` (static tier): every
    reported learned decision is made by it; engine: the compute engine the receipts
    pipeline runs on (default LocalEngine); encoder_id: the encoder's id. Raises
    RouterDataError when the table cannot train a router.
    """
    say = progress or (lambda _msg: None)
    out_dir.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    m = outcome_matrix(outcomes, cfg.cost, candidates=cfg.candidates)
    where = outcomes.attrs.get(SOURCE_ATTR) or "outcomes"
    if m.n_prompts < 50:
        raise RouterDataError(f"{where}: {m.n_prompts} prompts scored by every candidate "
                              f"{list(m.candidates)}: need >= 50")
    say(f"embedding {m.n_prompts} prompts")
    texts = _texts(outcomes, m.prompt_ids)
    E = np.asarray(embed(texts), dtype=np.float32)
    timings["embed"] = time.perf_counter() - t0
    split = seeded_split(m.n_prompts, cfg.split, cfg.seed)
    tr, ca, te = (m.take(split == s) for s in SPLITS)
    Etr, Eca, Ete = (E[split == s] for s in SPLITS)
    k = len(m.candidates)
    text_of = dict(zip(m.prompt_ids.astype(str), texts, strict=True))
    text_in = {s: [t for t, x in zip(texts, split, strict=True) if x == s] for s in SPLITS}

    # 1. what production would have logged; the replays the team would have run
    t0 = time.perf_counter()
    rules = ScenarioRules(cfg.rules).fit(tr)
    sims, ledger = log_receipts(m, split, rules, cfg.exploration, text_of)
    # the head's inputs are what the ledger logged (the receipts pipeline reads them there)
    mtr, mca, mte = (logged_meta(sims[s_], x) for s_, x in zip(SPLITS, (tr, ca, te), strict=True))
    bandit = bandit_rows(sims["train"].ledger)
    replay, replay_choice = _replays(cfg, bandit, rules, (Etr, mtr, tr), (Eca, mca, ca), k)
    say(f"replay selection: {replay_choice['chosen']} ({replay_choice['why']})")
    labels = training_labels(bandit, replay)
    rows = _rows(labels, tr, cfg.head.max_weight)
    rules_eq, tr_eq, rules_eq_info = _fit_rules_equal(cfg, rows, tr)
    baseline = cfg.go.baseline
    if baseline == "rules_equal" and rules_eq is None:
        raise RouterDataError(f"go.baseline=rules_equal: {rules_eq_info['note']} "
                              f"(replay.share={cfg.replay.share:g})")
    incumbent = rules_eq if baseline == "rules_equal" else rules
    incumbent_q_cal = float(ca.score[np.arange(ca.n_prompts), incumbent.predict_index(ca)].mean())
    replays = replay_table(replay, sims["train"], sims["calibration"], ca, text_of,
                           cfg.replay.seed)
    timings["labels"] = time.perf_counter() - t0

    # 2. the receipts pipeline on them (the split is the seeded one: shares of sessions)
    n_s = {s: int(sims[s].stats["sessions"]) for s in SPLITS}
    total = sum(n_s.values())
    rcfg = dataclasses.replace(
        cfg, spread_seeds=1,
        evaluation=dataclasses.replace(cfg.evaluation, attribution="off"),
        receipts=dataclasses.replace(cfg.receipts, calibration_share=n_s["calibration"] / total,
                                     test_share=n_s["test"] / total, embargo_ms=0))
    view = CalibrationView(incumbent=(baseline, incumbent_q_cal), observed=True)
    t0 = time.perf_counter()
    try:
        receipts, rrun = train_router_receipts(
            validate_ledger(ledger, source="simulated receipts"), replays, rcfg,
            out_dir / "receipts", _lookup_encoder(texts, E, embed, encoder_id),
            progress=say, head_scorer=head_scorer, engine=engine, view=view,
            waive_support=True)
    except ReceiptsError as e:
        raise RouterDataError(f"{where}: the receipts simulated from the table cannot train "
                              f"a router: {e}") from e
    timings["receipts"] = time.perf_counter() - t0
    fitted = rrun.fitted
    served = Served.of(fitted.point, fitted.fallback, fitted.rule)
    rule, fallback = served.rule, served.fallback
    cfg = dataclasses.replace(cfg, head=fitted.config,
                              policy=served_policy(cfg.objective, cfg.policy, incumbent_q_cal))

    # 3. what only full information adds: every router on the test truth
    t0 = time.perf_counter()
    say("full information: baselines and every router on the test truth")
    data = fitted.data
    fit_rows = fitted.rows_for(rcfg.head.max_weight)["train"]
    scorers: dict[str, Any] = {
        "learned": fitted.deployed,
        "knn": KnnRouter(n_neighbors=cfg.knn_neighbors).fit(
            data.E["train"], data.meta["train"], fit_rows, k),
        "lgbm": LgbmRouter(n_estimators=cfg.lgbm_estimators).fit(
            data.E["train"], data.meta["train"], fit_rows, k),
    }
    points = {"learned": served}
    for n in ("knn", "lgbm"):
        pt, fb, _ = operating_point(scorers[n], data, m.candidates, fitted.unit_cost, rule,
                                    cfg.evaluation.n_thresholds, cfg.objective, view)
        points[n] = Served.of(pt, fb, rule)
    prob_te = {n: s.predict_proba(Ete, mte) for n, s in scorers.items()}
    choice = {n: points[n].choose(prob_te[n]) for n in SCORED}
    rng = np.random.default_rng(cfg.seed)
    random = RandomRouter.matching(choice["learned"], k, seed=cfg.seed, strong=fallback)
    oracle = OracleRouter(cfg.policy.success_cutoff)
    choice.update({"rules": rules.predict_index(te), "random": random.choose(Ete),
                   "cheap_only": np.zeros(te.n_prompts, np.int64),
                   "strong_only": np.full(te.n_prompts, fallback, np.int64),
                   "oracle": oracle.choose(te.score, fallback=fallback)})
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
        test[n]["threshold"] = points[n].summary()
    weak, strong = anchors(te, ev, allow_same=True)
    gaps, gap_reps = cr95_gaps(te, curves, [("learned", "rules"), ("learned", "rules_equal")],
                               ev)
    timings["truth"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    spread = _spread(cfg, fitted, test["learned"], (Ete, mte, te), say)
    timings["spread"] = time.perf_counter() - t0
    say("the go/no-go gate on the test truth, and its learning curve")
    t0 = time.perf_counter()
    ope = _ope_beside_truth(receipts, rrun, sims["test"], te, choice["learned"])
    gate, curve = _gate(cfg, fitted, served, prob_te["learned"], te, (Ete, mte),
                        choice[baseline], incumbent_q_cal,
                        float(sims["train"].stats["exploration_share"]))
    timings["gate"] = time.perf_counter() - t0

    curve_rows, note = [], None
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
    decisions = _decisions(te, prob_te["learned"], served, rule)
    decisions.to_parquet(decisions_path, index=False)  # ids, scores, decisions: no text
    labels_path = out_dir / "router_labels.parquet"
    labels.to_parquet(labels_path, index=False)  # ids, labels, metadata: no text

    st = sims["train"].stats
    summary = {
        "pipeline": "router", "mode": "outcomes", "candidates": list(m.candidates),
        "prompts": int(m.n_prompts), "outcomes": m.report,
        "splits": {s: int((split == s).sum()) for s in SPLITS},
        "exploration": {"rate": float(cfg.exploration.rate),
                        "cap": float(cfg.exploration.cap),
                        "sessions": int(st["sessions"]),
                        "explored_sessions": int(st["exploration_sessions"]),
                        **{k2: v for k2, v in st.items()
                           if k2 not in ("sessions", "exploration_sessions")}},
        "labels": labels[Label.LABEL_SOURCE].value_counts().to_dict(),
        "replay": replay_choice,
        "rules": rules.describe(), "rules_equal": rules_eq_info, "go_baseline": baseline,
        "head": fitted.deployed.report(), "head_selection": fitted.selection,
        "spread": spread, "test": test, "test_gaps": gaps, "test_note": note, "ope": ope,
        **gate, "learning_curve": curve,
        "receipts": {"what": "the receipts pipeline (pipelines/router_receipts.py) on the "
                             "receipts simulated from the table and its replays: it fitted "
                             "the served head and chose its threshold on calibration",
                     "summary": str(out_dir / "receipts" / "summary.json"),
                     "splits": receipts["splits"], "replays": receipts["replays"],
                     "operating_point": receipts["operating_point"],
                     "labels": receipts["labels"], "verdict": receipts["verdict"],
                     "go_reason": receipts.get("go_reason")},
        "artifacts": {"curves": str(curves_path), "labels": str(labels_path),
                      "test_decisions": str(decisions_path),
                      "receipts": str(out_dir / "receipts")},
        "decision_stability": _stability(decisions),
        "timings_s": {k2: round(v, 3) for k2, v in timings.items()},
    }
    (out_dir / "receipts" / "summary.json").write_text(json.dumps(json_safe(receipts), indent=1))
    summary["served_threshold"] = float(served.threshold)
    summary["headline"] = served_headline(test, baseline, gate)
    summary = json_safe(summary)
    run = RouterRun(cfg, m.candidates, fitted.head, float(served.threshold), rules, summary,
                    rule=rule, fallback=int(fallback),
                    deployed=fitted.deployed if hasattr(fitted.deployed, "served_") else None,
                    golden_inputs=golden_inputs(text_in["test"], mte["category"],
                                                mte["prompt_tokens"]),
                    rules_equal=rules_eq, gap_replicates=gap_reps,
                    fit_prompts={s_: prompt_hashes(text_in[s_]) for s_ in ("train", "calibration")})
    return summary, run


def _spread(cfg: RouterPipelineConfig, fitted: FittedRouter, headline: dict, test: tuple,
            say: Callable[[str], None]) -> dict:
    """The learned router's test figures over head seeds (`router_fit.seed_spread`): the
    chosen head refitted with seeds seed + 1 .. seed + spread_seeds - 1 on the same rows
    and split (`FittedRouter.refit`: its threshold chosen again on calibration), scored on
    the same test prompts (`router.spread_seeds`)."""
    Ete, mte, te = test
    ev = dataclasses.replace(cfg.evaluation, n_boot=0)

    def row_of(seed: int) -> dict:
        dep, point, fb = fitted.refit(seed)
        prob = dep.predict_proba(Ete, mte)
        s = policy_summary(te, Served.of(point, fb, fitted.rule).choose(prob),
                           routing_scores(prob, fitted.rule), ev)
        return {"seed": seed, **{key: s[key] for key in SPREAD_KEYS},
                "threshold": float(point["threshold"])}

    first = {"seed": cfg.seed, **{key: headline[key] for key in SPREAD_KEYS},
             "threshold": headline["threshold"]["threshold"]}
    return seed_spread(first, cfg.seed, cfg.spread_seeds, row_of,
                       {key: (lambda r, key=key: r[key]) for key in SPREAD_KEYS}, SPREAD_WHAT,
                       say)


def _ope_beside_truth(receipts: dict, rrun: Any, sim: ReceiptsSimulation, te: OutcomeMatrix,
                      choice: np.ndarray) -> dict:
    """The receipts run's OPE of its test sessions (the rules with exploration logged them)
    beside the truth of the same decisions (`policy_truth`), and whether each interval
    covers it; the receipts gate's verdict as `ope_verdict` (what receipts alone say)."""
    ope = dict(receipts["ope"])
    row = sim.truth.prompt_row
    truth = policy_truth(sim, te, sim.truth.session_id, choice[row])
    # the learned policy's and the logging policy's true opening quality, and all figures
    ope["truth"], ope["logging_policy_truth"] = truth["quality"], truth["logging_quality"]
    ope["truth_figures"] = truth
    pairs = {"dr": ("dr", "quality"), "ips": ("ips", "quality"), "snips": ("snips", "quality"),
             "cost": ("cost", "cost")}

    ope["covers_truth"] = {n: covers(ope.get(key), truth[fig]) for n, (key, fig) in pairs.items()}
    ope["covers_truth"]["diff_quality"] = covers(ope.get("diff", {}).get("quality"),
                                                 truth["diff_quality"])
    ope["covers_truth"]["diff_cost"] = covers(ope.get("diff", {}).get("cost"), truth["diff_cost"])
    at = pd.Series(np.arange(len(sim.truth.session_id)), index=sim.truth.session_id.astype(str))
    pos = at.reindex(np.asarray(rrun.test_sessions, dtype=str)).to_numpy()
    ok = np.isfinite(pos.astype(float))
    agree = (np.asarray(rrun.test_choice)[ok] == choice[row[pos[ok].astype(np.int64)]])
    ope["served_agreement"] = {"sessions": int(ok.sum()),
                               "share": float(agree.mean()) if ok.any() else None,
                               "what": "the receipts run's test decisions (its served sample) "
                                       "equal to the ones judged on the truth"}
    ope["ope_verdict"] = {"verdict": receipts["verdict"], "reason": receipts.get("go_reason"),
                          "what": "the receipts-mode gate (router/gate.py ope_gate) on these "
                                  "test sessions, against the logging policy (the rules with "
                                  "exploration): what a gate from receipts alone would say"}
    return ope


def _gate(cfg: RouterPipelineConfig, fitted: FittedRouter, served: Served,
          prob_test: np.ndarray, te: OutcomeMatrix, test_inputs: tuple, base_te: np.ndarray,
          incumbent_q_cal: float, explored_share: float) -> tuple[dict, list[dict]]:
    """The verdict at the served threshold (`router.gate.outcomes_gate`), and the learning
    curve over explored sessions.

    The learned router is judged at exactly the operating point router.json ships
    (`served`: the receipts pipeline's choice on the fully replayed calibration split for
    `router.objective` against `go.baseline`), on the objective's own criteria
    (`router.gate.objective_criteria`) on the test truth. Each learning-curve point refits
    the chosen head on the train decisions without the explored sessions left out, its
    threshold chosen again on calibration, as it would be served. prob_test: the served
    head's test probabilities; base_te: the incumbent's (`go.baseline`) test choices,
    incumbent_q_cal its calibration quality."""
    Ete, mte = test_inputs
    g = cfg.go

    def compare(s: Served, prob_test: np.ndarray) -> dict:
        ch = s.choose(prob_test)
        crit, fig = objective_criteria(cfg.objective, g.baseline, g.n_boot, te, ch, base_te,
                                       int(s.fallback), cfg.seed)
        return {"threshold": float(s.threshold), "operating_point": s.goal,
                "objective_met_on_calibration": bool(s.point.get("met")),
                "learned_calibration_quality": float(s.point.get("dr_quality", np.nan)),
                **fig,
                "rules_cost": float(te.cost[np.arange(te.n_prompts), base_te].mean()),
                "learned_cost": float(te.cost[np.arange(te.n_prompts), ch].mean()),
                "_criteria": crit}

    main = compare(served, prob_test)
    train = fitted.data.decisions["train"]
    explored = (train[Label.LABEL_SOURCE] == "exploration").to_numpy()
    sessions = np.sort(train.loc[explored, Label.SESSION_ID].astype(str).unique())
    perm = np.random.default_rng(cfg.seed).permutation(sessions)
    curve = []
    for f in g.curve_fractions:
        keep = set(perm[: int(round(f * len(perm)))])
        h = main
        if f != 1.0:
            use = ~explored | train[Label.SESSION_ID].astype(str).isin(keep).to_numpy()
            dep, point, fb = dataclasses.replace(fitted, data=fitted.data.with_train(use)
                                                 ).refit(cfg.seed)
            h = compare(Served.of(point, fb, fitted.rule), dep.predict_proba(Ete, mte))
        n = len(keep)
        curve.append({"fraction": f, "explored_sessions": n,
                      "days_of_live_exploration": n / (float(cfg.exploration.rate)
                                                       * g.sessions_per_day),
                      "cost_saving": h["cost_saving"], "quality_delta": h["quality_delta"],
                      "significant": bool(all(c.passed() for c in h["_criteria"]))})
    gate = outcomes_gate(cfg.objective, g.baseline, main, main.pop("_criteria"), te.n_prompts,
                         g.sessions_per_day, explored_share, float(cfg.exploration.cap),
                         float(cfg.split[2]), served.rule, curve,
                         {"rules_calibration_quality": incumbent_q_cal})
    return gate, curve


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

