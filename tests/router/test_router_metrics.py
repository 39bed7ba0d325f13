"""Cost/quality curves, RouteLLM's APGR / CPT, cost_ratio_at_95 and the policy summary.

Hand-computable tiny matrices; RouteLLM's own formula (routellm/evals, re-derived
here) on the same threshold points; all 1,319 GSM8K prompts (the package's shipped
outcomes) in a slow test.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from replaylab.router.config import RouterEvalConfig
from replaylab.router.metrics import (
    cost_quality_curve,
    curve_metrics,
    policy_summary,
    route_by_threshold,
)
from replaylab.router.replay import Label, OutcomeMatrix, outcome_matrix
from replaylab.router.rules import ScenarioRules
from replaylab.sources.routellm import import_routellm_gsm8k
from tests.helpers.router import GSM8K, ROUTELLM_COST


def matrix(score: np.ndarray, cost: np.ndarray, names: tuple[str, ...] = ("weak", "strong"),
           ) -> OutcomeMatrix:
    n = len(score)
    meta = pd.DataFrame({"prompt_id": [f"p{i}" for i in range(n)], "task": "t",
                         Label.PROMPT_LENGTH: 10.0})
    score = np.asarray(score, float)
    return OutcomeMatrix(names, meta, score, score >= 1.0, np.broadcast_to(
        np.asarray(cost, float), score.shape).copy(), np.full(score.shape, np.nan),
        np.full(score.shape, np.nan))


def oracle_case(n: int = 1000, a: float = 0.7) -> OutcomeMatrix:
    """Weak right on the first a*n prompts, strong always right; costs 1 and 10."""
    weak = (np.arange(n) < a * n).astype(float)
    return matrix(np.column_stack([weak, np.ones(n)]), [1.0, 10.0])


def test_route_by_threshold_picks_the_cheapest_passing_candidate():
    pred = np.array([[0.9, 0.2, 0.1], [0.3, 0.8, 0.5], [0.1, 0.2, 0.3]])
    order = np.array([0, 1, 2])  # cost order
    got = route_by_threshold(pred, order, fallback=2, thresholds=np.array([-np.inf, 0.5, 0.85, np.inf]))
    assert got.tolist() == [[0, 0, 0], [0, 1, 2], [0, 2, 2], [2, 2, 2]]


def test_oracle_router_apgr_is_analytic():
    a = 0.7
    m = oracle_case(a=a)
    curve = cost_quality_curve(m, np.column_stack([m.score[:, 0], np.ones(m.n_prompts)]))
    assert curve.strong_share[0] == 0.0 and curve.strong_share[-1] == 1.0
    got = curve_metrics(curve.strong_share, curve.quality, curve.cost, a, 1.0, 10.0)
    # PGR rises linearly to 1 at share 1-a and stays: area (1-a)/2 + a
    assert np.isclose(got["apgr"], (1 + a) / 2)
    assert np.isclose(got["cpt50"], 0.5 * (1 - a)) and np.isclose(got["cpt80"], 0.8 * (1 - a))
    # cheapest point with quality >= 0.95: share 1-a, cost a*1 + (1-a)*10
    assert np.isclose(got["cost_ratio_at_95"], (a * 1 + (1 - a) * 10) / 10)


def test_random_router_apgr_is_one_half():
    rng = np.random.default_rng(0)
    n = 6000
    m = matrix(np.column_stack([rng.random(n) < 0.6, rng.random(n) < 0.9]).astype(float), [1, 10])
    s = policy_summary(m, np.ones(n, dtype=int), rng.random((n, 2)), RouterEvalConfig(n_boot=100))
    assert abs(s["apgr"] - 0.5) < 0.03
    assert s["apgr-lo-95"] < 0.5 < s["apgr-hi-95"]
    assert abs(s["cpt50"] - 0.5) < 0.06 and abs(s["cpt80"] - 0.8) < 0.06


def routellm_reference(win_rate: np.ndarray, weak_ok: np.ndarray, strong_ok: np.ndarray,
                       num_results: int = 10) -> tuple[dict, np.ndarray]:
    """RouteLLM's evaluation, re-derived from routellm/evals/{benchmarks,evaluate}.py.

    Thresholds: the edges of `pd.qcut(win_rate, num_results)`; strong when
    win_rate >= edge (> for the last edge). APGR = (AUC - AUC_weak) / (AUC_strong -
    AUC_weak), trapezoids over share of strong calls; CPT(x) = np.interp of the
    quality x(strong - weak) + weak on (accuracy, share).
    """
    _, edges = pd.qcut(win_rate, num_results, retbins=True)
    pts = []
    for i, thr in enumerate(edges):
        strong = win_rate >= thr if i != len(edges) - 1 else win_rate > thr
        pts.append((strong.mean(), np.where(strong, strong_ok, weak_ok).mean()))
    pts = np.array(sorted(pts))
    share, acc = pts[:, 0], pts[:, 1]
    w, s = weak_ok.mean(), strong_ok.mean()
    auc = np.trapezoid(acc, share)
    auc_w, auc_s = np.trapezoid(np.full_like(share, w), share), np.trapezoid(
        np.full_like(share, s), share)
    ref = {"apgr": (auc - auc_w) / (auc_s - auc_w)}
    for x in (0.5, 0.8):
        ref[f"cpt{round(x * 100)}"] = float(np.interp(x * (s - w) + w, acc, share))
    return ref, edges


def test_apgr_and_cpt_match_routellm_formula():
    rng = np.random.default_rng(4)
    n = 3000
    hard = rng.random(n)  # an informative router: hard prompts fail the weak model more
    weak_ok = (rng.random(n) > 0.9 * hard).astype(float)
    strong_ok = (rng.random(n) > 0.3 * hard).astype(float)
    win_rate = np.clip(hard + rng.normal(0, 0.1, n), 0, 1)
    ref, edges = routellm_reference(win_rate, weak_ok, strong_ok)
    m = matrix(np.column_stack([weak_ok, strong_ok]), [1.0, 10.0])
    # weak iff 1 - w >= t  <=>  w <= 1 - t: t just above 1 - edge gives w < edge
    t = np.append(np.nextafter(1.0 - edges[:-1], np.inf), 1.0 - edges[-1])
    pred = np.column_stack([1.0 - win_rate, np.zeros(n)])
    curve = cost_quality_curve(m, pred, thresholds=t)
    assert np.all(np.diff(curve.quality) >= 0)  # monotone: np.interp is well defined
    got = curve_metrics(curve.strong_share, curve.quality, curve.cost, curve.weak_quality,
                        curve.strong_quality, curve.strong_cost)
    for k, v in ref.items():
        assert np.isclose(got[k], v, atol=1e-12), (k, got[k], v)


def test_policy_summary_keys_strong_only_and_rules():
    m = oracle_case(n=200)
    strong_only = np.ones(m.n_prompts, dtype=int)
    s = policy_summary(m, strong_only, config=RouterEvalConfig(n_boot=50))
    assert s["quality"] == 1.0 and s["strong_share"] == 1.0 and s["cost"] == 10.0
    assert np.isnan(s["apgr"]) and np.isnan(s["cost_ratio_at_95"])  # no scores: no curve
    for k in ("quality", "cost", "strong_share", "apgr", "cpt50", "cpt80", "cost_ratio_at_95"):
        assert k in s and f"{k}-lo-95" in s and f"{k}-hi-95" in s
    weak_only = policy_summary(m, np.zeros(m.n_prompts, dtype=int), config=RouterEvalConfig(n_boot=200))
    assert weak_only["quality-lo-95"] <= weak_only["quality"] <= weak_only["quality-hi-95"]
    assert weak_only["quality-lo-95"] < weak_only["quality-hi-95"]


def test_bootstrap_resamples_sessions_not_prompts():
    rng = np.random.default_rng(2)
    n = 300
    m = matrix(np.column_stack([rng.random(n) < 0.5, rng.random(n) < 0.8]).astype(float), [1, 5])
    pred = rng.random((n, 2))
    choice = (pred[:, 0] < 0.5).astype(int)
    cfg = RouterEvalConfig(n_boot=100, seed=3)
    base = policy_summary(m, choice, pred, cfg)
    # every session twice: same point estimates and, resampling sessions, the same intervals
    twice = m.take(np.repeat(np.arange(n), 2))
    dup = policy_summary(twice, np.repeat(choice, 2), np.repeat(pred, 2, axis=0), cfg,
                         session=np.repeat(np.arange(n), 2))
    for k in ("quality", "quality-lo-95", "quality-hi-95", "apgr-lo-95", "apgr-hi-95"):
        assert np.isclose(base[k], dup[k]), k
    # resampling the copies as if independent understates the spread
    naive = policy_summary(twice, np.repeat(choice, 2), np.repeat(pred, 2, axis=0), cfg)
    assert naive["quality-hi-95"] - naive["quality-lo-95"] < base["quality-hi-95"] - base["quality-lo-95"]


def test_three_candidate_curve_spans_cheapest_to_strong():
    rng = np.random.default_rng(1)
    n = 500
    score = np.column_stack([rng.random(n) < p for p in (0.4, 0.6, 0.9)]).astype(float)
    m = matrix(score, [1.0, 3.0, 10.0], names=("s", "m", "l"))
    curve = cost_quality_curve(m, rng.random((n, 3)))
    assert curve.weak == "s" and curve.strong == "l"
    assert curve.strong_share[0] == 0.0 and curve.strong_share[-1] == 1.0
    ends = curve.frame().set_index("threshold")
    assert np.isclose(ends.at[-np.inf, "cost"], 1.0) and np.isclose(ends.at[np.inf, "cost"], 10.0)
    assert list(curve.frame().columns) == ["threshold", "strong_share", "quality", "cost", "pgr"]


@pytest.mark.slow
def test_gsm8k_rules_and_oracle_summaries(test_data):
    """All 1,319 GSM8K prompts: the package's shipped outcomes."""
    frame = import_routellm_gsm8k(
        GSM8K, contaminated_path=test_data / "routellm/gsm8k/contaminated_prompts.jsonl")
    m = outcome_matrix(frame, ROUTELLM_COST)
    rules = ScenarioRules().fit(m)
    oracle = policy_summary(m, rules.predict_index(m), m.score, RouterEvalConfig(n_boot=100))
    assert oracle["strong"] == "gpt-4-1106-preview" and oracle["strong_share"] == 1.0
    assert oracle["apgr"] > 0.95 and oracle["cost_ratio_at_95"] < 0.5
