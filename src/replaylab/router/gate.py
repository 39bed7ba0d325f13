"""The router's gate, both modes: the objective's criteria on intervals, three verdicts.

A criterion is one number of the served point with its interval and the line it must
clear (`Criterion`): e.g. "quality vs rules" must have its lower bound >= -margin, "cost
vs logging" its upper bound < 0. `router.objective.ObjectiveConfig` says which criteria a
run has. This is the one gate module of both modes: the outcomes mode's criteria on a
full-information test table (`objective_criteria`, `outcomes_gate`; `pipelines/router.py`)
and the receipts mode's on OPE of the latest sessions (`receipts_criteria`, `ope_gate`;
`pipelines/router_receipts.py`) are built here and read by `judge`:

    GO                   every criterion clears its line (and no hard failure, e.g.
                         exploration above its cap);
    NO-GO                a hard failure, or a criterion's whole interval is on the wrong
                         side of its line, or an interval straddles its line with its
                         estimate on the wrong side while the overlap diagnostics pass
                         (the evidence is good and points to failure);
    NOT ENOUGH EVIDENCE  every failing criterion's interval straddles its line, and either
                         the overlap diagnostics fail (ESS, departure support, weight
                         concentration: `router.ope_sums.overlap_diagnostics`) or each
                         estimate is on the passing side. It states how much more data
                         would decide it: test sessions at which every straddling interval
                         would exclude its line if the estimate held and the half-width
                         shrank as 1/sqrt(n), and at which the diagnostics would pass (ESS
                         and departure support grow with n), and the days at
                         `go.sessions_per_day`.

Intervals: `gate_interval` is the one place the gate's confidence is set: replicates of the
criterion (a session bootstrap) -> [lo, hi] at `GateBoundary.level` (two-sided percentile).
A sequential boundary (valid under repeated looks) plugs in there as another `method`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from replaylab.router.objective import ObjectiveConfig
from replaylab.stats import percentile_interval, session_bootstrap
from replaylab.verdict import GO, NO_GO, NOT_ENOUGH_EVIDENCE, more_data_text

BOUNDARY_METHODS = ("percentile",)


@dataclass(frozen=True)
class GateBoundary:
    """How wide the gate's intervals are: level (two-sided), method (BOUNDARY_METHODS;
    `percentile`: the session-bootstrap percentile interval, valid at one look)."""

    level: float = 0.95
    method: str = "percentile"

    def __post_init__(self) -> None:
        if not 0.5 <= float(self.level) < 1.0:
            raise ValueError(f"GateBoundary.level={self.level}: must be in [0.5, 1)")
        if self.method not in BOUNDARY_METHODS:
            raise ValueError(f"GateBoundary.method={self.method!r}: one of {BOUNDARY_METHODS}")


def gate_interval(reps: np.ndarray, estimate: float,
                  boundary: GateBoundary | None = None) -> list[float]:
    """[lo, hi] of a criterion from its replicates (n_boot,) at the boundary's level,
    widened to the estimate where a degenerate bootstrap leaves it outside."""
    b = boundary or GateBoundary()
    reps = np.asarray(reps, float)
    reps = reps[np.isfinite(reps)]
    if not len(reps):
        return [float("nan"), float("nan")]
    lo, hi = percentile_interval(reps, b.level)
    return [float(min(lo, estimate)), float(max(hi, estimate))]


def one_sided_lower(reps: np.ndarray, level: float) -> float:
    """The high-confidence lower bound of a gain: its replicates' (1 - level) quantile
    (one-sided at `level`; SCOPE-RL's and HCOPE's reading of a bootstrap)."""
    reps = np.asarray(reps, float)
    reps = reps[np.isfinite(reps)]
    return float(np.quantile(reps, 1.0 - level)) if len(reps) else float("nan")


def paired_replicates(d: np.ndarray, n_boot: int, seed: int,
                      session: np.ndarray | None = None) -> np.ndarray:
    """(n_boot,) session-bootstrap replicates of mean(d) (`stats.paired_bootstrap_diff`'s)."""
    d = np.asarray(d, float)
    groups = np.arange(len(d)) if session is None else session
    reps = [(w @ d) / w.sum(axis=1) for w in session_bootstrap(groups, n_boot, seed)]
    return np.concatenate(reps) if reps else np.zeros(0)


@dataclass
class Criterion:
    """One number the objective needs, its interval, and the line it must clear.

    side "lower": passes iff ci[0] >= line (> line when strict); "upper": iff ci[1] <= line
    (< line when strict)."""

    name: str
    estimate: float
    ci: list[float]
    line: float
    side: str
    strict: bool = False
    unit: str = ""
    fmt: str = "+.4f"

    def passed(self) -> bool:
        lo, hi = self.ci
        if self.side == "lower":
            return lo > self.line if self.strict else lo >= self.line
        return hi < self.line if self.strict else hi <= self.line

    def decided_fail(self) -> bool:
        """The whole interval is on the failing side of the line."""
        lo, hi = self.ci
        return hi < self.line if self.side == "lower" else lo > self.line

    def estimate_passes(self) -> bool:
        e = self.estimate
        if self.side == "lower":
            return e > self.line if self.strict else e >= self.line
        return e < self.line if self.strict else e <= self.line

    def sessions_factor(self) -> float:
        """n_needed / n at which the interval would exclude the line on the estimate's side
        (half-width ~ 1/sqrt(n)); inf when the estimate sits on the line."""
        half = (self.ci[1] - self.ci[0]) / 2.0
        room = abs(self.estimate - self.line)
        if not math.isfinite(half) or room <= 0:
            return math.inf
        return max((half / room) ** 2, 1.0)

    def text(self) -> str:
        bound, op = (("CI lower", ">" if self.strict else ">=") if self.side == "lower"
                     else ("CI upper", "<" if self.strict else "<="))
        at = self.ci[0] if self.side == "lower" else self.ci[1]
        ok = "passes" if self.passed() else "fails"
        return (f"{self.name} {format(self.estimate, self.fmt)}{self.unit}, {bound} "
                f"{format(at, self.fmt)} (must be {op} {format(self.line, self.fmt)}: {ok})")

    def to_dict(self) -> dict:
        return {"name": self.name, "estimate": float(self.estimate),
                "ci": [float(x) for x in self.ci], "line": float(self.line), "side": self.side,
                "strict": bool(self.strict), "passed": bool(self.passed())}


@dataclass
class Evidence:
    """What the verdict is read on: the criteria, hard failures (a guard, e.g. exploration
    over its cap), overlap diagnostics that failed (with the factor n_needed / n at which
    each would pass), the test sessions judged, and the traffic to turn sessions into days."""

    criteria: list[Criterion]
    n_sessions: int
    sessions_per_day: float
    hard_failures: list[str] = field(default_factory=list)
    diagnostics: list[str] = field(default_factory=list)
    diagnostic_factors: list[float] = field(default_factory=list)
    explored_rate: float | None = None  # share of sessions explored (receipts mode)
    test_share: float = 1.0  # share of new sessions that land in the judged (test) split


def judge(ev: Evidence, objective_label: str) -> dict:
    """The verdict (module docstring): {"verdict", "go", "reasons", "criteria", "more_data"}.
    The reason names the objective, then every criterion, then the verdict and what decided
    it."""
    failing = [c for c in ev.criteria if not c.passed()]
    crit_text = "; ".join(c.text() for c in ev.criteria)
    more = None
    if not failing and not ev.hard_failures:
        verdict, why = GO, "every criterion clears its line"
    elif ev.hard_failures:
        verdict, why = NO_GO, "; ".join(ev.hard_failures)
    elif any(c.decided_fail() for c in failing):
        verdict = NO_GO
        why = "the interval of " + ", ".join(c.name for c in failing if c.decided_fail()) + \
              " is wholly on the failing side"
    elif ev.diagnostics or all(c.estimate_passes() for c in failing):
        verdict = NOT_ENOUGH_EVIDENCE
        factor = max([c.sessions_factor() for c in failing] + list(ev.diagnostic_factors))
        more = more_data(factor, ev)
        why = ("the interval of " + ", ".join(c.name for c in failing) + " still straddles "
               "its line" + (f" and the overlap diagnostics fail ({'; '.join(ev.diagnostics)})"
                             if ev.diagnostics else " with the estimate on the passing side")
               + f"; {more['text']} would decide it if the estimates held")
    else:
        verdict = NO_GO
        why = ("the estimate of " + ", ".join(c.name for c in failing if not c.estimate_passes())
               + " is on the failing side with the overlap diagnostics passing: more data "
               "would not decide for GO at these estimates")
    reasons = [f"{objective_label}; {crit_text}; {verdict}: {why}"]
    return {"verdict": verdict, "go": verdict == GO, "reasons": reasons,
            "criteria": [c.to_dict() for c in ev.criteria], "more_data": more,
            "hard_failures": list(ev.hard_failures), "diagnostics_failed": list(ev.diagnostics)}


def more_data(factor: float, ev: Evidence) -> dict:
    """How much more data would decide: test sessions, the traffic that brings them (a rerun
    splits the grown data the same way, so `test_share` of new sessions are judged), the
    explored ones among them, and days of that traffic at `sessions_per_day`."""
    n = max(int(ev.n_sessions), 1)
    if not math.isfinite(factor):
        return {"sessions": None, "explored_sessions": None, "days": None,
                "text": "an unknown amount of more data (an estimate sits on its line)"}
    more = max(n * factor - n, 0.0)
    traffic = more / max(float(ev.test_share), 1e-9)
    text = (f"~{math.ceil(more)} more test sessions ("
            + more_data_text(traffic, "sessions of traffic", ev.sessions_per_day)
            + f" at test share {ev.test_share:g}")
    explored = None if ev.explored_rate is None else more * ev.explored_rate
    if explored is not None:
        text += f"; ~{math.ceil(explored)} of the test sessions explored"
    text += ")"
    return {"sessions": float(math.ceil(more)), "traffic_sessions": float(math.ceil(traffic)),
            "explored_sessions": explored, "days": float(traffic / ev.sessions_per_day),
            "needed_total": float(n * factor), "test_share": float(ev.test_share),
            "text": text}


# ---------------------------------------------------------------- the OPE gate (receipts mode)
def receipts_criteria(v: dict, objective: ObjectiveConfig) -> list[Criterion]:
    """The objective's criteria on one OPE variant (`ope["evidence"]["variants"][...]`):
    incumbent: quality vs logging >= -margin and cost vs logging < 0; quality_floor:
    quality - fraction x strong-only >= 0 and cost vs logging < 0; budget: cost per call
    <= cost_per_call and quality vs logging > 0 (router/objective.py)."""
    def crit(key: str, name: str, line: float, side: str, strict: bool = False,
             unit: str = "", fmt: str = "+.4f") -> Criterion:
        return Criterion(name, v[key]["estimate"], list(v[key]["ci"]), line, side, strict,
                         unit, fmt)

    cost = crit("diff_cost", "cost vs logging", 0.0, "upper", True, " USD/call", "+.4g")
    if objective.kind == "incumbent":
        return [crit("diff_quality", "quality vs logging", -float(objective.margin), "lower"),
                cost]
    if objective.kind == "quality_floor":
        return [crit("quality_vs_floor", f"quality - {objective.fraction_of_strong:g} x "
                     "strong-only", 0.0, "lower"), cost]
    return [crit("cost", "cost per call", float(objective.cost_per_call or 0.0), "upper",
                 unit=" USD", fmt=".4g"),
            crit("diff_quality", "quality vs logging", 0.0, "lower", True)]


def ope_gate(ope: dict, objective: ObjectiveConfig, sessions_per_day: float,
             incumbent: str = "logging policy", test_share: float = 1.0) -> dict:
    """The receipts verdict (`router.gate.judge`) on the objective's criteria read with the
    gate's estimator and clip (DR, no clip: `ope_sums.CHOSEN`), the overlap diagnostics of
    the served policy's weights, and which other estimator or clip would flip it."""
    evid = ope["evidence"]
    w = evid["weights"]
    rate = ope["explored_sessions"] / max(ope["sessions"], 1)
    label = objective.label(incumbent)

    def judged(v: dict) -> dict:
        return judge(Evidence(receipts_criteria(v, objective), int(ope["sessions"]),
                              float(sessions_per_day), diagnostics=list(w["failed"]),
                              diagnostic_factors=list(w["factors"]), explored_rate=rate,
                              test_share=test_share), label)

    out = judged(evid["variants"][evid["chosen"]])
    flips = []
    for key, v in evid["variants"].items():
        if key == evid["chosen"]:
            continue
        other = judged(v)["verdict"]
        if other != out["verdict"]:
            clip = "no clip" if v["clip"] is None else f"clip {v['clip']:g} ({v['clip_level']})"
            flips.append(f"{v['estimator'].upper()} with {clip} would say {other}")
    evid["flips"] = flips
    reason = out["reasons"][0] + (f"; another estimator or clip would flip it: "
                                  f"{'; '.join(flips)}" if flips else
                                  "; every estimator (IPS, SNIPS, DR) at no clip and the "
                                  "automatic clip agrees")
    more = out["more_data"]
    return {"go": out["go"], "verdict": out["verdict"], "go_reason": reason,
            "go_reasons": [reason],
            "objective": {**objective.to_dict(), "label": label, "incumbent": incumbent},
            "go_detail": {"verdict": out["verdict"],
                          "rule": f"{label}: every criterion's interval clears its line "
                                  f"(router/gate.py), read with {evid['chosen']}",
                          "criteria": out["criteria"], "more_data": more,
                          "diagnostics_failed": out["diagnostics_failed"], "flips": flips,
                          "explored_test_sessions": int(ope["explored_sessions"]),
                          "explored_sessions_needed": (None if not more or more["sessions"] is None
                                                       else more["explored_sessions"]),
                          "days_needed": None if not more else more["days"]}}


# ---------------------------------------------------- the full-information gate (outcomes mode)
def objective_criteria(objective: ObjectiveConfig, baseline: str, n_boot: int, te: Any,
                       ch: np.ndarray, base_te: np.ndarray, fallback: int, seed: int
                       ) -> tuple[list[Criterion], dict]:
    """The objective's criteria at test choices `ch` against the incumbent's `base_te`
    (`baseline`: its name) on a fully replayed test table `te` (an OutcomeMatrix: (n, K)
    `score` and `cost`), each a paired prompt-bootstrap interval (`n_boot`, `seed`), and
    the figures the summary keeps (cost_saving, quality_delta, ...: {"mean", "ci"}).
    The receipts mode's criteria on OPE are `receipts_criteria`."""
    o = objective
    rows = np.arange(te.n_prompts)
    boundary = GateBoundary(level=0.95)

    def paired(d: np.ndarray) -> dict:
        est = float(d.mean()) if len(d) else float("nan")
        return {"mean": est,
                "ci": gate_interval(paired_replicates(d, n_boot, seed), est, boundary)}

    fig = {"cost_saving": paired(te.cost[rows, base_te] - te.cost[rows, ch]),
           "quality_delta": paired(te.score[rows, ch] - te.score[rows, base_te])}
    saving = Criterion("cost saving vs " + baseline, fig["cost_saving"]["mean"],
                       fig["cost_saving"]["ci"], 0.0, "lower", strict=True,
                       unit=" USD/prompt", fmt=".4g")
    if o.kind == "incumbent":
        crit = [Criterion("quality vs " + baseline, fig["quality_delta"]["mean"],
                          fig["quality_delta"]["ci"], -float(o.margin), "lower"), saving]
    elif o.kind == "quality_floor":
        fig["quality_vs_floor"] = paired(te.score[rows, ch]
                                         - float(o.fraction_of_strong) * te.score[rows, fallback])
        crit = [Criterion(f"quality - {o.fraction_of_strong:g} x strong-only",
                          fig["quality_vs_floor"]["mean"], fig["quality_vs_floor"]["ci"], 0.0,
                          "lower"), saving]
    else:
        fig["served_cost"] = paired(te.cost[rows, ch])
        crit = [Criterion("cost per prompt", fig["served_cost"]["mean"],
                          fig["served_cost"]["ci"], float(o.cost_per_call), "upper",
                          unit=" USD", fmt=".4g"),
                Criterion("quality vs " + baseline, fig["quality_delta"]["mean"],
                          fig["quality_delta"]["ci"], 0.0, "lower", strict=True)]
    return crit, fig


def outcomes_gate(objective: ObjectiveConfig, baseline: str, point: dict,
                  criteria: list[Criterion], n_prompts: int, sessions_per_day: float,
                  explored_share: float, cap: float, test_share: float, rule: str,
                  curve: list[dict], extra: dict | None = None) -> dict:
    """The outcomes mode's verdict (`judge`) at the served point: `point` its figures
    (threshold, operating_point, the `objective_criteria` figures, ...), `criteria` its
    `objective_criteria`. The test split is full-information, so no overlap diagnostic can
    fail: an interval that straddles its line with the estimate on the passing side reads
    NOT ENOUGH EVIDENCE. The explored share of sessions above `cap` is a hard failure.
    `curve`: the learning curve's points ({"explored_sessions",
    "days_of_live_exploration", "significant"}, growing budgets): the smallest budget from
    which every larger one is significant is the sessions and days needed."""
    within_cap = explored_share <= cap
    hard = [] if within_cap else [f"explored share {explored_share:.3f} of sessions is above "
                                  f"the cap {cap:g}"]
    label = objective.label(baseline)
    judged = judge(Evidence(criteria, n_prompts, sessions_per_day, hard_failures=hard,
                            test_share=test_share), label)
    served_text = (f"served threshold {point['threshold']:.4g} ({rule} rule; chosen "
                   f"on calibration: {point['operating_point']}), gated at the same threshold "
                   f"on the same objective")
    # the smallest budget from which every larger one is significant (not a lucky early point)
    first = None
    for c in reversed(curve):
        if not c["significant"]:
            break
        first = c
    return {"go": judged["go"], "verdict": judged["verdict"], "go_reasons": judged["reasons"],
            "objective": {**objective.to_dict(), "label": label, "incumbent": baseline},
            "go_detail": {**point, "verdict": judged["verdict"], "served": served_text,
                          "baseline": baseline,
                          "criteria": judged["criteria"], "more_data": judged["more_data"],
                          **(extra or {}),
                          "exploration_within_cap": within_cap, "explored_share": explored_share,
                          "sessions_per_day": sessions_per_day,
                          "explored_sessions_needed": first["explored_sessions"] if first else None,
                          "days_needed": first["days_of_live_exploration"] if first else None}}
