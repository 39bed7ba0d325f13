"""Score a router artifact on another run's test prompts: the champion on the challenger's.

The prompts, their full outcome matrix (every candidate's quality and cost) and
metadata are the challenger's test split (`replaylab.pipelines.router.test_prompts`,
the split `train_router` scores). The artifact answers them through the serving
runtime (`replaylab.runtime.Router.route_batch`: its own encoder, head and
threshold); the scores are the pipeline's: `policy_summary` (quality, cost,
strong-call share, curve metrics, bootstrap intervals) of its choices and of its
P(success) swept over thresholds, and `cost_quality_curve` for the figure.
Pure: no MLflow, no I/O.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaylab.router.metrics import cost_quality_curve, policy_summary
from replaylab.router.policy import routing_scores

KEYS = ("quality", "cost", "strong_share", "apgr", "cpt50", "cpt80", "cost_ratio_at_95")


class RouterRescoreError(ValueError):
    """The router cannot be scored on these prompts (the message says why)."""


def score_router(router: Any, matrix: Any, texts: list[str], meta: dict[str, np.ndarray],
                 evaluation: Any) -> dict:
    """{"prompts", "policy" (KEYS and "ci": {quality, cost: [lo, hi]}), "curve" (records
    of threshold, strong_share, quality, cost)} of a loaded Router on the prompts."""
    cand = [str(c) for c in matrix.candidates]
    if sorted(map(str, router.candidates)) != sorted(cand):
        raise RouterRescoreError(f"router candidates {list(router.candidates)} are not the "
                                 f"prompts' {cand}")
    decisions = router.route_batch(texts, [str(c) for c in meta["category"]],
                                   [float(t) for t in meta["prompt_tokens"]])
    if any(d.fallback or not d.scores for d in decisions):
        bad = sum(d.fallback or not d.scores for d in decisions)
        raise RouterRescoreError(f"the router did not score {bad} of {len(decisions)} prompts")
    col = {c: i for i, c in enumerate(cand)}
    choice = np.array([col[d.candidate] for d in decisions], dtype=np.int64)
    prob = np.array([[d.scores[c] for c in cand] for d in decisions], dtype=np.float64)
    pred = routing_scores(prob, router.rule)
    s = policy_summary(matrix, choice, pred, evaluation)
    tag = evaluation.level_tag
    policy = {k: s.get(k) for k in KEYS}
    policy["ci"] = {k: [s.get(f"{k}-lo-{tag}"), s.get(f"{k}-hi-{tag}")] for k in ("quality",
                                                                                  "cost")}
    curve = cost_quality_curve(matrix, pred, evaluation).frame()
    return {"prompts": int(len(texts)), "policy": policy,
            "curve": curve[["threshold", "strong_share", "quality", "cost"]].to_dict("list")}
