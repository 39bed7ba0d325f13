"""One declaration per artifact kind (`replaylab.artifacts.kinds`) and one re-scoring driver
(`replaylab.apps.registry.rescore_against(kind, ...)`), without an MLflow server.

The kinds declare their run artifact paths (the ones the registry logs under); a
verified folder published again keeps its content hash; the router's scorer
(`replaylab.artifacts.rescore_router.rescore_pair`) scores two routers on the
challenger's test prompts (the pipeline's split of the shipped GSM8K outcomes) with
stand-in routers in place of the runtime's; and the registry's driver, on a local
store (sqlite + files, a client of its own: no process-global tracking URI), records
the champion's scores on the challenger version, or the reason it was not scored.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from omegaconf import OmegaConf

from replaylab.apps import registry
from replaylab.apps.provenance import hmac_key
from replaylab.artifacts import kinds
from replaylab.artifacts import rescore_router as rr
from replaylab.contracts.manifest import (
    ManifestError,
    build_manifest,
    verify_manifest,
    write_manifest,
)
from tests.helpers.router import GSM8K, router_pipeline_config

NAME = "replaylab-router-kinds"


def router_folder(folder: Path, quality: float, go: bool = True) -> Path:
    """A router-kind stand-in folder (a manifest over its config and a stand-in encoder)."""
    (folder / "encoder").mkdir(parents=True)
    (folder / "router.json").write_text(json.dumps({"threshold": 0.5, "quality": quality}))
    (folder / "encoder" / "encoder.onnx").write_bytes(bytes(range(256)) * 8)
    m = build_manifest(folder, kind="router", version="1.0.0", contracts={"outcomes": "1"},
                       valid_days=30, features=[{"name": "text"}], outputs={}, calibration={},
                       training={"go": go, "go_reasons": ["seeded"], "prompts": 400},
                       runtime={}, fallback={})
    write_manifest(folder, m, hmac_key=hmac_key())  # signed with the tests' key (conftest)
    return folder


def test_each_kind_is_declared_once_with_its_run_path():
    assert set(kinds.KINDS) == {"demand", "router"}
    assert registry.KINDS == ("demand", "router")
    assert registry.ARTIFACT_PATH == {"demand": "demand_artifact", "router": "router_artifact"}
    for name, k in kinds.KINDS.items():
        assert kinds.artifact_kind(name) is k and k.pipeline == name
        assert callable(k.export) and callable(k.load) and callable(k.rescore)
        assert all(issubclass(e, Exception) for e in k.rescore_errors())
    assert kinds.DEMAND.reexport == "run_state" and kinds.ROUTER.reexport == "artifact"
    with pytest.raises(ValueError, match="unknown"):
        kinds.artifact_kind("forecast")


def test_republish_keeps_the_content_and_renews_the_version(tmp_path):
    art = router_folder(tmp_path / "router", 0.8)
    before = verify_manifest(art)
    out = kinds.republish(art, tmp_path / "again", version="1.2.0", valid_days=3)
    assert out["content_hash"] == before["content_hash"] and out["version"] == "1.2.0"
    assert out["training"] == before["training"] and out["kind"] == "router"
    assert (tmp_path / "again" / "encoder" / "encoder.onnx").read_bytes() == \
        (art / "encoder" / "encoder.onnx").read_bytes()
    same = kinds.republish(art, art, version="2.0.0", valid_days=30)  # in place
    assert same["content_hash"] == before["content_hash"] and verify_manifest(art)["version"] \
        == "2.0.0"
    (art / "router.json").write_text("{}")
    with pytest.raises(ManifestError):
        kinds.republish(art, tmp_path / "bad", version="1.0.0", valid_days=30)
    assert not (tmp_path / "bad").exists()


class StandInRouter:
    """Answers every prompt with one candidate: P(success) `quality` for it."""

    rule = "absolute"

    def __init__(self, candidates: list[str], pick: int, quality: float):
        self.candidates, self.pick, self.quality = candidates, pick, quality

    def route_batch(self, texts, categories, tokens):
        other = 1 - self.pick
        scores = {self.candidates[self.pick]: self.quality,
                  self.candidates[other]: 1 - self.quality}
        return [SimpleNamespace(candidate=self.candidates[self.pick], scores=scores,
                                fallback=False) for _ in texts]


@pytest.fixture(scope="module")
def prompts() -> rr.RouterRows:
    from replaylab.pipelines.router import test_prompts
    from replaylab.sources.routellm import import_routellm_gsm8k

    cfg = router_pipeline_config()
    matrix, texts, meta = test_prompts(import_routellm_gsm8k(GSM8K), cfg)
    return rr.RouterRows(matrix, texts, meta, cfg.evaluation)


def stand_ins(monkeypatch, candidates: list[str]) -> None:
    """The runtime's loader replaced: the folder's router.json quality says which router."""
    def load(folder, hmac_key=None, what=None):
        q = json.loads((Path(folder) / "router.json").read_text())["quality"]
        return StandInRouter(candidates, 0 if q >= 0.85 else 1, q)

    monkeypatch.setattr(rr, "load_router", load)


def test_the_router_scorer_scores_both_on_the_challengers_prompts(prompts, tmp_path,
                                                                  monkeypatch):
    cands = [str(c) for c in prompts.matrix.candidates]
    stand_ins(monkeypatch, cands)
    a, b = router_folder(tmp_path / "a", 0.9), router_folder(tmp_path / "b", 0.8)
    got = kinds.ROUTER.rescore(a, b, verify_manifest(b), prompts, None)
    n, rows = len(prompts.texts), np.arange(len(prompts.texts))
    m = prompts.matrix
    assert got["doc"]["comparison"]["rows"] == n == int(got["tags"]["rows"])
    q = got["doc"]["scores"]["challenger"]["policy"]["quality"]
    assert q == pytest.approx(float(m.score[rows, 0].mean()))
    d = got["doc"]["comparison"]["delta"]["all"]["quality"]
    assert d["mean"] == pytest.approx(float((m.score[:, 0] - m.score[:, 1]).mean()))
    assert json.loads(got["tags"]["delta.all.quality"])["mean"] == pytest.approx(d["mean"])
    assert not got["doc"]["champion_fit_overlap"]["known"]  # no fit_prompts.json
    assert "records no fit prompts" in got["tags"]["champion_fit_overlap"]
    assert set(got["metrics"]) == {f"{r}.{k}" for r in ("challenger", "champion")
                                   for k in ("quality", "cost", "cost_ratio_at_95")}


@pytest.fixture()
def store(tmp_path):
    """A local store with its own client (nothing process-global) and the registry's cfg."""
    from mlflow.tracking import MlflowClient

    url = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = MlflowClient(tracking_uri=url, registry_uri=url)
    exp = c.create_experiment("t-kinds", artifact_location=(tmp_path / "art").as_uri())
    # the store of large files too, under tmp_path (created by the registry otherwise)
    c.create_experiment("t-kinds-store", artifact_location=(tmp_path / "blobs").as_uri())
    cfg = OmegaConf.create({
        "tracking": {"uri": url, "enabled": True, "experiment": "t-kinds"},
        "export": {"hmac_key_env": None, "registry": {
            "names": {"demand": "replaylab-demand-k", "router": NAME},
            "blob_min_bytes": 1000, "blob_experiment": "t-kinds-store",
            "rescore_alias": "champion"}}})
    versions = {}
    for v, q in ((1, 0.8), (2, 0.9)):
        run = c.create_run(exp)
        folder = router_folder(tmp_path / f"router{v}", q)
        r = registry.register_folder(c, run.info.run_id, folder, NAME, cfg)
        c.set_terminated(run.info.run_id)
        versions[v] = (str(r["version"]), folder, r)
    c.set_registered_model_alias(NAME, "champion", versions[1][0])
    return SimpleNamespace(client=c, cfg=cfg, versions=versions)


