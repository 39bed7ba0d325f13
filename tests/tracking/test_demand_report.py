"""The demand report: contents from a seeded fake run, and rendering in headless Chromium.

The fake predictions and summary follow the pipeline's interface (predictions_test.parquet
columns, summary.json keys) but are built here, independent of the demand pipeline.

The browser test needs Debian's ``chromium`` (``make test`` installs it when missing). It
drives Chromium over the DevTools protocol on a pipe (``--remote-debugging-pipe``: fds 3/4,
NUL-terminated JSON; no websocket client needed), which gives console messages with their
level, uncaught exceptions, failed loads, each image's decoded size and a full-page
screenshot. The screenshot is kept under tests/screenshots/ and in pytest's tmp dir.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from replaylab.tracking.demand_figures import demand_figures
from replaylab.tracking.demand_report import write_demand_report
from tests.helpers.reports import (
    FINGERPRINT,
    PREDICTORS,
    browse,
    dump_dom,
    fake_predictions,
    fake_summary,
    ink,
    page_stderr_problems,
    parse_page,
)

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tests" / "screenshots"
HEADINGS = ["Demand model: total tokens before dispatch", "Targets", "Model against baselines",
            "Best baseline per metric", "Reliability", "Coverage and pinball per group",
            "By selected_model", "By category", "By slo_class", "Residuals",
            "Predicted against actual", "Censored, cancelled and absent usage",
            "Data and versions"]


# ---------------------------------------------------------------- fake run


@pytest.fixture(scope="module")
def fake_run():
    pred = fake_predictions()
    return pred, fake_summary(pred)


@pytest.fixture(scope="module")
def report(fake_run, tmp_path_factory) -> Path:
    pred, summary = fake_run
    return write_demand_report(pred, summary, tmp_path_factory.mktemp("demand_report"))


# ---------------------------------------------------------------- contents (no browser)
def test_report_contents(fake_run, report):
    pred, summary = fake_run
    before = json.dumps(summary, sort_keys=True)
    page = parse_page(report.read_text())
    text = " ".join(" ".join(page.text).split())
    assert [h for h in HEADINGS if h not in page.headings] == []
    assert page.scripts == 0
    # every figure is embedded as a PNG data URI, one per file written
    figs = sorted((report.parent / "figures").glob("*.png"))
    assert len(page.imgs) == len(figs) >= 7
    for img in page.imgs:
        assert img["src"].startswith("data:image/png;base64,")
        assert base64.b64decode(img["src"].split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    # provenance, versions, counts
    assert FINGERPRINT[:16] in text and "projection-v1" in text
    n_scored = int((pred["y"].notna() & ~pred["censored"] & ~pred["absent_usage"]).sum())
    assert f"measured on {n_scored:,} scored test rows" in text
    assert "not reported by this run" in text  # no cancelled column, no labels.cancelled
    assert "agrees with summary" in text
    # the baseline that beats the model at q0.1 is named plainly
    assert "session_ewma beats the model on pinball q0.1" in text
    assert "n < 200: not held to the band" in text  # the small 'rare' category
    assert json.dumps(summary, sort_keys=True) == before  # the summary is not mutated


def test_figures_alone(fake_run, tmp_path):
    pred, summary = fake_run
    paths = demand_figures(pred, summary, tmp_path)
    assert {"baselines", "reliability", "residuals", "scatter", "groups_category",
            "groups_selected_model", "groups_slo_class"} <= set(paths)
    assert all(p.stat().st_size > 5_000 for p in paths.values())


def test_parquet_round_trip_with_nullable_dtypes(fake_run, tmp_path):
    """predictions_test.parquet may come back with Float64 / boolean columns holding NA."""
    pred, summary = fake_run
    pred = pred.convert_dtypes(convert_string=False, convert_integer=False)
    pred.loc[pred.index[:5], "session_ewma-q0.5"] = pd.NA
    pred.to_parquet(tmp_path / "predictions_test.parquet")
    back = pd.read_parquet(tmp_path / "predictions_test.parquet")
    assert str(back["y"].dtype) == "Float64" and str(back["censored"].dtype) == "boolean"
    page = parse_page(write_demand_report(back, summary, tmp_path).read_text())
    assert len(page.imgs) >= 7


def test_cancelled_rows_are_counted_and_scored_apart(fake_run, tmp_path):
    pred, summary = fake_run
    pred = pred.assign(cancelled=False)
    pred.loc[pred.index[:40], "cancelled"] = True
    summary = {**summary, "labels": {**summary["labels"], "cancelled": 130}}
    text = " ".join(parse_page(write_demand_report(pred, summary, tmp_path).read_text()).text)
    assert "not reported by this run" not in text
    assert "Lower-bounded rows" in text and "130" in text


def test_label_classes_from_the_pipeline(fake_run, tmp_path):
    """The pipeline's frame carries label_class (label, length, cancelled, failed,
    absent_usage, prompt_absent) and its groups name their best baseline."""
    pred, summary = fake_run
    pred = pred.copy()
    cls = np.where(pred["absent_usage"], "absent_usage",
                   np.where(pred["censored"], "length", "label")).astype(object)
    cens = np.flatnonzero(pred["censored"].to_numpy())
    cls[cens[:30]], cls[cens[30:40]] = "cancelled", "failed"
    lab = np.flatnonzero(cls == "label")[:25]
    cls[lab] = "prompt_absent"
    pred.loc[pred.index[lab], "y"] = np.nan
    pred["label_class"], pred["cancelled"] = cls, cls == "cancelled"
    summary = json.loads(json.dumps(summary))
    summary["labels"].update(censored_by_reason={"length": 700, "cancelled": 200, "failed": 100},
                             prompt_absent=90)
    for g in summary["test"]["groups"]:
        g.update(best_baseline="category_bucket", best_baseline_mean_pinball=999.0)
    text = " ".join(" ".join(
        parse_page(write_demand_report(pred, summary, tmp_path).read_text()).text).split())
    for c, n_test, n_all in (("length", len(cens) - 40, 700), ("cancelled", 30, 200),
                             ("failed", 10, 100), ("prompt_absent", 25, 90)):
        assert f"{c} {n_test:,} {n_all:,}" in text, c
    assert "Lower-bounded rows" in text and "not reported by this run" not in text
    assert "best baseline's mean pinball from summary.json" in text
    assert "999.0 (category_bucket)" in text


def _drop_baselines(pred, summary):
    summary = json.loads(json.dumps(summary))
    summary["test"]["baselines"] = {}
    return pred[[c for c in pred if not any(c.startswith(f"{b}-") for b in PREDICTORS[1:])]], \
        summary


def _no_groups_no_reliability(pred, summary):
    summary = json.loads(json.dumps(summary))
    del summary["test"]["groups"], summary["test"]["reliability"]
    return pred, summary


def _nan_baseline(pred, summary):
    cols = [c for c in pred if c.startswith("session_ewma-")]
    return pred.assign(**{c: np.nan for c in cols}), summary


def _unknown_group(pred, summary):
    summary = json.loads(json.dumps(summary))
    summary["test"]["groups"].append({"by": "region", "value": "eu", "n": 300,
                                      "coverage": 0.6, "pinball": {}})
    return pred, summary


def _tiny(pred, summary):
    return pred.head(4), fake_summary(pred.head(4))


@pytest.mark.parametrize("change", [_drop_baselines, _no_groups_no_reliability, _nan_baseline,
                                    _unknown_group, _tiny])
def test_partial_inputs_still_render(fake_run, tmp_path, change):
    pred, summary = change(*fake_run)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        page = parse_page(write_demand_report(pred, summary, tmp_path).read_text())
    assert "Data and versions" in page.headings and page.imgs


def test_nothing_trained_says_why(tmp_path):
    pred = fake_predictions(n=50)
    pred["y"] = np.nan
    pred["absent_usage"] = True
    summary = {"pipeline": "demand", "rows_read": 50, "rows_valid": 50, "rows_quarantined": 0,
               "labels": {"train": 0, "calibration": 0, "test": 50, "censored": 0,
                          "absent_usage": 50},
               "interval": 0.8, "error": "no usable labels: every row lacks usage",
               "ledger_fingerprint": "abc", "projection": {"version": "projection-v1"}}
    page = parse_page(write_demand_report(pred, summary, tmp_path).read_text())
    text = " ".join(page.text)
    assert "Nothing could be trained or scored" in text and "no usable labels" in text
    assert page.imgs == [] and "Data and versions" in page.headings
    # an empty frame with no error key still renders, and says why
    page = parse_page(write_demand_report(pd.DataFrame(), {"interval": 0.8}, tmp_path).read_text())
    assert "no model predictions were written" in " ".join(page.text)


# ---------------------------------------------------------------- headless Chromium


@pytest.mark.timeout(180)
def test_console_checks_catch_a_broken_page(tmp_path):
    """Negative control: the checks below do see console errors, exceptions, broken images."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!doctype html><meta charset='utf-8'><h1>bad</h1>"
                   "<img alt='x' src='data:image/png;base64,AAAA'>"
                   "<script>console.error('boom'); undefinedFn();</script>")
    got = browse(bad.as_uri())
    assert any("boom" in str(c["args"]) for c in got["console_errors"])
    assert any("undefinedFn" in json.dumps(x) for x in got["exceptions"])
    assert got["images"][0]["w"] == 0
    page, _ = page_stderr_problems(got["stderr"], bad.as_uri())
    assert any("Uncaught" in x for x in page)


