"""The demand predictors fitted on Dask frames: baselines, the quantile boosters, the
conformal calibrators (`pipeline=demand compute=dask`, `pipelines.demand_dask`).

- `fit_baselines_dask`: the four baselines of `baselines.make_baselines`, the same
  classes and the same fitted state as their local `fit` (global quantiles by an exact
  distributed selection, `dask_ops.exact_quantiles_dask`; category-bucket tables by a
  shuffle on the bucket key and pandas' groupby quantile per bucket on the worker
  holding it);
- `fit_model_dask`: `QuantileDemandModel` with boosters trained by lightgbm.dask
  (`distributed.fit_quantile_boosters_dask`), the early-stopping tail the local rule's
  session-grouped, time-ordered cut;
- `calibrate_dask`: group calibrators from the calibration rows' conformity scores,
  collected exactly up to a bound, else a uniform hashed subsample (the module
  docstring of `pipelines.demand_dask`, step 5).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import dask
import numpy as np
import pandas as pd

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
from replaylab.demand.dask_ops import (
    exact_quantiles_dask,
    hash_uniform,
    key_hash,
    kth_smallest_hash,
    on_partitions,
)
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
from replaylab.runtime.demand_math import forward, raw_to_total

TAIL = "label_es_tail"  # the early-stopping tail's rows (label_ prefix: never a feature)


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


def model_rows(lab: Any, demand: DemandConfig, method: str) -> Any:
    """Train rows the booster fits: label rows, plus censored-class rows for `realized`."""
    train = lab[lab["split"] == "train"]
    if method == NONE:
        return train[train[CLASS_COLUMN] == LABEL]
    ok = train[CLASS_COLUMN].isin([LABEL, *demand.censoring.classes]) & \
        train[P.LABEL_TOTAL_DEMAND].notnull()
    return train[ok]


def fit_model_dask(rows: Any, demand: DemandConfig, method: str, client: object,
                   n_workers: int | None = None) -> QuantileDemandModel:
    """`QuantileDemandModel` with boosters trained by lightgbm.dask on `rows` (a dask frame
    of train rows, session-whole partitions); the fitted model is local, as `fit`'s.
    n_workers: the workers the boosters train on (default: those live now); a worker lost
    during the fit is waited for and the fit redone once, the same model, or `WorkersLost`
    (`demand.distributed.fit_quantile_boosters_dask`)."""
    from replaylab.demand.distributed import (
        LOST_WORKER_WAIT_S,
        fit_layout,
        fit_quantile_boosters_dask,
    )
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
        rows[rows[CLASS_COLUMN] != LABEL], len, sum))
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
    # LightGBM's ranks: no empty partition, only features every rank can bin as categorical
    # (`distributed.fit_layout`; `lightgbm_categorical` already left out those with no
    # category at all, the segfault of issue 41)
    cats = model.lightgbm_categorical()
    keep_full, cats_full = fit_layout(full_X, cats)
    keep_head, cats_head = (keep_full, cats_full) if head_X is full_X else fit_layout(head_X, cats)
    categorical = [c for c in cats if c in cats_full and c in cats_head]
    model.categorical_as_codes_ = [c for c in cats if c not in categorical]
    if model.categorical_as_codes_:
        logging.getLogger("replaylab").warning(
            "lightgbm.dask: %s train as numeric category codes: too few values on some "
            "training partition for every rank to bin them as categorical",
            ", ".join(model.categorical_as_codes_))
    model.empty_partitions_ = int(full_X.npartitions - len(keep_full))

    def non_empty(X: Any, y: Any, keep: list[int]) -> tuple[Any, Any]:
        return (X, y) if len(keep) == X.npartitions else (X.partitions[keep],
                                                          y.partitions[keep])

    same = head_X is full_X
    full_X, full_y = non_empty(full_X, full_y, keep_full)
    head_X, head_y = (full_X, full_y) if same else non_empty(head_X, head_y, keep_head)
    boosters, best, stopped = fit_quantile_boosters_dask(
        client, head_X, head_y, full_X, full_y, tail_X, tail_y, n_tail, qs, cfg, demand.seed,
        categorical=categorical, n_workers=n_workers,
        wait_s=dask.config.get("replaylab.lost-worker-wait", LOST_WORKER_WAIT_S))
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
