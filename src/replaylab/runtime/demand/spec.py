"""The demand manifest's sections as typed, frozen records: one schema for writer and reader.

The exporter (`replaylab.artifacts.demand_export`) builds a `DemandSections` and writes
`DemandSections.as_manifest()` through `contracts.manifest.build_manifest`; the runtime
reads a verified manifest back with `DemandSpec.from_manifest` (the sections it needs,
checked, plus what it derives: quantile positions, validity in ms, the assembly plan).
A section's `as_dict()` is exactly the JSON object of docs/specs/artifacts.md (the
manifest is canonical JSON, so the key order does not matter, the values do: a
first-turn count is the integer 0, a category's vocabulary a list of strings). The Rust
scorer (`scorers/rust`) reads the same JSON; the spec and the golden vectors bind it.

Standard library only (the serving runtime imports it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from replaylab.contracts.columns import CALENDAR_COLUMNS, HISTORY_COLUMNS
from replaylab.runtime.demand.fallback import FallbackBaseline
from replaylab.runtime.demand_math import SCALES

KIND = "demand"
MODEL_FILE = "model.onnx"
FEATURE_KINDS = ("numeric", "bool", "category")
FEATURE_SOURCES = ("request", "calendar", "history")
BASE_BANDS = ("clipped", "unclipped")


class ArtifactError(Exception):
    """The artifact verified but this runtime cannot use it; `reason` is a short code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


@dataclass(frozen=True)
class FeatureSpec:
    """One model feature, in the order of the model's input row.

    kind: numeric / bool / category (vocabulary: LightGBM's category codes are
    positions in it); source: request (a request field), calendar (from `timestamp`),
    history (a `hist_*` field; first_turn: its value on a first turn, 0 for the
    counts, None = missing).
    """

    name: str
    kind: str
    source: str
    vocabulary: tuple[str, ...] | None = None
    first_turn: int | float | None = None
    dtype: str = "float64"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "kind": self.kind}
        if self.vocabulary is not None:
            out["vocabulary"] = list(self.vocabulary)
        out["source"] = self.source
        if self.source == "history":
            out["first_turn"] = self.first_turn
        return out

    @classmethod
    def from_dict(cls, f: Any) -> FeatureSpec:
        """Checked: kinds and sources known, calendar and history names the runtime
        assembles, a category's vocabulary unique strings (ArtifactError feature_schema)."""
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise ArtifactError("feature_schema", f"bad feature entry {f!r}")
        kind, source, name = f.get("kind"), f.get("source"), f["name"]
        if kind not in FEATURE_KINDS or source not in FEATURE_SOURCES:
            raise ArtifactError("feature_schema", f"{name}: kind {kind!r} / source {source!r}")
        if (source == "calendar" and name not in CALENDAR_COLUMNS) or (
                source == "history" and name not in HISTORY_COLUMNS):
            raise ArtifactError("feature_schema", f"{name}: unknown {source} feature")
        vocab = None
        if kind == "category":
            vocab = f.get("vocabulary")
            if not isinstance(vocab, list) or not all(isinstance(v, str) for v in vocab) \
                    or len(set(vocab)) != len(vocab):
                raise ArtifactError("feature_schema", f"{name}: bad vocabulary")
            vocab = tuple(vocab)
        return cls(name, kind, source, vocab, f.get("first_turn"), f.get("dtype", "float64"))


@dataclass(frozen=True)
class Outputs:
    """What the ONNX graph returns and how a hint is made of it."""

    quantiles: tuple[float, ...]
    scale: str
    clip_to_cap: bool
    interval: float | None
    post_processing: str = ""
    onnx_input: str = "X"
    onnx_output: str = "raw"
    unit: str = "total tokens (prompt_tokens + completion_tokens)"

    def as_dict(self) -> dict[str, Any]:
        return {"onnx_input": self.onnx_input, "onnx_output": self.onnx_output,
                "quantiles": list(self.quantiles), "scale": self.scale,
                "clip_to_cap": self.clip_to_cap, "interval": self.interval, "unit": self.unit,
                "post_processing": self.post_processing}

    @classmethod
    def from_dict(cls, d: dict) -> Outputs:
        return cls(tuple(float(q) for q in d["quantiles"]), d["scale"],
                   bool(d.get("clip_to_cap", True)), d.get("interval"),
                   d.get("post_processing", ""), d.get("onnx_input", "X"),
                   d.get("onnx_output", "raw"), d.get("unit", ""))


