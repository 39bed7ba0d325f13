"""compute=dask for the demand model: lightgbm.dask on a LocalCluster matches the local fit.

One seeded synthetic ledger (3,000 sessions, ~5.5k rows), projected, split and
labelled by the pipeline's own step; the quantile model is fitted locally and on the
session's LocalCluster of 2 worker processes (`demand.fit_partitions.fit_model` on a
DaskEngine: `compute.lgbm`), each calibrated the same way (group CQR on the
calibration split) and scored on the same labelled test rows.
"""

from __future__ import annotations

import lightgbm as lgb
import numpy as np
import pytest

from replaylab.contracts import Ledger as L
from replaylab.contracts import validate_ledger
from replaylab.demand import DemandConfig, QuantileModelConfig
from replaylab.demand.conformal import GroupConformal
from replaylab.demand.metrics import interval_metrics
from replaylab.demand.model import QuantileDemandModel, request_cap
from replaylab.pipelines.demand_model import prepare_data
from replaylab.pipelines.project import LoadedLedger
from replaylab.projection import ProjectionConfig, SplitConfig
from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger

pytestmark = [pytest.mark.slow, pytest.mark.integration]

CFG = DemandConfig(model=QuantileModelConfig(num_threads=1))


@pytest.fixture(scope="module")
def data():
    frame = generate_synthetic_ledger(
        SyntheticLedgerConfig(n_sessions=3000, sessions_per_s=0.25), seed=7)
    loaded = LoadedLedger(validate_ledger(frame, source="test"), origin="test")
    return prepare_data(loaded, ProjectionConfig(), SplitConfig(embargo_ms=300_000), CFG)


@pytest.fixture(scope="module")
def engine(dask_address, dask_client):
    from replaylab.compute import ComputeConfig, DaskEngine

    return DaskEngine(ComputeConfig(kind="dask", address=dask_address), dask_client)


def _fit_on(engine, data, demand: DemandConfig = CFG) -> QuantileDemandModel:
    """The model stage of the partitioned pipeline on the train label rows (2 partitions,
    sessions whole)."""
    import dask

    from replaylab.demand.censoring import NONE
    from replaylab.demand.fit_partitions import fit_model
    from replaylab.demand.labels import CLASS_COLUMN, LABEL

    train = data.frame("train").assign(**{CLASS_COLUMN: LABEL})
    with dask.config.set({"dataframe.convert-string": False}):
        rows = engine.from_pandas(train, npartitions=2, by=L.SESSION_ID)
        return fit_model(engine, rows, demand, NONE)


def _model() -> QuantileDemandModel:
    return QuantileDemandModel(CFG.quantiles, CFG.model, CFG.scale, CFG.clip_to_cap, CFG.seed)


def _score(model: QuantileDemandModel, data) -> dict:
    """Calibrate on the calibration split as the pipeline does; metrics on labelled test rows."""
    calib, test = data.frame("calibration"), data.frame("test")
    cq = model.predict_quantiles(calib)
    conformal = GroupConformal(CFG.interval, CFG.group_columns, CFG.min_group_size,
                               CFG.scale).fit(calib, cq[:, 0], cq[:, -1], data.y("calibration"))
    tq = model.predict_quantiles(test)
    lo, hi = conformal.predict_interval(test, tq[:, 0], tq[:, -1], request_cap(test))
    usable = data.labels.usable[data.masks["test"]]
    y = data.labels.y_total[data.masks["test"]][usable]
    return interval_metrics(y, tq[usable], lo[usable], hi[usable], CFG.quantiles)


@pytest.fixture(scope="module")
def fits(data, engine):
    train, y = data.frame("train"), data.y("train")
    local = _model().fit(train, y)
    return local, _fit_on(engine, data)


def test_dask_fit_matches_local_coverage_and_pinball(fits, data):
    local, dask = (_score(m, data) for m in fits)
    assert local["n"] == dask["n"] > 500
    assert abs(local["coverage"] - dask["coverage"]) <= 0.03, (local, dask)
    for m in (local, dask):
        assert abs(m["coverage"] - CFG.interval) <= 0.05, m
    rel = abs(dask["mean_pinball"] - local["mean_pinball"]) / local["mean_pinball"]
    assert rel <= 0.05, (local["mean_pinball"], dask["mean_pinball"])


def test_dask_model_is_local_with_the_same_vocabulary(fits, data):
    local, dask = fits
    assert dask.compute_ == "dask" and local.compute_ == "local"
    assert dask.feature_names_ == local.feature_names_ and dask.categories_ == local.categories_
    for lb, db, k in zip(local.boosters_, dask.boosters_, dask.best_iterations_, strict=True):
        assert isinstance(db, lgb.Booster) and db.num_trees() >= k >= 1
        assert db.pandas_categorical == lb.pandas_categorical  # same category codes
        assert db.params["num_machines"] == 1 and not db.params.get("machines")
    # early stopping ran on the same tail, with the same rule
    assert dask.validation_rows_ == local.validation_rows_ > 0
    for q, v in local.validation_pinball_.items():
        assert abs(dask.validation_pinball_[q] - v) / v < 0.1
    pred = dask.predict_quantiles(data.frame("test"))
    assert pred.shape == (int(data.masks["test"].sum()), len(CFG.quantiles))
    assert np.all(np.diff(pred, axis=1) >= 0)


def test_dask_fit_is_repeatable(data, engine):
    cfg = QuantileModelConfig(n_estimators=20, early_stopping_rounds=5, num_threads=1)
    a, b = (_fit_on(engine, data, DemandConfig(model=cfg)) for _ in range(2))
    assert a.best_iterations_ == b.best_iterations_
    for ba, bb in zip(a.boosters_, b.boosters_, strict=True):
        assert ba.model_to_string() == bb.model_to_string()
