"""Planned replays (issue 46): the plan's top within the share, coverage strata, no leakage
of the outcomes a replay is about to reveal, seeded determinism, and `auto`'s choice.

Tiny seeded tables: prompts in 6 clusters of a 12-d embedding; the cheap candidate
succeeds with a cluster-dependent rate, the strong one mostly; a kNN scorer fitted on the
receipts alone (logged + explored openings, never a replay) stands in for the round-0 head.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from replaylab.contracts.columns import Outcomes as O
from replaylab.router.baselines import KnnRouter
from replaylab.router.config import RouterExplorationConfig, RouterReplayConfig
from replaylab.router.exploration import bandit_rows, simulate_receipts
from replaylab.router.inputs import TrainingRows, ips_weights
from replaylab.router.replay import (
    Label,
    OutcomeMatrix,
    choose_replays,
    logged_openings,
    planned_prompts,
    random_prompts,
    replay_labels,
)
from replaylab.router.replay_plan import (
    coverage_strata,
    expected_gain,
    pair_priority,
    plan_prompts,
    replay_plan,
)
from replaylab.router.rules import ScenarioRules
from replaylab.runtime.routing import routing_scores
from tests.helpers.router import replay_world as world  # candidates CANDS

CANDS = ("cheap", "strong")
RULE = "margin"



def receipts(m: OutcomeMatrix, seed: int = 0) -> pd.DataFrame:
    rules = ScenarioRules().fit(m)
    sim = simulate_receipts(m, rules, RouterExplorationConfig(rate=0.1, seed=seed))
    return bandit_rows(sim.ledger)


def round0_prob(bandit: pd.DataFrame, m: OutcomeMatrix, emb: np.ndarray) -> np.ndarray:
    """P(success) of a scorer fitted on the receipts' opening decisions only."""
    dec = bandit[bandit[Label.POLICY_DECISION].astype(bool)]
    row_of = pd.Series(np.arange(m.n_prompts), index=m.prompt_ids)
    col = {c: k for k, c in enumerate(m.candidates)}
    rows = TrainingRows(row=row_of.reindex(dec[Label.PROMPT_ID]).to_numpy(np.int64),
                        action=dec[Label.CANDIDATE].map(col).to_numpy(np.int64),
                        reward=dec[Label.REWARD].to_numpy(float),
                        weight=ips_weights(dec[Label.PROPENSITY].to_numpy(float), 20.0))
    return KnnRouter(n_neighbors=15).fit(emb, None, rows, len(CANDS)).predict_proba(emb)


@pytest.fixture(scope="module")
def setup():
    m, emb = world()
    bandit = receipts(m)
    return m, emb, bandit, round0_prob(bandit, m, emb)


def test_one_stratum_takes_exactly_the_top_of_the_plan():
    rng = np.random.default_rng(3)
    value = rng.random(200)
    picked = plan_prompts(value, 50)
    assert len(picked) == 50
    assert set(picked) == set(np.argsort(-value)[:50])
    assert np.all(np.diff(value[picked]) <= 0)  # ranked, best first
    assert len(plan_prompts(value, 0)) == 0 and len(plan_prompts(value, 500)) == 200


def test_strata_get_their_share_and_spend_it_on_their_top():
    rng = np.random.default_rng(4)
    value = rng.random(300)
    strata = np.repeat([0, 1, 2], [150, 100, 50])
    value[strata == 0] += 10.0  # one stratum would take everything without coverage
    picked = plan_prompts(value, 60, strata)
    assert np.bincount(strata[picked], minlength=3).tolist() == [30, 20, 10]
    for s, n in ((0, 30), (1, 20), (2, 10)):
        rows = np.flatnonzero(strata == s)
        assert set(picked[strata[picked] == s]) == set(rows[np.argsort(-value[rows])[:n]])


