"""`pipeline=project compute=dask` over a ledger dataset: no row of the ledger on the driver.

The same summary as `project.project_ledger`, with every step a Dask graph the
workers run; the driver receives counts, boundaries and one bounded sample for the
figures:

1. read and validate per partition (`contracts.dataset.read_ledger_dask`), the
   quarantine written as Parquet by the workers (`DIR/quarantine/part-*.parquet`);
2-3. `projection.project(..., compute="dask")`, the one projection recipe: the ledger
   fingerprint as a multiset digest of per-partition row hashes
   (`projection.version.ledger_fingerprint_dask`; the local fingerprint sorts every row
   hash, which would gather them all), then project and split
   (`projection.splits_dask.project_and_split_dask`: one shuffle on session_id, exact
   boundaries), the features written as Parquet by the workers
   (`DIR/features/part.*.parquet`);
4. the ledger profile, label and split counts as partition sums;
5. the figures and report from a uniform sample of at most `SAMPLE_ROWS` rows, which
   the report says.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from replaylab.contracts import Ledger as L
from replaylab.contracts import has_values
from replaylab.contracts.columns import LABEL_COLUMNS
from replaylab.contracts.columns import Projected as P
from replaylab.projection import ProjectionConfig, SplitConfig, feature_columns, project
from replaylab.projection.version import FINGERPRINT_SCHEME_DASK

STAGES = {"read": "read and validate per partition, the quarantine written by the workers",
          "fingerprint": "ledger fingerprint from per-partition row hashes",
          "project": "projection and exact split boundaries (one shuffle on session_id)",
          "write": "features written by the workers",
          "aggregates": "profile, labels and splits as partition sums; the figures' sample"}
SAMPLE_ROWS = 100_000  # rows the figures are drawn from (a uniform sample, seeded)
TIMING_KEYS = {"read": "read_validate", "fingerprint": "fingerprint",
               "project": "projection_splits", "write": "write_features",
               "aggregates": "aggregates"}  # summary.json's timings_s keys
PROFILE_COUNTS = (L.LIFECYCLE_STATE, L.FINISH_REASON, L.CATEGORY, L.SELECTED_MODEL)


def profile_parts(ledger: pd.DataFrame) -> pd.DataFrame:
    """A partition's part of `project.ledger_profile` as (key, value, n) rows to be summed
    (sessions are whole in a partition after the session shuffle, so per-partition
    session counts add up)."""
    rows = [("requests", "", len(ledger)), ("usage_absent", "",
                                            int(ledger[L.COMPLETION_TOKENS].isna().sum()))]
    for col in PROFILE_COUNTS:
        if has_values(ledger, col):
            for k, v in ledger[col].value_counts(dropna=False).items():
                rows.append((col, str(k), int(v)))
    return pd.DataFrame(rows, columns=["key", "value", "n"])


def session_parts(features: pd.DataFrame) -> pd.DataFrame:
    """A partition's sessions, most turns, time window and label counts (sessions whole)."""
    turns = features.groupby(L.SESSION_ID).size()
    absent = features[P.LABEL_USAGE_ABSENT].fillna(False).astype(bool)
    censored = features[P.LABEL_CENSORED].fillna(False).astype(bool)
    t = features[L.TIMESTAMP]
    return pd.DataFrame({
        "sessions": [int(turns.size)], "max_turns": [int(turns.max()) if turns.size else 0],
        "t_min": [int(t.min()) if len(t) else np.iinfo(np.int64).max],
        "t_max": [int(t.max()) if len(t) else np.iinfo(np.int64).min],
        "rows": [len(features)], "usable": [int((~absent & ~censored).sum())],
        "censored": [int((censored & ~absent).sum())], "absent_usage": [int(absent.sum())]})


