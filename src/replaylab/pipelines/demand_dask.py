"""`pipeline=demand compute=dask`: the demand pipeline with no ledger row on the driver.

`train_demand_dask` runs `pipelines.demand.train_demand`'s stages as Dask graphs
over a ledger dataset; the driver receives counts, fitted parameters and sums:

1. read, validate and quarantine on the cluster; fingerprint, project and split by
   the one projection recipe (`projection.project(..., compute="dask")`: sessions
   whole in one partition, exact split boundaries);
2. labels per partition (`demand.labels.demand_labels`): the ledger's
   finish_reason and lifecycle_state travel beside the features by the same
   session_id shuffle (same hash, same partition count: the same partition),
   every row checked to have found its ledger row;
3. baselines fitted exactly as locally, to the same classes
   (`demand.baselines`): global quantiles by an exact distributed selection
   (`demand.dask_ops.exact_quantiles_dask`: numpy's `quantile` bit for bit);
   category-bucket tables by a shuffle on the bucket key and pandas' groupby
   quantile per bucket on the worker holding it (the local code on the same
   values); the session EWMA ratio quantiles by the exact selection;
4. the quantile boosters with `lightgbm.dask` fed from the train split's
   partitions (`demand.distributed.fit_quantile_boosters_dask`); the
   early-stopping tail is the local rule's session-grouped, time-ordered cut
   (`split_boundaries_dask` over train);
5. conformal calibration from the calibration split's conformity scores,
   computed per partition. Up to `CALIBRATION_COLLECT_MAX` labelled rows the
   (score, cell) pairs of every predictor are collected (5M rows x 5 float64
   scores + a cell string: about 300 MB at the bound) and the corrections are the
   exact local ones (`GroupConformal.fit_scores`). Beyond it, a uniform
   subsample of exactly `CALIBRATION_COLLECT_MAX` rows without replacement, by
   the smallest values of a hash of request_id (`dask_ops.hash_uniform`), is
   collected instead: the hash does not look at the scores, so the subsample is
   a uniformly random subset of an exchangeable calibration set, itself
   exchangeable with a test row, and split conformal's finite-sample guarantee
   P(y in interval) >= level holds with n = the subsample's size (per cell: the
   cell's rows of the subsample are a uniform subset of the cell's rows, the
   guarantee holds per cell conditionally on its subsample size). Only the
   correction's sampling variability grows (of order 1/sqrt(n));
6. test metrics as partition sums (pinball per level, coverage, width, MAE, the
   raw band, per-group tables, censored rows, reliability), every predictor on
   the same labelled rows; intervals by a session-cluster Poisson bootstrap with
   w[b, s] ~ Poisson(1) from a hash of (session_id, b) (`dask_ops.poisson_weights`),
   so every partition draws the same weight for the same session without
   talking to the others; N_BOOT_DASK = 200 replicates (the cost is B x sessions
   per partition; the Monte Carlo error of a 2.5% / 97.5% percentile endpoint
   with B = 200 is about 0.19 bootstrap standard errors, against 0.085 with the
   local path's 1000 multinomial draws); the gate is `demand.gate.demand_gate`,
   the local rule, on these aggregates;
7. predictions written by the workers as Parquet, one file per test partition
   (`DIR/predictions_test/part-*.parquet`), the local file's columns.

Measured against the local run on the same rows (bench/bench_demand_dask.py, a
synthetic ledger of 1,094,273 rows in 16 Parquet parts, 2 worker processes x 1
thread, 2026-12-06): accounting, splits, labels and time windows equal; every
baseline's fitted state equal (global quantiles and bucket tables bit for bit) and
its test figures equal to 1e-13 (summation order); the model's test mean pinball
-3.0e-6 relative (28.09434 vs 28.09443), per level within 7.3e-5 relative,
coverage -0.0037 (0.8018 vs 0.8056), mean width -0.09%; per-row model quantiles
differ by a median 1e-4 and a 99th percentile 2.5% relative. The tolerances the
tests hold the model to: mean pinball 5% relative, coverage 0.04 absolute (a
5,000-row ledger: observed -0.013% and -0.0048).

Differences from the local run, by construction: the boosters (LightGBM's
distributed bins and per-worker quantile leaf averaging, `demand.distributed`),
so the model's predictions, its interval and every figure of the model differ a
little; the baselines' fitted state and figures do not (exact). Not distributed
(yet): HPO, the `pinball` censoring variant and `auto`'s choice among variants
(the run trains `none`, or `realized` when configured, and says so), the HTML
report (which recomputes from rows), the fingerprint (the multiset scheme of
`project_dask`, not the local sort-based one).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pandas as pd

from replaylab.contracts import Ledger as L
from replaylab.contracts.columns import KEY_COLUMNS
from replaylab.contracts.columns import Projected as P
from replaylab.demand.baselines import (
    CategoryBucketBaseline,
    MaxTokensCapBaseline,
    PromptLengthBaseline,
    SessionEwmaBaseline,
    bucket_keys,
    make_baselines,
)
from replaylab.demand.censoring import NONE, REALIZED
from replaylab.demand.config import DemandConfig
from replaylab.demand.conformal import GroupConformal, cell_keys, cqr_scores
from replaylab.demand.dask_ops import (
    exact_quantiles_dask,
    hash_uniform,
    key_hash,
    kth_smallest_hash,
    on_partitions,
    poisson_weights,
)
from replaylab.demand.gate import CI_LEVEL, demand_gate
from replaylab.demand.inputs import check_quantiles, output_labels, prompt_tokens
from replaylab.demand.labels import (
    ABSENT_USAGE,
    LABEL,
    LOWER_BOUND_CLASSES,
    PROMPT_ABSENT,
    DemandDataError,
    demand_labels,
)
from replaylab.demand.metrics import quantile_key, row_figures
from replaylab.demand.model import (
    QuantileDemandModel,
    base_band,
    is_categorical_feature,
    model_feature_names,
    request_cap,
)
from replaylab.projection import ProjectionConfig, SplitConfig, feature_columns, project
from replaylab.projection.version import FINGERPRINT_SCHEME_DASK
from replaylab.runtime.demand_math import forward, raw_to_total

MODEL = "model"
CALIBRATION_COLLECT_MAX = 5_000_000  # calibration rows whose scores are collected exactly
N_BOOT_DASK = 200
STAGES = {"read": "read and validate per partition, the quarantine written by the workers",
          "project": "the ledger fingerprint, projection, exact split boundaries and labels "
                     "per partition; the features written by the workers",
          "model": "the quantile boosters (lightgbm.dask)",
          "calibrate": "baselines (exact) and conformal calibration scores",
          "evaluate": "test metrics as partition sums, predictions written by the workers",
          "report": "the report's figures from a uniform sample of the predictions"}
GOLDEN_SAMPLE = 5_000  # test rows (hashed sample) the golden rows are picked from
REPORT_ROWS = 100_000  # test predictions (hashed sample) the report's figures are drawn from
CLASS = "label_class"  # label_ prefix: never a feature (`feature_columns`)
TAIL = "label_es_tail"
_FIGS = ("mean_pinball", "coverage", "mean_width", "mae_p50")


# ------------------------------------------------------------------ labels


def _label_part(part: pd.DataFrame, ledger: pd.DataFrame, failed_is_censored: bool
                ) -> pd.DataFrame:
    """`demand_labels` of one session-whole partition, its ledger rows aligned by request_id."""
    led = ledger.drop_duplicates(L.REQUEST_ID).set_index(L.REQUEST_ID)
    ids = part[L.REQUEST_ID].to_numpy(dtype=object)
    missing = ~pd.Index(ids).isin(led.index)
    if missing.any():
        raise RuntimeError(f"{int(missing.sum())} feature rows found no ledger row in their "
                           "partition: the ledger and features shuffles disagree")
    aligned = led.reindex(ids)
    aligned.index = part.index
    labels = demand_labels(part, aligned, failed_is_censored)
    return part.assign(**{CLASS: labels.label_class})


def attach_labels(features: Any, valid: Any, failed_is_censored: bool) -> Any:
    """Features with a `label_class` column, per partition (no gathering)."""
    cols = [c for c in (L.SESSION_ID, L.REQUEST_ID, L.FINISH_REASON, L.LIFECYCLE_STATE)
            if c in valid.columns]
    small = valid[cols].shuffle(on=L.SESSION_ID, npartitions=features.npartitions,
                                shuffle_method="tasks")
    meta = features._meta.assign(**{CLASS: pd.Series([], dtype=object)})
    return features.map_partitions(_label_part, small, failed_is_censored, meta=meta,
                                   align_dataframes=False)


def _facts_part(part: pd.DataFrame, group_columns: tuple[str, ...]) -> dict:
    """Counts per (split, class), time window per split, train label rows' group values."""
    counts = part.groupby(["split", CLASS]).size()
    t = part[L.TIMESTAMP].to_numpy(dtype="int64")
    window = {}
    for s in ("train", "calibration", "test"):
        m = (part["split"] == s).to_numpy()
        if m.any():
            window[s] = (int(t[m].min()), int(t[m].max()))
    train = part[(part["split"] == "train") & (part[CLASS] == LABEL)]
    keys = bucket_keys(train, group_columns)
    return {"counts": {k: int(v) for k, v in counts.items()}, "window": window,
            "train_groups": {by: set(map(str, keys[by])) for by in group_columns}}