def test_planned_selection_is_the_plan_within_the_share_and_deterministic(setup):
    m, emb, bandit, prob = setup
    prompts, rows, seen = logged_openings(bandit, m)
    pids, report = planned_prompts(bandit, m, prob, 0.1, RULE, 0.25, seed=7)
    assert len(pids) == round(0.25 * len(prompts)) and len(set(pids)) == len(pids)
    assert set(pids) <= set(prompts)
    again, _ = planned_prompts(bandit, m, prob, 0.1, RULE, 0.25, seed=7)
    assert list(again) == list(pids)
    # without coverage strata beyond the two categories, each category's picks are its top
    pair, _ = pair_priority(prob[rows], 0.1, RULE)
    value = pd.Series(np.where(seen, 0.0, pair).sum(axis=1), index=prompts)
    task = pd.Series(m.meta[O.TASK].to_numpy()[rows], index=prompts)
    for t in ("math", "chat"):
        mine = task.index[task == t]
        got = [p for p in pids if task[p] == t]
        top = value[mine].sort_values(ascending=False).index[:len(got)]
        assert value[got].min() >= value[top].min() - 1e-12
    # the plan prefers what it values: its picks carry more plan value than a random draw
    rand = random_prompts(prompts, 0.25, seed=7)
    assert value[pids].mean() > value[rand].mean()
    assert report["mean_value_picked"] > report["mean_value_all"]


def test_the_ranking_never_reads_the_outcomes_it_is_about_to_reveal(setup):
    """Permuting the hidden (unlogged) outcomes of every prompt leaves the plan unchanged:
    what it ranks with (receipts, round-0 scorer, categories, embeddings) does not move."""
    m, emb, bandit, _ = setup
    prompts, rows, seen = logged_openings(bandit, m)
    rng = np.random.default_rng(11)
    score, success = m.score.copy(), m.success.copy()
    full_hidden = np.zeros(m.score.shape, bool)
    full_hidden[rows] = ~seen  # the outcomes no receipt observed
    idx = np.flatnonzero(full_hidden.ravel())
    perm = rng.permutation(idx)
    score.ravel()[idx] = 1.0 - m.score.ravel()[perm]  # permuted and flipped: surely different
    success.ravel()[idx] = ~m.success.ravel()[perm]
    m2 = OutcomeMatrix(m.candidates, m.meta, score, success, m.cost, m.prompt_tokens,
                       m.completion_tokens, m.report)
    assert (m2.score != m.score).any()
    prob = round0_prob(bandit, m, emb)
    prob2 = round0_prob(bandit, m2, emb)  # the round-0 scorer sees receipts only
    np.testing.assert_array_equal(prob, prob2)
    a, _ = planned_prompts(bandit, m, prob, 0.1, RULE, 0.25, seed=0, embedding=emb)
    b, _ = planned_prompts(bandit, m2, prob2, 0.1, RULE, 0.25, seed=0, embedding=emb)
    assert list(a) == list(b)
    # ...while the replayed labels do reveal them (the test can fail)
    ra = replay_labels(bandit, m, picked=a)
    rb = replay_labels(bandit, m2, picked=b)
    assert not np.array_equal(ra[Label.REWARD].to_numpy(), rb[Label.REWARD].to_numpy())


def test_coverage_strata_split_each_category_by_embedding_cell(setup):
    m, emb, _, _ = setup
    task = m.meta[O.TASK].to_numpy()
    strata = coverage_strata(emb, task, seed=0)
    assert len(np.unique(strata)) > 2
    for s in np.unique(strata):
        assert len(set(task[strata == s])) == 1  # a stratum never mixes categories
    np.testing.assert_array_equal(strata, coverage_strata(emb, task, seed=0))


