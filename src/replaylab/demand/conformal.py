"""Conformalized quantile regression (Romano, Patterson, Candes 2019), per group.

Base band: the lowest and highest predicted quantiles (lo, hi) of total tokens.
On the calibration split (rows with a regression label only) each row scores

    E_i = max(g(lo_i - p_i) - g(y_i - p_i),  g(y_i - p_i) - g(hi_i - p_i))

with p the prompt and g the scale (log1p of output tokens by default: a
multiplicative correction that scales with the request; "linear": tokens).
The correction is Q = the ceil((n + 1)(1 - alpha))-th smallest score (+inf when
that exceeds n), and the calibrated interval is

    [p + g^-1(g(lo - p) - Q),  p + g^-1(g(hi - p) + Q)]

which covers a new exchangeable row with probability >= 1 - alpha. Q may be
negative (the band was too wide); an interval that would turn inside out
collapses to its midpoint. Both ends are then clipped to [p, p + max_tokens].

Groups (Mondrian CQR): one correction per cell of the COMBINATION of
`group_columns` (e.g. model x category x slo class) with at least
`min_group_size` calibration rows; other cells use the global correction. A cell
with its own correction gets the guarantee conditionally on the cell; reports
still break coverage down by each attribute separately.

Why by hand, not MAPIE: `mapie.regression.ConformalizedQuantileRegressor` (1.6)
computes one marginal correction (its `groups` argument is unused), cannot fall
back from small groups to the global correction, and fixes one confidence level
per fitted object while the reliability curve recalibrates one band to many
levels. The correction itself is the same formula: tests check equality with
MAPIE's `symmetric_correction=True` on one group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from replaylab.demand.baselines import bucket_keys
from replaylab.demand.inputs import prompt_tokens
from replaylab.demand.state import RunStateError, StateReader, StateWriter
from replaylab.runtime.demand_math import conformal_band, forward


def conformal_quantile(scores: np.ndarray, alpha: float) -> float:
    """The ceil((n + 1)(1 - alpha))-th smallest score; +inf when that rank exceeds n."""
    scores = np.asarray(scores, dtype="float64")
    n = scores.size
    if n == 0:
        raise ValueError("no calibration scores")
    k = math.ceil((n + 1) * (1.0 - alpha) - 1e-9)  # 1e-9: (n+1)(1-a) integral in exact math
    if k > n:
        return math.inf
    return float(np.partition(scores, k - 1)[k - 1])


def cqr_scores(lo: np.ndarray, hi: np.ndarray, y: np.ndarray, prompt: np.ndarray,
               scale: str) -> np.ndarray:
    """Conformity scores E (n,) of totals y against the band [lo, hi], on `scale`."""
    gy = forward(y - prompt, scale)
    return np.maximum(forward(lo - prompt, scale) - gy, gy - forward(hi - prompt, scale))


def cell_keys(features: pd.DataFrame, columns: Sequence[str]) -> np.ndarray:
    """One string per row naming its conformal cell (the public name of `_cell_keys`)."""
    return _cell_keys(features, columns)


def _cell_keys(features: pd.DataFrame, columns: Sequence[str]) -> np.ndarray:
    """One string per row naming its cell, e.g. 'llama-8b|code|interactive'."""
    if not columns:
        return np.full(len(features), "*", dtype=object)
    keys = bucket_keys(features, columns)
    first, rest = keys[columns[0]], [keys[c] for c in columns[1:]]
    return (first.str.cat(rest, sep="|") if rest else first).to_numpy(dtype=object)


class GroupConformal:
    """Group-conditional CQR with a global fallback; sklearn-style (`fit` -> self).

    level: nominal coverage (0.8); group_columns: the cells are their combination;
    min_group_size: calibration rows a cell needs for its own correction;
    scale: "log1p" | "linear" (the score scale, see the module docstring).
    """

    def __init__(self, level: float = 0.8, group_columns: Sequence[str] = (),
                 min_group_size: int = 200, scale: str = "log1p") -> None:
        self.level = level
        self.group_columns = group_columns
        self.min_group_size = min_group_size
        self.scale = scale

    def fit(self, features: pd.DataFrame, lo: np.ndarray, hi: np.ndarray,
            y: np.ndarray) -> GroupConformal:
        """Learn corrections from calibration rows with labels: features (n, *), lo/hi/y (n,)."""
        if not 0.0 < float(self.level) < 1.0:
            raise ValueError(f"level={self.level!r}: must be in (0, 1)")
        if int(self.min_group_size) < 1:
            raise ValueError(f"min_group_size={self.min_group_size!r}: must be >= 1")
        y = np.asarray(y, dtype="float64")
        if y.size == 0 or not np.isfinite(y).all():
            raise ValueError("calibration needs a non-empty array of finite totals")
        scores = cqr_scores(np.asarray(lo, float), np.asarray(hi, float), y,
                            prompt_tokens(features), self.scale)
        return self.fit_scores(scores, _cell_keys(features, self.group_columns))

    def fit_scores(self, scores: np.ndarray, cells: np.ndarray) -> GroupConformal:
        """Learn corrections from conformity scores (n,) and their cells (n,) (`cell_keys`):
        what `fit` does after scoring; a distributed caller scores on its workers and
        brings back only (score, cell) pairs."""
        if not 0.0 < float(self.level) < 1.0:
            raise ValueError(f"level={self.level!r}: must be in (0, 1)")
        if int(self.min_group_size) < 1:
            raise ValueError(f"min_group_size={self.min_group_size!r}: must be >= 1")
        scores = np.asarray(scores, dtype="float64")
        cells = np.asarray(cells, dtype=object)
        alpha = 1.0 - float(self.level)
        self.n_calibration_ = int(scores.size)
        self.global_correction_ = conformal_quantile(scores, alpha)
        self.cell_sizes_: dict[str, int] = {}
        self.corrections_: dict[str, float] = {}  # only cells with >= min_group_size rows
        codes, names = pd.factorize(cells)
        order = np.argsort(codes, kind="stable")
        bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
        for j, name in enumerate(names):
            cell_scores = scores[order[bounds[j]:bounds[j + 1]]]
            self.cell_sizes_[str(name)] = int(cell_scores.size)
            if cell_scores.size >= int(self.min_group_size):
                self.corrections_[str(name)] = conformal_quantile(cell_scores, alpha)
        return self

    def correction(self, features: pd.DataFrame) -> np.ndarray:
        """Per-row correction Q (n,): the row's cell's, else the global one."""
        cells = pd.Series(_cell_keys(features, self.group_columns), dtype=object)
        return cells.map(self.corrections_).fillna(self.global_correction_).to_numpy(float)

    def predict_interval(self, features: pd.DataFrame, lo: np.ndarray, hi: np.ndarray,
                         cap: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Calibrated (lo, hi) totals (n,) each from the base band; cap: max_tokens or NaN."""
        return conformal_band(lo, hi, prompt_tokens(features), self.correction(features), cap,
                              self.scale)

    def cells(self) -> list[dict]:
        """Each calibration cell: its size and which correction it gets."""
        return [{"cell": name, "n": n,
                 "correction": self.corrections_.get(name, self.global_correction_),
                 "applied": "group" if name in self.corrections_ else "global"}
                for name, n in sorted(self.cell_sizes_.items(), key=lambda kv: -kv[1])]

    def write_state(self, writer: StateWriter) -> None:
        """Save the fitted calibrator as `conformal.json` (corrections exact; +inf tagged)."""
        if not hasattr(self, "corrections_"):
            raise RunStateError("GroupConformal.write_state: the calibrator is not fitted")
        writer.put_json("conformal.json", {
            "params": {"level": float(self.level), "group_columns": list(self.group_columns),
                       "min_group_size": int(self.min_group_size), "scale": self.scale},
            "n_calibration_": self.n_calibration_,
            "global_correction_": float(self.global_correction_),
            "cell_sizes_": self.cell_sizes_,  # in fit order (cells() sorts stably)
            "corrections_": {k: float(v) for k, v in self.corrections_.items()}})

    @classmethod
    def read_state(cls, reader: StateReader) -> GroupConformal:
        """The calibrator `write_state` saved."""
        doc = reader.get_json("conformal.json")
        p = doc["params"]
        cq = cls(float(p["level"]), tuple(p["group_columns"]), int(p["min_group_size"]),
                 p["scale"])
        cq.n_calibration_ = int(doc["n_calibration_"])
        cq.global_correction_ = float(doc["global_correction_"])
        cq.cell_sizes_ = {str(k): int(v) for k, v in doc["cell_sizes_"].items()}
        cq.corrections_ = {str(k): float(v) for k, v in doc["corrections_"].items()}
        return cq


def reliability_curve(levels: Sequence[float], calib_features: pd.DataFrame,
                      calib_band: tuple[np.ndarray, np.ndarray], calib_y: np.ndarray,
                      test_features: pd.DataFrame, test_band: tuple[np.ndarray, np.ndarray],
                      test_y: np.ndarray, cap: np.ndarray | None, group_columns: Sequence[str],
                      min_group_size: int, scale: str) -> list[dict]:
    """Observed test coverage of the same base band recalibrated to each nominal level."""
    out = []
    for level in levels:
        cq = GroupConformal(level, group_columns, min_group_size, scale).fit(
            calib_features, *calib_band, calib_y)
        lo, hi = cq.predict_interval(test_features, *test_band, cap)
        out.append({"nominal": float(level),
                    "observed": float(np.mean((test_y >= lo) & (test_y <= hi))),
                    "mean_width": float(np.mean(hi - lo))})
    return out
