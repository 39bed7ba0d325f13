"""What a demand run fitted and the outputs its stages share (`pipelines.demand_partitions`
writes them on either engine): `DemandRun` (the fitted objects, for export), the test
predictions' columns (`predictions_frame`), the served interval's file (`write_served`),
the intervals' line (`intervals_text`) and the golden rows the export turns into golden
vectors (`select_golden_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from replaylab.contracts import Ledger as L
from replaylab.contracts.columns import Projected as P
from replaylab.demand.baselines import bucket_keys
from replaylab.demand.config import DemandConfig
from replaylab.demand.conformal import GroupConformal
from replaylab.demand.labels import ABSENT_USAGE, CANCELLED, CLASS_COLUMN
from replaylab.demand.metrics import quantile_key
from replaylab.demand.model import QuantileDemandModel
from replaylab.demand.served import SERVED

GOLDEN_ROWS = 31  # test rows kept for the artifact's golden vectors (the export adds one more)


@dataclass
class DemandRun:
    """What a demand run fitted: enough to export and serve the model and its fallbacks."""

    config: DemandConfig
    model: QuantileDemandModel
    calibrator: GroupConformal  # the model's interval at config.interval
    baselines: dict[str, Any]
    baseline_calibrators: dict[str, GroupConformal]
    projection_version: str
    ledger_fingerprint: str
    feature_columns: list[str] = field(default_factory=list)
    time_window: dict[str, Any] = field(default_factory=dict)  # per split: first/last dispatch ms
    # a few test rows (keys + model features) the export turns into golden vectors
    golden_rows: pd.DataFrame | None = None



def level_label(level: float) -> str:
    """'80' for 0.8: statsforecast's interval column suffix (`model-lo-80`)."""
    return f"{100.0 * float(level):g}"


def predictions_frame(test: pd.DataFrame, y: np.ndarray, label_class: np.ndarray,
                      censored: np.ndarray, predicted: dict[str, tuple], cfg: DemandConfig,
                      ) -> pd.DataFrame:
    """One row per test request, the columns of `predictions_test.parquet` (local, and each
    partition's file under compute=dask): keys, groups, observed total `y` (a lower bound
    where censored), label class and flags, and per predictor name its quantiles and
    interval (`predicted[name]` = (quantiles (n, q), lo, hi))."""
    keep = [c for c in (L.REQUEST_ID, L.SESSION_ID, L.TIMESTAMP, *cfg.group_columns,
                        *cfg.bucket_columns, L.PROMPT_TOKENS, L.MAX_TOKENS)
            if c in test.columns]
    out = test[list(dict.fromkeys(keep))].reset_index(drop=True).copy()
    out["y"] = y
    out[CLASS_COLUMN] = label_class
    out["censored"] = censored
    out["cancelled"] = label_class == CANCELLED
    out["absent_usage"] = label_class == ABSENT_USAGE
    lvl = level_label(cfg.interval)
    for name, (q, lo, hi) in predicted.items():
        for j, level in enumerate(cfg.quantiles):
            out[f"{name}-q{quantile_key(level)}"] = q[:, j]
        out[f"{name}-lo-{lvl}"] = lo
        out[f"{name}-hi-{lvl}"] = hi
    return out


def write_served(request_id: pd.Series, served, demand: DemandConfig, out_dir: Path) -> Path:
    """OUT/served_test.parquet: each test request's served interval (`served-lo-80`,
    `served-hi-80`), the interval the gate judged; both engines write it."""
    lvl = level_label(demand.interval)
    path = Path(out_dir) / "served_test.parquet"
    pd.DataFrame({L.REQUEST_ID: np.asarray(request_id, dtype=object),
                  f"{SERVED}-lo-{lvl}": served.lo, f"{SERVED}-hi-{lvl}": served.hi}
                 ).to_parquet(path, index=False)
    return path


def intervals_text(n_boot: int) -> str:
    """The summary's `test.intervals` line (both engines: the one session bootstrap)."""
    return (f"ci: 95% percentile intervals, {n_boot} session-cluster Poisson bootstrap "
            "replicates (w[b, s] ~ Poisson(1) from hash(session_id, b); every predictor on "
            "the same weights)")


def select_golden_rows(test: pd.DataFrame, total_q: np.ndarray, cap: np.ndarray | None,
                       group_columns: tuple[str, ...], columns: list[str],
                       n: int = GOLDEN_ROWS, seed: int = 0) -> pd.DataFrame:
    """A deterministic, varied handful of test rows for the artifact's golden vectors.

    The golden vectors must exercise every path the runtime takes, not only the
    common one, so the rows are picked by role, in this order: up to 4 first
    turns (the export sends them without `hist_*` fields: the runtime's
    first-turn path), the 4 rows whose top quantile sits closest to their
    `max_tokens` cap (the clip), 1 row without `max_tokens`, then a seeded
    round-robin over the conformal cells (one row per cell per round) until `n`.
    total_q: the model's total quantiles on `test` (n_test, q); cap: max_tokens
    (NaN = none) or None when the model does not clip; columns: kept columns
    (keys and the model's features; labels stay out). Same inputs, same rows.
    """
    n_test = len(test)
    picked: list[int] = []

    def take(positions) -> None:
        for i in positions:
            if len(picked) >= n:
                return
            if int(i) not in picked:
                picked.append(int(i))

    first = np.flatnonzero(test[P.TURNS_DISPATCHED].to_numpy(dtype="float64",
                                                             na_value=np.nan) == 0) \
        if P.TURNS_DISPATCHED in test.columns else np.array([], dtype=int)
    take(first[:4])
    if cap is not None:
        prompt = test[L.PROMPT_TOKENS].to_numpy(dtype="float64", na_value=np.nan)
        headroom = prompt + cap - total_q[:, -1]  # 0: the top quantile is clipped to the cap
        capped = np.flatnonzero(np.isfinite(headroom))
        take(capped[np.argsort(headroom[capped], kind="stable")][:4])
        take(np.flatnonzero(np.isnan(cap))[:1])
    keys = bucket_keys(test, group_columns)
    cells = keys.agg("|".join, axis=1).to_numpy(dtype=object) if group_columns else \
        np.full(n_test, "*", dtype=object)
    rng = np.random.default_rng(seed)
    by_cell = {c: list(rng.permutation(np.flatnonzero(cells == c)))
               for c in sorted(set(cells.tolist()))}
    order = [by_cell[c] for c in rng.permutation(sorted(by_cell))]
    while len(picked) < min(n, n_test) and any(order):
        take([rows.pop(0) for rows in order if rows])
    keep = [c for c in dict.fromkeys(columns) if c in test.columns]
    return test.iloc[picked][keep].reset_index(drop=True)
