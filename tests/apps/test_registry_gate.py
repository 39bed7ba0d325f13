"""The gate serves what it gated (issue 30), on a local MLflow store (sqlite + files).

Router-kind folders (a GO and a NO-GO verdict, manifests built by the manifest module)
are registered in-process; then: a promoted alias is fetched as gated; an alias moved by
`MlflowClient.set_registered_model_alias` outside promote is refused at fetch (exit-2
error, the out folder untouched) and served with `export.allow_ungated=true`, said so;
an alias put back by hand onto a version promoted earlier is refused too; a forced
version is fetched with `forced`, its reason and `gated: false`. The demand pinball
condition reads the paired interval of (challenger - champion): promoted only when its
upper bound is below 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from replaylab.apps import registry
from replaylab.apps.export import input_errors
from replaylab.apps.provenance import hmac_key
from replaylab.contracts.manifest import build_manifest, write_manifest

NAME = "replaylab-router-t"


def router_folder(folder: Path, go: bool, quality: float) -> Path:
    art = folder / "router"
    art.mkdir(parents=True)
    (art / "router.json").write_text(json.dumps({"threshold": 0.5, "quality": quality}))
    m = build_manifest(art, kind="router", version="1.0.0", contracts={"outcomes": "1"},
                       valid_days=30, features=[{"name": "text"}], outputs={}, calibration={},
                       training={"go": go, "go_reasons": [f"seeded verdict go={go}"],
                                 "prompts": 400, "served_threshold": 0.5,
                                 "gated_threshold": 0.5}, runtime={}, fallback={})
    write_manifest(art, m, hmac_key=hmac_key())  # signed with the tests' key (conftest)
    return art


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    import mlflow
    from mlflow.tracking import MlflowClient

    tmp = tmp_path_factory.mktemp("mlflow-local")
    url = f"sqlite:///{tmp / 'mlflow.db'}"
    c = MlflowClient(tracking_uri=url, registry_uri=url)
    exp = c.create_experiment("t-registry", artifact_location=(tmp / "art").as_uri())
    mlflow.set_tracking_uri(url)
    mlflow.set_registry_uri(url)

    def cfg(**over):
        base = {"tracking": {"uri": url, "enabled": True, "experiment": "t-registry"},
                "export": {"hmac_key_env": None, "allow_ungated": False, "registry": {
                    "names": {"demand": "replaylab-demand-t", "router": NAME},
                    "blob_min_bytes": 0, "blob_experiment": "t-store", "rescore_alias": None}},
                "name": NAME, "version": None, "alias": None, "force": False, "reason": None,
                "out": None, "ledger": None, "run_dir": None}
        conf = OmegaConf.create(base)
        for k, v in over.items():
            OmegaConf.update(conf, k, v)
        return conf

    versions = {}
    for go in (True, False):
        run = c.create_run(exp)
        art = router_folder(tmp / f"router-{go}", go, 0.85 if go else 0.8)
        r = registry.register_folder(c, run.info.run_id, art, NAME, cfg())
        c.set_terminated(run.info.run_id)
        versions[go] = str(r["version"])
    yield SimpleNamespace(url=url, client=c, exp=exp, cfg=cfg, go=versions[True],
                          nogo=versions[False], tmp=tmp)
    mlflow.set_tracking_uri(None)
    mlflow.set_registry_uri(None)  # process-global: later tests' clients must not see it


def in_run(store, job, conf, name: str) -> dict:
    import mlflow

    with mlflow.start_run(experiment_id=store.exp, run_name=name):
        return job(conf, store.tmp / name)


def test_promoted_alias_is_fetched_as_gated(store):
    s = in_run(store, registry.promote,
               store.cfg(version=store.go, alias="champion"), "promote-go")
    assert s["promotion"]["decision"] == "promoted" and s["promotion"]["reasons"]
    tag = store.client.get_model_version(NAME, store.go).tags["replaylab.promoted.champion"]
    assert store.client.get_run(tag).data.tags["registry.decision"] == "promoted"
    out = store.tmp / "serve" / "router"
    f = in_run(store, registry.fetch, store.cfg(alias="champion", out=str(out)), "fetch-go")
    assert f["fetch"]["gated"] is True and f["fetch"]["forced"] is False
    assert f["fetch"]["version"] == int(store.go) and (out / "router.json").is_file()


def test_alias_moved_outside_the_gate_is_refused_unless_allow_ungated(store):
    c = store.client
    c.set_registered_model_alias(NAME, "byhand", store.nogo)  # the UI's pencil, the API
    out = store.tmp / "serve-byhand" / "router"
    with pytest.raises(registry.FetchRefused, match="moved outside the promotion gate"):
        in_run(store, registry.fetch, store.cfg(alias="byhand", out=str(out)), "fetch-byhand")
    assert not out.exists()  # nothing published
    assert issubclass(registry.FetchRefused, input_errors())  # one error line, exit 2
    f = in_run(store, registry.fetch, store.cfg(alias="byhand", out=str(out),
                                                **{"export.allow_ungated": True}),
               "fetch-byhand-allowed")
    assert f["fetch"]["gated"] is False and f["fetch"]["allowed_ungated"] is True
    assert "outside the promotion gate" in f["fetch"]["ungated_reason"]
    assert (out / "router.json").is_file()
    # by number, with no gated alias on it: refused the same way
    with pytest.raises(registry.FetchRefused):
        in_run(store, registry.fetch, store.cfg(version=store.nogo, out=str(out)),
               "fetch-by-number")


def test_forced_version_is_served_as_forced(store):
    c = store.client
    s = in_run(store, registry.promote, store.cfg(version=store.nogo, alias="forced"),
               "promote-nogo")
    assert s["promotion"]["decision"] == "refused"
    s = in_run(store, registry.promote,
               store.cfg(version=store.nogo, alias="forced", force=True,
                         reason="incident 42: approved"), "promote-forced")
    assert s["promotion"]["decision"] == "forced"
    out = store.tmp / "serve-forced" / "router"
    f = in_run(store, registry.fetch, store.cfg(alias="forced", out=str(out)), "fetch-forced")
    assert f["fetch"]["forced"] is True and f["fetch"]["gated"] is False
    assert f["fetch"]["forced_reason"] == "incident 42: approved"
    last = c.search_runs([store.exp], "tags.`registry.action` = 'fetch'",
                         order_by=["attributes.start_time DESC"], max_results=1)[0]
    assert last.data.tags["registry.forced"] == "true"


def test_alias_put_back_by_hand_onto_an_earlier_promoted_version_is_refused(store):
    c = store.client
    for v in (store.go, store.nogo):  # go promoted, then nogo forced: the alias is on nogo
        conf = store.cfg(version=v, alias="rollback", force=v == store.nogo,
                         reason="test" if v == store.nogo else None)
        in_run(store, registry.promote, conf, f"promote-rollback-{v}")
    assert str(c.get_model_version_by_alias(NAME, "rollback").version) == store.nogo
    c.set_registered_model_alias(NAME, "rollback", store.go)  # by hand, back to v(go)
    with pytest.raises(registry.FetchRefused, match="put back outside the gate"):
        in_run(store, registry.fetch,
               store.cfg(alias="rollback", out=str(store.tmp / "serve-rb")), "fetch-rb")


def _mv(tags: dict, version: str = "2") -> SimpleNamespace:
    t = {"replaylab.kind": "demand", "replaylab.go": "true", "replaylab.go_reasons": "ok",
         "replaylab.content_hash": "sha256:b", "replaylab.test_window": "w"}
    return SimpleNamespace(name="d", version=version, tags={**t, **tags})


@pytest.mark.parametrize("ci,passed", [([-0.9, -0.1], True), ([-0.9, 0.2], False),
                                       (None, False)])
def test_demand_promotion_needs_the_paired_interval_below_zero(ci, passed):
    champion = _mv({"replaylab.content_hash": "sha256:a"}, version="1")
    v = "replaylab.vs.v1."
    tags = {v + "challenger_better": "true", v + "champion_content_hash": "sha256:a",
            v + "same_rows": "true", v + "rows": "500", v + "rows_source": "run folder",
            v + "levels": "0.1,0.5,0.9", v + "challenger.mean_pinball": "10.0",
            v + "champion.mean_pinball": "10.5", v + "challenger.coverage": "0.8",
            v + "champion.coverage": "0.79", v + "delta_mean_pinball": "-0.5",
            v + "delta_resampled": "sessions (120 sessions, 500 rows, 1000 draws, 95%)"}
    if ci is not None:
        tags[v + "delta_ci"] = json.dumps(ci)
    ok, reasons = registry.gate(_mv(tags), champion)
    assert ok is passed
    text = " ".join(reasons)
    if ci is None:
        assert "no paired interval recorded" in text
    else:
        assert "paired 95% interval" in text and ("better" in text)
    # the same scores on a version whose own gate said NO-GO: refused, and told exactly why
    ok, reasons = registry.gate(_mv({**tags, "replaylab.go": "false"}), champion)
    assert not ok
    beats = [r for r in reasons if "beats champion v1" in r]
    assert len(beats) == int(passed)  # said only when it does beat the champion
    if passed:
        assert reasons[0] == beats[0] and "but is itself NO-GO: refused" in beats[0]


def test_demand_champion_never_scored_on_these_rows_is_refused():
    champion = _mv({"replaylab.content_hash": "sha256:a"}, version="1")
    ok, reasons = registry.gate(_mv({}), champion)
    assert not ok and "never scored on this version's test rows" in reasons[-1]
    assert "ledger=" in reasons[-1]


def test_a_no_go_demand_version_is_refused_with_every_reason():
    champion = _mv({"replaylab.content_hash": "sha256:a"}, version="1")
    ok, reasons = registry.gate(_mv({"replaylab.go": "false"}), champion)
    assert not ok and reasons[0].startswith("NO-GO (go=false)")
    assert "never scored on this version's test rows" in reasons[-1]  # listed all the same


def test_an_edited_go_tag_does_not_pass_the_gate():
    """A NO-GO version whose `go` tag was edited to true in the MLflow UI: the tag and the
    verdict recomputed from its verified manifest disagree, so the gate refuses and names
    both values (it prefers neither silently)."""
    edited = _mv({"replaylab.kind": "router", "replaylab.go": "true",
                  "replaylab.go_reasons": "quality below the rules"})
    own = {"replaylab.go": "false", "replaylab.go_reasons": "quality below the rules"}
    ok, reasons = registry.gate(edited, None, own=own)
    assert not ok
    assert reasons[0].startswith("the version's tag replaylab.go=true disagrees with its "
                                 "verified manifest (go=false): refused")
    assert len(reasons) == 2 and reasons[1] == "NO-GO (go=false): quality below the rules"
    # a GO manifest whose tag was edited to false is refused all the same
    ok, reasons = registry.gate(_mv({"replaylab.kind": "router", "replaylab.go": "false"}),
                                None, own={"replaylab.go": "true", "replaylab.verdict": "GO"})
    assert not ok and "replaylab.go=false disagrees" in reasons[0]
    ok, _ = registry.gate(edited, None)  # without the manifest, the tag would have passed
    assert ok


def test_a_verdict_other_than_go_is_refused_like_no_go():
    own = {"replaylab.go": "true", "replaylab.verdict": "NOT ENOUGH EVIDENCE",
           "replaylab.go_reasons": "too few test rows to check the band"}
    ok, reasons = registry.gate(_mv({"replaylab.kind": "router", "replaylab.go_reasons":
                                     own["replaylab.go_reasons"]}), None, own=own)
    assert not ok and reasons == ["NOT ENOUGH EVIDENCE (go=false): too few test rows to "
                                  "check the band"]


def test_each_version_says_in_one_sentence_what_it_is_and_its_verdict(store):
    for version, word in ((store.go, "GO"), (store.nogo, "NO-GO")):
        d = store.client.get_model_version(NAME, version).description
        head, *reasons = d.splitlines()
        assert head.startswith(f"**{word}**: router artifact ") and "from run " in head
        assert reasons == [f"- seeded verdict go={word == 'GO'}"]  # every reason, one a line
