"""Cost/quality curves of a router and the summary numbers they are judged by.

A scoring router gives predicted success s(i, a) in [0, 1] for prompt i and
candidate a (n, K). At threshold t it sends prompt i to the CHEAPEST candidate
(by mean cost) whose predicted success reaches t, and to the strong candidate
when none does:

    a_t(i) = first a in cost order with s(i, a) >= t, else strong.

With two candidates (RouteLLM's setting) this is "weak if s(i, weak) >= t, else
strong", i.e. strong when the strong model's predicted advantage is high. Sweeping
t from -inf (everything to the cheapest) to +inf (everything to the strong
candidate) traces the curve of (strong_share(t), quality(t), cost(t)) over the
full-information outcomes: quality(t) = mean_i r(i, a_t(i)).

RouteLLM's metrics (Ong et al., "RouteLLM: Learning to Route LLMs with
Preference Data", 2024, arXiv:2406.18665; lm-sys/RouteLLM routellm/evals/evaluate.py):

    PGR(t)  = (quality(t) - quality(weak)) / (quality(strong) - quality(weak))
    APGR    = area under PGR against the share of strong calls, in [0, 1] of
              calls (RouteLLM: (AUC_router - AUC_weak) / (AUC_strong - AUC_weak)
              with trapezoids over its threshold points; the same number when the
              points span shares 0 to 1, as here). A random router scores ~0.5.
    CPT(x%) = the smallest share of strong calls at which PGR reaches x%, read on
              the piecewise-linear curve (RouteLLM interpolates with np.interp,
              which assumes quality increasing in share; the first crossing used
              here equals it then and stays defined when the curve wiggles).
              Reported as a share in [0, 1] (RouteLLM prints percent).

And the house's budget number:

    cost_ratio_at_95 = min { cost(t) : quality(t) >= 0.95 quality(strong) } / cost(strong)

(lower is better; 1.0 when only the all-strong point qualifies).

Intervals: prompts are sessions' opening requests; the session bootstrap
(`replaylab.stats`) resamples them (or the given session groups) and recomputes
every number of the summary on each replicate from replicate-weighted curves (one
matrix product per chunk of replicates), percentile intervals `<key>-lo-95`, `-hi-95`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from replaylab.router.config import RouterEvalConfig
from replaylab.router.policy import choose_by_threshold
from replaylab.router.replay import OutcomeMatrix
from replaylab.stats import percentile_interval, session_bootstrap

CPT_LEVELS = (0.5, 0.8)
SUMMARY_KEYS = ("quality", "cost", "strong_share", "apgr", "cpt50", "cpt80")


def anchors(matrix: OutcomeMatrix, config: RouterEvalConfig | None = None,
            allow_same: bool = False) -> tuple[int, int]:
    """(weak, strong) columns: configured, else cheapest mean cost / best mean score.

    When one candidate is both (RouterArena: gemini-2.0-flash is cheaper and better
    on average) there is no cost/quality trade-off to sweep: a ValueError unless
    `allow_same`.
    """
    config = config or RouterEvalConfig()
    q, c = matrix.score.mean(axis=0), matrix.cost.mean(axis=0)
    strong = (matrix.index(config.strong) if config.strong
              else int(np.lexsort((c, -q))[0]))  # best score, then cheaper
    weak = (matrix.index(config.weak) if config.weak
            else int(np.lexsort((-q, c))[0]))  # cheapest, then better
    if weak == strong and not allow_same:
        raise ValueError(f"weak and strong anchors are both {matrix.candidates[weak]!r}: the "
                         "cheapest candidate is also the best, nothing to route")
    return weak, strong


def cost_order(matrix: OutcomeMatrix) -> np.ndarray:
    """Columns by mean cost ascending (ties: higher mean score first)."""
    return np.lexsort((-matrix.score.mean(axis=0), matrix.cost.mean(axis=0)))


def route_by_threshold(predicted: np.ndarray, order: np.ndarray, fallback: int,
                       thresholds: np.ndarray) -> np.ndarray:
    """(T, n) chosen columns: cheapest in `order` with predicted >= t, else `fallback`
    (`policy.choose_by_threshold` on the columns put in cost order)."""
    order = np.asarray(order)
    at = int(np.flatnonzero(order == fallback)[0])  # the fallback's place in cost order
    pred = np.asarray(predicted, float)[:, order]  # (n, K) in cost order
    return order[choose_by_threshold(pred, np.asarray(thresholds, float).reshape(-1),
                                     fallback=at)]


def default_thresholds(predicted: np.ndarray, n_thresholds: int) -> np.ndarray:
    """Quantiles of the predicted scores plus -inf and +inf (both ends of the curve)."""
    qs = np.quantile(np.asarray(predicted, float), np.linspace(0.0, 1.0, n_thresholds))
    return np.unique(np.concatenate([[-np.inf], qs, [np.inf]]))


@dataclass(frozen=True)
class CostQualityCurve:
    """A threshold sweep, sorted by strong_share; arrays (T,); anchors as columns/values."""

    threshold: np.ndarray
    strong_share: np.ndarray
    quality: np.ndarray
    cost: np.ndarray
    pgr: np.ndarray
    weak: str
    strong: str
    weak_quality: float
    strong_quality: float
    strong_cost: float

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({"threshold": self.threshold, "strong_share": self.strong_share,
                             "quality": self.quality, "cost": self.cost, "pgr": self.pgr})


def _first_crossing(x: np.ndarray, y: np.ndarray, level: float) -> float:
    """Smallest x where the piecewise-linear y(x) reaches `level` (NaN if never)."""
    above = y >= level
    if not above.any():
        return float("nan")
    j = int(above.argmax())
    if j == 0:
        return float(x[0])
    x0, x1, y0, y1 = x[j - 1], x[j], y[j - 1], y[j]
    return float(x0 + (level - y0) * (x1 - x0) / (y1 - y0))


def curve_metrics(share: np.ndarray, quality: np.ndarray, cost: np.ndarray, weak_quality: float,
                  strong_quality: float, strong_cost: float, quality_target: float = 0.95) -> dict:
    """apgr, cpt50, cpt80, cost_ratio_at_<target> of one curve (arrays (T,), any order)."""
    order = np.lexsort((quality, share))
    x, q, c = share[order], quality[order], cost[order]
    gap = strong_quality - weak_quality
    pgr = (q - weak_quality) / gap if gap > 0 else np.full_like(q, np.nan)
    out = {"apgr": float(np.trapezoid(pgr, x)) if gap > 0 else float("nan")}
    for level in CPT_LEVELS:
        out[f"cpt{round(level * 100)}"] = _first_crossing(x, pgr, level) if gap > 0 else float("nan")
    ok = q >= quality_target * strong_quality - 1e-12
    key = f"cost_ratio_at_{round(quality_target * 100)}"
    out[key] = float(c[ok].min() / strong_cost) if ok.any() and strong_cost > 0 else float("nan")
    return out


def _sweep(matrix: OutcomeMatrix, predicted: np.ndarray, thresholds: np.ndarray,
           strong: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-threshold, per-prompt quality, cost and strong indicator, each (T, n)."""
    choice = route_by_threshold(predicted, cost_order(matrix), strong, thresholds)
    rows = np.arange(matrix.n_prompts)[None, :]
    return matrix.score[rows, choice], matrix.cost[rows, choice], (choice == strong).astype(float)


