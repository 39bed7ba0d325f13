"""The demand pipeline: ledger in; baselines, quantile model, conformal calibration, test scores out.

`train_demand` projects and labels the valid rows (`pipelines.demand_model.prepare_data`:
the one projection recipe, `projection.project`, time-ordered, session-grouped,
embargoed splits), fits the quantile model (`pipelines.demand_model.choose_censoring`)
and the baselines on
train labels, calibrates each one's interval on the calibration split, scores
all of them on the same test rows, writes `predictions_test.parquet` and
returns the summary plus a `DemandRun` holding the fitted objects (for export).
The rules for censored, cancelled and absent-usage rows: docs/design/demand-target.md;
how the model trains on rows cut at their cap (`demand.censoring`, chosen on the
calibration split by default): `replaylab.demand.censoring`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from replaylab.contracts import Ledger as L
from replaylab.contracts.columns import KEY_COLUMNS
from replaylab.contracts.columns import Projected as P
from replaylab.demand.baselines import bucket_keys, make_baselines
from replaylab.demand.config import DemandConfig
from replaylab.demand.conformal import GroupConformal, cell_keys, reliability_curve
from replaylab.demand.gate import N_BOOT, gate_from_rows
from replaylab.demand.hpo import HPOConfig, OnTrial, search_hyperparameters
from replaylab.demand.inputs import prompt_tokens
from replaylab.demand.labels import (
    ABSENT_USAGE,
    CANCELLED,
    CLASS_COLUMN,
    label_counts,
)
from replaylab.demand.metrics import (
    bootstrap_means,
    interval_metrics,
    lower_bound_metrics,
    mean_pinball,
    pinball_losses,
    quantile_key,
    row_figures,
)
from replaylab.demand.model import MODEL, QuantileDemandModel, base_band, request_cap
from replaylab.demand.served import (
    SERVED,
    end_ms_of,
    feedback_actuals,
    rows_per_day,
    served_band,
    served_section,
)
from replaylab.jsonsafe import json_safe
from replaylab.pipelines.demand_model import (
    DemandData,
    choose_censoring,
    prepare_data,
    validation_pinball,
)
from replaylab.pipelines.project import LoadedLedger, write_run_inputs
from replaylab.projection import (
    ProjectionConfig,
    SplitConfig,
    feature_columns,
    split_counts,
)
from replaylab.tracking.demand_report import write_demand_report

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


@dataclass
class _Scored:
    """One predictor's outputs on the calibration (labelled) and test (all) rows."""

    calib_q: np.ndarray  # (n_cal, q) raw quantiles, calibration rows with labels
    test_q: np.ndarray  # (n_test, q) raw quantiles, every test row
    calib_band: tuple[np.ndarray, np.ndarray]  # the base band conformal widens (`base_band`)
    test_band: tuple[np.ndarray, np.ndarray]
    calibrator: GroupConformal
    test_lo: np.ndarray
    test_hi: np.ndarray


def _fit_and_score(predictors: dict[str, Any], data: DemandData, cfg: DemandConfig,
                   cap_test: np.ndarray | None) -> dict[str, _Scored]:
    """Fit the baselines on train, calibrate every predictor, predict every test row."""
    calib, test = data.frame("calibration"), data.frame("test")
    out = {}
    for name, predictor in predictors.items():
        if name != MODEL:  # the model is fitted by the caller (callbacks, timings)
            predictor.fit(data.frame("train"), data.y("train"))
        calib_q, *calib_band = base_band(predictor, calib)
        cq = GroupConformal(cfg.interval, cfg.group_columns, cfg.min_group_size, cfg.scale).fit(
            calib, *calib_band, data.y("calibration"))
        test_q, *test_band = base_band(predictor, test)
        lo, hi = cq.predict_interval(test, *test_band, cap_test)
        out[name] = _Scored(calib_q, test_q, tuple(calib_band), tuple(test_band), cq, lo, hi)
    return out


def _group_rows(test: pd.DataFrame, usable: np.ndarray, y: np.ndarray,
                scored: dict[str, _Scored], cfg: DemandConfig) -> list[dict]:
    """Model metrics per value of each group attribute (separately), on labelled test rows."""
    rows = []
    keys = bucket_keys(test, cfg.group_columns)
    m = scored[MODEL]
    for by in cfg.group_columns:
        values = keys[by].to_numpy(dtype=object)
        for value in sorted(set(values[usable].tolist())):
            sel = usable & (values == value)
            pin = pinball_losses(y[sel], m.test_q[sel], cfg.quantiles)
            base = {name: mean_pinball(y[sel], s.test_q[sel], cfg.quantiles)
                    for name, s in scored.items() if name != MODEL}
            best = min(base, key=base.get)
            rows.append({
                "by": by, "value": str(value), "n": int(sel.sum()),
                "coverage": float(np.mean((y[sel] >= m.test_lo[sel]) & (y[sel] <= m.test_hi[sel]))),
                "mean_width": float(np.mean(m.test_hi[sel] - m.test_lo[sel])),
                "pinball": pin, "mean_pinball": float(np.mean(list(pin.values()))),
                "best_baseline": best, "best_baseline_mean_pinball": base[best],
            })
    return rows


