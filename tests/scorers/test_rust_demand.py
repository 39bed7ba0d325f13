"""The demand artifact's flat trees and the Rust demand scorer (docs/specs/demand-scorer.md).

Python side (no cargo needed): `trees.safetensors` (replaylab.artifacts.demand_flat)
walked by its numpy reference gives LightGBM's raw scores bit for bit, on the test rows
and on rows set at, just under and just over every split threshold, NaN, 0, -0 and the
zero band; also for a booster with `zero_as_missing` (missing type Zero) the demand
pipeline does not train by default; an export whose flat trees differ is refused.

Rust side (the crate built with `cargo build --offline --release`; skipped, saying so,
without cargo): `replaylab-route demand-golden` passes (features equal, raw scores bit
for bit); `replaylab-route demand` answers the same hints as `replaylab.runtime.
DemandPredictor` (frozen corrections) on the test split and on variants of it (missing
and null optional fields, unseen categories, partial or absent session history, string
and float timestamps, values at split thresholds, bad requests), every tree's leaf equal
to LightGBM's `pred_leaf`; a tampered file, an edited manifest and structurally broken
trees behind a valid manifest are refused; `cargo test --offline` passes against the
artifact (besides the crate's own fixture, tests/scorers/test_rust_crate.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import types
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from replaylab.artifacts.demand_export import DemandExportError, export_demand
from replaylab.artifacts.demand_flat import (
    MISSING,
    TREES_FILE,
    flat_predict,
    flat_trees,
    schema_matrix,
    trees_bytes,
)
from replaylab.contracts.manifest import build_manifest, write_manifest
from replaylab.demand import DemandConfig
from replaylab.pipelines.demand import train_demand
from replaylab.pipelines.project import LedgerInput, load_ledger
from replaylab.projection import ProjectionConfig, SplitConfig
from replaylab.projection.requests import plain_value
from replaylab.runtime import DemandPredictor
from replaylab.runtime.demand.spec import FeatureSpec
from replaylab.sources.synthetic import SyntheticLedgerConfig
from tests.helpers.rust import cargo_env, find_cargo

REPO = Path(__file__).resolve().parents[2]
CRATE = REPO / "scorers" / "rust"
BINARY = CRATE / "target" / "release" / "replaylab-route"
HINTS = ("hint_p50", "hint_p90", "hint_lo", "hint_hi")
UNSEEN = "never-seen-in-training"


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def demand_art(tmp_path_factory):
    """A tiny seeded demand run (300 synthetic sessions), exported: (run dir, artifact, run)."""
    out = tmp_path_factory.mktemp("demand-rust")
    loaded = load_ledger(LedgerInput(synthetic=SyntheticLedgerConfig(n_sessions=300,
                                                                     sessions_per_s=0.25)))
    summary, run = train_demand(loaded, ProjectionConfig(), SplitConfig(embargo_ms=60_000),
                                DemandConfig(), out)
    art = export_demand(run, summary, out / "artifacts" / "demand")
    return out, art, run


@pytest.fixture(scope="module")
def binary() -> Path:
    cargo = find_cargo()
    if cargo is None:
        pytest.skip("cargo not on PATH: the Rust demand scorer is not checked")
    proc = subprocess.run([cargo, "build", "--offline", "--release", "--quiet"], cwd=CRATE,
                          env=cargo_env(cargo), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return BINARY


def _test_rows(run_dir: Path) -> pd.DataFrame:
    feats = pd.read_parquet(run_dir / "features.parquet")
    return feats[feats["split"] == "test"].reset_index(drop=True)


def _request(rec: dict) -> dict:
    return {k: plain_value(v) for k, v in rec.items()
            if not k.startswith("label_") and k != "split"}


def _raw_lightgbm(model, X: np.ndarray, **kw) -> np.ndarray:
    return np.column_stack([b.predict(X, num_iteration=int(k), **kw)
                            for b, k in zip(model.boosters_, model.best_iterations_, strict=True)])


def _threshold_rows(base: np.ndarray, arrays: dict, n_features: int) -> np.ndarray:
    """Rows of `base` with one feature set at / just under / just over a split threshold,
    and NaN, 0, -0, +-1e-36 (the zero band) and 1e-30 in every feature."""
    rows = []
    numeric = (arrays["node_decision"] & 1) == 0
    for f, t in zip(arrays["node_feature"][numeric], arrays["node_threshold"][numeric],
                    strict=True):
        for v in (t, np.nextafter(t, -np.inf), np.nextafter(t, np.inf)):
            r = base[len(rows) % len(base)].copy()
            r[f] = v
            rows.append(r)
    for f in range(n_features):
        for v in (np.nan, 0.0, -0.0, 1e-36, -1e-36, 1e-30, -1.0, 0.5):
            r = base[len(rows) % len(base)].copy()
            r[f] = v
            rows.append(r)
    return np.array(rows)


# ---------------------------------------------------------------- Python side: the flat trees
def test_flat_trees_are_lightgbm_bit_for_bit(demand_art):
    run_dir, art, run = demand_art
    model = run.model
    arrays = flat_trees(model)
    features = [FeatureSpec.from_dict(f)
                for f in json.loads((art / "manifest.json").read_text())["features"]]
    X = schema_matrix(_test_rows(run_dir), features)
    rows = np.vstack([X, _threshold_rows(X, arrays, X.shape[1])])
    got = flat_predict(arrays, rows, len(model.boosters_))
    ref = _raw_lightgbm(model, rows, raw_score=True)
    assert len(rows) > 500 and np.array_equal(got, ref)
    # categorical splits and both missing types the pipeline trains are exercised
    assert (arrays["node_decision"] & 1).any() and ((arrays["node_decision"] >> 2) == 2).any()
    # the file on disk is these arrays
    from safetensors.numpy import load

    on_disk = load((art / TREES_FILE).read_bytes())
    assert set(on_disk) == set(arrays)
    assert all(np.array_equal(on_disk[k], arrays[k]) for k in arrays)


def test_flat_trees_zero_as_missing_and_categories(tmp_path):
    """missing_type Zero (zero_as_missing) and categorical splits, on a booster trained here."""
    import lightgbm as lgb

    rng = np.random.default_rng(3)
    n = 2000
    x0 = np.where(rng.random(n) < 0.3, 0.0, rng.normal(size=n))
    x1 = rng.integers(0, 6, n).astype(float)
    x1[rng.random(n) < 0.1] = np.nan
    x2 = np.where(rng.random(n) < 0.2, np.nan, rng.normal(size=n))
    X = np.column_stack([x0, x1, x2])
    y = 2 * (x0 == 0) + np.nan_to_num(x1) % 3 + np.nan_to_num(x2) + rng.normal(0, 0.1, n)
    params = {"objective": "quantile", "alpha": 0.5, "num_leaves": 15, "min_data_in_leaf": 5,
              "zero_as_missing": True, "verbose": -1, "seed": 0, "cat_smooth": 1,
              "min_data_per_group": 5}
    booster = lgb.train(params, lgb.Dataset(X, y, categorical_feature=[1],
                                            feature_name=["a", "b", "c"]), 40)
    model = types.SimpleNamespace(boosters_=[booster], best_iterations_=[40],
                                  feature_names_=["a", "b", "c"])
    arrays = flat_trees(model)
    missing = arrays["node_decision"] >> 2
    assert (missing == MISSING["Zero"]).any() and (arrays["node_decision"] & 1).any()
    rows = np.vstack([X[:300], _threshold_rows(X[:50], arrays, 3)])
    rows[:20, 1] = [-1, 6, 7, 2.5, 0.9, np.nan, 5, 4, 3, 2, 1, 0, -0.5, 1e9, -3, 2, 2, 2, 2, 2]
    got = flat_predict(arrays, rows, 1)[:, 0]
    assert np.array_equal(got, booster.predict(rows, raw_score=True))
    assert len(trees_bytes(arrays, 3, [0.5])) > 0


def test_export_refuses_flat_trees_that_differ(demand_art, tmp_path, monkeypatch):
    import replaylab.artifacts.demand_export as de

    _, _, run = demand_art

    def off_by_an_ulp(model):
        a = flat_trees(model)
        a["leaf_value"] = np.nextafter(a["leaf_value"], np.inf)
        return a

    monkeypatch.setattr(de, "flat_trees", off_by_an_ulp)
    summary = {"splits": {"rows": {}}, "test": {}}
    with pytest.raises(DemandExportError, match="flat trees differ"):
        export_demand(run, summary, tmp_path / "never")
    assert not (tmp_path / "never").exists()


# ---------------------------------------------------------------- Rust side
def _run(binary: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), *args], input=stdin, capture_output=True, text=True,
                          timeout=300)


def test_rust_golden_vectors_hold(binary, demand_art):
    _, art, _ = demand_art
    proc = _run(binary, "demand-golden", str(art))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = json.loads(proc.stdout)
    n = s["n_cases"]
    assert n >= 30 and s["ok"]
    assert s["features_equal"] == n and s["raw_cases"] == n and s["raw_max_abs"] == 0.0
    assert s["exact_agreement"] == 1.0 and s["hint_max_rel"] <= 1e-12


def _variants(reqs: list[dict], thresholds: dict[str, list[float]]) -> list[dict]:
    """Edge-case requests derived from real ones (each tagged in request_id)."""
    hist = [k for k in reqs[0] if k.startswith("hist_")]
    cats = ["category", "decision", "selected_model", "slo_class", "region"]
    edits = {
        "no-max": lambda r: r.pop("max_tokens"), "null-max": lambda r: r.update(max_tokens=None),
        "neg-max": lambda r: r.update(max_tokens=-1), "no-cached": lambda r: r.pop(
            "cached_prompt_tokens", None),
        "null-stream": lambda r: r.update(streaming=None), "no-stream": lambda r: r.pop("streaming"),
        "bool-cached": lambda r: r.update(cached_prompt_tokens=True),
        "first-turn": lambda r: [r.pop(h) for h in hist],
        "only-ended": lambda r: [r.pop(h) for h in hist if h != "hist_turns_ended"],
        "null-mean": lambda r: r.update(hist_completion_mean=None),
        "iso-ts": lambda r: r.update(timestamp=datetime.fromtimestamp(
            r["timestamp"] / 1000, UTC).isoformat()),
        "naive-ts": lambda r: r.update(timestamp=datetime.fromtimestamp(
            r["timestamp"] / 1000, UTC).replace(tzinfo=None).isoformat(sep=" ")),
        "float-ts": lambda r: r.update(timestamp=r["timestamp"] + 0.7),
        "no-ts": lambda r: r.pop("timestamp"),
        "bad-prompt": lambda r: r.update(prompt_tokens="12"),
        "no-prompt": lambda r: r.pop("prompt_tokens"),
        "bad-turn": lambda r: r.update(turn_index="x"),
        "bad-ts": lambda r: r.update(timestamp="yesterday"),
        "int-cat": lambda r: r.update(category=3), "null-model": lambda r: r.update(
            selected_model=None),
        **{f"unseen-{c}": lambda r, c=c: r.update({c: UNSEEN}) for c in cats},
        **{f"null-{c}": lambda r, c=c: r.update({c: None}) for c in cats},
    }
    out = []
    for i, (tag, edit) in enumerate(edits.items()):
        for j in range(3):
            r = dict(reqs[(7 * i + j) % len(reqs)])
            edit(r)
            r["request_id"] = f"{r.get('request_id')}+{tag}"
            out.append(r)
    k = 0
    for name, values in thresholds.items():  # request / history fields at split thresholds
        for t in values:
            for v in (t, float(np.nextafter(t, -np.inf)), float(np.nextafter(t, np.inf))):
                r = dict(reqs[k % len(reqs)])
                k += 1
                r[name] = v
                r["request_id"] = f"{r.get('request_id')}+{name}={v!r}"
                out.append(r)
    return out


def test_rust_hints_equal_the_python_runtime(binary, demand_art):
    run_dir, art, run = demand_art
    manifest = json.loads((art / "manifest.json").read_text())
    features = manifest["features"]
    rows = _test_rows(run_dir)
    base = [_request(rec) for rec in rows.to_dict("records")]
    arrays = flat_trees(run.model)
    direct = {f["name"]: j for j, f in enumerate(features)
              if f["kind"] != "category" and f["source"] != "calendar"}
    thresholds = {name: sorted(set(arrays["node_threshold"][
        (arrays["node_feature"] == j) & ((arrays["node_decision"] & 1) == 0)].tolist()))
        for name, j in direct.items()}
    requests = [json.loads(json.dumps(r)) for r in base + _variants(base, thresholds)]
    now_s = datetime.fromisoformat(manifest["created_at"]).timestamp() + 3600.0
    now_ms = int(now_s * 1000)
    proc = _run(binary, "demand", str(art), "--explain", "--now-ms", str(now_ms),
                stdin="\n".join(json.dumps(r) for r in requests) + "\n")
    assert proc.returncode == 0, proc.stderr
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    predictor = DemandPredictor.load(art, clock=lambda: now_s, online=False)
    assert predictor.loaded, predictor.reason
    want = predictor.predict_batch(requests)
    assert len(got) == len(want) == len(requests)
    worst_abs = worst_rel = 0.0
    reasons = set()
    for r, g, w in zip(requests, got, want, strict=True):
        where = r.get("request_id")
        assert g["request_id"] == w.request_id, where
        assert (g["hint_fallback"], g["fallback_reason"]) == (w.hint_fallback,
                                                              w.fallback_reason), where
        assert g["hint_model_version"] == w.hint_model_version, where
        reasons.add(w.fallback_reason)
        for k in HINTS:
            a, b = g[k], getattr(w, k)
            worst_abs = max(worst_abs, abs(a - b))
            worst_rel = max(worst_rel, abs(a - b) / max(abs(b), 1.0))
        if not w.hint_fallback:
            assert (g["correction_cell"], g["correction"]) == (w.correction_cell,
                                                               w.correction), where
            assert g["hint_interval"] == w.hint_interval
    # the ONNX graph sums its trees in its own order: the hints agree to a few ulps
    assert worst_rel <= 1e-12, (worst_abs, worst_rel)
    assert {None, "bad_request", "missing_prompt_tokens"} <= reasons
    # every tree's leaf and the raw sums are LightGBM's, on Rust's own feature rows
    encoded = [g for g in got if g["features"]]
    X = np.array([[np.nan if v is None else v for v in g["features"]] for g in encoded])
    leaves = _raw_lightgbm(run.model, X, pred_leaf=True)
    assert np.array_equal(np.array([g["leaves"] for g in encoded]), leaves)
    assert np.array_equal(np.array([g["raw"] for g in encoded]),
                          _raw_lightgbm(run.model, X, raw_score=True))
    # the untouched test rows encode as the training design does
    assert np.array_equal(X[:len(base)], schema_matrix(rows, [FeatureSpec.from_dict(f) for f in features]),
                          equal_nan=True)
    print(f"rust vs python runtime: {len(requests)} requests ({len(encoded)} encoded, "
          f"{X.shape[0] * leaves.shape[1]} tree walks), hint max abs {worst_abs:.3g}, "
          f"max rel {worst_rel:.3g}")


def _rebuilt(art: Path, dst: Path):
    """A copy whose manifest is rebuilt over the (edited) files: every hash valid."""
    shutil.copytree(art, dst)
    m = json.loads((art / "manifest.json").read_text())
    keep = {k: m[k] for k in ("contracts", "features", "outputs", "calibration", "training",
                              "runtime", "fallback")}
    return dst, lambda: write_manifest(dst, build_manifest(
        dst, kind="demand", version="1.0.0", valid_days=30, **keep))


def test_rust_refuses_a_tampered_artifact(binary, demand_art, tmp_path):
    _, art, run = demand_art
    bad = tmp_path / "flipped"
    shutil.copytree(art, bad)
    data = bytearray((bad / TREES_FILE).read_bytes())
    data[-3] ^= 1
    (bad / TREES_FILE).write_bytes(bytes(data))
    for cmd in ("demand-golden", "demand"):
        proc = _run(binary, cmd, str(bad), stdin="")
        assert proc.returncode == 2 and proc.stderr.startswith("error: hash_mismatch"), proc.stderr
    # valid hashes over broken trees: a child pointing back at its parent (a cycle)
    arrays = flat_trees(run.model)
    arrays["node_left"] = arrays["node_left"].copy()
    arrays["node_left"][int(np.flatnonzero(arrays["node_left"] >= 0)[0])] = 0
    features = json.loads((art / "manifest.json").read_text())["features"]
    cyclic, rebuild = _rebuilt(art, tmp_path / "cyclic")
    (cyclic / TREES_FILE).write_bytes(trees_bytes(arrays, len(features), [0.1, 0.5, 0.9]))
    rebuild()
    proc = _run(binary, "demand-golden", str(cyclic))
    assert proc.returncode == 2 and proc.stderr.startswith("error: trees"), proc.stderr
    # valid hashes, a leaf value one ulp off: the golden raw scores catch it
    arrays = flat_trees(run.model)
    arrays["leaf_value"] = np.nextafter(arrays["leaf_value"], np.inf)
    ulp, rebuild = _rebuilt(art, tmp_path / "ulp")
    (ulp / TREES_FILE).write_bytes(trees_bytes(arrays, len(features), [0.1, 0.5, 0.9]))
    rebuild()
    proc = _run(binary, "demand-golden", str(ulp))
    assert proc.returncode == 1 and not json.loads(proc.stdout)["ok"]
    assert json.loads(proc.stdout)["raw_max_abs"] > 0
    proc = _run(binary, "demand", str(ulp), stdin="{}\n")
    assert proc.returncode == 2 and proc.stderr.startswith("error: golden_mismatch")


@pytest.mark.slow
def test_cargo_test_against_the_artifact(binary, demand_art):
    _, art, _ = demand_art
    cargo = find_cargo()
    env = {**cargo_env(cargo), "REPLAYLAB_DEMAND_ARTIFACT": str(art)}
    # --nocapture: the tests' stderr names each artifact they checked (the fixture, then this)
    proc = subprocess.run([cargo, "test", "--offline", "--test", "demand", "--", "--nocapture"],
                          cwd=CRATE, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "test result: ok. 3 passed" in proc.stdout, proc.stdout[-2000:]
    assert f"{art}: " in proc.stderr and "not set" not in proc.stderr
