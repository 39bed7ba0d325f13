"""Where the receipts router's gain came from: its own logs, exploration or replays.

`router.evaluation.attribution: auto|off` (auto: on). The gain is the gate's objective
(router/objective.py, judged by router/gate.py) as an improvement over the incumbent, the
logging policy, at a head's calibration operating point:

    incumbent, quality_floor   cost saving per opening call (USD): logging cost - DR cost
    budget                     quality gain: DR quality - logging quality

Three heads, each the SERVED head configuration refitted with the served seed (one fit
each), its threshold chosen on calibration by the served rule (`router_fit.operating_point`
on every calibration decision: the threshold and the calibration value are read the same
way for all three), judged with DR on calibration and on test:

    own        the logging policy's own decisions only (label_source "logged": the sessions
               the exploration did not touch, ledger-v1 `routing_source` != exploration),
               no replays
    logged     + the explored decisions (every logged decision), no replays
    served     + the replays: the served router itself (not refitted)

gain(served) = gain(own) + [gain(logged) - gain(own)] + [gain(served) - gain(logged)]:
the head on the incumbent's own choices, the exploration increment, the replay increment.
A head that adds nothing is skipped (no exploration in train/calibration: own = logged;
no replays: logged = served). The replays are also scored per source (`source` column of
`data.replays`, else per split of the opening they label): logged + that group's replays
against logged, one fit per group (at most MAX_GROUPS groups, the largest).

Intervals: the paired session bootstrap of the gate (`router.ope_sums.ope_part`: hashed
Poisson(1) weights per session, `compute.ops.poisson_weights`); every head is judged on the
same sessions with the same weights, so an increment's replicates are differences of
replicates. An interval that covers 0 reads NOT ENOUGH EVIDENCE; under the incumbent
objective a cost saving whose head's quality interval lies wholly below the logging
policy's minus the margin is no gain ("bought with quality": the gate would say NO-GO on
it). Each point carries its quality vs the logging policy with its interval. The test split decides
nothing here: the served router is what it was; these figures only explain it.

Checks: each refitted head needs train and calibration rows of every candidate; the served
point's test gain must equal the gate's own figure. A failed check skips the attribution
and says why; it is never fatal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from replaylab.pipelines.router_fit import (
    FitData,
    FittedRouter,
    decision_meta,
    fit_head,
    operating_point,
)
from replaylab.router.gate import GateBoundary, gate_interval
from replaylab.router.ope_sums import TERMS, ope_part, scored_rows
from replaylab.router.replay import Label
from replaylab.runtime.routing import choose_by_threshold
from replaylab.verdict import NOT_ENOUGH_EVIDENCE

EXPLORED = "exploration"  # label_source of an explored opening (router.exploration.bandit_rows)
MAX_GROUPS = 8            # replay groups scored one by one (the largest; the rest reported)
# (name, what) of the three points, in order
POINTS = (("own", "head on the logging policy's own decisions (explored sessions removed), "
                  "no replays"),
          ("logged", "+ the explored decisions: every logged decision, no replays"),
          ("served", "+ the replays: the served router"))


class AttributionSkipped(Exception):
    """An attribution check failed: the reason goes to the summary, the run goes on."""


def objective_gain(kind: str) -> tuple[str, float, str]:
    """(TERMS term, sign, unit) of the gain a router makes over the incumbent under the
    objective `kind`: the cost saving (-(DR cost - logging cost)), or under `budget` the
    quality gain (DR quality - logging quality)."""
    if kind == "budget":
        return "d_q", 1.0, "quality (success rate)"
    return "d_c", -1.0, "USD per opening call saved"


def gain_of(total: dict | None, kind: str, n_boot: int = 0) -> tuple[float, np.ndarray]:
    """A judged head's gain (point, (n_boot,) replicates) from `ope_part` sums; None: the
    incumbent itself (gain 0)."""
    if total is None:
        return 0.0, np.zeros(n_boot)
    term, sign, _ = objective_gain(kind)
    i, one = TERMS.index(term), TERMS.index("one")
    S, R = total["sums"], total["reps"]
    with np.errstate(invalid="ignore", divide="ignore"):
        return sign * float(S[i] / S[one]), sign * R[:, i] / R[:, one]


def quality_diff(total: dict | None, n_boot: int = 0) -> tuple[float, np.ndarray]:
    """DR quality - logging quality of a judged head (point, (n_boot,) replicates; None:
    the incumbent, 0)."""
    if total is None:
        return 0.0, np.zeros(n_boot)
    S, R = total["sums"], total["reps"]
    i, one = TERMS.index("d_q"), TERMS.index("one")
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(S[i] / S[one]), R[:, i] / R[:, one]


BOUGHT_WITH_QUALITY = "bought with quality"


def read_interval(est: float, ci: list[float], unit: str, quality_fails: bool = False) -> dict:
    """An estimate with its interval and what it says: NOT ENOUGH EVIDENCE when the
    interval covers 0; a cost saving whose head has its quality interval wholly below the
    incumbent's minus the margin is no gain under the objective ("bought with quality")."""
    if quality_fails and est > 0:
        word = BOUGHT_WITH_QUALITY
    elif not (ci[0] > 0 or ci[1] < 0):
        word = NOT_ENOUGH_EVIDENCE
    else:
        word = "adds" if est > 0 else "takes away"
    return {"estimate": float(est), "ci": [float(ci[0]), float(ci[1])], "unit": unit,
            "reading": word}


