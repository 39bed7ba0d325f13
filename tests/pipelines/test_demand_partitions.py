"""pipeline=demand over engine partitions (`pipelines.demand_partitions.train_demand_partitions`)
on a DaskEngine and a LocalEngine against the in-memory `train_demand` on the same rows:
accounting, splits and labels equal; every baseline's fitted state equal; the model's test
figures within a tolerance on Dask (the lightgbm.dask boosters differ by construction) and
equal on the LocalEngine (the same local estimator); the one session bootstrap (hashed
Poisson) gives every engine equal intervals; every test row written once to the
partitioned predictions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from replaylab.compute import ComputeConfig, DaskEngine, LocalEngine
from replaylab.compute.ops import exact_quantiles, key_hash, order_statistics, poisson_weights
from replaylab.contracts.columns import Ledger as L
from replaylab.contracts.io import write_table
from replaylab.demand import DemandConfig, QuantileModelConfig
from replaylab.demand.config import CensoringConfig
from replaylab.pipelines.demand import train_demand
from replaylab.pipelines.project import LedgerInput, load_ledger
from replaylab.projection import ProjectionConfig, SplitConfig
from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger

CFG = DemandConfig(model=QuantileModelConfig(num_threads=1, n_estimators=200),
                   censoring=CensoringConfig(method="none"), min_group_size=100)
# the model's figures, dask vs local (observed on this ledger: see the test's comments)
PINBALL_RTOL = 0.05
COVERAGE_ATOL = 0.04
SUBSAMPLE = 300
REALIZED_CFG = DemandConfig(model=QuantileModelConfig(num_threads=1, n_estimators=50),
                            censoring=CensoringConfig(method="realized"), min_group_size=100)


def dask_engine(address: str, client) -> DaskEngine:
    return DaskEngine(ComputeConfig(kind="dask", address=address), client)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, dask_address, dask_client):
    import dask

    from replaylab.pipelines.demand_partitions import train_demand_partitions

    root = tmp_path_factory.mktemp("dd")
    frame = generate_synthetic_ledger(
        SyntheticLedgerConfig(n_sessions=2500, sessions_per_s=0.25), seed=7)
    single = write_table(frame, root / "one" / "ledger.parquet")
    n = len(frame) // 3
    for i, part in enumerate((frame.iloc[:n], frame.iloc[n:2 * n], frame.iloc[2 * n:])):
        write_table(part, root / "ds" / f"part-{i}.parquet")
    projection, split = ProjectionConfig(), SplitConfig(embargo_ms=300_000)
    local, local_run = train_demand(load_ledger(LedgerInput(path=str(single))), projection,
                                    split, CFG, root / "local")
    engine = dask_engine(dask_address, dask_client)  # the session's LocalCluster
    with dask.config.set({"dataframe.convert-string": False}):
        dist, dist_run = train_demand_partitions(engine, str(root / "ds"), CFG, projection,
                                                 split, root / "dask", blocksize=60_000)
        # past the collection bound: a hashed uniform subsample of SUBSAMPLE scores
        sub, sub_run = train_demand_partitions(engine, str(root / "ds"), CFG, projection,
                                               split, root / "dask-sub", blocksize=60_000,
                                               calibration_max=SUBSAMPLE, n_boot=50)
        real = train_demand_partitions(engine, str(root / "ds"), REALIZED_CFG, projection,
                                       split, root / "dask-realized", blocksize=60_000,
                                       n_boot=20)
    parts = train_demand_partitions(LocalEngine(), str(root / "ds"), CFG, projection, split,
                                    root / "local-parts")
    return local, local_run, dist, dist_run, sub, sub_run, real, parts


@pytest.mark.slow
@pytest.mark.integration
def test_accounting_splits_and_labels_equal_local(runs):
    local, _, dist, _, *_ = runs
    for key in ("rows_read", "rows_valid", "rows_quarantined", "quarantine_by_reason",
                "splits", "labels", "time_window", "interval", "quantiles"):
        assert dist[key] == local[key], key
    assert dist["projection"]["rows"] == local["projection"]["rows"]
    assert dist["projection"]["feature_columns"] == local["projection"]["feature_columns"]
    assert dist["test"]["rows"] == local["test"]["rows"]
    assert dist["test"]["labelled_rows"] == local["test"]["labelled_rows"]
    assert dist["calibration"]["rows"] == local["calibration"]["rows"]
    assert dist["partitions"] > 1
    # every summary key of the local run is there
    assert set(local) <= set(dist)
    assert Path(dist["reports"]["html"]).exists()


@pytest.mark.slow
@pytest.mark.integration
def test_baselines_fitted_state_and_figures_equal_local(runs):
    local, lr, dist, dr, *_ = runs
    assert list(dr.baselines) == list(lr.baselines)
    for name, b in lr.baselines.items():
        d = dr.baselines[name]
        assert type(d) is type(b), name
    a, b = lr.baselines["prompt_length"], dr.baselines["prompt_length"]
    assert np.array_equal(a.output_quantiles_, b.output_quantiles_) and a.n_train_ == b.n_train_
    a, b = lr.baselines["max_tokens_cap"], dr.baselines["max_tokens_cap"]
    assert a.default_max_tokens_ == b.default_max_tokens_
    assert np.array_equal(a.uses_cap_, b.uses_cap_)
    for a, b in ((lr.baselines["category_bucket"], dr.baselines["category_bucket"]),
                 (lr.baselines["session_ewma"].fallback_, dr.baselines["session_ewma"].fallback_)):
        assert np.array_equal(a.global_quantiles_, b.global_quantiles_)
        assert len(a.tables_) == len(b.tables_)
        for ta, tb in zip(a.tables_, b.tables_, strict=True):
            assert len(ta) > 0
            pd.testing.assert_frame_equal(ta, tb, check_exact=True)
    a, b = lr.baselines["session_ewma"], dr.baselines["session_ewma"]
    assert a.n_history_ == b.n_history_
    assert np.array_equal(a.ratio_quantiles_, b.ratio_quantiles_)
    # same fitted state, same calibration scores: the same corrections and test figures
    for name, cq in lr.baseline_calibrators.items():
        dq = dr.baseline_calibrators[name]
        assert dq.global_correction_ == cq.global_correction_, name
        assert dq.corrections_ == cq.corrections_, name
        assert dq.cell_sizes_ == dict(cq.cell_sizes_), name
        lt, dt = local["test"]["baselines"][name], dist["test"]["baselines"][name]
        for k in ("mean_pinball", "coverage", "mean_width", "mae_p50", "coverage_raw"):
            assert dt[k] == pytest.approx(lt[k], rel=1e-9), (name, k)
    assert dist["test"]["best_baseline"] == local["test"]["best_baseline"]


@pytest.mark.slow
@pytest.mark.integration
def test_model_figures_within_tolerance_of_local(runs):
    local, lr, dist, dr, *_ = runs
    lm, dm = local["test"]["model"], dist["test"]["model"]
    print("model dask vs local:", {k: (dm[k], lm[k]) for k in
                                   ("mean_pinball", "coverage", "mean_width", "mae_p50")},
          {q: (dm["pinball"][q], lm["pinball"][q]) for q in lm["pinball"]})
    assert dm["mean_pinball"] == pytest.approx(lm["mean_pinball"], rel=PINBALL_RTOL)
    for q in lm["pinball"]:
        assert dm["pinball"][q] == pytest.approx(lm["pinball"][q], rel=2 * PINBALL_RTOL)
    assert abs(dm["coverage"] - lm["coverage"]) <= COVERAGE_ATOL
    assert dr.model.compute_ == "dask" and dr.model.feature_names_ == lr.model.feature_names_
    assert dr.model.categories_ == lr.model.categories_
    assert dr.model.validation_rows_ == lr.model.validation_rows_
    # the same gate rule, on aggregates
    assert set(dist["gate"]) == set(local["gate"])
    assert dist["gate"]["vs_best_baseline"]["baseline"] == local["gate"]["vs_best_baseline"][
        "baseline"]
    assert [g["value"] for g in dist["test"]["groups"]] == [
        g["value"] for g in local["test"]["groups"]]
    assert [g["n"] for g in dist["test"]["groups"]] == [g["n"] for g in local["test"]["groups"]]
    assert [r["nominal"] for r in dist["test"]["reliability"]] == [
        r["nominal"] for r in local["test"]["reliability"]]


@pytest.mark.slow
@pytest.mark.integration
def test_one_session_bootstrap_gives_equal_intervals_on_both_engines(runs):
    local, _, dist, _, *_ = runs
    for name in ("model", *local["test"]["baselines"]):
        lt = local["test"]["model" if name == "model" else "baselines"]
        lt = lt if name == "model" else lt[name]
        dt = dist["test"]["model"] if name == "model" else dist["test"]["baselines"][name]
        for k in ("mean_pinball", "coverage", "mean_width"):
            lo, hi = dt["ci"][k]
            assert lo <= lt[k] <= hi, (name, k, lo, lt[k], hi)
    # one session bootstrap on both engines (hashed Poisson weights per session): the
    # baselines' figures are exact on both, so are their intervals, every figure's
    assert local["test"]["intervals"] == dist["test"]["intervals"]
    for name, lt in local["test"]["baselines"].items():
        dci = dist["test"]["baselines"][name]["ci"]
        assert set(dci) == set(lt["ci"]), name
        for k, ci in lt["ci"].items():
            assert dci[k] == pytest.approx(ci, rel=1e-9, abs=1e-12), (name, k, dci[k], ci)
    # the gate's resampling is named the same way
    assert dist["gate"]["vs_best_baseline"]["resampled"] == \
        local["gate"]["vs_best_baseline"]["resampled"]


@pytest.mark.slow
@pytest.mark.integration
def test_local_engine_partitions_train_what_the_in_memory_run_trains(runs):
    """The same pipeline on a LocalEngine: the local estimator on the same rows, so every
    figure of the model too (summed per partition instead of averaged: to 1e-9)."""
    local, lr, *_, parts = runs
    pr = parts[1]
    parts = parts[0]
    for key in ("rows_read", "rows_valid", "splits", "labels", "time_window"):
        assert parts[key] == local[key], key
    assert parts["ledger_fingerprint"] == local["ledger_fingerprint"]
    assert parts["projection"]["version"] == local["projection"]["version"]
    assert [b.model_to_string() for b in pr.model.boosters_] == \
        [b.model_to_string() for b in lr.model.boosters_]
    assert pr.calibrator.corrections_ == lr.calibrator.corrections_
    assert parts["model"]["trained_with"].startswith("lightgbm (")
    for name in ("model", *local["test"]["baselines"]):
        lt = local["test"]["model"] if name == "model" else local["test"]["baselines"][name]
        pt = parts["test"]["model"] if name == "model" else parts["test"]["baselines"][name]
        for k in ("mean_pinball", "coverage", "mean_width", "mae_p50"):
            assert pt[k] == pytest.approx(lt[k], rel=1e-9), (name, k)
        for k, ci in lt["ci"].items():
            assert pt["ci"][k] == pytest.approx(ci, rel=1e-9, abs=1e-12), (name, k)
    assert parts["gate"]["verdict"] == local["gate"]["verdict"]
    assert parts["gate"]["coverage"]["ci"] == pytest.approx(local["gate"]["coverage"]["ci"],
                                                            rel=1e-9)
    assert parts["test"]["served"]["coverage"] == pytest.approx(
        local["test"]["served"]["coverage"], rel=1e-12)


@pytest.mark.slow
@pytest.mark.integration
def test_predictions_partition_files_hold_every_test_row_once(runs):
    local, _, dist, _, *_ = runs
    pred = pd.read_parquet(dist["artifacts"]["predictions_test"])
    theirs = pd.read_parquet(local["artifacts"]["predictions_test"])
    assert len(pred) == dist["test"]["rows"] == len(theirs)
    assert pred[L.REQUEST_ID].is_unique
    assert set(pred[L.REQUEST_ID]) == set(theirs[L.REQUEST_ID])
    assert list(pred.columns) == list(theirs.columns)
    a = pred.sort_values(L.REQUEST_ID).reset_index(drop=True)
    b = theirs.sort_values(L.REQUEST_ID).reset_index(drop=True)
    for c in ("y", "label_class", "category_bucket-q0.5", "category_bucket-hi-80"):
        pd.testing.assert_series_equal(a[c], b[c], check_dtype=False)


@pytest.mark.slow
@pytest.mark.integration
def test_both_engines_gate_the_interval_serving_serves_by_the_same_replay(runs):
    """The gate judges the served interval (the runtime's online recalibration replayed
    over the test window) on both engines: same rule, same replay, the model's tolerance."""
    local, _, dist, _, *_ = runs
    ls, ds = local["test"]["served"], dist["test"]["served"]
    print("served dask vs local:", {k: (ds[k], ls[k]) for k in
                                    ("coverage", "frozen_coverage", "fed_back", "mean_width")})
    for s, run in ((ls, local), (ds, dist)):
        assert s["recalibration"] == "online" and s["config"] == CFG.served.__dict__
        assert run["gate"]["coverage"]["value"] == s["coverage"]
        assert run["gate"]["coverage"]["interval"] == "served"
        assert run["gate"]["coverage"]["frozen"] == run["test"]["model"]["coverage"]
        assert run["gate"]["verdict"] in ("GO", "NO-GO", "NOT ENOUGH EVIDENCE")
        assert s["ci"][0] <= s["coverage"] <= s["ci"][1]
    # the same actuals to feed back, ends from the ledger on both engines; how many the
    # tracker used differs a little (a lower bound inside the band is skipped: model-dependent)
    assert ds["actuals"] == ls["actuals"] and ds["modeled_end"] == ls["modeled_end"] == 0
    assert abs(ds["fed_back"] - ls["fed_back"]) <= 0.02 * ls["fed_back"]
    assert ds["n"] == ls["n"]
    assert abs(ds["coverage"] - ls["coverage"]) <= COVERAGE_ATOL
    a = pd.read_parquet(dist["artifacts"]["served_test"]).sort_values(L.REQUEST_ID)
    b = pd.read_parquet(local["artifacts"]["served_test"]).sort_values(L.REQUEST_ID)
    assert list(a.columns) == list(b.columns) == [L.REQUEST_ID, "served-lo-80", "served-hi-80"]
    assert a[L.REQUEST_ID].is_unique and list(a[L.REQUEST_ID]) == list(b[L.REQUEST_ID])


