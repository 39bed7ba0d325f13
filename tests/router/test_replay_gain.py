"""`router.replay.selection=planned_gain` (issue 46's ranking variant): the planned share
ranked by the expected gain of each replay to the routing decision
(`replay_plan.expected_gain`) instead of the plan's priority p (1 - p) exp(-|q - t| / 0.1).

Tiny seeded world as tests/router/test_replay_selection.py: 6 clusters of a 12-d embedding,
a cheap candidate whose success rate depends on the cluster, a strong one that mostly
succeeds, receipts from the rules with 10% exploration, a kNN scorer fitted on the receipts
alone standing in for the round-0 head.
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
    choose_replays,
    logged_openings,
    planned_prompts,
)
from replaylab.router.replay_plan import expected_gain, pair_priority
from replaylab.router.rules import ScenarioRules
from tests.helpers.router import replay_world as world  # candidates CANDS

CANDS = ("cheap", "strong")
RULE = "margin"
THRESHOLD = 0.1



@pytest.fixture(scope="module")
def setup():
    m, emb = world()
    sim = simulate_receipts(m, ScenarioRules().fit(m), RouterExplorationConfig(rate=0.1, seed=0))
    bandit = bandit_rows(sim.ledger)
    dec = bandit[bandit[Label.POLICY_DECISION].astype(bool)]
    row_of = pd.Series(np.arange(m.n_prompts), index=m.prompt_ids)
    col = {c: k for k, c in enumerate(m.candidates)}
    rows = TrainingRows(row=row_of.reindex(dec[Label.PROMPT_ID]).to_numpy(np.int64),
                        action=dec[Label.CANDIDATE].map(col).to_numpy(np.int64),
                        reward=dec[Label.REWARD].to_numpy(float),
                        weight=ips_weights(dec[Label.PROPENSITY].to_numpy(float), 20.0))
    prob = KnnRouter(n_neighbors=15).fit(emb, None, rows, len(CANDS)).predict_proba(emb)
    return m, emb, bandit, prob


def values(bandit, m, prob) -> tuple[pd.Series, pd.Series, pd.Series]:
    """Per logged opening prompt: its expected gain and its priority, summed over the
    candidates its receipts did not observe, and its category."""
    prompts, rows, seen = logged_openings(bandit, m)
    gain = np.where(seen, 0.0, expected_gain(prob[rows], THRESHOLD, RULE)).sum(axis=1)
    prio = np.where(seen, 0.0, pair_priority(prob[rows], THRESHOLD, RULE)[0]).sum(axis=1)
    task = m.meta[O.TASK].to_numpy()[rows]
    return (pd.Series(gain, index=prompts), pd.Series(prio, index=prompts),
            pd.Series(task, index=prompts))


def test_gain_criterion_takes_each_categorys_top_expected_gain(setup):
    m, _, bandit, prob = setup
    gain, prio, task = values(bandit, m, prob)
    pids, report = planned_prompts(bandit, m, prob, THRESHOLD, RULE, 0.25, seed=3,
                                   criterion="expected_gain")
    assert len(pids) == round(0.25 * len(gain)) and len(set(pids)) == len(pids)
    assert report["criterion"] == "expected_gain"
    for t in ("math", "chat"):  # embedding None: the strata are the categories
        got = [p for p in pids if task[p] == t]
        rest = gain[(task == t) & ~gain.index.isin(got)]
        assert gain[got].min() >= rest.max() - 1e-12  # nothing left out beats a pick
    np.testing.assert_allclose(report["mean_value_picked"], gain[pids].mean())
    # the picks differ from the priority's (the two criteria rank differently here)...
    by_prio, rep_p = planned_prompts(bandit, m, prob, THRESHOLD, RULE, 0.25, seed=3)
    assert rep_p["criterion"] == "priority" and set(pids) != set(by_prio)
    # ...and each criterion's picks carry more of its own value than the other's picks
    assert gain[pids].sum() > gain[by_prio].sum()
    assert prio[by_prio].sum() > prio[pids].sum()


def test_expected_gain_is_broader_than_the_priority_around_the_threshold():
    """The reason to try it: p (1 - p) exp(-gap / 0.1) has fallen to ~5% of its peak 0.3
    from the threshold, the expected gain (a tent) keeps about half, so its picks are less
    concentrated on the round-0 head's boundary."""
    p = np.array([[0.5, 0.5], [0.8, 0.5], [0.65, 0.5]])  # margin 0, 0.3, 0.15 from t = 0
    gain, prio = expected_gain(p, 0.0, RULE)[:, 0], pair_priority(p, 0.0, RULE)[0][:, 0]
    assert prio[1] / prio[0] < 0.06
    assert gain[1] / gain[0] > 0.3
    assert gain[0] > gain[2] > gain[1] > 0 and prio[0] > prio[2] > prio[1] > 0


def test_choose_replays_runs_planned_gain_and_reports_it(setup):
    m, emb, bandit, prob = setup
    calls: list[str] = []

    def plan():
        calls.append("plan")
        return prob, THRESHOLD, RULE

    def judge(rep: pd.DataFrame) -> float:
        raise AssertionError("planned_gain is chosen by config, never judged")

    want, _ = planned_prompts(bandit, m, prob, THRESHOLD, RULE, 0.25, seed=0, embedding=emb,
                              criterion="expected_gain")
    cfg = RouterReplayConfig(share=0.25, seed=0, selection="planned_gain")
    out, rep = choose_replays(bandit, m, cfg, plan, judge, embedding=emb)
    assert calls == ["plan"]
    assert rep["chosen"] == "planned_gain" and rep["why"] == "router.replay.selection=planned_gain"
    assert rep["plan"]["criterion"] == "expected_gain"
    assert set(out[Label.PROMPT_ID]) == set(want) and rep["replayed_prompts"] == len(want)
    assert (out[Label.LABEL_SOURCE] == "replay").all()
    # `planned` still ranks by the priority
    _, rep = choose_replays(bandit, m, RouterReplayConfig(share=0.25, selection="planned"),
                            plan, judge, embedding=emb)
    assert rep["plan"]["criterion"] == "priority"


def test_an_unknown_criterion_is_refused(setup):
    m, _, bandit, prob = setup
    with pytest.raises(ValueError, match="criterion"):
        planned_prompts(bandit, m, prob, THRESHOLD, RULE, 0.25, seed=0, criterion="greedy")
