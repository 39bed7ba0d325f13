"""The demand artifact and its runtime: export parity, manifest, verified loading, fallbacks,
golden vectors checked at load.

Parity compares the runtime's hints (ONNX graph + numpy post-processing +
conformal corrections from the manifest, features assembled from request
dicts) with the training pipeline's own test predictions, row by row.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from replaylab.apps.demand_runs import save_run_state
from replaylab.artifacts.demand_export import (
    GOLDEN_TOLERANCES,
    UNSEEN_CATEGORY,
    DemandExportError,
    demand_sections,
    export_demand,
    feature_schema,
)
from replaylab.contracts.golden import GOLDEN_FILE, MISMATCH
from replaylab.contracts.hints import HINT_COLUMNS, Acknowledgement, ledger_record, negotiate
from replaylab.contracts.manifest import build_manifest, verify_manifest, write_manifest
from replaylab.demand import DemandConfig
from replaylab.pipelines.demand import train_demand
from replaylab.pipelines.project import LedgerInput, LoadedLedger, load_ledger
from replaylab.projection import ProjectionConfig, SplitConfig
from replaylab.runtime import DemandPredictor, FallbackBaseline
from replaylab.runtime.demand import DemandSpec
from replaylab.sources.synthetic import SyntheticLedgerConfig
from tests.conftest import REPO

SPLIT = SplitConfig(embargo_ms=60_000)
RTOL = 1e-6
COLS = ["model-q0.5", "model-q0.9", "model-lo-80", "model-hi-80"]


def _requests(run_dir: Path, split: str = "test") -> tuple[list[dict], pd.DataFrame]:
    """Request dicts (pre-dispatch fields + history, NA -> None) of a run's split, and the rows."""
    feats = pd.read_parquet(run_dir / "features.parquet")
    rows = feats[feats["split"] == split].reset_index(drop=True)
    keep = [c for c in rows.columns if not c.startswith("label_") and c != "split"]
    reqs = [{k: (None if v is pd.NA or (isinstance(v, float) and math.isnan(v)) else v)
             for k, v in rec.items()} for rec in rows[keep].to_dict("records")]
    return reqs, rows


def _hints_array(hints) -> np.ndarray:
    return np.array([[h.hint_p50, h.hint_p90, h.hint_lo, h.hint_hi] for h in hints])


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-3)))


def _check_parity(run_dir: Path, art: Path) -> dict:
    predictor = DemandPredictor.load(art)
    assert predictor.loaded, predictor.reason
    reqs, rows = _requests(run_dir)
    pred = pd.read_parquet(run_dir / "predictions_test.parquet")
    assert list(pred["request_id"]) == list(rows["request_id"])
    hints = predictor.predict_batch(reqs)
    assert not any(h.hint_fallback for h in hints)
    got, ref = _hints_array(hints), pred[COLS].to_numpy(dtype=float)
    rel = _rel(got, ref)
    assert rel <= RTOL, f"max relative difference {rel:.3g} over {len(reqs)} test rows"
    single = _hints_array([predictor.predict(r) for r in reqs[:300]])
    # one row at a time (Python floats) = the batch (numpy), to the last bit or two
    np.testing.assert_allclose(single, got[:300], rtol=1e-12, atol=0)
    return {"rows": len(reqs), "max_rel": rel}


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """A demand run on a synthetic ledger (categories, sessions, history), exported."""
    out = tmp_path_factory.mktemp("demand")
    loaded = load_ledger(LedgerInput(
        synthetic=SyntheticLedgerConfig(n_sessions=1200, sessions_per_s=0.25)))
    summary, run = train_demand(loaded, ProjectionConfig(), SPLIT, DemandConfig(), out)
    art = export_demand(run, summary, out / "artifacts" / "demand", mlflow_run_id="abc",
                        git_commit="deadbeef")
    save_run_state(run, out)  # the demand_run/ folder, read back by _KILLED_EXPORT
    return out, art, summary, run


# ---------------------------------------------------------------- parity
def test_parity_every_test_row_synthetic(synthetic):
    run_dir, art, _, _ = synthetic
    figures = _check_parity(run_dir, art)
    assert figures["rows"] > 300


