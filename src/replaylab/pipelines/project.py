"""The foundation pipeline: ledger in, validated rows, dispatch-time features and splits out.

`load_ledger` reads a ledger-v1 file (or makes the embedded synthetic one) and
validates it; `project_ledger` turns the valid rows into leakage-safe features,
labels and a split column, writes them under the run folder it is handed, and
returns the summary every later pipeline extends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from replaylab.compute.ledger import read_ledger_dataset
from replaylab.contracts import Ledger as L
from replaylab.contracts import (
    ValidationResult,
    has_values,
    validate_ledger,
    write_quarantine,
)
from replaylab.contracts.columns import LABEL_COLUMNS
from replaylab.contracts.columns import Projected as P
from replaylab.projection import (
    ProjectionConfig,
    SplitConfig,
    feature_columns,
    project,
    split_counts,
)
from replaylab.sources.defects import inject_defects
from replaylab.sources.synthetic import SyntheticLedgerConfig, generate_synthetic_ledger
from replaylab.tracking.html import write_html_report
from replaylab.tracking.report import ledger_figures


@dataclass
class LedgerInput:
    """Where the ledger comes from: a file, or the seeded synthetic generator."""

    path: str | None = None
    synthetic: SyntheticLedgerConfig = field(default_factory=SyntheticLedgerConfig)
    defect_rate: float = 0.0  # share of synthetic rows corrupted to exercise the quarantine
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.defect_rate < 1.0:
            raise ValueError(f"defect_rate must be in [0, 1), got {self.defect_rate}")


@dataclass
class LoadedLedger:
    result: ValidationResult
    origin: str  # "synthetic" or the file path
    injected_defects: dict[str, int] = field(default_factory=dict)
    raw: pd.DataFrame | None = None  # the synthetic frame before validation (to write it)


def load_ledger(inp: LedgerInput) -> LoadedLedger:
    """Read and validate the ledger, or generate, corrupt (on purpose) and validate one."""
    if inp.path:  # a file, or a dataset (a directory, a glob: contracts/dataset.py)
        return LoadedLedger(read_ledger_dataset(inp.path), origin=str(inp.path))
    frame = generate_synthetic_ledger(inp.synthetic, seed=inp.seed)
    defects: dict[str, int] = {}
    if inp.defect_rate > 0:
        frame, defects = inject_defects(frame, rate=inp.defect_rate, seed=inp.seed)
    result = validate_ledger(frame, source="synthetic")
    return LoadedLedger(result, origin="synthetic", injected_defects=defects, raw=frame)


def write_run_inputs(loaded: LoadedLedger, out_dir: Path, write_ledger: bool) -> dict[str, str]:
    """The quarantine (and the synthetic ledger) next to a run's outputs; their paths."""
    artifacts: dict[str, str] = {}
    q = write_quarantine(loaded.result, out_dir / "quarantine" / "ledger.jsonl")
    if q is not None:
        artifacts["quarantine"] = str(q)
    if write_ledger and loaded.raw is not None:
        loaded.raw.to_parquet(out_dir / "ledger.parquet", index=False)
        artifacts["ledger"] = str(out_dir / "ledger.parquet")
    elif loaded.origin != "synthetic":
        artifacts["ledger"] = loaded.origin
    return artifacts


def ledger_profile(ledger: pd.DataFrame) -> dict[str, Any]:
    """Counts a reviewer checks first: sessions, turns, categories, models, time window."""
    def counts(col: str) -> dict[str, int]:
        if not has_values(ledger, col):  # absent and all null: the same "unknown"
            return {}
        return {str(k): int(v) for k, v in ledger[col].value_counts(dropna=False).items()}

    turns = ledger.groupby(L.SESSION_ID).size()
    out: dict[str, Any] = {
        "requests": int(len(ledger)),
        "sessions": int(turns.size),
        "turns_per_session": {"mean": float(turns.mean()), "max": int(turns.max())},
        "time_window_ms": [int(ledger[L.TIMESTAMP].min()), int(ledger[L.TIMESTAMP].max())],
        "lifecycle_state": counts(L.LIFECYCLE_STATE),
        "finish_reason": counts(L.FINISH_REASON),
        "category": counts(L.CATEGORY),
        "selected_model": counts(L.SELECTED_MODEL),
        "usage_absent": int(ledger[L.COMPLETION_TOKENS].isna().sum()),
    }
    return out


def project_ledger(loaded: LoadedLedger, projection: ProjectionConfig, split: SplitConfig,
                   out_dir: Path, features_fn: Callable | None = None,
                   write_ledger: bool = True) -> dict[str, Any]:
    """Project the valid rows (`projection.project`); write features, quarantine and report;
    return the summary.

    `features_fn(ledger, projection)`: the features' engine (default the pandas path;
    the entry point passes the Dask one for `compute=dask` on a local ledger: same
    output, by test).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    result = loaded.result
    ledger = result.valid
    artifacts: dict[str, str] = {}

    artifacts.update(write_run_inputs(loaded, out_dir, write_ledger))

    projected = project(ledger, projection, split, features_fn=features_fn)
    fingerprint, version = projected.fingerprint, projected.version
    features = projected.with_split_column()
    took = projected.timings
    timings = {"projection": took["fingerprint"] + took["features"], "splits": took["splits"]}

    path = out_dir / "features.parquet"
    features.to_parquet(path, index=False)
    artifacts["features"] = str(path)

    figures = ledger_figures(ledger, features, out_dir / "figures")
    report = write_html_report(
        out_dir / "report.html", title="replaylab: ledger and projection",
        facts={"source": loaded.origin, **result.summary(), "projection_version": version},
        figures=figures)
    summary = {
        "pipeline": "project",
        **{k: v for k, v in result.summary().items() if k != "contract"},
        "injected_defects": loaded.injected_defects,
        "ledger": ledger_profile(ledger),
        "ledger_fingerprint": fingerprint,
        "projection": {
            "version": version,
            "rows": int(len(features)),
            "assume_ended_before_next": projection.assume_ended_before_next,
            "ewma_alpha": projection.ewma_alpha,
            "split_config": asdict(split),
            "feature_columns": feature_columns(features),
            "label_columns": [c for c in LABEL_COLUMNS if c in features.columns],
        },
        "labels": _label_counts(features),
        "splits": _split_counts(features),
        "artifacts": artifacts,
        "reports": {"html": str(report), **{k: str(v) for k, v in figures.items()}},
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
        "rows_per_second_projection": round(len(features) / max(timings["projection"], 1e-9)),
    }
    return summary


def _label_counts(features: pd.DataFrame) -> dict[str, int]:
    """Rows by label status: usable regression labels, censored (a lower bound), usage absent."""
    absent = features[P.LABEL_USAGE_ABSENT].fillna(False).astype(bool)
    censored = features[P.LABEL_CENSORED].fillna(False).astype(bool)
    return {"rows": int(len(features)), "usable": int((~absent & ~censored).sum()),
            "censored": int((censored & ~absent).sum()), "absent_usage": int(absent.sum())}


def _split_counts(features: pd.DataFrame) -> dict[str, Any]:
    sessions = features.groupby("split")[L.SESSION_ID].nunique()
    return {
        "rows": split_counts(features["split"]),
        "sessions": {str(k): int(v) for k, v in sessions.items()},
    }
