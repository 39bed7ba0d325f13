"""The router's training inputs: observed outcomes, IPS weights, and the pre-dispatch metadata.

`TrainingRows` holds one observed (prompt, action) outcome per row with its
weight; `ips_weights` turns logged propensities into clipped 1/p weights
(replay rows, full information, get 1); `MetaEncoder` encodes what a router knows
before dispatch (task category, prompt length), which `meta_arrays` reads (its home is
`runtime/router_head.py`: the serving scorer reads the same form).
Shared by the MLP head, the baselines and the ONNX export.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from replaylab.config import fail_field as _fail

OTHER = "<other>"  # name of the category slot for unseen / rare / missing categories


def prompt_hash(text: str) -> str:
    """The first 8 bytes of the SHA-256 of a prompt's UTF-8 text, hex (16 characters): how
    a router artifact's fit_prompts.json names the prompts it was fitted on (no text kept)."""
    import hashlib

    return hashlib.sha256(str(text).encode("utf-8")).hexdigest()[:16]


def ips_weights(propensity: np.ndarray, max_weight: float | None = 20.0) -> np.ndarray:
    """(m,) row weights: 1/propensity clipped at max_weight; NaN propensity (replay, full
    information) -> 1. Propensities must be in (0, 1] where given."""
    p = np.asarray(propensity, dtype=np.float64)
    given = ~np.isnan(p)
    if not ((p[given] > 0) & (p[given] <= 1)).all():
        raise ValueError("ips_weights: propensities must be in (0, 1] (NaN for full-information rows)")
    w = np.ones_like(p)
    w[given] = 1.0 / p[given]
    return np.minimum(w, max_weight) if max_weight is not None else w


@dataclass(frozen=True)
class TrainingRows:
    """Observed outcomes, one per (prompt, action); arrays (m,).

    row: index into the embedding / meta arrays handed to `fit`; action: column
    0..K-1 (cheapest first); reward in [0, 1]; weight > 0 (default 1); cost >= 0
    in USD, NaN where unknown (None: no cost head is trained).
    """

    row: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    weight: np.ndarray | None = None
    cost: np.ndarray | None = None

    def __post_init__(self) -> None:
        m = len(np.asarray(self.row))
        arrays = {"row": np.asarray(self.row, np.int64), "action": np.asarray(self.action, np.int64),
                  "reward": np.asarray(self.reward, np.float64),
                  "weight": np.ones(m) if self.weight is None else np.asarray(self.weight, float)}
        if self.cost is not None:
            arrays["cost"] = np.asarray(self.cost, np.float64)
        checks = {"row": lambda v: v >= 0, "action": lambda v: v >= 0,
                  "reward": lambda v: (v >= 0) & (v <= 1),
                  "weight": lambda v: np.isfinite(v) & (v > 0), "cost": lambda v: ~(v < 0)}
        for k, v in arrays.items():
            if v.shape != (m,) or m == 0:
                _fail("TrainingRows", k, v.shape, f"must have shape ({m},) like row, m > 0")
            if not checks[k](v).all():
                _fail("TrainingRows", k, v[~checks[k](v)][:3].tolist(),
                      "out of range (row, action >= 0; reward in [0, 1]; weight > 0; cost >= 0)")
            object.__setattr__(self, k, v)

    def __len__(self) -> int:
        return len(self.row)

    def take(self, idx: np.ndarray) -> TrainingRows:
        return TrainingRows(self.row[idx], self.action[idx], self.reward[idx], self.weight[idx],
                            None if self.cost is None else self.cost[idx])


class MetaEncoder:
    """Category vocabulary and prompt-length standardization (sklearn-style).

    fit -> vocabulary_ (sorted categories with >= min_count rows), token_mean_,
    token_scale_ of log1p(prompt_tokens); codes(category) -> (n,) int64 with V =
    len(vocabulary_) for `other`; log_tokens_z(tokens) -> (n,) float64, NaN -> 0.
    """

    def __init__(self, min_count: int = 1) -> None:
        self.min_count = min_count

    def fit(self, category: np.ndarray, prompt_tokens: np.ndarray) -> MetaEncoder:
        keys = np.array([_cat_key(c) for c in category], dtype=object)
        vals, counts = np.unique(keys[keys != OTHER].astype(str), return_counts=True)
        self.vocabulary_ = tuple(str(v) for v, c in zip(vals, counts, strict=True)
                                 if c >= self.min_count)
        self.index_ = {v: i for i, v in enumerate(self.vocabulary_)}
        lt = np.log1p(np.maximum(np.asarray(prompt_tokens, np.float64), 0.0))
        lt = lt[np.isfinite(lt)]
        self.token_mean_ = float(lt.mean()) if len(lt) else 0.0
        sd = float(lt.std()) if len(lt) > 1 else 0.0
        self.token_scale_ = sd if sd > 1e-6 else 1.0
        return self

    def codes(self, category: np.ndarray) -> np.ndarray:
        other = len(self.vocabulary_)
        return np.array([self.index_.get(_cat_key(c), other) for c in category], dtype=np.int64)

    def log_tokens_z(self, prompt_tokens: np.ndarray) -> np.ndarray:
        lt = np.log1p(np.maximum(np.asarray(prompt_tokens, np.float64), 0.0))
        z = (lt - self.token_mean_) / self.token_scale_
        return np.where(np.isfinite(z), z, 0.0)


def _cat_key(c: object) -> str:
    return OTHER if pd.api.types.is_scalar(c) and pd.isna(c) else str(c)
