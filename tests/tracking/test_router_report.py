"""The router's go/no-go report: from a real `train_router` run on a seeded outcomes table.

The table is synthetic outcomes-v1 (400 prompts x 2 candidates): the cheap candidate
solves 'easy' prompts and fails 'hard' ones, the strong one solves 90% of both, so a
router that reads the prompt can beat per-task rules. `embed` is a cheap stand-in for
the encoder (hashed bag of words), so the run takes seconds. The browser check reuses
the demand report's headless-Chromium helpers and skips without Chromium.
"""

from __future__ import annotations

import base64
import copy
import json
import math
import zlib

import numpy as np
import pandas as pd
import pytest

from replaylab.contracts import validate_outcomes
from replaylab.contracts.columns import Outcomes as O
from replaylab.pipelines.router import train_router
from replaylab.router.pipeline_config import router_config
from replaylab.tracking.router_report import write_router_report
from tests.helpers.reports import browse, ink, page_stderr_problems, parse_page

POLICIES = ("learned", "knn", "lgbm", "rules", "random", "cheap_only", "strong_only", "oracle")
HEADINGS = ["Router verdict: learned router against the rules", "At the served threshold",
            "Policies on the test split", "Off-policy evaluation",
            "Learning curve: how much live exploration", "Labels and exploration",
            "Router head", "Data and versions"]
PNG = b"\x89PNG\r\n\x1a\n"


