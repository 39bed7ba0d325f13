"""The forecast's go/no-go: does the best forecaster beat seasonal naive, and is it calibrated?

The rule (`summary["gate"]`, the console's last line, the MLflow `go` / `verdict` tags):

- NOT ENOUGH EVIDENCE (go = None) when the backtest has fewer than `gate.min_origins`
  independent origins: origins whose test windows overlap (step < horizon) count as one
  block of ceil(horizon / step); too few to tell a forecaster from the control;
- else the challenger is the forecaster with the lowest backtest MASE other than
  seasonal naive (the control and the MASE scale). Per origin, its MASE minus seasonal
  naive's (each the mean over series of that origin's MASE) is a paired difference; its
  mean gets a percentile interval from a bootstrap over origins (origins whose test
  windows overlap, step < horizon, are resampled together, as one block);
- GO when that interval lies wholly below 0 (it beats seasonal naive) AND the
  challenger's 80% interval covers a share of actuals inside COVERAGE_TARGET; NO-GO
  otherwise, with the reason.

Read off the backtest, never recomputed by the entry point (apps.verdicts prints it).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from replaylab.forecast.config import CONTROLS, COVERAGE_TARGET, GateConfig
from replaylab.forecast.panel import BacktestPlan
from replaylab.stats import paired_bootstrap_diff

CONTROL = "seasonal_naive"
NOT_ENOUGH = "NOT ENOUGH EVIDENCE"


def gate_rule(cfg: GateConfig) -> str:
    lo, hi = COVERAGE_TARGET
    return (f"GO when the forecaster with the lowest MASE other than seasonal naive beats "
            f"seasonal naive's MASE with the {cfg.level:.0%} paired interval over backtest "
            f"origins wholly below 0, and its 80% coverage is within {lo:g}-{hi:g}; "
            f"{NOT_ENOUGH} under {cfg.min_origins} independent origins")


def _f(x: float, fmt: str = ".3f") -> str:
    return "n/a" if x is None or not math.isfinite(x) else format(x, fmt)


def forecast_gate(scores: dict[str, dict], by_origin: pd.DataFrame, plan: BacktestPlan,
                  cfg: GateConfig, seed: int) -> dict[str, Any]:
    """The verdict of one backtest.

    scores: `backtest.score_backtest`'s {forecaster: {"mase", "coverage_80", ...}};
    by_origin: `backtest.origin_mase` (one row per origin, a MASE column per forecaster).
    Returns {"go": True | False | None, "decision": "GO" | "NO-GO" | NOT_ENOUGH,
    "reasons": [...], "rule", "challenger", "origins", "blocks", "mase_diff", "coverage_80"}.
    """
    lo_t, hi_t = COVERAGE_TARGET
    n = int(len(by_origin))
    block = max(1, math.ceil(plan.horizon / plan.step))
    blocks = math.ceil(n / block)
    out: dict[str, Any] = {"rule": gate_rule(cfg), "origins": n, "block_origins": block,
                           "blocks": blocks, "coverage_target": [lo_t, hi_t],
                           "challenger": None, "mase_diff": None, "coverage_80": None}
    if blocks < cfg.min_origins:
        overlap = (f" in {blocks} independent blocks (windows overlap: step {plan.step} < "
                   f"horizon {plan.horizon})" if block > 1 else "")
        return {**out, "go": None, "decision": NOT_ENOUGH, "reasons": [
            f"{n} backtest origins{overlap} < gate.min_origins={cfg.min_origins}: too few to "
            "tell a forecaster from seasonal naive (a longer history, more "
            "forecast.backtest.n_windows, or windows that do not overlap)"]}
    others = {k: v["mase"] for k, v in scores.items()
              if k != CONTROL and v.get("mase") is not None and k in by_origin}
    if not others:
        return {**out, "go": False, "decision": "NO-GO",
                "reasons": ["no forecaster other than seasonal naive ran (summary.skipped)"]}
    name = min(others, key=lambda k: (others[k], k))
    pair = by_origin[[name, CONTROL]].dropna()
    diff = paired_bootstrap_diff(pair[name].to_numpy(), pair[CONTROL].to_numpy(), cfg.n_boot,
                                 seed, session=(pair.index.to_numpy() // block), level=cfg.level)
    lo, hi = diff["ci"]
    beats = math.isfinite(hi) and hi < 0
    cov = scores[name].get("coverage_80")
    covered = cov is not None and lo_t <= cov <= hi_t
    level = f"{cfg.level:.0%}"
    reasons = [
        f"{name} vs seasonal naive: MASE {_f(scores[name]['mase'])} vs "
        f"{_f(scores[CONTROL]['mase'])} over {len(pair)} origins, {name} - seasonal naive "
        f"{_f(diff['mean'], '+.3f')} ({level} CI [{_f(lo, '+.3f')}, {_f(hi, '+.3f')}]): "
        + ("beats it" if beats else "does not beat it (upper bound >= 0)"),
        f"80% coverage of {name} {_f(cov)} "
        + (f"within the target {lo_t:g}-{hi_t:g}" if covered
           else f"outside the target {lo_t:g}-{hi_t:g}")]
    note = _models_vs_controls(scores)
    if note:
        reasons.append(note)
    go = bool(beats and covered)
    return {**out, "go": go, "decision": "GO" if go else "NO-GO", "reasons": reasons,
            "challenger": name, "coverage_80": cov,
            "mase_diff": {"mean": diff["mean"], "ci": [lo, hi], "level": cfg.level,
                          "origins": int(len(pair)), "n_boot": cfg.n_boot}}


def _models_vs_controls(scores: dict[str, dict]) -> str | None:
    """Said beside the verdict, not part of it: the best model against the better control
    (a GO won by a control means the models add nothing here)."""
    def best(names: list[str]) -> str | None:
        named = [n for n in names if scores[n].get("mase") is not None]
        return min(named, key=lambda n: (scores[n]["mase"], n)) if named else None

    model = best([n for n in scores if n not in CONTROLS])
    control = best([n for n in scores if n in CONTROLS])
    if model is None or control is None:
        return None
    m, c = scores[model]["mase"], scores[control]["mase"]
    change = f" ({100 * (m / c - 1):+.1f}%)" if c else ""
    return (f"not gated: best model {model} MASE {_f(m)} vs best control {control} "
            f"{_f(c)}{change}")
