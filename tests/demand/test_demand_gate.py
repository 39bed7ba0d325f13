"""One story per verdict (issue 30): the demand gate, the report and the registry agree.

The gate is computed once (`replaylab.demand.gate`) from the rows the report's
figures are computed on; the report renders that dict, the registry reads it off the
manifest. These tests build the gate from rows, render the report from a summary that
carries it, and read it back through the registry's tag function: the three verdicts
are the same figures' verdict, GO and NO-GO alike.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from replaylab.apps.registry import NO_GATE, demand_gate, version_tags
from replaylab.demand.gate import COVERAGE_BAND, coverage_target, gate_from_rows, within_target
from replaylab.demand.metrics import (
    bootstrap_means,
    interval_metrics,
    paired_pinball_delta,
    row_figures,
)
from replaylab.tracking.demand_report import gate_verdict, write_demand_report
from replaylab.tracking.html import escape
from tests.helpers.reports import QS, fake_predictions, fake_summary

LEVEL = 0.8


def rows(n: int = 3000, seed: int = 3, model_sd: float = 0.7, width: float = 1.0):
    """Labelled rows of 300 sessions: y, the model's quantiles and interval, two baselines."""
    rng = np.random.default_rng(seed)
    session = rng.integers(0, 300, n)
    mu = rng.normal(5.5, 0.8, n) + rng.normal(0, 0.3, 300)[session]
    y = np.exp(mu + rng.normal(0, 0.7, n))
    z = np.array([-1.2816, 0.0, 1.2816])
    model_q = np.exp(mu[:, None] + model_sd * z[None, :])
    lo, hi = np.exp(mu + width * 0.7 * z[0]), np.exp(mu + width * 0.7 * z[2])
    flat = np.exp(np.full((n, 1), 5.5) + 1.1 * z[None, :])
    cap = np.full((n, 3), 4096.0)
    return y, model_q, lo, hi, {"prompt_length": flat, "max_tokens_cap": cap}, session


def test_figures_and_intervals_are_the_metrics_means():
    y, q, lo, hi, base, session = rows()
    per_row = row_figures(y, q, lo, hi, QS)
    m = interval_metrics(y, q, lo, hi, QS)
    for k in ("mean_pinball", "coverage", "mean_width", "mae_p50"):
        assert per_row[k].mean() == pytest.approx(m[k], rel=1e-12)
    for t in ("0.1", "0.5", "0.9"):
        assert per_row[f"pinball.{t}"].mean() == pytest.approx(m["pinball"][t], rel=1e-12)
    ci = bootstrap_means(per_row, session, 400, 0)
    for k, (a, b) in ci.items():
        assert a <= per_row[k].mean() <= b, k
    # paired: the interval of a difference is that of the per-row differences, same draws
    d = paired_pinball_delta(y, q, base["prompt_length"], QS, session, 400, 0)
    assert d["delta"] == pytest.approx(
        m["mean_pinball"] - interval_metrics(y, base["prompt_length"], lo, hi, QS)
        ["mean_pinball"], rel=1e-9)
    assert d["ci"][0] <= d["delta"] <= d["ci"][1] and d["resampled"] == "sessions"


def test_gate_needs_the_band_and_a_significant_win_over_the_best_baseline():
    y, q, lo, hi, base, session = rows()
    g = gate_from_rows(LEVEL, y, q, lo, hi, base, QS, session, 400, 0)
    assert g["vs_best_baseline"]["baseline"] == "prompt_length"  # the cap is far worse
    assert g["vs_best_baseline"]["ci"][1] < 0 and g["coverage"]["ok"] is within_target(
        g["coverage"]["value"], LEVEL)
    assert g["go"] == g["coverage"]["ok"]
    assert "0.77–0.83" in g["rule"] and "session-bootstrap" in g["rule"]
    # an interval too narrow: coverage outside the band, NO-GO whatever the pinball says
    narrow = gate_from_rows(LEVEL, y, q, *rows(width=0.5)[2:4], base, QS, session, 400, 0)
    assert not narrow["coverage"]["ok"] and not narrow["go"]
    assert "outside the target 0.77–0.83" in narrow["reasons"][0]
    # a baseline as good as the model (the model itself): no significant win, NO-GO
    tie = gate_from_rows(LEVEL, y, q, lo, hi, {"copy": q.copy()}, QS, session, 400, 0)
    assert tie["vs_best_baseline"]["ci"][1] >= 0 and not tie["go"]
    assert "does not beat it" in tie["reasons"][1]
    assert coverage_target(LEVEL) == pytest.approx((LEVEL - COVERAGE_BAND, LEVEL + COVERAGE_BAND))


