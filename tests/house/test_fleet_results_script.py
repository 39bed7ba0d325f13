"""scripts/fleet_results.py: table formatting, marker rewriting, and the markers of
docs/results/fleet.md (no experiment is run here)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fr():
    spec = importlib.util.spec_from_file_location("fleet_results",
                                                  REPO / "scripts" / "fleet_results.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # dataclasses look their module up
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)


POLICY = {"arrived": 19365, "completed": 19365, "rejected": 0, "timed_out": 0, "cancelled": 0,
          "slo_attainment": 1.0, "ttft_p99_s": 0.08222024802729522,
          "e2e_p99_s": 5.042695726567053, "goodput_rps": 47.034839744945586,
          "gpu_hours": 0.5718278935185185, "cost": 2.744773888888889,
          "joules_per_success": 56.76571296299628,
          "joules_per_output_token": 0.26886948053786786, "energy_provenance": "calibrated"}


def test_policy_row_prints_the_documents_digits(fr):
    row = " | ".join(str(c) for c in fr.policy_row("least_loaded", POLICY))
    assert row == ("least_loaded | 19365 | 19365 | 0 | 0 | 0 | 1.0000 | 0.082 | 5.04 | 47.0 "
                   "| 0.572 | 2.745 | 56.8 | 0.2689 | calibrated")
    assert [fr.sig3(x) for x in (0.0822, 1.3, 10.05, 108.11, None)] == [
        "0.0822", "1.30", "10.1", "108", "-"]
    assert [fr.ttft(x) for x in (0.6526, 3.9)] == ["0.653", "3.90"]


def test_ci_and_workload_line(fr):
    assert fr.ci({"mean": -0.1669, "ci95": [-0.4736, 0.1398], "n": 4}, "+.1f", 100) == (
        "-16.7 [-47.4, +14.0]")
    assert fr.ci({"mean": -0.19, "ci95": [None, None], "n": 1}, "+.0f", 100) == "-19 (n=1)"
    s = {"workload": {"source": "ledger", "file": "/x/y/mine.parquet", "fingerprint": "ab" * 32,
                      "rows_read": 400, "rows_quarantined": 0, "rows_used": 398,
                      "rows_skipped": {"absent_usage": 1, "prompt_absent": 0,
                                       "outside_windows": 1},
                      "rows_censored": {"length": 0, "cancelled": 2, "failed": 0},
                      "requests_simulated": 398, "windows": 4, "seeds": None,
                      "time_scale": 9000.0}}
    line = fr.workload_block(s, {}).splitlines()[-1]
    assert line == ("| ledger | `mine.parquet` | `abababababab` | 400 | 0 | 398 | absent_usage 1, "
                    "outside_windows 1 | cancelled 2 | 398 | 4 windows | 9000x |")


def test_write_doc_replaces_rendered_blocks_and_keeps_other_sets(fr, tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n<!-- fleet_results:a/runs -->\nold\n<!-- /fleet_results:a/runs -->\n"
                   "mid\n<!-- fleet_results:b/runs -->\nkeep me\n<!-- /fleet_results:b/runs -->\n")
    kept = fr.write_doc(doc, {"a/runs": "| new |"}, ["a"])
    text = doc.read_text()
    assert kept == ["b/runs"]
    assert "| new |" in text and "old" not in text and "keep me" in text
    assert text.startswith("intro\n<!-- fleet_results:a/runs -->\n\n| new |\n\n")
    assert fr.write_doc(doc, {"a/runs": "| new |"}, ["a"]) == ["b/runs"]   # idempotent
    assert doc.read_text() == text
    with pytest.raises(SystemExit, match="b/runs"):   # set b rendered, its block missing
        fr.write_doc(doc, {"a/runs": "| new |"}, ["a", "b"])


def test_every_marker_of_the_results_doc_names_a_block_the_script_renders(fr):
    text = (REPO / "docs" / "results" / "fleet.md").read_text()
    opened = re.findall(r"<!-- fleet_results:(\S+) -->\n", text)
    closed = re.findall(r"<!-- /fleet_results:(\S+) -->", text)
    assert opened and opened == closed
    assert len(fr.MARKER.findall(text)) == len(opened)
    for block_id in opened:
        set_name, _, block = block_id.partition("/")
        assert set_name in fr.SETS, block_id
        exp, _, name = block.partition(".")
        assert block in ("runs", "tokens") or name in fr.BLOCKS[exp], block_id
        assert block in ("runs", "tokens") or exp in fr.SETS[set_name].experiments, block_id


SIM = "simulated saturation run"
OLD_LOAD = {"offered_rps": 66.4, "capacity_rps": 207.5, "ratio": 0.32,   # formula-based
            "pools": {"h100": 100.0, "b200": 107.5}}
NEW_LOAD = {"offered_rps": 66.4, "capacity_rps": 88.5, "capacity_source": SIM,
            "ratio": 66.4 / 88.5, "formula_rps": 207.5, "formula_ratio": 0.32,
            "formula_over_simulated": 207.5 / 88.5, "pools": {"h100": 40.0, "b200": 48.5}}
OVERLOAD_CAPACITY = {
    "source": SIM, "req_per_s": 44.2, "rps": 44.2, "simulated_req_per_s": 44.2,
    "formula_req_per_s": 53.3, "formula_over_simulated": 53.3 / 44.2, "stated": False,
    "duration_s": 812.0, "simulated": {"requests": 40000, "completions": 35891,
                                       "duration_s": 812.0, "req_per_s": 44.2}}
OVERLOAD_LOADS = {
    "0.7x": {"factor": 0.7, "target_rps": 30.94, "offered_rps": 28.8,
             "served_rps": {"least_loaded": 28.8, "admission_none": 28.7},
             "served_over_offered": {"least_loaded": 1.0, "admission_none": 0.9965}},
    "2x": {"factor": 2.0, "target_rps": 88.4, "offered_rps": 87.1,
           "served_rps": {"least_loaded": 43.0, "admission_none": 40.1},
           "served_over_offered": {"least_loaded": 0.4937, "admission_none": 0.4604}}}


def _rows(block):
    return [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()]


def test_runs_table_sets_offered_load_against_the_simulated_capacity(fr):
    summary = {"workload": {"requests_simulated": 19365}}
    overload = {"experiment": "overload", "workload": {"requests_simulated": 82815},
                "capacity": OVERLOAD_CAPACITY, "loads": OVERLOAD_LOADS}
    rows = _rows(fr.runs_block({
        "energy": (summary, {"load": NEW_LOAD, "wall_s": 13.4, "max_rss_mb": 422}),
        "stale_telemetry": (summary, {"load": OLD_LOAD, "wall_s": 7.5, "max_rss_mb": 425}),
        "hint_admission": ({"workload": {"requests_simulated": 4619}}, {"wall_s": 68.4}),
        "overload": (overload, {"wall_s": 12.0, "max_rss_mb": 461})}))
    assert rows[0] == ["experiment", "requests simulated", "offered req/s",
                       "capacity req/s (simulated)", "offered / capacity",
                       "formula / simulated", "wall s", "peak RSS MB"]
    # the simulated capacity, not the formula's 207.5 (offered / formula = 0.32)
    assert rows[2] == ["energy", "19365", "66.4", "88.5", "0.75", "2.34", "13.4", "422"]
    # a formula-based load (run.json from before) is not shown as a simulated capacity
    assert rows[3] == ["stale_telemetry", "19365", "66.4", "-", "-", "-", "7.5", "425"]
    assert rows[4] == ["hint_admission", "4619", "-", "-", "-", "-", "68.4", "-"]
    # overload: its own capacity, the offered rate of every load factor as a range
    assert rows[5] == ["overload", "82815", "28.8-87.1", "44.2", "0.65-1.97", "1.21", "12.0",
                       "461"]


def test_overload_capacity_block_reads_the_source_and_shows_the_formula_beside_it(fr):
    text = fr.overload_capacity({"capacity": OVERLOAD_CAPACITY, "loads": OVERLOAD_LOADS}, {})
    first, _, rest = text.partition("\n\n")
    assert first == ("Capacity used for the load factors: 44.2 req/s (simulated saturation "
                     "run: 40,000 requests, 35,891 completions in a 812 s window); formula "
                     "said 53.3 (1.21x the simulated).")
    assert "estimated" not in text and "KV-limited" not in text
    assert _rows(rest) == [
        ["load", "target req/s", "offered req/s", "served least_loaded (/ offered)",
         "served admission_none (/ offered)"], ["---"] * 5,
        ["0.7x", "30.9", "28.8", "28.8 (1.00)", "28.7 (1.00)"],
        ["2x", "88.4", "87.1", "43.0 (0.49)", "40.1 (0.46)"]]
    stated = {**OVERLOAD_CAPACITY, "source": "stated (experiment.capacity_rps)",
              "req_per_s": 50.0, "rps": 50.0, "stated": True,
              "formula_over_simulated": 53.3 / 44.2}
    assert fr.overload_capacity({"capacity": stated}, {}) == (
        "Capacity used for the load factors: 50.0 req/s (stated (experiment.capacity_rps); "
        "the saturation run measured 44.2 req/s); formula said 53.3 (1.21x the simulated).")
    # a summary from before issue 30.5: the formula, said to be one
    old = {"rps": 19.3, "stated": False, "estimated": {"rps": 19.3, "pools": {}}}
    assert "analytic formula" in fr.overload_capacity({"capacity": old}, {})


def test_refresh_recomputes_only_formula_based_loads(fr, tmp_path):
    run = {"load": NEW_LOAD, "overrides": []}
    assert fr.refreshed("energy", run, tmp_path) is run           # already simulated
    assert fr.refreshed("overload", {"wall_s": 1.0}, tmp_path) == {"wall_s": 1.0}
    with pytest.raises(SystemExit, match="no overrides"):        # old load, cannot redo
        fr.refreshed("rollout", {"load": OLD_LOAD}, tmp_path)