def _facts_sum(parts: list[dict]) -> dict:
    counts: dict = {}
    window: dict = {}
    groups: dict = {}
    for p in parts:
        for k, v in p["counts"].items():
            counts[k] = counts.get(k, 0) + v
        for s, (lo, hi) in p["window"].items():
            a, b = window.get(s, (lo, hi))
            window[s] = (min(a, lo), max(b, hi))
        for by, vals in p["train_groups"].items():
            groups.setdefault(by, set()).update(vals)
    return {"counts": counts, "window": window, "train_groups": groups}


def _label_section(counts: dict) -> dict:
    """`labels.label_counts` from (split, class) counts."""
    def n(split=None, cls=None) -> int:
        return sum(v for (s, c), v in counts.items()
                   if (split is None or s == split) and (cls is None or c == cls))
    out: dict = {s: n(s, LABEL) for s in ("train", "calibration", "test", "embargo")}
    out["censored"] = sum(n(cls=c) for c in LOWER_BOUND_CLASSES)
    out["censored_by_reason"] = {c: n(cls=c) for c in LOWER_BOUND_CLASSES}
    out["absent_usage"] = n(cls=ABSENT_USAGE)
    out["prompt_absent"] = n(cls=PROMPT_ABSENT)
    return out


def check_trainable_counts(counts: dict, sessions: int, min_train_rows: int,
                           min_calibration_rows: int, source: str | None) -> None:
    """`labels.check_trainable` from (split, class) counts: the same rules and messages."""
    total = sum(counts.values())
    by_cls: dict = {}
    for (_, c), v in counts.items():
        by_cls[c] = by_cls.get(c, 0) + v
    at = f"{source}: " if source else ""
    if total == 0:
        raise DemandDataError(f"{at}no valid ledger rows: nothing to train a demand model on")
    with_usage = total - by_cls.get(ABSENT_USAGE, 0)
    if with_usage == 0:
        raise DemandDataError(f"{at}no usable labels: all {total} rows have completion_tokens "
                              "null (usage absent is not zero)")
    usable = by_cls.get(LABEL, 0)
    lb = sum(by_cls.get(c, 0) for c in LOWER_BOUND_CLASSES)
    if usable == 0:
        if lb == with_usage:
            raise DemandDataError(
                f"{at}no usable labels: all {lb} rows with usage are censored (finish_reason "
                "length/cancelled/error or aborted/failed): their output is only a lower bound")
        raise DemandDataError(f"{at}no usable labels: of {total} rows, {lb} are censored, "
                              f"{total - with_usage} lack usage, the rest lack prompt_tokens")
    if sessions < 3:
        raise DemandDataError(
            f"{at}the ledger holds {'a single session' if sessions == 1 else f'{sessions} sessions'}"
            ": time-ordered session splits need sessions in train, calibration and test")
    for split, need, field in (("train", min_train_rows, "demand.min_train_rows"),
                               ("calibration", min_calibration_rows,
                                "demand.min_calibration_rows"),
                               ("test", 1, "at least one")):
        have = counts.get((split, LABEL), 0)
        if have < need:
            raise DemandDataError(
                f"{at}too few usable labels in the {split} split: {have} < {need} ({field}; "
                f"{usable} usable of {total} rows): add sessions or change the split fractions")


# ------------------------------------------------------------------ baselines