@pytest.mark.timeout(240)
def test_report_renders_in_chromium(report, tmp_path):
    url = report.resolve().as_uri()
    # (a) the DOM after load has every heading and every figure
    dom = parse_page(dump_dom(url))
    assert [h for h in HEADINGS if h not in dom.headings] == []
    n_figs = len(list((report.parent / "figures").glob("*.png")))
    assert len(dom.imgs) == n_figs >= 7
    assert all(i.get("src", "").startswith("data:image/png;base64,") for i in dom.imgs)

    got = browse(url)
    shot = got["png"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for folder in (ARTIFACTS, tmp_path):  # (d) the screenshot is kept
        (folder / "demand_report.png").write_bytes(shot)
    shutil.copy(report, ARTIFACTS / "demand_report.html")

    # (b) no console errors, uncaught exceptions or failed loads from the page
    assert got["console_errors"] == [] and got["console_all"] == []
    assert got["exceptions"] == []
    assert got["log_errors"] == []
    page, other = page_stderr_problems(got["stderr"], url)
    assert page == [], page
    if other:  # unknown Chromium noise: shown, not failed on
        print("chromium stderr (not from the page):\n" + "\n".join(other[:20]))

    # (c) every image decoded at its file's size and drew something on the page
    assert len(got["images"]) == n_figs
    from PIL import Image

    full = Image.open(io.BytesIO(shot))
    for im in got["images"]:
        assert im["complete"] and im["w"] > 100 and im["h"] > 100, im
        assert im["cw"] > 300 and im["ch"] > 100, im
        assert im["y"] + im["ch"] <= full.height + 1
        box = (int(im["x"]), int(im["y"]), int(im["cw"]), int(im["ch"]))
        assert ink(shot, box) > 0.02, (im["alt"], ink(shot, box))