@dataclass(frozen=True)
class Calibration:
    """The group conformal correction per cell (None: unbounded, too few rows)."""

    level: float
    scale: str
    group_columns: tuple[str, ...]
    corrections: dict[str, float | None]
    global_correction: float | None
    min_group_size: int = 0
    n_calibration: int = 0
    cell_sizes: dict[str, int] = field(default_factory=dict)
    base_band: str = "clipped"  # absent in artifacts before `unclipped` existed
    method: str = "group_cqr"
    missing_value: str = "<none>"

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "level": self.level, "scale": self.scale,
                "group_columns": list(self.group_columns),
                "min_group_size": self.min_group_size, "missing_value": self.missing_value,
                "n_calibration": self.n_calibration,
                "global_correction": self.global_correction, "base_band": self.base_band,
                "corrections": dict(self.corrections), "cell_sizes": dict(self.cell_sizes)}

    @classmethod
    def from_dict(cls, d: dict) -> Calibration:
        glob = d["global_correction"]
        return cls(float(d["level"]), d.get("scale", ""),
                   tuple(str(c) for c in d["group_columns"]),
                   {str(k): (None if v is None else float(v))
                    for k, v in d["corrections"].items()},
                   None if glob is None else float(glob), d.get("min_group_size", 0),
                   d.get("n_calibration", 0), dict(d.get("cell_sizes", {})),
                   d.get("base_band", "clipped"), d.get("method", "group_cqr"),
                   d.get("missing_value", "<none>"))


@dataclass(frozen=True)
class Fallback:
    """The baseline that answers when the model cannot (`fallback.FallbackBaseline`)."""

    default_max_tokens: int
    name: str = "max_tokens_cap"
    rule: str = ("lo = prompt; p50 = p90 = hi = prompt + (max_tokens or default_max_tokens); "
                 "no coverage claimed")

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "default_max_tokens": self.default_max_tokens,
                "rule": self.rule}

    @classmethod
    def from_dict(cls, d: dict) -> Fallback:
        return cls(int(d["default_max_tokens"]), str(d["name"]), d.get("rule", ""))

    def baseline(self) -> FallbackBaseline:
        return FallbackBaseline(self.default_max_tokens, self.name)


@dataclass(frozen=True)
class Contracts:
    """The data contracts the artifact speaks: ledger-v1, the hint versions."""

    ledger: str
    hint: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"ledger": self.ledger, "hint": list(self.hint)}


@dataclass(frozen=True)
class Training:
    """Where the model came from (read by people and the registry, not by serving)."""

    ledger_fingerprint: str
    projection_version: str
    time_window: dict
    rows: dict
    labels: dict
    best_iterations: tuple[int, ...]
    headline: dict
    gate: Any
    mlflow_run_id: str | None
    git_commit: str | None
    replaylab_version: str

    def as_dict(self) -> dict[str, Any]:
        return {"ledger_fingerprint": self.ledger_fingerprint,
                "projection_version": self.projection_version,
                "time_window": self.time_window, "rows": self.rows, "labels": self.labels,
                "best_iterations": list(self.best_iterations), "headline": self.headline,
                "gate": self.gate, "mlflow_run_id": self.mlflow_run_id,
                "git_commit": self.git_commit, "replaylab_version": self.replaylab_version}