def groups_absent_from_test(train: pd.DataFrame, test: pd.DataFrame,
                            group_columns: list[str] | tuple[str, ...]) -> dict[str, list[str]]:
    """Per group column, the values the model trained on that no labelled test row has
    (their coverage and pinball are not measured by this run; the report lists them)."""
    tr, te = bucket_keys(train, group_columns), bucket_keys(test, group_columns)
    out = {}
    for by in group_columns:
        gone = sorted(set(map(str, tr[by])) - set(map(str, te[by])))
        if gone:
            out[by] = gone
    return out


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


def served_interval(data: DemandData, m: _Scored, demand: DemandConfig,
                    cap_test: np.ndarray | None, end_ms: np.ndarray):
    """The model's interval as serving will serve it over the test window
    (`replaylab.demand.served`): every test row, (n_test,) lo and hi in a `ServedBand`."""
    test, labels, tm = data.frame("test"), data.labels, data.masks["test"]
    cq = m.calibrator
    return served_band(test[L.TIMESTAMP].to_numpy(dtype="float64"), end_ms,
                       cell_keys(test, demand.group_columns), cq.corrections_,
                       cq.global_correction_, demand.interval, *m.test_band,
                       prompt_tokens(test), cap_test,
                       feedback_actuals(labels.y_total[tm], labels.label_class[tm]),
                       labels.lower_bound[tm], demand.scale, demand.served)


def write_served(request_id: pd.Series, served, demand: DemandConfig, out_dir: Path) -> Path:
    """OUT/served_test.parquet: each test request's served interval (`served-lo-80`,
    `served-hi-80`), the interval the gate judged; both engines write it."""
    lvl = level_label(demand.interval)
    path = Path(out_dir) / "served_test.parquet"
    pd.DataFrame({L.REQUEST_ID: np.asarray(request_id, dtype=object),
                  f"{SERVED}-lo-{lvl}": served.lo, f"{SERVED}-hi-{lvl}": served.hi}
                 ).to_parquet(path, index=False)
    return path


def _evaluate(data: DemandData, scored: dict[str, _Scored], demand: DemandConfig,
              cap_test: np.ndarray | None, served) -> dict:
    """The `test` section: every predictor on the same labelled rows; lower bounds apart.
    served: the model's `ServedBand` over the test window, which the gate judges."""
    test, labels, tm = data.frame("test"), data.labels, data.masks["test"]
    usable, y = labels.usable[tm], labels.y_total[tm]
    tests = {name: interval_metrics(y[usable], s.test_q[usable], s.test_lo[usable],
                                    s.test_hi[usable], demand.quantiles)
             for name, s in scored.items()}
    m = scored[MODEL]
    lb = labels.lower_bound[tm]
    reliability = reliability_curve(
        demand.reliability_levels, data.frame("calibration"),
        m.calib_band, data.y("calibration"),
        test[usable], (m.test_band[0][usable], m.test_band[1][usable]), y[usable],
        None if cap_test is None else cap_test[usable],
        demand.group_columns, demand.min_group_size, demand.scale)
    session = test[L.SESSION_ID].to_numpy(dtype=object)[usable]
    per_day = rows_per_day(test[L.TIMESTAMP].to_numpy(dtype="float64")[usable])
    _intervals(tests, scored, y[usable], usable, session, demand)
    baselines = {k: v for k, v in tests.items() if k != MODEL}
    best = min(baselines, key=lambda k: baselines[k]["mean_pinball"])
    top = quantile_key(demand.quantiles[-1])
    gate = gate_from_rows(demand.interval, y[usable], m.test_q[usable], served.lo[usable],
                          served.hi[usable], {k: s.test_q[usable] for k, s in scored.items()
                                              if k != MODEL},
                          demand.quantiles, session, N_BOOT, demand.seed,
                          interval=SERVED if demand.served.online else "frozen",
                          frozen_coverage=tests[MODEL]["coverage"], rows_per_day=per_day)
    return {
        "gate": gate,
        "served": served_section(served, y, usable, m.test_lo, m.test_hi, demand.served,
                                 gate["coverage"]["ci"], per_day, gate["coverage"]["sessions"]),
        "intervals": intervals_text(N_BOOT),
        "rows": int(tm.sum()), "labelled_rows": int(usable.sum()),
        "model": tests[MODEL], "baselines": baselines, "best_baseline": best,
        "model_beats": {
            "best_baseline_mean_pinball":
                tests[MODEL]["mean_pinball"] < baselines[best]["mean_pinball"],
            f"every_baseline_pinball_{top}":
                all(tests[MODEL]["pinball"][top] < b["pinball"][top] for b in baselines.values()),
        },
        "groups": _group_rows(test, usable, y, scored, demand),
        "groups_absent_from_test": groups_absent_from_test(data.frame("train"), test[usable],
                                                           demand.group_columns),
        "censored": lower_bound_metrics(y[lb], m.test_hi[lb], labels.label_class[tm][lb]),
        "reliability": reliability,
    }


