"""Score a router artifact on another run's test prompts: the champion on the challenger's.

The router beside the demand re-scoring (`replaylab.artifacts.rescore_demand`); the
router kind declares it (`replaylab.artifacts.kinds`). The prompts, their full
outcome matrix (every candidate's quality and cost) and metadata are the
challenger's test split (`replaylab.pipelines.router.test_prompts`, the split
`train_router` scores; the caller builds them, `RouterRows`). The artifact
answers them through the serving runtime (`replaylab.runtime.Router.route_batch`:
its own encoder, head and threshold); the scores are the pipeline's:
`policy_summary` (quality, cost, strong-call share, curve metrics, bootstrap
intervals) of its choices and of its P(success) swept over thresholds, and
`cost_quality_curve` for the figure. `rescore_pair` scores a challenger and a
champion folder and says what the registry records (tags, metrics). No MLflow;
it reads only the folders it is handed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
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
    from replaylab.router.inputs import prompt_hash

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


# ---------------------------------------------------------------- a champion on a challenger's prompts
@dataclass(frozen=True)
class RouterRows:
    """The challenger's test prompts (`replaylab.pipelines.router.test_prompts`): the
    outcome matrix, the texts, their metadata (category, prompt_tokens), and the
    pipeline's evaluation config (`labels.evaluation`: bootstrap draws, seed, level)."""

    matrix: Any
    texts: list[str]
    meta: dict[str, np.ndarray]
    evaluation: Any

    def counts(self) -> dict:
        return {"rows": len(self.texts)}


def fit_prompt_hashes(folder: Path) -> set[str] | None:
    """The prompt hashes a verified router folder was fitted and calibrated on (its
    fit_prompts.json), None when it records none."""
    from replaylab.artifacts.router_export import FIT_PROMPTS_FILE

    path = Path(folder) / FIT_PROMPTS_FILE
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    return {str(h) for k in ("train", "calibration") for h in doc.get(k) or []}


def load_router(folder: Path, hmac_key: bytes | None = None, what: str | None = None) -> Any:
    """The runtime's Router of a verified folder; ManifestError when the runtime refuses it."""
    from replaylab.contracts.manifest import ManifestError
    from replaylab.runtime import Router

    router = Router.load(folder, hmac_key=hmac_key)
    if not router.loaded:
        raise ManifestError(router.reason or "not_loaded",
                            f"{what or folder}: the runtime refuses it")
    return router


def _num(v: Any) -> str:
    return repr(float(v)) if v is not None else "nan"


def rescore_pair(challenger: Path, champion: Path, champion_manifest: dict, rows: RouterRows,
                 hmac_key: bytes | None = None) -> dict:
    """Both routers (verified folders), through the serving runtime, on the challenger's
    test prompts, leakage counted (the champion's fit_prompts.json).

    {"doc": the scores document's parts (scores, champion_fit_overlap, scores_unseen,
    comparison), "tags": what the version records (suffixes of `replaylab.vs.v<N>.`),
    "metrics": the run's metrics (suffixes of `rescore.vs_v<N>.`)}. ManifestError or
    RouterRescoreError: the champion cannot be scored here.
    """
    del champion_manifest  # the router's leakage is read off fit_prompts.json instead
    matrix, texts, meta, ev = rows.matrix, rows.texts, rows.meta, rows.evaluation
    fit = fit_prompt_hashes(champion)
    doc: dict[str, Any] = {"scores": {}}
    routed = {}
    for role, f in (("challenger", challenger), ("champion", champion)):
        router = load_router(f, hmac_key, what=role)
        choice, prob = route_prompts(router, matrix, texts, meta)
        routed[role] = (router.rule, choice, prob)
        doc["scores"][role] = score_choices(router.rule, matrix, choice, prob, ev)
    cmp_doc = compare_routers(matrix, texts, routed, fit, ev)
    overlap, deltas = cmp_doc["champion_fit_overlap"], cmp_doc["delta"]
    doc["champion_fit_overlap"] = overlap
    if "scores_unseen" in cmp_doc:
        doc["scores_unseen"] = cmp_doc["scores_unseen"]
    pa, pb = (doc["scores"][r]["policy"] for r in ("challenger", "champion"))
    doc["comparison"] = {"rows": len(texts), **{
        role: {k: pol[k] for k in ("quality", "cost", "strong_share", "cost_ratio_at_95")}
        | {"quality_ci": pol["ci"]["quality"], "cost_ci": pol["ci"]["cost"]}
        for role, pol in (("challenger", pa), ("champion", pb))},
        "delta": deltas, "champion_fit_overlap": overlap}
    if "scores_unseen" in doc:
        doc["comparison"]["unseen"] = {
            role: {k: s_["policy"][k] for k in ("quality", "cost", "cost_ratio_at_95")}
            for role, s_ in doc["scores_unseen"].items()}
    tags, metrics = {"rows": str(len(texts))}, {}
    for role, pol in (("challenger", pa), ("champion", pb)):
        for k in ("quality", "cost", "cost_ratio_at_95"):
            tags[f"{role}.{k}"] = _num(pol[k])
            metrics[f"{role}.{k}"] = pol[k]
        tags[f"{role}.quality_ci"] = json.dumps(pol["ci"]["quality"])
    for part, d in deltas.items():  # challenger - champion, paired prompt-bootstrap
        for k, v in d.items():
            tags[f"delta.{part}.{k}"] = json.dumps({"mean": v["mean"], "ci": v["ci"]})
    tags["champion_fit_overlap"] = (
        f"{overlap['seen']} of {overlap['prompts']} test prompts "
        f"({overlap['seen'] / max(overlap['prompts'], 1):.1%}) were in the champion's "
        "training or calibration prompts" if overlap["known"] else overlap["what"])
    for role, s_ in (doc.get("scores_unseen") or {}).items():
        for k in ("quality", "cost", "cost_ratio_at_95"):
            tags[f"{role}.unseen.{k}"] = _num(s_["policy"][k])
    return {"doc": doc, "tags": tags, "metrics": metrics}
