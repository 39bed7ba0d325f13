"""What every demand estimator reads: quantile levels, known prompt, output labels.

Shared by the baselines, the quantile LightGBM and the conformal calibration;
`features` is a projection frame (`dispatch_time_features`), `y` total demand
(prompt + completion) of the rows with a regression label.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from replaylab.contracts.columns import Ledger as L


def check_quantiles(quantiles: Sequence[float]) -> np.ndarray:
    """Quantile levels as float64 (q,); ValueError unless ascending, distinct, in (0, 1)."""
    qs = np.asarray(quantiles, dtype=float)
    if qs.ndim != 1 or qs.size == 0 or np.any((qs <= 0) | (qs >= 1)) or np.any(np.diff(qs) <= 0):
        raise ValueError(f"quantiles={list(quantiles)!r}: ascending distinct levels in (0, 1)")
    return qs


def prompt_tokens(features: pd.DataFrame) -> np.ndarray:
    """Prompt tokens as float64 (n,); 0 where unknown (such rows carry no label)."""
    return features[L.PROMPT_TOKENS].to_numpy(dtype="float64", na_value=0.0)


def output_labels(features: pd.DataFrame, y: np.ndarray) -> np.ndarray:
    """Output tokens (n,) of labelled rows: total - prompt, checked >= 0 and finite."""
    y = np.asarray(y, dtype="float64")
    if y.shape != (len(features),):
        raise ValueError(f"y has shape {y.shape}; expected ({len(features)},)")
    if y.size == 0 or not np.isfinite(y).all():
        raise ValueError("y must be a non-empty array of finite totals (labelled rows only)")
    return np.maximum(y - prompt_tokens(features), 0.0)
