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
   below 0: each session gets a Poisson(1) weight per replicate from a hash of
   (session_id, replicate, seed) (`demand.metrics.session_replicates`, the one
   bootstrap of both engines), every row of a session keeps its session's weight,
   both predictors are scored on the same weights.

Coverage carries its own session-bootstrap interval (reported; the rule reads the
measured value). The coverage judged is that of the interval serving will serve
(`coverage["interval"]`): the runtime's online recalibration replayed over the test
window (`replaylab.demand.served`, `demand.served.online`, the default), else the
exported (frozen) band.

Three verdicts (`replaylab.verdict`): GO when both hold; NOT ENOUGH EVIDENCE when the
test set is too small to check the band: the coverage interval is wider than the band
(2 x COVERAGE_BAND) and reaches into it, and the model is not significantly worse than
the best baseline (then neither a GO nor a NO-GO can be told); it states how many
more labelled test rows (and sessions, and days at the test window's traffic) would
narrow the interval to the band's width (the width shrinks as 1/sqrt(n)); NO-GO
otherwise. `go` is true only for GO.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from replaylab.verdict import NO_GO, NOT_ENOUGH_EVIDENCE, decide, is_go, more_data_text

COVERAGE_BAND = 0.03  # the report's coverage target: nominal ± this
GROUP_BAND = 0.08  # the report's per-group target (groups with n >= MIN_GROUP_N), not gated
CI_LEVEL = 0.95
N_BOOT = 1000  # Poisson session-bootstrap replicates of every interval, both engines
RESAMPLED = "sessions (Poisson(1) weights from hash(session_id, b))"


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


def objective_text(level: float, interval: str = "served") -> str:
    """The objective the verdict line names: what is judged, against what."""
    lo, hi = coverage_target(level)
    return (f"{interval} {level:.0%} interval's test coverage within {lo:.2f}–{hi:.2f} and "
            "mean pinball below the best baseline's")


def rule_text(level: float, level_ci: float = CI_LEVEL, interval: str = "served") -> str:
    lo, hi = coverage_target(level)
    what = ("the interval serving will serve (the runtime's online recalibration replayed "
            "over the test window)" if interval == "served" else
            "its exported (frozen) interval, as served with online recalibration off")
    return (f"GO when the model's test coverage of {what} at {level:.0%} is within "
            f"{lo:.2f}–{hi:.2f} (nominal ± {COVERAGE_BAND:g}) and its mean pinball beats the "
            f"best baseline's on the same rows: the upper bound of the paired {level_ci:.0%} "
            f"session-bootstrap interval of (model − best baseline) is below 0; "
            f"{NOT_ENOUGH_EVIDENCE} when the coverage's {level_ci:.0%} interval is wider than "
            f"the band ({2 * COVERAGE_BAND:g}) and reaches into it, unless the model is "
            f"significantly worse than the best baseline; {NO_GO} otherwise")


def band_evidence(coverage: dict[str, Any], level: float) -> dict[str, Any]:
    """Whether the test set can check the band: {"checkable", "ci_width", and, when it
    cannot, "more_rows", "more_sessions", "more_days"} (module docstring)."""
    lo, hi = coverage_target(level)
    ci = [float(x) if x is not None else math.nan for x in (coverage.get("ci") or [math.nan] * 2)]
    width = ci[1] - ci[0]
    out: dict[str, Any] = {"ci_width": width, "band_width": 2 * COVERAGE_BAND}
    if not math.isfinite(width):
        return {**out, "checkable": False, "reaches_band": True, "more_rows": math.nan}
    out["checkable"] = bool(width <= 2 * COVERAGE_BAND + 1e-12)
    out["reaches_band"] = bool(ci[1] >= lo - 1e-12 and ci[0] <= hi + 1e-12)
    if not out["checkable"]:
        grow = (width / (2 * COVERAGE_BAND)) ** 2  # the width shrinks as 1 / sqrt(n)
        n, sessions = int(coverage.get("n") or 0), coverage.get("sessions")
        out["more_rows"] = math.ceil(n * (grow - 1.0))
        if sessions:
            out["more_sessions"] = math.ceil(int(sessions) * (grow - 1.0))
        per_day = coverage.get("rows_per_day")
        if per_day and math.isfinite(float(per_day)) and float(per_day) > 0:
            out["rows_per_day"] = float(per_day)
            out["more_days"] = out["more_rows"] / float(per_day)
    return out


def demand_gate(level: float, coverage: dict[str, Any], vs_best: dict[str, Any]) -> dict:
    """The gate from the figures: coverage {"value", "ci", "n", "sessions", optional
    "interval" ("served" default | "frozen"), "rows_per_day"} and vs_best {"baseline",
    "model_mean_pinball", "baseline_mean_pinball", "delta", "ci"}.

    Returns {"go", "verdict", "objective", "rule", "reasons", "coverage",
    "vs_best_baseline", "level", "evidence"}.
    """
    lo, hi = coverage_target(level)
    cov = float(coverage.get("value", math.nan))
    cov_ok = within_target(cov, level)
    reasons = []
    cci = coverage.get("ci") or [math.nan, math.nan]
    what = "served interval" if (coverage.get("interval") or "served") == "served" \
        else "frozen interval"
    reasons.append(
        f"{what} coverage {cov:.3f} (95% CI [{cci[0]:.3f}, {cci[1]:.3f}], "
        f"n={coverage.get('n')}) {'within' if cov_ok else 'outside'} the target {lo:.2f}–{hi:.2f}"
        + (f"; frozen {float(coverage['frozen']):.3f}"
           if coverage.get("frozen") is not None and what == "served interval" else ""))
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
    interval = str(coverage.get("interval") or "served")
    evidence = band_evidence(coverage, level)
    worse = bool(base is not None and math.isfinite(ci[0]) and ci[0] > 0)
    enough = evidence["checkable"] or not evidence["reaches_band"] or worse
    verdict = decide(bool(cov_ok) and beat and evidence["checkable"], enough)
    if not evidence["checkable"]:
        more = more_data_text(evidence.get("more_rows", math.nan), "labelled test rows",
                              evidence.get("rows_per_day"))
        sess = (f", ~{evidence['more_sessions']} more sessions"
                if evidence.get("more_sessions") is not None else "")
        reasons.append(
            f"too few test rows to check the band: the coverage interval is "
            f"{evidence['ci_width']:.3f} wide, the band {2 * COVERAGE_BAND:.2f}"
            + (f"; {more}{sess} would narrow it to the band's width" if enough is False
               else ""))
    go = is_go(verdict)
    return {"go": go, "verdict": verdict, "objective": objective_text(level, interval),
            "rule": rule_text(level, interval=interval), "reasons": reasons,
            "evidence": evidence, "level": float(level),
            "coverage": {**coverage, "value": cov, "target": [lo, hi], "ok": bool(cov_ok)},
            "vs_best_baseline": {**vs_best, "delta": d, "ci": ci, "ok": beat}}


def gate_from_rows(level: float, y: np.ndarray, model_q: np.ndarray, model_lo: np.ndarray,
                   model_hi: np.ndarray, baseline_q: dict[str, np.ndarray],
                   quantiles: Sequence[float], session: np.ndarray | None,
                   n_boot: int = N_BOOT, seed: int = 0, interval: str = "served",
                   frozen_coverage: float | None = None,
                   rows_per_day: float | None = None) -> dict:
    """`demand_gate` computed from labelled test rows (y, the model's quantiles and
    the interval judged: the served one by default, each baseline's quantiles, the
    session of each row). interval: "served" | "frozen" (what model_lo / model_hi
    are); frozen_coverage: the exported band's, reported beside a served one;
    rows_per_day: labelled test rows per day of the test window (the days of data a
    NOT ENOUGH EVIDENCE needs)."""
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
                "n": int(y.size), "sessions": int(n_sessions), "interval": interval,
                "frozen": frozen_coverage, "rows_per_day": rows_per_day}
    vs_best: dict[str, Any] = {"baseline": best}
    if best is not None:
        vs_best.update(model_mean_pinball=float(model_rows.mean()),
                       baseline_mean_pinball=float(base_rows[best].mean()),
                       delta=float(values["delta"].mean()), ci=ci["delta"],
                       resampled=RESAMPLED if session is not None else "rows",
                       n_boot=int(n_boot))
    return demand_gate(level, coverage, vs_best)


def verdict_text(gate: dict | None) -> str:
    """'GO' / 'NO-GO' with the gate's reasons, one line (report, registry tag, console)."""
    if not gate:
        return "no gate recorded"
    word = gate.get("verdict") or decide(bool(gate.get("go")))
    return f"{word}: " + "; ".join(map(str, gate.get("reasons") or []))
