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
from replaylab.demand.censoring import NONE, PINBALL, REALIZED, VARIANTS, select_censoring
from replaylab.demand.config import DemandConfig
from replaylab.demand.conformal import GroupConformal, cell_keys, cqr_scores
from replaylab.demand.inputs import check_quantiles, output_labels, prompt_tokens
from replaylab.demand.labels import CLASS_COLUMN, LABEL
from replaylab.demand.metrics import quantile_key, row_pinball
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
    return observed_rows(engine, lab, "train", demand)


def observed_rows(engine: Any, lab: Any, split: str, demand: DemandConfig) -> Any:
    """The label rows of `split` and its rows of the censored classes training may use,
    those with an observed total (a lower bound for the censored ones)."""
    rows = select(engine, lab, split, (LABEL, *demand.censoring.classes))
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
    pin = np.sum(engine.each(_pin_sums, scored, len(qs)), axis=0) if MODEL in predictors \
        else None  # the model's calibration pinball (censoring variants: no MODEL key)
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
    if pin is not None:
        how["pinball"] = {quantile_key(q): float(pin[j] / n) for j, q in enumerate(qs)}
    return cal, got, how


# ------------------------------------------------------------------ censoring variants


def _variant_sums(part: pd.DataFrame, models: dict, calibrators: dict, demand: DemandConfig,
                  t_mid: float | None) -> dict:
    """Per variant, the sums of `variant_figures` over one partition's label rows (pinball
    per level, covered, width; by half around t_mid) and censored rows (hi >= observed,
    pinball of what they consumed)."""
    k = len(demand.quantiles)
    label = (part[CLASS_COLUMN] == LABEL).to_numpy()
    y = part[P.LABEL_TOTAL_DEMAND].to_numpy(dtype="float64")
    t = part[L.TIMESTAMP].to_numpy(dtype="int64")
    later = (t > t_mid) if t_mid is not None else np.zeros(len(part), dtype=bool)
    cap = request_cap(part) if demand.clip_to_cap else None
    out = {}
    for name, model in models.items():
        if not len(part):
            out[name] = {"n": 0, "pin": np.zeros(k), "covered": 0.0, "width": 0.0,
                         "halves_n": np.zeros(2), "halves_pin": np.zeros(2),
                         "capped_n": 0, "capped_hi": 0, "all_pin": np.zeros(k)}
            continue
        q, *band = base_band(model, part)
        lo, hi = calibrators[name].predict_interval(part, *band, cap)
        pin = row_pinball(y, q, demand.quantiles)  # (n, levels)
        row_mean = pin.mean(axis=1)
        halves = [label & ~later, label & later]
        out[name] = {
            "n": int(label.sum()), "pin": pin[label].sum(axis=0),
            "covered": float(((y >= lo) & (y <= hi))[label].sum()),
            "width": float((hi - lo)[label].sum()),
            "halves_n": np.asarray([h.sum() for h in halves], dtype="float64"),
            "halves_pin": np.asarray([row_mean[h].sum() for h in halves]),
            "capped_n": int((~label).sum()), "capped_hi": int((hi >= y)[~label].sum()),
            "all_pin": pin.sum(axis=0)}
    return out


def variant_figures(engine: Any, rows: Any, models: dict, calibrators: dict,
                    demand: DemandConfig) -> dict[str, dict]:
    """Each censoring variant's figures on `rows` (one split's label and censored rows with
    an observed total), as partition sums, what `censoring.select_censoring` reads. Label
    rows: n, mean pinball, coverage, mean width, the mean pinball of the earlier and the
    later half by dispatch time (around the exact median of the label rows' timestamps).
    Censored rows: capped_n, the share with hi >= observed, and the mean pinball of what
    every row consumed (label and censored)."""
    try:
        t_mid = exact_quantiles(engine, select(engine, rows, None, (LABEL,)), L.TIMESTAMP,
                                [0.5])[0]
    except ValueError:  # no label row: no halves
        t_mid = None
    parts = engine.each(_variant_sums, rows, models, calibrators, demand, t_mid)
    out = {}
    for name in models:
        s = {k: sum(p[name][k] for p in parts) for k in parts[0][name]} if parts else {}
        n = int(s.get("n", 0))
        fig: dict[str, Any] = {"n": n}
        if n:
            hn, hp = s["halves_n"], s["halves_pin"]
            fig.update(mean_pinball=float(np.mean(s["pin"] / n)),
                       halves_mean_pinball=[float(hp[0] / hn[0]), float(hp[1] / hn[1])]
                       if hn[0] and hn[1] else None,
                       coverage=float(s["covered"] / n), mean_width=float(s["width"] / n))
        capped = int(s.get("capped_n", 0))
        fig.update(capped_n=capped, capped_hi_ge_obs=None, consumption_mean_pinball=None)
        if capped:
            fig["capped_hi_ge_obs"] = float(s["capped_hi"] / capped)
            fig["consumption_mean_pinball"] = float(np.mean(s["all_pin"] / (n + capped)))
        out[name] = fig
    return out


