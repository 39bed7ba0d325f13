"""Threshold routing policy, escalation accounting, and the threshold's choice.

Candidates are columns ordered cheapest first. A scorer gives p (n, K), e.g.
`SuccessHead.predict_proba`. The STRONGEST column `fallback` is the one with the best
mean score on the calibration table (`strongest_column`; ties to the cheaper);
with RouteLLM's two candidates it is the last column, with LLMRouter's nine it
is not (the dearest model there is among the weakest).

Policy. Two rules (`PolicyConfig.rule`) turn p into routing scores q:

    absolute:  q[i, k] = p[i, k]                          "predicted success clears t"
    margin:    q[i, k] = p[i, k] - max_{j != k} p[i, j]   "predicted success beats every
                                                           other candidate's by t"  (default)

and at threshold t prompt i goes to

    a_t(i) = min { k : q[i, k] >= t }, else `fallback` (the fallback).

Under `margin`, t <= min q is cheap-only; as t rises to 0 the tolerance -t
shrinks and prompts move from the cheapest to their predicted-best candidate
(which always passes t <= 0, so a dear but weak candidate is never the
fallback); for t > 0 a prompt keeps its predicted-best candidate only when that
one leads every other by t, else goes to `fallback`, so the curve reaches
strong-only continuously even where the scorer thinks a cheap model is best.
With two
candidates, margin ranks prompts by the predicted quality loss p_strong -
p_cheap of the cheap call (RouteLLM's routers threshold the same quantity, the
strong model's predicted advantage) where `absolute` ranks by p_cheap alone,
which also sends to the strong model the prompts that both get wrong. It is
also the scenario rules' own form: the cheapest candidate within a tolerance of
the best. `absolute` is kept for the issue's literal wording and comparison.

Escalation (`escalated_outcome`). A first call whose score is below
`success_cutoff` on a candidate other than `fallback` is escalated within the same
turn: with `escalate_to="next"` to the next dearer column (straight to `fallback`
from a column dearer than `fallback`), again while it keeps failing, until a success
or `fallback`; with `"strongest"` straight to `fallback`. Every call is paid: cost(i) =
sum of the called columns' costs; quality(i) = the score of the LAST call (the
answer the user keeps). A successful first call, or a first call to `fallback`, is
never escalated: escalation adds cost only on failures.

Threshold choice (`select_threshold`) on the calibration split's
full-information tables S (n, K) scores in [0, 1] and C (n, K) costs:
- quality target: the cheapest point of the curve with
      mean quality(t) >= target_share x mean S[:, top]   (strong-only quality),
  ties to the higher quality, then the lower threshold; strong-only (t = +inf)
  always qualifies, so the target is always met on the calibration split; with
  `quality_floor` (an absolute floor, `router.objective` kind incumbent) the same rule
  with that floor, and the best-quality point (`met = False`) when none reaches it;
- cost budget: the best quality with mean cost(t) <= cost_budget (USD per
  prompt), ties to the lower cost; when no point fits, the cheapest point with
  `met = False`.
Thresholds swept: every distinct value of q, or `max_thresholds` quantiles of
them when there are more, plus -inf and +inf (both ends of the curve). How well
the threshold carries over is for the test split to say.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from replaylab.config import fail_field as _fail
from replaylab.runtime.routing import RULES, choose_by_threshold, routing_scores

ESCALATE_TO = ("next", "strongest")


@dataclass(frozen=True)
class PolicyConfig:
    """How the threshold is chosen and how a policy is scored (YAML: conf/router/ `policy`).

    target_share: quality target as a share of strong-only quality (used when
        cost_budget is null). cost_budget: mean USD per prompt; set: best quality
        within it. success_cutoff: a score below it is a failure (escalation).
    escalate: count escalation while choosing and scoring; escalate_to: "next" or
        "strongest". max_thresholds: thresholds swept at most. rule: "margin" or
        "absolute" (module docstring). quality_floor: an absolute mean-quality floor
        (the `router.objective` of kind incumbent: the incumbent's calibration quality
        minus its margin); set, it replaces target_share x strong-only.
    """

    target_share: float = 0.95
    cost_budget: float | None = None
    success_cutoff: float = 0.5
    escalate: bool = True
    escalate_to: str = "next"
    max_thresholds: int = 512
    rule: str = "margin"
    quality_floor: float | None = None  # absolute quality floor; set: wins over target_share

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not 0.0 < float(self.target_share) <= 1.0:
            _fail(name, "target_share", self.target_share, "must be in (0, 1]")
        if self.cost_budget is not None and not float(self.cost_budget) >= 0:
            _fail(name, "cost_budget", self.cost_budget, "must be >= 0 or null")
        if not 0.0 < float(self.success_cutoff) <= 1.0:
            _fail(name, "success_cutoff", self.success_cutoff, "must be in (0, 1]")
        if not isinstance(self.escalate, bool):
            _fail(name, "escalate", self.escalate, "must be a bool")
        if self.escalate_to not in ESCALATE_TO:
            _fail(name, "escalate_to", self.escalate_to, f"must be one of {ESCALATE_TO}")
        if self.rule not in RULES:
            _fail(name, "rule", self.rule, f"must be one of {RULES}")
        if isinstance(self.max_thresholds, bool) or not isinstance(self.max_thresholds, int) \
                or self.max_thresholds < 2:
            _fail(name, "max_thresholds", self.max_thresholds, "must be an integer >= 2")


def _tables(score: np.ndarray, cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s, c = np.asarray(score, np.float64), np.asarray(cost, np.float64)
    if s.ndim != 2 or s.shape != c.shape or s.shape[1] < 1:
        raise ValueError(f"score {s.shape} and cost {c.shape} must be the same (n, K)")
    if not (np.isfinite(s).all() and np.isfinite(c).all()):
        raise ValueError("score and cost must be finite (full-information tables)")
    return s, c


def strongest_column(score: np.ndarray, cost: np.ndarray | None = None) -> int:
    """Column with the best mean score (ties: the cheaper by mean cost, then the lower index)."""
    s = np.asarray(score, np.float64)
    q = s.mean(axis=0)
    c = np.zeros_like(q) if cost is None else np.asarray(cost, np.float64).mean(axis=0)
    return int(np.lexsort((np.arange(len(q)), c, -q))[0])


class ThresholdPolicy:
    """Route to the cheapest candidate whose routing score clears `threshold`, else `fallback`."""

    def __init__(self, threshold: float, *, fallback: int = -1, rule: str = "absolute") -> None:
        self.threshold = threshold
        self.fallback = fallback
        self.rule = rule

    def choose(self, prob: np.ndarray) -> np.ndarray:
        """(n,) column per prompt from predicted success prob (n, K)."""
        return choose_by_threshold(prob, float(self.threshold), fallback=self.fallback,
                                   rule=self.rule)


def escalated_outcome(actions: np.ndarray, score: np.ndarray, cost: np.ndarray, *,
                      escalate: bool = True, success_cutoff: float = 0.5,
                      escalate_to: str = "next", fallback: int = -1) -> dict[str, np.ndarray]:
    """Per-prompt outcome of first choices `actions` ((n,) or (T, n)) under the rule above;
    `fallback` is the strongest column (default the last).

    Returns arrays shaped like `actions`: quality, cost, final (last column called),
    calls (number of calls), escalated (bool).
    """
    s, c = _tables(score, cost)
    a = np.asarray(actions, np.int64)
    k = s.shape[1]
    if a.shape[-1] != len(s) or (a < 0).any() or (a >= k).any():
        raise ValueError(f"actions {a.shape} must index columns 0..{k - 1} of {len(s)} prompts")
    if escalate_to not in ESCALATE_TO:
        raise ValueError(f"escalate_to={escalate_to!r}: must be one of {ESCALATE_TO}")
    fallback = int(fallback) % k
    rows = np.broadcast_to(np.arange(len(s)), a.shape)
    cur, paid = a.copy(), c[rows, a].copy()
    calls = np.ones(a.shape, np.int64)
    if escalate:
        for _ in range(k - 1):
            fail = (cur != fallback) & (s[rows, cur] < success_cutoff)
            if not fail.any():
                break
            step = np.where(cur < fallback, cur + 1, fallback) if escalate_to == "next" else fallback
            cur = np.where(fail, step, cur)
            paid = paid + np.where(fail, c[rows, cur], 0.0)
            calls = calls + fail
    return {"quality": s[rows, cur], "cost": paid, "final": cur, "calls": calls,
            "escalated": calls > 1}


def evaluate(actions: np.ndarray, score: np.ndarray, cost: np.ndarray, *, escalate: bool = True,
             success_cutoff: float = 0.5, escalate_to: str = "next",
             fallback: int = -1) -> dict[str, float]:
    """Mean quality, cost (USD per prompt), strong_share (first calls to the strongest),
    strong_call_share (prompts that called the strongest at all), escalation_rate,
    calls_per_prompt, n. Full-information S, C (n, K); actions (n,)."""
    out = escalated_outcome(actions, score, cost, escalate=escalate, fallback=fallback,
                            success_cutoff=success_cutoff, escalate_to=escalate_to)
    fallback = int(fallback) % np.asarray(score).shape[1]
    a = np.asarray(actions)
    return {"quality": float(out["quality"].mean()), "cost": float(out["cost"].mean()),
            "strong_share": float((a == fallback).mean()),
            "strong_call_share": float(((a == fallback) | (out["final"] == fallback)).mean()),
            "escalation_rate": float(out["escalated"].mean()),
            "calls_per_prompt": float(out["calls"].mean()), "n": int(len(a))}


@dataclass(frozen=True)
class PolicyCurve:
    """A threshold sweep, arrays (T,) sorted by threshold (strong_share non-decreasing)."""

    threshold: np.ndarray
    strong_share: np.ndarray
    quality: np.ndarray
    cost: np.ndarray
    escalation_rate: np.ndarray
    strong_quality: float
    strong_cost: float
    weak_quality: float

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({"threshold": self.threshold, "strong_share": self.strong_share,
                             "quality": self.quality, "cost": self.cost,
                             "escalation_rate": self.escalation_rate})


def sweep_thresholds(prob: np.ndarray, max_thresholds: int = 512) -> np.ndarray:
    """Distinct values of the routing scores (or that many quantiles) plus -inf and +inf, sorted."""
    p = np.asarray(prob, np.float64).ravel()
    vals = np.unique(p)
    if len(vals) > max_thresholds:
        vals = np.unique(np.quantile(p, np.linspace(0.0, 1.0, max_thresholds), method="lower"))
    return np.concatenate([[-np.inf], vals, [np.inf]])


def threshold_curve(prob: np.ndarray, score: np.ndarray, cost: np.ndarray,
                    thresholds: np.ndarray | None = None, *, escalate: bool = False,
                    success_cutoff: float = 0.5, escalate_to: str = "next",
                    max_thresholds: int = 512, chunk: int = 64, rule: str = "absolute",
                    fallback: int = -1) -> PolicyCurve:
    """Cost/quality curve of any scorer prob (n, K) over full-information S, C (n, K).

    Default `escalate=False` is RouteLLM's accounting (metrics.py); True adds the
    escalation rule of this module. `fallback`: the strongest column, the fallback.
    Anchors: strong-only (`fallback`) and cheap-only (column 0) mean quality,
    strong-only mean cost.
    """
    s, c = _tables(score, cost)
    p = np.asarray(prob, np.float64)
    if p.shape != s.shape:
        raise ValueError(f"prob {p.shape} must match score {s.shape}")
    q = routing_scores(p, rule)
    fallback = int(fallback) % s.shape[1]
    t = np.sort(sweep_thresholds(q, max_thresholds) if thresholds is None
                else np.asarray(thresholds, np.float64))
    parts: list[np.ndarray] = []
    for j in range(0, len(t), chunk):  # (chunk, n, K) booleans at a time
        a = choose_by_threshold(q, t[j:j + chunk], fallback=fallback)
        out = escalated_outcome(a, s, c, escalate=escalate, success_cutoff=success_cutoff,
                                escalate_to=escalate_to, fallback=fallback)
        parts.append(np.stack([(a == fallback).mean(axis=1), out["quality"].mean(axis=1),
                               out["cost"].mean(axis=1), out["escalated"].mean(axis=1)]))
    share, quality, mean_cost, esc = np.concatenate(parts, axis=1)
    return PolicyCurve(t, share, quality, mean_cost, esc, float(s[:, fallback].mean()),
                       float(c[:, fallback].mean()), float(s[:, 0].mean()))


@dataclass(frozen=True)
class ThresholdChoice:
    """The chosen operating point on the calibration split and the curve it came from."""

    threshold: float
    quality: float
    cost: float
    strong_share: float
    met: bool
    goal: str
    curve: PolicyCurve
    rule: str = "absolute"
    fallback: int = -1

    def policy(self) -> ThresholdPolicy:
        return ThresholdPolicy(self.threshold, fallback=self.fallback, rule=self.rule)

    def choose(self, prob: np.ndarray) -> np.ndarray:
        """(n,) columns of the chosen operating point for predicted success prob (n, K)."""
        return self.policy().choose(prob)

    def summary(self) -> dict:
        return {"threshold": self.threshold, "rule": self.rule, "fallback": self.fallback,
                "quality": self.quality, "cost": self.cost,
                "strong_share": self.strong_share, "met": self.met, "goal": self.goal,
                "strong_quality": self.curve.strong_quality, "strong_cost": self.curve.strong_cost}


def select_threshold(prob: np.ndarray, score: np.ndarray, cost: np.ndarray,
                     config: PolicyConfig | None = None) -> ThresholdChoice:
    """Pick the threshold on calibration tables (rule in the module docstring)."""
    cfg = config or PolicyConfig()
    fallback = strongest_column(score, cost)
    curve = threshold_curve(prob, score, cost, escalate=cfg.escalate,
                            success_cutoff=cfg.success_cutoff, escalate_to=cfg.escalate_to,
                            max_thresholds=cfg.max_thresholds, rule=cfg.rule, fallback=fallback)
    q, cst, t = curve.quality, curve.cost, curve.threshold
    if cfg.cost_budget is None:
        floor = (cfg.target_share * curve.strong_quality if cfg.quality_floor is None
                 else float(cfg.quality_floor))
        ok = q >= floor - 1e-12
        goal = (f"quality >= {cfg.target_share:g} x strong-only ({floor:.6g})"
                if cfg.quality_floor is None else f"quality >= {floor:.6g}")
        order = np.lexsort((t, -q, cst))  # cheapest, then better, then lower threshold
    else:
        ok = cst <= cfg.cost_budget + 1e-15
        goal = f"best quality with cost <= {cfg.cost_budget:g}"
        order = np.lexsort((t, cst, -q))  # better, then cheaper, then lower threshold
    met = bool(ok.any())
    if met:
        j = int(order[ok[order]][0])
    elif cfg.cost_budget is not None:  # a budget below cheap-only's cost
        j = int(np.lexsort((-q, cst))[0])
    else:  # an absolute floor above every point (the incumbent beats strong-only)
        j = int(np.lexsort((cst, -q))[0])
    return ThresholdChoice(float(t[j]), float(q[j]), float(cst[j]),
                           float(curve.strong_share[j]), met, goal, curve, cfg.rule, fallback)