def test_exact_quantiles_equal_numpy():
    rng = np.random.default_rng(0)
    engine = LocalEngine()
    for x in (rng.integers(0, 3000, 5001).astype(float), rng.standard_normal(777) * 1e3,
              np.exp(rng.standard_normal(4000)), np.array([3.0]), np.array([1.0, 1, 1, 2])):
        frame = engine.from_pandas(pd.DataFrame({"x": x}), npartitions=3)
        got = exact_quantiles(engine, frame, "x", (0.1, 0.5, 0.9))
        assert np.array_equal(got, np.quantile(x, (0.1, 0.5, 0.9)))
    u = rng.random(1000)
    t = order_statistics(engine, engine.from_pandas(pd.DataFrame({"u": u}), 4), "u", [99])[0]
    assert int((u <= t).sum()) == 100  # the subsample threshold: exactly 100 rows at or under


def test_poisson_weights_are_a_function_of_the_key():
    h = key_hash(np.array([f"s{i}" for i in range(50_000)], dtype=object))
    w = poisson_weights(h, 4, seed=3)
    assert w.shape == (4, 50_000)
    assert abs(w.mean() - 1.0) < 0.01 and abs(w.var() - 1.0) < 0.02
    # the same session gives the same weights wherever it is evaluated
    assert np.array_equal(poisson_weights(h[123:124], 4, 3)[:, 0], w[:, 123])
    assert not np.array_equal(w[0], w[1])


