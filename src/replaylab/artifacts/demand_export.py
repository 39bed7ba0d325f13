"""Export a trained demand run as a versioned, verifiable artifact folder (atomically).

`export_demand(run, summary, out_dir, ...)` writes

    out_dir/model.onnx      every quantile booster, exact (double) TreeEnsemble
    out_dir/manifest.json   schema 1 (docs/artifacts.md): features, outputs,
                            conformal corrections per cell, training facts,
                            runtime requirements, fallback baseline, file hashes

Everything is written into a temporary sibling folder first and renamed into
place only once the manifest is written and synced, so an interrupted export
leaves either the previous artifact or nothing under `out_dir`, never a folder
the loader accepts (a leftover `.<name>.tmp-*` sibling has no valid manifest
until it is complete, and is never renamed after a crash). Replacing an
existing artifact is two renames (old aside, new in): a loader running between
them finds no folder and falls back.
"""

from __future__ import annotations

import math
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from replaylab import __version__
from replaylab.artifacts.manifest import build_manifest, staged_folder, write_manifest
from replaylab.artifacts.onnx_lgbm import ML_OPSET, ONNX_OPSET, demand_model_to_onnx
from replaylab.contracts.ledger import LEDGER_VERSION
from replaylab.projection.features import CALENDAR_COLUMNS, HISTORY_COLUMNS, OWN_BOOL_COLUMNS
from replaylab.runtime.demand import HISTORY_COUNTS, KIND, MODEL_FILE
from replaylab.runtime.hints import SUPPORTED_HINT_VERSIONS

# First-turn values of the history features: counts are 0, everything else missing.
_FIRST_TURN_ZERO = (*HISTORY_COUNTS, "hist_turns_censored")


class DemandExportError(ValueError):
    """The run cannot be exported as a demand artifact (the message says why)."""


def _json_float(x: float) -> float | None:
    """A correction as JSON: +inf (too few calibration rows) -> null, read back as unbounded."""
    x = float(x)
    return x if math.isfinite(x) else None


def feature_schema(model: Any) -> list[dict]:
    """The ordered feature schema of a fitted QuantileDemandModel (names, kinds, vocabularies).

    Vocabularies are the booster's `pandas_categorical` (LightGBM's category
    codes are positions in these lists); they must equal the model's own.
    """
    vocabs = model.boosters_[0].pandas_categorical or []
    cats = [c for c in model.feature_names_ if c in model.categories_]
    if len(vocabs) != len(cats):
        raise DemandExportError(f"{len(cats)} categorical features but the booster has "
                                f"{len(vocabs)} vocabularies")
    vocab = dict(zip(cats, vocabs, strict=True))
    out = []
    for name in model.feature_names_:
        entry: dict[str, Any] = {"name": name, "dtype": "float64"}
        if name in vocab:
            if [str(v) for v in vocab[name]] != list(model.categories_[name]):
                raise DemandExportError(f"{name}: the booster's vocabulary differs from the model's")
            entry.update(kind="category", vocabulary=[str(v) for v in vocab[name]])
        else:
            entry["kind"] = "bool" if name in OWN_BOOL_COLUMNS else "numeric"
        if name in CALENDAR_COLUMNS:
            entry["source"] = "calendar"
        elif name in HISTORY_COLUMNS:
            entry.update(source="history", first_turn=0 if name in _FIRST_TURN_ZERO else None)
        else:
            entry["source"] = "request"
        out.append(entry)
    return out