def choose_censoring(engine: Any, lab: Any, demand: DemandConfig, counts: dict,
                     n_workers: int | None = None,
                     calibration_max: int = 5_000_000) -> tuple[QuantileDemandModel, dict]:
    """The model to keep and the summary's `censoring` section, on either engine.

    lab: the labelled projection (every split, `CLASS_COLUMN`); counts: {(split, class):
    rows}. Fewer censored train rows than `censoring.min_rows`: the label rows alone.
    A configured variant is fitted as configured. `auto` fits every variant (the
    pinball stage's first r trees are the r-round model, one candidate per
    `censoring.rounds`), calibrates each on the calibration label rows and picks on the
    calibration split (`censoring.select_censoring`); each one's test figures are
    reported, never used; with fewer censored calibration rows than `censoring.min_rows`
    nothing can be judged and none is fitted. The `pinball` variant's censored stage trains
    in this process (`QuantileDemandModel.fit`): on a DaskEngine it is not a candidate, and
    configured it falls back to the label rows alone; the section says so."""
    cfg = demand.censoring
    classes = tuple(cfg.classes)
    n_train = sum(v for (s, c), v in counts.items() if s == "train" and c in classes)
    n_cal = sum(v for (s, c), v in counts.items() if s == "calibration" and c in classes)
    section: dict[str, Any] = {"configured": cfg.method, "classes": list(classes),
                               "train_censored_rows": int(n_train),
                               "calibration_censored_rows": int(n_cal)}

    def fit(method: str) -> QuantileDemandModel:
        return fit_model(engine, model_rows(engine, lab, demand, method), demand, method,
                         n_workers)

    local = engine.kind != "dask"
    if n_train < cfg.min_rows:
        section.update(method=NONE, candidate=NONE, reason=f"{n_train} censored train rows < "
                       f"censoring.min_rows={cfg.min_rows}: trained on the label rows alone")
        return fit(NONE), section
    if cfg.method != "auto":
        if cfg.method == PINBALL and not local:
            section.update(method=NONE, candidate=NONE,
                           reason="censoring.method=pinball is not distributed (its censored "
                                  "pinball stage trains in one process): compute=dask trained "
                                  "on the label rows alone")
            return fit(NONE), section
        section.update(method=cfg.method, candidate=cfg.method, reason="configured")
        if cfg.method == PINBALL:
            section["pinball_rounds"] = cfg.rounds[-1]
        return fit(cfg.method), section
    if n_cal < cfg.min_rows:  # select_censoring's first rule, known before any fit
        section.update(method=NONE, candidate=NONE, reason=(
            f"{n_cal} censored calibration rows < censoring.min_rows={cfg.min_rows}: too few "
            "to judge a variant (none fitted)"))
        return fit(NONE), section
    models: dict[str, QuantileDemandModel] = {}
    for method in (VARIANTS if local else (NONE, REALIZED)):
        model = fit(method)
        # the pinball stage's trees are appended: its first r trees are the r-round model
        models.update({f"{PINBALL}@{r}": model.with_censored_rounds(r) for r in cfg.rounds}
                      if method == PINBALL else {method: model})
    calib_labels = select(engine, lab, "calibration", (LABEL,))
    calibrators = calibrate(engine, calib_labels, models, demand, calibration_max)[0]
    figures = {split: variant_figures(engine, observed_rows(engine, lab, split, demand),
                                      models, calibrators, demand)
               for split in ("calibration", "test")}
    candidates = {name: {"calibration": figures["calibration"][name],
                         "test_report_only": figures["test"][name]} for name in models}
    chosen, reason = select_censoring({k: v["calibration"] for k, v in candidates.items()},
                                      cfg.min_rows, cfg.max_pinball_increase,
                                      cfg.min_capped_gain)
    if not local:
        reason += ("; pinball not a candidate under compute=dask (its censored stage trains "
                   "in one process)")
    model = models[chosen]
    section.update(method=model.censoring, candidate=chosen, reason=reason,
                   candidates=candidates)
    if model.censoring == PINBALL:
        section["pinball_rounds"] = model.censored_rounds_
    return model, section
