"""The fitted demand run, shared by `python -m training pipeline=demand` and `python -m export`.

Saves the fitted DemandRun next to the run (so a finished run can be
re-exported) and exports the artifact with the provenance the library must not
look up itself (`replaylab.apps.provenance`).

The run state is a folder of plain files, never a pickle (it is logged to and
fetched back from the tracking store, which anyone with write access to a run
could edit): `replaylab.demand.state` writes and verifies it (SHA-256 of every
file in `state.json`, checked before anything is parsed); each fitted object
saves its own part:

    demand_run/
      state.json                     index: format, version, sha256 + size per file
      run.json                       DemandConfig, projection version, ledger
                                     fingerprint, feature columns, time window,
                                     the baselines' names in order
      model/model.json, model/booster-<j>.txt   QuantileDemandModel, LightGBM text
      calibrator/conformal.json      the model's GroupConformal
      baselines/<name>/baseline.json (+ .npy arrays)   each baseline
      baseline_calibrators/<name>/conformal.json
      golden_rows.parquet            the golden rows (absent when the run has none)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from replaylab.apps.provenance import git_commit, hmac_key

RUN_STATE = "demand_run"  # the fitted DemandRun: a folder of plain files (module docstring)
LEGACY_RUN_STATE = "demand_run.joblib"  # the pickle of earlier versions: never loaded
STATE_KIND = "replaylab.demand_run"
STATE_VERSION = 1


def _write_run(run: Any, w) -> None:
    from replaylab.demand.baselines import write_baseline
    from replaylab.demand.state import RunStateError

    if set(run.baselines) != set(run.baseline_calibrators):
        raise RunStateError("every baseline needs its calibrator: "
                         f"{sorted(run.baselines)} vs {sorted(run.baseline_calibrators)}")
    run.model.write_state(w.sub("model"))
    run.calibrator.write_state(w.sub("calibrator"))
    for name, baseline in run.baselines.items():
        write_baseline(baseline, w.sub("baselines").sub(name))
        run.baseline_calibrators[name].write_state(w.sub("baseline_calibrators").sub(name))
    if run.golden_rows is not None:
        w.put_frame("golden_rows.parquet", run.golden_rows)
    w.put_json("run.json", {
        "config": run.config.to_dict(), "projection_version": run.projection_version,
        "ledger_fingerprint": run.ledger_fingerprint,
        "feature_columns": list(run.feature_columns), "time_window": run.time_window,
        "baselines": list(run.baselines), "golden_rows": run.golden_rows is not None})


def save_run_state(run: Any, run_dir: Path) -> Path:
    """Write `run` (a DemandRun) as the folder `run_dir/demand_run`; returns its path.

    An object with no pickle-free state raises RunStateError and nothing is written.
    """
    from replaylab.demand.state import write_state_folder

    return write_state_folder(Path(run_dir) / RUN_STATE, STATE_KIND, STATE_VERSION,
                              lambda w: _write_run(run, w))


def load_run_state(path: Path) -> Any:
    """The DemandRun saved in the folder `path`, verified as a whole before it is parsed.

    FileNotFoundError: no folder there; RunStateError (one line): a pickle, a
    changed, missing or extra file, a symlink, a file of another kind.
    """
    from replaylab.demand.state import RunStateError, read_state_folder

    path = Path(path)
    if not path.exists() and not path.is_symlink():
        legacy = path.parent / LEGACY_RUN_STATE
        if legacy.exists():
            raise RunStateError(f"{legacy}: a pickled run state of an earlier version; refused, "
                                "never loaded (re-run training to save it as plain files)")
        raise FileNotFoundError(f"{path}: no fitted demand run here (was it a pipeline=demand "
                                "run of this version?)")
    r = read_state_folder(path, STATE_KIND, STATE_VERSION)
    try:
        return _read_run(r, path)
    except (KeyError, TypeError, AttributeError, IndexError) as e:  # hashed, but not our layout
        raise RunStateError(f"{path}: not a demand run state of this version "
                            f"({type(e).__name__}: {e})") from None


def _read_run(r, path: Path) -> Any:
    from replaylab.config import from_mapping
    from replaylab.demand.baselines import read_baseline
    from replaylab.demand.config import DemandConfig
    from replaylab.demand.conformal import GroupConformal
    from replaylab.demand.model import QuantileDemandModel
    from replaylab.pipelines.demand_outputs import DemandRun

    doc = r.get_json("run.json")
    names = doc["baselines"]
    return DemandRun(
        config=from_mapping(DemandConfig, doc["config"], f"{path}/run.json config"),
        model=QuantileDemandModel.read_state(r.sub("model")),
        calibrator=GroupConformal.read_state(r.sub("calibrator")),
        baselines={n: read_baseline(r.sub("baselines").sub(n)) for n in names},
        baseline_calibrators={n: GroupConformal.read_state(r.sub("baseline_calibrators").sub(n))
                              for n in names},
        projection_version=doc["projection_version"],
        ledger_fingerprint=doc["ledger_fingerprint"],
        feature_columns=list(doc["feature_columns"]), time_window=doc["time_window"],
        golden_rows=r.get_frame("golden_rows.parquet") if doc["golden_rows"] else None)


def export_run(run: Any, summary: dict, out: Path, export_cfg: Any,
               mlflow_run_id: str | None) -> dict:
    """Export `run` to `out`; returns the summary's `export` section."""
    from replaylab.artifacts.kinds import DEMAND
    from replaylab.contracts.manifest import verify_manifest

    key = hmac_key(export_cfg.get("hmac_key_env"))
    path = DEMAND.export(run, summary, out, version=str(export_cfg.version),
                         valid_days=float(export_cfg.valid_days), hmac_key=key,
                         mlflow_run_id=mlflow_run_id, git_commit=git_commit())
    m = verify_manifest(path, hmac_key=key, required_kind="demand")
    return {"path": str(path), "version": m["version"], "content_hash": m["content_hash"],
            "created_at": m["created_at"], "valid_until": m["valid_until"],
            "signed": key is not None,
            "files": {e["path"]: e["size"] for e in m["files"]}}
