"""Issue 43's "done means": a verdict no one can forge, on a real `mlflow server` on loopback.

Two signed demand-kind folders (manifests built by the manifest module: a GO verdict and a
NO-GO one in `training.gate`) and an unsigned GO one are registered with `python -m export
register`. Then every write the MLflow UI or client gives is tried, and each is refused
at `promote` or `fetch` with one line:

- `training.gate` rewritten to GO in a registered version's manifest.json in the artifact
  store (its content hash recomputed, or not): refused (the hash covers `training`, the
  signature covers everything), also with `export.allow_unsigned=true`;
- a promote run forged with the client (the tags a promote run writes, the version tag
  naming it, the alias), and a record signed with another key: refused at fetch;
- a refused promotion turned into "promoted" by three pencil edits (run tag, version tag,
  alias): refused at fetch (a refusal writes no signed record);
- a version's `replaylab.go` tag edited: refused at promote and at fetch, naming both
  values;
- an unsigned manifest: refused unless `export.allow_unsigned=true` (then one UNSIGNED line).

The bad-input paths (an alias not in `export.aliases`, force without a reason, a missing
run_dir) are one `error:` line, exit 2, and leave no run in the store; the runs list and
the model page are screenshot in headless Chromium (the decision word first).

On the session's one server (tests/conftest.py `mlflow_server`): the default demand name
is this file's alone there, its registry actions log to an experiment of their own
(`REGISTRY_EXPERIMENT`), and `python -m export` runs in process
(tests/helpers/entrypoints.py).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import pytest

from replaylab.apps.provenance import hmac_key
from replaylab.contracts.manifest import (
    build_manifest,
    canonical_json,
    content_hash,
    hmac_sha256,
    write_manifest,
)
from tests.conftest import REPO
from tests.helpers import entrypoints

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SHOTS = REPO / "tests" / "screenshots"
NAME = "replaylab-demand"
# where promote/fetch/compare log (export.registry.experiment; replaylab-registry by
# default): this file's own on the shared server, so its runs list is this file's
REGISTRY_EXPERIMENT = "it-forgery-registry"


def demand_run(folder: Path, go: bool, *, signed: bool = True) -> Path:
    """A finished run folder holding a demand-kind artifact whose `training.gate` is GO or
    NO-GO (both reasons recorded, the failing one second so the description must reorder)."""
    art = folder / "artifacts" / "demand"
    art.mkdir(parents=True)
    (art / "model.onnx").write_bytes(b"stand-in model " + str(go).encode())
    reasons = ["served interval coverage 0.801 (95% CI [0.78, 0.82], n=900) within the "
               "target 0.75-0.85",
               "mean pinball vs best baseline p90: 10.1 vs 12.3, model - baseline -2.2 "
               "(95% CI [-3.0, -1.4]): beats it (upper bound < 0)" if go else
               "mean pinball vs best baseline p90: 12.9 vs 12.3, model - baseline +0.6 "
               "(95% CI [+0.1, +1.1]): does not beat it (upper bound >= 0)"]
    gate = {"go": go, "verdict": "GO" if go else "NO-GO", "rule": "coverage in band and "
            "beats the best baseline", "reasons": reasons}
    m = build_manifest(art, kind="demand", version="1.0.0", contracts={"ledger": "1"},
                       valid_days=30, features=[{"name": "prompt_tokens", "kind": "numeric"}],
                       outputs={}, calibration={"level": 0.8},
                       training={"gate": gate, "headline": {"mean_pinball": 10.0},
                                 "ledger_fingerprint": f"ledger-{go}-{signed}"},
                       runtime={}, fallback={})
    write_manifest(art, m, hmac_key=hmac_key() if signed else None)
    (folder / "summary.json").write_text(json.dumps({"pipeline": "demand", "gate": gate}))
    return folder


def client(url: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=url, registry_uri=url)


@pytest.fixture(scope="module")
def store(mlflow_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("forgery")
    url, _artifacts = mlflow_server
    versions = {}
    for key, go, signed in (("go", True, True), ("nogo", False, True),
                            ("unsigned", True, False)):
        folder = demand_run(tmp / key, go, signed=signed)
        proc, s = export(url, tmp, f"reg-{key}", "register", f"run_dir={folder}")
        assert proc.returncode == 0, proc.stderr[-2000:]
        versions[key] = str(s["registry"][0]["version"])
    return url, tmp, versions


def export(url: str, tmp: Path, name: str, *args: str) -> tuple[entrypoints.EntryRun, dict]:
    """`python -m export *args` on the server, in process: (the run, its summary)."""
    run = entrypoints.export(*args, f"tracking.uri={url}", "tracking.experiment=it-forgery",
                             f"export.registry.experiment={REGISTRY_EXPERIMENT}",
                             run_dir=tmp / name)
    return run, run.summary


def errors(proc: entrypoints.EntryRun) -> list[str]:
    """The `error:` lines (MLflow's own "View run" notes aside)."""
    return [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]


def refused_fetch(url: str, tmp: Path, name: str, *args: str) -> str:
    out = tmp / name / "serve"
    proc, _ = export(url, tmp, name, "fetch", f"name={NAME}", f"out={out}", *args)
    lines = errors(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert not out.exists()  # nothing published
    return lines[0]


def test_an_edited_gate_in_the_artifact_store_is_refused(store):
    """training.gate rewritten to GO in the stored manifest.json of the NO-GO version."""
    url, tmp, v = store
    c = client(url)
    mv = c.get_model_version(NAME, v["nogo"])
    with tempfile.TemporaryDirectory() as d:
        local = Path(c.download_artifacts(mv.run_id, "demand_artifact/manifest.json", d))
        original = local.read_bytes()
        try:
            edited_gate_is_refused(url, tmp, v, c, mv, local)
        finally:  # the version as registered again, for the other tests
            local.write_bytes(original)
            c.log_artifact(mv.run_id, str(local), artifact_path="demand_artifact")
            c.delete_registered_model_alias(NAME, "challenger")


def edited_gate_is_refused(url, tmp, v, c, mv, local: Path) -> None:
    m = json.loads(local.read_text())
    m["training"]["gate"].update(go=True, verdict="GO")
    for recompute in (False, True):
        if recompute:  # an attacker who knows the hash recipe
            m["content_hash"] = content_hash(m)
        local.write_bytes(canonical_json(m) + b"\n")
        c.log_artifact(mv.run_id, str(local), artifact_path="demand_artifact")
        proc, s = export(url, tmp, f"promote-edited-{recompute}", "promote", f"name={NAME}",
                         f"version={v['nogo']}", "alias=champion")
        assert proc.returncode == 3 and s["promotion"]["decision"] == "refused"
        assert not s["promotion"]["verified"] and "bad_signature" in s["promotion"]["reasons"][0]
        last = proc.stdout.strip().splitlines()[-1]
        assert last.startswith(f"promote {NAME} v{v['nogo']}->champion: REFUSED (manifest: "
                               "bad_signature"), last
        # without the signature check, the hash (over training too) still refuses it: the
        # manifest's own, or the one registered
        proc, s = export(url, tmp, f"promote-edited-unsigned-{recompute}", "promote",
                         f"name={NAME}", f"version={v['nogo']}", "alias=champion",
                         "export.allow_unsigned=true")
        assert proc.returncode == 3 and "content_hash" in s["promotion"]["reasons"][0]
        assert ("registered" in s["promotion"]["reasons"][0]) == recompute
    assert c.get_registered_model(NAME).aliases.get("champion") is None
    c.set_registered_model_alias(NAME, "challenger", v["nogo"])  # by hand
    line = refused_fetch(url, tmp, "fetch-edited", "alias=challenger",
                         "export.allow_ungated=true")
    assert "bad_signature" in line


def test_a_forged_promote_run_is_refused_at_fetch(store):
    url, tmp, v = store
    c = client(url)
    exp = c.get_experiment_by_name(REGISTRY_EXPERIMENT) or c.get_experiment(
        c.create_experiment(REGISTRY_EXPERIMENT))
    run = c.create_run(exp.experiment_id, tags={
        "registry.action": "promote", "registry.model": NAME, "registry.version": v["go"],
        "registry.alias": "champion", "registry.decision": "promoted"})
    c.set_terminated(run.info.run_id)
    c.set_model_version_tag(NAME, v["go"], "replaylab.promoted.champion", run.info.run_id)
    c.set_registered_model_alias(NAME, "champion", v["go"])
    line = refused_fetch(url, tmp, "fetch-forged", "alias=champion")
    assert f"run {run.info.run_id} holds no signed promotion record" in line
    # a record in the run, signed with another key
    body = {"schema": "replaylab.promotion/1", "name": NAME, "version": v["go"],
            "alias": "champion", "decision": "promoted", "promote_run": run.info.run_id}
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "record.json"
        f.write_text(json.dumps({"record": body,
                                 "signature": "hmac-sha256:" + hmac_sha256(body, b"other")}))
        c.log_artifact(run.info.run_id, str(f), artifact_path="promotion")
    line = refused_fetch(url, tmp, "fetch-forged-record", "alias=champion")
    assert "does not verify with this project's key" in line
    c.delete_registered_model_alias(NAME, "champion")


def test_pencil_edits_turning_a_refusal_into_a_promotion_are_refused_at_fetch(store):
    url, tmp, v = store
    c = client(url)
    proc, s = export(url, tmp, "promote-nogo", "promote", f"name={NAME}",
                     f"version={v['nogo']}", "alias=champion")
    assert proc.returncode == 3 and s["promotion"]["record"] is None
    run_id = s["mlflow"]["run_id"]
    assert c.get_run(run_id).info.run_name == f"REFUSED promote demand v{v['nogo']}->champion"
    c.set_tag(run_id, "registry.decision", "promoted")  # the three pencil edits
    c.set_model_version_tag(NAME, v["nogo"], "replaylab.promoted.champion", run_id)
    c.set_registered_model_alias(NAME, "champion", v["nogo"])
    line = refused_fetch(url, tmp, "fetch-pencil", "alias=champion")
    assert f"run {run_id} holds no signed promotion record" in line
    c.delete_registered_model_alias(NAME, "champion")


def test_an_edited_verdict_tag_is_refused_naming_both_values(store):
    url, tmp, v = store
    c = client(url)
    # a gated challenger (signed record) whose verdict tag is edited afterwards
    proc, s = export(url, tmp, "force-go", "promote", f"name={NAME}", f"version={v['go']}",
                     "alias=challenger", "force=true", "reason=test")
    assert proc.returncode == 0 and s["promotion"]["decision"] == "promoted"
    tags = c.get_model_version(NAME, v["go"]).tags
    assert tags["replaylab.alias.challenger"] == "gated"
    c.set_model_version_tag(NAME, v["go"], "replaylab.verdict", "NO-GO")
    try:
        line = refused_fetch(url, tmp, "fetch-tag", "alias=challenger")
        assert "tag replaylab.verdict=NO-GO disagrees with its verified manifest " \
               "(verdict=GO)" in line
    finally:
        c.set_model_version_tag(NAME, v["go"], "replaylab.verdict", "GO")
    out = tmp / "served"
    proc, f = export(url, tmp, "fetch-ok", "fetch", f"name={NAME}", "alias=challenger",
                     f"out={out}")
    assert proc.returncode == 0 and f["fetch"]["gated"], proc.stderr[-2000:]


def test_promote_names_both_values_of_an_edited_tag(store):
    url, tmp, v = store
    c = client(url)
    c.set_model_version_tag(NAME, v["nogo"], "replaylab.go", "true")
    try:
        proc, s = export(url, tmp, "promote-edited-tag", "promote", f"name={NAME}",
                         f"version={v['nogo']}", "alias=champion")
    finally:
        c.set_model_version_tag(NAME, v["nogo"], "replaylab.go", "false")
    assert proc.returncode == 3 and s["promotion"]["decision"] == "refused"
    assert s["promotion"]["reasons"][0].startswith(
        "the version's tag replaylab.go=true disagrees with its verified manifest (go=false)")


def test_an_unsigned_manifest_needs_allow_unsigned(store):
    url, tmp, v = store
    c = client(url)
    assert c.get_model_version(NAME, v["unsigned"]).tags["replaylab.signed"] == "false"
    proc, s = export(url, tmp, "promote-unsigned", "promote", f"name={NAME}",
                     f"version={v['unsigned']}", "alias=champion")
    assert proc.returncode == 3 and "missing_signature" in s["promotion"]["reasons"][0]
    assert "export.allow_unsigned=true" in s["promotion"]["reasons"][0]
    proc, s = export(url, tmp, "promote-unsigned-ok", "promote", f"name={NAME}",
                     f"version={v['unsigned']}", "alias=champion", "export.allow_unsigned=true")
    assert proc.returncode == 0 and s["promotion"]["decision"] == "promoted"
    said = (proc.stdout + proc.stderr).splitlines()  # Hydra's log handler writes to stdout
    assert sum("UNSIGNED:" in ln for ln in said) == 1
    line = refused_fetch(url, tmp, "fetch-unsigned", "alias=champion")
    assert "missing_signature" in line and "export.allow_unsigned=true" in line
    c.delete_registered_model_alias(NAME, "champion")


def test_bad_input_is_one_line_and_leaves_no_run(store):
    url, tmp, v = store
    c = client(url)
    before = {r.info.run_id for e in c.search_experiments()
              for r in c.search_runs([e.experiment_id])}
    cut = demand_run(tmp / "cut", True)  # trained on a ledger whose last line was cut
    summary = json.loads((cut / "summary.json").read_text())
    summary["truncated"] = ["ledger.jsonl line 599: truncated: the file ends mid-line, 41 "
                            "bytes left"]
    (cut / "summary.json").write_text(json.dumps(summary))
    for args, said in (
            (("register", f"run_dir={cut}"), "was trained on a truncated ledger (ledger.jsonl "
             "line 599"),
            (("promote", f"name={NAME}", f"version={v['go']}", "alias=champoin"),
             "alias=champoin: not one of the configured aliases (champion, challenger"),
            (("promote", f"name={NAME}", f"version={v['go']}", "alias=champion", "force=true"),
             "force=true needs reason="),
            (("register", f"run_dir={tmp / 'nowhere'}"), "not a finished run")):
        proc, _ = export(url, tmp, "bad-input", *args)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and said in lines[0], proc.stderr
    after = {r.info.run_id for e in c.search_experiments()
             for r in c.search_runs([e.experiment_id])}
    assert after == before  # not even a FAILED one


def test_registering_the_same_content_again_reuses_the_version(store):
    url, tmp, v = store
    c = client(url)
    n = len(c.search_model_versions(f"name='{NAME}'"))
    proc, s = export(url, tmp, "reg-again", "register", f"run_dir={tmp / 'go'}")
    assert proc.returncode == 0 and s["registry"][0]["version"] == int(v["go"])
    assert s["registry"][0]["reused"] and "(same content: reused)" in proc.stdout
    assert len(c.search_model_versions(f"name='{NAME}'")) == n
    proc, s = export(url, tmp, "reg-dup", "register", f"run_dir={tmp / 'go'}",
                     "export.allow_duplicate=true")
    assert proc.returncode == 0 and s["registry"][0]["version"] == n + 1


def test_registry_runs_and_model_page_show_the_decision_first(store):
    """Registry actions log to their own experiment; the runs list and the model page, as
    the MLflow UI draws them, show the decision word (screenshots in tests/screenshots/)."""
    url, tmp, v = store
    c = client(url)
    proc, _ = export(url, tmp, "promote-shown", "promote", f"name={NAME}",
                     f"version={v['nogo']}", "alias=champion")
    assert proc.returncode == 3, proc.stderr[-2000:]
    reg = c.get_experiment_by_name(REGISTRY_EXPERIMENT)
    names = [r.info.run_name for r in c.search_runs([reg.experiment_id])
             if r.data.tags.get("pipeline") == "export"]  # not the runs forged by hand
    assert f"REFUSED promote demand v{v['nogo']}->champion" in names
    assert all(n.split()[0] in ("PROMOTED", "REFUSED", "FORCED", "SERVED",
                                          "UNGATED") for n in names), names
    training = c.get_experiment_by_name("it-forgery")
    assert not any(r.data.tags.get("registry.action") in ("promote", "fetch", "compare")
                   for r in c.search_runs([training.experiment_id]))
    assert reg.tags.get("mlflow.experimentKind") == "custom_model_development"
    d = c.get_model_version(NAME, v["nogo"]).description
    head, *reasons = d.splitlines()
    assert head.startswith("**NO-GO**: demand artifact")
    assert reasons[0].startswith("- mean pinball") and "does not beat it" in reasons[0]
    assert reasons[1].startswith("- served interval coverage")  # failing reasons first
    SHOTS.mkdir(parents=True, exist_ok=True)
    for page, file in ((f"#/experiments/{reg.experiment_id}?workflowType=machine_learning",
                        "mlflow_registry_runs.png"), (f"#/models/{NAME}", "mlflow_model_page_43.png")):
        shot = tmp / file
        with tempfile.TemporaryDirectory() as profile:
            done = subprocess.run(
                ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                 f"--user-data-dir={profile}", "--window-size=1600,1200",
                 "--virtual-time-budget=20000", f"--screenshot={shot}", f"{url}/{page}"],
                capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
        (SHOTS / file).write_bytes(shot.read_bytes())
