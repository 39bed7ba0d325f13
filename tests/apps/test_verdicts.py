"""One story per verdict: the line, the run tags and the report stamp are read off the summary."""

from __future__ import annotations

from replaylab.apps.verdicts import (
    RUN_FACTS_MARK,
    run_facts,
    run_tags,
    stamp_html,
    summary_go,
    verdict_line,
)


def test_demand_line_is_the_gates_verdict_and_reasons():
    gate = {"go": False, "reasons": ["coverage 0.807 within 0.77-0.83", "does not beat it"]}
    line = verdict_line({"pipeline": "demand", "gate": gate})
    assert line == "demand: NO-GO (coverage 0.807 within 0.77-0.83; does not beat it)"
    assert summary_go({"pipeline": "demand", "gate": gate}) is False
    assert verdict_line({"pipeline": "demand"}).startswith("demand: no verdict")


def test_router_lines_in_both_modes():
    s = {"pipeline": "router", "go": True, "verdict": "GO",
         "go_reasons": ["objective incumbent: ...; GO: saves 0.001 USD/prompt"],
         "test": {"learned": {"cost_ratio_at_95": 0.6061, "quality": 0.8512, "cost": 0.00712}},
         "headline": {"cost_vs_strong_only": 0.5765, "cost_vs_incumbent": 0.6012,
                      "incumbent": "rules"},
         "spread": {"seeds": [0, 1, 2], "cost": {"min": 0.0069, "max": 0.0074}}}
    assert verdict_line(s) == (
        "router: GO (objective incumbent: ...; GO: saves 0.001 USD/prompt); served point on "
        "test: quality 0.851, cost 0.00712 USD/prompt (over head seeds [0, 1, 2]: "
        "0.0069..0.0074) = 0.577 of strong-only, 0.601 of rules; curve figure "
        "cost_ratio_at_95 0.606")
    r = {"pipeline": "router", "mode": "receipts", "go": False, "go_reasons": ["CI spans 0"]}
    assert verdict_line(r) == "router: NO-GO (CI spans 0)"
    thin = {**r, "verdict": "NOT ENOUGH EVIDENCE"}
    assert verdict_line(thin) == "router: NOT ENOUGH EVIDENCE (CI spans 0)"
    # after the run, summary["verdict"] is this line; the word stays in go_detail (run names)
    from replaylab.apps.verdicts import verdict_word

    done = {**r, "verdict": verdict_line(thin), "go_detail": {"verdict": "NOT ENOUGH EVIDENCE"}}
    assert verdict_word(done) == "NOT ENOUGH EVIDENCE" and verdict_line(done).startswith(
        "router: NOT ENOUGH EVIDENCE (")


def test_promote_lines_say_promoted_refused_or_forced_and_name_the_run():
    base = {"pipeline": "export", "action": "promote"}
    p = {"name": "replaylab-router", "version": 3, "alias": "champion",
         "reasons": ["go=false: quality below"], "reason": "incident 42"}
    for decision, word in (("promoted", "PROMOTED"), ("refused", "REFUSED"),
                           ("forced", "FORCED")):
        s = {**base, "promotion": {**p, "decision": decision}}
        line = verdict_line(s)
        assert line.startswith(f"promote replaylab-router v3->champion: {word} (")
        assert "go=false: quality below" in line
        assert ("incident 42" in line) == (decision == "forced")
        tags = run_tags(s)
        # the decision first (the runs list truncates from the right); a forced promotion
        # is not a GO and says forced
        assert tags["mlflow.runName"] == f"{word} promote router v3->champion"
        assert tags["go"] == str(decision == "promoted").lower()
        assert tags["forced"] == str(decision == "forced").lower()


def test_fetch_line_says_forced_and_ungated():
    f = {"name": "m", "version": 2, "alias": "champion", "path": "serve/m",
         "content_hash": "sha256:abc"}
    s = {"pipeline": "export", "action": "fetch", "fetch": f}
    assert "verified, served at serve/m" in verdict_line(s)
    forced = verdict_line({**s, "fetch": {**f, "forced": True, "forced_reason": "incident"}})
    assert "FORCED" in forced and "incident" in forced
    ungated = verdict_line({**s, "fetch": {**f, "allowed_ungated": True,
                                           "ungated_reason": "alias moved by hand"}})
    assert "UNGATED" in ungated and "alias moved by hand" in ungated


