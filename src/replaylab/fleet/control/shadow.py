"""Shadow evaluation of a candidate policy beside the acting one, and the canary gate it feeds.

`ShadowPolicy(acting, candidate)` is a Policy that always does what `acting`
says. On every question it also asks `candidate` the same question, on the
same request, eligible set, fleet and time, and logs both answers without
acting on the candidate's:

- admit: both answers (None = admit, else the reason);
- choose (asked only when the acting policy admitted and the simulator asks):
  both replicas, and the candidate's hard constraints checked against the
  fleet: its answer is an int in the eligible set, and that replica serves
  the request's model, in its residency region, and is ready. A candidate
  exception is caught and logged as an error; it never reaches the simulator.
  The candidate gets a copy of the eligible list (it cannot alter the acting
  policy's input).

Because the candidate never acts, the run (every request's fate, every joule)
is the acting policy's own: running `ShadowPolicy(a, c)` gives the same result
as running `a` alone (tested). The candidate's state drifts from what it would
have been had it acted (it sees the acting policy's fleet), so agreement is a
measure of its decisions in the acting policy's world, not of its own outcome.

`shadow_report(log, result, slo)` -> dict: decisions, agreement (admission,
choice, overall), candidate violations by kind and errors, the acting policy's
SLO figures (from `summarize`), and `canary_ready` with `reasons`. A candidate
is canary-ready when: it was asked at least `min_decisions` choices; it made
zero hard-constraint violations and zero errors (any one is a blocker: a
violation in production is a residency breach or a misroute); the log covers
every arrival of `result`; and it would not reject more than `max_extra_reject`
(absolute share of arrivals) beyond what the acting policy rejected.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping

import pandas as pd

from replaylab.fleet.sim.outcomes import SloTarget, summarize
from replaylab.fleet.sim.result import SimResult

NOT_INT, NOT_ELIGIBLE, WRONG_MODEL, RESIDENCY, NOT_READY = (
    "not_an_int", "not_eligible", "wrong_model", "residency", "not_ready")
ACTING_FIGURES = ("arrived", "completed", "rejected", "timed_out", "cancelled", "slo_attainment",
                  "ttft_p99_s", "e2e_p99_s", "goodput_rps", "joules_per_output_token")


class ShadowLog:
    """Column lists, one row per question: admissions, then choices."""

    def __init__(self) -> None:
        self.admits: dict[str, list] = {"index": [], "t": [], "acting": [], "candidate": [],
                                        "candidate_error": []}
        self.choices: dict[str, list] = {"index": [], "t": [], "acting": [], "candidate": [],
                                         "violation": [], "candidate_error": []}

    def admit_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.admits)

    def choice_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.choices)


def check_choice(request, choice, eligible, fleet) -> str:
    """'' when `choice` is a legal answer for `request`, else the first hard constraint it breaks."""
    if isinstance(choice, bool) or not isinstance(choice, int):
        return NOT_INT
    if not 0 <= choice < len(fleet.replicas):
        return NOT_ELIGIBLE  # no such replica
    rep = fleet.replicas[choice]
    if rep.model != request.model:
        return WRONG_MODEL
    if request.region is not None and rep.region != request.region:
        return RESIDENCY
    if rep.state != "ready":
        return NOT_READY
    if choice not in eligible:
        return NOT_ELIGIBLE  # e.g. not free in shared queueing
    return ""


class ShadowPolicy:
    """Acts with `acting`; asks `candidate` the same questions and logs both, never acting on it."""

    def __init__(self, acting, candidate) -> None:
        for name, p in (("acting", acting), ("candidate", candidate)):
            if not callable(getattr(p, "choose", None)):
                raise ValueError(f"ShadowPolicy.{name}={type(p).__name__}: must have choose(...)")
        self.acting, self.candidate = acting, candidate
        self.log = ShadowLog()
        self._a_admit = getattr(acting, "admit", None)
        self._c_admit = getattr(candidate, "admit", None)

    def admit(self, request, fleet, now):
        a = None if self._a_admit is None else self._a_admit(request, fleet, now)
        c, err = None, ""
        if self._c_admit is not None:
            try:
                c = self._c_admit(request, fleet, now)
            except Exception as e:  # noqa: BLE001 - a candidate's failure is data, not a crash
                c, err = None, f"{type(e).__name__}: {e}"[:200]
        log = self.log.admits
        log["index"].append(request.index)
        log["t"].append(now)
        log["acting"].append(None if a is None else str(a))
        log["candidate"].append(None if c is None else str(c))
        log["candidate_error"].append(err)
        return a

    def choose(self, request, eligible, fleet, now):
        a = self.acting.choose(request, eligible, fleet, now)
        c, err, why = None, "", ""
        try:
            c = self.candidate.choose(request, list(eligible), fleet, now)
        except Exception as e:  # noqa: BLE001
            err = f"{type(e).__name__}: {e}"[:200]
        if not err:
            why = check_choice(request, c, eligible, fleet)
        log = self.log.choices
        log["index"].append(request.index)
        log["t"].append(now)
        log["acting"].append(a)
        log["candidate"].append(c if isinstance(c, int) and not isinstance(c, bool) else None)
        log["violation"].append(why)
        log["candidate_error"].append(err)
        return a


def shadow_report(log: ShadowLog | ShadowPolicy, result: SimResult,
                  slo: Mapping[str, SloTarget] | None = None, *, min_decisions: int = 100,
                  max_extra_reject: float = 0.05) -> dict:
    """Agreement, candidate violations, the acting policy's SLO figures, and the canary verdict."""
    if isinstance(log, ShadowPolicy):
        log = log.log
    ad, ch = log.admits, log.choices
    n_adm, n_ch = len(ad["index"]), len(ch["index"])
    admit_agree = sum((a is None) == (c is None) for a, c in zip(ad["acting"], ad["candidate"],
                                                                  strict=True))
    cand_reject = sum(c is not None for c in ad["candidate"])
    act_reject = sum(a is not None for a in ad["acting"])
    choice_agree = sum(a == c for a, c in zip(ch["acting"], ch["candidate"], strict=True))
    # overall: per request, same admission and (when both admitted and a choice was asked) same replica
    same_choice = dict(zip(ch["index"], (a == c for a, c in zip(ch["acting"], ch["candidate"],
                                                                  strict=True)), strict=True))
    overall = sum((a is None) == (c is None) and (a is not None or same_choice.get(i, True))
                  for i, a, c in zip(ad["index"], ad["acting"], ad["candidate"], strict=True))
    kinds = Counter(v for v in ch["violation"] if v)
    errors = sum(bool(e) for e in ch["candidate_error"]) + sum(bool(e) for e in ad["candidate_error"])
    violations = sum(kinds.values())
    summary = summarize(result, slo)
    arrived = summary["arrived"]
    extra_reject = (cand_reject - act_reject) / n_adm if n_adm else 0.0
    reasons = []
    if violations:
        reasons.append(f"{violations} hard-constraint violations by the candidate: {dict(kinds)}")
    if errors:
        reasons.append(f"{errors} candidate errors")
    if n_ch < min_decisions:
        reasons.append(f"only {n_ch} choices shadowed (< {min_decisions})")
    if n_adm != arrived:
        reasons.append(f"log covers {n_adm} admissions, the run had {arrived} arrivals")
    if extra_reject > max_extra_reject:
        reasons.append(f"candidate would reject {extra_reject:.1%} more of the arrivals than "
                       f"the acting policy (> {max_extra_reject:.0%})")
    return {
        "decisions": n_ch,
        "admissions": n_adm,
        "admit_agreement": admit_agree / n_adm if n_adm else math.nan,
        "choice_agreement": choice_agree / n_ch if n_ch else math.nan,
        "agreement_rate": overall / n_adm if n_adm else math.nan,
        "candidate_violations": violations,
        "violations_by_kind": dict(kinds),
        "candidate_errors": errors,
        "candidate_reject_rate": cand_reject / n_adm if n_adm else math.nan,
        "acting_reject_rate": act_reject / n_adm if n_adm else math.nan,
        "acting": {k: summary[k] for k in ACTING_FIGURES},
        "canary_ready": not reasons,
        "reasons": reasons,
    }
