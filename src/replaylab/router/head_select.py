"""The head's IPS clip, teachers and width, chosen per run on that run's calibration split.

The router head's hyperparameters used to be fixed defaults chosen on our public sets
(`head.max_weight` 2, `head.teachers` 5, `head.hidden` [256, 128]). A user's outcomes
are not our sets: on one hidden user outcome set the clip 2 gave a calibration-chosen
router at cost-at-95%-quality 0.724 (NO-GO) where the clip 20 gave 0.536 (GO). So the
defaults are now candidates, and each run chooses among them on its OWN calibration split
(`router.head_select`, YAML `conf/router/default.yaml`), never on its test split:

- both modes (`pipelines.router_fit.fit_router`, in the receipts pipeline, which the
  outcomes mode `pipelines.router.train_router` runs on receipts simulated from its
  table): each candidate head is fitted on the train rows (its own clip),
  Platt-calibrated on calibration and scored as served; the criterion is the DR cost per
  opening call at the calibration operating point of `router.objective` (by default the
  cheapest threshold whose DR quality reaches the incumbent's calibration quality minus
  the margin: the logging policy's in receipts mode, the `go.baseline` rules' on the
  outcomes mode's fully replayed calibration split, where DR reads the observed values;
  kind budget: -DR quality); a candidate whose curve cannot reach that quality ranks
  after every one that can (among those: the higher DR quality first).

Lower is better; ties (to 1e-12) go to the cheaper head (fewer teachers, then fewer
hidden weights), then to the configured value, then to the smaller clip.

Search `coordinate` (default): start at the configured head (`router.head`), then try
the clip values at the configured teachers and width, keep the best; then the teacher
counts at that clip; then the widths at that clip and teacher count. With two values per
axis that is 4 candidate heads (the configured one included), not the 8 of the full
grid; `grid` tries every combination. The configured head is always a candidate, so a
selection can only move away from it when calibration says so. The chosen head is the
one served (it is not refitted); everything downstream that refits a head (the outcomes
mode's learning curve, the receipts mode's seed-to-seed spread) refits with the chosen
values. `enabled: false` fits the configured head only, exactly as before.

Cost: a teachers = 1 candidate at a clip and width already fitted with M teachers reuses
teacher 0 of that fit (the same seed, rows and config: the same head; the pipelines pass
one `teacher_cache` dict to every candidate's `SuccessHead.fit`), so at the default candidates the search costs one more M-teacher fit, plus
one small-width fit, beyond the configured head's.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from replaylab.router.head_config import HeadConfig, HeadSelectConfig

AXES = ("max_weight", "teachers", "hidden")  # the coordinate order
TIE = 12  # criterion rounded to this many decimals before ranking (float-rounding ties)


def values_of(hc: HeadConfig) -> dict:
    """The selected hyperparameters of a head config, as plain JSON values."""
    return {"max_weight": None if hc.max_weight is None else float(hc.max_weight),
            "teachers": int(hc.teachers), "hidden": [int(h) for h in hc.hidden]}


def _weights(hidden: tuple[int, ...], d: int = 384) -> int:
    widths = (d, *hidden)
    return sum(a * b for a, b in zip(widths, widths[1:], strict=False))


@dataclass
class Trial:
    """One candidate head on calibration: `met` (the quality target was reachable),
    `criterion` (lower is better among the met ones), `figures` (reported), `fitted`
    (whatever the pipeline's evaluate returned: the head as it would be served)."""

    head: HeadConfig
    stage: str
    met: bool
    criterion: float
    figures: dict = field(default_factory=dict)
    fitted: Any = None

    def rank(self, base: HeadConfig) -> tuple:
        crit = round(float(self.criterion), TIE) if np.isfinite(self.criterion) else np.inf
        mw = np.inf if self.head.max_weight is None else float(self.head.max_weight)
        return (not self.met, crit, self.head.teachers, _weights(self.head.hidden),
                values_of(self.head) != values_of(base), mw)


Evaluate = Callable[[HeadConfig], tuple[bool, float, dict, Any]]


def select_head(base: HeadConfig, sel: HeadSelectConfig, evaluate: Evaluate,
                criterion: str) -> tuple[Trial, dict]:
    """Try the candidate heads (module docstring) and return (the chosen trial, the
    summary's `head_selection` section). `evaluate(head_config)` fits and scores one
    candidate on calibration only: (met, criterion, figures, fitted). With
    `sel.enabled` false only `base` is fitted."""
    trials: dict[str, Trial] = {}

    def run(hc: HeadConfig, stage: str) -> Trial:
        key = repr(values_of(hc))
        if key not in trials:
            met, crit, figures, fitted = evaluate(hc)
            trials[key] = Trial(hc, stage, bool(met), float(crit), figures, fitted)
        return trials[key]

    current = run(base, "configured")
    if not sel.enabled:
        return current, {"enabled": False, "chosen": values_of(base), "chosen_on": "config",
                         "criterion": criterion, "candidates": [],
                         "reason": "router.head_select.enabled=false: the configured head "
                                   "(router.head), fitted once"}
    options = {"max_weight": sel.max_weight, "teachers": sel.teachers, "hidden": sel.hidden}
    steps: list[str] = []
    if sel.search == "grid":
        for mw, te, hid in itertools.product(*(options[a] for a in AXES)):
            run(dataclasses.replace(base, max_weight=mw, teachers=te, hidden=hid), "grid")
        current = min(trials.values(), key=lambda t: t.rank(base))
    else:
        for axis in AXES:
            pool = [current] + [run(dataclasses.replace(current.head, **{axis: v}), axis)
                                for v in options[axis] if v != getattr(current.head, axis)]
            best = min(pool, key=lambda t: t.rank(base))
            others = [t for t in pool if t is not best]
            if others:
                steps.append(_step(axis, best, others, current))
            current = best
    chosen = current
    rows = []
    for t in trials.values():
        rows.append({"stage": t.stage, **values_of(t.head), "met": t.met,
                     "criterion": t.criterion, **t.figures, "chosen": t is chosen})
    changed = [a for a in AXES if values_of(chosen.head)[a] != values_of(base)[a]]
    reason = (f"the lowest calibration criterion among {len(trials)} candidate heads "
              f"({sel.search} search"
              + ("; " + "; ".join(steps) if steps else "") + "); "
              + (f"moved from the configured {', '.join(changed)}" if changed
                 else "the configured head kept"))
    return chosen, {"enabled": True, "search": sel.search, "criterion": criterion,
                    "chosen_on": "calibration", "chosen": values_of(chosen.head),
                    "configured": values_of(base), "candidates": rows, "reason": reason}


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def _step(axis: str, best: Trial, others: list[Trial], before: Trial) -> str:
    def fig(t: Trial) -> str:
        return f"{t.criterion:.4g}" if t.met else f"target not met ({t.criterion:.4g})"

    verb = "kept" if best is before else "chosen"
    vs = ", ".join(f"{_fmt(getattr(t.head, axis))}: {fig(t)}" for t in others)
    return f"{axis} {_fmt(getattr(best.head, axis))} {verb} ({fig(best)} vs {vs})"