def _outputs(part: pd.DataFrame) -> pd.Series:
    y = part[P.LABEL_TOTAL_DEMAND].to_numpy(dtype="float64", na_value=np.nan)
    return pd.Series(output_labels(part, y) if len(part) else np.zeros(0), index=part.index,
                     dtype="float64")


def _ratios(part: pd.DataFrame) -> pd.Series:
    ewma = part[P.COMPLETION_EWMA].to_numpy(dtype="float64", na_value=np.nan)
    has = np.isfinite(ewma)
    out = _outputs(part).to_numpy()
    return pd.Series((out[has] + 1.0) / (ewma[has] + 1.0), dtype="float64")


def _bucket_frame(part: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    keys = bucket_keys(part, cols)
    out = keys.assign(_out=_outputs(part).to_numpy())
    out["_key"] = keys[cols[0]].str.cat([keys[c] for c in cols[1:]], sep="\x1f") \
        if len(cols) > 1 else keys[cols[0]]
    return out


def _bucket_table(part: pd.DataFrame, cols: list[str], qs: list[float], min_size: int
                  ) -> pd.DataFrame:
    """`CategoryBucketBaseline.fit`'s table on rows holding whole buckets (its own code)."""
    g = pd.Series(part["_out"].to_numpy(dtype="float64"), index=part.index).groupby(
        [part[c] for c in cols])
    size = g.size()
    big = size.index[size >= int(min_size)]
    table = g.quantile(list(qs)).unstack(-1)
    return table.loc[big].set_axis(list(range(len(qs))), axis=1) if len(big) else None


def _bucket_tables(train: Any, bucket_columns: tuple[str, ...], qs: list[float],
                   min_size: int) -> list[pd.DataFrame]:
    tables = []
    for k in range(1, len(bucket_columns) + 1):
        cols = list(bucket_columns[:k])
        meta = pd.DataFrame({**{c: pd.Series([], dtype=object) for c in cols},
                             "_out": pd.Series([], dtype="float64"),
                             "_key": pd.Series([], dtype=object)})
        frame = train.map_partitions(_bucket_frame, cols, meta=meta).shuffle(
            on="_key", npartitions=train.npartitions, shuffle_method="tasks")
        parts = dask.compute(*[dask.delayed(_bucket_table)(p, cols, qs, min_size)
                               for p in frame.to_delayed()])
        parts = [p for p in parts if p is not None and len(p)]
        if parts:
            tables.append(pd.concat(parts).sort_index())
        else:  # no bucket big enough: the empty table `fit` keeps
            idx = (pd.MultiIndex.from_arrays([[]] * len(cols), names=cols) if len(cols) > 1
                   else pd.Index([], dtype=object, name=cols[0]))
            tables.append(pd.DataFrame(columns=list(qs), index=idx, dtype="float64"))
    return tables


def _max_cap(part: pd.DataFrame) -> float:
    caps = part[L.MAX_TOKENS].to_numpy(dtype="float64", na_value=np.nan)
    caps = caps[np.isfinite(caps)]
    return float(caps.max()) if caps.size else -math.inf


def fit_baselines_dask(train: Any, demand: DemandConfig) -> dict[str, Any]:
    """The four baselines of `make_baselines`, fitted on the train label rows of a dask
    frame: the same classes and the same fitted state as their local `fit`."""
    qs = check_quantiles(demand.quantiles)
    out = train.map_partitions(_outputs, meta=pd.Series([], dtype="float64"))
    global_q, n = exact_quantiles_dask(out, qs)
    base = make_baselines(demand.quantiles, demand.default_max_tokens, demand.bucket_columns,
                          demand.min_bucket_size)
    prompt: PromptLengthBaseline = base[PromptLengthBaseline.name]
    prompt.output_quantiles_, prompt.n_train_ = global_q.copy(), int(n)

    cap: MaxTokensCapBaseline = base[MaxTokensCapBaseline.name]
    if cap.default_max_tokens is not None:
        if int(cap.default_max_tokens) < 1:
            raise ValueError(f"default_max_tokens={cap.default_max_tokens!r}: must be >= 1")
        cap.default_max_tokens_ = float(cap.default_max_tokens)
    else:
        seen = on_partitions(train, _max_cap, max)
        cap.default_max_tokens_ = float(seen if math.isfinite(seen) else
                                        on_partitions(out, lambda s: float(s.max())
                                                      if len(s) else -math.inf, max))
    cap.uses_cap_ = qs >= 0.5

    bucket: CategoryBucketBaseline = base[CategoryBucketBaseline.name]
    if int(bucket.min_bucket_size) < 1:
        raise ValueError(f"min_bucket_size={bucket.min_bucket_size!r}: must be >= 1")
    bucket.global_quantiles_ = global_q.copy()
    bucket.tables_ = _bucket_tables(train, tuple(bucket.bucket_columns), list(qs),
                                    int(bucket.min_bucket_size))

    ewma: SessionEwmaBaseline = base[SessionEwmaBaseline.name]
    fallback = CategoryBucketBaseline(qs, ewma.bucket_columns, ewma.min_bucket_size)
    fallback.global_quantiles_ = global_q.copy()
    fallback.tables_ = ([t.copy() for t in bucket.tables_]
                        if tuple(ewma.bucket_columns) == tuple(bucket.bucket_columns)
                        and ewma.min_bucket_size == bucket.min_bucket_size
                        else _bucket_tables(train, tuple(ewma.bucket_columns), list(qs),
                                            int(ewma.min_bucket_size)))
    ewma.fallback_ = fallback
    ratios = train.map_partitions(_ratios, meta=pd.Series([], dtype="float64"))
    n_hist = int(on_partitions(ratios, len, sum))
    ewma.n_history_ = n_hist
    ewma.ratio_quantiles_ = (exact_quantiles_dask(ratios, qs)[0]
                             if n_hist >= int(ewma.min_history_rows) else None)
    return base


# ------------------------------------------------------------------ model


def _vocabulary(part: pd.DataFrame, names: list[str]) -> dict[str, set]:
    return {c: {str(v) for v in part[c].dropna().unique()} for c in names}


def _union(parts: list[dict]) -> dict[str, list[str]]:
    out: dict[str, set] = {}
    for p in parts:
        for c, vals in p.items():
            out.setdefault(c, set()).update(vals)
    return {c: sorted(v) for c, v in out.items()}


def _design_part(part: pd.DataFrame, model: QuantileDemandModel) -> pd.DataFrame:
    return model.design(part)


def _target_part(part: pd.DataFrame, scale: str) -> pd.Series:
    y = part[P.LABEL_TOTAL_DEMAND].to_numpy(dtype="float64", na_value=np.nan)
    t = forward(output_labels(part, y), scale) if len(part) else np.zeros(0)
    return pd.Series(t, index=part.index, dtype="float64", name="target")


def _tail_sums(part: pd.DataFrame, model: QuantileDemandModel, boosters: list,
               rounds: list[int]) -> np.ndarray:
    """[n, pinball sum per level] of the early-stopped boosters on the tail rows."""
    qs = np.asarray(model.quantiles, dtype="float64")
    if len(part) == 0:
        return np.zeros(1 + len(qs))
    X = model.design(part)
    raw = np.column_stack([b.predict(X, num_iteration=k) for b, k in zip(boosters, rounds,
                                                                      strict=True)])
    pred = raw_to_total(raw, prompt_tokens(part),
                        request_cap(part) if model.clip_to_cap else None, model.scale)
    y = part[P.LABEL_TOTAL_DEMAND].to_numpy(dtype="float64")[:, None]
    d = y - pred
    pin = np.maximum(qs[None, :] * d, (qs[None, :] - 1.0) * d)
    return np.concatenate([[len(part)], pin.sum(axis=0)])


def _model_rows(lab: Any, demand: DemandConfig, method: str) -> Any:
    """Train rows the booster fits: label rows, plus censored-class rows for `realized`."""
    train = lab[lab["split"] == "train"]
    if method == NONE:
        return train[train[CLASS] == LABEL]
    ok = train[CLASS].isin([LABEL, *demand.censoring.classes]) & \
        train[P.LABEL_TOTAL_DEMAND].notnull()
    return train[ok]


def fit_model_dask(rows: Any, demand: DemandConfig, method: str, client: object,
                   n_workers: int | None = None) -> QuantileDemandModel:
    """`QuantileDemandModel` with boosters trained by lightgbm.dask on `rows` (a dask frame
    of train rows, session-whole partitions); the fitted model is local, as `fit`'s.
    n_workers: the workers the boosters train on (default: those live now); a worker lost
    during the fit is waited for and the fit redone once, the same model, or `WorkersLost`
    (`demand.distributed.fit_quantile_boosters_dask`)."""
    from replaylab.demand.distributed import LOST_WORKER_WAIT_S, fit_quantile_boosters_dask
    from replaylab.projection.splits_dask import assign_splits_dask, split_boundaries_dask

    qs = check_quantiles(demand.quantiles)
    model = QuantileDemandModel(demand.quantiles, demand.model, demand.scale,
                                demand.clip_to_cap, demand.seed, censoring=method,
                                censored_rounds=demand.censoring.rounds[-1])
    cfg = model.config_ = model.config or demand.model
    model.base_band_ = "unclipped"
    names = model_feature_names(rows._meta)
    model.feature_names_ = names
    cats = [c for c in names if is_categorical_feature(rows._meta[c])]
    vocab = on_partitions(rows, _vocabulary, _union, cats) if cats else {}
    model.categories_ = {c: vocab.get(c, []) for c in cats}
    n = int(on_partitions(rows, len, sum))
    model.censored_rows_ = 0 if method == NONE else int(on_partitions(
        rows[rows[CLASS] != LABEL], len, sum))
    frac = float(cfg.early_stopping_fraction)
    rows = rows.assign(**{TAIL: False})
    n_tail = 0
    if cfg.early_stopping_rounds != 0 and frac != 0.0:
        cut = SplitConfig(train=1.0 - frac, calibration=frac, test=0.0, embargo_ms=0)
        b = split_boundaries_dask(rows, cut)
        tail = assign_splits_dask(rows, b, cut) == "calibration"
        n_tail = int(on_partitions(tail, lambda s: int(s.sum()), sum))
        if n_tail >= 20 and n - n_tail >= 20:
            rows = rows.assign(**{TAIL: tail})
        else:
            n_tail = 0
    rows = rows.persist()
    meta_x = model.design(rows._meta)
    meta_y = pd.Series([], dtype="float64", name="target")

    def xy(frame: Any) -> tuple[Any, Any]:
        return (frame.map_partitions(_design_part, model, meta=meta_x).persist(),
                frame.map_partitions(_target_part, model.scale, meta=meta_y).persist())

    full_X, full_y = xy(rows)
    if n_tail:
        head_X, head_y = xy(rows[~rows[TAIL]])
        tail_rows = rows[rows[TAIL]]
        tail_X, tail_y = xy(tail_rows)
    else:
        head_X, head_y, tail_X, tail_y, tail_rows = full_X, full_y, None, None, None
    boosters, best, stopped = fit_quantile_boosters_dask(
        client, head_X, head_y, full_X, full_y, tail_X, tail_y, n_tail, qs, cfg, demand.seed,
        n_workers=n_workers, wait_s=dask.config.get("replaylab.lost-worker-wait",
                                                    LOST_WORKER_WAIT_S))
    model.boosters_, model.best_iterations_ = boosters, best
    model.compute_ = "dask"
    model.n_features_in_ = len(names)
    model.validation_rows_ = int(n_tail)
    model.validation_pinball_ = None
    if n_tail:
        sums = on_partitions(tail_rows, _tail_sums, lambda p: np.sum(p, axis=0), model,
                             stopped, best)
        model.validation_pinball_ = {f"{q:g}": float(sums[1 + j] / sums[0])
                                     for j, q in enumerate(qs)}
    return model


# ------------------------------------------------------------------ calibration


def _calib_part(part: pd.DataFrame, predictors: dict, demand: DemandConfig) -> pd.DataFrame:
    """Per labelled calibration row: every predictor's conformity score, the cell, the
    model's pinball per level, a hashed uniform (the subsample's key)."""
    y = part[P.LABEL_TOTAL_DEMAND].to_numpy(dtype="float64")
    prompt = prompt_tokens(part)
    out = {"cell": cell_keys(part, demand.group_columns)}
    qs = np.asarray(demand.quantiles, dtype="float64")
    for name, pred in predictors.items():
        q, lo, hi = base_band(pred, part) if len(part) else (np.zeros((0, len(qs))),) * 3
        out[f"score:{name}"] = cqr_scores(lo, hi, y, prompt, demand.scale) if len(part) \
            else np.zeros(0)
        if name == MODEL:
            d = y[:, None] - q
            pin = np.maximum(qs[None, :] * d, (qs[None, :] - 1.0) * d)
            for j in range(len(qs)):
                out[f"pin:{j}"] = pin[:, j]
    out["u"] = hash_uniform(key_hash(part[L.REQUEST_ID]), demand.seed) if len(part) \
        else np.zeros(0)
    return pd.DataFrame(out, index=part.index)


def calibrate_dask(calib: Any, predictors: dict, demand: DemandConfig, collect_max: int
                   ) -> tuple[dict[str, GroupConformal], pd.DataFrame, dict]:
    """Group calibrators of every predictor from the calibration rows' scores (module
    docstring, step 5); returns them, the collected (score, cell) frame and its facts."""
    meta = _calib_part(calib._meta, predictors, demand)
    scored = calib.map_partitions(_calib_part, predictors, demand, meta=meta).persist()
    n = int(on_partitions(scored, len, sum))
    qs = demand.quantiles
    pin = on_partitions(scored[[f"pin:{j}" for j in range(len(qs))]],
                        lambda p: p.sum().to_numpy(), lambda p: np.sum(p, axis=0))
    keep = ["cell", *[f"score:{k}" for k in predictors]]
    if n <= collect_max:
        got = scored[keep].compute()
        how = {"rows": n, "scores_used": n, "rule": f"exact: all {n} calibration scores "
               f"collected (<= {collect_max})"}
    else:
        thr = kth_smallest_hash(scored["u"], collect_max)
        got = scored[scored["u"] <= thr][keep].compute()
        how = {"rows": n, "scores_used": int(len(got)),
               "rule": f"uniform subsample of {len(got)} of {n} rows without replacement "
                       "(smallest hash(request_id) values): exchangeable, so the split-"
                       "conformal guarantee holds with n = the subsample"}
    cells = got["cell"].to_numpy(dtype=object)
    cal = {name: GroupConformal(demand.interval, demand.group_columns, demand.min_group_size,
                                demand.scale).fit_scores(got[f"score:{name}"].to_numpy(), cells)
           for name in predictors}
    how["pinball"] = {quantile_key(q): float(pin[j] / n) for j, q in enumerate(qs)}
    return cal, got, how


# ------------------------------------------------------------------ evaluation


def _predict_all(part: pd.DataFrame, predictors: dict, calibrators: dict,
                 demand: DemandConfig) -> dict:
    cap = request_cap(part) if demand.clip_to_cap else None
    out = {}
    for name, pred in predictors.items():
        q, lo_b, hi_b = base_band(pred, part)
        lo, hi = calibrators[name].predict_interval(part, lo_b, hi_b, cap)
        out[name] = (q, lo, hi, (lo_b, hi_b))
    return out


def _predictions_frame(part: pd.DataFrame, got: dict, demand: DemandConfig) -> pd.DataFrame:
    """The local `predictions_test.parquet` columns for one partition."""
    keep = [c for c in (L.REQUEST_ID, L.SESSION_ID, L.TIMESTAMP, *demand.group_columns,
                        *demand.bucket_columns, L.PROMPT_TOKENS, L.MAX_TOKENS)
            if c in part.columns]
    out = part[list(dict.fromkeys(keep))].reset_index(drop=True).copy()
    cls = part[CLASS].to_numpy(dtype=object)
    out["y"] = part[P.LABEL_TOTAL_DEMAND].to_numpy(dtype="float64", na_value=np.nan)
    out["label_class"] = cls
    out["censored"] = np.isin(cls, LOWER_BOUND_CLASSES)
    out["cancelled"] = cls == "cancelled"
    out["absent_usage"] = cls == "absent_usage"
    lvl = f"{100.0 * float(demand.interval):g}"
    for name, (q, lo, hi, _) in got.items():
        for j, qq in enumerate(demand.quantiles):
            out[f"{name}-q{quantile_key(qq)}"] = q[:, j]
        out[f"{name}-lo-{lvl}"] = lo
        out[f"{name}-hi-{lvl}"] = hi
    return out


def _eval_part(part: pd.DataFrame, index: int, predictors: dict, calibrators: dict,
               reliability: dict, demand: DemandConfig, n_boot: int, out_dir: str) -> dict:
    """One test partition: write its predictions; return its sums (module docstring, 6)."""
    names = list(predictors)
    qs = list(demand.quantiles)
    if len(part) == 0:
        return {"rows": 0}
    got = _predict_all(part, predictors, calibrators, demand)
    _predictions_frame(part, got, demand).to_parquet(
        os.path.join(out_dir, f"part-{index:05d}.parquet"), index=False)
    cls = part[CLASS].to_numpy(dtype=object)
    y_all = part[P.LABEL_TOTAL_DEMAND].to_numpy(dtype="float64", na_value=np.nan)
    u = cls == LABEL
    y = y_all[u]
    cols: dict[str, np.ndarray] = {}
    for name in names:
        q, lo, hi, _ = got[name]
        for k, v in row_figures(y, q[u], lo[u], hi[u], qs).items():
            cols[f"{name}|{k}"] = v
        cols[f"{name}|coverage_raw"] = ((y >= q[u, 0]) & (y <= q[u, -1])).astype(float)
        cols[f"{name}|mean_width_raw"] = q[u, -1] - q[u, 0]
    keys = list(cols)
    X = np.column_stack([cols[k] for k in keys]) if len(y) else np.zeros((0, len(keys)))
    res: dict[str, Any] = {"rows": len(part), "n": int(u.sum()), "keys": keys,
                           "sums": X.sum(axis=0)}
    # session-cluster Poisson bootstrap: per-session sums, weights from hash(session, b)
    sess = part[L.SESSION_ID].to_numpy(dtype=object)[u]
    codes, uniq = pd.factorize(sess)
    xs = np.zeros((len(uniq), len(keys)))
    np.add.at(xs, codes, X)
    ns = np.bincount(codes, minlength=len(uniq)).astype(float)
    w = poisson_weights(key_hash(np.asarray(uniq, dtype=object)), n_boot, demand.seed)
    res["boot"], res["boot_n"], res["sessions"] = w @ xs, w @ ns, len(uniq)
    # per group value: n, model pinball per level, covered, width, baselines' mean pinball
    test_u = part[u]
    gkeys = bucket_keys(test_u, demand.group_columns)
    mq, mlo, mhi, mband = got[MODEL]
    d = y[:, None] - mq[u]
    tau = np.asarray(qs)[None, :]
    mpin = np.maximum(tau * d, (tau - 1.0) * d)
    bmp = np.column_stack([cols[f"{b}|mean_pinball"] for b in names if b != MODEL]) \
        if len(y) else np.zeros((0, len(names) - 1))
    per = np.column_stack([np.ones(len(y)), mpin, ((y >= mlo[u]) & (y <= mhi[u])),
                           mhi[u] - mlo[u], bmp]) if len(y) else np.zeros((0, 0))
    groups: dict = {}
    for by in demand.group_columns:
        vals = gkeys[by].to_numpy(dtype=object)
        for v in set(vals.tolist()):
            groups[(by, str(v))] = per[vals == v].sum(axis=0)
    res["groups"] = groups
    # rows whose total is a lower bound: hi >= observed, by reason
    lb = np.isin(cls, LOWER_BOUND_CLASSES)
    res["censored"] = {str(r): np.array([int(((cls == r) & lb).sum()),
                                         int(((cls == r) & lb & (mhi >= y_all)).sum())])
                       for r in set(cls[lb].tolist())}
    # the model's band recalibrated to each reliability level
    cap = request_cap(test_u) if demand.clip_to_cap else None
    rel = {}
    for level, cq in reliability.items():
        lo, hi = cq.predict_interval(test_u, mband[0][u], mband[1][u], cap)
        rel[level] = np.array([float(((y >= lo) & (y <= hi)).sum()), float((hi - lo).sum())])
    res["reliability"] = rel
    return res


def _eval_sum(parts: list[dict]) -> dict:
    parts = [p for p in parts if p.get("n") is not None]
    out: dict[str, Any] = {"rows": 0, "n": 0, "sessions": 0, "groups": {}, "censored": {},
                           "reliability": {}}
    for p in parts:
        out["rows"] += p["rows"]
        out["n"] += p["n"]
        out["sessions"] += p["sessions"]
        out["keys"] = p["keys"]
        for k in ("sums", "boot", "boot_n"):
            out[k] = p[k] if k not in out else out[k] + p[k]
        for field in ("groups", "censored", "reliability"):
            for k, v in p[field].items():
                out[field][k] = v if k not in out[field] else out[field][k] + v
    return out


def _ci(reps: np.ndarray) -> list[float]:
    from replaylab.stats import percentile_interval

    return [float(v) for v in percentile_interval(reps, CI_LEVEL)]


def _test_section(agg: dict, names: list[str], demand: DemandConfig, n_boot: int,
                  train_groups: dict, test_rows: int) -> dict:
    qs = list(demand.quantiles)
    keys, n = agg["keys"], agg["n"]
    mean = dict(zip(keys, agg["sums"] / n, strict=True))
    reps = agg["boot"] / agg["boot_n"][:, None]  # (B, m) replicate means
    col = {k: j for j, k in enumerate(keys)}
    tests = {}
    for name in names:
        pin = {quantile_key(q): float(mean[f"{name}|pinball.{quantile_key(q)}"]) for q in qs}
        tests[name] = {
            "n": int(n), "pinball": pin, "mean_pinball": float(np.mean(list(pin.values()))),
            "coverage": float(mean[f"{name}|coverage"]),
            "mean_width": float(mean[f"{name}|mean_width"]),
            "mae_p50": float(mean[f"{name}|mae_p50"]),
            "coverage_raw": float(mean[f"{name}|coverage_raw"]),
            "mean_width_raw": float(mean[f"{name}|mean_width_raw"]),
            "ci": {k.split("|", 1)[1]: _ci(reps[:, j]) for k, j in col.items()
                   if k.startswith(f"{name}|") and not k.endswith("_raw")}}
    baselines = {k: v for k, v in tests.items() if k != MODEL}
    best = min(baselines, key=lambda k: baselines[k]["mean_pinball"])
    top = quantile_key(qs[-1])
    m_mp, b_mp = mean[f"{MODEL}|mean_pinball"], mean[f"{best}|mean_pinball"]
    delta = reps[:, col[f"{MODEL}|mean_pinball"]] - reps[:, col[f"{best}|mean_pinball"]]
    gate = demand_gate(
        demand.interval,
        {"value": tests[MODEL]["coverage"], "ci": tests[MODEL]["ci"]["coverage"], "n": int(n),
         "sessions": int(agg["sessions"])},
        {"baseline": best, "model_mean_pinball": float(m_mp),
         "baseline_mean_pinball": float(b_mp), "delta": float(m_mp - b_mp),
         "ci": _ci(delta), "resampled": "sessions (Poisson(1) weights from hash(session_id, b))",
         "n_boot": int(n_boot)})
    groups = []
    others = [b for b in names if b != MODEL]
    for by in demand.group_columns:
        for value in sorted(v for (b, v) in agg["groups"] if b == by):
            s = agg["groups"][(by, value)]
            k = s[0]
            pin = {quantile_key(q): float(s[1 + j] / k) for j, q in enumerate(qs)}
            base = {b: float(s[3 + len(qs) + i] / k) for i, b in enumerate(others)}
            bb = min(base, key=base.get)
            groups.append({"by": by, "value": value, "n": int(k),
                           "coverage": float(s[1 + len(qs)] / k),
                           "mean_width": float(s[2 + len(qs)] / k), "pinball": pin,
                           "mean_pinball": float(np.mean(list(pin.values()))),
                           "best_baseline": bb, "best_baseline_mean_pinball": base[bb]})
    tested = {by: {v for (b, v) in agg["groups"] if b == by} for by in demand.group_columns}
    absent = {by: sorted(train_groups.get(by, set()) - tested[by])
              for by in demand.group_columns if train_groups.get(by, set()) - tested[by]}
    cens = agg["censored"]
    c_n = int(sum(v[0] for v in cens.values()))
    censored = {"n": c_n, "hi_at_least_observed":
                float(sum(v[1] for v in cens.values()) / c_n) if c_n else None,
                "by_reason": {r: {"n": int(v[0]), "hi_at_least_observed": float(v[1] / v[0])}
                              for r, v in sorted(cens.items())}}
    reliability = [{"nominal": float(level), "observed": float(v[0] / n),
                    "mean_width": float(v[1] / n)}
                   for level, v in sorted(agg["reliability"].items())]
    return {
        "gate": gate,
        "intervals": f"ci: 95% percentile intervals, {n_boot} session-cluster Poisson bootstrap "
                     "replicates (w[b, s] ~ Poisson(1) from hash(session_id, b); every "
                     "predictor on the same weights)",
        "rows": int(test_rows), "labelled_rows": int(n),
        "model": tests[MODEL], "baselines": baselines, "best_baseline": best,
        "model_beats": {
            "best_baseline_mean_pinball":
                tests[MODEL]["mean_pinball"] < baselines[best]["mean_pinball"],
            f"every_baseline_pinball_{top}":
                all(tests[MODEL]["pinball"][top] < b["pinball"][top]
                    for b in baselines.values())},
        "groups": groups, "groups_absent_from_test": absent, "censored": censored,
        "reliability": reliability,
    }


# ------------------------------------------------------------------ entry


def _golden_sample(part: pd.DataFrame, frac: float, seed: int) -> pd.DataFrame:
    u = hash_uniform(key_hash(part[L.REQUEST_ID]), seed + 7) if len(part) else np.zeros(0)
    return part[u < frac]


def train_demand_dask(spec_or_dataset: Any, demand: DemandConfig, projection: ProjectionConfig,
                      split: SplitConfig, out_dir: Path, client: object = None, *,
                      blocksize: int | str | None = None, n_boot: int = N_BOOT_DASK,
                      calibration_max: int = CALIBRATION_COLLECT_MAX,
                      progress: Callable[[str], None] | None = None) -> tuple[dict, Any]:
    """`pipelines.demand.train_demand` on a Dask cluster over a ledger dataset.

    spec_or_dataset: a ledger dataset spec (`contracts.dataset.ledger_paths`: file,
    directory, glob, hive) or a `LedgerDataset` already read. client: a
    `distributed.Client` (default: the current one). Writes quarantine/,
    features/ and predictions_test/ (Parquet, by the workers) under out_dir and
    returns (summary with `train_demand`'s keys, `DemandRun`). Raises
    DemandDataError when nothing can be trained (`labels.check_trainable`'s rules).

    progress(text): the stage lines (`pipelines.stages.DaskStages`, `STAGES`; default the
    `replaylab` logger), with a task bar on a TTY. A worker lost mid-run: Dask recomputes
    its tasks from the graph; the boosters, which lightgbm.dask trains on a fixed set of
    workers, wait (dask config `replaylab.lost-worker-wait`, default
    `demand.distributed.LOST_WORKER_WAIT_S` s) for the cluster to be back to the workers
    it had when the run started and are refitted once: the same result as an undisturbed
    run; else `StageFailed`, one line naming the stage.
    """
    from distributed import default_client

    from replaylab.contracts.dataset import DEFAULT_BLOCKSIZE, read_ledger_dask
    from replaylab.demand.distributed import WorkersLost
    from replaylab.pipelines.demand import DemandRun, select_golden_rows
    from replaylab.pipelines.stages import DaskStages, StageFailed
    from replaylab.projection.distributed import no_string_conversion

    client = client or default_client()
    n_workers = len(client.scheduler_info()["workers"])  # the boosters train on as many
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stage = DaskStages(STAGES, progress, client=client)
    with no_string_conversion(), stage:
        with stage("read"):
            ds = (read_ledger_dask(spec_or_dataset, blocksize or DEFAULT_BLOCKSIZE)
                  if isinstance(spec_or_dataset, (str, os.PathLike))
                  else spec_or_dataset).persist()
            accounting = ds.write_quarantine(str(out_dir / "quarantine"))
            source = str(spec_or_dataset) if isinstance(spec_or_dataset, (str, os.PathLike)) \
                else accounting.source
            if accounting.rows_valid == 0:
                raise DemandDataError(f"{source}: no valid ledger rows "
                                      f"({accounting.rows_quarantined} quarantined, see "
                                      "quarantine/): nothing to train on")
        with stage("project"):
            projected = project(ds.valid, projection, split, compute="dask")
            features, splits = projected.features, projected.splits
            fingerprint, version = projected.fingerprint, projected.version
            lab = attach_labels(features, ds.valid, demand.failed_is_censored).persist()
            facts = on_partitions(lab, _facts_part, _facts_sum, tuple(demand.group_columns))
            sessions = sum(splits["sessions"].values())
            check_trainable_counts(facts["counts"], sessions, demand.min_train_rows,
                                   demand.min_calibration_rows, source)
            lab.drop(columns=[CLASS]).to_parquet(str(out_dir / "features"), write_index=False)

        with stage("model"):
            method, censoring = _censoring_section(demand, facts["counts"])
            try:
                model = fit_model_dask(_model_rows(lab, demand, method), demand, method,
                                       client, n_workers)
            except WorkersLost as e:
                raise StageFailed(f"dask stage {stage.number('model')} (model) stopped: {e}; "
                                  "no summary was written") from e

        with stage("calibrate"):
            train = lab[(lab["split"] == "train") & (lab[CLASS] == LABEL)].persist()
            baselines = fit_baselines_dask(train, demand)
            predictors = {MODEL: model, **baselines}
            calib = lab[(lab["split"] == "calibration") & (lab[CLASS] == LABEL)]
            calibrators, scores, cal_how = calibrate_dask(calib, predictors, demand,
                                                          calibration_max)
            cells = scores["cell"].to_numpy(dtype=object)
            reliability = {float(level): GroupConformal(
                level, demand.group_columns, demand.min_group_size, demand.scale).fit_scores(
                    scores[f"score:{MODEL}"].to_numpy(), cells)
                for level in demand.reliability_levels}
            del scores

        with stage("evaluate"):
            test = lab[lab["split"] == "test"]
            pred_dir = out_dir / "predictions_test"
            pred_dir.mkdir(parents=True, exist_ok=True)
            for old in pred_dir.glob("part-*.parquet"):
                old.unlink()
            shared = client.scatter([predictors, calibrators, reliability], broadcast=True,
                                    hash=False)
            parts = [dask.delayed(_eval_part)(p, i, *shared, demand, n_boot, str(pred_dir))
                     for i, p in enumerate(test.to_delayed())]
            agg = dask.delayed(_eval_sum)(parts).compute()
            test_rows = splits["rows"].get("test", 0)
            section = _test_section(agg, list(predictors), demand, n_boot,
                                    facts["train_groups"], test_rows)
            frac = min(1.0, GOLDEN_SAMPLE / max(test_rows, 1))
            sample = test.map_partitions(_golden_sample, frac, demand.seed,
                                         meta=test._meta).compute()
    took = stage.timings
    timings = {"projection": took["read"] + took["project"], "model_fit": took["model"],
               "baselines_and_calibration": took["calibrate"], "evaluation": took["evaluate"]}
    sample = sample.sort_values(L.REQUEST_ID).reset_index(drop=True)
    cap_s = request_cap(sample) if demand.clip_to_cap else None
    golden = select_golden_rows(sample, model.predict_quantiles(sample), cap_s,
                                demand.group_columns, [*KEY_COLUMNS, *model.feature_names_],
                                seed=demand.seed)
    window = {s: {"first_ms": lo, "last_ms": hi} for s, (lo, hi) in facts["window"].items()}
    cal = calibrators[MODEL]
    val = model.validation_pinball_
    importance = sorted(model.feature_importance().items(), key=lambda kv: -kv[1])
    feat_cols = [c for c in feature_columns(features._meta) if c != "split"]
    summary = {
        "pipeline": "demand",
        "compute": "dask",
        **{k: v for k, v in accounting.summary().items() if k != "contract"},
        "injected_defects": {},
        "ledger_fingerprint": fingerprint,
        "fingerprint_scheme": FINGERPRINT_SCHEME_DASK,
        "projection": {"version": version, "rows": int(sum(splits["rows"].values())),
                       "assume_ended_before_next": projection.assume_ended_before_next,
                       "ewma_alpha": projection.ewma_alpha, "split_config": asdict(split),
                       "feature_columns": feat_cols},
        "splits": {"rows": splits["rows"],
                   "sessions": {k: v for k, v in splits["sessions"].items() if v}},
        "split_boundaries": splits["boundaries"],
        "time_window": window,
        "labels": _label_section(facts["counts"]),
        "interval": demand.interval,
        "quantiles": list(demand.quantiles),
        "demand_config": demand.to_dict(),
        "model": {
            "best_iterations": {quantile_key(q): k for q, k in
                                zip(demand.quantiles, model.best_iterations_, strict=True)},
            "validation": {"rows": model.validation_rows_, "pinball": val,
                           "mean_pinball": float(np.mean(list(val.values()))) if val else None},
            "feature_importance_gain": dict(importance[:15]),
            "trained_with": "lightgbm.dask (demand.distributed.fit_quantile_boosters_dask)",
            "workers": n_workers},  # the model is a function of the rows and of this number
        "censoring": censoring,
        "hpo": {"trials_run": 0, "note": "not run under compute=dask"},
        "calibration": {
            "rows": cal_how["rows"], "level": demand.interval, "scale": demand.scale,
            "group_columns": list(demand.group_columns),
            "min_group_size": demand.min_group_size,
            "global_correction": cal.global_correction_, "cells": cal.cells(),
            "pinball": cal_how["pinball"], "scores_used": cal_how["scores_used"],
            "rule": cal_how["rule"]},
        "gate": section.pop("gate"),
        "test": section,
        "artifacts": {"quarantine": str(out_dir / "quarantine"),
                      "features": str(out_dir / "features"),
                      "predictions_test": str(pred_dir)},
        "partitions": int(ds.npartitions),
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
    }
    from replaylab.jsonsafe import json_safe

    summary = json_safe(summary)
    with stage, stage("report"):
        report, report_rows = _write_report(pred_dir, summary, out_dir, demand.seed)
    summary["reports"] = {"html": str(report),
                          "rows": f"figures from a uniform sample of {report_rows:,} of "
                                  f"{int(test_rows):,} test predictions (hash of request_id); "
                                  "every figure of summary.json is a partition sum"}
    summary["timings_s"]["report"] = round(stage.timings["report"], 3)
    run = DemandRun(demand, model, cal, baselines,
                    {k: c for k, c in calibrators.items() if k != MODEL}, version, fingerprint,
                    list(model.feature_names_), window, golden)
    return summary, run


def _write_report(pred_dir: Path, summary: dict, out_dir: Path, seed: int) -> tuple[Path, int]:
    """`write_demand_report` from the summary and a bounded uniform sample of the written
    predictions (at most REPORT_ROWS rows, chosen on the workers by a hash of request_id)."""
    import dask.dataframe as dd

    from replaylab.tracking.demand_report import write_demand_report

    n = int(summary["test"]["rows"])
    frac = min(1.0, REPORT_ROWS / max(n, 1))
    with dask.config.set({"dataframe.convert-string": False}):
        preds = dd.read_parquet(str(pred_dir))
        sample = preds.map_partitions(_golden_sample, frac, seed, meta=preds._meta).compute()
    sample = sample.sort_values(L.TIMESTAMP, kind="stable").reset_index(drop=True)
    return write_demand_report(sample, summary, out_dir), len(sample)


def _censoring_section(demand: DemandConfig, counts: dict) -> tuple[str, dict]:
    """The variant trained under compute=dask and the summary's `censoring` section."""
    cfg = demand.censoring
    n_train = sum(v for (s, c), v in counts.items() if s == "train" and c in cfg.classes)
    n_cal = sum(v for (s, c), v in counts.items() if s == "calibration" and c in cfg.classes)
    section: dict[str, Any] = {"configured": cfg.method, "classes": list(cfg.classes),
                               "train_censored_rows": int(n_train),
                               "calibration_censored_rows": int(n_cal)}
    if n_train < cfg.min_rows:
        section.update(method=NONE, candidate=NONE, reason=f"{n_train} censored train rows < "
                       f"censoring.min_rows={cfg.min_rows}: trained on the label rows alone")
        return NONE, section
    if cfg.method in (NONE, REALIZED):
        section.update(method=cfg.method, candidate=cfg.method, reason="configured")
        return cfg.method, section
    section.update(method=NONE, candidate=NONE,
                   reason=f"censoring.method={cfg.method} is not distributed (its censored "
                          "pinball stage trains locally): compute=dask trained on the label "
                          "rows alone")
    return NONE, section


__all__ = ["CALIBRATION_COLLECT_MAX", "N_BOOT_DASK", "attach_labels", "calibrate_dask",
           "check_trainable_counts", "fit_baselines_dask", "fit_model_dask",
           "train_demand_dask"]
