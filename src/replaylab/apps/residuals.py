"""`python -m evaluation residuals`: read (or replay) the ledger, aggregate, draw."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from replaylab.config import ConfigError


def residuals(cfg: DictConfig, run_dir: Path) -> dict:
    from replaylab.contracts import read_ledger, write_quarantine
    from replaylab.hints.residuals import ResidualDataError, residual_figures, residual_summary

    exp = cfg.experiment
    if not cfg.data.get("ledger"):
        raise ConfigError("experiment=residuals needs data.ledger=PATH (a ledger-v1 file)")
    path = Path(cfg.data.ledger)
    if not path.is_file():
        raise FileNotFoundError(f"data.ledger={path}: no such file")
    result = read_ledger(path)
    run_dir.mkdir(parents=True, exist_ok=True)
    arts = {}
    if result.rows_quarantined:
        arts["quarantine"] = str(write_quarantine(result, run_dir / "quarantine" / "ledger.jsonl"))
    ledger = result.valid
    replayed = None
    if exp.get("artifact"):
        from replaylab.hints.replay import replay_hints
        from replaylab.runtime.demand import DemandPredictor

        predictor = DemandPredictor.load(exp.artifact)
        ledger = replay_hints(ledger, predictor)
        replayed = {"artifact": str(exp.artifact), "loaded": predictor.loaded,
                    "reason": predictor.reason, "version": predictor.version}
        arts["replayed_ledger"] = str(run_dir / "replayed_ledger.parquet")
        ledger.to_parquet(arts["replayed_ledger"], index=False)
    groups = list(exp.group_columns)
    try:
        summary = residual_summary(ledger, groups, exp.get("time_bucket_s"),
                                   int(exp.min_group_rows))
    except ResidualDataError as e:  # the message names the columns; this names the file
        raise ResidualDataError(f"{path}: {e}") from e
    figures = residual_figures(summary, ledger, run_dir / "figures", groups)
    import pandas as pd

    table = run_dir / "residuals_by_group.csv"
    pd.DataFrame(summary["groups"]).to_csv(table, index=False)
    arts["by_group"] = str(table)
    return {"pipeline": "residuals", "ledger": str(path), "rows_read": result.rows_read,
            "rows_quarantined": result.rows_quarantined, "replayed": replayed, **summary,
            "artifacts": arts, "reports": {k: str(v) for k, v in figures.items()}}