@pytest.mark.slow
@pytest.mark.integration
def test_calibration_past_the_bound_uses_an_exact_size_hashed_subsample(runs):
    local, _, dist, dr, sub, sr, *_ = runs
    cal = sub["calibration"]
    assert cal["rows"] == dist["calibration"]["rows"] > SUBSAMPLE
    assert cal["scores_used"] == SUBSAMPLE and "subsample" in cal["rule"]
    assert sr.calibrator.n_calibration_ == SUBSAMPLE
    assert dist["calibration"]["scores_used"] == dist["calibration"]["rows"]
    # the same rows every run (hash of request_id), only the correction's noise grows
    assert sum(sr.calibrator.cell_sizes_.values()) == SUBSAMPLE
    assert abs(sr.calibrator.global_correction_ - dr.calibrator.global_correction_) < 0.25
    assert abs(sub["test"]["model"]["coverage"] - dist["test"]["model"]["coverage"]) < 0.06


@pytest.mark.slow
@pytest.mark.integration
def test_the_dask_run_saves_loads_and_exports_as_a_local_one(runs, tmp_path):
    from replaylab.apps.demand_runs import load_run_state, save_run_state
    from replaylab.artifacts.demand_export import export_demand

    _, _, dist, dr, *_ = runs
    back = load_run_state(save_run_state(dr, tmp_path))
    rows = dr.golden_rows
    assert len(rows) > 0
    assert np.array_equal(back.model.predict_quantiles(rows), dr.model.predict_quantiles(rows))
    for name, b in dr.baselines.items():
        assert np.array_equal(back.baselines[name].predict_quantiles(rows),
                              b.predict_quantiles(rows)), name
    out = export_demand(dr, dist, tmp_path / "artifact")
    assert (out / "manifest.json").exists()


