"""Score a demand artifact on another run's test rows: the champion on the challenger's rows.

The promotion gate (`replaylab.apps.registry`) may only compare a challenger's
pinball with the champion's when both were scored on the same rows. A champion
trained on another ledger or split was scored on other rows, so its recorded
figures say nothing about the challenger's. This module scores any verified
artifact on a given set of test rows:

- the rows: the challenger's test split, either from its run folder
  (`run_test_rows`: `features.parquet` and `predictions_test.parquet`, which
  `pipeline=demand` writes) or re-derived from its ledger with its own
  projection and split (`ledger_test_rows`: the pipeline's projection, split and
  label functions);
- the predictions: the artifact's runtime, `DemandPredictor.quantiles_batch`
  (what serving computes: feature assembly from request fields and session
  history, the ONNX model, clip, the exported conformal correction), every
  quantile level, online recalibration off;
- the scores: the pipeline's own functions (`replaylab.demand.metrics.interval_metrics`
  on the labelled rows, coverage / width / pinball per value of each group column
  keyed by `replaylab.demand.baselines.bucket_keys`), so the challenger
  re-scored here reproduces its pipeline scores (golden-vector parity: ~1e-6).

`compare_scores` sets two such scores side by side on the quantile levels both
artifacts predict. Pure: no MLflow, no I/O beyond the two parquet files.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from replaylab.contracts import Ledger as L
from replaylab.demand.baselines import bucket_keys
from replaylab.demand.labels import CLASS_COLUMN, LABEL, demand_labels
from replaylab.demand.metrics import coverage, interval_metrics, pinball_losses, quantile_key
from replaylab.projection import project
from replaylab.projection.recipe import SPLIT_COLUMN
from replaylab.projection.requests import requests


class RescoreError(ValueError):
    """The rows cannot be re-scored (the message says why)."""


@dataclass(frozen=True)
class TestRows:
    """A run's test rows: projected frame (request fields, session history), labels."""

    frame: pd.DataFrame
    y: np.ndarray  # observed total tokens (a lower bound where censored, NaN without usage)
    usable: np.ndarray  # rows with a regression label: the rows the pipeline scores
    fingerprint: str | None = None  # the ledger's fingerprint, when known


def run_test_rows(features_path: str | Path, predictions_path: str | Path) -> TestRows:
    """The test rows of a finished `pipeline=demand` run folder.

    features.parquet (every projected row and its split) gives the request fields
    and history; predictions_test.parquet (one row per test request, same order)
    gives the observed total and label class. Rows are matched on request_id.
    """
    features = pd.read_parquet(features_path)
    pred = pd.read_parquet(predictions_path, columns=[L.REQUEST_ID, "y", CLASS_COLUMN])
    test = features[features[SPLIT_COLUMN] == "test"].reset_index(drop=True)
    if len(test) != len(pred) or not np.array_equal(test[L.REQUEST_ID].to_numpy(dtype=object),
                                                    pred[L.REQUEST_ID].to_numpy(dtype=object)):
        raise RescoreError(f"{features_path}: its test rows are not those of {predictions_path}")
    return TestRows(test, pred["y"].to_numpy(dtype="float64"),
                    pred[CLASS_COLUMN].to_numpy(dtype=object) == LABEL)


def ledger_test_rows(ledger: pd.DataFrame, projection: Any, split: Any,
                     failed_is_censored: bool = True) -> TestRows:
    """The test rows of a validated ledger under a run's projection and split configs
    (what `pipeline=demand` derives: `projection.project`, the same label function)."""
    projected = project(ledger, projection, split)
    features, splits = projected.features, projected.splits
    labels = demand_labels(features, ledger, failed_is_censored)
    tm = splits == "test"
    if not tm.any():
        raise RescoreError("the ledger has no test rows under this split")
    return TestRows(features[tm].reset_index(drop=True), labels.y_total[tm],
                    labels.usable[tm], projected.fingerprint)


def predict_rows(predictor: Any, rows: TestRows) -> Any:
    """The runtime's quantiles of every row (`DemandPredictor.quantiles_batch`) on the
    rows' requests (`projection.requests.requests`: a first turn without `hist_*`)."""
    return predictor.quantiles_batch(requests(rows.frame))