def intervals_text(n_boot: int) -> str:
    """The summary's `test.intervals` line (both engines: the one session bootstrap)."""
    return (f"ci: 95% percentile intervals, {n_boot} session-cluster Poisson bootstrap "
            "replicates (w[b, s] ~ Poisson(1) from hash(session_id, b); every predictor on "
            "the same weights)")


def _intervals(tests: dict[str, dict], scored: dict[str, _Scored], y: np.ndarray,
               usable: np.ndarray, session: np.ndarray, demand: DemandConfig) -> None:
    """Add `ci` (95% session-bootstrap interval of every figure: pinball per level, mean
    pinball, coverage, width, MAE) to each predictor's test metrics, all predictors on the
    same replicates (`replaylab.demand.metrics.bootstrap_means`: the hashed Poisson session
    bootstrap, the same weights under either engine)."""
    values = {}
    for name, s in scored.items():
        for k, v in row_figures(y, s.test_q[usable], s.test_lo[usable], s.test_hi[usable],
                                demand.quantiles).items():
            values[f"{name}|{k}"] = v
    ci = bootstrap_means(values, session, N_BOOT, demand.seed)
    for key, interval in ci.items():
        name, k = key.split("|", 1)
        tests[name].setdefault("ci", {})[k] = interval


def _model_facts(model: QuantileDemandModel, demand: DemandConfig) -> dict:
    val = model.validation_pinball_
    importance = sorted(model.feature_importance().items(), key=lambda kv: -kv[1])
    return {
        "best_iterations": {quantile_key(q): k for q, k in
                            zip(demand.quantiles, model.best_iterations_, strict=True)},
        "validation": {"rows": model.validation_rows_, "pinball": val,
                       "mean_pinball": float(np.mean(list(val.values()))) if val else None},
        "feature_importance_gain": dict(importance[:15]),
    }


def _data_facts(data: DemandData, projection: ProjectionConfig, split: SplitConfig) -> dict:
    sessions = data.features.groupby(data.splits)[L.SESSION_ID].nunique()
    return {
        "ledger_fingerprint": data.fingerprint,
        "projection": {"version": data.version, "rows": int(len(data.features)),
                       "assume_ended_before_next": projection.assume_ended_before_next,
                       "ewma_alpha": projection.ewma_alpha, "split_config": asdict(split),
                       "feature_columns": feature_columns(data.features)},
        "splits": {"rows": split_counts(pd.Series(data.splits)),
                   "sessions": {str(k): int(v) for k, v in sessions.items()}},
        "time_window": _time_window(data),
        "labels": label_counts(data.labels, data.splits),
    }


def _time_window(data: DemandData) -> dict[str, Any]:
    """First and last dispatch (epoch ms) of each split's rows."""
    t = data.features[L.TIMESTAMP].to_numpy(dtype="int64")
    return {s: {"first_ms": int(t[data.splits == s].min()), "last_ms": int(t[data.splits == s].max())}
            for s in ("train", "calibration", "test") if (data.splits == s).any()}


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


