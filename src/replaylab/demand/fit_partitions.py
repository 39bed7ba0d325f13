"""The demand predictors fitted on engine partitions: baselines, the quantile model, the
conformal calibrators (`pipelines.demand_partitions`), written once against
`compute.Engine` and run on either engine.

- `fit_baselines`: the four baselines of `baselines.make_baselines`, the same classes and
  the same fitted state as their local `fit` (global quantiles by the exact selection
  `compute.ops.exact_quantiles`: numpy's `quantile` bit for bit; category-bucket tables
  by a shuffle on the bucket key and pandas' groupby quantile per bucket on the
  partition holding it);
- `fit_model`: `QuantileDemandModel`; on a `LocalEngine` its own `fit` on the collected
  train rows, on a `DaskEngine` the boosters by lightgbm.dask (`compute.lgbm`) on the
  train partitions, the early-stopping tail the local rule's session-grouped,
  time-ordered cut;
- `calibrate`: group calibrators from the calibration rows' conformity scores,
  collected exactly up to a bound, else a uniform hashed subsample (the module
  docstring of `pipelines.demand_partitions`, step 5).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import pandas as pd

from replaylab.compute.ops import exact_quantiles, hash_uniform, key_hash, order_statistics
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.columns import Projected as P
from replaylab.demand.baselines import (
    CategoryBucketBaseline,
    MaxTokensCapBaseline,
    PromptLengthBaseline,
    SessionEwmaBaseline,
    bucket_keys,
    make_baselines,
)
from replaylab.demand.censoring import NONE
from replaylab.demand.config import DemandConfig
from replaylab.demand.conformal import GroupConformal, cell_keys, cqr_scores
from replaylab.demand.inputs import check_quantiles, output_labels, prompt_tokens
from replaylab.demand.labels import CLASS_COLUMN, LABEL
from replaylab.demand.metrics import quantile_key
from replaylab.demand.model import (
    MODEL,
    QuantileDemandModel,
    base_band,
    is_categorical_feature,
    model_feature_names,
    request_cap,
)
from replaylab.projection import SplitConfig
from replaylab.projection.partitioned import split_boundaries_on
from replaylab.runtime.demand_math import forward, raw_to_total

TAIL = "label_es_tail"  # the early-stopping tail's rows (label_ prefix: never a feature)
OUT = "out"  # a frame's one column of values (output tokens, EWMA ratios)


def rows_where(part: pd.DataFrame, split: str | None, classes: tuple[str, ...] | None
               ) -> pd.DataFrame:
    """The rows of one partition in `split` (None: any) whose label class is in `classes`
    (None: any)."""
    keep = np.ones(len(part), dtype=bool)
    if split is not None:
        keep &= (part["split"] == split).to_numpy()
    if classes is not None:
        keep &= part[CLASS_COLUMN].isin(list(classes)).to_numpy()
    return part[keep]


def select(engine: Any, frame: Any, split: str | None, classes: tuple[str, ...] | None) -> Any:
    return engine.map(rows_where, frame, split, classes, meta=rows_where(
        engine.meta(frame), split, classes))


# ------------------------------------------------------------------ baselines


def _outputs(part: pd.DataFrame) -> pd.DataFrame:
    y = part[P.LABEL_TOTAL_DEMAND].to_numpy(dtype="float64", na_value=np.nan)
    return pd.DataFrame({OUT: output_labels(part, y) if len(part) else np.zeros(0)},
                        index=part.index, dtype="float64")


def _ratios(part: pd.DataFrame) -> pd.DataFrame:
    ewma = part[P.COMPLETION_EWMA].to_numpy(dtype="float64", na_value=np.nan)
    has = np.isfinite(ewma)
    out = _outputs(part)[OUT].to_numpy()
    return pd.DataFrame({OUT: (out[has] + 1.0) / (ewma[has] + 1.0)}, dtype="float64")


def _bucket_frame(part: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    keys = bucket_keys(part, cols)
    out = keys.assign(_out=_outputs(part)[OUT].to_numpy())
    out["_key"] = keys[cols[0]].str.cat([keys[c] for c in cols[1:]], sep="\x1f") \
        if len(cols) > 1 else keys[cols[0]]
    return out


def _bucket_table(part: pd.DataFrame, cols: list[str], qs: list[float], min_size: int
                  ) -> pd.DataFrame | None:
    """`CategoryBucketBaseline.fit`'s table on rows holding whole buckets (its own code)."""
    g = pd.Series(part["_out"].to_numpy(dtype="float64"), index=part.index).groupby(
        [part[c] for c in cols])
    size = g.size()
    big = size.index[size >= int(min_size)]
    table = g.quantile(list(qs)).unstack(-1)
    return table.loc[big].set_axis(list(range(len(qs))), axis=1) if len(big) else None


