"""scripts/fleet_results.py: table formatting, marker rewriting, and the markers of
docs/results-fleet.md (no experiment is run here)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


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
    text = (REPO / "docs" / "results-fleet.md").read_text()
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
