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
    replayed, online = None, None
    if exp.get("artifact"):
        ledger, replayed, online = _replay(ledger, exp, run_dir)
        arts["replayed_ledger"] = str(run_dir / "replayed_ledger.parquet")
        ledger.to_parquet(arts["replayed_ledger"], index=False)
    groups = list(exp.group_columns)
    try:
        summary = residual_summary(ledger, groups, exp.get("time_bucket_s"),
                                   int(exp.min_group_rows))
    except ResidualDataError as e:  # the message names the columns; this names the file
        raise ResidualDataError(f"{path}: {e}") from e
    figures = residual_figures(summary, ledger, run_dir / "figures", groups)
    if online is not None:
        figures["online"] = online.pop("figure")
    import pandas as pd

    table = run_dir / "residuals_by_group.csv"
    pd.DataFrame(summary["groups"]).to_csv(table, index=False)
    arts["by_group"] = str(table)
    return {"pipeline": "residuals", "ledger": str(path), "rows_read": result.rows_read,
            "rows_quarantined": result.rows_quarantined, "replayed": replayed, **summary,
            "online": online,
            "artifacts": arts, "reports": {k: str(v) for k, v in figures.items()}}


def _replay(ledger, exp: DictConfig, run_dir: Path) -> tuple:
    """(the replayed ledger, what was replayed, the `online` section or None).

    With online recalibration on, the ledger is replayed frozen and adaptive
    (`compare_online`) and the adaptive replay is the one analysed.
    """
    from omegaconf import OmegaConf

    from replaylab.hints.online_eval import compare_online, deployment_start_ms, online_figure
    from replaylab.hints.replay import replay_hints
    from replaylab.runtime.demand import DemandPredictor
    from replaylab.runtime.online import OnlineConfig

    try:
        cfg = OnlineConfig.from_mapping(OmegaConf.to_container(exp.get("online") or {}))
    except ValueError as e:
        raise ConfigError(f"experiment.online: {e}") from e
    predictor = DemandPredictor.load(exp.artifact, online=cfg)
    replayed = {"artifact": str(exp.artifact), "loaded": predictor.loaded,
                "reason": predictor.reason, "version": predictor.version}
    if not (predictor.loaded and cfg.enabled):
        return replay_hints(ledger, predictor, online=False), replayed, None
    where = exp.get("online_from", "test")
    if where == "test":
        start = deployment_start_ms(predictor.manifest)
    elif where == "start":
        start = int(ledger["timestamp"].min())
    elif isinstance(where, int) and not isinstance(where, bool):
        start = where
    else:
        raise ConfigError(f"experiment.online_from={where!r}: test, start or epoch ms")
    band = list(exp.get("coverage_band") or [0.77, 0.83])
    try:
        cmp = compare_online(ledger, predictor, online_from_ms=start,
                             window=int(exp.get("coverage_window", 500)),
                             band=(float(band[0]), float(band[1])))
    except ValueError as e:
        raise ConfigError(f"experiment=residuals online comparison: {e}") from e
    figure = online_figure(cmp, run_dir / "figures" / "online_coverage.png")
    return cmp.adaptive, replayed, {**cmp.summary, "figure": figure}