@pytest.mark.slow
@pytest.mark.integration
def test_realized_censoring_trains_on_the_cut_rows_too(runs):
    local, _, dist, dr, _, _, (real, rr), _ = runs
    sec = real["censoring"]
    assert sec["method"] == "realized" and sec["reason"] == "configured"
    assert sec["train_censored_rows"] == rr.model.censored_rows_ > 0
    assert dr.model.censored_rows_ == 0 and dist["censoring"]["method"] == "none"


def test_check_trainable_counts_says_what_the_local_check_says():
    from replaylab.demand.labels import DemandDataError, DemandLabels, check_trainable
    from replaylab.pipelines.demand_partitions import check_trainable_counts

    cls = np.array(["label"] * 40 + ["length"] * 5 + ["absent_usage"] * 3, dtype=object)
    splits = np.array(["train"] * 30 + ["calibration"] * 5 + ["test"] * 13, dtype=object)
    labels = DemandLabels(np.ones(len(cls)), cls, np.zeros(len(cls)), np.full(len(cls), np.nan),
                          "x.parquet")
    counts = pd.Series(1, index=pd.MultiIndex.from_arrays([splits, cls])).groupby(
        level=[0, 1]).sum().to_dict()
    check_trainable(labels, splits, 5, 10, 3)
    check_trainable_counts(counts, 5, 10, 3, "x.parquet")  # neither raises
    for args in ((2, 10, 3), (5, 50, 3), (1, 10, 3), (5, 10, 30)):
        sessions, min_train, min_cal = args
        with pytest.raises(DemandDataError) as a:
            check_trainable(labels, splits, sessions, min_train, min_cal)
        with pytest.raises(DemandDataError) as b:
            check_trainable_counts(counts, sessions, min_train, min_cal, "x.parquet")
        assert str(a.value) == str(b.value)


