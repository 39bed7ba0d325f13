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


def route_prompts(router: Any, matrix: Any, texts: list[str], meta: dict[str, np.ndarray],
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(choice (n,) column per prompt, prob (n, K) P(success)) of a loaded Router."""
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
    return choice, prob


def score_choices(rule: str, matrix: Any, choice: np.ndarray, prob: np.ndarray,
                  evaluation: Any) -> dict:
    """{"prompts", "policy" (KEYS and "ci": {quality, cost: [lo, hi]}), "curve" (records
    of threshold, strong_share, quality, cost)} of a router's choices and P(success)."""
    pred = routing_scores(prob, rule)
    s = policy_summary(matrix, choice, pred, evaluation)
    tag = evaluation.level_tag
    policy = {k: s.get(k) for k in KEYS}
    policy["ci"] = {k: [s.get(f"{k}-lo-{tag}"), s.get(f"{k}-hi-{tag}")] for k in ("quality",
                                                                                  "cost")}
    curve = cost_quality_curve(matrix, pred, evaluation).frame()
    return {"prompts": int(len(choice)), "policy": policy,
            "curve": curve[["threshold", "strong_share", "quality", "cost"]].to_dict("list")}


def score_router(router: Any, matrix: Any, texts: list[str], meta: dict[str, np.ndarray],
                 evaluation: Any) -> dict:
    """`score_choices` of a loaded Router's decisions on the prompts."""
    choice, prob = route_prompts(router, matrix, texts, meta)
    return score_choices(router.rule, matrix, choice, prob, evaluation)


def paired_deltas(matrix: Any, a: np.ndarray, b: np.ndarray, n_boot: int, seed: int,
                  level: float = 0.95) -> dict:
    """Router a minus router b on the same prompts: mean quality and cost per prompt, each
    with its paired prompt-bootstrap interval (`replaylab.stats.paired_bootstrap_diff`;
    prompts are the sessions here)."""
    from replaylab.stats import paired_bootstrap_diff

    rows = np.arange(len(a))
    return {k: paired_bootstrap_diff(x[rows, a], x[rows, b], n_boot, seed, level=level)
            for k, x in (("quality", matrix.score), ("cost", matrix.cost))}


def seen_mask(texts: list[str], fit_hashes: set[str]) -> np.ndarray:
    """(n,) True where a prompt's text hash is among `fit_hashes` (another router's
    fit_prompts.json: it was fitted or calibrated on that prompt)."""
    from replaylab.pipelines.router import prompt_hash

    return np.array([prompt_hash(t) in fit_hashes for t in texts], dtype=bool)


def compare_routers(matrix: Any, texts: list[str], routed: dict[str, tuple],
                    fit_hashes: set[str] | None, evaluation: Any) -> dict:
    """Challenger and champion on the challenger's test prompts, leakage counted.

    routed: role -> (rule, choice, prob) of "challenger" and "champion"; fit_hashes: the
    champion's fit_prompts.json hashes (None: it records none, leakage unknown).
    {"champion_fit_overlap": {known, prompts, seen, unseen, what}, "delta": {"all": ...,
    "unseen": ...} (challenger - champion quality and cost, paired prompt-bootstrap
    intervals), "scores_unseen": role -> `score_choices` on the prompts the champion
    never saw (when some were seen and some not)}.
    """
    ev = evaluation
    ca, cb = routed["challenger"][1], routed["champion"][1]
    seen = seen_mask(texts, fit_hashes) if fit_hashes is not None else None
    overlap = {"known": seen is not None, "prompts": len(texts),
               "seen": int(seen.sum()) if seen is not None else None,
               "unseen": int((~seen).sum()) if seen is not None else None,
               "what": "challenger test prompts whose text the champion was fitted or "
                       "calibrated on (its fit_prompts.json)" if seen is not None else
                       "the champion artifact records no fit prompts (exported before "
                       "fit_prompts.json): leakage unknown"}
    out: dict[str, Any] = {"champion_fit_overlap": overlap,
                           "delta": {"all": paired_deltas(matrix, ca, cb, ev.n_boot, ev.seed,
                                                          ev.level)}}
    if seen is not None and seen.any() and (~seen).any():
        sub = matrix.take(~seen)
        out["scores_unseen"] = {role: score_choices(rule, sub, ch[~seen], pr[~seen], ev)
                                for role, (rule, ch, pr) in routed.items()}
        out["delta"]["unseen"] = paired_deltas(sub, ca[~seen], cb[~seen], ev.n_boot, ev.seed,
                                               ev.level)
    return out
