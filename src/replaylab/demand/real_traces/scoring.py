"""Scoring one demand run on a real trace: paired bootstrap and verdict against issue 3.

Inputs are what `python -m training pipeline=demand` writes: `summary.json` (a
mapping) and `predictions_test.parquet` (a frame with `y`, `session_id`,
`label_class` and `<predictor>-q<level>` / `model-lo-<pct>` / `model-hi-<pct>`
columns). The bootstrap resamples whole test sessions (`replaylab.stats`
`ClusterBootstrap`; single requests where a trace has no sessions) and ignores
dependence in time, so its intervals are, if anything, too narrow.

Targets (issue 3): test coverage of the 80% interval within COVERAGE_BAND overall
and within GROUP_BAND for every group with at least GROUP_MIN_N test rows; mean
pinball and pinball at the top quantile below every baseline's where the dataset
has features beyond prompt length (`TraceDataset.pinball_target`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from replaylab.stats import ClusterBootstrap

GROUP_MIN_N = 200  # groups with fewer test rows are reported but not held to the band
COVERAGE_BAND = (0.77, 0.83)  # issue 3: overall coverage of the 80% interval
GROUP_BAND = (0.72, 0.88)  # issue 3: every group with >= GROUP_MIN_N test rows
BOOTSTRAP = 2000  # session resamples
BASELINES = ("prompt_length", "max_tokens_cap", "category_bucket", "session_ewma")


def row_pinball(y: np.ndarray, q: np.ndarray, levels: list[float]) -> np.ndarray:
    """(n, len(levels)) pinball loss of each row; its column means are sklearn's figures.

    y: (n,) observed; q: (n, len(levels)) predicted quantiles at `levels`.
    """
    diff = y[:, None] - q
    a = np.asarray(levels)[None, :]
    return np.maximum(a * diff, (a - 1.0) * diff)


def paired_session_bootstrap(pred: pd.DataFrame, levels: list[float], level_label: str,
                             n_boot: int = BOOTSTRAP, seed: int = 0) -> dict:
    """Session-clustered bootstrap of model - baseline pinball and of model coverage.

    pred: the run's test predictions (every row; the labelled ones are used).
    level_label: the interval's percent as in the column names ("80").
    Returns {"rows", "sessions", "resamples", "coverage_ci", "delta": {baseline:
    {"mean_pinball", "mean_pinball_ci", "pinball_top", "pinball_top_ci"}},
    "model_check_mean_pinball"}; every CI is the 2.5% and 97.5% quantiles of the
    replicates.
    """
    pred = pred[pred["label_class"] == "label"]
    y = pred["y"].to_numpy(dtype=float)
    boot = ClusterBootstrap(pred["session_id"], n_boot, seed)

    def ci(per_row: np.ndarray) -> list[float]:
        return list(boot.interval(per_row, 0.025, 0.975))

    def losses(name: str) -> np.ndarray:
        q = pred[[f"{name}-q{lv:g}" for lv in levels]].to_numpy(dtype=float)
        return row_pinball(y, q, levels)

    m = losses("model")

    def covered(name: str) -> np.ndarray:
        return ((y >= pred[f"{name}-lo-{level_label}"])
                & (y <= pred[f"{name}-hi-{level_label}"])).to_numpy(dtype=float)

    out: dict = {"rows": int(len(y)), "sessions": int(boot.n_clusters), "resamples": n_boot,
                 "coverage_ci": ci(covered("model")), "delta": {}}
    if f"served-lo-{level_label}" in pred.columns:  # the interval serving serves (gated)
        out["served_coverage_ci"] = ci(covered("served"))
    for b in BASELINES:
        d = m - losses(b)
        out["delta"][b] = {
            "mean_pinball": float(d.mean()), "mean_pinball_ci": ci(d.mean(axis=1)),
            "pinball_top": float(d[:, -1].mean()), "pinball_top_ci": ci(d[:, -1])}
    out["model_check_mean_pinball"] = float(m.mean())  # equals summary's figure
    return out


def _in(x: float | None, band: tuple[float, float]) -> bool:
    return x is not None and band[0] <= x <= band[1]


def assess_run(name: str, s: dict, boot: dict | None, pinball_target: bool) -> dict:
    """The figures the results document shows and the verdict against issue 3's targets.

    s: the run's summary.json; boot: `paired_session_bootstrap` of its predictions;
    pinball_target: whether the pinball target applies (sessions or categories).
    """
    test = s["test"]
    model, base = test["model"], test["baselines"]
    top = f"{s['quantiles'][-1]:g}"
    best = min(base, key=lambda b: base[b]["mean_pinball"])
    best_top = min(base, key=lambda b: base[b]["pinball"][top])
    big = [g for g in test["groups"] if g["n"] >= GROUP_MIN_N]
    cov = [g["coverage"] for g in big]
    beats_mean = all(model["mean_pinball"] < b["mean_pinball"] for b in base.values())
    beats_top = all(model["pinball"][top] < b["pinball"][top] for b in base.values())
    served = test.get("served") or {}
    # the coverage held to the band: the interval serving serves where the run replayed it
    cov_judged = served.get("coverage", model["coverage"])
    verdict = {
        "coverage_in_band": _in(cov_judged, COVERAGE_BAND),
        "frozen_coverage_in_band": _in(model["coverage"], COVERAGE_BAND),
        "groups_in_band": all(_in(c, GROUP_BAND) for c in cov) if cov else None,
        "beats_every_baseline_mean_pinball": beats_mean,
        f"beats_every_baseline_pinball_{top}": beats_top,
        "pinball_target_applies": pinball_target,
    }
    fails = []
    if not verdict["coverage_in_band"]:
        fails.append(f"coverage {cov_judged:.3f} outside {COVERAGE_BAND[0]}..{COVERAGE_BAND[1]}")
    if verdict["groups_in_band"] is False:
        fails.append("a group outside 0.72..0.88")
    if pinball_target and not (beats_mean and beats_top):
        fails.append("does not beat every baseline")
    verdict["meets_targets"] = not fails
    verdict["fails"] = fails
    return {
        "dataset": name, "rows": s["rows_valid"], "rows_quarantined": s["rows_quarantined"],
        "labels": s["labels"], "splits": s["splits"], "quantiles": s["quantiles"],
        "interval": s["interval"], "top": top,
        "features": s["projection"]["feature_columns"],
        "fingerprint": s["ledger_fingerprint"], "projection_version": s["projection"]["version"],
        "split_config": s["projection"]["split_config"],
        "gate": s.get("gate"),
        "test": {"rows": test["rows"], "labelled_rows": test["labelled_rows"],
                 "model": model, "baselines": base, "groups": test["groups"], "served": served,
                 "censored": test["censored"], "reliability": test["reliability"]},
        "model_facts": s["model"], "calibration": {k: v for k, v in s["calibration"].items()
                                                   if k != "pinball"},
        "best_baseline": best, "best_baseline_top": best_top,
        "group_coverage_range": [min(cov), max(cov)] if cov else None,
        "groups_n200": len(big),
        "verdict": verdict, "bootstrap": boot, "wall_s": s.get("_wall_s"),
    }


def results_table(results: list[dict]) -> pd.DataFrame:
    """One row per scored dataset (errors left out): the headline figures of results.csv."""
    flat = [{"dataset": r["dataset"], "test_labelled": r["test"]["labelled_rows"],
             "model_mean_pinball": r["test"]["model"]["mean_pinball"],
             "best_baseline": r["best_baseline"],
             "best_baseline_mean_pinball":
                 r["test"]["baselines"][r["best_baseline"]]["mean_pinball"],
             "coverage": r["test"]["model"]["coverage"],
             "served_coverage": (r["test"].get("served") or {}).get("coverage"),
             "gate": (r.get("gate") or {}).get("verdict"),
             "meets_targets": r["verdict"]["meets_targets"]}
            for r in results if "error" not in r]
    return pd.DataFrame(flat)
