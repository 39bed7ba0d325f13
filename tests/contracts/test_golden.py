"""replaylab.contracts.golden: the shared golden-vector format, comparisons and CPU facts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from replaylab.contracts.golden import (
    ANY_MACHINE,
    GOLDEN_FILE,
    MISMATCH,
    U8S8_EXACT,
    GoldenError,
    check,
    cpu_info,
    golden_document,
    max_abs_diff,
    read_golden,
    row_cosines,
    stable_agreement,
    this_machine,
    write_golden,
)
from replaylab.contracts.manifest import build_manifest, verify_manifest, write_manifest
from replaylab.runtime.routing import choose_by_threshold, decision_margin


def _folder(tmp_path, doc=None, raw=None):
    folder = tmp_path / "art"
    folder.mkdir(parents=True)
    if doc is not None:
        write_golden(folder, doc)
    if raw is not None:
        (folder / GOLDEN_FILE).write_text(raw)
    (folder / "model.bin").write_bytes(b"x")
    m = build_manifest(folder, kind="t", version="1.0.0", contracts={}, valid_days=1,
                       features=[], outputs={}, calibration={}, training={}, runtime={},
                       fallback={})
    write_manifest(folder, m)
    return folder, verify_manifest(folder)


def test_document_round_trips_through_the_verified_manifest(tmp_path):
    doc = golden_document("t", [{"input": {"x": 1}, "expected": {"y": 2.5}}], {"y_abs": 1e-6})
    assert doc["built_on"]["machine"] and doc["format"] == 1
    folder, m = _folder(tmp_path, doc)
    assert read_golden(folder, m, kind="t")["cases"] == doc["cases"]
    with pytest.raises(GoldenError) as exc:
        read_golden(folder, m, kind="other")
    assert exc.value.reason == "golden_malformed"
    with pytest.raises(ValueError):
        golden_document("t", [], {})
    with pytest.raises(ValueError):
        golden_document("t", [{"input": {}}], {})


def test_built_on_describes_this_machine_unless_pinned():
    cases, tol = [{"input": {"x": 1}, "expected": {"y": 2.5}}], {"y_abs": 1e-6}
    real = golden_document("t", cases, tol)["built_on"]
    assert real == this_machine() and "cpu_flags" in real and real["onnxruntime"]
    # a committed fixture records the constant: the same bytes whichever CPU writes it
    pinned = golden_document("t", cases, tol, built_on=ANY_MACHINE)
    assert pinned["built_on"] == dict(ANY_MACHINE)
    assert "cpu_flags" not in json.dumps(pinned) and "u8s8" not in json.dumps(pinned)


def test_absent_and_malformed_golden_files_say_which(tmp_path):
    folder, m = _folder(tmp_path / "a")
    with pytest.raises(GoldenError) as exc:
        read_golden(folder, m)
    assert exc.value.reason == "golden_absent"
    folder, m = _folder(tmp_path / "b", raw=json.dumps({"format": 1, "cases": []}))
    with pytest.raises(GoldenError) as exc:
        read_golden(folder, m)
    assert exc.value.reason == "golden_malformed"


def test_comparisons():
    a = np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    np.testing.assert_allclose(row_cosines(a, np.array([[2.0, 0.0], [0.0, 0.0], [0.0, 1.0]])),
                               [1.0, 1.0, np.sqrt(0.5)])
    assert max_abs_diff([1.0, 2.0], [1.0, 2.5]) == 0.5
    assert max_abs_diff([1.0], [1.0, 2.0]) == float("inf")
    assert max_abs_diff([1.0], [np.nan]) == float("inf")
    # a flip on a case within the tolerance is excused, one beyond it is not
    share, n = stable_agreement(["a", "b", "a"], ["a", "a", "a"], np.array([0.5, 1e-5, 0.2]),
                                1e-4)
    assert (share, n) == (1.0, 2)
    share, n = stable_agreement(["a", "b"], ["b", "b"], np.array([0.5, 0.5]), 1e-4)
    assert (share, n) == (0.5, 2)
    ok = check({"p": 1e-7, "agree": 1.0}, {"p": ("<=", 1e-4), "agree": (">=", 1.0)}, 0.01)
    assert ok.ok and ok.reason is None and ok.figures["bound_p"] == "<= 0.0001"
    bad = check({"p": 1e-3, "agree": None}, {"p": ("<=", 1e-4), "agree": (">=", 1.0)}, 0.01)
    assert not bad.ok and bad.reason == MISMATCH and bad.failed == ["p", "agree"]
    assert json.dumps(bad.as_dict())


def test_decision_margin_is_the_distance_to_a_flip():
    prob = np.array([[0.80, 0.90], [0.50, 0.90], [0.895, 0.90]])
    # margin rule: q = p - best other; threshold -0.05: cheap wins when within 0.05 of strong
    chosen = choose_by_threshold(prob, -0.05, fallback=1, rule="margin")
    assert chosen.tolist() == [1, 1, 0]
    margin = decision_margin(prob, -0.05, fallback=1, rule="margin")
    np.testing.assert_allclose(margin, [0.05, 0.35, 0.045], atol=1e-12)
    # moving every probability by less than margin / 2 never changes a decision
    rng = np.random.default_rng(0)
    for _ in range(200):
        eps = rng.uniform(-1, 1, prob.shape) * (margin[:, None] / 2 - 1e-9)
        assert (choose_by_threshold(prob + eps, -0.05, fallback=1, rule="margin")
                == chosen).all()


def test_cpu_info_names_the_int8_kernel_family():
    info = cpu_info()
    # CPU-dependent: exact with int32 accumulation (VNNI, AMX), saturated on AVX2's
    # vpmaddubsw path (32 x 32767); anything else is a kernel this project has not seen
    assert info["u8s8"] in (U8S8_EXACT, 32 * 32767), info
    assert info["u8s8_saturates"] == (info["u8s8"] != U8S8_EXACT)
    print("this CPU:", info)
