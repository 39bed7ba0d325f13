"""The demand go/no-go: one rule, computed once, from the figures the report shows.

`demand_gate` is called by the pipeline on its test rows and stored as
`summary["gate"]`; the report renders that dict (rule and verdict), the export
copies it into the manifest (`training.gate`) and the registry reads it from
there (tags `replaylab.go` / `go_reasons`). Nothing recomputes the verdict with
another definition, so the report and the gate cannot disagree.

The rule:

1. coverage: the model's test coverage of its calibrated interval lies within
   the target band, nominal level ± `COVERAGE_BAND` (the report's target:
   0.77–0.83 for the 80% interval), ends included;
2. baseline: the model's mean pinball is below the best baseline's (the baseline
   with the lowest mean pinball on the same rows), and the upper bound of the
   paired session-bootstrap interval (`CI_LEVEL`) of (model − best baseline) is
   below 0: sessions are drawn with replacement, every row of a session keeps its
   session's draw count, both predictors are scored on the same draws.

Coverage carries its own session-bootstrap interval (reported; the rule reads the
measured value).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

COVERAGE_BAND = 0.03  # the report's coverage target: nominal ± this
GROUP_BAND = 0.08  # the report's per-group target (groups with n >= MIN_GROUP_N), not gated
CI_LEVEL = 0.95
N_BOOT = 1000


def coverage_target(level: float) -> tuple[float, float]:
    """The coverage target band of an interval at nominal `level`: level ± COVERAGE_BAND."""
    return float(level) - COVERAGE_BAND, float(level) + COVERAGE_BAND


def within_target(coverage: float, level: float) -> bool | None:
    """Whether a measured coverage meets the target (None when it is not a number)."""
    c = float(coverage) if coverage is not None else math.nan
    if not math.isfinite(c):
        return None
    lo, hi = coverage_target(level)
    return bool(lo - 1e-12 <= c <= hi + 1e-12)


def rule_text(level: float, level_ci: float = CI_LEVEL) -> str:
    lo, hi = coverage_target(level)
    return (f"GO when the model's test coverage of its {level:.0%} interval is within "
            f"{lo:.2f}–{hi:.2f} (nominal ± {COVERAGE_BAND:g}) and its mean pinball beats the "
            f"best baseline's on the same rows: the upper bound of the paired {level_ci:.0%} "
            f"session-bootstrap interval of (model − best baseline) is below 0")


def demand_gate(level: float, coverage: dict[str, Any], vs_best: dict[str, Any]) -> dict:
    """The gate from the figures: coverage {"value", "ci", "n", "sessions"} and vs_best
    {"baseline", "model_mean_pinball", "baseline_mean_pinball", "delta", "ci"}.

    Returns {"go", "rule", "reasons", "coverage", "vs_best_baseline", "level"}.
    """
    lo, hi = coverage_target(level)
    cov = float(coverage.get("value", math.nan))
    cov_ok = within_target(cov, level)
    reasons = []
    cci = coverage.get("ci") or [math.nan, math.nan]
    reasons.append(
        f"coverage {cov:.3f} (95% CI [{cci[0]:.3f}, {cci[1]:.3f}], n={coverage.get('n')}) "
        f"{'within' if cov_ok else 'outside'} the target {lo:.2f}–{hi:.2f}")
    base = vs_best.get("baseline")
    d, ci = float(vs_best.get("delta", math.nan)), list(vs_best.get("ci") or [math.nan] * 2)
    beat = bool(base is not None and math.isfinite(ci[1]) and ci[1] < 0)
    if base is None:
        reasons.append("no baseline scored: the model cannot be shown to beat one")
    else:
        reasons.append(
            f"mean pinball vs best baseline {base}: {vs_best.get('model_mean_pinball', math.nan):.4g}"
            f" vs {vs_best.get('baseline_mean_pinball', math.nan):.4g}, model − baseline "
            f"{d:+.4g} (95% CI [{ci[0]:+.4g}, {ci[1]:+.4g}]): "
            + ("beats it (upper bound < 0)" if beat else
               "does not beat it (upper bound >= 0)"))
    go = bool(cov_ok) and beat
    return {"go": go, "rule": rule_text(level), "reasons": reasons,
            "level": float(level),
            "coverage": {**coverage, "value": cov, "target": [lo, hi], "ok": bool(cov_ok)},
            "vs_best_baseline": {**vs_best, "delta": d, "ci": ci, "ok": beat}}


def gate_from_rows(level: float, y: np.ndarray, model_q: np.ndarray, model_lo: np.ndarray,
                   model_hi: np.ndarray, baseline_q: dict[str, np.ndarray],
                   quantiles: Sequence[float], session: np.ndarray | None,
                   n_boot: int = N_BOOT, seed: int = 0) -> dict:
    """`demand_gate` computed from labelled test rows (y, the model's quantiles and
    calibrated interval, each baseline's quantiles, the session of each row)."""
    from replaylab.demand.metrics import bootstrap_means, row_pinball

    y = np.asarray(y, dtype="float64")
    model_rows = row_pinball(y, model_q, quantiles).mean(axis=1)
    base_rows = {b: row_pinball(y, q, quantiles).mean(axis=1) for b, q in baseline_q.items()}
    covered = ((y >= model_lo) & (y <= model_hi)).astype("float64")
    best = min(base_rows, key=lambda b: float(base_rows[b].mean())) if base_rows else None
    values = {"coverage": covered}
    if best is not None:
        values["delta"] = model_rows - base_rows[best]
    ci = bootstrap_means(values, session, n_boot, seed, CI_LEVEL)
    n_sessions = len(set(np.asarray(session).tolist())) if session is not None else int(y.size)
    coverage = {"value": float(covered.mean()) if y.size else math.nan, "ci": ci["coverage"],
                "n": int(y.size), "sessions": int(n_sessions)}
    vs_best: dict[str, Any] = {"baseline": best}
    if best is not None:
        vs_best.update(model_mean_pinball=float(model_rows.mean()),
                       baseline_mean_pinball=float(base_rows[best].mean()),
                       delta=float(values["delta"].mean()), ci=ci["delta"],
                       resampled="sessions" if session is not None else "rows",
                       n_boot=int(n_boot))
    return demand_gate(level, coverage, vs_best)


def verdict_text(gate: dict | None) -> str:
    """'GO' / 'NO-GO' with the gate's reasons, one line (report, registry tag, console)."""
    if not gate:
        return "no gate recorded"
    return f"{'GO' if gate.get('go') else 'NO-GO'}: " + "; ".join(map(str, gate.get("reasons") or []))