def _sections(run: Any, summary: dict, *, mlflow_run_id: str | None,
              git_commit: str | None) -> dict[str, Any]:
    cfg, model, cq = run.config, run.model, run.calibrator
    qs = [float(q) for q in cfg.quantiles]
    if 0.5 not in qs or 0.9 not in qs:
        raise DemandExportError(f"quantiles {qs}: a demand hint needs the 0.5 and 0.9 levels")
    test = summary.get("test", {})
    model_test = test.get("model", {})
    cap = run.baselines["max_tokens_cap"]
    return {
        "contracts": {"ledger": LEDGER_VERSION, "hint": list(SUPPORTED_HINT_VERSIONS)},
        "features": feature_schema(model),
        "outputs": {
            "onnx_input": "X", "onnx_output": "raw", "quantiles": qs, "scale": cfg.scale,
            "clip_to_cap": bool(cfg.clip_to_cap), "interval": float(cfg.interval),
            "unit": "total tokens (prompt_tokens + completion_tokens)",
            "post_processing": "raw (n, q) -> sort per row -> inverse scale -> + prompt_tokens "
                               "-> clip to [prompt, prompt + max_tokens]; interval: "
                               "conformal_band(lowest, highest quantile, correction of the "
                               "request's cell) (replaylab.runtime.demand_math)",
        },
        "calibration": {
            "method": "group_cqr", "level": float(cq.level), "scale": cq.scale,
            "group_columns": list(cq.group_columns), "min_group_size": int(cq.min_group_size),
            "missing_value": "<none>", "n_calibration": int(cq.n_calibration_),
            "global_correction": _json_float(cq.global_correction_),
            "corrections": {k: _json_float(v) for k, v in sorted(cq.corrections_.items())},
            "cell_sizes": dict(sorted(cq.cell_sizes_.items())),
        },
        "training": {
            "ledger_fingerprint": run.ledger_fingerprint,
            "projection_version": run.projection_version,
            "time_window": dict(getattr(run, "time_window", {}) or {}),
            "rows": summary.get("splits", {}).get("rows", {}),
            "labels": summary.get("labels", {}),
            "best_iterations": [int(k) for k in model.best_iterations_],
            "headline": {
                "test_mean_pinball": model_test.get("mean_pinball"),
                "test_coverage": model_test.get("coverage"),
                "test_mean_width": model_test.get("mean_width"),
                "best_baseline": test.get("best_baseline"),
            },
            "mlflow_run_id": mlflow_run_id, "git_commit": git_commit,
            "replaylab_version": __version__,
        },
        "runtime": {
            "packages": {"numpy": ">=2.0", "onnxruntime": ">=1.18"},
            "onnx_opset": ONNX_OPSET, "ai_onnx_ml_opset": ML_OPSET, "ir_version": 10,
            "input_dtype": "float64", "loader": "replaylab.runtime.DemandPredictor",
        },
        "fallback": {
            "name": "max_tokens_cap", "default_max_tokens": int(cap.default_max_tokens_),
            "rule": "lo = prompt; p50 = p90 = hi = prompt + (max_tokens or default_max_tokens); "
                    "no coverage claimed",
        },
    }


def export_demand(run: Any, summary: dict, out_dir: str | Path, *, version: str = "1.0.0",
                  valid_days: float = 30.0, hmac_key: bytes | None = None,
                  created: datetime | None = None, mlflow_run_id: str | None = None,
                  git_commit: str | None = None, _after_model_written: Any = None) -> Path:
    """Write the demand artifact of `run` (a DemandRun) to `out_dir`; returns `out_dir`.

    summary: the run's summary.json dict (training facts). version: semantic
    version; valid_days: validity period from `created` (now). hmac_key: sign
    the manifest. Raises DemandExportError for a run that cannot be exported.
    """
    out_dir = Path(out_dir)
    sections = _sections(run, summary, mlflow_run_id=mlflow_run_id, git_commit=git_commit)
    graph = demand_model_to_onnx(run.model)
    with staged_folder(out_dir) as tmp:
        model_path = tmp / MODEL_FILE
        with model_path.open("wb") as f:
            f.write(graph.SerializeToString())
            f.flush()
            os.fsync(f.fileno())
        if _after_model_written is not None:  # test hook: interrupt an export midway
            _after_model_written(tmp)
        manifest = build_manifest(tmp, kind=KIND, version=version, valid_days=valid_days,
                                  created=created, **sections)
        write_manifest(tmp, manifest, hmac_key=hmac_key)
    return out_dir