def own_variant(data: FitData) -> FitData:
    """The fit data without explored decisions and without replays."""
    dec, E = {}, {}
    for s, d in data.decisions.items():
        keep = (d[Label.LABEL_SOURCE].astype(str) != EXPLORED).to_numpy()
        dec[s], E[s] = d[keep], data.E[s][keep]
    return FitData(dec, E, data.replays.iloc[0:0])


def with_replays(data: FitData, keep: np.ndarray | None) -> FitData:
    """Every logged decision and the replays `keep` selects (None: none)."""
    rep = data.replays.iloc[0:0] if keep is None else data.replays[keep]
    return FitData(data.decisions, data.E, rep.reset_index(drop=True))


def replay_groups(replays: pd.DataFrame, source: pd.Series | None) -> tuple[str, dict]:
    """('source' | 'split', name -> boolean mask over the fit replays). source: one label
    per replay row (None or all missing: grouped by the split of the opening replayed)."""
    if source is not None and source.notna().any():
        by, key = "source", source.fillna("(none)").astype(str).to_numpy()
    else:
        by, key = "split", replays["split"].astype(str).to_numpy()
    names, counts = np.unique(key, return_counts=True)
    order = np.argsort(-counts, kind="stable")
    return by, {str(names[j]): key == names[j] for j in order}


def unseen_candidates(data: FitData, k: int) -> list[int]:
    """Candidates without a train or a calibration row (logged or replayed) in `data`."""
    out: set[int] = set()
    for s, d in data.decisions.items():
        rep = data.replays[data.replays["split"] == s] if len(data.replays) else data.replays
        seen = np.bincount(np.concatenate([d["action"].to_numpy(np.int64),
                                           rep["action"].to_numpy(np.int64)]), minlength=k)
        out |= set(np.flatnonzero(seen[:k] == 0).tolist())
    return sorted(out)


@dataclasses.dataclass
class Judged:
    """One head of the attribution: its operating point and its judged sums (None: the
    incumbent's own choices, no head)."""

    threshold: float | None
    fallback: int | None
    calibration: dict | None
    test: dict | None
    rows: dict
    note: str = ""

    def quality(self, split: str, boundary: GateBoundary) -> dict:
        """The head's DR quality - the logging policy's, with its interval."""
        q, reps = quality_diff(getattr(self, split), len(getattr(self, split)["reps"])
                               if getattr(self, split) is not None else 0)
        return {"estimate": q, "ci": gate_interval(reps, q, boundary) if len(reps) else [q, q]}

    def figures(self, kind: str, boundary: GateBoundary) -> dict:
        out = {"threshold": self.threshold, "rows": self.rows,
               **({"note": self.note} if self.note else {})}
        for split in ("calibration", "test"):
            out[split] = {"gain": gain_of(getattr(self, split), kind)[0],
                          "quality_vs_logging": self.quality(split, boundary)}
        return out


