"""Off-policy value of a routing policy from a receipts ledger: IPS, SNIPS, DR.

Data. One logged decision per binding chosen by the logging policy (bandit rows
with policy_decision; escalations are consequences, not decisions): context x_i,
action a_i, reward r_i, logged propensity p_i = pi_0(a_i | x_i) > 0, session g_i.
A target policy is a row-stochastic matrix pi (n, K) of probabilities
pi(a | x_i); a deterministic router is its one-hot (`policy_matrix`). The value
of pi is V(pi) = E_x sum_a pi(a | x) E[r | x, a]; r is the opening quality for
the quality value, and any per-decision outcome (call cost, session cost) for
the cost value.

Estimators (Dudik, Langford & Li, "Doubly Robust Policy Evaluation and
Learning", ICML 2011; Swaminathan & Joachims, "The Self-Normalized Estimator for
Counterfactual Learning", NeurIPS 2015), with w_i = pi(a_i | x_i) / p_i:

    IPS   = (1/n) sum_i w_i r_i                                  unbiased if p_i > 0 wherever pi > 0
    SNIPS = sum_i w_i r_i / sum_i w_i                            biased O(1/n), lower variance;
                                                                 E[w] = 1, so sum w / n ~ 1 checks p
    DR    = (1/n) sum_i [ sum_a pi(a|x_i) q(x_i, a) + w_i (r_i - q(x_i, a_i)) ]
                                                                 unbiased if p is right OR q is

q(x, a) is a reward model (n, K), e.g. the learned router's predicted quality;
it must not be fitted on the rows it evaluates (cross-fit it), else DR inherits
its overfit. `max_weight` clips w (biased, lower variance; off by default).

Intervals. A session's decisions share a user and a prompt, so they are not
independent: the bootstrap resamples SESSIONS with replacement (a cluster
bootstrap; Field & Welsh, "Bootstrapping clustered data", JRSS-B 2007) and
reports percentile intervals. All three estimators are ratios of sums, so a
replicate is a vector of row multiplicities c_b and every replicate of every
estimator is one matrix product: IPS_b = (c_b . w r) / (c_b . 1). The bootstrap
and the interval are `replaylab.stats.session_bootstrap` and `percentile_interval`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from replaylab.router.config import RouterEvalConfig
from replaylab.router.replay import Label
from replaylab.stats import percentile_interval, session_bootstrap

ESTIMATORS = ("ips", "snips", "dr")


@dataclass(frozen=True)
class LoggedDecisions:
    """Logged bandit decisions as arrays over `candidates` (n rows).

    action: (n,) column index; reward, propensity: (n,); session: (n,) int codes;
    context_key: (n,) the rows' context keys (to align q-hat and target policies).
    """

    candidates: tuple[str, ...]
    action: np.ndarray
    reward: np.ndarray
    propensity: np.ndarray
    session: np.ndarray
    context_key: np.ndarray

    @property
    def n(self) -> int:
        return len(self.action)


def logged_decisions(rows: pd.DataFrame, candidates: tuple[str, ...] | list[str],
                     reward: str = Label.REWARD) -> LoggedDecisions:
    """Bandit rows (exploration.bandit_rows) -> the logging policy's decisions as arrays.

    reward: the column to evaluate (`reward` = opening quality, `cost`,
    `session_cost`, ...). Escalation and replay rows are left out (not decisions).
    """
    cands = tuple(candidates)
    dec = rows[rows[Label.POLICY_DECISION].astype(bool)
               & (rows[Label.LABEL_SOURCE] != "replay")]
    unknown = sorted(set(dec[Label.CANDIDATE]) - set(cands))
    if unknown:
        raise ValueError(f"logged_decisions: actions {unknown} are not among {list(cands)}")
    r = pd.to_numeric(dec[reward], errors="coerce").to_numpy(float)
    p = pd.to_numeric(dec[Label.PROPENSITY], errors="coerce").to_numpy(float)
    if not np.isfinite(r).all():
        raise ValueError(f"logged_decisions: {int((~np.isfinite(r)).sum())} decisions have no "
                         f"{reward!r} (unknown outcome); filter them and say so before OPE")
    if not ((p > 0) & (p <= 1)).all():
        raise ValueError("logged_decisions: propensities must be in (0, 1]; "
                         f"{int((~((p > 0) & (p <= 1))).sum())} are not")
    lookup = {c: k for k, c in enumerate(cands)}
    return LoggedDecisions(cands, dec[Label.CANDIDATE].map(lookup).to_numpy(np.int64), r, p,
                           pd.factorize(dec[Label.SESSION_ID])[0],
                           dec[Label.CONTEXT_KEY].to_numpy())


def policy_matrix(choice: np.ndarray, k: int) -> np.ndarray:
    """(n,) chosen column indices -> (n, K) one-hot probabilities of a deterministic policy."""
    choice = np.asarray(choice, dtype=np.int64)
    out = np.zeros((len(choice), k))
    out[np.arange(len(choice)), choice] = 1.0
    return out


def policy_value(values: np.ndarray, target: np.ndarray) -> float:
    """Truth: mean_i sum_a target[i, a] values[i, a] over full-information values (n, K)."""
    values, target = np.asarray(values, float), np.asarray(target, float)
    if values.shape != target.shape:
        raise ValueError(f"policy_value: values {values.shape} and target {target.shape} differ")
    return float((values * target).sum(axis=1).mean())


def _check_target(target: np.ndarray, b: LoggedDecisions) -> np.ndarray:
    target = np.asarray(target, float)
    if target.shape != (b.n, len(b.candidates)):
        raise ValueError(f"target policy has shape {target.shape}, expected {(b.n, len(b.candidates))}")
    if (target < 0).any() or not np.allclose(target.sum(axis=1), 1.0, atol=1e-6):
        raise ValueError("target policy rows must be probabilities summing to 1")
    return target


def importance_weights(b: LoggedDecisions, target: np.ndarray,
                       max_weight: float | None = None) -> np.ndarray:
    """(n,) w_i = pi(a_i | x_i) / p_i, clipped at max_weight when given."""
    w = _check_target(target, b)[np.arange(b.n), b.action] / b.propensity
    return np.minimum(w, max_weight) if max_weight is not None else w


def _terms(b: LoggedDecisions, target: np.ndarray, q_hat: np.ndarray | None,
           max_weight: float | None) -> dict[str, np.ndarray]:
    """Per-row terms whose (weighted) sums make each estimator: numerators and denominators."""
    w = importance_weights(b, target, max_weight)
    terms = {"wr": w * b.reward, "w": w, "one": np.ones(b.n)}
    if q_hat is not None:
        q = np.asarray(q_hat, float)
        if q.shape != target.shape:
            raise ValueError(f"q_hat has shape {q.shape}, expected {target.shape}")
        dm = (np.asarray(target, float) * q).sum(axis=1)
        terms["dr"] = dm + w * (b.reward - q[np.arange(b.n), b.action])
        terms["dm"] = dm
    return terms


def _estimates(sums: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {"ips": sums["wr"] / sums["one"], "snips": sums["wr"] / sums["w"]}
    if "dr" in sums:
        out["dr"] = sums["dr"] / sums["one"]
        out["dm"] = sums["dm"] / sums["one"]
    return out


RewardModel = np.ndarray | Callable[[LoggedDecisions], np.ndarray]


def ope_estimates(b: LoggedDecisions, target: np.ndarray, q_hat: RewardModel | None = None,
                  config: RouterEvalConfig | None = None) -> dict:
    """IPS, SNIPS (and DR, DM when q_hat is given) of `target` with session-bootstrap CIs.

    target: (n, K) aligned with `b`'s rows and candidates; q_hat: the same shape,
    or a callable mapping `b` to it (e.g. a fitted router's predicted quality). Returns
    {"ips": V, "ips-lo-95": ..., "ips-hi-95": ..., ..., plus diagnostics: n,
    sessions, mean_weight (should be ~1), max_weight, ess (effective sample
    size (sum w)^2 / sum w^2), support (share of rows with w > 0)}.
    """
    config = config or RouterEvalConfig()
    target = _check_target(target, b)
    if callable(q_hat):
        q_hat = q_hat(b)
    terms = _terms(b, target, q_hat, config.max_weight)
    point = _estimates({k: v.sum(keepdims=True) for k, v in terms.items()})
    keys = list(point)
    reps: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    stacked = np.stack([terms[k] for k in terms])  # (m, n)
    for counts in session_bootstrap(b.session, config.n_boot, config.seed):
        sums = dict(zip(terms, (counts @ stacked.T).T, strict=True))  # each (b,)
        with np.errstate(divide="ignore", invalid="ignore"):
            for k, v in _estimates(sums).items():
                reps[k].append(v)
    tag = config.level_tag
    out: dict = {}
    for k in keys:
        out[k] = float(point[k][0])
        if config.n_boot:
            lo, hi = percentile_interval(np.concatenate(reps[k]), config.level)
            out[f"{k}-lo-{tag}"], out[f"{k}-hi-{tag}"] = lo, hi
    w = terms["w"]
    out.update(n=b.n, sessions=int(len(np.unique(b.session))), mean_weight=float(w.mean()),
               max_weight=float(w.max()) if b.n else float("nan"),
               ess=float(w.sum() ** 2 / (w ** 2).sum()) if (w > 0).any() else 0.0,
               support=float((w > 0).mean()) if b.n else float("nan"))
    return out


# Low support: the estimate rests on few effective rows. ESS = (sum w)^2 / sum w^2 is the
# number of equally weighted rows the weighted estimate is worth (Kong 1992); below
# LOW_ESS, or with under LOW_SUPPORT of the rows agreeing with the target policy, an
# interval can miss the truth by far more than its width says (seen: IPS and DR both
# 0.21 under the truth at ESS 24.9 of 264 sessions).
LOW_ESS = 50.0
LOW_SUPPORT = 0.05


def clip_interval(ci: list[float], lo: float, hi: float) -> list[float]:
    """An interval's ends clipped to the feasible [lo, hi]."""
    return [float(min(max(v, lo), hi)) for v in ci]


def feasible_interval(est: dict, key: str, lo: float, hi: float, tag: str) -> dict:
    """{"estimate", "ci", "clipped"} of estimator `key` in `ope_estimates`' output: the
    estimate and its percentile interval clipped to the feasible [lo, hi] (an IPS value of
    a quality in [0, 1] can exceed 1; no policy can), the interval widened to the estimate
    where float rounding of a degenerate bootstrap leaves it a few ulps outside."""
    raw = float(est[key])
    v = float(min(max(raw, lo), hi))
    raw_ci = [float(est[f"{key}-lo-{tag}"]), float(est[f"{key}-hi-{tag}"])]
    a, b = clip_interval(raw_ci, lo, hi)
    return {"estimate": v, "ci": [min(a, v), max(b, v)],
            "clipped": bool(v != raw or [a, b] != raw_ci)}


def covers(estimate: dict | None, value: float) -> bool | None:
    """Whether an estimate's interval (`{"ci": [lo, hi]}`) covers `value`, to float rounding:
    a degenerate interval (every replicate equal, e.g. all sessions routed to one candidate
    of fixed cost) and its truth differ by float rounding only. None when the interval or
    the value is missing (no support)."""
    ci = (estimate or {}).get("ci") or [None, None]
    if ci[0] is None or ci[1] is None or not np.isfinite(value):
        return None
    tol = 1e-12 * max(1.0, abs(value))
    return bool(ci[0] - tol <= value <= ci[1] + tol)


def support_check(est: dict) -> list[str]:
    """The low-support warnings (empty: none) of `ope_estimates`' ess and support."""
    warn = []
    n = int(est.get("sessions", est.get("n", 0)))
    if float(est.get("ess", 0.0)) < LOW_ESS:
        warn.append(f"low support: effective sample size {float(est.get('ess', 0.0)):.1f} of "
                    f"{n} sessions < {LOW_ESS:g} (the OPE interval may miss by more than "
                    "its width)")
    if float(est.get("support", 0.0)) < LOW_SUPPORT:
        warn.append(f"low support: only {float(est.get('support', 0.0)):.3f} of logged "
                    "decisions agree with the evaluated router")
    return warn


def paired_difference(b: LoggedDecisions, target: np.ndarray, q_hat: np.ndarray | None = None,
                      config: RouterEvalConfig | None = None, estimator: str = "dr") -> dict:
    """V(target) - V(logging), paired on the same logged rows, with a session-bootstrap CI.

    The logging policy's value is its on-policy mean reward (1/n) sum_i r_i, so the
    difference is the mean of the per-row terms t_i - r_i, with t_i the IPS term w_i r_i
    or (estimator="dr", q_hat needed) the DR term; every replicate resamples sessions,
    keeping each row's two terms together. Returns {"estimate", "ci", "estimator"}.
    """
    config = config or RouterEvalConfig()
    if estimator not in ("ips", "dr"):
        raise ValueError(f"paired_difference: estimator={estimator!r}: ips or dr")
    if estimator == "dr" and q_hat is None:
        raise ValueError("paired_difference: estimator='dr' needs q_hat")
    terms = _terms(b, _check_target(target, b), q_hat if estimator == "dr" else None,
                   config.max_weight)
    d = (terms["dr"] if estimator == "dr" else terms["wr"]) - b.reward
    reps = [(c @ d) / c.sum(axis=1) for c in session_bootstrap(b.session, config.n_boot,
                                                               config.seed)]
    lo, hi = percentile_interval(np.concatenate(reps) if reps else np.zeros(0), config.level)
    return {"estimate": float(d.mean()) if b.n else float("nan"), "ci": [float(lo), float(hi)],
            "estimator": estimator}


def on_policy_value(b: LoggedDecisions, config: RouterEvalConfig | None = None) -> dict:
    """The logging policy's own value: mean logged reward, session-bootstrap CI."""
    config = config or RouterEvalConfig()
    reps = [(c @ b.reward) / c.sum(axis=1) for c in session_bootstrap(b.session, config.n_boot,
                                                                      config.seed)]
    lo, hi = percentile_interval(np.concatenate(reps) if reps else np.zeros(0), config.level)
    return {"estimate": float(b.reward.mean()) if b.n else float("nan"),
            "ci": [float(lo), float(hi)]}


def point_values(b: LoggedDecisions, targets: np.ndarray, q_hat: np.ndarray,
                 max_weight: float | None = None) -> dict[str, np.ndarray]:
    """IPS, SNIPS and DR point estimates of T deterministic policies at once.

    targets: (T, n) chosen column per policy and row (e.g. a threshold sweep); q_hat:
    (n, K). Returns {"ips", "snips", "dr"}: (T,) each; no bootstrap (a sweep's curve)."""
    choice = np.asarray(targets, dtype=np.int64)
    q = np.asarray(q_hat, float)
    match = choice == b.action[None, :]                                   # (T, n)
    w = match / b.propensity[None, :]
    if max_weight is not None:
        w = np.minimum(w, max_weight)
    wr = w * b.reward[None, :]
    dm = np.take_along_axis(q, choice.T, axis=1).T                       # (T, n) q(x, pi(x))
    resid = b.reward - q[np.arange(b.n), b.action]                         # (n,)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"ips": wr.mean(axis=1), "snips": wr.sum(axis=1) / w.sum(axis=1),
                "dr": (dm + w * resid[None, :]).mean(axis=1)}
