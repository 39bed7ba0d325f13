"""The router tests' shared world: candidates, configs, a TF-IDF embedder, seeded head data."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd

from replaylab.apps.inputs import default_outcomes
from replaylab.router.config import (
    RouterCostConfig,
)
from replaylab.router.inputs import TrainingRows, ips_weights
from replaylab.router.pipeline_config import router_config

CHEAP, STRONG = "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"


ENCODER = "tfidf-svd-48"


# `python -m training pipeline=router` overrides for a run whose test is about something
# else than choosing the head, the replay selection, the seed spread or the learning curve:
# the configured head fitted once, one teacher, one seed, uniform replays, the curve's full
# point only. Each of those defaults refits the head (docs/design/router.md steps 4-6): the
# head selection alone fits 4 heads, two of them distilled from 5 teachers, and the curve
# refits at 25% and 50% of the labels; they have their own tests
# (tests/router/test_router_head_select.py, tests/router/test_replay_selection.py, the
# spread and the curve in tests/pipelines/test_router_pipeline.py).
ONE_HEAD = ("router.head_select.enabled=false", "router.head.teachers=1",
            "router.spread_seeds=1", "router.replay.selection=random",
            "router.go.curve_fractions=[1.0]")


def router_receipts_config(**over) -> object:
    base = {"candidates": [CHEAP, STRONG],
            "cost": {"call_cost_usd": {CHEAP: 0.00012, STRONG: 0.01235}},
            "head": {"max_epochs": 20, "num_threads": 1, "teachers": 1},
            "receipts": {"n_boot": 200, "min_explored_per_candidate": 5}, "spread_seeds": 1,
            "replay_plan": {"budget": 50},
            # the gain's attribution refits the head twice more: on only where a test is
            # about it (tests/pipelines/test_router_receipts_attribution.py, the Dask parity)
            "evaluation": {"attribution": "off"}}
    base.update(over)
    return router_config(base)


def tfidf(texts: list[str]) -> np.ndarray:
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer

    z = TruncatedSVD(48, random_state=0).fit_transform(TfidfVectorizer(min_df=2).fit_transform(texts))
    return (z / np.linalg.norm(z, axis=1, keepdims=True).clip(1e-9)).astype(np.float32)


GSM8K = default_outcomes()


def router_pipeline_config(**over) -> object:
    base = {"candidates": [CHEAP, STRONG],
            "cost": {"call_cost_usd": {CHEAP: 0.00012, STRONG: 0.01235}},
            "head": {"max_epochs": 30, "num_threads": 1}, "go": {"n_boot": 300},
            "evaluation": {"n_boot": 200}, "lgbm_estimators": 50}
    base.update(over)
    return router_config(base)


MIXTRAL = "mistralai/Mixtral-8x7B-Instruct-v0.1"


GPT4 = "gpt-4-1106-preview"


# RouteLLM's blended prices (USD per million tokens: GPT-4 24.7, Mixtral 0.24) x an
# assumed 500 tokens per call: MODELED per-call costs (the source has no tokens).
ROUTELLM_COST = RouterCostConfig(call_cost_usd={GPT4: 24.7 * 500 / 1e6, MIXTRAL: 0.24 * 500 / 1e6})


K = 3


GOOD = np.array([[1, 1, 1]] * 4 + [[0, 1, 1]] * 2 + [[0, 0, 1], [0, 0, 0]], dtype=bool)  # (8, K)


PRICE = np.array([1.0, 4.0, 20.0])  # USD per million tokens, cheapest first



def replay_world(n: int = 400, seed: int = 0) -> tuple:
    """(outcome matrix, embeddings) for the replay-selection tests: n prompts in 6
    clusters of 12-d unit embeddings; candidates "cheap" (success 0.1..0.9 by cluster,
    0.001 USD) and "strong" (0.95, 0.02 USD); tasks alternate math / chat."""
    from replaylab.contracts.columns import Outcomes as O
    from replaylab.router.replay import outcome_matrix

    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(6, 12))
    cluster = rng.integers(0, 6, n)
    emb = centers[cluster] + rng.normal(scale=0.3, size=(n, 12))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    p_cheap = np.linspace(0.1, 0.9, 6)[cluster]
    rows = []
    for i in range(n):
        for cand, p, cost in (("cheap", p_cheap[i], 0.001), ("strong", 0.95, 0.02)):
            ok = bool(rng.random() < p)
            rows.append({O.VERSION: "1", O.PROMPT_ID: f"p{i:04d}", O.PROMPT_TEXT: f"prompt {i}",
                         O.TASK: ("math", "chat")[i % 2], O.CANDIDATE: cand, O.SCORE: float(ok),
                         O.SUCCESS: ok, O.COST: cost, O.CURRENCY: "USD"})
    return (outcome_matrix(pd.DataFrame(rows), candidates=["cheap", "strong"]),
            emb.astype(np.float32))


def clustered(n: int = 2000, d: int = 32, seed: int = 0) -> dict:
    """Embeddings (n, d) in 8 clusters, meta, full-information score / cost (n, K)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(len(GOOD), d))
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    cluster = rng.integers(0, len(GOOD), n)
    emb = centers[cluster] + rng.normal(scale=0.5 / np.sqrt(d), size=(n, d))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    p = np.where(GOOD[cluster], 0.97, 0.03)
    score = (rng.random(p.shape) < p).astype(float)
    tokens = np.round(rng.lognormal(4.0, 1.0, n))
    cost = PRICE * (tokens[:, None] + 200.0) / 1e6 * rng.lognormal(0.0, 0.1, (n, K))
    meta = {"category": np.array([f"task{c % 3}" for c in cluster], dtype=object),
            "prompt_tokens": tokens}
    return {"emb": emb.astype(np.float32), "meta": meta, "score": score, "cost": cost,
            "cluster": cluster, "p": p}