def _verdict_in(html: str) -> str:
    m = re.search(r"<span class='gate-verdict [a-z]+'>([A-Z -]+)</span>", html)
    assert m, "the report prints no gate verdict"
    return m.group(1)


@pytest.mark.parametrize("model_sd", [0.7, 0.2])
def test_report_and_registry_tell_the_gates_verdict_on_the_same_figures(model_sd, tmp_path):
    """The fake run's rows -> the gate; the report rendered from that summary prints the
    gate's verdict and rule; the registry's tags (read off a manifest holding the same
    dict) say the same. model_sd 0.2: quantiles far too narrow, so pinball loses."""
    pred = fake_predictions()
    ev = pred[pred["y"].notna() & ~pred["censored"] & ~pred["absent_usage"]]
    y = ev["y"].to_numpy(float)
    centre = np.log(ev["model-q0.5"].to_numpy(float))
    z = np.array([-1.2816, 0.0, 1.2816])
    pred = pred.copy()
    for j, t in enumerate(QS):
        pred.loc[ev.index, f"model-q{t}"] = np.exp(centre + model_sd * z[j])
    ev = pred.loc[ev.index]
    session = np.arange(len(ev)) // 3  # three rows a session
    qcols = [f"model-q{t}" for t in QS]
    g = gate_from_rows(LEVEL, y, ev[qcols].to_numpy(float), ev["model-lo-80"].to_numpy(float),
                       ev["model-hi-80"].to_numpy(float),
                       {p: ev[[f"{p}-q{t}" for t in QS]].to_numpy(float)
                        for p in ("prompt_length", "max_tokens_cap", "category_bucket",
                                  "session_ewma")}, QS, session, 300, 0)
    summary = fake_summary(pred) | {"gate": g}
    html = write_demand_report(pred, summary, tmp_path).read_text()
    assert _verdict_in(html) == gate_verdict(g) == ("GO" if g["go"] else "NO-GO")
    assert escape(g["rule"]) in html
    for reason in g["reasons"]:
        assert escape(reason) in html
    # the coverage target row's badge is the gate's coverage verdict
    manifest = {"kind": "demand", "content_hash": "sha256:x", "version": "1.0.0",
                "valid_until": "2099-01-01", "calibration": {"level": LEVEL},
                "training": {"headline": {"test_coverage": g["coverage"]["value"]}, "gate": g}}
    tags = version_tags(manifest, None)
    assert tags["replaylab.go"] == str(g["go"]).lower()
    assert tags["replaylab.go_reasons"] == "; ".join(g["reasons"])
    assert tags["replaylab.gate_rule"] == g["rule"]
    if model_sd == 0.2:
        assert not g["go"]


def test_a_manifest_without_a_gate_is_refused():
    ok, why, gate = demand_gate({"kind": "demand", "training": {"headline": {
        "test_coverage": 0.8}}})
    assert (ok, why, gate) == (False, NO_GATE, {})
    assert "no gate recorded" in why


def test_report_without_a_gate_says_so(tmp_path):
    pred = fake_predictions(n=600)
    html = write_demand_report(pred, fake_summary(pred), tmp_path).read_text()
    assert "no gate recorded in summary.json" in html


def test_groups_in_train_but_absent_from_test_are_listed_and_reported(tmp_path):
    import pandas as pd

    from replaylab.demand.baselines import bucket_keys
    from replaylab.pipelines.demand_figures import groups_absent

    def values(frame, cols):  # what the project stage keeps per group column
        keys = bucket_keys(frame, cols)
        return {by: set(map(str, keys[by])) for by in cols}

    cols = ["category", "selected_model", "missing_col"]
    train = pd.DataFrame({"category": ["chat", "code", "math", None],
                          "selected_model": ["a", "a", "b", "b"]})
    test = pd.DataFrame({"category": ["chat", "chat"], "selected_model": ["a", "b"]})
    got = groups_absent(values(train, cols), values(test, cols), cols)
    assert got == {"category": ["<none>", "code", "math"]}
    assert groups_absent(values(test, ["category"]), values(train, ["category"]),
                         ["category"]) == {}
