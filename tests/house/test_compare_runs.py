"""scripts/compare_runs.py: what the house move was checked with finds what changed, and only that."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("compare_runs", REPO / "scripts" / "compare_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(root: Path, summary: dict, files: dict[str, str]) -> Path:
    for kind in ("demand", "router"):
        (root / kind / "artifacts" / kind).mkdir(parents=True)
        doc = json.loads(json.dumps(summary).replace("<RUN>", str(root / kind)))
        (root / kind / "summary.json").write_text(json.dumps(doc))
        manifest = {"kind": kind, "files": [{"path": p, "sha256": h} for p, h in files.items()]}
        (root / kind / "artifacts" / kind / "manifest.json").write_text(json.dumps(manifest))
    return root


SUMMARY = {"verdict": "NO-GO", "test": {"coverage": 0.807, "n": [1395, 2]},
           "wall_seconds": 12.0, "timings_s": {"fit": 3.2}, "mlflow": {"run_id": "a"},
           "registry": [{"version": 1}], "artifacts": {"ledger": "<RUN>/ledger.parquet"},
           "data": {"outcomes": "gsm8k:/checkout-a/src/replaylab/data/x.csv"}}
FILES = {"model.onnx": "1" * 64, "golden.json": "2" * 64, "encoder/manifest.json": "3" * 64}


def test_equal_runs_differ_only_in_what_a_rerun_changes(tmp_path):
    compare = _script()
    after = copy.deepcopy(SUMMARY)
    after.update(wall_seconds=99.0, timings_s={"fit": 1.0}, mlflow={"run_id": "b"},
                 registry=[{"version": 7}])
    after["data"]["outcomes"] = "gsm8k:/tmp/clone/src/replaylab/data/x.csv"
    files = {**FILES, "encoder/manifest.json": "4" * 64}  # a nested manifest: its own time
    problems, counts = compare.compare(_run(tmp_path / "a", SUMMARY, FILES),
                                       _run(tmp_path / "b", after, files))
    assert problems == []
    assert counts == {"summary_leaves": 2 * 6, "manifests": 2, "files": 4}
    assert compare.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 0


def test_a_changed_figure_or_file_is_reported(tmp_path):
    compare = _script()
    after = copy.deepcopy(SUMMARY)
    after["test"]["coverage"] = 0.806
    del after["test"]["n"][1]
    problems, _ = compare.compare(_run(tmp_path / "a", SUMMARY, FILES),
                                  _run(tmp_path / "b", after, {**FILES, "model.onnx": "9" * 64}))
    assert "demand/summary.json/test/coverage: 0.807 != 0.806" in problems
    assert "router/summary.json/test/n/1: only before" in problems
    assert any(p.startswith("demand/artifacts/demand/manifest.json: model.onnx: sha256")
               for p in problems)
    assert len(problems) == 6  # three of each kind
    assert compare.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 1


def test_rtol_forgives_summation_order_and_nothing_else(tmp_path):
    """--rtol: floats a few ulps apart (the same terms summed in another order) are equal;
    a figure that moved, an integer or a string that changed are still differences."""
    compare = _script()
    after = copy.deepcopy(SUMMARY)
    after["test"]["coverage"] = 0.807 * (1 + 3e-15)
    a, b = _run(tmp_path / "a", SUMMARY, FILES), _run(tmp_path / "b", after, FILES)
    assert len(compare.compare(a, b)[0]) == 2  # exact by default: one per kind
    assert compare.compare(a, b, rtol=1e-9)[0] == []
    assert compare.main([str(a), str(b), "--rtol", "1e-9"]) == 0
    after["test"]["coverage"] = 0.8071
    after["test"]["n"][0] = 1396
    c = _run(tmp_path / "c", after, FILES)
    assert len(compare.compare(a, c, rtol=1e-9)[0]) == 4
