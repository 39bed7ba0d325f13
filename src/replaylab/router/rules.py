"""Scenario rules: the routing policy deployed before anything is learned.

The logging policy of the simulated receipts, and the baseline a learned router
must beat. Three rules, checked in this order for each prompt:

1. long prompt: prompt_length > `long_prompt_tokens` -> `long_prompt_candidate`;
2. task rule: a candidate per task (`task_candidate`, configured by hand);
3. default: `default_candidate`.

Tasks without a configured rule, and a null default, are FITTED on the training
split handed to `fit` (`describe()` says which choices were fitted and on how
many prompts): on the task's training prompts, pick the cheapest candidate whose
mean score is within `quality_tolerance` of the best candidate's mean score,

    a*(task) = argmin_{a : mean_r(a) >= max_b mean_r(b) - tol} mean_cost(a),

i.e. "the cheap model where it is as good as the best, the best elsewhere"; a
task with fewer than `min_task_prompts` training prompts uses the default, and
the default is the same rule over all training prompts.

A scikit-learn-style estimator: `__init__` only stores the config, `fit`
validates and learns `task_candidate_`, `default_candidate_`, returns self.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from replaylab.contracts.columns import Outcomes as O
from replaylab.router.config import RouterRulesConfig
from replaylab.router.replay import Label, OutcomeMatrix

DECISION_LONG = "long_prompt"
DECISION_TASK = "task:"  # + task name
DECISION_DEFAULT = "default"


def cheapest_within(score: np.ndarray, cost: np.ndarray, tolerance: float) -> int:
    """Column of the cheapest candidate whose mean score is within `tolerance` of the best.

    score, cost: (n, K). Ties on cost go to the higher mean score, then the lower index.
    """
    mean_r, mean_c = score.mean(axis=0), cost.mean(axis=0)
    ok = np.flatnonzero(mean_r >= mean_r.max() - tolerance - 1e-12)
    return int(ok[np.lexsort((-mean_r[ok], mean_c[ok]))[0]])


class ScenarioRules:
    """Rules by prompt length, task and a default; fitted where not configured."""

    def __init__(self, config: RouterRulesConfig | None = None) -> None:
        self.config = config or RouterRulesConfig()

    def fit(self, train: OutcomeMatrix) -> ScenarioRules:
        cfg = self.config
        named = {**cfg.task_candidate}
        if cfg.default_candidate is not None:
            named["<default>"] = cfg.default_candidate
        if cfg.long_prompt_candidate is not None:
            named["<long_prompt>"] = cfg.long_prompt_candidate
        for where, cand in named.items():
            if cand not in train.candidates:
                raise ValueError(f"RouterRulesConfig: rule {where} -> {cand!r} names no candidate "
                                 f"of the table ({', '.join(train.candidates)})")
        self.candidates_ = train.candidates
        tol = float(cfg.quality_tolerance)
        if cfg.default_candidate is not None:
            self.default_candidate_, self.default_source_ = cfg.default_candidate, "configured"
        else:
            k = cheapest_within(train.score, train.cost, tol)
            self.default_candidate_, self.default_source_ = train.candidates[k], "fitted"
        self.task_candidate_: dict[str, str] = dict(cfg.task_candidate)
        self.task_source_: dict[str, str] = {t: "configured" for t in cfg.task_candidate}
        tasks = train.meta[O.TASK].to_numpy()
        if cfg.fit_tasks:
            for task in sorted(set(tasks) - set(cfg.task_candidate)):
                rows = tasks == task
                if rows.sum() < cfg.min_task_prompts:
                    continue  # too few prompts to fit: the default answers
                k = cheapest_within(train.score[rows], train.cost[rows], tol)
                self.task_candidate_[task] = train.candidates[k]
                self.task_source_[task] = "fitted"
        self.fitted_on_ = {"prompts": train.n_prompts, "tasks": int(len(set(tasks))),
                           "fitted_tasks": sum(v == "fitted" for v in self.task_source_.values())}
        return self

    @classmethod
    def from_choices(cls, candidates: tuple[str, ...], task_candidate: dict[str, str],
                     default_candidate: str, note: str, n: int,
                     config: RouterRulesConfig | None = None) -> ScenarioRules:
        """Rules given as choices (e.g. the logging policy observed in a receipts ledger),
        fitted state set without an outcome table; `describe()` carries `note`."""
        bad = sorted({default_candidate, *task_candidate.values()} - set(candidates))
        if bad:
            raise ValueError(f"ScenarioRules.from_choices: {bad} are not candidates {candidates}")
        base = config or RouterRulesConfig()
        rules = cls(RouterRulesConfig(**{**{f: getattr(base, f) for f in (
            "quality_tolerance", "min_task_prompts", "chars_per_token")},
            "long_prompt_tokens": None, "long_prompt_candidate": None}))
        rules.candidates_ = tuple(candidates)
        rules.default_candidate_, rules.default_source_ = default_candidate, "observed"
        rules.task_candidate_ = dict(task_candidate)
        rules.task_source_ = {t: "observed" for t in task_candidate}
        rules.fitted_on_ = {"prompts": int(n), "tasks": len(task_candidate), "fitted_tasks": 0}
        rules.note_ = note
        return rules

    def _check_fitted(self) -> None:
        if not hasattr(self, "default_candidate_"):
            raise RuntimeError("ScenarioRules is not fitted: call fit(train_matrix) first")

    def decide(self, meta: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(n,) candidate names and (n,) decision names (`long_prompt`, `task:<t>`, `default`).

        meta: a frame with `task` and `prompt_length` (OutcomeMatrix.meta).
        """
        self._check_fitted()
        tasks = meta[O.TASK].astype(str)
        by_task = tasks.map(self.task_candidate_)
        choice = by_task.fillna(self.default_candidate_).to_numpy(dtype=object)
        decision = np.where(by_task.notna(), DECISION_TASK + tasks, DECISION_DEFAULT).astype(object)
        if self.config.long_prompt_tokens is not None:
            long = meta[Label.PROMPT_LENGTH].to_numpy(float) > self.config.long_prompt_tokens
            choice[long] = self.config.long_prompt_candidate
            decision[long] = DECISION_LONG
        return choice, decision

    def predict(self, meta: pd.DataFrame) -> np.ndarray:
        """(n,) candidate names chosen for the prompts of `meta`."""
        return self.decide(meta)[0]

    def predict_index(self, matrix: OutcomeMatrix) -> np.ndarray:
        """(n,) column indices into `matrix.candidates` of the chosen candidates."""
        names = self.predict(matrix.meta)
        lookup = {c: k for k, c in enumerate(matrix.candidates)}
        missing = sorted(set(names) - set(lookup))
        if missing:
            raise ValueError(f"ScenarioRules chose {missing}, absent from the table's candidates")
        return np.array([lookup[c] for c in names], dtype=np.int64)

    def describe(self) -> dict:
        """What the rules are and which were fitted (for the run summary)."""
        self._check_fitted()
        cfg = self.config
        fitted = [t for t, s in self.task_source_.items() if s == "fitted"]
        note = getattr(self, "note_", None) or ("configured by hand" if not fitted and self.default_source_ == "configured"
                else f"choices fitted on the training split ({self.fitted_on_['prompts']} prompts): "
                     f"{len(fitted)} task rule(s)"
                     + (" and the default" if self.default_source_ == "fitted" else ""))
        return {
            "default_candidate": self.default_candidate_, "default_source": self.default_source_,
            "task_candidate": dict(sorted(self.task_candidate_.items())),
            "task_source": dict(sorted(self.task_source_.items())),
            "long_prompt_tokens": cfg.long_prompt_tokens,
            "long_prompt_candidate": cfg.long_prompt_candidate,
            "quality_tolerance": cfg.quality_tolerance, "fitted_on": self.fitted_on_, "note": note,
        }
