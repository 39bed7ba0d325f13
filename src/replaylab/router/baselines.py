"""Baseline routers on the same splits and inputs as the learned head.

Every router follows one shape: `fit(embedding (n, d), meta, rows: TrainingRows,
n_candidates=None) -> self`, then `choose(embedding, meta=None) -> (n,)` columns,
and the scoring ones `predict_proba(embedding, meta=None) -> (n, K)` predicted
success, so `policy.ThresholdPolicy`, `threshold_curve` and `select_threshold`
apply to them as to the head. Columns are ordered cheapest first; the last is
the strongest.

- CheapOnlyRouter / StrongOnlyRouter: column 0 / column K-1 for every prompt.
- RandomRouter: the strongest with probability `strong_share`, else the
  cheapest (seeded); `matching(actions, K)` sets the share to another policy's
  strong-call rate (RouteLLM's random baseline at a matched rate). Its
  `predict_proba` is seeded uniform noise: the threshold sweep of a random scorer
  (APGR ~ 0.5).
- KnnRouter: cosine k nearest training prompts (sklearn NearestNeighbors, brute);
      p(i, a) = (sum_{j in N(i)} S_wr[j, a] + alpha prior_a) / (sum_{j in N(i)} S_w[j, a] + alpha)
  where S_wr[j, a] = sum of w r and S_w[j, a] = sum of w over prompt j's observed
  rows of candidate a (IPS weights for bandit rows, 1 for replay rows, clipped at
  max_weight), prior_a the weighted mean reward of a, alpha = prior_strength: a
  neighbourhood where a was never observed gets the prior.
- LgbmRouter: one LightGBM per candidate on the rows where it was observed,
  features [embedding, category code (categorical), standardized log1p(prompt
  tokens)], objective `cross_entropy` (takes graded rewards in [0, 1]),
  sample_weight = the rows' weights clipped at max_weight. A candidate with fewer
  than `min_rows` rows predicts its weighted mean reward (0.5 when unseen).
- OracleRouter: the per-prompt limit, needing full-information scores S (n, K):
  the cheapest candidate whose score reaches the cutoff, else the strongest. With
  0/1 scores no router reaches higher quality, and wherever a router's choice
  succeeds the oracle's is no more expensive (given columns in per-prompt cost
  order); with graded scores it is the cheapest success, not the best score.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replaylab.router.inputs import MetaEncoder, TrainingRows
from replaylab.router.policy import choose_by_threshold
from replaylab.runtime.router_head import meta_arrays


def _k(rows: TrainingRows, n_candidates: int | None) -> int:
    return int(n_candidates) if n_candidates is not None else int(rows.action.max()) + 1


def _n(embedding: Any) -> int:
    return len(embedding)


class _Constant:
    def fit(self, embedding: np.ndarray, meta: Any, rows: TrainingRows,
            n_candidates: int | None = None) -> Any:
        self.n_candidates_ = _k(rows, n_candidates)
        return self

    def with_candidates(self, k: int) -> Any:
        """Fitted without data: only K matters."""
        self.n_candidates_ = int(k)
        return self


class CheapOnlyRouter(_Constant):
    """Every prompt to column 0 (the cheapest)."""

    def choose(self, embedding: np.ndarray, meta: Any = None) -> np.ndarray:
        return np.zeros(_n(embedding), np.int64)


class StrongOnlyRouter(_Constant):
    """Every prompt to column K-1 (the strongest)."""

    def choose(self, embedding: np.ndarray, meta: Any = None) -> np.ndarray:
        return np.full(_n(embedding), self.n_candidates_ - 1, np.int64)


class RandomRouter(_Constant):
    """The strongest (column `strong`, default the last) with probability strong_share, else
    the cheapest; seeded per call."""

    def __init__(self, strong_share: float = 0.5, seed: int = 0, strong: int = -1) -> None:
        self.strong_share = strong_share
        self.seed = seed
        self.strong = strong

    @classmethod
    def matching(cls, actions: np.ndarray, n_candidates: int, seed: int = 0,
                 strong: int = -1) -> RandomRouter:
        """A random router at the strong-call rate of `actions` (n,)."""
        col = int(strong) % n_candidates
        share = float((np.asarray(actions) == col).mean())
        return cls(share, seed, col).with_candidates(n_candidates)

    def choose(self, embedding: np.ndarray, meta: Any = None) -> np.ndarray:
        if not 0.0 <= self.strong_share <= 1.0:
            raise ValueError(f"strong_share={self.strong_share!r}: must be in [0, 1]")
        u = np.random.default_rng(self.seed).random(_n(embedding))
        strong = int(self.strong) % self.n_candidates_
        return np.where(u < self.strong_share, strong, 0).astype(np.int64)

    def predict_proba(self, embedding: np.ndarray, meta: Any = None) -> np.ndarray:
        return np.random.default_rng([self.seed, 1]).random((_n(embedding), self.n_candidates_))


class _Scoring:
    threshold: float = 0.5

    def choose(self, embedding: np.ndarray, meta: Any = None) -> np.ndarray:
        """Cheapest column with predicted success >= `threshold` (attribute), else the last."""
        return choose_by_threshold(self.predict_proba(embedding, meta), self.threshold)


def _weighted_prior(rows: TrainingRows, k: int) -> np.ndarray:
    w_r = np.bincount(rows.action, rows.weight * rows.reward, minlength=k)
    w = np.bincount(rows.action, rows.weight, minlength=k)
    return np.where(w > 0, w_r / np.maximum(w, 1e-300), 0.5)


def _clip(rows: TrainingRows, max_weight: float | None) -> TrainingRows:
    if max_weight is None:
        return rows
    return TrainingRows(rows.row, rows.action, rows.reward, np.minimum(rows.weight, max_weight),
                        rows.cost)


class KnnRouter(_Scoring):
    """IPS-weighted k-nearest-neighbour success rates on embeddings (cosine)."""

    def __init__(self, n_neighbors: int = 25, weighting: str = "uniform",
                 prior_strength: float = 1.0, max_weight: float | None = 20.0,
                 threshold: float = 0.5) -> None:
        self.n_neighbors = n_neighbors
        self.weighting = weighting
        self.prior_strength = prior_strength
        self.max_weight = max_weight
        self.threshold = threshold

    def fit(self, embedding: np.ndarray, meta: Any, rows: TrainingRows,
            n_candidates: int | None = None) -> KnnRouter:
        from sklearn.neighbors import NearestNeighbors  # noqa: PLC0415

        if self.weighting not in ("uniform", "similarity"):
            raise ValueError(f"weighting={self.weighting!r}: 'uniform' or 'similarity'")
        k = self.n_candidates_ = _k(rows, n_candidates)
        rows = _clip(rows, self.max_weight)
        prompts, inv = np.unique(rows.row, return_inverse=True)
        self.sum_wr_ = np.zeros((len(prompts), k))
        self.sum_w_ = np.zeros((len(prompts), k))
        np.add.at(self.sum_wr_, (inv, rows.action), rows.weight * rows.reward)
        np.add.at(self.sum_w_, (inv, rows.action), rows.weight)
        self.prior_ = _weighted_prior(rows, k)
        emb = np.asarray(embedding, np.float64)[prompts]
        self.index_ = NearestNeighbors(n_neighbors=min(self.n_neighbors, len(prompts)),
                                       metric="cosine", algorithm="brute").fit(emb)
        return self

    def predict_proba(self, embedding: np.ndarray, meta: Any = None) -> np.ndarray:
        dist, idx = self.index_.kneighbors(np.asarray(embedding, np.float64))
        sim = (np.ones_like(dist) if self.weighting == "uniform"
               else np.clip(1.0 - dist, 0.0, None))  # (n, k)
        num = np.einsum("nj,njk->nk", sim, self.sum_wr_[idx])
        den = np.einsum("nj,njk->nk", sim, self.sum_w_[idx])
        a = self.prior_strength
        return (num + a * self.prior_) / (den + a)


class LgbmRouter(_Scoring):
    """One IPS-weighted LightGBM success model per candidate (embedding + meta)."""

    def __init__(self, n_estimators: int = 200, learning_rate: float = 0.05,
                 num_leaves: int = 15, min_child_samples: int = 20,
                 colsample_bytree: float = 0.5, use_meta: bool = True,
                 max_weight: float | None = 20.0, min_rows: int = 20, n_jobs: int = 1,
                 seed: int = 0, threshold: float = 0.5) -> None:
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.num_leaves = num_leaves
        self.min_child_samples = min_child_samples
        self.colsample_bytree = colsample_bytree
        self.use_meta = use_meta
        self.max_weight = max_weight
        self.min_rows = min_rows
        self.n_jobs = n_jobs
        self.seed = seed
        self.threshold = threshold

    def _design(self, embedding: np.ndarray, meta: Any) -> np.ndarray:
        emb = np.asarray(embedding, np.float64)
        if not self.use_meta:
            return emb
        category, tokens = meta_arrays(meta, len(emb))
        return np.column_stack([emb, self.encoder_.codes(category),
                                self.encoder_.log_tokens_z(tokens)])

    def fit(self, embedding: np.ndarray, meta: Any, rows: TrainingRows,
            n_candidates: int | None = None) -> LgbmRouter:
        import lightgbm as lgb  # noqa: PLC0415

        k = self.n_candidates_ = _k(rows, n_candidates)
        rows = _clip(rows, self.max_weight)
        category, tokens = meta_arrays(meta, len(embedding))
        seen = np.unique(rows.row)
        self.encoder_ = MetaEncoder().fit(category[seen], tokens[seen])
        x = self._design(embedding, meta)
        cat = [x.shape[1] - 2] if self.use_meta else []
        self.prior_ = _weighted_prior(rows, k)
        self.models_: list[Any] = []
        for a in range(k):
            m = rows.action == a
            if m.sum() < self.min_rows or np.ptp(rows.reward[m]) == 0:
                self.models_.append(None)
                continue
            model = lgb.LGBMRegressor(
                objective="cross_entropy", n_estimators=self.n_estimators,
                learning_rate=self.learning_rate, num_leaves=self.num_leaves,
                min_child_samples=self.min_child_samples, colsample_bytree=self.colsample_bytree,
                n_jobs=self.n_jobs, random_state=self.seed, deterministic=True,
                force_row_wise=True, verbose=-1)
            model.fit(x[rows.row[m]], rows.reward[m], sample_weight=rows.weight[m],
                      categorical_feature=cat or "auto")
            self.models_.append(model)
        return self

    def predict_proba(self, embedding: np.ndarray, meta: Any = None) -> np.ndarray:
        x = self._design(embedding, meta)
        cols = [np.full(len(x), self.prior_[a]) if mdl is None else mdl.predict(x)
                for a, mdl in enumerate(self.models_)]
        return np.clip(np.column_stack(cols), 0.0, 1.0)


class OracleRouter:
    """Per-prompt limit from full-information scores S (n, K) (needs no fit)."""

    def __init__(self, success_cutoff: float = 0.5) -> None:
        self.success_cutoff = success_cutoff

    def predict_proba(self, score: np.ndarray) -> np.ndarray:
        """(n, K) 1.0 where the candidate succeeds: ThresholdPolicy(t in (0, 1]) = the oracle."""
        return (np.asarray(score, np.float64) >= self.success_cutoff).astype(np.float64)

    def choose(self, score: np.ndarray, fallback: int = -1) -> np.ndarray:
        """(n,) cheapest succeeding column, else `fallback` (default the last)."""
        ok = self.predict_proba(score) > 0
        fallback = int(fallback) % ok.shape[1]
        return np.where(ok.any(axis=1), ok.argmax(axis=1), fallback).astype(np.int64)
