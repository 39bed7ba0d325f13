"""The fitted demand run saved without pickle (`replaylab.apps.demand_runs`, `replaylab.demand.state`).

Round trip: every fitted attribute, every prediction and interval, and the
exported artifact are the same after save + load. Refusals: a pickle planted in
the folder (by name or by its bytes, hash rewritten) is refused and never
unpickled (its payload would create a marker file), as are a changed byte, a
missing or extra file, a symlink and an index naming a path outside the folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pandas as pd
import pytest

from replaylab.apps.demand_runs import RUN_STATE, load_run_state, save_run_state
from replaylab.artifacts.demand_export import export_demand
from replaylab.contracts.manifest import verify_manifest
from replaylab.demand import DemandConfig, QuantileModelConfig
from replaylab.demand.config import CensoringConfig
from replaylab.demand.model import base_band, request_cap
from replaylab.demand.state import INDEX, RunStateError
from replaylab.pipelines.demand import train_demand
from replaylab.pipelines.project import LedgerInput, load_ledger
from replaylab.projection import ProjectionConfig, SplitConfig
from replaylab.sources.synthetic import SyntheticLedgerConfig
from tests.conftest import REPO

CREATED = datetime.now(UTC).replace(microsecond=0)  # one instant for both exports


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A small seeded demand run (censored pinball stage, group cells), saved as a folder."""
    out = tmp_path_factory.mktemp("demand_state")
    loaded = load_ledger(LedgerInput(
        synthetic=SyntheticLedgerConfig(n_sessions=400, sessions_per_s=0.25)))
    cfg = DemandConfig(min_group_size=30, model=QuantileModelConfig(n_estimators=60),
                       censoring=CensoringConfig(method="pinball", rounds=(5,), min_rows=5))
    summary, run = train_demand(loaded, ProjectionConfig(), SplitConfig(embargo_ms=60_000), cfg,
                                out)
    (out / "summary.json").write_text(json.dumps(summary))
    state = save_run_state(run, out)
    features = pd.read_parquet(out / "features.parquet")
    return out, state, summary, run, features[features["split"] == "test"]


def _copy(state: Path, tmp_path: Path) -> Path:
    """A copy of the state folder to damage."""
    import shutil

    return Path(shutil.copytree(state, tmp_path / RUN_STATE))


