"""`pipeline=demand`: THE demand pipeline, written once against `compute.Engine`; the
ledger never on the driver under `compute=dask`, in this process under `compute=local`
(`pipelines.demand.train_demand` runs it on a `LocalEngine` over a ledger in memory).

`train_demand_partitions` runs the stages over the partitions of a ledger
(`Engine.read_ledger` of a dataset, or `Engine.from_validated` of one in memory) on
either engine; the driver receives counts, fitted parameters and sums:

1. read, validate and quarantine per partition; fingerprint, project and split by
   the one projection recipe on the engine (`projection.project_on`: sessions whole in
   one partition, exact split boundaries);
2. labels per partition (`demand.labels.demand_labels`): the ledger's
   finish_reason and lifecycle_state travel beside the features by the same
   session_id shuffle (same hash, same partition count: the same partition),
   every row checked to have found its ledger row;
3. baselines fitted exactly as locally, to the same classes
   (`demand.baselines`): global quantiles by an exact distributed selection
   (`compute.ops.exact_quantiles`: numpy's `quantile` bit for bit);
   category-bucket tables by a shuffle on the bucket key and pandas' groupby
   quantile per bucket on the partition holding it (the local code on the same
   values); the session EWMA ratio quantiles by the exact selection;
4. the quantile boosters: on a LocalEngine the local estimator on the collected train
   rows; on a DaskEngine `lightgbm.dask` fed from the train split's partitions
   (`compute.lgbm.fit_boosters`), the early-stopping tail the local rule's
   session-grouped, time-ordered cut;
5. conformal calibration from the calibration split's conformity scores,
   computed per partition. Up to `CALIBRATION_COLLECT_MAX` labelled rows the
   (score, cell) pairs of every predictor are collected (5M rows x 5 float64
   scores + a cell string: about 300 MB at the bound) and the corrections are the
   exact local ones (`GroupConformal.fit_scores`). Beyond it, a uniform
   subsample of exactly `CALIBRATION_COLLECT_MAX` rows without replacement, by
   the smallest values of a hash of request_id (`compute.ops.hash_uniform`), is
   collected instead: the hash does not look at the scores, so the subsample is
   a uniformly random subset of an exchangeable calibration set, itself
   exchangeable with a test row, and split conformal's finite-sample guarantee
   P(y in interval) >= level holds with n = the subsample's size (per cell: the
   cell's rows of the subsample are a uniform subset of the cell's rows, the
   guarantee holds per cell conditionally on its subsample size). Only the
   correction's sampling variability grows (of order 1/sqrt(n));
6. test metrics as partition sums (pinball per level, coverage, width, MAE, the
   raw band, per-group tables, censored rows, reliability), every predictor on
   the same labelled rows; intervals by THE session bootstrap of both engines
   (`demand.metrics.session_replicates`): w[b, s] ~ Poisson(1) from a hash of
   (session_id, b) (`compute.ops.poisson_weights`), so every partition draws the
   same weight for the same session without talking to the others, and the local
   run draws the same; N_BOOT = 1000 replicates (the cost is B x sessions per
   partition, in blocks of 4,096 sessions); the gate is `demand.gate.demand_gate`,
   the local rule, on these aggregates;
7. predictions written per test partition as Parquet (by the workers on Dask),
   one file per partition (`DIR/predictions_test/part-*.parquet`), the local file's
   columns;
8. the interval serving will serve (`demand.served`, the local rule): each test
   partition returns, per row, what the replay of the runtime's online recalibration
   needs (dispatch and end time, cell, the model's base band, prompt, cap, actual,
   session: 12 values, about 100 bytes a row, 100 MB per million test rows); the
   driver replays them in dispatch order with the local function, writes
   `DIR/served_test.parquet` (request_id, served-lo-80, served-hi-80) and the gate
   judges that interval's coverage, its interval from the same Poisson(1) session
   weights as every other figure.

Where each step lives: this module holds the stages (read, project and label, the
summary, the report) and the label counts; the predictors fitted on engine frames
(steps 3 to 5: `fit_baselines`, `fit_model`, `calibrate`) are
`replaylab.demand.fit_partitions`; the test figures as partition sums (steps 6 and 7)
are `pipelines.demand_figures`.

Dask against the in-memory local run on the same rows (bench/bench_demand_dask.py, a
synthetic ledger of 1,094,273 rows in 16 Parquet parts, 2 worker processes x 1
thread, 2026-12-06, before the move onto the engine; the in-memory run was then a
separate driver, since 2026-12-07 this pipeline on a LocalEngine, whose figures equal
the old driver's to 1e-13 relative on `make run`'s ledger): accounting, splits, labels and
time windows equal; every baseline's fitted state equal (global quantiles and bucket
tables bit for bit) and its test figures equal to 1e-13 (summation order); the model's
test mean pinball -3.0e-6 relative (28.09434 vs 28.09443), per level within 7.3e-5
relative, coverage -0.0037 (0.8018 vs 0.8056), mean width -0.09%; per-row model
quantiles differ by a median 1e-4 and a 99th percentile 2.5% relative. The tolerances
the tests hold the model to: mean pinball 5% relative, coverage 0.04 absolute.

Differences between the engines, by construction: on Dask the boosters
(LightGBM's distributed bins and per-worker quantile leaf averaging, `compute.lgbm`), so
the model's predictions, its interval and every figure of the model differ a little;
the baselines' fitted state and figures do not (exact), nor any interval's bootstrap
(one hashed Poisson bootstrap on both engines). HPO (`hpo`: an Optuna search before the
model stage's final fit) runs on either engine: each trial is `fit_model` on the engine,
scored by its validation tail's mean pinball (`_validation_pinball`). The censoring
variant (`demand.fit_partitions.choose_censoring`: `auto` fits every variant and picks on
the calibration split's partition sums) runs on either engine, except the `pinball`
variant's censored stage, which trains in one process: under Dask `auto` chooses between
`none` and `realized` and says so. The HTML report recomputes from a uniform sample of
rows.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from replaylab.compute.ops import hashed_sample, key_hash, sample_rows
from replaylab.contracts import Ledger as L
from replaylab.contracts.columns import KEY_COLUMNS
from replaylab.demand.baselines import bucket_keys
from replaylab.demand.censoring import NONE
from replaylab.demand.config import DemandConfig
from replaylab.demand.conformal import GroupConformal
from replaylab.demand.fit_partitions import (
    calibrate,
    choose_censoring,
    fit_baselines,
    fit_model,
    model_rows,
    select,
)
from replaylab.demand.gate import N_BOOT
from replaylab.demand.hpo import HPOConfig, OnTrial, search_hyperparameters
from replaylab.demand.labels import (
    ABSENT_USAGE,
    CLASS_COLUMN,
    LABEL,
    LOWER_BOUND_CLASSES,
    PROMPT_ABSENT,
    DemandDataError,
    demand_labels,
)
from replaylab.demand.metrics import quantile_key
from replaylab.demand.model import MODEL, request_cap
from replaylab.demand.served import END_MS, ledger_end_ms
from replaylab.jsonsafe import json_safe
from replaylab.pipelines.demand_figures import (
    eval_part,
    eval_sum,
    served_replay,
    test_section,
)
from replaylab.pipelines.demand_outputs import DemandRun, select_golden_rows
from replaylab.pipelines.project import write_features
from replaylab.projection import ProjectionConfig, SplitConfig, feature_columns, project_on
from replaylab.tracking.demand_report import write_demand_report

CALIBRATION_COLLECT_MAX = 5_000_000  # calibration rows whose scores are collected exactly
STAGES = {"read": "read and validate per partition, the quarantine written per partition",
          "project": "the ledger fingerprint, projection, exact split boundaries and labels "
                     "per partition; the features written per partition",
          "model": "the quantile boosters (local LightGBM, or lightgbm.dask on the cluster)",
          "calibrate": "baselines (exact) and conformal calibration scores",
          "evaluate": "test metrics as partition sums, predictions written per partition",
          "report": "the report's figures from a uniform sample of the predictions"}
GOLDEN_SAMPLE = 5_000  # test rows (hashed sample) the golden rows are picked from
REPORT_ROWS = 100_000  # test predictions (hashed sample) the report's figures are drawn from
GOLDEN_SALT = 7  # the golden and report samples' hash stream (seed + this)
LEDGER_LABEL_COLUMNS = (L.SESSION_ID, L.REQUEST_ID, L.FINISH_REASON, L.LIFECYCLE_STATE,
                        L.ENDED_AT, L.DURATION_MS)  # the end: when serving gets the actual


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
    aligned[L.TIMESTAMP] = part[L.TIMESTAMP].to_numpy()
    return part.assign(**{CLASS_COLUMN: labels.label_class, END_MS: ledger_end_ms(aligned)})


def _columns(part: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    return part[cols]


def attach_labels(engine: Any, features: Any, valid: Any, failed_is_censored: bool) -> Any:
    """Features with `label_class` and the modeled end columns, per partition (no
    gathering): the ledger's label columns travel to the features' partitions by the same
    session_id shuffle (same hash, same partition count: the same partition), every row
    checked to have found its ledger row."""
    cols = [c for c in LEDGER_LABEL_COLUMNS if c in engine.columns(valid)]
    small = engine.shuffle_by(engine.map(_columns, valid, cols,
                                         meta=engine.meta(valid)[cols]), L.SESSION_ID)
    meta = engine.meta(features).assign(**{CLASS_COLUMN: pd.Series([], dtype=object),
                                               END_MS: pd.Series([], dtype="float64")})
    return engine.map_aligned(_label_part, features, small, failed_is_censored, meta=meta)


def _facts_part(part: pd.DataFrame, group_columns: tuple[str, ...]) -> dict:
    """Counts per (split, class), time window per split, train label rows' group values."""
    counts = part.groupby(["split", CLASS_COLUMN]).size()
    t = part[L.TIMESTAMP].to_numpy(dtype="int64")
    window = {}
    for s in ("train", "calibration", "test"):
        m = (part["split"] == s).to_numpy()
        if m.any():
            window[s] = (int(t[m].min()), int(t[m].max()))
    train = part[(part["split"] == "train") & (part[CLASS_COLUMN] == LABEL)]
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