# ------------------------------------------------------------------ a worker lost mid-run

LOST_CFG = DemandConfig(model=QuantileModelConfig(num_threads=1, n_estimators=60),
                        censoring=CensoringConfig(method="none"), min_group_size=100)


def small_dataset(root: Path, n_sessions: int = 800) -> Path:
    frame = generate_synthetic_ledger(
        SyntheticLedgerConfig(n_sessions=n_sessions, sessions_per_s=0.25), seed=7)
    n = len(frame) // 3
    for i in range(3):
        write_table(frame.iloc[i * n:(i + 1) * n], root / "ds" / f"p{i}.parquet")
    return root / "ds"


@pytest.mark.slow
@pytest.mark.integration
def test_a_worker_killed_during_the_fit_and_restarted_gives_the_same_result(
        tmp_path, monkeypatch, caplog):
    """Two `dask worker`s (with their nannies); the worker process of one is SIGKILLed while
    lightgbm.dask trains, its nanny starts it again: the fit is aborted (no hang), redone
    once on the two workers, and the run ends with the undisturbed run's model, bit for
    bit, and its figures."""
    import logging
    import os
    import signal
    import threading
    import time

    import dask
    import lightgbm.dask as lgb_dask
    import psutil
    from distributed import Client

    from replaylab.pipelines.demand_partitions import train_demand_partitions
    from tests.helpers.dask import dask_processes

    ds = small_dataset(tmp_path)
    split = SplitConfig(embargo_ms=300_000)
    with dask_processes(tmp_path) as (address, workers), Client(address) as client, \
            dask.config.set({"dataframe.convert-string": False}):
        engine = dask_engine(address, client)
        ref, ref_run = train_demand_partitions(engine, str(ds), LOST_CFG, ProjectionConfig(),
                                               split, tmp_path / "ref", n_boot=20)
        real_train, calls = lgb_dask._train, []

        def kill_during_the_second_fit(*args, **kwargs):
            calls.append(1)
            if len(calls) == 2:
                def kill():
                    time.sleep(0.3)
                    for child in psutil.Process(workers[0].pid).children(recursive=True):
                        os.kill(child.pid, signal.SIGKILL)  # the worker, not its nanny
                threading.Thread(target=kill, daemon=True).start()
            return real_train(*args, **kwargs)

        monkeypatch.setattr(lgb_dask, "_train", kill_during_the_second_fit)
        with caplog.at_level(logging.WARNING, logger="replaylab"):
            got, got_run = train_demand_partitions(engine, str(ds), LOST_CFG,
                                                   ProjectionConfig(), split, tmp_path / "got",
                                                   n_boot=20)
        assert len(client.scheduler_info()["workers"]) == 2
    assert any("lost worker" in r.getMessage() for r in caplog.records), "no refit seen"
    assert [b.model_to_string() for b in got_run.model.boosters_] == \
        [b.model_to_string() for b in ref_run.model.boosters_]
    for key in ("rows_read", "splits", "labels", "model", "calibration", "gate", "test"):
        assert got[key] == ref[key], key
    assert got["model"]["workers"] == 2