def calibration_total(fitted: FittedRouter, dep: Any, threshold: float, fallback: int,
                      unit_session: np.ndarray, n_boot: int, seed: int) -> dict:
    """`ope_part` sums of a head at its threshold on every calibration decision the fits
    read (the same rows and weights for each head)."""
    d = fitted.data.decisions["calibration"]
    prob = dep.predict_proba(fitted.data.E["calibration"], decision_meta(d))
    choice = choose_by_threshold(prob, threshold, fallback=fallback, rule=fitted.rule)
    return ope_part(scored_rows(d, prob, choice), len(fitted.candidates), fitted.unit_cost,
                    unit_session, n_boot, seed, None, None, fallback, fitted.rule)


def attribute(fitted: FittedRouter, judge_test: Callable[[Any, float, int], dict],
              unit_session: np.ndarray, n_boot: int, level: float, seed: int,
              source: pd.Series | None, gate_gain: float,
              say: Callable[[str], None]) -> tuple[dict, dict | None]:
    """(summary["attribution"], summary["replays"]["value"] or None) of a receipts run
    (module docstring). judge_test(served graph, threshold, fallback) -> the test split's
    summed `ope_part` (no threshold sweep), on the run's engine; gate_gain: the served
    router's gain as the gate read it (the check). Raises AttributionSkipped."""
    kind = fitted.objective.kind
    k = len(fitted.candidates)
    boundary = GateBoundary(level=level)
    unit = objective_gain(kind)[2]

    def judged(data: FitData | None, name: str) -> Judged:
        if data is None:  # the served router itself
            dep, thr, fb = fitted.deployed, float(fitted.point["threshold"]), fitted.fallback
            data = fitted.data
        else:
            unseen = unseen_candidates(data, k)
            if unseen:
                raise AttributionSkipped(f"the {name} head has no train or calibration row of "
                                         f"candidate(s) {unseen}: it cannot be fitted like the "
                                         "served one")
            say(f"attribution: the {name} head (one fit)")
            refits[0] += 1
            rows = dataclasses.replace(fitted, data=data).rows_for(fitted.config.max_weight)
            try:  # a refit that cannot be made explains nothing: reported, never fatal
                _, dep = fit_head(fitted.config, seed, data.E, data.meta, rows, k,
                                  fitted.head_scorer)
                point, fb, _ = operating_point(dep, fitted.data, fitted.candidates,
                                               fitted.unit_cost, fitted.rule,
                                               fitted.n_thresholds, fitted.objective,
                                               fitted.view)
            except (ValueError, RuntimeError, FloatingPointError, np.linalg.LinAlgError) as e:
                raise AttributionSkipped(f"the {name} head could not be refitted: "
                                         f"{type(e).__name__}: {e}") from e
            thr = float(point["threshold"])
        n = {s: int(len(d)) for s, d in data.decisions.items()}
        n["replays"] = int(len(data.replays))
        return Judged(thr, int(fb), calibration_total(fitted, dep, thr, fb, unit_session,
                                                     n_boot, seed),
                      judge_test(dep, thr, fb), n)

    def quality_fails(j: Judged, split: str) -> bool:
        """Objective incumbent: j's quality interval wholly below the logging policy's minus
        the margin (its cost saving is then no gain). Other objectives: the gain read alone."""
        if kind != "incumbent" or getattr(j, split) is None:
            return False
        return j.quality(split, boundary)["ci"][1] < -float(fitted.objective.margin)

    def increment(a: Judged, b: Judged) -> dict:
        """b's gain - a's gain, per split, with the paired interval."""
        out = {}
        for split in ("calibration", "test"):
            (ga, ra), (gb, rb) = (gain_of(getattr(a, split), kind, n_boot),
                                  gain_of(getattr(b, split), kind, n_boot))
            out[split] = read_interval(gb - ga, gate_interval(rb - ra, gb - ga, boundary), unit,
                                       quality_fails(b, split))
        return out

    refits = [0]
    data = fitted.data
    explored = sum(int((d[Label.LABEL_SOURCE].astype(str) == EXPLORED).sum())
                   for d in data.decisions.values())
    n_rep = int(len(data.replays))
    if not explored and not n_rep:
        raise AttributionSkipped("no explored decision and no replay in train or calibration:"
                                 " the served head is the head on the logging policy's own "
                                 "decisions")
    served = judged(None, "served")
    if abs(gain_of(served.test, kind)[0] - gate_gain) > 1e-9 * max(1.0, abs(gate_gain)):
        raise AttributionSkipped(f"the served point's test gain {gain_of(served.test, kind)[0]} "
                                 f"is not the gate's {gate_gain}")
    logged = judged(with_replays(data, None), "logged") if n_rep else served
    own_data = own_variant(data)
    unseen = unseen_candidates(own_data, k)
    if not explored:
        own = logged
    elif unseen:  # a deterministic incumbent logs only its own choices: nothing to learn from
        own = Judged(None, None, None, None,
                     {s: int(len(d)) for s, d in own_data.decisions.items()} | {"replays": 0},
                     f"the logging policy's own decisions never show candidate(s) "
                     f"{[fitted.candidates[j] for j in unseen]}: a head on them cannot choose "
                     "those, so this point is the incumbent's own choices (gain 0, no fit)")
    else:
        own = judged(own_data, "own")
    points = {"own": own, "logged": logged, "served": served}

    zero = {}  # the own head's gain over the logging policy (the incumbent: gain 0)
    for split in ("calibration", "test"):
        g, reps = gain_of(getattr(own, split), kind, n_boot)
        zero[split] = read_interval(g, gate_interval(reps, g, boundary), unit,
                                    quality_fails(own, split)) \
            if own.test is not None else {"estimate": 0.0, "ci": [0.0, 0.0], "unit": unit,
                                          "reading": "the incumbent itself (no head fitted)"}
    attribution = {
        "gain": {"what": f"the gate's objective ({fitted.objective.label('logging policy')}) "
                         "as an improvement over the logging policy at each head's calibration "
                         "operating point, DR", "unit": unit},
        "points": {name: {"what": what, **points[name].figures(kind, boundary)}
                   for name, what in POINTS},
        "increments": {"head_on_own_decisions": zero,
                       "exploration": increment(own, logged),
                       "replays": increment(logged, served)},
        "total": {split: gain_of(getattr(served, split), kind)[0]
                  for split in ("calibration", "test")},
        "explored_decisions": explored, "replays": n_rep,
        "interval": f"paired session bootstrap (hashed Poisson(1) weights), {level:g} "
                    "two-sided; NOT ENOUGH EVIDENCE where it covers 0; under the incumbent "
                    "objective a saving whose head has its quality interval wholly below the "
                    f"logging policy's - {fitted.objective.margin:g} reads "
                    f"'{BOUGHT_WITH_QUALITY}' (no gain under the objective)",
        "how": "the served head configuration and seed refitted once per point; threshold "
               "chosen on calibration as the served one; the test split decides nothing"}
    value = None
    if n_rep:
        by, groups = replay_groups(data.replays, source)
        per: dict = {}
        for name, mask in list(groups.items())[:MAX_GROUPS]:
            g = served if mask.all() else judged(with_replays(data, mask), f"replays {name}")
            per[name] = {"replays": int(mask.sum()), **increment(logged, g)}
        value = {"by": by, "with": served.figures(kind, boundary),
                 "without": logged.figures(kind, boundary),
                 "increment": attribution["increments"]["replays"], "groups": per,
                 "groups_left_out": max(0, len(groups) - MAX_GROUPS),
                 "what": "the served head with and without the replays (the same head "
                         "configuration and seed); per group: logged decisions + that "
                         "group's replays against logged decisions alone", "unit": unit}
    attribution["refits"] = refits[0]
    return attribution, value
