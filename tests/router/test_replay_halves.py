"""`router.replay.selection=planned_halves` (issue 46's third ranking variant): replay the
top of the round-0 plan at share/2, refit the round-0 head on the receipts plus those
replays, and plan the other share/2 among the prompts not yet replayed.

Tiny seeded world as tests/router/test_replay_gain.py: 6 clusters of a 12-d embedding, a
cheap candidate whose success rate depends on the cluster, a strong one that mostly
succeeds, receipts from the rules with 10% exploration. A kNN scorer stands in for the
round-0 head: fitted on the receipts alone (`plan`), then on the receipts plus the replay
rows it is handed (`replan`), so it can read no outcome it was not given.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from replaylab.router.baselines import KnnRouter
from replaylab.router.config import RouterExplorationConfig, RouterReplayConfig
from replaylab.router.exploration import bandit_rows, simulate_receipts
from replaylab.router.inputs import TrainingRows, ips_weights
from replaylab.router.replay import (
    Label,
    OutcomeMatrix,
    choose_replays,
    logged_openings,
    planned_halves,
    planned_prompts,
    training_labels,
)
from replaylab.router.rules import ScenarioRules
from tests.helpers.router import replay_world as world  # candidates CANDS

CANDS = ("cheap", "strong")
RULE = "margin"
THRESHOLD = 0.1
SHARE = 0.25



def knn_prob(labels: pd.DataFrame, m: OutcomeMatrix, emb: np.ndarray) -> np.ndarray:
    """(n, K) P(success) of a kNN fitted on the logged decisions (IPS weights) and the
    replay rows (weight 1) of `labels`: only the outcomes the labels hold."""
    use = labels[labels[Label.POLICY_DECISION].astype(bool)
                 | (labels[Label.LABEL_SOURCE] == "replay")]
    row_of = pd.Series(np.arange(m.n_prompts), index=m.prompt_ids)
    col = {c: k for k, c in enumerate(m.candidates)}
    prop = use[Label.PROPENSITY].to_numpy(float)
    weight = np.where(np.isnan(prop), 1.0, ips_weights(np.nan_to_num(prop, nan=1.0), 20.0))
    rows = TrainingRows(row=row_of.reindex(use[Label.PROMPT_ID]).to_numpy(np.int64),
                        action=use[Label.CANDIDATE].map(col).to_numpy(np.int64),
                        reward=use[Label.REWARD].to_numpy(float), weight=weight)
    return KnnRouter(n_neighbors=15).fit(emb, None, rows, len(CANDS)).predict_proba(emb)


def heads(bandit: pd.DataFrame, m: OutcomeMatrix, emb: np.ndarray, calls: list | None = None):
    def plan():
        if calls is not None:
            calls.append("plan")
        return knn_prob(training_labels(bandit), m, emb), THRESHOLD, RULE

    def replan(replay: pd.DataFrame):
        if calls is not None:
            calls.append(("replan", frozenset(replay[Label.PROMPT_ID])))
        # the threshold moves with the refit, as the pipeline's recomputed one does
        return knn_prob(training_labels(bandit, replay), m, emb), THRESHOLD + 0.05, RULE

    return plan, replan


@pytest.fixture(scope="module")
def setup():
    m, emb = world()
    sim = simulate_receipts(m, ScenarioRules().fit(m), RouterExplorationConfig(rate=0.1, seed=0))
    return m, emb, bandit_rows(sim.ledger)


def halves(bandit, m, emb, seed: int = 0):
    plan, replan = heads(bandit, m, emb)
    cfg = RouterReplayConfig(share=SHARE, seed=seed, selection="planned_halves")
    out, rep = planned_halves(bandit, m, cfg, plan, replan, embedding=emb)
    return out, rep, np.array(rep["first_half"]), np.array(rep["second_half"])


def perturbed(m: OutcomeMatrix, bandit: pd.DataFrame, keep: np.ndarray,
              seed: int) -> OutcomeMatrix:
    """`m` with every outcome flipped that the receipts did not observe, except on the
    prompts in `keep`: the outcomes a selection must not have read."""
    prompts, rows, seen = logged_openings(bandit, m)
    flip = ~seen & ~np.isin(prompts, keep)[:, None]
    flip &= np.random.default_rng(seed).random(flip.shape) < 0.7
    score, success = m.score.copy(), m.success.copy()
    score[rows] = np.where(flip, 1.0 - score[rows], score[rows])
    success[rows] = np.where(flip, ~success[rows], success[rows])
    assert flip.sum() > 50  # a real perturbation
    return OutcomeMatrix(m.candidates, m.meta, score, success, m.cost, m.prompt_tokens,
                         m.completion_tokens, m.report)


def test_halves_total_and_first_half_is_planned_at_half_the_share(setup):
    m, emb, bandit = setup
    prompts = logged_openings(bandit, m)[0]
    out, rep, first, second = halves(bandit, m, emb)
    total = round(SHARE * len(prompts))
    assert len(first) + len(second) == total
    assert len(first) == round(SHARE / 2 * len(prompts))
    assert set(out[Label.PROMPT_ID]) == set(first) | set(second)
    # the first half is exactly `planned` at share/2 on the round-0 head
    plan, _ = heads(bandit, m, emb)
    prob, t, rule = plan()
    want, _ = planned_prompts(bandit, m, prob, t, rule, SHARE / 2, 0, emb)
    assert set(first) == set(want)
    # the second half excludes the first and has no repeats
    assert not set(first) & set(second) and len(set(second)) == len(second)
    h1, h2 = rep["halves"]
    assert (h1["picked"], h2["picked"]) == (len(first), len(second))
    assert h1["threshold"] == THRESHOLD and h2["threshold"] == THRESHOLD + 0.05
    assert h1["plan_value_picked"] > 0 and h2["plan_value_picked"] > 0


def test_the_refit_changes_the_second_half(setup):
    """The refreshed plan is not the rest of the round-0 plan: the second half differs from
    what `planned` at the full share adds beyond its share/2 picks."""
    m, emb, bandit = setup
    _, _, first, second = halves(bandit, m, emb)
    plan, _ = heads(bandit, m, emb)
    full, _ = planned_prompts(bandit, m, *plan(), SHARE, 0, emb)
    assert set(second) != set(full) - set(first)


def test_unrevealed_outcomes_cannot_change_the_first_half(setup):
    m, emb, bandit = setup
    _, _, first, second = halves(bandit, m, emb)
    m2 = perturbed(m, bandit, keep=np.array([]), seed=1)  # every unobserved outcome
    _, _, first2, _ = halves(bandit, m2, emb)
    assert set(first2) == set(first)


def test_the_second_half_reads_only_the_first_halfs_revealed_outcomes(setup):
    m, emb, bandit = setup
    out, _, first, second = halves(bandit, m, emb)
    # outcomes of prompts never replayed: the whole pick is unchanged
    m2 = perturbed(m, bandit, keep=np.concatenate([first, second]), seed=2)
    out2, _, first2, second2 = halves(bandit, m2, emb)
    assert list(first2) == list(first) and list(second2) == list(second)
    pd.testing.assert_frame_equal(out.reset_index(drop=True), out2.reset_index(drop=True))
    # the first half's revealed outcomes do feed the second half
    m3 = perturbed(m, bandit, keep=second, seed=3)
    _, _, first3, second3 = halves(bandit, m3, emb)
    assert set(first3) == set(first) and set(second3) != set(second)


def test_choose_replays_runs_planned_halves_and_reports_both_halves(setup):
    m, emb, bandit = setup
    calls: list = []
    plan, replan = heads(bandit, m, emb, calls)

    def judge(rep: pd.DataFrame) -> float:
        raise AssertionError("planned_halves is chosen by config, never judged")

    cfg = RouterReplayConfig(share=SHARE, seed=0, selection="planned_halves")
    out, rep = choose_replays(bandit, m, cfg, plan, judge, embedding=emb, replan=replan)
    _, _, first, second = halves(bandit, m, emb)
    assert calls == ["plan", ("replan", frozenset(first))]  # replan sees the first half only
    assert rep["chosen"] == "planned_halves"
    assert rep["why"].startswith("router.replay.selection=planned_halves: first half")
    assert [h["picked"] for h in rep["halves"]] == [len(first), len(second)]
    assert rep["replayed_prompts"] == len(first) + len(second)
    assert set(out[Label.PROMPT_ID]) == set(first) | set(second)
    assert (out[Label.LABEL_SOURCE] == "replay").all()
    with pytest.raises(ValueError, match="replan"):
        choose_replays(bandit, m, cfg, plan, judge, embedding=emb)