def _check_azure_parity(path: Path, split: SplitConfig, out: Path) -> dict:
    from replaylab.contracts import validate_ledger
    from replaylab.sources.azure import import_azure_llm_2023

    ledger = import_azure_llm_2023(path)
    loaded = LoadedLedger(validate_ledger(ledger, source=str(path)), origin=str(path))
    summary, run = train_demand(loaded, ProjectionConfig(), split, DemandConfig(), out)
    art = export_demand(run, summary, out / "art")
    return _check_parity(out, art)


@pytest.mark.parametrize("service", ["code", "conv"])
def test_parity_every_test_row_real_azure_slice(service, test_data, tmp_path):
    """Real rows on a fresh clone: the committed first 200 requests of each Azure LLM 2023
    trace (tests/data/README_ledgers.md). They span 37 s (conv) and 80 s (code), so the
    embargo is 0 instead of a minute."""
    path = test_data / "azure_llm_2023" / f"AzureLLMInferenceTrace_{service}_first200.csv"
    figures = _check_azure_parity(path, SplitConfig(embargo_ms=0), tmp_path)
    assert figures["rows"] == 40  # the test fifth of 200 single-request sessions


@pytest.mark.slow
@pytest.mark.parametrize("service, rows", [("code", 1500), ("conv", 2000)])
def test_parity_every_test_row_real_azure_trace(service, rows, shared_data, tmp_path):
    """Full-file variant: the whole Azure LLM 2023 traces (code 8,819, conv 19,366 requests)."""
    path = shared_data / "traces" / "azure_llm_2023" / f"AzureLLMInferenceTrace_{service}.csv"
    figures = _check_azure_parity(path, SPLIT, tmp_path)
    assert figures["rows"] > rows


# ---------------------------------------------------------------- manifest
def test_manifest_describes_the_model(synthetic):
    _, art, summary, run = synthetic
    m = verify_manifest(art, required_kind="demand")
    names = [f["name"] for f in m["features"]]
    assert names == list(run.model.feature_names_)
    vocab = dict(zip([c for c in names if c in run.model.categories_],
                     run.model.boosters_[0].pandas_categorical, strict=True))
    for f in m["features"]:
        if f["kind"] == "category":
            assert f["vocabulary"] == [str(v) for v in vocab[f["name"]]]
        assert f["source"] in ("request", "calendar", "history")
    hist = {f["name"]: f.get("first_turn") for f in m["features"] if f["source"] == "history"}
    assert hist["hist_turns_ended"] == 0 and hist["hist_completion_mean"] is None
    cal = m["calibration"]
    assert cal["global_correction"] == run.calibrator.global_correction_
    assert cal["corrections"] == run.calibrator.corrections_  # exact floats, JSON round trip
    assert m["outputs"]["quantiles"] == [0.1, 0.5, 0.9] and m["outputs"]["interval"] == 0.8
    t = m["training"]
    assert t["ledger_fingerprint"] == run.ledger_fingerprint
    assert t["projection_version"] == run.projection_version
    assert t["mlflow_run_id"] == "abc" and t["git_commit"] == "deadbeef"
    assert t["time_window"]["train"]["first_ms"] <= t["time_window"]["test"]["first_ms"]
    assert t["rows"] == summary["splits"]["rows"]
    assert t["headline"]["test_mean_pinball"] == summary["test"]["model"]["mean_pinball"]
    assert m["runtime"]["ai_onnx_ml_opset"] == 5 and "onnxruntime" in m["runtime"]["packages"]
    assert m["fallback"] == {**m["fallback"], "name": "max_tokens_cap", "default_max_tokens": 4096}
    assert [f["path"] for f in m["files"]] == ["golden.json", "model.onnx", "trees.safetensors"]
    assert m["contracts"]["ledger"] == "1" and m["contracts"]["hint"] == ["1"]


def test_the_typed_sections_are_what_the_manifest_holds_and_read_back(synthetic):
    """One schema: the exporter's `DemandSections` are the manifest's sections as written,
    and the runtime's `DemandSpec` reads back the same records."""
    _, art, summary, run = synthetic
    m = verify_manifest(art, required_kind="demand")
    sections = demand_sections(run, summary, mlflow_run_id="abc",
                               git_commit="deadbeef").as_manifest()
    assert {k: m[k] for k in sections} == sections
    spec = DemandSpec.from_manifest(m)
    assert [f.as_dict() for f in spec.features] == m["features"]
    assert spec.outputs.as_dict() == m["outputs"]
    assert spec.calibration.as_dict() == m["calibration"]
    counts = [f for f in spec.features if f.name == "hist_turns_ended"]
    assert counts and counts[0].first_turn == 0 and type(counts[0].first_turn) is int
    assert spec.fallback.default_max_tokens == m["fallback"]["default_max_tokens"]


