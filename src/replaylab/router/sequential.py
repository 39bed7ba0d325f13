"""A receipts gate that stays valid when it is re-run on a growing ledger (issue 45 item 4).

The loop re-runs the receipts gate every round on more data. A fixed-level interval
judged at every look says GO on a router that is truly no better more often than its
level says: each look is another chance to be wrong. Two tools keep the false-GO rate
at its nominal `alpha` over all looks:

1. A betting confidence bound (Waudby-Smith & Ramdas, "Estimating means of bounded
   random variables by betting", JRSS-B 2024; for off-policy values, Waudby-Smith, Wu,
   Ramdas, Karampatziakis & Mineiro, "Anytime-valid off-policy inference for contextual
   bandits", 2022). For x_i >= 0 with mean mu, in a fixed order (sessions by opening
   time), the capital K_t(m) = prod_{i<=t} (1 + lambda_i (x_i - m)), lambda_i in
   [0, c / m] chosen from x_1..x_{i-1} only, is a non-negative martingale when mu = m
   and grows when mu > m; by Ville's inequality P(exists t: K_t(mu) >= 1/alpha) <= alpha,
   so L = inf{m : max_t K_t(m) < 1/alpha} is a lower bound on mu that holds at every t
   at once (a confidence sequence), with no bound above on x needed. The bets are
   predictable plug-ins (WSR's "PrPl"): lambda_t = sqrt(2 log(1/alpha) / (sigma_{t-1}^2
   t log(1 + t))) for a bound at every t at once, or sqrt(2 log(1/alpha) / (sigma_{t-1}^2
   n)) tuned for a look of n rows (still valid at every t, tightest at n: the width of an
   empirical-Bernstein interval, ~sigma sqrt(2 log(1/alpha) / n)); capped at c / m.
2. Alpha spending across looks (Lan & DeMets, Biometrika 1983): look k of `looks`
   planned spends alpha*(k / looks) - alpha*((k - 1) / looks) of the total, with the
   O'Brien-Fleming-type alpha*(t) = 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t)) (little early,
   most at the last look) or the Pocock-type alpha*(t) = alpha log(1 + (e - 1) t). The
   look's interval is the betting bound at that look's alpha. Whatever the looks share
   (the test window moves with the ledger, the candidate is retrained), the chance that
   ANY look says a false GO is at most the sum of the looks' alphas = alpha (union
   bound), because the betting bound is valid at any fixed size too.

The paired differences (served - logging, per opening decision, IPS): with w = pi(a | x)
/ p the importance weight of the served router (0 or 1 / p for a deterministic router)
and r in [0, s] (quality: s = 1; cost per call: s = the largest logged cost), the terms
D = (w - 1) r have mean d = V(served) - V(logging) (IPS is unbiased where the logging
policy explores every candidate) and lie in [-s, (w_max - 1) s], w_max = 1 / the
smallest logged propensity. The lower end of d is a betting bound on D + s >= 0, the
upper end one on (w_max - 1) s - D >= 0: the gate's "quality lower" uses the first
(its range below is 1, so the bets are rarely capped), "cost upper" the second. DR's
terms are not bounded by constants the data can know, so the sequential bounds are IPS's.

Written here, not taken from a library: `confseq` (Howard, Waudby-Smith et al.) ships
only as a source build with a C++ extension that needs Boost, and its betting
sequences assume observations in [0, 1]; importance-weighted terms have a range set by
the smallest propensity, and the lower bound needs none above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from replaylab.config import fail_field

KINDS = ("none", "spending")
SPENDING = ("obrien_fleming", "pocock")
BET_CAP = 0.5  # c: lambda <= c / m keeps every factor of the capital >= 1 - c > 0 (WSR)


@dataclass(frozen=True)
class SequentialConfig:
    """How the receipts gate keeps its false-GO rate under repeated looks (YAML:
    `router.sequential`).

    kind: `none` (one look: the session-bootstrap interval at router.receipts.level) or
        `spending` (alpha spending across looks with the betting bound, module doc).
    alpha: the false-GO probability allowed over ALL looks together (one-sided, per
        criterion of the gate).
    look: this run's look, 1 for the first run of the gate on this candidate's ledger;
        recorded in the summary. looks: the looks planned; `spending` spreads alpha over
        them and a look past the plan has no alpha left (it cannot say GO).
    spending: obrien_fleming (default: keeps alpha for the later, larger looks) or pocock.
    """

    kind: str = "none"
    alpha: float = 0.05
    look: int = 1
    looks: int = 5
    spending: str = "obrien_fleming"

    def __post_init__(self) -> None:
        name = type(self).__name__
        if self.kind not in KINDS:
            fail_field(name, "kind", self.kind, f"must be one of {KINDS}")
        if self.spending not in SPENDING:
            fail_field(name, "spending", self.spending, f"must be one of {SPENDING}")
        if not 0.0 < float(self.alpha) < 0.5:
            fail_field(name, "alpha", self.alpha, "must be in (0, 0.5)")
        for key in ("look", "looks"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                fail_field(name, key, v, "must be an integer >= 1")


def spent(t: float, alpha: float, spending: str) -> float:
    """alpha*(t): the share of `alpha` spent by information fraction t in [0, 1]."""
    t = min(max(float(t), 0.0), 1.0)
    if t <= 0.0:
        return 0.0
    if spending == "pocock":
        return float(alpha * math.log1p((math.e - 1.0) * t))
    # here, not at import: composing a config imports this module (SequentialConfig) and
    # scipy.stats costs ~0.5-2 s of every `python -m ...` start-up
    from scipy.stats import norm

    return float(2.0 - 2.0 * norm.cdf(norm.ppf(1.0 - alpha / 2.0) / math.sqrt(t)))


def look_alpha(cfg: SequentialConfig) -> dict:
    """The alpha of look `cfg.look` (information fraction look / looks) and what the run
    records: {"look", "looks", "alpha", "spending", "spent_before", "spent", "alpha_look"}."""
    before = spent((cfg.look - 1) / cfg.looks, cfg.alpha, cfg.spending)
    upto = spent(cfg.look / cfg.looks, cfg.alpha, cfg.spending)
    return {"look": int(cfg.look), "looks": int(cfg.looks), "alpha": float(cfg.alpha),
            "spending": cfg.spending, "spent_before": before, "spent": upto,
            "alpha_look": max(upto - before, 0.0)}


def _log_capital_max(x: np.ndarray, lam: np.ndarray, m: float) -> float:
    """max_t log K_t(m) of the betting capital (module doc, 1) for a candidate mean m > 0."""
    return float(np.cumsum(np.log1p(np.minimum(lam, BET_CAP / m) * (x - m))).max())


def betting_lower_bound(x: np.ndarray, alpha: float, *, floor: float = 0.0,
                        prior_var: float = 1.0, horizon: int | None = None,
                        tol: float = 1e-7) -> float:
    """Lower confidence bound on E[x] for x >= floor, in the given order (module doc, 1).

    The bets are predictable: lambda_t from the mean and variance of x_1..x_{t-1} (one
    prior point of variance `prior_var`, data-free). horizon=None: the anytime bets
    sqrt(2 log(1/alpha) / (var t log(1 + t))), a bound valid at every prefix at once;
    horizon=n: bets sqrt(2 log(1/alpha) / (var n)) tuned for a look of n rows (still
    valid at every prefix, tightest at n). Every factor 1 + min(lambda, c / m) (x - m)
    decreases in m, so the rejected means {m : max_t K_t(m) >= 1/alpha} are an interval
    and L is found by bisection to `tol` (reported at the rejected end: rounded down).
    alpha <= 0 (no alpha left) gives `floor`."""
    x = np.asarray(x, dtype=float) - float(floor)
    if x.ndim != 1 or (x < -1e-12).any() or not np.isfinite(x).all():
        raise ValueError("betting_lower_bound: x must be finite and >= floor")
    x = np.maximum(x, 0.0)
    n = len(x)
    if n == 0 or alpha <= 0.0 or not x.any():
        return float(floor)
    t = np.arange(1, n + 1, dtype=float)
    csum = np.cumsum(x)
    mu_prev = np.concatenate([[0.0], csum[:-1] / t[:-1]])  # mean of x_1..x_{t-1}
    dev = np.concatenate([[0.0], np.cumsum((x - mu_prev) ** 2)[:-1]])
    var_prev = (float(prior_var) + dev) / t
    level = math.log(1.0 / alpha)
    per = t * np.log1p(t) if horizon is None else np.full(n, float(max(horizon, 1)))
    lam = np.sqrt(2.0 * level / (var_prev * per))
    lo, hi = 0.0, 2.0 * max(float(x.mean()), tol)
    while _log_capital_max(x, lam, hi) >= level:  # the bound is above hi: widen
        lo, hi = hi, 2.0 * hi
    if _log_capital_max(x, lam, tol) < level:
        return float(floor)
    lo = max(lo, tol)
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if _log_capital_max(x, lam, mid) >= level:
            lo = mid
        else:
            hi = mid
    return float(lo + floor)


def paired_ips_interval(weight: np.ndarray, reward: np.ndarray, alpha: float,
                        scale: float = 1.0, max_weight: float | None = None,
                        horizon: int | None = None) -> dict:
    """Interval for d = E[w r] - E[r] (served - logging, IPS), the rows' terms
    D = (w - 1) r with r in [0, scale] and w <= max_weight (default: the largest weight
    seen; the logged propensities' floor is the design's), so D in [-scale, (max_weight -
    1) scale]: each end a betting bound at one-sided `alpha`. Returns {"estimate", "ci"}."""
    w, r = np.asarray(weight, float), np.asarray(reward, float)
    s = float(scale)
    if s <= 0 or (r < 0).any() or (r > s * (1 + 1e-9)).any() or (w < 0).any():
        raise ValueError(f"paired_ips_interval: rewards must lie in [0, {s:g}], weights >= 0")
    d = (w - 1.0) * np.minimum(r, s)
    top = (max(float(max_weight if max_weight is not None else w.max(initial=1.0)), 1.0)
           - 1.0) * s
    prior = s * s / 4.0  # the variance of a reward in [0, s] at most: data-free
    lo = betting_lower_bound(d, alpha, floor=-s, prior_var=prior, horizon=horizon)
    hi = -betting_lower_bound(-d, alpha, floor=-top, prior_var=prior, horizon=horizon)
    est = float(d.mean()) if len(d) else float("nan")
    return {"estimate": est, "ci": [float(lo), float(hi)]}


def sequential_diffs(weight: np.ndarray, quality: np.ndarray, cost: np.ndarray,
                     cfg: SequentialConfig, max_weight: float | None = None) -> dict:
    """The receipts gate's two paired differences (served - logging: opening quality in
    [0, 1] and cost per opening call) as `spending` intervals at this look's alpha, rows in
    opening-time order, bets tuned to this look's size; plus the record the run keeps
    (`look_alpha`, the sequence used). max_weight: 1 / the smallest logging propensity of
    the design (default: the largest weight seen)."""
    rec = look_alpha(cfg)
    a = rec["alpha_look"]
    c = np.asarray(cost, float)
    c_max = float(c.max()) if len(c) and c.max() > 0 else 1.0
    n = len(c)
    out = {"quality": {**paired_ips_interval(weight, quality, a, 1.0, max_weight, n),
                       "estimator": "ips"},
           "cost": {**paired_ips_interval(weight, c, a, c_max, max_weight, n),
                    "estimator": "ips"}}
    rec.update(kind=cfg.kind, cost_scale_usd=c_max, estimator="ips",
               sequence="betting confidence bound (Waudby-Smith & Ramdas, predictable bets "
                        f"tuned to the look's {n} rows) at one-sided alpha {a:.3g} per "
                        "criterion, alpha spent over the looks (Lan-DeMets "
                        f"{cfg.spending})")
    out["record"] = rec
    return out


SEQUENTIAL_VARIANT = "ips@sequential"


def sequential_evidence(ope: dict, weight: np.ndarray, quality: np.ndarray, cost: np.ndarray,
                        opening_ms: np.ndarray, cfg: SequentialConfig) -> dict:
    """The receipts OPE with the gate's estimator switched to the look's sequential
    intervals (kind `spending`; `none` returns `ope` as is).

    weight, quality, cost, opening_ms: (n,) per test decision (served router's importance
    weight, opening quality, cost per opening call, opening time); the rows are judged in
    opening-time order. Adds the variant `ips@sequential` (the chosen variant's figures,
    with the paired quality and cost differences replaced by `sequential_diffs`) to
    ope["evidence"]["variants"], makes it the one the gate reads (`chosen`), and records
    ope["sequential"] (look, alpha spent, the sequence). The other variants keep their
    one-look intervals: the report's 'would flip it' compares against them."""
    if cfg.kind == "none":
        return ope
    order = np.lexsort((np.arange(len(opening_ms)), np.asarray(opening_ms)))
    w = np.asarray(weight, float)[order]
    seq = sequential_diffs(w, np.asarray(quality, float)[order],
                           np.asarray(cost, float)[order], cfg,
                           max_weight=float(w.max(initial=1.0)))
    evid = ope["evidence"]
    base = evid["variants"][evid["chosen"]]
    evid["variants"][SEQUENTIAL_VARIANT] = {
        **base, "estimator": "ips", "clip_level": "sequential", "clip": None,
        "diff_quality": {"estimate": seq["quality"]["estimate"], "ci": seq["quality"]["ci"]},
        "diff_cost": {"estimate": seq["cost"]["estimate"], "ci": seq["cost"]["ci"]}}
    evid["chosen"] = SEQUENTIAL_VARIANT
    ope["sequential"] = seq["record"]
    return ope