def _bucket_tables(engine: Any, train: Any, bucket_columns: tuple[str, ...], qs: list[float],
                   min_size: int) -> list[pd.DataFrame]:
    tables = []
    for k in range(1, len(bucket_columns) + 1):
        cols = list(bucket_columns[:k])
        meta = pd.DataFrame({**{c: pd.Series([], dtype=object) for c in cols},
                             "_out": pd.Series([], dtype="float64"),
                             "_key": pd.Series([], dtype=object)})
        frame = engine.shuffle_by(engine.map(_bucket_frame, train, cols, meta=meta), "_key")
        parts = [p for p in engine.each(_bucket_table, frame, cols, qs, min_size)
                 if p is not None and len(p)]
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


def _max_out(part: pd.DataFrame) -> float:
    return float(part[OUT].max()) if len(part) else -math.inf


def _quantiles(engine: Any, frame: Any, qs: Any) -> tuple[np.ndarray, int]:
    n = engine.each_sum(len, frame)
    return np.asarray(exact_quantiles(engine, frame, OUT, list(qs)), dtype="float64"), int(n)


def fit_baselines(engine: Any, train: Any, demand: DemandConfig) -> dict[str, Any]:
    """The four baselines of `make_baselines`, fitted on the train label rows of an engine
    frame: the same classes and the same fitted state as their local `fit`."""
    qs = check_quantiles(demand.quantiles)
    out = engine.persist(engine.map(_outputs, train, meta=_outputs(engine.meta(train))))
    global_q, n = _quantiles(engine, out, qs)
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
        seen = max(engine.each(_max_cap, train), default=-math.inf)
        cap.default_max_tokens_ = float(seen if math.isfinite(seen) else
                                        max(engine.each(_max_out, out), default=-math.inf))
    cap.uses_cap_ = qs >= 0.5

    bucket: CategoryBucketBaseline = base[CategoryBucketBaseline.name]
    if int(bucket.min_bucket_size) < 1:
        raise ValueError(f"min_bucket_size={bucket.min_bucket_size!r}: must be >= 1")
    bucket.global_quantiles_ = global_q.copy()
    bucket.tables_ = _bucket_tables(engine, train, tuple(bucket.bucket_columns), list(qs),
                                    int(bucket.min_bucket_size))

    ewma: SessionEwmaBaseline = base[SessionEwmaBaseline.name]
    fallback = CategoryBucketBaseline(qs, ewma.bucket_columns, ewma.min_bucket_size)
    fallback.global_quantiles_ = global_q.copy()
    fallback.tables_ = ([t.copy() for t in bucket.tables_]
                        if tuple(ewma.bucket_columns) == tuple(bucket.bucket_columns)
                        and ewma.min_bucket_size == bucket.min_bucket_size
                        else _bucket_tables(engine, train, tuple(ewma.bucket_columns),
                                            list(qs), int(ewma.min_bucket_size)))
    ewma.fallback_ = fallback
    ratios = engine.persist(engine.map(_ratios, train, meta=_ratios(engine.meta(train))))
    n_hist = int(engine.each_sum(len, ratios))
    ewma.n_history_ = n_hist
    ewma.ratio_quantiles_ = (_quantiles(engine, ratios, qs)[0]
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


def model_rows(engine: Any, lab: Any, demand: DemandConfig, method: str) -> Any:
    """Train rows the booster fits: label rows, plus censored-class rows for `realized`."""
    if method == NONE:
        return select(engine, lab, "train", (LABEL,))
    rows = select(engine, lab, "train", (LABEL, *demand.censoring.classes))
    return engine.map(_with_total, rows, meta=engine.meta(rows))


def _with_total(part: pd.DataFrame) -> pd.DataFrame:
    return part[part[P.LABEL_TOTAL_DEMAND].notna().to_numpy()]


def _new_model(demand: DemandConfig, method: str) -> QuantileDemandModel:
    return QuantileDemandModel(demand.quantiles, demand.model, demand.scale, demand.clip_to_cap,
                               demand.seed, censoring=method,
                               censored_rounds=demand.censoring.rounds[-1])


def fit_model(engine: Any, rows: Any, demand: DemandConfig, method: str,
              n_workers: int | None = None) -> QuantileDemandModel:
    """`QuantileDemandModel` on `rows` (an engine frame of train rows, session-whole
    partitions; `model_rows`). LocalEngine: the model's own `fit` on the rows collected in
    partition order (the local estimator, bit for bit); DaskEngine: the boosters by
    lightgbm.dask on the partitions (`compute.lgbm.fit_boosters`; the fitted model is
    local either way), on `n_workers` workers (default: those live now; a run passes the
    count it started with). A worker lost during the Dask fit is waited for and the fit
    redone once, the same model, or `compute.lgbm.WorkersLost`."""
    if engine.kind != "dask":  # local LightGBM: no cluster to lay partitions out on
        frame = engine.collect(rows)
        y = frame[P.LABEL_TOTAL_DEMAND].to_numpy(dtype="float64", na_value=np.nan)
        censored = (frame[CLASS_COLUMN] != LABEL).to_numpy()
        return _new_model(demand, method).fit(frame, y, censored=censored)
    return _fit_model_on_cluster(engine, rows, demand, method, n_workers)


def _fit_model_on_cluster(engine: Any, rows: Any, demand: DemandConfig, method: str,
                          n_workers: int | None) -> QuantileDemandModel:
    from replaylab.compute.lgbm import fit_boosters

    qs = check_quantiles(demand.quantiles)
    model = _new_model(demand, method)
    cfg = model.config_ = model.config or demand.model
    model.base_band_ = "unclipped"
    meta = engine.meta(rows)
    names = model_feature_names(meta)
    model.feature_names_ = names
    cats = [c for c in names if is_categorical_feature(meta[c])]
    vocab = _union(engine.each(_vocabulary, rows, cats)) if cats else {}
    model.categories_ = {c: vocab.get(c, []) for c in cats}
    n = int(engine.each_sum(len, rows))
    model.censored_rows_ = 0 if method == NONE else int(engine.each_sum(
        lambda p: int((p[CLASS_COLUMN] != LABEL).sum()), rows))
    frac = float(cfg.early_stopping_fraction)
    n_tail = 0
    tail_cut = None
    if cfg.early_stopping_rounds != 0 and frac != 0.0:
        cut = SplitConfig(train=1.0 - frac, calibration=frac, test=0.0, embargo_ms=0)
        tail_cut = (split_boundaries_on(engine, rows, cut), cut)
    rows = engine.persist(engine.map(_mark_tail, rows, tail_cut,
                                     meta=meta.assign(**{TAIL: pd.Series([], dtype=bool)})))
    if tail_cut is not None:
        n_tail = int(engine.each_sum(lambda p: int(p[TAIL].sum()), rows))
        if n_tail < 20 or n - n_tail < 20:  # the local rule: too small to stop on
            n_tail = 0
    meta_x = model.design(meta)
    meta_y = pd.Series([], dtype="float64", name="target")

    def xy(frame: Any) -> tuple[Any, Any]:
        return (engine.persist(engine.map(_design_part, frame, model, meta=meta_x)),
                engine.persist(engine.map(_target_part, frame, model.scale, meta=meta_y)))

    full = xy(rows)
    tail_rows = None
    if n_tail:
        head = xy(engine.map(_tail_rows, rows, False, meta=engine.meta(rows)))
        tail_rows = engine.map(_tail_rows, rows, True, meta=engine.meta(rows))
        tail = xy(tail_rows)
    else:
        head, tail = full, None
    # LightGBM's ranks: no empty partition, only features every rank can bin as categorical
    # (`compute.lgbm.fit_layout`; `lightgbm_categorical` already left out those with no
    # category at all, the segfault of issue 41)
    cats = model.lightgbm_categorical()
    boosters, best, stopped, binned, empty = fit_boosters(
        engine, head, full, tail, n_tail, qs, cfg, demand.seed, cats, n_workers)
    model.categorical_as_codes_ = [c for c in cats if c not in binned]
    if model.categorical_as_codes_:
        logging.getLogger("replaylab").warning(
            "lightgbm.dask: %s train as numeric category codes: too few values on some "
            "training partition for every rank to bin them as categorical",
            ", ".join(model.categorical_as_codes_))
    model.empty_partitions_ = empty
    model.boosters_, model.best_iterations_ = boosters, best
    model.compute_ = "dask"
    model.n_features_in_ = len(names)
    model.validation_rows_ = int(n_tail)
    model.validation_pinball_ = None
    if n_tail:
        sums = np.sum(engine.each(_tail_sums, tail_rows, model, stopped, best), axis=0)
        model.validation_pinball_ = {f"{q:g}": float(sums[1 + j] / sums[0])
                                     for j, q in enumerate(qs)}
    return model


def _mark_tail(part: pd.DataFrame, tail_cut: tuple | None) -> pd.DataFrame:
    """The rows with a TAIL column: True in the early-stopping tail (the later sessions)."""
    from replaylab.projection.splits import assign_splits

    if tail_cut is None or len(part) == 0:
        return part.assign(**{TAIL: np.zeros(len(part), dtype=bool)})
    boundaries, cut = tail_cut
    split = assign_splits(part[[L.SESSION_ID, L.TIMESTAMP]], boundaries, cut)
    return part.assign(**{TAIL: np.asarray(split) == "calibration"})


def _tail_rows(part: pd.DataFrame, in_tail: bool) -> pd.DataFrame:
    return part[part[TAIL].to_numpy() == in_tail]


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


def _pin_sums(part: pd.DataFrame, k: int) -> np.ndarray:
    return part[[f"pin:{j}" for j in range(k)]].sum().to_numpy()


def _at_most(part: pd.DataFrame, threshold: float) -> pd.DataFrame:
    return part[part["u"].to_numpy() <= threshold]


def calibrate(engine: Any, calib: Any, predictors: dict, demand: DemandConfig,
              collect_max: int) -> tuple[dict[str, GroupConformal], pd.DataFrame, dict]:
    """Group calibrators of every predictor from the calibration rows' scores (module
    docstring of `pipelines.demand_partitions`, step 5); returns them, the collected
    (score, cell) frame and its facts."""
    meta = _calib_part(engine.meta(calib), predictors, demand)
    scored = engine.persist(engine.map(_calib_part, calib, predictors, demand, meta=meta))
    n = int(engine.each_sum(len, scored))
    qs = demand.quantiles
    pin = np.sum(engine.each(_pin_sums, scored, len(qs)), axis=0)
    keep = ["cell", *[f"score:{k}" for k in predictors]]
    if n <= collect_max:
        got = engine.collect(scored, keep)
        how = {"rows": n, "scores_used": n, "rule": f"exact: all {n} calibration scores "
               f"collected (<= {collect_max})"}
    else:  # the collect_max-th smallest hash: an exact-size uniform subsample
        thr = order_statistics(engine, scored, "u", [collect_max - 1])[0]
        got = engine.collect(engine.map(_at_most, scored, thr, meta=meta), keep)
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