def cost_quality_curve(matrix: OutcomeMatrix, predicted: np.ndarray,
                       config: RouterEvalConfig | None = None,
                       thresholds: np.ndarray | None = None) -> CostQualityCurve:
    """The threshold sweep of a scoring router over the full-information outcomes.

    predicted: (n, K) predicted success per prompt and candidate, rows as `matrix`.
    thresholds: default `default_thresholds(predicted, config.n_thresholds)`.
    """
    config = config or RouterEvalConfig()
    predicted = _check_predicted(matrix, predicted)
    weak, strong = anchors(matrix, config)
    t = default_thresholds(predicted, config.n_thresholds) if thresholds is None else np.asarray(
        thresholds, float)
    q, c, s = (a.mean(axis=1) for a in _sweep(matrix, predicted, t, strong))
    order = np.lexsort((q, s))
    wq, sq = float(matrix.score[:, weak].mean()), float(matrix.score[:, strong].mean())
    pgr = (q - wq) / (sq - wq) if sq > wq else np.full_like(q, np.nan)
    return CostQualityCurve(t[order], s[order], q[order], c[order], pgr[order],
                            matrix.candidates[weak], matrix.candidates[strong], wq, sq,
                            float(matrix.cost[:, strong].mean()))


def _check_predicted(matrix: OutcomeMatrix, predicted: np.ndarray) -> np.ndarray:
    predicted = np.asarray(predicted, float)
    if predicted.shape != matrix.score.shape:
        raise ValueError(f"predicted has shape {predicted.shape}, expected {matrix.score.shape}")
    return predicted


