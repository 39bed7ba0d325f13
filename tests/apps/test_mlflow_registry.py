"""Integration: the Model Registry through a real `mlflow server` on loopback (docs/howto/mlflow.md).

Two tiny seeded demand runs on the same ledger (so the same test window) register
versions at the end of `python -m training pipeline=demand`, the second scored
against the first (the champion then) on its own test rows; a third on another
ledger registers without that score. Two router-kind folders (a go and a no-go
verdict, manifests built by the manifest module, one same stand-in encoder file
over the store-once size) are registered with `python -m export register`.
Then: the gate promotes and refuses, reads the champion's scores on the
challenger's rows, refuses another window until `compare ledger=` scored it
there; force needs and logs a reason; serving fetches by alias and picks up an
alias change; files altered in the artifact store are refused at fetch; the
encoder is uploaded once and both versions reassemble and verify. Both compare
reports and the MLflow UI model and version pages are opened in headless
Chromium; screenshots go to tests/screenshots/.

The session's one server (tests/conftest.py `mlflow_server`) under this file's own model
names; demand v1 is the session's logged demand run (tests/apps/conftest.py); the other
runs and every `python -m export` run in process (tests/helpers/entrypoints.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from replaylab.apps.provenance import hmac_key
from replaylab.contracts.manifest import build_manifest, verify_manifest, write_manifest
from tests.apps.conftest import REGISTRY_DEMAND, REGISTRY_EXPERIMENT, REGISTRY_ROUTER
from tests.conftest import REPO
from tests.helpers import entrypoints
from tests.helpers.router import ONE_HEAD

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ARTIFACTS = REPO / "tests" / "screenshots"
DEMAND, ROUTER = REGISTRY_DEMAND, REGISTRY_ROUTER
NAMES = (f"export.registry.names.demand={DEMAND}", f"export.registry.names.router={ROUTER}")


def ink(png: bytes) -> float:
    """Share of non-white pixels of a screenshot."""
    import io

    import numpy as np
    from PIL import Image

    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    return float(np.mean(img.min(axis=2) < 225))


@pytest.fixture(scope="module")
def server(mlflow_server):
    """The session's server (tests/conftest.py); this file's model names are its own."""
    return mlflow_server


def export(url: str, *args: str, run_dir: Path) -> tuple[entrypoints.EntryRun, dict]:
    """`python -m export *args` on the server, in process: (the run, its summary)."""
    run = entrypoints.export(*args, f"tracking.uri={url}",
                             f"tracking.experiment={REGISTRY_EXPERIMENT}", *NAMES,
                             run_dir=run_dir)
    return run, run.summary


def client(url: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=url, registry_uri=url)


ENCODER_BYTES = 1_300_000  # over export.registry.blob_min_bytes (1 MiB): stored once


def encoder_bytes() -> bytes:
    """A stand-in encoder file, the same for every router folder (seeded)."""
    import numpy as np

    return np.random.default_rng(17).integers(0, 256, ENCODER_BYTES, dtype=np.uint8).tobytes()


def fake_router_run(folder: Path, go: bool, quality: float) -> Path:
    """A finished run folder holding a router-kind artifact (a manifest over its config
    file and a stand-in encoder/) and a summary with the test section the compare view
    reads (each policy's quality and cost with intervals, and curves)."""
    art = folder / "artifacts" / "router"
    (art / "encoder").mkdir(parents=True)
    (art / "router.json").write_text(json.dumps({"threshold": 0.5, "quality": quality}))
    (art / "encoder" / "encoder.onnx").write_bytes(encoder_bytes())
    (art / "encoder" / "tokenizer.json").write_text(json.dumps({"vocab": ["a", "b"]}))
    test = {p: {"quality": q, "cost": c, "ci": {"quality": [q - 0.03, q + 0.03],
                                                 "cost": [c * 0.9, c * 1.1]}}
            for p, q, c in (("learned", quality, 0.004), ("rules", 0.78, 0.006),
                            ("cheap_only", 0.6, 0.0001), ("strong_only", 0.9, 0.012))}
    m = build_manifest(art, kind="router", version="1.0.0", contracts={"outcomes": "1"},
                       valid_days=30, features=[{"name": "text"}], outputs={}, calibration={},
                       training={"go": go, "go_reasons": ["seeded test verdict"], "prompts": 400,
                                 "test": test}, runtime={}, fallback={})
    write_manifest(art, m, hmac_key=hmac_key())  # signed with the tests' key (conftest)
    (folder / "summary.json").write_text(json.dumps({"pipeline": "router", "test": test,
                                                     "go": go}))
    return folder


@pytest.fixture(scope="module")
def registry(server, logged_demand_run, tmp_path_factory):
    """Demand v1 (60 trees: the session's logged demand run) and v2 (20 trees) on one
    ledger, v2 registered while v1 is the champion (so scored against it); v3 on another
    ledger (800 sessions), not scored; router v1 (go) and v2 (no-go)."""
    url, store = server
    tmp = tmp_path_factory.mktemp("runs")
    runs = {"demand1": logged_demand_run}
    # setup, not the gate: the champion v2 is registered against
    client(url).set_registered_model_alias(DEMAND, "champion", "1")
    for v, sessions, trees, extra in ((2, 600, 20, ()),
                                      (3, 800, 60, ("export.registry.rescore_alias=null",))):
        out = tmp / f"demand{v}"
        runs[f"demand{v}"] = entrypoints.train(
            "pipeline=demand", f"data.synthetic.n_sessions={sessions}",
            f"demand.model.n_estimators={trees}", f"tracking.uri={url}",
            f"tracking.experiment={REGISTRY_EXPERIMENT}", *NAMES, *extra,
            run_dir=out).summary | {"dir": str(out)}
    for v, go in ((1, True), (2, False)):
        folder = fake_router_run(tmp / f"router{v}", go, 0.85 if go else 0.80)
        proc, s = export(url, "register", f"run_dir={folder}", run_dir=tmp / f"reg-router{v}")
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs[f"router{v}"] = s | {"dir": str(folder)}
    return url, store, runs, tmp


def test_register_puts_verified_folders_in_the_registry_with_their_tags(registry):
    url, _, runs, _ = registry
    c = client(url)
    assert [r["version"] for r in runs["demand1"]["registry"]] == [1]
    assert [r["version"] for r in runs["demand2"]["registry"]] == [2]
    assert [r["version"] for r in runs["demand3"]["registry"]] == [3]
    for v in (1, 2, 3):
        s = runs[f"demand{v}"]
        m = verify_manifest(Path(s["artifacts"]["demand"]))
        mv = c.get_model_version(DEMAND, str(v))
        t = mv.tags
        assert t["replaylab.content_hash"] == m["content_hash"] == s["export"]["content_hash"]
        assert t["replaylab.data_fingerprint"] == s["ledger_fingerprint"]
        assert t["replaylab.projection_version"] == m["training"]["projection_version"]
        assert float(t["replaylab.metric.test_mean_pinball"]) == pytest.approx(
            s["test"]["model"]["mean_pinball"])
        # the registry's verdict is the run's own gate, as its report prints it
        assert t["replaylab.go"] == str(s["gate"]["go"]).lower()
        assert t["replaylab.go_reasons"] == "; ".join(s["gate"]["reasons"])
        assert t["replaylab.gate_rule"] == s["gate"]["rule"] == m["training"]["gate"]["rule"]
        html = Path(s["reports"]["html"]).read_text()
        assert f">{'GO' if s['gate']['go'] else 'NO-GO'}</span>" in html
        assert json.loads(t["replaylab.signature"])["inputs"]
        assert mv.run_id == s["mlflow"]["run_id"]
        run = c.get_run(mv.run_id)
        assert run.data.tags[f"replaylab.registered.{DEMAND}"] == str(v)
        # one logging route for both kinds: logged with the run under its kind's path,
        # registered from there (a demand folder is small: nothing stored apart)
        reg = s["registry"][0]
        assert reg["artifact_path"] == "demand_artifact" and mv.source.endswith(
            "/demand_artifact")
        assert t["replaylab.blobs"] == "uploaded 0, reused 0"
        assert {f.path for f in c.list_artifacts(mv.run_id, "demand_artifact")} == {
            f"demand_artifact/{e['path']}" for e in m["files"]} | {
            "demand_artifact/manifest.json"}
    # same ledger and split: the same test window, so the pinballs are comparable
    w = {c.get_model_version(DEMAND, v).tags["replaylab.test_window"] for v in ("1", "2")}
    assert len(w) == 1
    assert c.get_model_version(DEMAND, "3").tags["replaylab.test_window"] not in w
    r1, r2 = (c.get_model_version(ROUTER, v).tags for v in ("1", "2"))
    assert (r1["replaylab.go"], r2["replaylab.go"]) == ("true", "false")
    for v in ("1", "2"):
        assert c.get_model_version(ROUTER, v).source.endswith("/router_artifact")
        assert runs[f"router{v}"]["registry"][0]["artifact_path"] == "router_artifact"
    assert float(r1["replaylab.metric.learned.quality"]) == 0.85


def test_champion_is_scored_on_the_challengers_test_rows_at_registration(registry):
    """v2 was registered while v1 was the champion: v1's artifact, fetched and verified,
    was scored on v2's test rows by the runtime and the pipeline's metric code. Same
    ledger and split, so those are v1's own test rows: the scores must be v1's pipeline
    scores (and v2's re-scored figures v2's), group by group."""
    url, _, runs, tmp = registry
    c = client(url)
    s1, s2 = runs["demand1"], runs["demand2"]
    t = c.get_model_version(DEMAND, "2").tags
    v = "replaylab.vs.v1."
    assert t[v + "champion_content_hash"] == s1["export"]["content_hash"]
    assert t[v + "rows"] == str(s2["test"]["labelled_rows"]) and t[v + "same_rows"] == "true"
    assert t[v + "levels"] == "0.1,0.5,0.9" and t[v + "rows_source"] == "run folder"
    assert float(t[v + "champion.mean_pinball"]) == pytest.approx(
        s1["test"]["model"]["mean_pinball"], rel=1e-6)
    assert float(t[v + "challenger.mean_pinball"]) == pytest.approx(
        s2["test"]["model"]["mean_pinball"], rel=1e-6)
    assert float(t[v + "champion.coverage"]) == pytest.approx(s1["test"]["model"]["coverage"])
    better = s2["test"]["model"]["mean_pinball"] < s1["test"]["model"]["mean_pinball"]
    assert t[v + "challenger_better"] == str(better).lower()
    assert s2["registry"][0]["rescore"]["challenger_better"] == better
    # the gate's number: the paired session-bootstrap interval of challenger - champion
    delta = s2["registry"][0]["rescore"]["delta"]
    assert delta["delta"] == pytest.approx(s2["test"]["model"]["mean_pinball"]
                                           - s1["test"]["model"]["mean_pinball"], rel=1e-5)
    assert json.loads(t[v + "delta_ci"]) == pytest.approx(delta["ci"])
    assert delta["ci"][0] <= delta["delta"] <= delta["ci"][1] and delta["resampled"] == "sessions"
    for g in s1["test"]["groups"]:  # coverage by group, in the tag
        assert f"{g['by']}={g['value']}: {g['coverage']:.3f} (n={g['n']})" in \
            t[v + "champion.coverage_by_group"]
    # the full scores: a JSON file and metrics of the training run that registered v2
    run_id = s2["mlflow"]["run_id"]
    assert t[v + "scored_in_run"] == run_id
    doc = json.loads(Path(c.download_artifacts(run_id, t[v + "scores_json"],
                                               str(tmp))).read_text())
    got = {(g["by"], g["value"]): g for g in doc["scores"]["champion"]["groups"]}
    for g in s1["test"]["groups"]:
        assert got[(g["by"], g["value"])]["coverage"] == pytest.approx(g["coverage"])
        assert got[(g["by"], g["value"])]["mean_pinball"] == pytest.approx(g["mean_pinball"],
                                                                          rel=1e-6)
    metrics = c.get_run(run_id).data.metrics
    assert metrics["rescore.vs_v1.champion.mean_pinball"] == pytest.approx(
        s1["test"]["model"]["mean_pinball"], rel=1e-6)
    # v1 (the champion when it was registered) and v3 (rescore_alias=null) carry none
    assert not any(".vs." in k for k in c.get_model_version(DEMAND, "1").tags)
    assert not any(".vs." in k for k in c.get_model_version(DEMAND, "3").tags)


def test_another_window_is_refused_until_compare_scores_the_champion_there(registry):
    from replaylab.artifacts.rescore_demand import run_test_rows, score_artifact
    from replaylab.runtime import DemandPredictor

    url, _, runs, tmp = registry
    c = client(url)
    c.set_registered_model_alias(DEMAND, "window", "1")
    s1, s3 = runs["demand1"], runs["demand3"]
    proc, s = export(url, "promote", f"name={DEMAND}", "version=3", "alias=window",
                     "export.new_alias=true", run_dir=tmp / "window-refused")
    assert proc.returncode == 3, proc.stderr[-2000:]
    why = " ".join(s["promotion"]["reasons"])
    assert "never scored on this version's test rows" in why and "another window" in why
    assert "ledger=" in why  # it says how to score it
    # the wrong ledger is refused (a bad input: exit 2), nothing recorded
    proc, _ = export(url, "compare", f"name={DEMAND}", "version=3", "alias=window",
                     f"ledger={s1['artifacts']['ledger']}", run_dir=tmp / "window-wrong")
    assert proc.returncode == 2 and "not its ledger" in proc.stderr
    assert not any(".vs." in k for k in c.get_model_version(DEMAND, "3").tags)
    # its own ledger: v1 is scored on v3's test rows (re-derived from the ledger)
    proc, s = export(url, "compare", f"name={DEMAND}", "version=3", "alias=window",
                     f"ledger={s3['artifacts']['ledger']}", run_dir=tmp / "window-compare")
    assert proc.returncode == 0, proc.stderr[-2000:]
    cmp = s["compare"]["rescore"]
    assert cmp["rows"] == s3["test"]["rows"] and cmp["challenger"]["scored_rows"] == \
        s3["test"]["labelled_rows"]
    assert cmp["challenger"]["mean_pinball"] == pytest.approx(
        s3["test"]["model"]["mean_pinball"], rel=1e-6)
    # the same numbers as scoring v1's own folder on v3's run-folder rows here
    rows = run_test_rows(Path(s3["dir"]) / "features.parquet",
                         Path(s3["dir"]) / "predictions_test.parquet")
    direct = score_artifact(DemandPredictor.load(Path(s1["artifacts"]["demand"]), online=False),
                            rows, ("selected_model", "category", "slo_class"))
    assert cmp["champion"]["mean_pinball"] == pytest.approx(direct["model"]["mean_pinball"],
                                                            rel=1e-9)
    assert direct["model"]["mean_pinball"] != pytest.approx(s1["test"]["model"]["mean_pinball"])
    text = Path(s["reports"]["compare"]).read_text()
    assert "<h2>Champion re-scored on the challenger's test rows</h2>" in text
    t = c.get_model_version(DEMAND, "3").tags
    assert t["replaylab.vs.v1.rows_source"].startswith("ledger ")
    # now the gate decides on those scores
    proc, s = export(url, "promote", f"name={DEMAND}", "version=3", "alias=window",
                     "export.new_alias=true", run_dir=tmp / "window-decided")
    why = " ".join(s["promotion"]["reasons"])
    assert "re-scored on this version's" in why and "paired 95% interval" in why, why
    passed = s3["gate"]["go"] and cmp["delta"]["ci"][1] < 0
    assert s["promotion"]["gate_passed"] == passed and proc.returncode == (0 if passed else 3)


def test_promotion_gate_allows_refuses_and_records_every_decision(registry):
    """v1 onto the alias that points at it (no other champion: its own gate decides), then
    v2 against it: v2's own gate and the paired interval of its pinball against v1's on
    its rows (upper bound below 0)."""
    url, _, runs, tmp = registry
    c = client(url)
    s1, s2 = runs["demand1"], runs["demand2"]
    proc, s = export(url, "promote", f"name={DEMAND}", "version=1", "alias=champion",
                     run_dir=tmp / "promote-v1")
    assert s["promotion"]["decision"] == ("promoted" if s1["gate"]["go"] else "refused")
    assert proc.returncode == (0 if s1["gate"]["go"] else 3), proc.stderr[-2000:]
    assert c.get_model_version_by_alias(DEMAND, "champion").version == "1"
    ci = s2["registry"][0]["rescore"]["delta"]["ci"]
    passed = s2["gate"]["go"] and ci[1] < 0
    proc, s = export(url, "promote", f"name={DEMAND}", "version=2", "alias=champion",
                     run_dir=tmp / "promote-v2")
    assert proc.returncode == (0 if passed else 3), proc.stderr[-2000:]
    assert s["promotion"]["decision"] == ("promoted" if passed else "refused")
    assert s["promotion"]["gate_passed"] == passed
    assert any("paired 95% interval" in r for r in s["promotion"]["reasons"])
    assert c.get_model_version_by_alias(DEMAND, "champion").version == ("2" if passed else "1")
    run = c.get_run(s["mlflow"]["run_id"])
    assert run.data.tags["registry.decision"] == s["promotion"]["decision"]
    assert run.data.tags["registry.previous"] == "1"
    names = {a.path for a in c.list_artifacts(run.info.run_id, "reports")}
    assert "reports/compare_report.html" in names  # the compare view, logged with the decision
    # the router gate reads the go/no-go verdict
    proc, s = export(url, "promote", f"name={ROUTER}", "version=2", "alias=champion",
                     run_dir=tmp / "promote-nogo")
    assert proc.returncode == 3 and s["promotion"]["decision"] == "refused"
    proc, s = export(url, "promote", f"name={ROUTER}", "version=1", "alias=champion",
                     run_dir=tmp / "promote-go")
    assert proc.returncode == 0 and s["promotion"]["decision"] == "promoted"
    assert c.get_model_version_by_alias(ROUTER, "champion").version == "1"


def test_force_needs_a_reason_and_logs_it(registry):
    url, _, _, tmp = registry
    c = client(url)
    proc, _ = export(url, "promote", f"name={ROUTER}", "version=2", "alias=forced", "force=true",
                     "export.new_alias=true", run_dir=tmp / "force-no-reason")
    assert proc.returncode == 2 and "reason" in proc.stderr
    proc, s = export(url, "promote", f"name={ROUTER}", "version=2", "alias=forced", "force=true",
                     "reason='incident 42: reviewer approved'", "export.new_alias=true",
                     run_dir=tmp / "force")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert s["promotion"]["decision"] == "forced" and not s["promotion"]["gate_passed"]
    assert c.get_model_version_by_alias(ROUTER, "forced").version == "2"
    tags = c.get_run(s["mlflow"]["run_id"]).data.tags
    assert tags["registry.force"] == "true"
    assert tags["registry.reason"] == "incident 42: reviewer approved"
    # served, but said so: FORCED with the reason
    proc, f = export(url, "fetch", f"name={ROUTER}", "alias=forced",
                     f"out={tmp / 'serve-forced' / 'router'}", run_dir=tmp / "fetch-forced")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f["fetch"]["forced"] is True and f["fetch"]["gated"] is False
    assert f["fetch"]["forced_reason"] == "incident 42: reviewer approved"
    assert "FORCED" in proc.stderr + proc.stdout


def test_fetch_by_alias_picks_up_an_alias_change(registry):
    from replaylab.runtime import DemandPredictor

    url, _, runs, tmp = registry
    c = client(url)
    c.set_registered_model_alias(DEMAND, "serving", "1")  # by hand: outside the gate
    out = tmp / "serve" / "demand"
    proc, s = export(url, "fetch", f"name={DEMAND}", "alias=serving", f"out={out}",
                     run_dir=tmp / "fetch0")
    assert proc.returncode == 2 and "outside the promotion gate" in proc.stderr
    assert not out.exists()
    proc, s = export(url, "fetch", f"name={DEMAND}", "alias=serving", f"out={out}",
                     "export.allow_ungated=true", run_dir=tmp / "fetch1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert s["fetch"]["allowed_ungated"] and not s["fetch"]["gated"]
    p = DemandPredictor.load(out)
    assert p.loaded and p.manifest["content_hash"] == runs["demand1"]["export"]["content_hash"]
    c.set_registered_model_alias(DEMAND, "serving", "2")
    proc, s = export(url, "fetch", f"name={DEMAND}", "alias=serving", f"out={out}",
                     "export.allow_ungated=true", run_dir=tmp / "fetch2")
    assert proc.returncode == 0 and s["fetch"]["version"] == 2
    p = DemandPredictor.load(out)
    assert p.loaded and p.manifest["content_hash"] == runs["demand2"]["export"]["content_hash"]
    row = {"prompt_tokens": 300, "max_tokens": 800, "category": "chat"}
    original = DemandPredictor.load(Path(runs["demand2"]["artifacts"]["demand"]))
    assert p.predict(row).hint_p50 == original.predict(row).hint_p50


def test_files_altered_in_the_store_are_refused_at_fetch(registry):
    from replaylab.runtime import DemandPredictor

    url, store, runs, tmp = registry
    c = client(url)
    # a version of its own (re-registered from run 1's folder), so the other tests keep theirs
    proc, s = export(url, "register", f"run_dir={runs['demand1']['dir']}",
                     "export.allow_duplicate=true", run_dir=tmp / "reg-tamper")
    assert proc.returncode == 0, proc.stderr[-2000:]
    version = str(s["registry"][0]["version"])
    run_id = s["mlflow"]["run_id"]
    stored = next(store.rglob(f"{run_id}/artifacts/demand_artifact/model.onnx"))
    good = tmp / "serve-tamper" / "demand"
    c.set_registered_model_alias(DEMAND, "tamper", version)
    proc, _ = export(url, "fetch", f"name={DEMAND}", "alias=tamper", f"out={good}",
                     "export.allow_ungated=true", run_dir=tmp / "fetch-before")
    assert proc.returncode == 0, proc.stderr[-2000:]
    before = (good / "manifest.json").read_bytes()
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, same size
    stored.write_bytes(bytes(data))
    proc, s = export(url, "fetch", f"name={DEMAND}", "alias=tamper", f"out={good}",
                     "export.allow_ungated=true", run_dir=tmp / "fetch-after")
    assert proc.returncode == 2 and "hash_mismatch" in proc.stderr
    assert (good / "manifest.json").read_bytes() == before  # the old verified folder stays
    assert DemandPredictor.load(good).loaded
    fresh = tmp / "serve-fresh" / "demand"
    proc, _ = export(url, "fetch", f"name={DEMAND}", "alias=tamper", f"out={fresh}",
                     "export.allow_ungated=true", run_dir=tmp / "fetch-fresh")
    assert proc.returncode == 2 and not fresh.exists()
    assert not DemandPredictor.load(fresh).loaded  # nothing there: the runtime falls back
    # and the gate will not move an alias onto it, not even forced
    proc, s = export(url, "promote", f"name={DEMAND}", f"version={version}", "alias=champion2",
                     "force=true", "reason=test", "export.new_alias=true",
                     run_dir=tmp / "promote-tampered")
    assert proc.returncode == 3 and not s["promotion"]["verified"]


def test_router_encoder_is_stored_once_and_both_versions_reassemble(registry):
    """Router v1 and v2 share one encoder file over blob_min_bytes: v1 uploads it to the
    content-addressed store, v2 finds its sha256 there and uploads nothing; each fetch
    puts it back and verifies the whole folder; an altered stored copy is refused."""
    import hashlib

    url, store, runs, tmp = registry
    c = client(url)
    b1, b2 = (runs[f"router{v}"]["registry"][0]["blobs"] for v in (1, 2))
    assert (b1["uploaded"], b1["reused"], b1["bytes_uploaded"]) == (1, 0, ENCODER_BYTES)
    assert (b2["uploaded"], b2["reused"], b2["bytes_uploaded"]) == (0, 1, 0)
    sha = hashlib.sha256(encoder_bytes()).hexdigest()
    copies = [f for f in store.rglob("*") if f.is_file() and f.stat().st_size == ENCODER_BYTES]
    assert [f.name for f in copies] == [sha]  # one copy in the whole store, named by content
    assert not list(store.rglob("router_artifact/encoder/encoder.onnx"))
    for v in (1, 2):  # (the session's store holds other files' runs: these two runs')
        run_id = runs[f"router{v}"]["mlflow"]["run_id"]
        assert len(list(store.rglob(f"{run_id}/artifacts/router_artifact/blobs.json"))) == 1
    assert c.get_model_version(ROUTER, "2").tags["replaylab.blobs"] == "uploaded 0, reused 1"
    for v in ("1", "2"):
        out = tmp / f"serve-router{v}" / "router"
        proc, s = export(url, "fetch", f"name={ROUTER}", f"version={v}", f"out={out}",
                         "export.allow_ungated=true", run_dir=tmp / f"fetch-router{v}")
        assert proc.returncode == 0, proc.stderr[-2000:]
        m = verify_manifest(out, required_kind="router")
        assert m["content_hash"] == c.get_model_version(ROUTER, v).tags["replaylab.content_hash"]
        assert (out / "encoder" / "encoder.onnx").read_bytes() == encoder_bytes()
        assert not (out / "blobs.json").exists()
    # the one stored copy altered in place: every version using it is refused at fetch
    blob, good = copies[0], copies[0].read_bytes()
    data = bytearray(good)
    data[len(data) // 3] ^= 0xFF
    blob.write_bytes(bytes(data))
    try:
        bad = tmp / "serve-router-bad" / "router"
        proc, _ = export(url, "fetch", f"name={ROUTER}", "version=2", f"out={bad}",
                         "export.allow_ungated=true", run_dir=tmp / "fetch-router-bad")
        assert proc.returncode == 2 and "hash_mismatch" in proc.stderr and not bad.exists()
    finally:
        blob.write_bytes(good)


REAL = "replaylab-router-real"


@pytest.fixture(scope="module")
def real_routers(server, tmp_path_factory):
    """Two real `pipeline=router` runs (MiniLM, the shipped GSM8K outcomes, seeds 0 and 3:
    other test prompts) registered under their own name; v1 is the champion when v2 is
    registered, so v2's run scores both routers on v2's test prompts."""
    url, store = server
    tmp = tmp_path_factory.mktemp("real-routers")
    runs = {}
    for v, seed in ((1, 0), (2, 3)):
        out = tmp / f"router{v}"
        # the real encoder and data; one head per run, not the default's selection among
        # 4, 5 teachers, 3 seeds and two replay selections (the test is about registration
        # and re-scoring)
        runs[v] = entrypoints.train("pipeline=router", f"seed={seed}", *ONE_HEAD,
                                    "router.go.n_boot=200",
                                    "router.evaluation.n_boot=200",
                                    f"export.registry.names.router={REAL}",
                                    f"tracking.uri={url}",
                                    f"tracking.experiment={REGISTRY_EXPERIMENT}",
                                    run_dir=out).summary | {"dir": str(out)}
        if v == 1:
            client(url).set_registered_model_alias(REAL, "champion", "1")
    return url, store, runs, tmp


def test_real_router_champion_is_scored_on_the_challengers_prompts(real_routers):
    from tests.helpers.reports import browse, page_stderr_problems

    url, store, runs, tmp = real_routers
    c = client(url)
    r1, r2 = runs[1]["registry"][0], runs[2]["registry"][0]
    # the MiniLM encoder files: uploaded by the first registration only
    assert r1["blobs"]["uploaded"] >= 1 and r1["blobs"]["bytes_uploaded"] > 50_000_000
    assert r2["blobs"] == {"uploaded": 0, "reused": r1["blobs"]["uploaded"],
                           "bytes_uploaded": 0}
    t = c.get_model_version(REAL, "2").tags
    v = "replaylab.vs.v1."
    assert t[v + "champion_content_hash"] == c.get_model_version(REAL, "1").tags[
        "replaylab.content_hash"]
    learned = runs[2]["test"]["learned"]
    assert int(t[v + "rows"]) == r2["rescore"]["rows"] > 0
    # re-scored through the runtime, the challenger reproduces its pipeline test scores
    for k in ("quality", "cost", "cost_ratio_at_95"):
        assert float(t[v + f"challenger.{k}"]) == pytest.approx(learned[k], rel=1e-9), k
    assert json.loads(t[v + "challenger.quality_ci"]) == pytest.approx(learned["ci"]["quality"])
    # another split seed: another test window (the anchors' test scores differ)
    assert t["replaylab.test_window"] != c.get_model_version(REAL, "1").tags[
        "replaylab.test_window"]
    champ_q = float(t[v + "champion.quality"])
    assert 0 < champ_q <= 1 and champ_q != pytest.approx(runs[1]["test"]["learned"]["quality"])
    doc = json.loads(Path(c.download_artifacts(t[v + "scored_in_run"], t[v + "scores_json"],
                                               str(tmp))).read_text())
    for role in ("challenger", "champion"):
        curve = doc["scores"][role]["curve"]
        assert len(curve["cost"]) == len(curve["quality"]) > 2
    proc, s = export(url, "compare", f"name={REAL}", "version=2", "alias=champion",
                     run_dir=tmp / "compare-real")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = Path(s["reports"]["compare"])
    text = report.read_text()
    assert "<h2>Champion re-scored on the challenger's test prompts</h2>" in text
    assert "alt='rescore_router_curves'" in text
    got = browse(report.resolve().as_uri())
    assert got["console_errors"] == [] and got["exceptions"] == []
    assert len(got["images"]) >= 3 and all(i["w"] > 0 for i in got["images"])
    assert page_stderr_problems(got["stderr"], report.resolve().as_uri())[0] == []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "compare_report_router_real.png").write_bytes(got["png"])


def test_runtime_imports_no_mlflow():
    code = ("import sys, replaylab.runtime; "
            "print(any(m == 'mlflow' or m.startswith('mlflow.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


@pytest.mark.timeout(300)
def test_compare_report_and_model_page_in_chromium(registry):
    from tests.helpers.reports import browse, page_stderr_problems

    url, _, runs, tmp = registry
    client(url).set_registered_model_alias(DEMAND, "compared", "1")
    proc, s = export(url, "compare", f"name={DEMAND}", "version=2", "alias=compared",
                     run_dir=tmp / "compare-demand")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (s["compare"]["challenger"], s["compare"]["champion"]) == (2, 1)
    report = Path(s["reports"]["compare"])
    text = report.read_text()
    assert "Calibration and coverage by group" in text and "same data and test window" in text
    m1, m2 = (runs[f"demand{v}"]["test"]["model"] for v in (1, 2))
    p1, p2 = m1["mean_pinball"], m2["mean_pinball"]
    (a1, b1), (a2, b2) = m1["ci"]["mean_pinball"], m2["ci"]["mean_pinball"]
    assert (f"<td>{p2:.4g} <span class='ci'>[{a2:.4g}, {b2:.4g}]</span></td>"
            f"<td>{p1:.4g} <span class='ci'>[{a1:.4g}, {b1:.4g}]</span></td>"
            f"<td>{p2 - p1:.4g}</td>") in text  # each side's own, with its interval
    got = browse(report.resolve().as_uri())
    assert got["console_errors"] == [] and got["exceptions"] == []
    assert got["images"] and all(i["w"] > 0 for i in got["images"])
    assert page_stderr_problems(got["stderr"], report.resolve().as_uri())[0] == []
    # v2 was scored against v1 at registration: the report shows the recorded scores
    assert "champion scored on the challenger's test rows: <span class='ok'>yes</span>" in text
    assert "alt='rescore_group_coverage'" in text
    assert len(got["images"]) >= 3  # re-scored coverage by group, pinball, own coverage
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "compare_report_demand.png").write_bytes(got["png"])
    client(url).set_registered_model_alias(ROUTER, "compared", "1")
    proc, s = export(url, "compare", f"name={ROUTER}", "version=2", "alias=compared",
                     run_dir=tmp / "compare-router")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rreport = Path(s["reports"]["compare"])
    rtext = rreport.read_text()
    assert "Cost/quality curves" in rtext and "data:image/png;base64" in rtext
    assert "<td>0.85 <span class='ci'>[0.82, 0.88]</span></td>" in rtext  # v1's learned quality
    got = browse(rreport.resolve().as_uri())
    assert got["console_errors"] == [] and got["exceptions"] == []
    assert len(got["images"]) == 2 and all(i["w"] > 0 for i in got["images"])  # both curves
    assert page_stderr_problems(got["stderr"], rreport.resolve().as_uri())[0] == []
    assert ink(got["png"]) > 0.02
    (ARTIFACTS / "compare_report_router.png").write_bytes(got["png"])
    # the MLflow UI's model page (a single-page app: give its scripts time to render)
    shot = tmp / "model_page.png"
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={profile}", "--window-size=1600,2000",
             "--virtual-time-budget=20000", f"--screenshot={shot}",
             f"{url}/#/models/{DEMAND}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    png = shot.read_bytes()
    assert ink(png) > 0.02  # something was drawn, not a blank page
    (ARTIFACTS / "mlflow_model_page.png").write_bytes(png)
