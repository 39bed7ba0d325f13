"""The outcomes router's cost/quality curves: the rules' routing scores and paired gaps.

`rules_scores` is the scenario rules' curve (what the rules family would route at every
threshold); `cr95_gaps` the paired prompt-bootstrap differences of test
cost_ratio_at_<target> between two policies' curves (both resampled with the same
prompts). `pipelines/router.py` reports them beside the learned router's curve.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from replaylab.contracts.columns import Outcomes as O
from replaylab.router.metrics import (
    anchors,
    cost_order,
    curve_metrics,
    default_thresholds,
    route_by_threshold,
)
from replaylab.router.replay import Label, OutcomeMatrix
from replaylab.router.rules import ScenarioRules
from replaylab.stats import percentile_interval, session_bootstrap


def _cr95_sweeps(te: OutcomeMatrix, pred: np.ndarray, ev: Any, strong: int
                 ) -> tuple[np.ndarray, ...]:
    t = default_thresholds(pred, ev.n_thresholds)
    choice = route_by_threshold(pred, cost_order(te), strong, t)  # (T, n)
    rows = np.arange(te.n_prompts)[None, :]
    return (te.score[rows, choice], te.cost[rows, choice],
            (choice == strong).astype(float))


def cr95_gaps(te: OutcomeMatrix, curves: dict[str, np.ndarray], pairs: Sequence[tuple[str, str]],
              ev: Any) -> tuple[dict, dict[str, np.ndarray]]:
    """Paired differences of test cost_ratio_at_<target> between policies' curves.

    curves: policy -> (n, K) routing scores; pairs: (a, b) -> a - b (negative: a is
    cheaper at the target). Every replicate resamples the test prompts once for both
    policies (`evaluation.n_boot`, `seed`), so the interval is paired. Returns
    ({"a-b": {"mean", "ci"}}, {"a-b": (n_boot,) replicates}); empty without a trade-off.
    """
    weak, strong = anchors(te, ev, allow_same=True)
    names = sorted({n for p in pairs for n in p if n in curves})
    if weak == strong or not pairs or ev.n_boot < 1:
        return {}, {}
    key = f"cost_ratio_at_{round(ev.quality_target * 100)}"
    sweeps = {n: _cr95_sweeps(te, curves[n], ev, strong) for n in names}
    anchor = np.stack([te.score[:, weak], te.score[:, strong], te.cost[:, strong]])

    def values(w: np.ndarray) -> dict[str, np.ndarray]:  # w (b, n) -> name -> (b,)
        tot = w.sum(axis=1)
        a = (w @ anchor.T) / tot[:, None]
        out = {}
        for n, (q, c, s) in sweeps.items():
            qb, cb, sb = ((w @ x.T) / tot[:, None] for x in (q, c, s))
            out[n] = np.array([curve_metrics(sb[j], qb[j], cb[j], a[j, 0], a[j, 1], a[j, 2],
                                             ev.quality_target)[key] for j in range(len(w))])
        return out

    point = values(np.ones((1, te.n_prompts)))
    reps: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for w in session_bootstrap(np.arange(te.n_prompts), ev.n_boot, ev.seed):
        for n, v in values(w).items():
            reps[n].append(v)
    rep = {n: np.concatenate(v) for n, v in reps.items()}
    summary, diffs = {}, {}
    for a, b in pairs:
        if a not in curves or b not in curves:
            continue
        d = rep[a] - rep[b]
        lo, hi = percentile_interval(d, ev.level)
        summary[f"{a}-{b}"] = {"mean": float(point[a][0] - point[b][0]), "ci": [lo, hi],
                               "significant": bool(np.isfinite(lo) and np.isfinite(hi)
                                                   and (hi < 0 or lo > 0))}
        diffs[f"{a}-{b}"] = d
    return summary, diffs


def rules_scores(rules: ScenarioRules, train: OutcomeMatrix, m: OutcomeMatrix) -> np.ndarray:
    """The rules family's curve: per-task train success of each candidate (what the rules are
    fitted on), shorter prompts first within a task. Under the `margin` rule, sweeping the
    threshold is sweeping the rules' own tolerance (cheapest candidate within -t of the
    task's best), the long-prompt rule breaking ties; under `absolute` it moves tasks
    (then long prompts) from cheap to strong candidates."""
    tasks = train.meta[O.TASK].astype(str).to_numpy()
    table = pd.DataFrame(train.score).groupby(tasks).mean()
    prior = train.score.mean(axis=0)
    own = table.reindex(m.meta[O.TASK].astype(str)).to_numpy(float)
    own = np.where(np.isfinite(own), own, prior[None, :])
    length = m.meta[Label.PROMPT_LENGTH].to_numpy(float)
    rank = pd.Series(length).rank(pct=True).to_numpy()
    others = np.ones(own.shape, bool)  # the task's best keeps its value: a margin of 0
    others[np.arange(len(own)), own.argmax(axis=1)] = False
    return own - 1e-3 * rank[:, None] * others  # ties within a task broken by length