@dataclass(frozen=True)
class Requirements:
    """What serving needs: packages, ONNX opsets, the input dtype, the loader."""

    onnx_opset: int
    ai_onnx_ml_opset: int
    packages: dict[str, str] = field(
        default_factory=lambda: {"numpy": ">=2.0", "onnxruntime": ">=1.18"})
    ir_version: int = 10
    input_dtype: str = "float64"
    loader: str = "replaylab.runtime.DemandPredictor"

    def as_dict(self) -> dict[str, Any]:
        return {"packages": dict(self.packages), "onnx_opset": self.onnx_opset,
                "ai_onnx_ml_opset": self.ai_onnx_ml_opset, "ir_version": self.ir_version,
                "input_dtype": self.input_dtype, "loader": self.loader}


@dataclass(frozen=True)
class DemandSections:
    """The kind-specific sections of a demand manifest (`build_manifest(**as_manifest())`)."""

    contracts: Contracts
    features: tuple[FeatureSpec, ...]
    outputs: Outputs
    calibration: Calibration
    training: Training
    runtime: Requirements
    fallback: Fallback

    def as_manifest(self) -> dict[str, Any]:
        return {"contracts": self.contracts.as_dict(),
                "features": [f.as_dict() for f in self.features],
                "outputs": self.outputs.as_dict(), "calibration": self.calibration.as_dict(),
                "training": self.training.as_dict(), "runtime": self.runtime.as_dict(),
                "fallback": self.fallback.as_dict()}


@dataclass(frozen=True)
class DemandSpec:
    """What a verified manifest says about inputs, outputs and calibration, checked, and
    what the runtime derives from it (ArtifactError `feature_schema` / `outputs`)."""

    features: tuple[FeatureSpec, ...]
    outputs: Outputs
    calibration: Calibration
    fallback: FallbackBaseline
    i50: int
    i90: int
    version: str  # `<semver>+<content hash prefix>`
    created_ms: int
    valid_until_ms: int
    plan: tuple  # (name, operation, category index, first-turn value) per feature

    @property
    def quantiles(self) -> tuple[float, ...]:
        return self.outputs.quantiles

    @property
    def clipped_band(self) -> bool:
        """The conformal base band is the quantiles after the cap clip (artifacts before
        `calibration.base_band: unclipped`) or before it (demand_math.total_and_band)."""
        return self.calibration.base_band == "clipped"

    @staticmethod
    def from_manifest(m: dict) -> DemandSpec:
        from replaylab.runtime.demand.request import operation

        feats = tuple(FeatureSpec.from_dict(f) for f in m["features"])
        if len({f.name for f in feats}) != len(feats) or not feats:
            raise ArtifactError("feature_schema", "empty or duplicate feature names")
        try:
            out = Outputs.from_dict(m["outputs"])
            cal = Calibration.from_dict(m["calibration"])
            i50, i90 = out.quantiles.index(0.5), out.quantiles.index(0.9)
            fallback = Fallback.from_dict(m["fallback"]).baseline()
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError("outputs", f"outputs/calibration/fallback unusable: {exc}") from None
        qs, level = out.quantiles, cal.level
        if out.scale not in SCALES or list(qs) != sorted(set(qs)) or not 0.0 < level < 1.0:
            raise ArtifactError("outputs", f"scale {out.scale!r}, quantiles {qs}, level {level}")
        if cal.base_band not in BASE_BANDS:
            raise ArtifactError("outputs", f"calibration.base_band {cal.base_band!r}")
        created = datetime.fromisoformat(m["created_at"]).astimezone(UTC)
        until = datetime.fromisoformat(m["valid_until"]).astimezone(UTC)
        version = f"{m['version']}+{m['content_hash'].removeprefix('sha256:')[:12]}"
        plan = tuple((f.name, operation(f.name, f.kind, f.source),
                      None if f.vocabulary is None
                      else {v: i for i, v in enumerate(f.vocabulary)},
                      math.nan if f.first_turn is None else float(f.first_turn)) for f in feats)
        return DemandSpec(feats, out, cal, fallback, i50, i90, version,
                          int(created.timestamp() * 1000), int(until.timestamp() * 1000), plan)