def test_export_refuses_a_model_without_the_hint_levels(synthetic):
    _, _, summary, run = synthetic
    bad = dataclasses.replace(run, config=dataclasses.replace(run.config, quantiles=(0.1, 0.5, 0.8)))
    with pytest.raises(DemandExportError, match="0.9"):
        export_demand(bad, summary, Path("/nonexistent/never-written"))
    assert feature_schema(run.model)[0].name == run.model.feature_names_[0]


def test_reexport_replaces_the_folder_and_keeps_it_loadable(synthetic, tmp_path):
    _, _, summary, run = synthetic
    out = tmp_path / "demand"
    export_demand(run, summary, out, version="1.0.0")
    export_demand(run, summary, out, version="1.1.0")
    p = DemandPredictor.load(out)
    assert p.loaded and p.version.startswith("1.1.0+")
    assert [x.name for x in tmp_path.iterdir()] == ["demand"]  # no temporary leftovers
    # the golden cases are deterministic: the same run gives the same cases
    first = json.loads((synthetic[1] / GOLDEN_FILE).read_text())["cases"]
    assert json.loads((out / GOLDEN_FILE).read_text())["cases"] == first


# ---------------------------------------------------------------- verified loading
def _copy(art: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(art, dst)
    return dst


def _request(**kw) -> dict:
    base = {"request_id": "r1", "prompt_tokens": 500, "max_tokens": 1000, "turn_index": 0,
            "category": "chat", "selected_model": "llama-3.1-8b-instruct",
            "slo_class": "interactive", "streaming": True, "timestamp": 1_700_000_000_000}
    return {**base, **kw}


def _assert_fallback(hint, reason: str, prompt=500.0, cap=1000.0) -> None:
    assert hint.hint_fallback and hint.fallback_reason == reason
    assert hint.hint_model_version == "baseline:max_tokens_cap"
    assert (hint.hint_lo, hint.hint_p50, hint.hint_p90, hint.hint_hi) == (
        prompt, prompt + cap, prompt + cap, prompt + cap)
    assert hint.hint_interval is None


def test_a_tampered_model_file_falls_back_with_the_reason(synthetic, tmp_path):
    art = _copy(synthetic[1], tmp_path / "a")
    data = bytearray((art / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 0x01
    (art / "model.onnx").write_bytes(bytes(data))
    p = DemandPredictor.load(art)
    assert not p.loaded and p.reason == "hash_mismatch"
    _assert_fallback(p.predict(_request()), "hash_mismatch")


def test_missing_expired_and_unsigned_artifacts_fall_back(synthetic, tmp_path):
    art = synthetic[1]
    assert DemandPredictor.load(tmp_path / "nope").reason == "missing_artifact"
    assert DemandPredictor.load(None).reason == "missing_artifact"
    later = time.time() + 400 * 86400
    p = DemandPredictor.load(art, clock=lambda: later)
    assert p.reason == "expired"
    _assert_fallback(p.predict(_request(max_tokens=None)), "expired", cap=4096.0)
    assert DemandPredictor.load(art, hmac_key=b"k").reason == "missing_signature"
    custom = DemandPredictor.load(tmp_path / "nope", fallback=FallbackBaseline(2048))
    _assert_fallback(custom.predict(_request(max_tokens=None)), "missing_artifact", cap=2048.0)


def test_an_artifact_expiring_while_loaded_falls_back_per_hint(synthetic):
    now = [time.time()]
    p = DemandPredictor.load(synthetic[1], clock=lambda: now[0])
    assert not p.predict(_request()).hint_fallback
    now[0] += 31 * 86400  # past valid_until (30 days)
    _assert_fallback(p.predict(_request()), "expired")


def test_signed_artifact_loads_only_with_its_key(synthetic, tmp_path):
    _, _, summary, run = synthetic
    art = export_demand(run, summary, tmp_path / "signed", hmac_key=b"secret")
    assert DemandPredictor.load(art, hmac_key=b"secret").loaded
    assert DemandPredictor.load(art, hmac_key=b"wrong").reason == "bad_signature"


def _rebuild(art: Path, dst: Path, edit) -> Path:
    """A copy whose manifest is rebuilt (valid hashes) after `edit(manifest)`."""
    dst = _copy(art, dst)
    m = json.loads((dst / "manifest.json").read_text())
    edit(m)
    keep = {k: m[k] for k in ("contracts", "features", "outputs", "calibration", "training",
                              "runtime", "fallback")}
    write_manifest(dst, build_manifest(dst, kind="demand", version="1.0.0", valid_days=30,
                                       **keep))
    return dst


def test_schema_the_runtime_cannot_assemble_falls_back(synthetic, tmp_path):
    def unknown_history(m):
        m["features"][-1]["name"] = "hist_something_new"

    def dropped_feature(m):
        m["features"].pop()

    def no_p90(m):
        m["outputs"]["quantiles"] = [0.1, 0.5, 0.95]

    for i, (edit, reason) in enumerate([(unknown_history, "feature_schema"),
                                        (dropped_feature, "feature_schema"),
                                        (no_p90, "outputs")]):
        p = DemandPredictor.load(_rebuild(synthetic[1], tmp_path / str(i), edit))
        assert p.reason == reason, edit.__name__
        assert p.predict(_request()).hint_fallback


def test_unbounded_correction_is_uncertain(synthetic, tmp_path):
    def unbounded(m):
        m["calibration"]["global_correction"] = None
        m["calibration"]["corrections"] = {}

    art = _rebuild(synthetic[1], tmp_path / "u", unbounded)
    # the golden vectors hold the exported corrections: the edited calibration misses them
    assert DemandPredictor.load(art).reason == "golden_mismatch"
    p = DemandPredictor.load(art, check_golden=False)
    assert p.loaded
    _assert_fallback(p.predict(_request()), "uncertain")


# ---------------------------------------------------------------- golden vectors
def _golden(art: Path) -> dict:
    return json.loads((art / GOLDEN_FILE).read_text())


def _resign(folder: Path, hmac_key: bytes | None = None) -> Path:
    """Rebuild (and sign) `folder`'s manifest over its current files: every hash verifies."""
    m = json.loads((folder / "manifest.json").read_text())
    keep = {k: m[k] for k in ("contracts", "features", "outputs", "calibration", "training",
                              "runtime", "fallback")}
    write_manifest(folder, build_manifest(folder, kind="demand", version=m["version"],
                                          valid_days=30, **keep), hmac_key=hmac_key)
    return folder


def _edit_golden(art: Path, dst: Path, edit, hmac_key: bytes | None = None) -> Path:
    dst = _copy(art, dst)
    doc = _golden(dst)
    edit(doc)
    (dst / GOLDEN_FILE).write_text(json.dumps(doc))
    return _resign(dst, hmac_key)


def test_golden_vectors_are_listed_hashed_and_cover_the_paths(synthetic):
    _, art, _, _ = synthetic
    m = verify_manifest(art, required_kind="demand")
    entry = next(f for f in m["files"] if f["path"] == GOLDEN_FILE)
    raw = (art / GOLDEN_FILE).read_bytes()
    assert entry["sha256"] == hashlib.sha256(raw).hexdigest() and entry["size"] == len(raw)
    doc = _golden(art)
    assert doc["format"] == 1 and doc["kind"] == "demand"
    assert doc["tolerances"] == GOLDEN_TOLERANCES
    assert doc["built_on"]["machine"] and doc["built_on"]["onnxruntime"]
    cases = doc["cases"]
    assert 24 <= len(cases) <= 40
    inputs = [c["input"] for c in cases]
    assert all(isinstance(r.get("timestamp"), int) for r in inputs)  # no "now" in a golden case
    first_turns = [r for r in inputs if not any(k.startswith("hist_") for k in r)]
    assert len(first_turns) >= 2 and any(r.get("hist_turns_ended", 0) > 0 for r in inputs)
    unseen = [c for c in cases if c["input"].get("category") == UNSEEN_CATEGORY]
    assert len(unseen) == 1
    assert unseen[0]["expected"]["correction"] == m["calibration"]["global_correction"]
    assert len({c["expected"]["cell"] for c in cases}) >= 4  # spread over the conformal cells
    clipped = [c for c in cases if c["input"].get("max_tokens") is not None
               and c["expected"]["hint_p90"] == c["input"]["prompt_tokens"]
               + c["input"]["max_tokens"]]
    assert clipped, "no golden case reaches its max_tokens cap"
    assert any(r.get("max_tokens") is None for r in inputs)  # and one without a cap
    # checked against LightGBM at export, every case the model answers
    parity = doc["lightgbm_parity"]
    assert parity["rows"] == sum(not c["expected"]["hint_fallback"] for c in cases) > 20
    assert parity["max_rel"] <= 1e-12


def test_golden_check_passes_on_this_machine(synthetic):
    _, art, _, _ = synthetic
    p = DemandPredictor.load(art)
    assert p.loaded and p.golden_status == "passed" and p.golden.ok and p.golden.reason is None
    f = p.golden.figures
    assert f["cases"] == len(_golden(art)["cases"]) and f["exact_agreement"] == 1.0
    assert f["hint_max_abs"] == 0.0  # same machine, same code: bit for bit
    assert p.golden.seconds > 0 and p.golden.cpu["machine"]
    # the golden inputs go through predict_batch like any request
    cases = _golden(art)["cases"]
    hints = p.predict_batch([c["input"] for c in cases])
    assert [h.hint_p90 for h in hints] == [c["expected"]["hint_p90"] for c in cases]


def test_a_golden_vector_off_by_a_token_falls_back_with_golden_mismatch(synthetic, tmp_path):
    _, art, _, _ = synthetic

    def one_token_off(doc):
        doc["cases"][3]["expected"]["hint_p50"] += 1.0

    def other_cell(doc):
        doc["cases"][0]["expected"]["cell"] = "some|other|cell"

    for i, (edit, failed) in enumerate([(one_token_off, ["hint_max_abs", "hint_max_rel"]),
                                        (other_cell, ["exact_agreement"])]):
        off = _edit_golden(art, tmp_path / str(i), edit, hmac_key=b"k")  # re-signed: verifies
        assert verify_manifest(off, hmac_key=b"k")
        p = DemandPredictor.load(off, hmac_key=b"k")
        assert not p.loaded and p.reason == MISMATCH == "golden_mismatch", edit.__name__
        assert p.golden_status == "failed" and p.golden.failed == failed
        assert p.manifest is not None and p.version is None
        _assert_fallback(p.predict(_request()), MISMATCH)
        assert all(h.fallback_reason == MISMATCH for h in p.predict_batch([_request()] * 3))
        # check_golden=False: the operator's explicit choice to serve it anyway
        skipped = DemandPredictor.load(off, hmac_key=b"k", check_golden=False)
        assert skipped.loaded and skipped.golden_status == "skipped" and skipped.golden is None


def test_a_malformed_golden_file_falls_back(synthetic, tmp_path):
    def no_tolerances(doc):
        doc.pop("tolerances")

    p = DemandPredictor.load(_edit_golden(synthetic[1], tmp_path / "m", no_tolerances))
    assert p.reason == "golden_malformed" and p.golden_status == "malformed"
    _assert_fallback(p.predict(_request()), "golden_malformed")

    def unreadable_case(doc):
        doc["cases"][0]["input"] = 7

    p = DemandPredictor.load(_edit_golden(synthetic[1], tmp_path / "c", unreadable_case))
    assert p.reason == "golden_mismatch" and p.golden.failed == ["golden_cases"]
    assert "TypeError" in p.golden.figures["error"]


def test_an_artifact_without_golden_vectors_loads_as_before(synthetic, tmp_path):
    old = _copy(synthetic[1], tmp_path / "old")
    (old / GOLDEN_FILE).unlink()
    _resign(old)
    p = DemandPredictor.load(old)
    assert p.loaded and p.reason is None and p.golden_status == "absent" and p.golden is None
    ref = DemandPredictor.load(synthetic[1]).predict(_request())
    assert p.predict(_request()).hint_p90 == ref.hint_p90


def test_a_run_without_golden_rows_is_not_exported(synthetic, tmp_path):
    _, _, summary, run = synthetic
    with pytest.raises(DemandExportError, match="golden rows"):
        export_demand(dataclasses.replace(run, golden_rows=None), summary, tmp_path / "x")
    assert not (tmp_path / "x").exists()
    # explicit rows: any projection rows will do
    art = export_demand(dataclasses.replace(run, golden_rows=None), summary, tmp_path / "y",
                        golden_rows=run.golden_rows.iloc[:5])
    assert len(_golden(art)["cases"]) == 6  # the five rows and the unseen-category copy
    assert DemandPredictor.load(art).golden_status == "passed"


def test_load_time_cost_of_the_golden_check(synthetic):
    """Median of 20 loads with and without the check (printed; the machine decides the time)."""
    art = synthetic[1]

    def median_load(check: bool) -> float:
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            p = DemandPredictor.load(art, check_golden=check)
            times.append(time.perf_counter() - t0)
            assert p.loaded
        return float(np.median(times))

    median_load(True)  # warm caches and onnxruntime's first-session setup
    without, with_check = median_load(False), median_load(True)
    p = DemandPredictor.load(art)
    print(f"\ndemand load: median {without * 1e3:.2f} ms without the golden check, "
          f"{with_check * 1e3:.2f} ms with it (+{(with_check - without) * 1e3:.2f} ms; the "
          f"check alone {p.golden.seconds * 1e3:.2f} ms for {p.golden.figures['cases']} cases)")


# ---------------------------------------------------------------- requests
def test_bad_rows_fall_back_alone_in_a_batch(synthetic):
    p = DemandPredictor.load(synthetic[1])
    hints = p.predict_batch([_request(), _request(prompt_tokens=None),
                             _request(max_tokens="lots"), _request(category=None, region="xx")])
    assert [h.fallback_reason for h in hints] == [None, "missing_prompt_tokens", "bad_request",
                                                  None]
    assert hints[1].hint_lo == 0.0 and hints[1].hint_hi == 1000.0  # the cap alone
    ok = hints[0]
    assert 500 <= ok.hint_lo <= ok.hint_p50 <= ok.hint_p90 <= 1500 and ok.hint_hi <= 1500
    assert ok.hint_interval == 0.8 and ok.hint_model_version == p.version
    assert 0 <= ok.hint_age_ms < 3_600_000


def test_a_request_without_history_is_a_first_turn(synthetic):
    run_dir, art, _, _ = synthetic
    p = DemandPredictor.load(art)
    reqs, rows = _requests(run_dir)
    first = [r for r in reqs if r["hist_turns_dispatched"] == 0][:50]
    bare = [{k: v for k, v in r.items() if not k.startswith("hist_")} for r in first]
    np.testing.assert_array_equal(_hints_array(p.predict_batch(bare)),
                                  _hints_array(p.predict_batch(first)))
    later = next(r for r in reqs if r["hist_turns_ended"] >= 2 and r["hist_completion_mean"])
    partial = {k: v for k, v in later.items()
               if not k.startswith("hist_") or k in ("hist_turns_ended", "hist_completion_mean",
                                                      "hist_last_completion")}
    assert not p.predict(partial).hint_fallback  # count, mean and last are enough


def test_timestamp_forms_agree(synthetic):
    p = DemandPredictor.load(synthetic[1])
    ms = 1_700_000_000_000
    iso = datetime.fromtimestamp(ms / 1000, UTC)
    a = p.predict(_request(timestamp=ms))
    b = p.predict(_request(timestamp=iso.isoformat().replace("+00:00", "Z")))
    c = p.predict(_request(timestamp=iso))
    assert a.hint_p50 == b.hint_p50 == c.hint_p50
    assert p.predict(_request(timestamp="yesterday")).fallback_reason == "bad_request"


def test_eight_threads_get_the_single_threaded_answers(synthetic):
    run_dir, art, _, _ = synthetic
    p = DemandPredictor.load(art)
    reqs, _ = _requests(run_dir)
    reqs = reqs[:400]
    expected = _hints_array([p.predict(r) for r in reqs])
    np.testing.assert_allclose(expected, _hints_array(p.predict_batch(reqs)), rtol=1e-12)
    barrier = threading.Barrier(8)

    def worker(k: int) -> np.ndarray:
        barrier.wait()  # all eight call at once
        order = np.random.default_rng(k).permutation(len(reqs))
        got = np.empty_like(expected)
        for i in order:
            got[i] = _hints_array([p.predict(reqs[i])])[0]
        return got

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(worker, range(8)))
    for got in results:
        np.testing.assert_array_equal(got, expected)


# ---------------------------------------------------------------- negotiation, ack, ledger
def test_negotiation_and_acknowledgement():
    assert negotiate(["1"]) == "1" and negotiate(["2", "1"]) == "1"
    assert negotiate([]) is None and negotiate(["2"]) is None
    assert negotiate(["1", "2"], offered=["1", "2"]) == "2"
    with pytest.raises(ValueError, match="state"):
        Acknowledgement("maybe")


def test_ledger_record_keeps_estimate_decision_actual_apart():
    p = DemandPredictor.load(None)  # fallback hints are fine for the bookkeeping
    req = _request()
    hint = p.predict(req)
    done = ledger_record(req, hint, Acknowledgement("used", "admitted"),
                         {"completion_tokens": 300, "finish_reason": "stop",
                          "lifecycle_state": "completed"})
    assert done["hint_p50"] == hint.hint_p50 and done["ack_decision"] == "admitted"
    assert done["completion_tokens"] == 300 and done["residual_total_tokens"] == 800 - 1500
    assert done["residual_covered"] is True and done["residual_is_lower_bound"] is False
    cut = ledger_record(req, hint, None, {"completion_tokens": 20, "finish_reason": "cancelled",
                                          "lifecycle_state": "aborted"})
    assert cut["ack_state"] == "absent" and cut["residual_is_lower_bound"] is True
    assert cut["residual_covered"] is None  # a lower bound inside the band proves nothing
    absent = ledger_record(req, hint, Acknowledgement("ignored"), {"completion_tokens": None})
    assert absent["residual_total_tokens"] is None and absent["residual_covered"] is None
    unsupported = ledger_record(req, None, Acknowledgement("unsupported"), {})
    assert all(unsupported[c] is None for c in HINT_COLUMNS)


# ---------------------------------------------------------------- isolation, atomicity
_BLOCKER = """
import sys, importlib.abc
BLOCKED = {"torch", "lightgbm", "pandas", "sklearn", "mlflow", "onnx", "scipy", "transformers"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked in this test: {name}")
sys.meta_path.insert(0, Block())
"""


def test_runtime_imports_and_predicts_without_the_training_stack(synthetic):
    art = synthetic[1]
    req = _request()
    code = _BLOCKER + f"""
import json
from replaylab.runtime import DemandPredictor
p = DemandPredictor.load({str(art)!r})
h = p.predict({req!r})
print(json.dumps([p.loaded, p.reason, h.hint_p50, h.hint_hi, sorted(
    m for m in sys.modules if m.split(".")[0] in BLOCKED), p.golden_status]))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded, reason, p50, hi, heavy, golden = json.loads(proc.stdout.strip().splitlines()[-1])
    here = DemandPredictor.load(art).predict(req)
    assert loaded and reason is None and heavy == [] and golden == "passed"
    assert (p50, hi) == (here.hint_p50, here.hint_hi)


_KILLED_EXPORT = """
import sys, time, json
from pathlib import Path
from replaylab.apps.demand_runs import load_run_state
from replaylab.artifacts.demand_export import export_demand
run_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
run = load_run_state(run_dir / "demand_run")
summary = json.loads((run_dir / "summary.json").read_text())
def hang(tmp):
    (run_dir / "export.midway").write_text(str(tmp))
    time.sleep(600)
export_demand(run, summary, out, version="9.9.9", _after_model_written=hang)
"""


def test_an_export_killed_midway_leaves_nothing_the_loader_accepts(synthetic, tmp_path):
    run_dir, _, summary, run = synthetic
    (run_dir / "summary.json").write_text(json.dumps(summary))
    out = tmp_path / "demand"
    for previous in (False, True):
        if previous:
            export_demand(run, summary, out, version="1.0.0")
        marker = run_dir / "export.midway"
        marker.unlink(missing_ok=True)
        proc = subprocess.Popen([sys.executable, "-c", _KILLED_EXPORT, str(run_dir), str(out)],
                                cwd=REPO, start_new_session=True)
        deadline = time.time() + 120
        while not marker.exists():
            assert proc.poll() is None and time.time() < deadline, "export never got midway"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        partial = Path(marker.read_text())
        assert (partial / "model.onnx").exists() and not (partial / "manifest.json").exists()
        assert DemandPredictor.load(partial).reason == "unreadable"
        p = DemandPredictor.load(out)
        if previous:  # the old artifact is untouched
            assert p.loaded and p.version.startswith("1.0.0+")
        else:  # nothing was ever renamed into place
            assert p.reason == "missing_artifact"


def test_valid_days_and_created_bound_the_validity(synthetic, tmp_path):
    _, _, summary, run = synthetic
    created = datetime.now(UTC) - timedelta(days=2)
    art = export_demand(run, summary, tmp_path / "old", valid_days=1, created=created)
    assert DemandPredictor.load(art).reason == "expired"
