"""The routing rule: predicted success per candidate -> the chosen column (numpy only).

One implementation, used by training (`replaylab.router.policy`, every curve,
threshold and reported decision) and by serving (`replaylab.runtime.Router`),
so a decision reported by training is the decision served for the same
probabilities, by construction. Everything is float64: the head's float32
probabilities are widened exactly, and the margin and the comparison with the
threshold are done in float64 on both sides (a float32 subtraction, or a
threshold rounded to float32, would flip prompts that sit on the threshold).

Rules (`rule`):
  absolute  q_k = p_k                                   (success >= threshold)
  margin    q_k = p_k - max_{j != k} p_j                (success minus the best OTHER
                                                         candidate's; ties give 0)
Choice: the cheapest column (lowest index; columns are cheapest first) whose
q_k >= threshold, else `fallback` (the strongest candidate on calibration).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

RULES = ("margin", "absolute")


def routing_scores(prob: np.ndarray, rule: str = "absolute") -> np.ndarray:
    """(n, K) routing scores q (float64) of predicted success p under `rule`."""
    p = np.asarray(prob, np.float64)
    if p.ndim != 2:
        raise ValueError(f"prob must be (n, K), got shape {p.shape}")
    if rule not in RULES:
        raise ValueError(f"rule={rule!r}: must be one of {RULES}")
    if rule == "absolute" or p.shape[1] < 2:
        return p
    two = -np.partition(-p, 1, axis=1)[:, :2]  # best and second best per row
    best_other = np.where(p >= two[:, :1], two[:, 1:2], two[:, :1])
    return p - best_other


def choose_by_threshold(prob: np.ndarray, threshold: float | np.ndarray, *,
                        fallback: int = -1, rule: str = "absolute") -> np.ndarray:
    # `fallback` is the one name of that column (its index) in training and serving (the
    # summary's and RouterRun's `fallback`, the artifact's `fallback_candidate` by name; it
    # was also `top`, `_top`, `fallback_index`): it names what the column is for, the route
    # when nothing clears the threshold; the strongest on calibration is only its default.
    """Cheapest column whose routing score clears `threshold`, else `fallback` (default the
    last). prob (n, K) predicted success; threshold a scalar -> (n,) int64, or (T,) -> (T, n)."""
    q = routing_scores(prob, rule)
    fallback = int(fallback) % q.shape[1]
    t = np.asarray(threshold, np.float64)
    passes = q[None, :, :] >= t.reshape(-1, 1, 1)  # (T, n, K)
    out = np.where(passes.any(axis=2), passes.argmax(axis=2), fallback).astype(np.int64)
    return out[0] if t.ndim == 0 else out


def decision_margin(prob: np.ndarray, threshold: float, *, fallback: int = -1,
                    rule: str = "absolute") -> np.ndarray:
    """(n,) float64 distance of each row's decision from flipping: min over the columns up to
    and including the chosen one of |q_k - threshold|. A row whose margin is below the
    probability error of another machine's kernels may be routed differently there."""
    q = routing_scores(prob, rule)
    chosen = choose_by_threshold(prob, threshold, fallback=fallback, rule=rule)
    gap = np.abs(q - float(threshold))
    k = q.shape[1]
    # columns cheaper than the choice (they failed) and the choice itself (it passed); when
    # nothing passed (fallback) every column failed: all of them count
    upto = np.where(np.any(q >= float(threshold), axis=1), chosen, k - 1)
    mask = np.arange(k)[None, :] <= upto[:, None]
    return np.where(mask, gap, np.inf).min(axis=1)


def choose_one(prob: Sequence[float], threshold: float, *, fallback: int = -1,
               rule: str = "absolute") -> int:
    """`choose_by_threshold` for one row, in plain Python floats (the serving hot path:
    ~1 µs instead of ~15 µs of small numpy calls). The same float64 arithmetic: each q_k
    is p_k or p_k minus the best other p_j, compared with `threshold` as a double, so the
    choice is the array version's, bit for bit (a test checks it on ties and random rows)."""
    if rule not in RULES:
        raise ValueError(f"rule={rule!r}: must be one of {RULES}")
    p = [float(x) for x in prob]
    k = len(p)
    t = float(threshold)
    if rule == "margin" and k >= 2:
        # best and second best values (a tie for the best: second = best)
        best = max(p)
        rest = p.copy()
        rest.remove(best)
        second = max(rest)
        q = [x - (second if x >= best else best) for x in p]
    else:
        q = p
    for j, v in enumerate(q):
        if v >= t:
            return j
    return int(fallback) % k
