"""What both router modes share: the golden inputs, the seed spread, the outcomes gate.

Each is written once (`pipelines/router_run.py`, `pipelines/router_fit.py`,
`router/gate.py`) and called by the outcomes and the receipts pipeline; these tests pin
the behaviour both modes rely on, on tiny hand-made inputs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from replaylab.pipelines.router_fit import seed_spread
from replaylab.pipelines.router_run import GOLDEN_QUERIES, golden_inputs
from replaylab.router.gate import Criterion, objective_criteria, outcomes_gate
from replaylab.router.objective import ObjectiveConfig
from replaylab.verdict import GO, NO_GO


def test_golden_inputs_are_spread_over_the_prompts_with_text():
    """Up to GOLDEN_QUERIES prompts with text, first and last included, evenly spaced;
    prompts without text (a ledger embedding) are skipped; missing metadata is None; the
    two edge cases close the list."""
    n = 40
    texts = [None if i % 4 == 1 else f"prompt {i}" for i in range(n)]
    category = np.array([None if i % 5 == 0 else f"c{i % 3}" for i in range(n)], dtype=object)
    tokens = np.where(np.arange(n) % 7 == 0, np.nan, np.arange(n, dtype=float))
    got = golden_inputs(texts, category, tokens)
    queries, edges = got[:-2], got[-2:]
    have = [i for i, t in enumerate(texts) if t is not None]
    assert len(queries) == GOLDEN_QUERIES
    picked = [int(q["text"].split()[1]) for q in queries]
    assert picked[0] == have[0] and picked[-1] == have[-1] and picked == sorted(set(picked))
    for q, i in zip(queries, picked, strict=True):
        assert q["category"] == (None if i % 5 == 0 else f"c{i % 3}")
        assert q["prompt_tokens"] == (None if i % 7 == 0 else float(i))
    assert edges[0] == {"text": "", "category": None, "prompt_tokens": None}
    assert edges[1]["text"] and edges[1]["category"] is None
    few = golden_inputs(["a", None, "b"], ["x", "y", "z"], [1.0, 2.0, 3.0])
    assert [q["text"] for q in few[:-2]] == ["a", "b"]
    assert golden_inputs([None, None], [None, None], [1.0, 2.0])[:-2] == []


def test_seed_spread_refits_each_further_seed_and_summarizes_finite_values():
    """seed_spread calls row_of for seed+1 .. seed+n-1 (saying each), keeps the served
    row first, and summarizes each figure over the finite values; verdict lists appear
    only when every row has a verdict."""
    said: list[str] = []
    rows = {7: 0.5, 8: float("nan"), 9: 0.8}
    out = seed_spread({"seed": 6, "q": 0.2}, 6, 4,
                      lambda s: {"seed": s, "q": rows[s]}, {"q": lambda r: r["q"]},
                      "what", said.append)
    assert out["seeds"] == [6, 7, 8, 9] and len(said) == 3 and "head seed 9" in said[-1]
    q = out["q"]
    assert q["min"] == 0.2 and q["max"] == 0.8 and math.isclose(q["mean"], 0.5)
    assert math.isnan(q["values"][2]) and "verdict" not in out
    judged = seed_spread({"seed": 0, "q": 1.0, "go": True, "verdict": GO}, 0, 2,
                         lambda s: {"seed": s, "q": 0.0, "go": False, "verdict": NO_GO},
                         {"q": lambda r: r["q"]}, "what", lambda _m: None)
    assert judged["go"] == [True, False] and judged["verdict"] == [GO, NO_GO]
    assert seed_spread({"seed": 3, "q": 1.0}, 3, 1, None, {"q": lambda r: r["q"]}, "w",
                       lambda _m: None)["seeds"] == [3]


class _Table:
    """A fully replayed test table: (n, K) score and cost."""

    def __init__(self, score: np.ndarray, cost: np.ndarray) -> None:
        self.score, self.cost, self.n_prompts = score, cost, len(score)


@pytest.mark.parametrize("cheaper", [True, False])
def test_outcomes_gate_on_a_full_information_table(cheaper):
    """A router as good as the incumbent and cheaper on every prompt is GO; one that is
    dearer on every prompt is NO-GO with its cost criterion wholly on the failing side.
    The learning curve's first budget from which every larger one is significant is the
    sessions needed."""
    rng = np.random.default_rng(0)
    n = 400
    score = np.stack([rng.uniform(0.6, 1.0, n), rng.uniform(0.6, 1.0, n)], axis=1)
    cost = np.stack([np.full(n, 1.0), np.full(n, 3.0)], axis=1)
    score[:, 0] = score[:, 1]  # the cheap candidate is as good on every prompt
    te = _Table(score, cost)
    served = np.zeros(n, np.int64) if cheaper else np.ones(n, np.int64)
    incumbent = np.ones(n, np.int64) if cheaper else np.zeros(n, np.int64)
    obj = ObjectiveConfig()
    crit, fig = objective_criteria(obj, "rules", 200, te, served, incumbent, 1, seed=0)
    assert all(isinstance(c, Criterion) for c in crit)
    assert fig["cost_saving"]["mean"] == (2.0 if cheaper else -2.0)
    curve = [{"explored_sessions": 10, "days_of_live_exploration": 1.0, "significant": False},
             {"explored_sessions": 20, "days_of_live_exploration": 2.0, "significant": True},
             {"explored_sessions": 40, "days_of_live_exploration": 4.0, "significant": True}]
    point = {"threshold": 0.5, "operating_point": "goal"}
    g = outcomes_gate(obj, "rules", point, crit, n, 1000.0, 0.05, 0.1, 0.2, "margin", curve,
                      {"rules_calibration_quality": 0.9})
    assert g["verdict"] == (GO if cheaper else NO_GO) and g["go"] is cheaper
    d = g["go_detail"]
    assert d["explored_sessions_needed"] == 20 and d["days_needed"] == 2.0
    assert d["rules_calibration_quality"] == 0.9 and d["exploration_within_cap"] is True
    assert "served threshold 0.5 (margin rule" in d["served"]
    over = outcomes_gate(obj, "rules", point, crit, n, 1000.0, 0.2, 0.1, 0.2, "margin", curve)
    assert over["verdict"] == NO_GO and "above the cap" in over["go_reasons"][0]


def _calibration_data(n: int = 60, k: int = 3, replay_every: int = 1, seed: int = 3):
    """FitData with `n` calibration decisions over k candidates (random logged action,
    propensity, reward, cost) and a full outcome table; every `replay_every`-th opening is
    replayed against every candidate it did not log (1: all of them)."""
    import pandas as pd

    from replaylab.pipelines.router_fit import FitData
    from replaylab.router.receipts import OPENING_REQUEST
    from replaylab.router.replay import Label

    rng = np.random.default_rng(seed)
    table, cost = rng.random((n, k)), rng.random((n, k)) / 100
    action = rng.integers(0, k, n)
    d = pd.DataFrame({Label.SESSION_ID: [f"s{i}" for i in range(n)],
                      OPENING_REQUEST: [f"s{i}/t0" for i in range(n)],
                      "action": action, Label.REWARD: table[np.arange(n), action],
                      Label.COST: cost[np.arange(n), action],
                      Label.PROPENSITY: rng.uniform(0.05, 0.95, n),
                      "category": "c", "prompt_tokens": 10.0},
                     index=pd.RangeIndex(100, 100 + n))
    reps = [{"row": 100 + i, "action": a, Label.REWARD: table[i, a], Label.COST: cost[i, a],
             "split": "calibration"}
            for i in range(0, n, replay_every) for a in range(k) if a != action[i]]
    data = FitData({"train": d.iloc[:0], "calibration": d}, {"calibration": np.zeros((n, 2))},
                   pd.DataFrame(reps))
    return data, table, cost, action


def test_a_fully_replayed_calibration_split_is_read_at_its_observed_values():
    """`observed_values` on a calibration split replayed in full: the DR models are the
    observed table, so DR of any policy is its full-information value, whatever the
    head's probabilities and the propensities."""
    from replaylab.pipelines.router_fit import observed_values
    from replaylab.router.ope import LoggedDecisions, point_values
    from replaylab.router.replay import Label

    data, table, cost, _ = _calibration_data()
    n, k = table.shape
    prob = np.random.default_rng(0).random((n, k))
    q, c = observed_values(data, "calibration", prob, np.full(k, 0.5))
    assert np.array_equal(q, table) and np.allclose(c, cost)
    policies = np.random.default_rng(1).integers(0, k, (5, n))
    d = data.decisions["calibration"]
    logged = LoggedDecisions(("a", "b", "c"), d["action"].to_numpy(np.int64),
                             d[Label.REWARD].to_numpy(float), d[Label.PROPENSITY].to_numpy(float),
                             np.arange(n), d.index.to_numpy())
    dr = point_values(logged, policies, q)["dr"]
    assert np.allclose(dr, table[np.arange(n)[None, :], policies].mean(axis=1), atol=1e-12)


def test_partial_replays_keep_the_heads_model_for_the_logged_call():
    """An opening replayed for some candidates only: the replayed ones read their observed
    outcome, the logged call keeps the head's probability (DR stays unbiased: the model of
    the logged action must not depend on its own draw), unreplayed openings are the head's."""
    from replaylab.pipelines.router_fit import observed_values

    data, table, _, action = _calibration_data(replay_every=2)
    n, k = table.shape
    rep = data.replays
    keep = ~((rep["row"] == 100) & (rep["action"] == rep["action"][rep["row"] == 100].min()))
    data.replays = rep[keep].reset_index(drop=True)  # opening 0 now lacks one candidate
    prob = np.full((n, k), 0.25)
    q, _ = observed_values(data, "calibration", prob, np.full(k, 0.5))
    assert q[0, action[0]] == 0.25  # opening 0 is not fully observed
    assert np.all(q[1::2] == 0.25)  # never replayed
    for i in range(2, n, 2):  # fully replayed: the table, the logged call included
        assert np.array_equal(q[i], table[i])