@pytest.mark.slow
@pytest.mark.integration
def test_a_worker_lost_for_good_stops_the_run_in_one_line_without_a_summary(tmp_path):
    """`python -m training pipeline=demand compute=dask compute.address=...`: one of two
    `dask worker`s is SIGKILLed with its nanny as the model stage starts and does not come
    back: the run waits (dask config replaylab.lost-worker-wait, 5 s here), then stops
    with one `error:` line naming the stage, exit code 2, and no summary.json."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import REPO
    from tests.helpers.dask import ENV, dask_processes

    ds = small_dataset(tmp_path)
    out = tmp_path / "run"
    env = {**ENV, "DASK_REPLAYLAB__LOST_WORKER_WAIT": "5"}
    with dask_processes(tmp_path) as (address, workers):
        run = subprocess.Popen(
            [sys.executable, "-m", "training", "pipeline=demand", "compute=dask",
             f"compute.address={address}", f"data.ledger={ds}", "tracking=off",
             "demand.model.n_estimators=60", f"hydra.run.dir={out}"], cwd=REPO,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline, log = time.time() + 300, ""
        while "dask stage 3/6" not in log and time.time() < deadline and run.poll() is None:
            time.sleep(0.2)
            log = (out / "__main__.log").read_text() if (out / "__main__.log").is_file() else ""
        os.killpg(workers[0].pid, signal.SIGKILL)  # the worker and its nanny: gone for good
        _, stderr = run.communicate(timeout=600)
    assert "dask stage 3/6" in log
    errors = [x for x in stderr.splitlines() if x.startswith("error:")]
    assert run.returncode == 2 and len(errors) == 1, stderr[-3000:]
    assert errors[0].startswith("error: dask stage 3/6 (model) stopped: lightgbm.dask")
    print(errors[0])
    assert "rerun" in errors[0] and "Traceback" not in stderr
    assert not (out / "summary.json").exists()


def _three_partitions(frame: pd.DataFrame) -> object:
    """The ledger validated in memory as three partitions of a LocalEngine."""
    from replaylab.contracts import validate_ledger

    return LocalEngine().from_validated(validate_ledger(frame, source="test"), npartitions=3)


@pytest.mark.slow
@pytest.mark.integration
def test_hpo_runs_on_either_engine_and_searches_as_the_in_memory_run(tmp_path, dask_address,
                                                                     dask_client):
    """demand.hpo on engine partitions: the in-memory front door (`train_demand`, one
    partition) and a LocalEngine over the same rows in three partitions run the same trials
    (the same local estimator on the same rows), so the same search, best parameters and
    final model; on Dask each trial is fitted by lightgbm.dask on the cluster and the best
    parameters are the ones the final model trains with."""
    import dask

    from replaylab.demand.hpo import HPOConfig
    from replaylab.pipelines.demand_partitions import train_demand_partitions

    frame = generate_synthetic_ledger(
        SyntheticLedgerConfig(n_sessions=700, sessions_per_s=0.25), seed=11)
    path = write_table(frame, tmp_path / "ledger.parquet")
    cfg = DemandConfig(model=QuantileModelConfig(num_threads=1, n_estimators=60),
                       censoring=CensoringConfig(method="none"), min_group_size=100)
    projection, split = ProjectionConfig(), SplitConfig(embargo_ms=300_000)
    mem, mem_run = train_demand(load_ledger(LedgerInput(path=str(path))), projection, split,
                                cfg, tmp_path / "mem", hpo=HPOConfig(trials=3, seed=1))
    seen: list[tuple] = []
    parts, parts_run = train_demand_partitions(
        LocalEngine(), _three_partitions(frame), cfg, projection, split, tmp_path / "parts",
        hpo=HPOConfig(trials=3, seed=1), on_trial=lambda n, p, v: seen.append((n, p, v)))
    assert [n for n, _, _ in seen] == [0, 1, 2]
    for key in ("trials_run", "best_params", "best_trial", "first_trial_value",
                "best_value_validation_mean_pinball"):
        assert parts["hpo"][key] == mem["hpo"][key], key
    assert parts["hpo"]["best_value_validation_mean_pinball"] == min(v for *_, v in seen)
    assert parts["demand_config"] == mem["demand_config"]
    assert [b.model_to_string() for b in parts_run.model.boosters_] == \
        [b.model_to_string() for b in mem_run.model.boosters_]
    assert "hpo" in parts["timings_s"]

    with dask.config.set({"dataframe.convert-string": False}):
        dist, dist_run = train_demand_partitions(
            dask_engine(dask_address, dask_client), str(path), cfg, projection, split,
            tmp_path / "dask", hpo=HPOConfig(trials=2, seed=1), n_boot=20)
    assert dist["hpo"]["trials_run"] == 2 and dist["hpo"]["trials_in_study"] == 2
    assert np.isfinite(dist["hpo"]["best_value_validation_mean_pinball"])
    best = dist["hpo"]["best_params"]
    assert {k: dist["demand_config"]["model"][k] for k in best} == best
    assert dist_run.model.config_.learning_rate == best["learning_rate"]
    assert dist["model"]["trained_with"].startswith("lightgbm.dask")


@pytest.mark.slow
@pytest.mark.integration
def test_censoring_auto_chooses_on_either_engine_as_the_in_memory_run(tmp_path, dask_address,
                                                                      dask_client):
    """censoring.method=auto over engine partitions: on a LocalEngine over the rows in three
    partitions every variant (none, realized, pinball at each round count), its
    calibration and test figures as partition sums equal the in-memory front door's (one
    partition; to summation order), so the same choice, reason and boosters; on Dask the
    candidates are none and realized (the pinball stage trains in one process) and the
    pick is select_censoring's on the Dask figures."""
    import dask

    from replaylab.demand.censoring import select_censoring
    from replaylab.pipelines.demand_partitions import train_demand_partitions

    frame = generate_synthetic_ledger(
        SyntheticLedgerConfig(n_sessions=4000, sessions_per_s=0.25), seed=5)
    path = write_table(frame, tmp_path / "ledger.parquet")
    cens = CensoringConfig(method="auto", min_rows=5)
    cfg = DemandConfig(model=QuantileModelConfig(num_threads=1, n_estimators=60),
                       censoring=cens, min_group_size=100)
    projection, split = ProjectionConfig(), SplitConfig(embargo_ms=300_000)
    mem, mem_run = train_demand(load_ledger(LedgerInput(path=str(path))), projection, split,
                                cfg, tmp_path / "mem")
    parts, parts_run = train_demand_partitions(LocalEngine(), _three_partitions(frame), cfg,
                                               projection, split, tmp_path / "parts",
                                               n_boot=20)
    a, b = mem["censoring"], parts["censoring"]
    assert a["candidate"] != "none"  # a real choice among the variants on this ledger
    assert {k: v for k, v in a.items() if k != "candidates"} == \
        {k: v for k, v in b.items() if k != "candidates"}
    assert list(b["candidates"]) == ["none", "realized", "pinball@10", "pinball@30",
                                     "pinball@100"] == list(a["candidates"])
    for name, by_split in a["candidates"].items():
        for where, figs in by_split.items():
            got = b["candidates"][name][where]
            assert set(got) == set(figs), (name, where)
            for k, v in figs.items():
                assert got[k] == pytest.approx(v, rel=1e-12), (name, where, k)
    assert [q.model_to_string() for q in parts_run.model.boosters_] == \
        [q.model_to_string() for q in mem_run.model.boosters_]

    with dask.config.set({"dataframe.convert-string": False}):
        dist, dist_run = train_demand_partitions(
            dask_engine(dask_address, dask_client), str(path), cfg, projection, split,
            tmp_path / "dask", n_boot=20)
    d = dist["censoring"]
    assert list(d["candidates"]) == ["none", "realized"]
    assert "pinball not a candidate under compute=dask" in d["reason"]
    want, _ = select_censoring({k: v["calibration"] for k, v in d["candidates"].items()},
                               cens.min_rows, cens.max_pinball_increase, cens.min_capped_gain)
    assert d["candidate"] == d["method"] == want == dist_run.model.censoring
    assert d["candidates"]["none"]["calibration"]["capped_n"] == \
        a["candidates"]["none"]["calibration"]["capped_n"]