def test_the_driver_records_the_champions_router_scores_on_the_version(store, prompts,
                                                                      monkeypatch):
    c = store.client
    stand_ins(monkeypatch, [str(x) for x in prompts.matrix.candidates])
    v2, folder, logged = store.versions[2]
    assert logged["artifact_path"] == "router_artifact"
    assert logged["blobs"]["uploaded"] + logged["blobs"]["reused"] == 1  # the encoder, once
    mv = c.get_model_version(NAME, v2)
    built = []

    def rows():
        built.append(1)
        return prompts, "outcomes test"

    doc = registry.rescore_against("router", c, store.cfg, NAME, mv, folder, rows)
    assert built == [1] and doc["kind"] == "router" and "error" not in doc
    assert doc["champion"]["version"] == 1 and doc["rows"] == len(prompts.texts)
    t = c.get_model_version(NAME, v2).tags
    p = registry.vs_prefix(1)
    assert t[p + "rows_source"] == "outcomes test" and t[p + "rows"] == str(len(prompts.texts))
    assert float(t[p + "challenger.quality"]) == pytest.approx(
        doc["comparison"]["challenger"]["quality"])
    assert t[p + "champion_content_hash"] == c.get_model_version(NAME, "1").tags[
        "replaylab.content_hash"]
    assert t[p + "scores_json"] == registry.rescore_json(NAME, v2, 1)
    # the champion itself: nothing to score (and the rows are never built)
    assert registry.rescore_against("router", c, store.cfg, NAME,
                                    c.get_model_version(NAME, "1"), folder, rows) is None
    assert built == [1]


def test_a_champion_the_runtime_refuses_is_recorded_as_not_scored(store, prompts):
    c = store.client
    v2, folder, _ = store.versions[2]
    mv = c.get_model_version(NAME, v2)
    doc = registry.rescore_against("router", c, store.cfg, NAME, mv, folder, prompts,
                                   "outcomes test")
    assert doc["error"].startswith("champion v1 not scored")
    assert c.get_model_version(NAME, v2).tags[registry.vs_prefix(1) + "error"] == doc["error"]