# ------------------------------------------------------------------ entry


def _without(part: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    return part.drop(columns=cols)


def _part_name(part: pd.DataFrame) -> str:
    """A test partition's predictions file: named by a hash of its first request id (the
    same name for the same partition on either engine and every rerun)."""
    first = str(part[L.REQUEST_ID].iloc[0]) if len(part) else ""
    return f"part-{int(key_hash(np.array([first], dtype=object))[0]):016x}.parquet"


def train_demand_partitions(engine: Any, source: Any, demand: DemandConfig,
                            projection: ProjectionConfig, split: SplitConfig, out_dir: Path, *,
                            blocksize: int | str | None = None, n_boot: int = N_BOOT,
                            calibration_max: int = CALIBRATION_COLLECT_MAX,
                            injected_defects: dict | None = None,
                            hpo: HPOConfig | None = None, on_trial: OnTrial | None = None,
                            progress: Callable[[str], None] | None = None) -> tuple[dict, Any]:
    """The demand pipeline over the partitions of `engine` (module docstring).

    source: a ledger dataset spec (file, directory, glob, hive: `Engine.read_ledger`) or a
    `compute.LedgerFrame` already read. Writes quarantine/, features/ and
    predictions_test/ (Parquet, per partition) and served_test.parquet under out_dir and
    returns (summary, `DemandRun`); one partition of test rows (a LocalEngine): the
    predictions in predictions_test.parquet and the features in features.parquet, as
    `artifacts.rescore_demand.run_test_rows` reads them. Raises DemandDataError
    when nothing can be trained (`labels.check_trainable`'s rules).

    hpo: an Optuna search over the model's hyperparameters before the final fit
    (`demand.hpo.search_hyperparameters`), each trial fitted on the engine and scored on
    the validation tail of train (`on_trial(number, params, value)` per finished trial;
    the entry point logs each as a nested MLflow run).

    progress(text): the stage lines (`Engine.stages`, `STAGES`; default the `replaylab`
    logger), with a task bar on a TTY under Dask. A worker lost mid-run: Dask recomputes
    its tasks from the graph; the boosters, which lightgbm.dask trains on a fixed set of
    workers, wait (dask config `replaylab.lost-worker-wait`, default
    `compute.lgbm.LOST_WORKER_WAIT_S` s) for the cluster to be back to the workers it
    had when the run started and are refitted once: the same result as an undisturbed
    run; else `StageFailed`, one line naming the stage.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # the workers the run starts with: the boosters train on as many (a lost one is
    # waited for, `compute.lgbm`), so the model is a function of the rows and this number
    workers = int(engine.facts().get("n_workers", 1))
    stage = engine.stages(STAGES, progress)
    with stage:
        with stage("read"):
            is_spec = isinstance(source, (str, os.PathLike))
            ds = engine.read_ledger(str(source), blocksize=blocksize) if is_spec else source
            quarantine = ds.write_quarantine(str(out_dir / "quarantine"))
            accounting = ds.accounting
            where = str(source) if is_spec else accounting.source
            if accounting.rows_valid == 0:
                raise DemandDataError(f"{where}: no valid ledger rows "
                                      f"({accounting.rows_quarantined} quarantined, see "
                                      "quarantine/): nothing to train on")
        with stage("project"):
            projected = project_on(engine, ds.valid, projection, split)
            features, splits = projected.features, projected.splits  # split: a column
            fingerprint, version = projected.fingerprint, projected.version
            lab = engine.persist(attach_labels(engine, features, ds.valid,
                                               demand.failed_is_censored))
            facts = _facts_sum(engine.each(_facts_part, lab, tuple(demand.group_columns)))
            sessions = sum(splits["sessions"].values())
            check_trainable_counts(facts["counts"], sessions, demand.min_train_rows,
                                   demand.min_calibration_rows, where)
            features_path = write_features(engine, engine.map(
                _without, lab, [CLASS_COLUMN, END_MS], meta=engine.meta(features)), out_dir)

        with stage("model"):
            hpo_facts, hpo_s = None, None
            try:
                if hpo is not None and hpo.trials > 0:
                    t0 = time.perf_counter()
                    train_rows = engine.persist(model_rows(engine, lab, demand, NONE))
                    best, hpo_facts = search_hyperparameters(
                        lambda model_cfg: _validation_pinball(engine, train_rows, demand,
                                                              model_cfg, workers),
                        demand.model, hpo, study_suffix=version, on_trial=on_trial)
                    demand = dataclasses.replace(demand, model=best)
                    del train_rows
                    hpo_s = time.perf_counter() - t0
                model, censoring = choose_censoring(engine, lab, demand, facts["counts"],
                                                    workers, calibration_max)
            except Exception as e:
                from replaylab.compute.lgbm import WorkersLost

                if isinstance(e, WorkersLost):  # what the worker died of: the nannies
                    raise stage.failure("model", e, "LightGBM (lightgbm.dask)") from e
                raise

        with stage("calibrate"):
            train = engine.persist(select(engine, lab, "train", (LABEL,)))
            baselines = fit_baselines(engine, train, demand)
            predictors = {MODEL: model, **baselines}
            calib = select(engine, lab, "calibration", (LABEL,))
            calibrators, scores, cal_how = calibrate(engine, calib, predictors, demand,
                                                     calibration_max)
            cells = scores["cell"].to_numpy(dtype=object)
            reliability = {float(level): GroupConformal(
                level, demand.group_columns, demand.min_group_size, demand.scale).fit_scores(
                    scores[f"score:{MODEL}"].to_numpy(), cells)
                for level in demand.reliability_levels}
            del scores

        with stage("evaluate"):
            test = engine.persist(select(engine, lab, "test", None))
            pred_dir = out_dir / "predictions_test"
            pred_dir.mkdir(parents=True, exist_ok=True)
            for old in pred_dir.glob("part-*.parquet"):
                old.unlink()
            agg = eval_sum(engine.each(eval_part, test, predictors, calibrators, reliability,
                                       demand, n_boot, str(pred_dir), _part_name))
            pred_path = _one_file_if_one_partition(pred_dir, engine.npartitions(test),
                                                   out_dir / "predictions_test.parquet")
            test_rows = splits["rows"].get("test", 0)
            served = served_replay(agg.pop("served_rows"), calibrators[MODEL], demand, n_boot,
                                   out_dir)
            section = test_section(agg, list(predictors), demand, n_boot,
                                   facts["train_groups"], test_rows, served)
            frac = min(1.0, GOLDEN_SAMPLE / max(test_rows, 1))
            sample = engine.collect(hashed_sample(engine, test, frac, demand.seed + GOLDEN_SALT,
                                                  key=L.REQUEST_ID))
    took = stage.timings
    timings = {"projection": took["read"] + took["project"],
               **({"hpo": hpo_s} if hpo_s is not None else {}),
               "model_fit": took["model"] - (hpo_s or 0.0),
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
    feat_cols = [c for c in feature_columns(engine.meta(features)) if c != "split"]
    on_cluster = getattr(model, "compute_", "local") == "dask"
    summary = {
        "pipeline": "demand",
        **{k: v for k, v in ds.summary().items() if k != "contract"},
        "injected_defects": dict(injected_defects or {}),
        "ledger_fingerprint": fingerprint,
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
            "trained_with": ("lightgbm.dask (compute.lgbm.fit_boosters)" if on_cluster
                             else "lightgbm (QuantileDemandModel.fit)"),
            "lightgbm_categorical": model.lightgbm_categorical(),
            "categorical_as_codes": list(getattr(model, "categorical_as_codes_", [])),
            "train_partitions_without_rows": int(getattr(model, "empty_partitions_", 0)),
            "workers": workers},  # the model is a function of the rows and this number
        "censoring": censoring,
        "hpo": hpo_facts or {"trials_run": 0},
        "calibration": {
            "rows": cal_how["rows"], "level": demand.interval, "scale": demand.scale,
            "group_columns": list(demand.group_columns),
            "min_group_size": demand.min_group_size,
            "global_correction": cal.global_correction_, "cells": cal.cells(),
            "pinball": cal_how["pinball"], "scores_used": cal_how["scores_used"],
            "rule": cal_how["rule"]},
        "gate": section.pop("gate"),
        "test": section,
        "artifacts": {**({"quarantine": quarantine} if quarantine else {}),
                      "features": features_path,
                      "predictions_test": str(pred_path),
                      "served_test": str(out_dir / "served_test.parquet")},
        "partitions": int(ds.npartitions),
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
    }
    summary = json_safe(summary)
    with stage, stage("report"):
        report, report_rows = _write_report(pred_path, summary, out_dir, demand.seed)
    summary["reports"] = {"html": str(report),
                          "rows": f"figures from a uniform sample of {report_rows:,} of "
                                  f"{int(test_rows):,} test predictions (hash of request_id); "
                                  "every figure of summary.json is a partition sum"}
    summary["timings_s"]["report"] = round(stage.timings["report"], 3)
    run = DemandRun(demand, model, cal, baselines,
                    {k: c for k, c in calibrators.items() if k != MODEL}, version, fingerprint,
                    list(model.feature_names_), window, golden)
    return summary, run


def _one_file_if_one_partition(pred_dir: Path, npartitions: int, one: Path) -> Path:
    """The test predictions where readers expect them: `one` (predictions_test.parquet) when
    the test rows were one partition (moved from pred_dir), else pred_dir, a Parquet file per
    partition; the other form, a previous run's in the same folder, is removed."""
    files = sorted(pred_dir.glob("part-*.parquet"))
    if npartitions == 1 and len(files) == 1:
        files[0].replace(one)
        pred_dir.rmdir()
        return one
    one.unlink(missing_ok=True)
    return pred_dir


def _write_report(pred_path: Path, summary: dict, out_dir: Path, seed: int
                  ) -> tuple[Path, int]:
    """`write_demand_report` from the summary and a bounded uniform sample of the written
    predictions (at most REPORT_ROWS rows, by a hash of request_id), read file by file
    (pred_path: one file, or a folder of them)."""
    n = int(summary["test"]["rows"])
    frac = min(1.0, REPORT_ROWS / max(n, 1))
    files = sorted(pred_path.glob("part-*.parquet")) if pred_path.is_dir() else [pred_path]
    parts = [sample_rows(pd.read_parquet(f), frac, seed + GOLDEN_SALT, L.REQUEST_ID)
             for f in files]
    sample = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    sample = sample.sort_values(L.TIMESTAMP, kind="stable").reset_index(drop=True)
    return write_demand_report(sample, summary, out_dir), len(sample)


def _validation_pinball(engine: Any, rows: Any, demand: DemandConfig, model_cfg: Any,
                        workers: int) -> float:
    """An HPO trial: the label-rows model fitted on the engine with `model_cfg` (early
    stopping on the time-ordered tail of train); its mean pinball on that tail. The score
    is the early-stopped boosters', so the trial skips the refit on all of train (the
    chosen parameters' final fit makes it)."""
    trial = dataclasses.replace(model_cfg, refit_full_train=False)
    model = fit_model(engine, rows, dataclasses.replace(demand, model=trial), NONE, workers)
    val = model.validation_pinball_
    return float(np.mean(list(val.values()))) if val else math.nan


__all__ = ["CALIBRATION_COLLECT_MAX", "attach_labels", "check_trainable_counts",
           "train_demand_partitions"]