def policy_summary(matrix: OutcomeMatrix, choice: np.ndarray, predicted: np.ndarray | None = None,
                   config: RouterEvalConfig | None = None,
                   session: np.ndarray | None = None) -> dict:
    """quality, cost, strong_share of `choice` (n,) and the curve numbers of `predicted`.

    choice: (n,) column indices the policy picks at its operating point.
    predicted: (n, K) scores of the router for the curve metrics; None (a rules
    policy, no threshold) leaves apgr, cpt50, cpt80, cost_ratio_at_95 NaN.
    session: (n,) group of each prompt for the bootstrap (default: each its own).
    Every key has `<key>-lo-<level>` and `<key>-hi-<level>` (session bootstrap).
    """
    config = config or RouterEvalConfig()
    weak, strong = anchors(matrix, config, allow_same=True)
    n, rows = matrix.n_prompts, np.arange(matrix.n_prompts)
    choice = np.asarray(choice, dtype=np.int64)
    # per-prompt terms; every number below is a function of their weighted means
    own = np.stack([matrix.score[rows, choice], matrix.cost[rows, choice],
                    (choice == strong).astype(float), matrix.score[:, weak],
                    matrix.score[:, strong], matrix.cost[:, strong]])  # (6, n)
    sweep = None
    if predicted is not None and weak != strong:
        t = default_thresholds(_check_predicted(matrix, predicted), config.n_thresholds)
        sweep = _sweep(matrix, predicted, t, strong)  # 3 x (T, n)

    def numbers(weights: np.ndarray) -> list[dict]:  # weights (b, n)
        tot = weights.sum(axis=1)
        m = (weights @ own.T) / tot[:, None]  # (b, 6)
        curves = [(weights @ a.T) / tot[:, None] for a in sweep] if sweep is not None else None
        res = []
        for j in range(len(weights)):
            d = {"quality": m[j, 0], "cost": m[j, 1], "strong_share": m[j, 2]}
            if curves is not None:
                d.update(curve_metrics(curves[2][j], curves[0][j], curves[1][j], m[j, 3],
                                       m[j, 4], m[j, 5], config.quality_target))
            res.append(d)
        return res

    point = numbers(np.ones((1, n)))[0]
    if weak == strong:
        point["note"] = (f"{matrix.candidates[weak]} is both the cheapest and the best "
                         "candidate: no curve (apgr, cpt, cost_ratio are NaN)")
    keys = list(SUMMARY_KEYS) + [f"cost_ratio_at_{round(config.quality_target * 100)}"]
    out = {k: float(point.get(k, np.nan)) for k in keys}
    reps = [d for w in session_bootstrap(rows if session is None else session, config.n_boot,
                                         config.seed) for d in numbers(w)]
    tag = config.level_tag
    for k in keys:
        if config.n_boot:
            lo, hi = percentile_interval(np.array([d.get(k, np.nan) for d in reps]), config.level)
            out[f"{k}-lo-{tag}"], out[f"{k}-hi-{tag}"] = lo, hi
    if "note" in point:
        out["note"] = point["note"]
    out.update(n=n, weak=matrix.candidates[weak], strong=matrix.candidates[strong],
               weak_quality=float(own[3].mean()), strong_quality=float(own[4].mean()),
               strong_cost=float(own[5].mean()))
    return out