def logged_rows(data: dict, prompts: np.ndarray, pi0=(0.6, 0.3, 0.1), replay_share: float = 0.2,
                seed: int = 1) -> TrainingRows:
    """One logged action per prompt (weight 1/pi0) plus all K for a replayed share (weight 1)."""
    rng = np.random.default_rng(seed)
    act = rng.choice(K, size=len(prompts), p=pi0)
    replay = prompts[rng.random(len(prompts)) < replay_share]
    row = np.r_[prompts, np.repeat(replay, K)]
    action = np.r_[act, np.tile(np.arange(K), len(replay))]
    weight = np.r_[ips_weights(np.asarray(pi0)[act]), np.ones(len(replay) * K)]
    return TrainingRows(row, action, data["score"][row, action], weight,
                        data["cost"][row, action])


TRAIN, CALIB, TEST = np.arange(0, 1400), np.arange(1400, 1700), np.arange(1700, 2000)


def confounded(n: int = 3000, d: int = 16, seed: int = 0) -> tuple:
    """One region; a hidden z (half the prompts, invisible in the embedding) decides the
    cheap candidate's success (0.05 if z else 0.95), and the logging policy knows it:
    it sends z=0 prompts to cheap w.p. 0.9, z=1 w.p. 0.1 (cheap under-explored where
    it fails). Truth: P(cheap succeeds) = 0.5 everywhere."""
    rng = np.random.default_rng(seed)
    emb = rng.normal(size=(n, d))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    z = rng.random(n) < 0.5
    score = np.column_stack([rng.random(n) < np.where(z, 0.05, 0.95),
                             rng.random(n) < 0.9]).astype(float)
    p_cheap = np.where(z, 0.1, 0.9)
    act = (rng.random(n) >= p_cheap).astype(np.int64)
    prop = np.where(act == 0, p_cheap, 1.0 - p_cheap)
    return emb.astype(np.float32), score, act, prop


class ReceiptsWorld(NamedTuple):
    """The GSM8K receipts world: the outcome matrix, the logging policy's simulated
    sessions, the prompt texts, the deployment ledger and the offline replays."""

    matrix: object
    sim: object
    texts: dict
    ledger: pd.DataFrame
    replays: pd.DataFrame


def receipts_world(cfg) -> ReceiptsWorld:
    """The shipped GSM8K outcomes under cfg's costs, candidates and rules; receipts with 8%
    explored, two sessions per prompt (seed 3); 25% of the openings replayed (seed 0)."""
    from replaylab.router.config import RouterExplorationConfig
    from replaylab.router.exploration import deployment_ledger, replay_outcomes, simulate_receipts
    from replaylab.router.replay import outcome_matrix
    from replaylab.router.rules import ScenarioRules
    from replaylab.sources.routellm import import_routellm_gsm8k

    outcomes = import_routellm_gsm8k(default_outcomes())
    m = outcome_matrix(outcomes, cfg.cost, candidates=cfg.candidates)
    rules = ScenarioRules(cfg.rules).fit(m)
    sim = simulate_receipts(m, rules, RouterExplorationConfig(rate=0.08, sessions_per_prompt=2,
                                                              seed=3))
    texts = outcomes.drop_duplicates("prompt_id").set_index("prompt_id")["prompt_text"].to_dict()
    led = deployment_ledger(sim, texts)
    rep = replay_outcomes(sim, m, texts, share=0.25, seed=0)
    return ReceiptsWorld(m, sim, texts, led, rep)