def test_every_pipeline_has_a_line():
    for s in ({"pipeline": "project", "rows_read": 10, "rows_valid": 9, "rows_quarantined": 1},
              {"pipeline": "forecast", "best": "mstl", "targets": {"a": True},
               "backtest": {"mstl": {"mase": 0.8, "coverage_80": 0.8},
                            "seasonal_naive": {"mase": 1.0}}},
              {"pipeline": "fleet", "experiment": "overload", "conserved": True,
               "policies": {"least_loaded": {"slo_attainment": {"mean": 0.9,
                                                                "ci95": [0.8, 0.95]}}}},
              {"pipeline": "export", "action": "register", "source": "d",
               "registry": [{"name": "m", "version": 1}], "relogged": {"metrics": 5}}):
        line = verdict_line(s)
        assert line.split(":")[0] and "None" not in line, line
    assert "targets met" in verdict_line({"pipeline": "forecast", "best": "mstl",
                                          "targets": {"a": True}, "backtest": {}})
    auto = {"pipeline": "fleet", "experiment": "autoscaling", "conserved": True,
            "winners": {"steady": {"policy": "forecast", "gpu_hours": 1663.8,
                                   "slo_attainment": 0.99978}}}
    assert verdict_line(auto) == ("fleet autoscaling: requests conserved; steady: forecast wins "
                                  "(1664 GPU-hours at SLO 0.9998)")
    assert "0.900 [0.800, 0.950]" in verdict_line(
        {"pipeline": "fleet", "experiment": "x", "conserved": True,
         "policies": {"p": {"slo_attainment": {"mean": 0.9, "ci95": [0.8, 0.95]}}}})


def test_an_import_line_ends_with_what_the_ledger_is_ready_for():
    counts = {"pipeline": "import", "rows_read": 16, "rows_valid": 13, "rows_quarantined": 3}
    assert verdict_line(counts) == "import: 16 rows read, 13 valid, 3 quarantined"
    ready = {**counts, "readiness": {"line": "ready: demand: usage on 90% of 10 completed rows"}}
    assert verdict_line(ready) == ("import: 16 rows read, 13 valid, 3 quarantined; ready: "
                                   "demand: usage on 90% of 10 completed rows")


def test_residuals_line_reads_coverage_and_drift_off_the_summary():
    s = {"pipeline": "residuals", "rows": 1275, "nominal": 0.8,
         "overall": {"hinted": 1275, "scored": 1148, "coverage": 0.7831, "nominal": 0.8,
                     "coverage_ci95": [0.7581, 0.8066]},
         "drift": {"flagged": 2, "groups_flagged": ["category=rag"]}}
    assert verdict_line(s) == ("residuals: 1148 of 1275 hinted rows scored; 80% coverage "
                               "0.783 [0.758, 0.807]; drift: 2 buckets flagged, groups "
                               "flagged: category=rag")
    bare = verdict_line({"pipeline": "residuals", "drift": {"flagged": 0}})
    assert "n/a" in bare and "groups flagged" not in bare


def test_the_report_stamp_carries_the_run_facts_once(tmp_path):
    page = tmp_path / "r.html"
    page.write_text("<!doctype html><html><body><h1>Report</h1></body></html>")
    s = {"pipeline": "demand", "gate": {"go": True, "reasons": ["ok"]},
         "splits": {"rows": {"test": 12}},
         "time_window": {"test": {"first_ms": 1700092800018, "last_ms": 1700109161597}},
         "mlflow": {"run_id": "abc", "tracking_uri": "http://127.0.0.1:5000",
                    "experiment_id": "3"}}
    facts = run_facts(s, "deadbeef")
    assert facts["run"] == ("http://127.0.0.1:5000/#/experiments/3/runs/abc"
                            "?workflowType=machine_learning")  # the classic run page
    assert facts["test window"] == "2023-11-16 00:00 to 2023-11-16 04:32 UTC; 12 test rows"
    assert facts["verdict"] == "demand: GO (ok)" and facts["commit"] == "deadbeef"
    stamp_html(page, facts)
    stamp_html(page, {**facts, "verdict": "demand: NO-GO (changed)"})  # replaced, not added
    text = page.read_text()
    assert text.count(RUN_FACTS_MARK) == 2 and "NO-GO (changed)" in text
    assert "demand: GO (ok)" not in text and text.index("run-facts") < text.index("<h1>")
    assert "not tracked" in run_facts({"pipeline": "project"}, None)["run"]