def project_dataset_dask(spec: str, projection: ProjectionConfig, split: SplitConfig,
                         out_dir: Path, blocksize: int | str | None = None,
                         seed: int = 0, progress: Any = None) -> dict[str, Any]:
    """`pipeline=project` over the ledger dataset `spec` on the current Dask client (or
    scheduler); writes quarantine/, features/, figures/ and report.html under out_dir and
    returns the summary (`project.project_ledger`'s keys, plus `split_boundaries`).
    progress(text): the stage lines (`pipelines.stages.DaskStages`: as each of the five
    stages starts and ends; default the `replaylab` logger), with a task bar on a TTY."""
    import dask

    from replaylab.compute.ledger import DEFAULT_BLOCKSIZE, read_ledger_dask
    from replaylab.compute.stages import DaskStages
    from replaylab.tracking.html import write_html_report
    from replaylab.tracking.report import ledger_figures

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    with dask.config.set({"dataframe.convert-string": False}), \
            DaskStages(STAGES, progress) as stage:
        with stage("read"):
            ds = read_ledger_dask(spec, blocksize or DEFAULT_BLOCKSIZE).persist()
            accounting = ds.write_quarantine(str(out_dir / "quarantine"))
        projected = project(ds.valid, projection, split, compute="dask", step=stage)
        features, splits = projected.features, projected.splits
        fingerprint, version = projected.fingerprint, projected.version
        with stage("write"):
            features.to_parquet(str(out_dir / "features"), write_index=False)
        with stage("aggregates"):
            prof = ds.valid.map_partitions(
                profile_parts, meta=pd.DataFrame({"key": pd.Series(dtype=object),
                                                  "value": pd.Series(dtype=object),
                                                  "n": pd.Series(dtype="int64")}))
            prof = prof.groupby(["key", "value"])["n"].sum().compute()
            sess = features.map_partitions(session_parts).compute()
            n_rows = int(sess["rows"].sum())
            frac = min(1.0, SAMPLE_ROWS / max(n_rows, 1))
            sample_f = features.sample(frac=frac, random_state=seed).compute()
            sample_l = ds.valid.sample(frac=frac, random_state=seed).compute()
    timings = {TIMING_KEYS[k]: v for k, v in stage.timings.items()}
    cols = feature_columns(sample_f)
    profile = {
        "requests": int(prof.get(("requests", ""), 0)),
        "sessions": int(sess["sessions"].sum()),
        "turns_per_session": {"mean": n_rows / max(int(sess["sessions"].sum()), 1),
                              "max": int(sess["max_turns"].max())},
        "time_window_ms": [int(sess["t_min"].min()), int(sess["t_max"].max())],
        **{col: {str(v): int(prof[(col, v)]) for (k, v) in prof.index if k == col}
           for col in PROFILE_COUNTS},
        "usage_absent": int(prof.get(("usage_absent", ""), 0)),
    }
    figures = ledger_figures(sample_l, sample_f, out_dir / "figures")
    result = accounting.summary()
    report = write_html_report(
        out_dir / "report.html", title="replaylab: ledger and projection (Dask)",
        facts={"source": spec, **result, "projection_version": version,
               "split_boundaries": splits["boundaries"],
               "figures": f"from a uniform sample of {len(sample_f):,} of {n_rows:,} rows "
                          f"(seed {seed})"},
        figures=figures)
    return {
        "pipeline": "project",
        **{k: v for k, v in result.items() if k != "contract"},
        "injected_defects": {},
        "ledger": profile,
        "ledger_fingerprint": fingerprint,
        "fingerprint_scheme": FINGERPRINT_SCHEME_DASK,
        "projection": {
            "version": version, "rows": n_rows,
            "assume_ended_before_next": projection.assume_ended_before_next,
            "ewma_alpha": projection.ewma_alpha, "split_config": asdict(split),
            "feature_columns": cols,
            "label_columns": [c for c in LABEL_COLUMNS if c in sample_f.columns]},
        "labels": {k: int(sess[k].sum()) for k in ("rows", "usable", "censored",
                                                   "absent_usage")},
        # as the local summary: every split's rows, the sessions of the splits that have any
        "splits": {"rows": splits["rows"],
                   "sessions": {k: v for k, v in splits["sessions"].items() if v}},
        "split_boundaries": splits["boundaries"],
        "artifacts": {"quarantine": str(out_dir / "quarantine"),
                      "features": str(out_dir / "features")},
        "reports": {"html": str(report), **{k: str(v) for k, v in figures.items()}},
        "figure_sample_rows": int(len(sample_f)),
        "partitions": int(ds.npartitions),
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
        "rows_per_second_projection": round(n_rows / max(timings["projection_splits"], 1e-9)),
    }