def train_demand(loaded: LoadedLedger, projection: ProjectionConfig, split: SplitConfig,
                 demand: DemandConfig, out_dir: Path, *,
                 trial_callback: Callable[[dict[str, float]], None] | None = None,
                 hpo: HPOConfig | None = None, on_trial: OnTrial | None = None,
                 write_ledger: bool = False) -> tuple[dict, DemandRun]:
    """Train, calibrate and test every demand predictor; write predictions; return the summary.

    trial_callback: called once, before the test split is touched, with
    validation figures ({"validation_mean_pinball", "calibration_mean_pinball"});
    an HPO driver reports them (and may raise to prune). hpo: an Optuna search
    over the model's hyperparameters on the validation tail of train before the
    final fit (`on_trial(number, params, value)` per finished trial; the entry
    point logs each as a nested MLflow run). Everything runs in this process
    (compute=local; `pipelines.demand_partitions.train_demand_partitions` is the same
    pipeline over engine partitions). Raises DemandDataError
    when the ledger cannot train a model (no usable labels, a single session,
    everything censored, too few calibration rows).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    artifacts = write_run_inputs(loaded, out_dir, write_ledger)
    t0 = time.perf_counter()
    data = prepare_data(loaded, projection, split, demand)
    timings["projection"] = time.perf_counter() - t0
    cap_test = request_cap(data.frame("test")) if demand.clip_to_cap else None

    hpo_facts = None
    if hpo is not None and hpo.trials > 0:
        t0 = time.perf_counter()
        best, hpo_facts = search_hyperparameters(
            lambda model_cfg: validation_pinball(data, demand, model_cfg),
            demand.model, hpo, study_suffix=data.version, on_trial=on_trial)
        demand = dataclasses.replace(demand, model=best)
        timings["hpo"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    model, censoring = choose_censoring(data, demand)
    timings["model_fit"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    baselines = make_baselines(demand.quantiles, demand.default_max_tokens,
                               demand.bucket_columns, demand.min_bucket_size)
    scored = _fit_and_score({MODEL: model, **baselines}, data, demand, cap_test)
    timings["baselines_and_calibration"] = time.perf_counter() - t0

    m = scored[MODEL]
    calib_pin = pinball_losses(data.y("calibration"), m.calib_q, demand.quantiles)
    if trial_callback is not None:
        val = model.validation_pinball_
        trial_callback({
            "validation_mean_pinball": float(np.mean(list(val.values()))) if val else math.nan,
            "calibration_mean_pinball": float(np.mean(list(calib_pin.values())))})

    features_path = out_dir / "features.parquet"  # the projection this run trained on
    data.features.assign(split=data.splits).to_parquet(features_path, index=False)
    artifacts["features"] = str(features_path)
    t0 = time.perf_counter()
    served = served_interval(data, m, demand, cap_test,
                             end_ms_of(data.frame("test"), loaded.result.valid))
    timings["served_replay"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    test = _evaluate(data, scored, demand, cap_test, served)
    timings["evaluation"] = time.perf_counter() - t0
    path = out_dir / "predictions_test.parquet"
    tm, lab = data.masks["test"], data.labels
    predictions = predictions_frame(data.frame("test"), lab.y_total[tm], lab.label_class[tm],
                                    lab.lower_bound[tm], {k: (v.test_q, v.test_lo, v.test_hi)
                                                          for k, v in scored.items()}, demand)
    predictions.to_parquet(path, index=False)
    artifacts["predictions_test"] = str(path)
    artifacts["served_test"] = str(write_served(predictions[L.REQUEST_ID], served, demand,
                                                out_dir))

    summary = {
        "pipeline": "demand",
        **{k: v for k, v in loaded.result.summary().items() if k != "contract"},
        "injected_defects": loaded.injected_defects,
        **_data_facts(data, projection, split),
        "interval": demand.interval,
        "quantiles": list(demand.quantiles),
        "demand_config": demand.to_dict(),
        "model": _model_facts(model, demand),
        "censoring": censoring,
        "hpo": hpo_facts or {"trials_run": 0},
        "calibration": {
            "rows": int(data.masks["calibration"].sum()), "level": demand.interval,
            "scale": demand.scale, "group_columns": list(demand.group_columns),
            "min_group_size": demand.min_group_size,
            "global_correction": m.calibrator.global_correction_,
            "cells": m.calibrator.cells(), "pinball": calib_pin,
        },
        "gate": test.pop("gate"),
        "test": test,
        "artifacts": artifacts,
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
    }
    golden = select_golden_rows(data.frame("test"), m.test_q, cap_test, demand.group_columns,
                                [*KEY_COLUMNS, *model.feature_names_], seed=demand.seed)
    run = DemandRun(demand, model, m.calibrator, baselines,
                    {k: s.calibrator for k, s in scored.items() if k != MODEL},
                    data.version, data.fingerprint, list(model.feature_names_),
                    _time_window(data), golden)
    summary = json_safe(summary)
    t0 = time.perf_counter()
    report = write_demand_report(predictions, summary, out_dir)
    summary["reports"] = {"html": str(report)}
    summary["timings_s"]["report"] = round(time.perf_counter() - t0, 3)
    return summary, run
