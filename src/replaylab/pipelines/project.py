"""The foundation pipeline: ledger in, validated rows, dispatch-time features and splits out.

One implementation on the compute engine (`replaylab.compute`: `LocalEngine` in this
process, `DaskEngine` on a cluster; `compute` means only where the partitions are
processed). `load_ledger` reads a ledger-v1 file (or makes the embedded synthetic one)
and validates it; `project_ledger` takes that, or a ledger dataset spec read and
validated per partition by the engine, and in five stages

1. read: the valid rows as partitions, the quarantine written (`quarantine/ledger.jsonl`
   from memory; one Parquet file per partition when the engine read the dataset);
2-3. fingerprint, project: `projection.project_on`, the one recipe (the same features,
   split of every row, fingerprint and version on either engine);
4. write: `features.parquet` (one partition), else `features/part.i.parquet` written
   where the partitions are;
5. aggregates: the ledger profile, label and split counts as partition sums; the
   figures and report from the rows of a hashed sample of sessions
   (`compute.ops.hashed_sample`) of at most about `SAMPLE_ROWS` rows (all rows below),

and returns the summary every later pipeline extends; `summary["compute"]` says which
engine ran. The driver holds counts, boundaries and the figures' sample, never the
ledger, when the engine reads a dataset.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from replaylab.compute import LocalEngine, ops
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
from replaylab.projection import ProjectionConfig, SplitConfig, feature_columns, project_on
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
    if inp.path:  # a file, or a dataset (a directory, a glob: compute/ledger.py)
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
    return {**artifacts, **ledger_artifact(loaded, out_dir, write_ledger)}


def ledger_artifact(loaded: LoadedLedger, out_dir: Path, write_ledger: bool) -> dict[str, str]:
    """{"ledger": where the run's ledger is}: the synthetic ledger written beside the run's
    outputs (write_ledger), or the file it was read from; {} for an unwritten synthetic."""
    if write_ledger and loaded.raw is not None:
        loaded.raw.to_parquet(out_dir / "ledger.parquet", index=False)
        return {"ledger": str(out_dir / "ledger.parquet")}
    return {} if loaded.origin == "synthetic" else {"ledger": loaded.origin}


def write_features(engine: Any, features: Any, out_dir: Path) -> str:
    """A run's projected rows where its readers expect them: `features.parquet` when the
    frame is one partition, else `features/` with a Parquet file per partition (written by
    the workers under Dask); the path."""
    if engine.npartitions(features) == 1:
        path = out_dir / "features.parquet"
        engine.collect(features).to_parquet(path, index=False)
        return str(path)
    engine.write(features, out_dir / "features")
    return str(out_dir / "features")


STAGES = {"read": "read and validate the ledger, the quarantine written",
          "fingerprint": "the ledger fingerprint (sorted row hashes, range by range)",
          "project": "projection and exact split boundaries (sessions whole per partition)",
          "write": "features written where the partitions are",
          "aggregates": "profile, labels and splits as partition sums; the figures' sample"}
SAMPLE_ROWS = 100_000  # about the rows the figures are drawn from (whole sessions, hashed)
PROFILE_COUNTS = (L.LIFECYCLE_STATE, L.FINISH_REASON, L.CATEGORY, L.SELECTED_MODEL)


def profile_parts(ledger: pd.DataFrame) -> dict[str, Any]:
    """A partition's additive part of the ledger profile: requests, absent usage and the
    value counts of `PROFILE_COUNTS` (absent and all-null columns: no counts)."""
    counts = {}
    for col in PROFILE_COUNTS:
        if has_values(ledger, col):  # absent and all null: the same "unknown"
            counts[col] = {str(k): int(v)
                           for k, v in ledger[col].value_counts(dropna=False).items()}
    return {"requests": int(len(ledger)),
            "usage_absent": int(ledger[L.COMPLETION_TOKENS].isna().sum()), "counts": counts}


def session_parts(features: pd.DataFrame) -> dict[str, int]:
    """A session-whole partition's sessions, most turns, time window and label counts."""
    turns = features.groupby(L.SESSION_ID).size()
    absent = features[P.LABEL_USAGE_ABSENT].fillna(False).astype(bool)
    censored = features[P.LABEL_CENSORED].fillna(False).astype(bool)
    t = features[L.TIMESTAMP]
    return {"sessions": int(turns.size), "max_turns": int(turns.max()) if turns.size else 0,
            "t_min": int(t.min()) if len(t) else None, "t_max": int(t.max()) if len(t) else None,
            "rows": int(len(features)), "usable": int((~absent & ~censored).sum()),
            "censored": int((censored & ~absent).sum()), "absent_usage": int(absent.sum())}


def _profile(ledger_parts: list[dict], session_parts_: list[dict]) -> dict[str, Any]:
    counts: dict[str, dict[str, int]] = {}
    for part in ledger_parts:
        for col, values in part["counts"].items():
            acc = counts.setdefault(col, {})
            for k, v in values.items():
                acc[k] = acc.get(k, 0) + v
    sessions = sum(p["sessions"] for p in session_parts_)
    rows = sum(p["rows"] for p in session_parts_)
    lo = [p["t_min"] for p in session_parts_ if p["t_min"] is not None]
    hi = [p["t_max"] for p in session_parts_ if p["t_max"] is not None]
    return {
        "requests": sum(p["requests"] for p in ledger_parts),
        "sessions": int(sessions),
        "turns_per_session": {"mean": rows / sessions if sessions else float("nan"),
                              "max": max((p["max_turns"] for p in session_parts_), default=0)},
        "time_window_ms": [min(lo) if lo else None, max(hi) if hi else None],
        **{col: dict(sorted(counts.get(col, {}).items(), key=lambda kv: (-kv[1], kv[0])))
           for col in PROFILE_COUNTS},
        "usage_absent": sum(p["usage_absent"] for p in ledger_parts),
    }


def ledger_profile(ledger: pd.DataFrame) -> dict[str, Any]:
    """Counts a reviewer checks first: sessions, turns, categories, models, time window."""
    return _profile([profile_parts(ledger)], [session_parts(_session_columns(ledger))])


def _session_columns(ledger: pd.DataFrame) -> pd.DataFrame:
    """The columns `session_parts` reads, from a ledger (usage absent from the tokens)."""
    absent = ledger[L.COMPLETION_TOKENS].isna()
    return pd.DataFrame({L.SESSION_ID: ledger[L.SESSION_ID], L.TIMESTAMP: ledger[L.TIMESTAMP],
                         P.LABEL_USAGE_ABSENT: absent,
                         P.LABEL_CENSORED: pd.Series(False, index=ledger.index)})


def project_ledger(source: LoadedLedger | str, projection: ProjectionConfig,
                   split: SplitConfig, out_dir: Path, *, engine: Any = None,
                   write_ledger: bool = True, seed: int = 0, blocksize: int | str | None = None,
                   progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """pipeline=project on `engine` (default `LocalEngine()`): see the module docstring.

    source: a `LoadedLedger` (read or generated in memory: `load_ledger`), or a ledger
    dataset spec (a file, a directory, a glob: `compute.ledger.ledger_paths`) read and
    validated per partition by the engine (`blocksize`: bytes per Dask partition).
    Writes quarantine/, features, figures/ and report.html under out_dir; returns the
    summary. progress(text): the stage lines (default the `replaylab` logger)."""
    eng = engine or LocalEngine()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    artifacts: dict[str, str] = {}
    loaded = source if isinstance(source, LoadedLedger) else None
    with eng.stages(STAGES, progress) as stage:
        with stage("read"):
            if loaded is not None:
                ledger = eng.from_validated(loaded.result)
                artifacts.update(write_run_inputs(loaded, out_dir, write_ledger))
            else:
                ledger = eng.read_ledger(str(source), blocksize=blocksize)
                quarantine = ledger.write_quarantine(out_dir / "quarantine")
                if quarantine is not None:
                    artifacts["quarantine"] = quarantine
                artifacts["ledger"] = str(source)
        projected = project_on(eng, ledger.valid, projection, split, step=stage)
        features, facts = projected.features, projected.splits
        with stage("write"):
            artifacts["features"] = write_features(eng, features, out_dir)
        with stage("aggregates"):
            profile = _profile(eng.each(profile_parts, ledger.valid),
                               sess := eng.each(session_parts, features))
            n_rows = sum(p["rows"] for p in sess)
            frac = min(1.0, SAMPLE_ROWS / max(n_rows, 1))
            sample_f = eng.collect(ops.hashed_sample(eng, features, frac, seed))
            sample_l = eng.collect(ops.hashed_sample(eng, ledger.valid, frac, seed))
    timings = dict(stage.timings)
    accounting = ledger.summary()
    origin = loaded.origin if loaded is not None else str(source)
    figures = ledger_figures(sample_l, sample_f, out_dir / "figures")
    sampled = ({"figures": f"from a hashed sample of {len(sample_f):,} of {n_rows:,} rows "
                           f"(whole sessions, seed {seed})"} if frac < 1.0 else {})
    report = write_html_report(
        out_dir / "report.html", title="replaylab: ledger and projection",
        facts={"source": origin, **accounting, "projection_version": projected.version,
               "split_boundaries": facts["boundaries"], **sampled},
        figures=figures)
    return {
        "pipeline": "project",
        **{k: v for k, v in accounting.items() if k != "contract"},
        "injected_defects": loaded.injected_defects if loaded is not None else {},
        "ledger": profile,
        "ledger_fingerprint": projected.fingerprint,
        "projection": {
            "version": projected.version,
            "rows": int(n_rows),
            "assume_ended_before_next": projection.assume_ended_before_next,
            "ewma_alpha": projection.ewma_alpha,
            "split_config": asdict(split),
            "feature_columns": feature_columns(sample_f),
            "label_columns": [c for c in LABEL_COLUMNS if c in sample_f.columns],
        },
        "labels": {k: int(sum(p[k] for p in sess))
                   for k in ("rows", "usable", "censored", "absent_usage")},
        # every split's rows; the sessions of the splits that have any
        "splits": {"rows": facts["rows"],
                   "sessions": {k: v for k, v in facts["sessions"].items() if v}},
        "split_boundaries": facts["boundaries"],
        "artifacts": artifacts,
        "reports": {"html": str(report), **{k: str(v) for k, v in figures.items()}},
        "figure_sample_rows": int(len(sample_f)),
        "partitions": int(ledger.npartitions),
        "compute": eng.facts(),
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
        "rows_per_second_projection": round(n_rows / max(timings.get("project", 0.0), 1e-9)),
    }
