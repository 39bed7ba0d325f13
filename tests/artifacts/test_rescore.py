"""replaylab.artifacts.rescore_demand without MLflow: an artifact scored on a run's test rows.

Two tiny seeded `pipeline=demand` runs (tracking off) on two ledgers (600 and 800
sessions). A run's own artifact, scored on its own test rows by the runtime and
the pipeline's metric code, must reproduce the pipeline's test scores (overall
and group by group); the rows re-derived from the ledger must be the run
folder's; another artifact scored on those rows must differ from its own scores
(they are other rows), and the comparison is on the levels both predict.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from replaylab.artifacts.rescore_demand import (
    compare_scores,
    ledger_test_rows,
    run_test_rows,
    score_artifact,
)
from replaylab.config import from_mapping
from replaylab.contracts.ledger import read_ledger
from replaylab.projection import ProjectionConfig, SplitConfig
from replaylab.projection.requests import requests
from replaylab.runtime import DemandPredictor
from tests.helpers.entrypoints import train

pytestmark = pytest.mark.slow  # two tiny training runs (~40 s on 2 cores)
GROUPS = ("selected_model", "category", "slo_class")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("rescore")
    out = {}
    for name, sessions in (("a", 600), ("b", 800)):
        out[name] = tmp / name
        train("pipeline=demand", "tracking=off", f"data.synthetic.n_sessions={sessions}",
              "demand.model.n_estimators=40", run_dir=out[name])
    return out


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def rows_of(run: Path):
    return run_test_rows(run / "features.parquet", run / "predictions_test.parquet")


def predictor(run: Path) -> DemandPredictor:
    p = DemandPredictor.load(run / "artifacts" / "demand", online=False)
    assert p.loaded
    return p


def test_an_artifact_on_its_own_rows_reproduces_the_pipeline_scores(runs):
    for run in runs.values():
        s = summary(run)
        got = score_artifact(predictor(run), rows_of(run), GROUPS)
        assert got["rows"] == s["test"]["rows"]
        assert got["labelled_rows"] == got["scored_rows"] == s["test"]["labelled_rows"]
        assert got["fallback"] == {} and got["quantiles"] == [0.1, 0.5, 0.9]
        for k in ("mean_pinball", "coverage", "mean_width", "mae_p50", "coverage_raw"):
            assert got["model"][k] == pytest.approx(s["test"]["model"][k], rel=1e-6), k
        want = {(g["by"], g["value"]): g for g in s["test"]["groups"]}
        assert {(g["by"], g["value"]) for g in got["groups"]} == set(want)
        for g in got["groups"]:
            w = want[(g["by"], g["value"])]
            assert g["n"] == w["n"] and g["coverage"] == pytest.approx(w["coverage"])
            assert g["mean_pinball"] == pytest.approx(w["mean_pinball"], rel=1e-6)


def test_rows_from_the_ledger_are_the_run_folders(runs):
    run = runs["b"]
    s = summary(run)
    p = s["projection"]
    rows = ledger_test_rows(read_ledger(run / "ledger.parquet").valid,
                            from_mapping(ProjectionConfig, {
                                "ewma_alpha": p["ewma_alpha"],
                                "assume_ended_before_next": p["assume_ended_before_next"]},
                                "projection"),
                            from_mapping(SplitConfig, p["split_config"], "split"))
    ref = rows_of(run)
    assert rows.fingerprint == s["ledger_fingerprint"]
    assert list(rows.frame["request_id"]) == list(ref.frame["request_id"])
    np.testing.assert_array_equal(rows.usable, ref.usable)
    np.testing.assert_array_equal(np.nan_to_num(rows.y, nan=-1), np.nan_to_num(ref.y, nan=-1))


def test_another_artifact_on_these_rows_is_scored_on_them(runs):
    rows = rows_of(runs["b"])
    own_b = score_artifact(predictor(runs["b"]), rows, GROUPS)
    a_on_b = score_artifact(predictor(runs["a"]), rows, GROUPS)
    a_own = summary(runs["a"])["test"]["model"]
    assert a_on_b["scored_rows"] == own_b["scored_rows"]
    assert a_on_b["model"]["mean_pinball"] != pytest.approx(a_own["mean_pinball"])
    cmp = compare_scores(own_b, a_on_b)
    assert cmp["levels"] == ["0.1", "0.5", "0.9"]
    assert cmp["delta_mean_pinball"] == pytest.approx(
        own_b["model"]["mean_pinball"] - a_on_b["model"]["mean_pinball"])
    assert cmp["challenger_better"] == (cmp["delta_mean_pinball"] < 0)
    # only the levels both predict are compared
    fewer = {**a_on_b, "quantiles": [0.5, 0.9]}
    assert compare_scores(own_b, fewer)["levels"] == ["0.5", "0.9"]


def test_a_first_turn_is_sent_without_history():
    import pandas as pd

    frame = pd.DataFrame({"request_id": ["r1", "r2"], "prompt_tokens": [10, 20],
                          "hist_turns_dispatched": [0, 2], "hist_completion_mean": [None, 5.0],
                          "label_secret": [1, 2]})
    first, later = requests(frame)
    assert first == {"request_id": "r1", "prompt_tokens": 10}
    assert later["hist_turns_dispatched"] == 2 and later["hist_completion_mean"] == 5.0
    assert "label_secret" not in later  # only pre-dispatch fields and history