def test_choose_replays_reports_the_selection_and_auto_keeps_the_cheaper(setup):
    m, emb, bandit, prob = setup
    calls = []

    def plan():
        calls.append("plan")
        return prob, 0.1, RULE

    def judge_for(better: str):
        def judge(rep: pd.DataFrame) -> float:
            is_planned = set(rep[Label.PROMPT_ID]) == set(planned)
            return 0.4 if (is_planned == (better == "planned")) else 0.6
        return judge

    planned, _ = planned_prompts(bandit, m, prob, 0.1, RULE, 0.25, seed=0, embedding=emb)
    base = RouterReplayConfig(share=0.25, seed=0)
    rand, rep = choose_replays(bandit, m, RouterReplayConfig(share=0.25, selection="random"),
                               plan, judge_for("planned"), embedding=emb)
    assert rep["chosen"] == "random" and not calls
    pd.testing.assert_frame_equal(rand, replay_labels(bandit, m, base))
    out, rep = choose_replays(bandit, m, RouterReplayConfig(share=0.25, selection="planned"),
                              plan, judge_for("random"), embedding=emb)
    assert rep["chosen"] == "planned" and set(out[Label.PROMPT_ID]) == set(planned)
    assert rep["replayed_prompts"] == len(planned)
    for better in ("planned", "random"):
        out, rep = choose_replays(bandit, m, base, plan, judge_for(better), embedding=emb)
        assert rep["selection"] == "auto" and rep["chosen"] == better
        assert better in rep["why"] and set(rep["calibration_cost_ratio"]) == {"planned", "random"}
    with pytest.raises(ValueError, match="selection"):
        RouterReplayConfig(selection="greedy")


def test_planned_replays_sit_nearer_the_routing_boundary_than_random(setup):
    """The statistic the plan is for: the replayed prompts' round-0 routing scores are
    closer to the threshold than a random share's (mean over 5 seeds of the receipts)."""
    gaps = {"planned": [], "random": []}
    for seed in range(5):
        m, emb = world(seed=seed)
        bandit = receipts(m, seed)
        prob = round0_prob(bandit, m, emb)
        prompts, rows, _ = logged_openings(bandit, m)
        t = float(np.median(routing_scores(prob, RULE)[:, 0]))
        gap = pd.Series(np.abs(routing_scores(prob[rows], RULE)[:, 0] - t), index=prompts)
        pids, _ = planned_prompts(bandit, m, prob, t, RULE, 0.25, seed=seed, embedding=emb)
        gaps["planned"].append(gap[pids].mean())
        gaps["random"].append(gap[random_prompts(prompts, 0.25, seed)].mean())
    assert np.mean(gaps["planned"]) < 0.7 * np.mean(gaps["random"])


def test_expected_gain_is_the_value_of_the_revealed_outcome_to_the_decision():
    """Absolute rule: t (1 - p) above the threshold, p (1 - t) below it; never negative;
    largest at the threshold; the plan carries it per row (the next round's gain)."""
    p = np.array([[0.1, 0.9], [0.5, 0.95], [0.7, 0.99], [0.95, 0.99]])
    t = 0.6
    g = expected_gain(p, t, "absolute")
    want = np.where(p >= t, t * (1 - p), p * (1 - t))
    np.testing.assert_allclose(g, want, atol=1e-12)
    rng = np.random.default_rng(5)
    q = rng.random((300, 3))
    for rule in ("absolute", "margin"):
        assert (expected_gain(q, 0.05, rule) >= 0).all()
    near = expected_gain(np.array([[0.6, 0.9]]), t, "absolute")[0, 0]
    far = expected_gain(np.array([[0.05, 0.9], [0.99, 0.9]]), t, "absolute")[:, 0]
    assert (near > far).all()
    meta = pd.DataFrame({"prompt_id": ["a", "b", "c", "d"], "session_id": list("abcd"),
                         "opening_ms": [1, 2, 3, 4]})
    plan = replay_plan(p, np.array([1, 1, 1, 1]), t, "absolute", meta, CANDS, budget=4)
    assert list(plan["candidate"].unique()) == ["cheap"]
    np.testing.assert_allclose(plan["expected_gain"],
                               want[meta.set_index("prompt_id").index.get_indexer(
                                   plan["prompt_id"]), 0])
