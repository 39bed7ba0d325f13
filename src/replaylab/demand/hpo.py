"""Hyperparameter search for the quantile model with Optuna's own API (SQLite storage).

The objective is the mean pinball loss of the early-stopped boosters on the
time-ordered tail of TRAIN (QuantileDemandModel.validation_pinball_): neither
the calibration split (the conformal guarantee needs it unseen) nor the test
split is looked at. Trials skip the refit on full train; only the best
parameters are refit, by the caller. Each finished trial is reported to
`on_trial(number, params, value)`, which the entry point turns into a nested
MLflow run (the library does not call MLflow).

hydra-optuna-sweeper pins optuna<3 and breaks SQLite storage, hence Optuna
directly, from the pipeline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from replaylab.demand.config import QuantileModelConfig

OnTrial = Callable[[int, dict[str, Any], float], None]


@dataclass(frozen=True)
class HPOConfig:
    """Optuna search over the LightGBM hyperparameters (demand.hpo.*).

    trials: number of trials; 0 disables the search (the default of `make run`).
    storage: an Optuna RDB URL, e.g. sqlite:///DIR/optuna.db; null = in memory.
    study_name: prefix; the projection version is appended so that studies of
        different data never mix, and a rerun on the same data resumes the study.
    timeout_s: stop starting trials after this many seconds (null = no limit).
    """

    trials: int = 0
    storage: str | None = None
    study_name: str = "demand"
    timeout_s: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.trials, bool) or int(self.trials) != self.trials or self.trials < 0:
            raise ValueError(f"HPOConfig.trials={self.trials!r}: must be an integer >= 0")
        if self.storage is not None and "://" not in str(self.storage):
            raise ValueError(f"HPOConfig.storage={self.storage!r}: must be an RDB URL "
                             "such as sqlite:///path/optuna.db")
        if self.timeout_s is not None and float(self.timeout_s) <= 0:
            raise ValueError(f"HPOConfig.timeout_s={self.timeout_s!r}: must be > 0")


def suggest(trial: Any, base: QuantileModelConfig) -> QuantileModelConfig:
    """The search space: the parameters that matter most for small quantile GBMs."""
    return dataclasses.replace(
        base,
        learning_rate=trial.suggest_float("learning_rate", 0.02, 0.2, log=True),
        num_leaves=trial.suggest_int("num_leaves", 7, 63, log=True),
        min_child_samples=trial.suggest_int("min_child_samples", 10, 200, log=True),
        feature_fraction=trial.suggest_float("feature_fraction", 0.6, 1.0),
        lambda_l2=trial.suggest_float("lambda_l2", 1e-3, 10.0, log=True),
        refit_full_train=False,  # a trial needs only the validation figure
    )


def search_hyperparameters(fit_validation: Callable[[QuantileModelConfig], float],
                           base: QuantileModelConfig, cfg: HPOConfig, study_suffix: str,
                           on_trial: OnTrial | None = None) -> tuple[QuantileModelConfig, dict]:
    """Run `cfg.trials` trials; return the best config (refit as `base` says) and the facts.

    fit_validation(model_cfg) -> validation mean pinball of a model fitted with it.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name = f"{cfg.study_name}-{study_suffix}"
    study = optuna.create_study(study_name=name, storage=cfg.storage, direction="minimize",
                                sampler=optuna.samplers.TPESampler(seed=cfg.seed),
                                load_if_exists=True)
    already = len(study.trials)
    # The first trial evaluates the configured parameters, so the search can only improve.
    if already == 0:
        study.enqueue_trial({k: getattr(base, k) for k in (
            "learning_rate", "num_leaves", "min_child_samples", "feature_fraction", "lambda_l2")})

    def objective(trial: Any) -> float:
        value = float(fit_validation(suggest(trial, base)))
        if not np.isfinite(value):
            raise optuna.TrialPruned("validation pinball is not finite")
        return value

    def report(study: Any, trial: Any) -> None:
        if on_trial is not None and trial.value is not None:
            on_trial(trial.number, dict(trial.params), float(trial.value))

    study.optimize(objective, n_trials=cfg.trials, timeout=cfg.timeout_s, callbacks=[report],
                   show_progress_bar=False)
    best = dataclasses.replace(base, **study.best_params)
    trials = study.trials_dataframe(attrs=("number", "value", "state"))
    facts = {
        "trials_run": cfg.trials, "trials_in_study": int(len(study.trials)),
        "resumed_from": already, "study_name": name, "storage": cfg.storage,
        "best_value_validation_mean_pinball": float(study.best_value),
        "best_params": dict(study.best_params), "best_trial": int(study.best_trial.number),
        "first_trial_value": _first_value(trials),
    }
    return best, facts


def _first_value(trials: pd.DataFrame) -> float | None:
    done = trials.dropna(subset=["value"]).sort_values("number")
    return float(done["value"].iloc[0]) if len(done) else None