def _rehash(folder: Path, rel: str) -> None:
    """Rewrite the index entry of `rel` to its current bytes (a writer who edits both)."""
    index = json.loads((folder / INDEX).read_text())
    data = (folder / rel).read_bytes()
    index["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    (folder / INDEX).write_text(json.dumps(index))


class _Marker:
    """A pickle whose loading creates a file: proof that a load unpickled it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def _armed_pickle(tmp_path: Path) -> tuple[bytes, Path]:
    marker = tmp_path / "unpickled.marker"
    payload = pickle.dumps(_Marker(marker), protocol=4)
    pickle.loads(payload).close()  # the payload is live: loading it does create the marker
    assert marker.exists()
    marker.unlink()
    return payload, marker


def _same(a, b, where: str = "") -> None:
    """Deep equality of fitted state: arrays bit for bit, frames exactly, boosters by text."""
    if isinstance(a, lgb.Booster):
        assert isinstance(b, lgb.Booster), where
        assert a.model_to_string(num_iteration=-1) == b.model_to_string(num_iteration=-1), where
        assert a.pandas_categorical == b.pandas_categorical, where
        assert a.best_iteration == b.best_iteration, where
    elif isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b, check_exact=True, obj=where)
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where  # order too: cells() sorts stably
        for k in a:
            _same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif dataclasses.is_dataclass(a):
        assert type(a) is type(b), where
        for f in dataclasses.fields(a):
            _same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif a is None or isinstance(a, str | int | float | bool):
        assert type(a) is type(b) or {type(a), type(b)} <= {int, float}, where
        assert a == b, f"{where}: {a!r} != {b!r}"
    else:
        assert type(a) is type(b), where
        assert vars(a).keys() == vars(b).keys(), f"{where}: {sorted(vars(a))} vs {sorted(vars(b))}"
        for k in vars(a):
            _same(getattr(a, k), getattr(b, k), f"{where}.{k}")


# ---------------------------------------------------------------- round trip
def test_the_folder_holds_no_pickle_and_every_file_is_indexed(fitted):
    _, state, _, run, _ = fitted
    files = sorted(p.relative_to(state).as_posix() for p in state.rglob("*") if p.is_file())
    index = json.loads((state / INDEX).read_text())
    assert sorted(index["files"]) == [f for f in files if f != INDEX]
    assert {f.rsplit(".", 1)[1] for f in files} <= {"json", "txt", "npy", "parquet"}
    assert not any((state / f).read_bytes()[:1] == b"\x80" for f in files)
    assert len([f for f in files if f.startswith("model/booster-")]) == len(run.model.quantiles)


def test_round_trip_restores_every_fitted_attribute(fitted):
    _, state, _, run, _ = fitted
    back = load_run_state(state)
    assert run.model.censoring == "pinball" and run.model.censored_rounds_ == 5  # both stages
    assert run.calibrator.corrections_  # group cells, not only the global correction
    _same(run, back, "run")


def test_round_trip_predictions_and_intervals_are_bit_identical(fitted):
    _, state, _, run, test = fitted
    back = load_run_state(state)
    cap = request_cap(test)
    for name, before, after, cq_before, cq_after in [
            ("model", run.model, back.model, run.calibrator, back.calibrator),
            *[(n, run.baselines[n], back.baselines[n], run.baseline_calibrators[n],
               back.baseline_calibrators[n]) for n in run.baselines]]:
        q0, *band0 = base_band(before, test)
        q1, *band1 = base_band(after, test)
        assert np.array_equal(q0, q1), name
        for x, y in zip(cq_before.predict_interval(test, *band0, cap),
                        cq_after.predict_interval(test, *band1, cap), strict=True):
            assert np.array_equal(x, y), name
    gold = run.golden_rows
    assert np.array_equal(run.model.predict_quantiles(gold), back.model.predict_quantiles(gold))


def test_the_export_of_a_reloaded_run_is_the_same_artifact(fitted, tmp_path):
    """Byte for byte: every file, so the manifest's content hash too (trees.safetensors is
    written with a sorted header: `demand_flat.canonical_header`)."""
    _, state, summary, run, _ = fitted
    kw = {"created": CREATED, "mlflow_run_id": "abc", "git_commit": "deadbeef"}
    a = export_demand(run, summary, tmp_path / "a", **kw)
    b = export_demand(load_run_state(state), summary, tmp_path / "b", **kw)
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir()) and "trees.safetensors" in names
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    ma, mb = (verify_manifest(f, required_kind="demand") for f in (a, b))
    assert ma["content_hash"] == mb["content_hash"]


def test_saving_again_replaces_the_folder(fitted, tmp_path):
    _, _, _, run, _ = fitted
    first = save_run_state(run, tmp_path)
    (first / "stale.json").write_text("{}")
    assert save_run_state(run, tmp_path) == first and not (first / "stale.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == [RUN_STATE]  # no temporary sibling left


def test_a_baseline_without_plain_state_fails_at_save_and_writes_nothing(fitted, tmp_path):
    _, _, _, run, _ = fitted

    class Custom:
        name = "custom"

        def predict_quantiles(self, features):
            return np.zeros((len(features), 3))

    odd = dataclasses.replace(run, baselines={**run.baselines, "custom": Custom()},
                              baseline_calibrators={**run.baseline_calibrators,
                                                    "custom": run.calibrator})
    with pytest.raises(RunStateError, match="no pickle-free state"):
        save_run_state(odd, tmp_path)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("plant", ["joblib_file", "pkl_indexed", "json_is_pickle",
                                   "booster_is_pickle", "npy_is_pickle"])
def test_a_planted_pickle_is_refused_and_never_unpickled(fitted, tmp_path, plant):
    _, state, _, _, _ = fitted
    payload, marker = _armed_pickle(tmp_path)
    folder = _copy(state, tmp_path)
    if plant == "joblib_file":  # the old layout's name, dropped into the folder
        (folder / "demand_run.joblib").write_bytes(payload)
        match = "demand_run.joblib, a pickle"
    elif plant == "pkl_indexed":  # listed in the index with its true hash
        (folder / "model" / "extra.pkl").write_bytes(payload)
        _rehash(folder, "model/extra.pkl")
        match = "a pickle"
    else:
        rel = {"json_is_pickle": "run.json", "booster_is_pickle": "model/booster-0.txt",
               "npy_is_pickle": "baselines/prompt_length/output_quantiles.npy"}[plant]
        (folder / rel).write_bytes(payload)
        _rehash(folder, rel)
        match = f"{rel} is a pickle"
    with pytest.raises(RunStateError, match=match) as e:
        load_run_state(folder)
    assert "\n" not in str(e.value)
    assert not marker.exists()


def test_an_index_that_is_a_pickle_is_refused(fitted, tmp_path):
    _, state, _, _, _ = fitted
    payload, marker = _armed_pickle(tmp_path)
    folder = _copy(state, tmp_path)
    (folder / INDEX).write_bytes(payload)
    with pytest.raises(RunStateError, match="state.json is a pickle"):
        load_run_state(folder)
    assert not marker.exists()


def test_a_legacy_pickled_run_is_refused_not_loaded(fitted, tmp_path):
    payload, marker = _armed_pickle(tmp_path)
    (tmp_path / "demand_run.joblib").write_bytes(payload)
    with pytest.raises(RunStateError, match="pickled run state of an earlier version"):
        load_run_state(tmp_path / RUN_STATE)
    assert not marker.exists()


def test_a_changed_byte_is_refused(fitted, tmp_path):
    _, state, _, _, _ = fitted
    folder = _copy(state, tmp_path)
    path = folder / "model" / "booster-1.txt"
    data = bytearray(path.read_bytes())
    i = data.index(b"leaf_value=") + len(b"leaf_value=")
    data[i] = ord("9") if data[i] != ord("9") else ord("8")
    path.write_bytes(bytes(data))
    with pytest.raises(RunStateError, match="booster-1.txt does not match its SHA-256"):
        load_run_state(folder)


def test_a_missing_file_is_refused(fitted, tmp_path):
    _, state, _, _, _ = fitted
    folder = _copy(state, tmp_path)
    (folder / "calibrator" / "conformal.json").unlink()
    with pytest.raises(RunStateError, match="missing: calibrator/conformal.json"):
        load_run_state(folder)


def test_an_extra_file_is_refused(fitted, tmp_path):
    _, state, _, _, _ = fitted
    folder = _copy(state, tmp_path)
    (folder / "notes.json").write_text("{}")
    with pytest.raises(RunStateError, match=r"not in state.json: notes.json"):
        load_run_state(folder)


def test_symlinks_are_refused(fitted, tmp_path):
    _, state, _, _, _ = fitted
    folder = _copy(state, tmp_path)
    target = folder / "run.json"
    outside = tmp_path / "run.json"
    outside.write_bytes(target.read_bytes())
    target.unlink()
    target.symlink_to(outside)  # same bytes, same hash: still refused
    with pytest.raises(RunStateError, match="run.json is a symlink"):
        load_run_state(folder)
    link = tmp_path / "link"
    link.symlink_to(state)
    with pytest.raises(RunStateError, match="the state folder is a symlink"):
        load_run_state(link)


def test_an_index_naming_a_path_outside_the_folder_is_refused(fitted, tmp_path):
    _, state, _, _, _ = fitted
    folder = _copy(state, tmp_path)
    (tmp_path / "secret.json").write_text("{}")
    index = json.loads((folder / INDEX).read_text())
    index["files"]["../secret.json"] = {"sha256": "0" * 64, "size": 2}
    (folder / INDEX).write_text(json.dumps(index))
    with pytest.raises(RunStateError, match="not a safe relative path"):
        load_run_state(folder)


def test_no_folder_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="no fitted demand run here"):
        load_run_state(tmp_path / RUN_STATE)


# ---------------------------------------------------------------- python -m export
def test_python_m_export_refuses_a_tampered_run_in_one_line(fitted, tmp_path):
    run_dir, state, summary, _, _ = fitted
    payload, marker = _armed_pickle(tmp_path)
    copy = tmp_path / "run"
    copy.mkdir()
    (copy / "summary.json").write_text(json.dumps(summary))
    folder = _copy(state, copy)
    (folder / "run.json").write_bytes(payload)
    _rehash(folder, "run.json")
    db = tmp_path / "mlflow.db"
    proc = subprocess.run([sys.executable, "-m", "export", f"run_dir={copy}",
                           f"tracking.uri=sqlite:///{db}", f"hydra.run.dir={tmp_path / 'e'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and \
        "run.json is a pickle" in lines[0], lines
    assert not marker.exists()
    # checked before an MLflow run opens: the store holds no (FAILED) run
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{db}")
    assert not [r for e in c.search_experiments() for r in c.search_runs([e.experiment_id])]


def test_run_id_fetch_verifies_what_the_store_holds(fitted, tmp_path, monkeypatch):
    """Through a local MLflow store: the logged folder re-exports; a pickle planted among the
    run's artifacts is refused at fetch time and never unpickled."""
    mlflow = pytest.importorskip("mlflow")
    from omegaconf import OmegaConf

    from replaylab.apps.export import export_demand_run

    run_dir, state, summary, _, _ = fitted
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # the environment, not mlflow.set_tracking_uri (process-global: later tests would see it)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_experiment("state-test")
    with mlflow.start_run() as r:
        mlflow.log_artifacts(str(state), artifact_path=RUN_STATE)
        mlflow.log_text(json.dumps(summary), "summary.json")
    cfg = OmegaConf.create({
        "run_dir": None, "run_id": r.info.run_id, "out": str(tmp_path / "out"),
        "tracking": {"uri": uri},
        "export": {"version": "1.0.0", "valid_days": 30, "hmac_key_env": None}})
    section = export_demand_run(cfg, tmp_path)["export"]
    assert verify_manifest(Path(section["path"]), required_kind="demand")
    payload, marker = _armed_pickle(tmp_path)
    with mlflow.start_run(run_id=r.info.run_id):
        (tmp_path / "demand_run.joblib").write_bytes(payload)
        mlflow.log_artifact(str(tmp_path / "demand_run.joblib"), artifact_path=RUN_STATE)
    with pytest.raises(RunStateError, match="demand_run.joblib, a pickle"):
        export_demand_run(cfg, tmp_path)
    assert not marker.exists()