def synthetic_outcomes(n: int = 400, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        hard, task = bool(rng.random() < 0.5), ("math", "chat")[i % 2]
        words = " ".join(f"w{w}" for w in rng.integers(0, 40, 6))
        text = f"{task} {'hard' if hard else 'easy'} question {words}"
        for cand, rate, cost in (("cheap", 0.05 if hard else 0.99, 2e-4), ("strong", 0.97, 1e-2)):
            ok = bool(rng.random() < rate)
            rows.append({O.VERSION: "1", O.PROMPT_ID: f"p{i:04d}", O.PROMPT_TEXT: text,
                         O.TASK: task, O.CANDIDATE: cand, O.SCORE: float(ok), O.SUCCESS: ok,
                         O.COST: cost, O.CURRENCY: "USD", O.PROMPT_TOKENS: 20 + len(text) // 4,
                         O.COMPLETION_TOKENS: 100})
    return pd.DataFrame(rows)


def embed(texts: list[str], dim: int = 32) -> np.ndarray:
    """Hashed bag of words: each word a fixed random vector; L2-normalized sums."""
    out = np.zeros((len(texts), dim), np.float32)
    for i, t in enumerate(texts):
        for w in t.split():
            out[i] += np.random.default_rng(zlib.crc32(w.encode())).normal(size=dim)
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


@pytest.fixture(scope="module")
def summary(tmp_path_factory) -> dict:
    checked = validate_outcomes(synthetic_outcomes())
    assert (checked.rows_valid, checked.rows_quarantined) == (800, 0)
    cfg = router_config({"candidates": ["cheap", "strong"], "go": {"n_boot": 200},
                         "evaluation": {"n_boot": 100}, "head": {"max_epochs": 5},
                         "lgbm_estimators": 30})
    s, _run = train_router(checked.valid, cfg, tmp_path_factory.mktemp("router_run"), embed)
    return json.loads(json.dumps(s))  # as the pipeline writes it to summary.json


@pytest.fixture(scope="module")
def report(summary, tmp_path_factory):
    return write_router_report(summary, tmp_path_factory.mktemp("router_report"))


def _text(path) -> str:
    return " ".join(" ".join(parse_page(path.read_text()).text).split())


def test_report_contents(summary, report):
    before = json.dumps(summary, sort_keys=True)
    page = parse_page(report.read_text())
    text = " ".join(" ".join(page.text).split())
    assert [h for h in HEADINGS if h not in page.headings] == []
    assert page.scripts == 0
    verdict = "GO" if summary["go"] else "NO-GO"
    assert f"{verdict} " in text and ("NO-GO" in text) == (not summary["go"])
    for r in summary["go_reasons"]:  # verbatim, GO or not
        assert " ".join(r.split()) in text
    assert [p for p in POLICIES if p not in text] == []
    assert f"{summary['ope']['truth']:.3f}" in text
    assert summary["rules"]["note"] in text
    assert "days of live exploration" in text and "0.05 of 10,000 sessions/day" in text
    # three figures, written and embedded, each a real picture
    figs = sorted((report.parent / "figures").glob("*.png"))
    assert [f.name for f in figs] == ["router_curves.png", "router_learning_curve.png",
                                      "router_ope.png"]
    assert all(f.read_bytes()[:8] == PNG and f.stat().st_size > 20_000 for f in figs)
    assert len(page.imgs) == 3
    assert all(base64.b64decode(i["src"].split(",", 1)[1])[:8] == PNG for i in page.imgs)
    assert "<td class=''>—</td>" in report.read_text()  # NaN APGR etc. of fixed policies
    assert "<td class=''>nan" not in report.read_text().lower()
    assert json.dumps(summary, sort_keys=True) == before  # not mutated


def test_no_go_shows_its_reasons(summary, tmp_path):
    s = copy.deepcopy(summary)
    reasons = ["cost saving vs rules 0 USD/prompt, 95% CI [0, 0] does not exclude zero",
               "quality vs rules -0.0200, CI lower bound -0.0400 < -0.01 <b>",
               "exploration rate above its cap"]
    s.update(go=False, go_reasons=reasons)
    path = write_router_report(s, tmp_path)
    text = _text(path)
    assert "NO-GO" in text
    assert all(r in text for r in reasons)
    assert "&lt;b&gt;" in path.read_text()  # escaped, not markup


def test_thin_evidence_names_its_objective_criteria_and_the_data_it_needs(summary, tmp_path):
    s = copy.deepcopy(summary)
    s.update(go=False, verdict="NOT ENOUGH EVIDENCE",
             objective={"kind": "incumbent", "label": "objective incumbent: the cheapest point "
                        "with quality >= the incumbent (rules) - 0.01"})
    s["go_detail"].update(
        criteria=[{"name": "quality vs rules", "estimate": 0.002, "ci": [-0.03, 0.034],
                   "line": -0.01, "side": "lower", "strict": False, "passed": False}],
        more_data={"text": "~1200 more test sessions (~0.1 days at 10000 per day)"})
    text = _text(write_router_report(s, tmp_path))
    assert "NOT ENOUGH EVIDENCE" in text and "objective incumbent" in text
    assert "quality vs rules" in text and "lower >= -0.01" in text and "fails" in text
    assert "More data would decide it: ~1200 more test sessions" in text


def _empty_curve(s):
    s["learning_curve"] = []
    s["go_detail"].update(explored_sessions_needed=None, days_needed=None)


def _no_ope_no_curves_file(s):
    del s["ope"]
    s["artifacts"]["curves"] = "/nonexistent/router_curves_test.parquet"


def _nan_everywhere(s):
    for t in s["test"].values():
        t.update(apgr=math.nan, quality=math.nan, ci={})
    s["go_detail"]["threshold"] = math.inf
    del s["go"], s["rules"], s["labels"]


@pytest.mark.parametrize("change", [_empty_curve, _no_ope_no_curves_file, _nan_everywhere])
def test_missing_pieces_still_render(summary, tmp_path, change):
    s = copy.deepcopy(summary)
    change(s)
    text = _text(write_router_report(s, tmp_path))
    assert "Data and versions" in text and "learned" in text
    if change is _empty_curve:
        assert "No learning curve in this run" in text
        assert not (tmp_path / "figures" / "router_learning_curve.png").exists()
    if change is _nan_everywhere:
        assert "NO-GO" in text and "summary.json has no go verdict" in text


def test_empty_summary(tmp_path):
    text = _text(write_router_report({}, tmp_path))
    assert "NO-GO" in text and "summary.json has no test scores" in text


@pytest.mark.timeout(180)
def test_report_renders_in_chromium(report):
    got = browse(report.resolve().as_uri())
    assert got["console_errors"] == [] and got["exceptions"] == [] and got["log_errors"] == []
    assert page_stderr_problems(got["stderr"], report.resolve().as_uri())[0] == []
    assert len(got["images"]) == 3
    for im in got["images"]:
        assert im["complete"] and im["w"] > 500 and im["cw"] > 300, im
        box = (int(im["x"]), int(im["y"]), int(im["cw"]), int(im["ch"]))
        assert ink(got["png"], box) > 0.02, im["alt"]