def score_artifact(predictor: Any, rows: TestRows, group_columns: tuple[str, ...] | list[str],
                   batch: Any = None) -> dict:
    """The pipeline's test scores of a loaded `DemandPredictor` on `rows`.

    {"rows", "labelled_rows", "scored_rows", "fallback" (reason -> labelled rows the
    model did not answer, left out), "quantiles", "model" (interval_metrics),
    "groups" ([{by, value, n, coverage, mean_width, pinball, mean_pinball}])}.
    batch: its `predict_rows` when already computed.
    """
    if batch is None:
        batch = predict_rows(predictor, rows)
    answered = np.array([r is None for r in batch.fallback], dtype=bool)
    sel = rows.usable & answered
    levels = [float(q) for q in batch.levels]
    y, q, lo, hi = rows.y[sel], batch.total[sel], batch.lo[sel], batch.hi[sel]
    groups = []
    keys = bucket_keys(rows.frame, list(group_columns))
    for by in group_columns:
        values = keys[by].to_numpy(dtype=object)[sel]
        for value in sorted(set(values.tolist())):
            g = values == value
            pin = pinball_losses(y[g], q[g], levels)
            groups.append({"by": str(by), "value": str(value), "n": int(g.sum()),
                           "coverage": coverage(y[g], lo[g], hi[g]),
                           "mean_width": float(np.mean(hi[g] - lo[g])), "pinball": pin,
                           "mean_pinball": float(np.mean(list(pin.values())))})
    skipped = Counter(r for r, u in zip(batch.fallback, rows.usable, strict=True)
                      if u and r is not None)
    return {"rows": int(len(rows.y)), "labelled_rows": int(rows.usable.sum()),
            "scored_rows": int(sel.sum()), "fallback": dict(skipped), "quantiles": levels,
            "model": interval_metrics(y, q, lo, hi, levels), "groups": groups}


def common_mean_pinball(scores: dict, levels: list[str]) -> float:
    """Mean pinball of `scores` over the quantile keys `levels` (NaN when one is missing)."""
    pin = (scores.get("model") or {}).get("pinball") or {}
    vals = [pin.get(k) for k in levels]
    return float(np.mean(vals)) if vals and all(v is not None for v in vals) else float("nan")


def compare_scores(challenger: dict, champion: dict) -> dict:
    """Challenger and champion scored on the same rows, on the quantile levels both predict.

    {"levels", "rows", "challenger"/"champion": {mean_pinball, coverage, mean_width},
    "delta_mean_pinball", "challenger_better" (strictly lower mean pinball)}.
    """
    levels = sorted({quantile_key(q) for q in challenger.get("quantiles", [])}
                    & {quantile_key(q) for q in champion.get("quantiles", [])}, key=float)
    sides = {}
    for role, s in (("challenger", challenger), ("champion", champion)):
        m = s.get("model") or {}
        sides[role] = {"mean_pinball": common_mean_pinball(s, levels),
                       "coverage": m.get("coverage"), "mean_width": m.get("mean_width"),
                       "scored_rows": s.get("scored_rows")}
    a, b = sides["challenger"]["mean_pinball"], sides["champion"]["mean_pinball"]
    ok = bool(np.isfinite(a) and np.isfinite(b) and a < b)
    return {"levels": levels, "rows": challenger.get("rows"), **sides,
            "delta_mean_pinball": a - b, "challenger_better": ok}


def paired_delta(challenger: Any, champion: Any, rows: TestRows, n_boot: int = 1000,
                 seed: int = 0) -> dict:
    """Challenger minus champion mean pinball on the labelled rows both answered, on the
    quantile levels both predict, with its paired 95% bootstrap interval: sessions are
    resampled when the rows carry session ids, else rows
    (`replaylab.demand.metrics.paired_pinball_delta`). challenger, champion: `predict_rows`.
    """
    from replaylab.demand.metrics import paired_pinball_delta

    la = [quantile_key(q) for q in challenger.levels]
    lb = [quantile_key(q) for q in champion.levels]
    levels = sorted(set(la) & set(lb), key=float)
    both = np.array([a is None and b is None for a, b in
                     zip(challenger.fallback, champion.fallback, strict=True)], dtype=bool)
    sel = rows.usable & both
    session = (rows.frame[L.SESSION_ID].to_numpy(dtype=object)[sel]
               if L.SESSION_ID in rows.frame else None)
    qa = challenger.total[sel][:, [la.index(k) for k in levels]]
    qb = champion.total[sel][:, [lb.index(k) for k in levels]]
    out = paired_pinball_delta(rows.y[sel], qa, qb, [float(k) for k in levels], session,
                               n_boot, seed)
    return {**out, "levels": levels, "n_boot": int(n_boot)}
