"""Export a trained demand run as a versioned, verifiable artifact folder (atomically).

`export_demand(run, summary, out_dir, ...)` writes

    out_dir/model.onnx      every quantile booster, exact (double) TreeEnsemble
    out_dir/trees.safetensors  the same trees as flat LightGBM node arrays, for engines
                            without onnxruntime (replaylab.artifacts.demand_flat,
                            docs/specs/demand-scorer.md)
    out_dir/golden.json     golden vectors: ~32 test-split requests and the hints
                            the runtime computes for them here, with tolerances
                            (replaylab.contracts.golden; checked again at load);
                            each case also holds the feature vector (`features`,
                            null = NaN) and LightGBM's raw scores (`raw`) for a
                            non-Python engine's checks
    out_dir/manifest.json   schema 1 (docs/specs/artifacts.md): features, outputs,
                            conformal corrections per cell, training facts,
                            runtime requirements, fallback baseline, file hashes

The golden hints come from `replaylab.runtime.DemandPredictor` itself, run on
the staged model.onnx and manifest sections, so the loader compares like with
like; before they are written they are checked against the LightGBM model and
its conformal calibrator on the same rows (the export's parity check: a miss
raises DemandExportError and publishes nothing), and the flat trees must give
LightGBM's raw scores on them bit for bit.

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
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from replaylab import __version__
from replaylab.artifacts.demand_flat import (
    TREES_FILE,
    flat_predict,
    flat_trees,
    schema_matrix,
    trees_bytes,
)
from replaylab.artifacts.onnx_lgbm import ML_OPSET, ONNX_OPSET, demand_model_to_onnx
from replaylab.contracts import Ledger as L
from replaylab.contracts.columns import (
    CALENDAR_COLUMNS,
    HISTORY_COLUMNS,
    HISTORY_COUNT_COLUMNS,
    KEY_COLUMNS,
    OWN_BOOL_COLUMNS,
)
from replaylab.contracts.columns import Projected as P
from replaylab.contracts.golden import golden_document, max_abs_diff, write_golden
from replaylab.contracts.hints import SUPPORTED_HINT_VERSIONS
from replaylab.contracts.ledger import LEDGER_VERSION
from replaylab.contracts.manifest import build_manifest, staged_folder, write_manifest
from replaylab.demand.model import base_band, request_cap
from replaylab.projection.requests import requests
from replaylab.runtime.demand import KIND, MODEL_FILE, DemandPredictor
from replaylab.runtime.demand.predictor import GOLDEN_HINTS
from replaylab.runtime.demand.spec import (
    Calibration,
    Contracts,
    DemandSections,
    Fallback,
    FeatureSpec,
    Outputs,
    Requirements,
    Training,
)

# First-turn values of the history features: counts are 0, everything else missing.
_FIRST_TURN_ZERO = (*HISTORY_COUNT_COLUMNS, P.TURNS_CENSORED)
# Golden-vector tolerances, checked on the serving machine (replaylab.runtime.demand).
# The graph is exact in double (docs/specs/artifacts.md: 1e-15 relative to LightGBM) and the
# post-processing is the same numpy code on both sides, so another CPU can differ only
# by summation order and an ulp or two of expm1 / log1p: ~1e-13 relative at most. A
# tree read differently (a threshold or a leaf rounded, a branch flipped) moves a hint
# by a leaf value, typically 1e-4 relative or more. 1e-6 relative and 0.01 token sit between the
# two with orders of magnitude to spare either side; both bounds must hold.
# raw_abs: the per-quantile raw scores of an engine walking trees.safetensors (summed in
# file order, docs/specs/demand-scorer.md) against LightGBM's: 0, bit for bit.
GOLDEN_TOLERANCES = {"hint_abs": 0.01, "hint_rel": 1e-6, "raw_abs": 0.0}
UNSEEN_CATEGORY = "golden-unseen-category"  # a value no vocabulary holds


class DemandExportError(ValueError):
    """The run cannot be exported as a demand artifact (the message says why)."""


def _json_float(x: float) -> float | None:
    """A correction as JSON: +inf (too few calibration rows) -> null, read back as unbounded."""
    x = float(x)
    return x if math.isfinite(x) else None


def feature_schema(model: Any) -> tuple[FeatureSpec, ...]:
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
        vocabulary = None
        if name in vocab:
            if [str(v) for v in vocab[name]] != list(model.categories_[name]):
                raise DemandExportError(f"{name}: the booster's vocabulary differs from the model's")
            kind, vocabulary = "category", tuple(str(v) for v in vocab[name])
        else:
            kind = "bool" if name in OWN_BOOL_COLUMNS else "numeric"
        first_turn = None
        if name in CALENDAR_COLUMNS:
            source = "calendar"
        elif name in HISTORY_COLUMNS:
            source, first_turn = "history", 0 if name in _FIRST_TURN_ZERO else None
        else:
            source = "request"
        out.append(FeatureSpec(name, kind, source, vocabulary, first_turn))
    return tuple(out)


def demand_sections(run: Any, summary: dict, *, mlflow_run_id: str | None,
                    git_commit: str | None) -> DemandSections:
    """The typed manifest sections of a demand run (`runtime.demand.spec`)."""
    cfg, model, cq = run.config, run.model, run.calibrator
    qs = [float(q) for q in cfg.quantiles]
    if 0.5 not in qs or 0.9 not in qs:
        raise DemandExportError(f"quantiles {qs}: a demand hint needs the 0.5 and 0.9 levels")
    test = summary.get("test", {})
    model_test = test.get("model", {})
    cap = run.baselines["max_tokens_cap"]
    return DemandSections(
        contracts=Contracts(LEDGER_VERSION, tuple(SUPPORTED_HINT_VERSIONS)),
        features=feature_schema(model),
        outputs=Outputs(
            quantiles=tuple(qs), scale=cfg.scale, clip_to_cap=bool(cfg.clip_to_cap),
            interval=float(cfg.interval),
            post_processing="raw (n, q) -> sort per row -> inverse scale -> + prompt_tokens "
                            "-> clip to [prompt, prompt + max_tokens]; interval: "
                            "conformal_band(lowest, highest quantile before the clip "
                            "(calibration.base_band), correction of the request's cell), "
                            "then the same clip (replaylab.runtime.demand_math)"),
        calibration=Calibration(
            level=float(cq.level), scale=cq.scale, group_columns=tuple(cq.group_columns),
            min_group_size=int(cq.min_group_size), n_calibration=int(cq.n_calibration_),
            global_correction=_json_float(cq.global_correction_),
            # the band the corrections were fitted on (replaylab.runtime.demand_math)
            base_band=getattr(model, "base_band_", "clipped"),
            corrections={k: _json_float(v) for k, v in sorted(cq.corrections_.items())},
            cell_sizes=dict(sorted(cq.cell_sizes_.items()))),
        training=Training(
            ledger_fingerprint=run.ledger_fingerprint,
            projection_version=run.projection_version,
            time_window=dict(getattr(run, "time_window", {}) or {}),
            rows=summary.get("splits", {}).get("rows", {}),
            labels=summary.get("labels", {}),
            best_iterations=tuple(int(k) for k in model.best_iterations_),
            headline={
                "test_mean_pinball": model_test.get("mean_pinball"),
                "test_coverage": model_test.get("coverage"),
                "test_mean_width": model_test.get("mean_width"),
                "best_baseline": test.get("best_baseline"),
            },
            # the go/no-go the run's report shows (replaylab.demand.gate): the registry reads it
            gate=summary.get("gate"),
            mlflow_run_id=mlflow_run_id, git_commit=git_commit, replaylab_version=__version__),
        runtime=Requirements(onnx_opset=ONNX_OPSET, ai_onnx_ml_opset=ML_OPSET),
        fallback=Fallback(default_max_tokens=int(cap.default_max_tokens_)),
    )


def _unseen_column(features: Sequence[FeatureSpec]) -> str | None:
    """The request category the unseen-value case changes: `category`, else the first one."""
    cats = [f.name for f in features if f.kind == "category" and f.source == "request"]
    return L.CATEGORY if L.CATEGORY in cats else (cats[0] if cats else None)


def golden_inputs(rows: pd.DataFrame, features: Sequence[FeatureSpec]
                  ) -> tuple[list[dict], pd.DataFrame]:
    """The golden cases' request dicts and the frame LightGBM scores for them.

    One request per row (`projection.requests.requests`: keys, the artifact's
    request fields and session history; the calendar features are left to the
    runtime, which derives them from `timestamp`); a first turn is sent without any
    `hist_*` field (the runtime's first-turn path). One more case copies the first later turn (else the first row) with
    an unseen request category (the runtime's and LightGBM's missing branch,
    the global correction). The frame holds the same rows, that case included.
    """
    wanted = [*KEY_COLUMNS, *(f.name for f in features if f.source != "calendar")]
    frame = rows.reset_index(drop=True)
    column = _unseen_column(features)
    if column is not None and len(frame):
        later = np.flatnonzero(frame[P.TURNS_DISPATCHED].to_numpy(
            dtype="float64", na_value=np.nan) > 0) if P.TURNS_DISPATCHED in frame else []
        source = int(later[0]) if len(later) else 0
        extra = frame.iloc[[source]].copy()
        extra[column] = UNSEEN_CATEGORY
        if L.REQUEST_ID in extra:
            extra[L.REQUEST_ID] = f"{extra[L.REQUEST_ID].iloc[0]}+unseen-{column}"
        frame = pd.concat([frame.astype({column: object}), extra.astype({column: object})],
                          ignore_index=True)
    return requests(frame, wanted), frame


def _lightgbm_parity(run: Any, frame: pd.DataFrame, expected: list[dict]) -> dict:
    """The golden hints against LightGBM + the conformal calibrator on the same rows.

    Rows the runtime answers with a fallback (e.g. `uncertain`) are left out.
    Raises DemandExportError when a hint differs beyond GOLDEN_TOLERANCES.
    """
    model, cq = run.model, run.calibrator
    q, band_lo, band_hi = base_band(model, frame)
    cap = request_cap(frame) if model.clip_to_cap else None
    lo, hi = cq.predict_interval(frame, band_lo, band_hi, cap)
    qs = [float(x) for x in model.quantiles]
    ref = np.column_stack([q[:, qs.index(0.5)], q[:, qs.index(0.9)], lo, hi])
    got = np.array([[e[k] for k in GOLDEN_HINTS] for e in expected], dtype="float64")
    used = np.array([not e["hint_fallback"] for e in expected], dtype=bool)
    scale = np.maximum(np.abs(ref[used]), 1.0)
    figures = {"rows": int(used.sum()), "max_abs": max_abs_diff(ref[used], got[used]),
               "max_rel": max_abs_diff(ref[used] / scale, got[used] / scale)}
    if figures["max_abs"] > GOLDEN_TOLERANCES["hint_abs"] or \
            figures["max_rel"] > GOLDEN_TOLERANCES["hint_rel"]:
        raise DemandExportError(f"the ONNX runtime's hints differ from LightGBM's on the golden "
                                f"rows: {figures} (tolerances {GOLDEN_TOLERANCES})")
    return figures


def _flat_parity(run: Any, frame: pd.DataFrame, features: Sequence[FeatureSpec],
                 trees: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(feature rows, raw scores) of the golden frame; the flat walk must equal LightGBM exactly."""
    model = run.model
    X = schema_matrix(frame, features)
    ref = np.column_stack([b.predict(X, num_iteration=int(k), raw_score=True)
                           for b, k in zip(model.boosters_, model.best_iterations_, strict=True)])
    got = flat_predict(trees, X, ref.shape[1])
    if not np.array_equal(got, ref):
        raise DemandExportError(f"the flat trees differ from LightGBM's raw scores on the golden "
                                f"rows (max {max_abs_diff(got, ref):.3g})")
    return X, ref


def demand_golden(run: Any, rows: pd.DataFrame, manifest: dict, model: bytes,
                  trees: dict[str, np.ndarray] | None = None, *,
                  built_on: Mapping[str, Any] | None = None) -> dict:
    """golden.json of a demand artifact: the runtime's hints for `rows`, checked against LightGBM.

    manifest: the manifest built so far (its sections are what the loader will
    read); model: the staged model.onnx bytes; trees: the flat arrays (default:
    those of run.model). The hints are computed at the manifest's `created_at`,
    so an artifact exported already expired still has golden vectors. Each
    case's `expected` also gets the feature row (`features`, NaN -> null) and
    LightGBM's raw scores (`raw`, the artifact's quantile order, before sorting).
    """
    created = datetime.fromisoformat(manifest["created_at"]).timestamp()
    predictor = DemandPredictor.from_manifest(manifest, model, clock=lambda: created)
    features = tuple(FeatureSpec.from_dict(f) for f in manifest["features"])
    requests, frame = golden_inputs(rows, features)
    expected = predictor.golden_expected(requests)
    parity = _lightgbm_parity(run, frame, expected)
    X, raw = _flat_parity(run, frame, features,
                          flat_trees(run.model) if trees is None else trees)
    for e, x, q in zip(expected, X.tolist(), raw.tolist(), strict=True):
        e["features"] = [None if math.isnan(v) else v for v in x]
        e["raw"] = q
    cases = [{"input": r, "expected": e} for r, e in zip(requests, expected, strict=True)]
    return golden_document(KIND, cases, GOLDEN_TOLERANCES,
                           reference="replaylab.runtime.DemandPredictor on the staged "
                                     "model.onnx and manifest sections",
                           lightgbm_parity=parity, built_on=built_on)


def export_demand(run: Any, summary: dict, out_dir: str | Path, *, version: str = "1.0.0",
                  valid_days: float = 30.0, hmac_key: bytes | None = None,
                  created: datetime | None = None, mlflow_run_id: str | None = None,
                  git_commit: str | None = None, golden_rows: pd.DataFrame | None = None,
                  built_on: Mapping[str, Any] | None = None,
                  _after_model_written: Any = None) -> Path:
    """Write the demand artifact of `run` (a DemandRun) to `out_dir`; returns `out_dir`.

    summary: the run's summary.json dict (training facts). version: semantic
    version; valid_days: validity period from `created` (now). hmac_key: sign
    the manifest. golden_rows: projection rows for the golden vectors (default:
    the test rows the run kept, `DemandRun.golden_rows`). Raises
    DemandExportError for a run that cannot be exported, a run without golden
    rows included (one trained before golden vectors existed: retrain it, or
    pass test rows of its `features.parquet`). built_on: what golden.json records about
    the exporting machine (None: this one, `golden.this_machine()`; a committed fixture
    passes `golden.ANY_MACHINE`, so that its bytes are the same on any CPU).
    """
    out_dir = Path(out_dir)
    sections = demand_sections(run, summary, mlflow_run_id=mlflow_run_id,
                               git_commit=git_commit).as_manifest()
    rows = golden_rows if golden_rows is not None else getattr(run, "golden_rows", None)
    if rows is None or len(rows) == 0:
        raise DemandExportError("no golden rows: the run predates golden vectors (retrain it) "
                                "or give golden_rows= (test rows of its features.parquet)")
    created = created or datetime.now(UTC)  # one creation time for both manifest builds
    graph = demand_model_to_onnx(run.model).SerializeToString()
    trees = flat_trees(run.model)
    flat = trees_bytes(trees, len(sections["features"]), sections["outputs"]["quantiles"])
    with staged_folder(out_dir) as tmp:
        model_path = tmp / MODEL_FILE
        with model_path.open("wb") as f:
            f.write(graph)
            f.flush()
            os.fsync(f.fileno())
        with (tmp / TREES_FILE).open("wb") as f:
            f.write(flat)
            f.flush()
            os.fsync(f.fileno())
        if _after_model_written is not None:  # test hook: interrupt an export midway
            _after_model_written(tmp)
        draft = build_manifest(tmp, kind=KIND, version=version, valid_days=valid_days,
                               created=created, **sections)
        golden = write_golden(tmp, demand_golden(run, rows, draft, graph, trees,
                                                 built_on=built_on))
        with golden.open("rb") as f:  # durable before the manifest names it, like model.onnx
            os.fsync(f.fileno())
        manifest = build_manifest(tmp, kind=KIND, version=version, valid_days=valid_days,
                                  created=created, **sections)
        write_manifest(tmp, manifest, hmac_key=hmac_key)
    return out_dir

