"""Runs the tests of tests/apps share: made once per session, in process, on the session's
MLflow server (tests/conftest.py `mlflow_server`); tests only read them."""

from __future__ import annotations

import pytest

from tests.helpers.entrypoints import train

# The registry test's model names on the session server (the walkthrough keeps the default
# names on a fresh server of its own, as the page runs; every other file has its own names)
REGISTRY_DEMAND, REGISTRY_ROUTER = "it-registry-demand", "it-registry-router"
REGISTRY_EXPERIMENT = "it-registry"


@pytest.fixture(scope="session")
def logged_demand_run(mlflow_server, tmp_path_factory) -> dict:
    """ONE tiny seeded demand run (600 synthetic sessions, 60 trees) logged to the session
    server and registered as version 1 of `REGISTRY_DEMAND`: the registry tests' v1 and the
    run `python -m export run_id=` rebuilds. Its summary, plus "dir"."""
    url, _store = mlflow_server
    out = tmp_path_factory.mktemp("logged-demand") / "run"
    run = train("pipeline=demand", "data.synthetic.n_sessions=600",
                "demand.model.n_estimators=60", f"tracking.uri={url}",
                f"tracking.experiment={REGISTRY_EXPERIMENT}",
                f"export.registry.names.demand={REGISTRY_DEMAND}", run_dir=out)
    return run.summary | {"dir": str(out)}
