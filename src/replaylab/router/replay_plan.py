"""Which offline replays would teach the router most: `replay_plan.jsonl`.

The next round's replays join train and calibration openings, and today's latest
sessions are the next round's training data, so the plan ranks the (opening
prompt, candidate) pairs of the latest sessions (calibration and test) whose
outcome is unobserved (not the logged candidate) by

    priority(i, a) = p_ia (1 - p_ia)  x  exp(-|q_ia - t| / scale)

p_ia: the served head's P(success) of candidate a on prompt i; p (1 - p) is the
Bernoulli variance of that outcome under the head, largest where the head is
least sure. q_ia: a's routing score (`runtime.routing.routing_scores`), t: the
served threshold; the second factor is 1 where a sits on the decision boundary and
falls off with its distance (scale 0.1 of a probability), so a replay that could
flip a served decision ranks before one that could not. Ties go to the later
session. The budget caps the rows; one prompt may appear with several candidates.
No prompt text is written: `prompt_id` is the opening turn's `request_id`, which
the user looks up in their own ledger, replays offline, and passes back as
outcomes-v1 rows (`data.replays`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from replaylab.config import fail_field
from replaylab.runtime.routing import routing_scores

SCALE = 0.1


@dataclass(frozen=True)
class ReplayPlanConfig:
    """budget: rows of replay_plan.jsonl (0: no plan); splits: whose openings are ranked."""

    budget: int = 200
    splits: tuple[str, ...] = ("calibration", "test")

    def __post_init__(self) -> None:
        if isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 0:
            fail_field(type(self).__name__, "budget", self.budget, "must be an integer >= 0")
        object.__setattr__(self, "splits", tuple(str(s) for s in self.splits))


def pair_priority(prob: np.ndarray, threshold: float, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """(n, K) priority p (1 - p) exp(-|q - t| / SCALE) of replaying each (prompt, candidate)
    and (n, K) its boundary gap |q - t| (module docstring). prob: the head's P(success);
    nothing else is read: the ranking cannot see an outcome it has not been given."""
    prob = np.asarray(prob, float)
    gap = np.abs(routing_scores(prob, rule) - float(threshold)) if np.isfinite(threshold) \
        else np.full_like(prob, np.inf)
    return prob * (1.0 - prob) * np.exp(-np.minimum(gap, 1e6) / SCALE), gap


def expected_gain(prob: np.ndarray, threshold: float, rule: str) -> np.ndarray:
    """(n, K) expected gain of replaying each (prompt, candidate): the value of learning
    that outcome to the routing decision on the prompt, under the head's own belief.

    With q_a(p) candidate a's routing score and t the threshold, the decision values a by
    max(q_a - t, 0) (a is served when its score clears t); the replay reveals y ~ Bernoulli(p_a)
    and sets p_a to y, so the gain is

        p_a max(q_a(p_a = 1) - t, 0) + (1 - p_a) max(q_a(p_a = 0) - t, 0) - max(q_a(p) - t, 0)

    (>= 0: the expected value of perfect information on that one score; e.g. the absolute
    rule gives t (1 - p) above the threshold, p (1 - t) below it), in routing-score units
    (success probability, or its margin over the best other candidate). A prompt's expected
    gain is the sum over the candidates replayed for it."""
    prob = np.asarray(prob, float)
    if not np.isfinite(threshold):
        return np.zeros_like(prob)
    t = float(threshold)
    now = np.maximum(routing_scores(prob, rule) - t, 0.0)
    gain = np.zeros_like(prob)
    for a in range(prob.shape[1]):
        up, down = prob.copy(), prob.copy()
        up[:, a], down[:, a] = 1.0, 0.0
        gain[:, a] = (prob[:, a] * np.maximum(routing_scores(up, rule)[:, a] - t, 0.0)
                      + (1.0 - prob[:, a]) * np.maximum(routing_scores(down, rule)[:, a] - t, 0.0)
                      - now[:, a])
    return np.maximum(gain, 0.0)  # float rounding only


def replay_plan(prob: np.ndarray, logged_action: np.ndarray, threshold: float, rule: str,
                meta: pd.DataFrame, candidates: tuple[str, ...], budget: int) -> pd.DataFrame:
    """The ranked plan (module docstring).

    prob: (n, K) served P(success) of the ranked openings; logged_action: (n,) column
    logged for each; meta: n rows with prompt_id, session_id, opening_ms. Returns at most
    `budget` rows: prompt_id, candidate, session_id, opening_ms, p_success, boundary_gap,
    priority, expected_gain (`expected_gain`), rank (1 = first)."""
    prob = np.asarray(prob, float)
    n, k = prob.shape
    if n == 0 or budget == 0:
        return pd.DataFrame(columns=["rank", "prompt_id", "candidate", "session_id",
                                     "opening_ms", "p_success", "boundary_gap", "priority",
                                     "expected_gain"])
    priority, gap = pair_priority(prob, threshold, rule)
    priority[np.arange(n), np.asarray(logged_action, np.int64)] = -np.inf  # observed already
    i, a = np.divmod(np.arange(n * k), k)
    flat = priority.ravel()
    opening = meta["opening_ms"].to_numpy(np.int64)[i]
    order = np.lexsort((-opening, -flat))
    order = order[np.isfinite(flat[order])][:budget]
    i, a = i[order], a[order]
    return pd.DataFrame({
        "rank": np.arange(1, len(order) + 1),
        "prompt_id": meta["prompt_id"].to_numpy()[i],
        "candidate": np.asarray(candidates, dtype=object)[a],
        "session_id": meta["session_id"].to_numpy()[i],
        "opening_ms": opening[order],
        "p_success": prob[i, a], "boundary_gap": gap[i, a], "priority": flat[order],
        "expected_gain": expected_gain(prob, threshold, rule)[i, a]})


def write_replay_plan(plan: pd.DataFrame, path: Path) -> Path:
    """replay_plan.jsonl: one JSON object per row, ranked."""
    path.parent.mkdir(parents=True, exist_ok=True)
    plan.to_json(path, orient="records", lines=True)
    if plan.empty:
        path.write_text("")
    return path


# Coverage strata: each category is cut into this many k-means cells of the embedding
# space (fewer when it has fewer prompts), so that a planned share cannot spend itself
# on one corner of the prompts where the round-0 head happens to sit on the boundary.
COVERAGE_CELLS = 8


def coverage_strata(embedding: np.ndarray, category: np.ndarray, seed: int,
                    cells: int = COVERAGE_CELLS) -> np.ndarray:
    """(n,) stratum id per prompt: category x k-means cell of the embedding (scikit-learn's
    KMeans, seeded; a well-kept implementation rather than a hand-written one)."""
    from sklearn.cluster import KMeans  # noqa: PLC0415 - heavy, only when planning

    emb = np.asarray(embedding, np.float64)
    codes, uniq = pd.factorize(pd.Series(np.asarray(category, dtype=object)).fillna(""))
    out = np.zeros(len(emb), np.int64)
    for c in range(len(uniq)):
        rows = np.flatnonzero(codes == c)
        n_cells = int(min(cells, max(1, len(rows) // 20)))
        if n_cells > 1:
            km = KMeans(n_clusters=n_cells, n_init=1, random_state=seed).fit(emb[rows])
            out[rows] = c * cells + km.labels_
        else:
            out[rows] = c * cells
    return out


def plan_prompts(priority: np.ndarray, n_pick: int, strata: np.ndarray | None = None,
                 seed: int = 0) -> np.ndarray:
    """Positions of the `n_pick` prompts a planned replay takes, ranked (first = best).

    priority: (n,) the prompt's value to the plan (the sum of `pair_priority` over the
    candidates not yet observed for it); strata: (n,) coverage strata (`coverage_strata`;
    None: one stratum, i.e. the top `n_pick` of the plan). Each stratum gets its share of
    `n_pick` in proportion to its size (largest remainder) and spends it on its highest
    priorities; ties are broken by a seeded draw. Reads nothing but its arguments."""
    priority = np.asarray(priority, float)
    n = len(priority)
    n_pick = int(min(max(n_pick, 0), n))
    if n_pick == 0:
        return np.zeros(0, np.int64)
    tie = np.random.default_rng(seed).random(n)
    strata = np.zeros(n, np.int64) if strata is None else pd.factorize(np.asarray(strata))[0]
    size = np.bincount(strata)
    quota = size * n_pick / n
    take = np.floor(quota).astype(np.int64)
    rest = n_pick - int(take.sum())
    if rest:
        take[np.lexsort((-size, -(quota - take)))[:rest]] += 1
    chosen = []
    for s in np.flatnonzero(take):
        rows = np.flatnonzero(strata == s)
        order = rows[np.lexsort((tie[rows], -priority[rows]))]
        chosen.append(order[:take[s]])
    picked = np.concatenate(chosen)
    return picked[np.lexsort((tie[picked], -priority[picked]))]
