"""Optuna search: SQLite storage, trials as nested MLflow runs, the test split never used."""

from __future__ import annotations

import json

import optuna
import pytest

from replaylab.demand.config import QuantileModelConfig
from replaylab.demand.hpo import HPOConfig, search_hyperparameters
from tests.helpers.entrypoints import train


def test_search_resumes_its_study_and_reports_every_trial(tmp_path):
    storage = f"sqlite:///{tmp_path}/optuna.db"
    seen = []

    def objective(cfg: QuantileModelConfig) -> float:  # a known bowl: best num_leaves ~ 20
        assert cfg.refit_full_train is False
        return (cfg.num_leaves - 20) ** 2 + cfg.learning_rate

    cfg = HPOConfig(trials=6, storage=storage, seed=1)
    best, facts = search_hyperparameters(objective, QuantileModelConfig(), cfg, "v1",
                                         on_trial=lambda n, p, v: seen.append((n, v)))
    assert [n for n, _ in seen] == list(range(6))
    assert facts["first_trial_value"] == seen[0][1]  # trial 0 is the configured parameters
    assert facts["best_value_validation_mean_pinball"] == min(v for _, v in seen)
    assert best.refit_full_train is True  # the final fit keeps the configured refit
    _, again = search_hyperparameters(objective, QuantileModelConfig(), cfg, "v1")
    assert again["resumed_from"] == 6 and again["trials_in_study"] == 12
    study = optuna.load_study(study_name="demand-v1", storage=storage)
    assert len(study.trials) == 12


def test_bad_hpo_config_names_the_field():
    with pytest.raises(ValueError, match="trials"):
        HPOConfig(trials=-1)
    with pytest.raises(ValueError, match="storage"):
        HPOConfig(storage="optuna.db")


@pytest.mark.slow
def test_trials_are_nested_mlflow_runs(tmp_path):
    out = tmp_path / "run"
    train("pipeline=demand", "data.synthetic.n_sessions=800",
          f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", "demand.hpo.trials=3",
          "demand.model.n_estimators=60", run_dir=out)
    s = json.loads((out / "summary.json").read_text())
    assert s["hpo"]["trials_run"] == 3 and (out / "optuna.db").is_file()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    parent = client.get_run(s["mlflow"]["run_id"])
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(children) == 3
    values = sorted(c.data.metrics["validation_mean_pinball"] for c in children)
    assert values[0] == pytest.approx(s["hpo"]["best_value_validation_mean_pinball"])
