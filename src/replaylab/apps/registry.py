"""The MLflow Model Registry: register verified artifact folders, gate aliases, fetch by alias.

A registered version is the artifact folder itself (model.onnx / router.json /
encoder/ ... and manifest.json), logged as a plain run artifact and registered
from there; its tags carry what a reviewer and the promotion gate read (the
manifest's content hash, the data fingerprint, the projection version, the
headline metrics, the go/no-go verdict, the test window). docs/howto/mlflow.md says
why it is not an `mlflow.pyfunc` model.

Verification is the manifest's (`replaylab.contracts.manifest.verify_manifest`),
before a version is registered, before an alias moves, and after every fetch.

Large files (the router's MiniLM encoder) are stored once per content: a file of
at least `export.registry.blob_min_bytes` goes to a content-addressed location
(`sha256/<2 hex>/<sha256>` in the one run of the experiment
`export.registry.blob_experiment`), uploaded only when that key is not there yet;
the version's folder then holds `blobs.json` in its place, and every download
puts the files back and verifies the whole folder against its manifest.

A demand challenger is scored against the champion on its own test rows
(`replaylab.artifacts.rescore`) when it is registered at the end of
`pipeline=demand` and by `compare ... ledger=PATH`; the gate reads those scores
(tags `replaylab.vs.v<champion>.*`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from replaylab.apps.provenance import hmac_key
from replaylab.config import ConfigError
from replaylab.contracts.errors import InputError
from replaylab.contracts.manifest import (
    ManifestError,
    canonical_json,
    link_or_copy,
    staged_folder,
    verify_manifest,
)

KINDS = ("demand", "router")
ARTIFACT_PATH = {"demand": "demand_artifact", "router": "router_artifact"}  # in the run
TAG = "replaylab."  # prefix of every tag this module writes
BLOBS = "blobs.json"  # in a logged folder: its large files, stored once per sha256
BLOB_STORE_TAG = TAG + "blob_store"
TAG_MAX = 4000  # model version tag values: MLflow keeps 5000 characters


class FetchRefused(InputError):
    """A downloaded version did not verify (an input error: exit code 2, DIR untouched)."""


# ---------------------------------------------------------------- what a version says
def test_window(manifest: dict) -> str:
    """A short id of the data and test window a version was scored on: two versions with
    the same id were scored on the same test rows (same ledger, same split)."""
    t = manifest.get("training") or {}
    body = {"data": data_fingerprint(manifest), "window": (t.get("time_window") or {}).get("test"),
            "n_test": (t.get("labels") or {}).get("test")}
    if manifest.get("kind") == "router":
        # a router manifest keeps no split seed or prompt ids; the single-candidate anchors'
        # test scores are functions of the test prompts alone: another split, another id
        body["anchors"] = {p: (t.get("test") or {}).get(p) for p in ("cheap_only", "strong_only")}
    return hashlib.sha256(canonical_json(body)).hexdigest()[:16]


def data_fingerprint(manifest: dict) -> str:
    """The training data's fingerprint (demand: the ledger's; router: the outcomes' when given,
    else the prompt counts and contracts, the only facts its manifest keeps)."""
    t = manifest.get("training") or {}
    if t.get("ledger_fingerprint"):
        return str(t["ledger_fingerprint"])
    if t.get("data_fingerprint"):
        return str(t["data_fingerprint"])
    body = {"prompts": t.get("prompts"), "contracts": manifest.get("contracts")}
    return "derived:" + hashlib.sha256(canonical_json(body)).hexdigest()[:32]


NO_GATE = ("no gate recorded: this version's manifest has no training.gate (exported before "
           "the demand gate was recorded); re-train or re-export it to be gated")


def demand_gate(manifest: dict, reg: Any = None) -> tuple[bool, str, dict]:
    """(passed, reason, gate) of the demand gate's own part, read off the manifest: the
    verdict the run's report shows (`training.gate`, computed once by
    `replaylab.demand.gate`: coverage within the report's target band and the model
    beating the best baseline with a paired session-bootstrap interval). A manifest
    without it is refused ("no gate recorded")."""
    gate = (manifest.get("training") or {}).get("gate")
    if not isinstance(gate, dict) or "go" not in gate:
        return False, NO_GATE, {}
    why = "; ".join(map(str, gate.get("reasons") or []))
    return bool(gate["go"]), why, gate


def version_tags(manifest: dict, reg: Any) -> dict[str, str]:
    """The tags of a registered version, all from its verified manifest."""
    kind, t = manifest["kind"], manifest.get("training") or {}
    tags = {"kind": kind, "content_hash": manifest["content_hash"],
            "artifact_version": manifest["version"], "data_fingerprint": data_fingerprint(manifest),
            "projection_version": str(t.get("projection_version") or "n/a"),
            "test_window": test_window(manifest), "valid_until": manifest["valid_until"],
            "source_run_id": str(t.get("mlflow_run_id") or ""),
            "signed": str("signature" in manifest).lower()}
    if kind == "demand":
        head = t.get("headline") or {}
        ok, why, g = demand_gate(manifest, reg)
        tags.update({f"metric.{k}": repr(float(v)) for k, v in head.items()
                     if isinstance(v, int | float) and not isinstance(v, bool)})
        tags.update(go=str(ok).lower(), go_reasons=why[:TAG_MAX],
                    gate_rule=str(g.get("rule") or "none recorded")[:TAG_MAX],
                    interval=str((manifest.get("calibration") or {}).get("level")))
    else:
        go = t.get("go")
        tags.update(go=str(go is True).lower(),
                    go_reasons="; ".join(map(str, t.get("go_reasons") or []))[:4000])
        if t.get("served_threshold") is not None:
            tags["served_threshold"] = repr(float(t["served_threshold"]))
        for policy in ("learned", "rules", "strong_only"):
            for m, v in ((t.get("test") or {}).get(policy) or {}).items():
                if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                    tags[f"metric.{policy}.{m}"] = repr(float(v))
    return {TAG + k: v for k, v in tags.items()}


def signature(manifest: dict) -> dict:
    """An MLflow model signature (inputs/outputs column specs) read off the manifest."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    types = {"numeric": "double", "bool": "boolean", "category": "string"}
    if manifest["kind"] == "demand":
        inputs = [ColSpec(types.get(f.get("kind"), "string"), f["name"])
                  for f in manifest["features"] if f.get("source", "request") == "request"]
        outputs = [ColSpec("double", n) for n in ("hint_lo", "hint_p50", "hint_hi")]
    else:
        inputs = [ColSpec("string", "text"), ColSpec("string", "category"),
                  ColSpec("long", "prompt_tokens")]
        outputs = [ColSpec("string", "candidate")]
    return ModelSignature(Schema(inputs), Schema(outputs)).to_dict()


# ---------------------------------------------------------------- MLflow plumbing
def client(cfg: DictConfig) -> Any:
    from mlflow.tracking import MlflowClient

    if not cfg.tracking.uri:
        raise ConfigError("the registry needs tracking.uri (e.g. sqlite:///mlflow.db)")
    return MlflowClient(tracking_uri=cfg.tracking.uri, registry_uri=cfg.tracking.uri)


def model_name(cfg: DictConfig, kind: str) -> str:
    return str(cfg.export.registry.names[kind])


def register_folder(c: Any, run_id: str, folder: Path, name: str, cfg: DictConfig,
                    logged_at: str | None = None) -> dict:
    """Verify `folder`, log it to run `run_id` (unless already logged at `logged_at`), and
    register it as a new version of `name`; returns {name, version, content_hash, go}."""
    from mlflow.exceptions import MlflowException

    key = hmac_key(cfg.export.get("hmac_key_env"))
    manifest = verify_manifest(folder, hmac_key=key)
    kind = manifest["kind"]
    if kind not in KINDS:
        raise ConfigError(f"{folder}: kind {kind!r} is not registered (one of {KINDS})")
    path = logged_at or ARTIFACT_PATH[kind]
    blobs = {"uploaded": 0, "reused": 0, "bytes_uploaded": 0}
    if logged_at is None:
        blobs = log_folder(c, cfg, run_id, folder, path, manifest)
    try:
        c.create_registered_model(name, description=f"replaylab {kind} artifact folders "
                                  "(manifest-verified; docs/howto/mlflow.md)")
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    tags = version_tags(manifest, cfg.export.registry)
    tags[TAG + "signature"] = json.dumps(signature(manifest))
    tags[TAG + "registered_by_run"] = run_id
    tags[TAG + "blobs"] = f"uploaded {blobs['uploaded']}, reused {blobs['reused']}"
    run = c.get_run(run_id)
    source = f"{run.info.artifact_uri.rstrip('/')}/{path}"
    mv = c.create_model_version(name, source, run_id=run_id, tags=tags,
                                description=version_description(manifest, tags, run.info))
    return {"name": name, "version": int(mv.version), "content_hash": manifest["content_hash"],
            "go": tags[TAG + "go"], "artifact_path": path, "blobs": blobs}


def version_description(manifest: dict, tags: dict[str, str], run_info: Any) -> str:
    """One sentence for the version page: what it is, where from, its verdict and why."""
    why = tags.get(TAG + "go_reasons", "").split("; ")[0]
    go = "GO" if tags.get(TAG + "go") == "true" else "NO-GO"
    return (f"{manifest['kind']} artifact {manifest['version']} "
            f"({manifest['content_hash'][:19]}) from run {run_info.run_name or run_info.run_id}, "
            f"created {manifest.get('created_at', '?')[:10]}: {go}"
            + (f" ({why[:300]})" if why else "") + ".")


# ---------------------------------------------------------------- large files, once
def blob_store_run(c: Any, cfg: DictConfig) -> str:
    """The run holding the content-addressed large files (created on first use)."""
    name = str(cfg.export.registry.get("blob_experiment") or "replaylab-artifact-store")
    exp = c.get_experiment_by_name(name)
    exp_id = exp.experiment_id if exp is not None else c.create_experiment(name)
    found = c.search_runs([exp_id], filter_string=f"tags.`{BLOB_STORE_TAG}` = 'true'",
                          order_by=["attributes.start_time ASC"], max_results=1)
    if found:
        return found[0].info.run_id
    run = c.create_run(exp_id, run_name="artifact-store", tags={BLOB_STORE_TAG: "true"})
    c.set_terminated(run.info.run_id)
    return run.info.run_id


def blob_key(sha256: str) -> str:
    return f"sha256/{sha256[:2]}/{sha256}"


def log_folder(c: Any, cfg: DictConfig, run_id: str, folder: Path, path: str,
               manifest: dict) -> dict:
    """Log a verified folder under `path` of run `run_id`; files of at least
    `blob_min_bytes` are uploaded to the blob store only when their sha256 is not
    there yet, and listed in the logged folder's blobs.json instead."""
    limit = int(cfg.export.registry.get("blob_min_bytes") or 0)
    big = [e for e in manifest["files"] if limit > 0 and int(e["size"]) >= limit]
    out = {"uploaded": 0, "reused": 0, "bytes_uploaded": 0}
    if not big:
        c.log_artifacts(run_id, str(folder), artifact_path=path)
        return out
    store = blob_store_run(c, cfg)
    # a temporary sibling: hard links stay on the folder's file system (no copy of the encoder)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}.log-") as tmp:
        stage, upload = Path(tmp) / "folder", Path(tmp) / "upload"
        shutil.copytree(folder, stage, copy_function=link_or_copy)
        upload.mkdir()
        entries = []
        for e in big:
            key = blob_key(e["sha256"])
            present = {f.path for f in c.list_artifacts(store, key.rsplit("/", 1)[0])}
            if key in present:
                out["reused"] += 1
            else:
                blob = upload / e["sha256"]
                link_or_copy(folder / e["path"], blob)
                c.log_artifact(store, str(blob), artifact_path=key.rsplit("/", 1)[0])
                blob.unlink()
                out["uploaded"] += 1
                out["bytes_uploaded"] += int(e["size"])
            (stage / e["path"]).unlink()
            entries.append({"path": e["path"], "sha256": e["sha256"], "size": int(e["size"]),
                            "run_id": store, "artifact": key})
        (stage / BLOBS).write_text(json.dumps({"files": entries}, indent=1))
        c.log_artifacts(run_id, str(stage), artifact_path=path)
    return out


def reassemble(folder: Path, cfg: DictConfig) -> None:
    """Put a downloaded folder's stored-once files (blobs.json) back in place; the caller
    verifies the folder against its manifest afterwards (a bad blob fails there)."""
    import mlflow

    listing = folder / BLOBS
    if not listing.is_file():
        return
    root = folder.resolve()
    for e in json.loads(listing.read_text()).get("files", []):
        target = (folder / str(e["path"])).resolve()
        if not target.is_relative_to(root) or target == root:
            raise ManifestError("path", f"{BLOBS}: {e['path']!r} leaves the folder")
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            try:
                got = mlflow.artifacts.download_artifacts(
                    run_id=str(e["run_id"]), artifact_path=str(e["artifact"]), dst_path=tmp,
                    tracking_uri=str(cfg.tracking.uri))
            except Exception as exc:  # MlflowException / OSError: the stored file is gone
                raise ManifestError("missing_file", f"{e['path']!r}: stored file "
                                    f"{e['artifact']} cannot be downloaded: {exc}") from None
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(got, target)
    listing.unlink()


def register_outcome(run: Any, summary: dict, cfg: DictConfig) -> list[dict]:
    """The registry hook at the end of a recorded run: every artifact folder the run wrote
    (summary["artifacts"]["demand" | "router"]) becomes a version, when
    `export.register` is on and tracking is enabled."""
    reg = cfg.get("export", {}) or {}
    if run is None or not reg.get("register", False):
        return []
    arts = summary.get("artifacts") or {}
    c, out = client(cfg), []
    for kind in KINDS:
        folder = arts.get(kind)
        if not folder or not Path(folder).is_dir():
            continue
        already = ARTIFACT_PATH[kind] if kind == "demand" else None  # log_outcome logged it
        r = register_folder(c, run.info.run_id, Path(folder), model_name(cfg, kind), cfg,
                            logged_at=already)
        if kind == "demand" and all(Path(str(arts.get(k) or "")).is_file()
                                    for k in ("features", "predictions_test")):
            from replaylab.artifacts.rescore import RescoreError, run_test_rows

            mv = c.get_model_version(r["name"], str(r["version"]))
            try:
                rows = run_test_rows(arts["features"], arts["predictions_test"])
                doc = rescore_against(c, cfg, r["name"], mv, Path(folder), rows, "run folder")
            except RescoreError as e:
                doc = {"champion": {"version": None}, "error": str(e)}
            if doc is not None:
                r["rescore"] = {"champion": doc["champion"]["version"],
                                **({"error": doc["error"]} if "error" in doc
                                   else doc["comparison"])}
        if kind == "router" and summary.get("mode") == "receipts":
            # the champion re-score rebuilds test prompts from an outcome table; a receipts
            # run is judged by OPE on its own test sessions instead (not re-scored here)
            r["rescore"] = {"champion": None, "note": "receipts mode: not re-scored against "
                            "the champion (OPE on the run's test sessions is the verdict)"}
        elif kind == "router" and cfg.get("router") is not None and cfg.get("data") is not None:
            mv = c.get_model_version(r["name"], str(r["version"]))
            doc = rescore_router_against(c, cfg, r["name"], mv, Path(folder))
            if doc is not None:
                r["rescore"] = {"champion": doc["champion"]["version"],
                                **({"error": doc["error"]} if "error" in doc
                                   else doc["comparison"])}
        out.append(r)
    for r in out:
        import mlflow

        mlflow.set_tag(f"{TAG}registered.{r['name']}", str(r["version"]))
    return out


def registered_artifacts(cfg: DictConfig, run_dir: Path) -> dict:
    """The job of `python -m export register run_dir=DIR`: the artifact folders of a finished
    run, for the registry hook (nothing is rebuilt)."""
    if not cfg.run_dir:
        raise ConfigError("register needs run_dir=DIR (a finished training run folder)")
    source = Path(cfg.run_dir)
    found = {k: str(source / "artifacts" / k) for k in KINDS
             if (source / "artifacts" / k / "manifest.json").is_file()}
    if not found:
        raise FileNotFoundError(f"{source}/artifacts/: no demand/ or router/ artifact folder")
    for k, f in (("features", "features.parquet"), ("predictions_test",
                                                    "predictions_test.parquet")):
        if "demand" in found and (source / f).is_file():  # the test rows, for the re-score
            found[k] = str(source / f)
    if source.joinpath("summary.json").is_file():  # the run's summary, for the compare view
        import mlflow

        if mlflow.active_run() is not None:
            mlflow.log_artifact(str(source / "summary.json"), artifact_path="source_run")
    return {"pipeline": "export", "action": "register", "source": str(source),
            "artifacts": found}


def download_version(c: Any, cfg: DictConfig, name: str, version: int | str,
                     into: Path) -> Path:
    """The files of a version (its artifact folder) downloaded under `into`."""
    import mlflow

    mv = c.get_model_version(name, str(version))
    folder = Path(mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=str(into),
                                                      tracking_uri=str(cfg.tracking.uri)))
    reassemble(folder, cfg)
    return folder


def verified_version(c: Any, cfg: DictConfig, name: str, version: int | str,
                     into: Path) -> tuple[Any, dict, Path]:
    """(model version, verified manifest, local folder); ManifestError when the downloaded
    files do not verify or are not the registered content."""
    mv = c.get_model_version(name, str(version))
    folder = download_version(c, cfg, name, version, into)
    manifest = verify_manifest(folder, hmac_key=hmac_key(cfg.export.get("hmac_key_env")),
                               required_kind=mv.tags.get(TAG + "kind"))
    if manifest["content_hash"] != mv.tags.get(TAG + "content_hash"):
        raise ManifestError("content_hash", f"{name} v{version}: the store holds content "
                            f"{manifest['content_hash'][:19]}, registered "
                            f"{str(mv.tags.get(TAG + 'content_hash'))[:19]}")
    return mv, manifest, folder


def alias_version(c: Any, name: str, alias: str) -> Any | None:
    from mlflow.exceptions import MlflowException

    try:
        return c.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def _float_tag(mv: Any, key: str) -> float:
    try:
        return float(mv.tags.get(TAG + key))
    except (TypeError, ValueError):
        return math.nan


# ---------------------------------------------------------------- champion on the challenger's rows
def vs_prefix(champion_version: int | str) -> str:
    """Tag prefix of the scores of a version against champion version N (`replaylab.vs.vN.`)."""
    return f"{TAG}vs.v{champion_version}."


def rescore_json(name: str, version: int | str, champion_version: int | str) -> str:
    return f"rescore/{name}-v{version}-vs-v{champion_version}.json"


def load_scorer(folder: Path, cfg: DictConfig) -> Any:
    """The runtime's DemandPredictor of a verified folder (online recalibration off)."""
    from replaylab.runtime import DemandPredictor

    p = DemandPredictor.load(folder, hmac_key=hmac_key(cfg.export.get("hmac_key_env")),
                             online=False)
    if not p.loaded:
        raise ManifestError(p.reason or "not_loaded", f"{folder}: the runtime refuses it")
    return p


def _group_text(groups: list[dict]) -> str:
    return "; ".join(f"{g['by']}={g['value']}: {g['coverage']:.3f} (n={g['n']})"
                     for g in groups)[:TAG_MAX]


def rescore_against(c: Any, cfg: DictConfig, name: str, mv: Any, folder: Path, rows: Any,
                    source: str, alias: str | None = None) -> dict | None:
    """Score the version `alias` points at (default `export.registry.rescore_alias`) and
    the challenger `mv` (its verified folder) on the challenger's test `rows`, with the
    same code (`replaylab.artifacts.rescore`); record the scores on `mv` (tags
    `replaylab.vs.v<champion>.*`), as metrics and a JSON file of the open run. None: no
    other champion. A champion that does not verify or load is recorded as an error."""
    import mlflow

    from replaylab.artifacts.rescore import (
        compare_scores,
        paired_delta,
        predict_rows,
        score_artifact,
    )
    from replaylab.runtime.demand import ArtifactError

    alias = alias or cfg.export.registry.get("rescore_alias")
    champion = alias_version(c, name, str(alias)) if alias else None
    if champion is None or str(champion.version) == str(mv.version) or \
            champion.tags.get(TAG + "content_hash") == mv.tags.get(TAG + "content_hash"):
        return None  # no other champion, or the very same artifact
    prefix = vs_prefix(champion.version)
    doc: dict[str, Any] = {
        "challenger": {"name": name, "version": int(mv.version),
                       "content_hash": mv.tags.get(TAG + "content_hash")},
        "champion": {"version": int(champion.version), "alias": str(alias),
                     "content_hash": champion.tags.get(TAG + "content_hash")},
        "rows_source": source, "rows": int(len(rows.y)), "labelled_rows": int(rows.usable.sum())}
    try:
        manifest = verify_manifest(folder, hmac_key=hmac_key(cfg.export.get("hmac_key_env")))
        groups = tuple((manifest.get("calibration") or {}).get("group_columns") or ())
        with tempfile.TemporaryDirectory() as tmp:
            _, cm, champion_folder = verified_version(c, cfg, name, champion.version, Path(tmp))
            doc["champion_fit_overlap"] = fit_overlap(cm, rows)
            pa, pb = load_scorer(folder, cfg), load_scorer(champion_folder, cfg)
            ba, bb = predict_rows(pa, rows), predict_rows(pb, rows)
            doc["scores"] = {"challenger": score_artifact(pa, rows, groups, batch=ba),
                             "champion": score_artifact(pb, rows, groups, batch=bb)}
            delta = paired_delta(ba, bb, rows)
    except (ManifestError, ArtifactError) as e:
        doc["error"] = f"champion v{champion.version} not scored: {e}"
        c.set_model_version_tag(name, mv.version, prefix + "error", doc["error"][:TAG_MAX])
        return doc
    cmp = doc["comparison"] = compare_scores(doc["scores"]["challenger"],
                                             doc["scores"]["champion"])
    # the gate's number: challenger - champion mean pinball, paired interval on these rows
    cmp["delta"] = delta
    cmp["challenger_better_ci"] = bool(math.isfinite(delta["ci"][1]) and delta["ci"][1] < 0)
    run = mlflow.active_run()
    tags = {"champion_content_hash": str(doc["champion"]["content_hash"]),
            "rows": str(cmp["challenger"]["scored_rows"]), "rows_source": source,
            "same_rows": str(cmp["challenger"]["scored_rows"]
                             == cmp["champion"]["scored_rows"]).lower(),
            "levels": ",".join(cmp["levels"]),
            "challenger_better": str(cmp["challenger_better"]).lower(),
            "delta_mean_pinball": repr(float(delta["delta"])),
            "delta_ci": json.dumps(delta["ci"]),
            "delta_resampled": f"{delta['resampled']} ({delta['sessions']} sessions, "
                               f"{delta['n']} rows, {delta['n_boot']} draws, 95%)",
            "champion.coverage_by_group": _group_text(doc["scores"]["champion"]["groups"]),
            "champion_fit_overlap": str(doc["champion_fit_overlap"]).lower(),
            "scored_in_run": run.info.run_id if run is not None else "",
            "scores_json": rescore_json(name, mv.version, champion.version)}
    for role in ("challenger", "champion"):  # the rest: the JSON file and the run's metrics
        for k in ("mean_pinball", "coverage"):
            tags[f"{role}.{k}"] = repr(float(cmp[role][k]))
    metrics = {f"rescore.vs_v{champion.version}.{role}.{k}": float(cmp[role][k])
               for role in ("challenger", "champion")
               for k in ("mean_pinball", "coverage", "mean_width")}
    for g in doc["scores"]["champion"]["groups"]:
        key = "".join(ch if ch.isalnum() or ch in "_-." else "_"
                      for ch in f"{g['by']}.{g['value']}")
        metrics[f"rescore.vs_v{champion.version}.champion.coverage.{key}"] = g["coverage"]
    record_rescore(c, name, mv, prefix, tags, doc, metrics)
    return doc


def record_rescore(c: Any, name: str, mv: Any, prefix: str, tags: dict[str, str], doc: dict,
                   metrics: dict[str, float]) -> None:
    """Tags on the version, the full document and metrics in the open run."""
    import mlflow

    for k, v in tags.items():
        c.set_model_version_tag(name, mv.version, prefix + k, v)
    if mlflow.active_run() is not None:
        mlflow.log_text(json.dumps(doc, indent=1, default=str), tags["scores_json"])
        mlflow.log_metrics({k: v for k, v in metrics.items()
                            if isinstance(v, int | float) and math.isfinite(v)})


def rescore_router_against(c: Any, cfg: DictConfig, name: str, mv: Any, folder: Path,
                           ) -> dict | None:
    """At the end of pipeline=router: the router `export.registry.rescore_alias` points at
    and the challenger `mv` (its verified folder), both through the serving runtime, on
    the challenger's test prompts (rebuilt from the run's outcomes table and config),
    scored by the pipeline's policy metrics (`replaylab.router.rescore`); recorded as
    `replaylab.vs.v<champion>.*` tags, metrics and a JSON file (with both curves)."""
    import mlflow

    from replaylab.apps.inputs import load_outcomes, plain
    from replaylab.pipelines.router import test_prompts
    from replaylab.router.pipeline_config import router_config
    from replaylab.router.rescore import (
        RouterRescoreError,
        compare_routers,
        route_prompts,
        score_choices,
    )
    from replaylab.runtime import Router

    alias = cfg.export.registry.get("rescore_alias")
    champion = alias_version(c, name, str(alias)) if alias else None
    if champion is None or str(champion.version) == str(mv.version) or \
            champion.tags.get(TAG + "content_hash") == mv.tags.get(TAG + "content_hash"):
        return None
    prefix = vs_prefix(champion.version)
    values = plain(cfg.router)
    values.pop("encoder", None)
    rcfg = router_config(values)
    outcomes, origin = load_outcomes(cfg)
    matrix, texts, meta = test_prompts(outcomes, rcfg)
    key = hmac_key(cfg.export.get("hmac_key_env"))
    doc: dict[str, Any] = {
        "kind": "router",
        "challenger": {"name": name, "version": int(mv.version),
                       "content_hash": mv.tags.get(TAG + "content_hash")},
        "champion": {"version": int(champion.version), "alias": str(alias),
                     "content_hash": champion.tags.get(TAG + "content_hash")},
        "rows_source": f"outcomes {origin}", "rows": len(texts)}
    ev = rcfg.labels.evaluation
    try:
        with tempfile.TemporaryDirectory() as tmp:
            _, _, champion_folder = verified_version(c, cfg, name, champion.version, Path(tmp))
            fit = fit_prompt_hashes(champion_folder)
            doc["scores"], routed = {}, {}
            for role, f in (("challenger", folder), ("champion", champion_folder)):
                router = Router.load(f, hmac_key=key)
                if not router.loaded:
                    raise ManifestError(router.reason or "not_loaded",
                                        f"{role}: the runtime refuses it")
                choice, prob = route_prompts(router, matrix, texts, meta)
                routed[role] = (router.rule, choice, prob)
                doc["scores"][role] = score_choices(router.rule, matrix, choice, prob, ev)
    except (ManifestError, RouterRescoreError) as e:
        doc["error"] = f"champion v{champion.version} not scored: {e}"
        c.set_model_version_tag(name, mv.version, prefix + "error", doc["error"][:TAG_MAX])
        return doc
    cmp_doc = compare_routers(matrix, texts, routed, fit, ev)
    overlap, deltas = cmp_doc["champion_fit_overlap"], cmp_doc["delta"]
    doc["champion_fit_overlap"] = overlap
    if "scores_unseen" in cmp_doc:
        doc["scores_unseen"] = cmp_doc["scores_unseen"]
    pa, pb = (doc["scores"][r]["policy"] for r in ("challenger", "champion"))
    doc["comparison"] = {"rows": len(texts), **{
        role: {k: pol[k] for k in ("quality", "cost", "strong_share", "cost_ratio_at_95")}
        | {"quality_ci": pol["ci"]["quality"], "cost_ci": pol["ci"]["cost"]}
        for role, pol in (("challenger", pa), ("champion", pb))},
        "delta": deltas, "champion_fit_overlap": overlap}
    if "scores_unseen" in doc:
        doc["comparison"]["unseen"] = {
            role: {k: s_["policy"][k] for k in ("quality", "cost", "cost_ratio_at_95")}
            for role, s_ in doc["scores_unseen"].items()}
    run = mlflow.active_run()
    tags = {"champion_content_hash": str(doc["champion"]["content_hash"]),
            "rows": str(len(texts)), "rows_source": doc["rows_source"][:TAG_MAX],
            "scored_in_run": run.info.run_id if run is not None else "",
            "scores_json": rescore_json(name, mv.version, champion.version)}
    metrics = {}
    for role, pol in (("challenger", pa), ("champion", pb)):
        for k in ("quality", "cost", "cost_ratio_at_95"):
            tags[f"{role}.{k}"] = repr(float(pol[k])) if pol[k] is not None else "nan"
            metrics[f"rescore.vs_v{champion.version}.{role}.{k}"] = pol[k]
        tags[f"{role}.quality_ci"] = json.dumps(pol["ci"]["quality"])
    for part, d in deltas.items():  # challenger - champion, paired prompt-bootstrap
        for k, v in d.items():
            tags[f"delta.{part}.{k}"] = json.dumps({"mean": v["mean"], "ci": v["ci"]})
    tags["champion_fit_overlap"] = (
        f"{overlap['seen']} of {overlap['prompts']} test prompts "
        f"({overlap['seen'] / max(overlap['prompts'], 1):.1%}) were in the champion's "
        "training or calibration prompts" if overlap["known"] else overlap["what"])
    for role, s_ in (doc.get("scores_unseen") or {}).items():
        for k in ("quality", "cost", "cost_ratio_at_95"):
            v = s_["policy"][k]
            tags[f"{role}.unseen.{k}"] = repr(float(v)) if v is not None else "nan"
    record_rescore(c, name, mv, prefix, tags, doc, metrics)
    return doc


def fit_prompt_hashes(folder: Path) -> set[str] | None:
    """The prompt hashes a verified router folder was fitted and calibrated on (its
    fit_prompts.json), None when it records none."""
    from replaylab.router.artifact import FIT_PROMPTS_FILE

    path = folder / FIT_PROMPTS_FILE
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    return {str(h) for k in ("train", "calibration") for h in doc.get(k) or []}


def fit_overlap(manifest: dict, rows: Any) -> bool:
    """True when the time window a version was fitted and calibrated on overlaps the
    rows' dispatch times: its scores there may be optimistic (it may have seen them)."""
    from replaylab.contracts import Ledger as L

    window = (manifest.get("training") or {}).get("time_window") or {}
    t = rows.frame[L.TIMESTAMP].to_numpy(dtype="int64")  # epoch ms, as the pipeline records
    if not len(t):
        return False
    lo, hi = int(t.min()), int(t.max())
    return any(int(w["first_ms"]) <= hi and int(w["last_ms"]) >= lo
               for s, w in window.items() if s in ("train", "calibration") and w)


def recorded_rescore(c: Any, mv: Any, champion: Any, into: Path) -> dict | None:
    """The scores of `mv` against `champion` recorded earlier (its JSON file), or None."""
    prefix = vs_prefix(champion.version)
    run_id, path = mv.tags.get(prefix + "scored_in_run"), mv.tags.get(prefix + "scores_json")
    if not (run_id and path) or mv.tags.get(prefix + "champion_content_hash") != \
            champion.tags.get(TAG + "content_hash"):
        return None
    try:
        return json.loads(Path(c.download_artifacts(run_id, path, str(into))).read_text())
    except Exception:  # MlflowException / OSError: the run or its file is gone
        return None


def challenger_ledger_rows(c: Any, cfg: DictConfig, mv: Any, ledger: str) -> Any:
    """The challenger's test rows re-derived from `ledger` with its training run's own
    projection, split and label configs (config/resolved.yaml); ConfigError when the
    ledger is not the one it was trained on (another fingerprint)."""
    from omegaconf import OmegaConf

    from replaylab.apps.inputs import plain
    from replaylab.artifacts.rescore import ledger_test_rows
    from replaylab.config import from_mapping
    from replaylab.contracts.ledger import read_ledger
    from replaylab.projection import ProjectionConfig, SplitConfig

    # the training run, else the run that registered it (a run whose store was lost is
    # logged again by `export register`, config/resolved.yaml included)
    runs = list(dict.fromkeys(r for r in (mv.tags.get(TAG + "source_run_id"), mv.run_id) if r))
    with tempfile.TemporaryDirectory() as tmp:
        local, errors = None, []
        for train_run in runs:
            try:
                local = c.download_artifacts(train_run, "config/resolved.yaml", tmp)
                break
            except Exception as e:  # MlflowException / OSError
                errors.append(f"{train_run}: {str(e).splitlines()[0][:200]}")
        if local is None:
            raise FileNotFoundError(f"v{mv.version}: neither its training run nor the run that "
                                    f"registered it has config/resolved.yaml here "
                                    f"({'; '.join(errors)})")
        tcfg = OmegaConf.load(local)
    projection = from_mapping(ProjectionConfig, plain(tcfg.projection), "projection")
    split = from_mapping(SplitConfig, plain(tcfg.split), "split")
    rows = ledger_test_rows(read_ledger(ledger).valid, projection, split,
                            bool(tcfg.demand.get("failed_is_censored", True)))
    want = mv.tags.get(TAG + "data_fingerprint")
    if rows.fingerprint != want:
        raise ConfigError(f"ledger={ledger}: fingerprint {rows.fingerprint}, but v{mv.version} "
                          f"was trained on {want}: not its ledger")
    return rows


# ---------------------------------------------------------------- promotion
def gate(mv: Any, champion: Any | None, own: dict[str, str] | None = None) -> tuple[bool,
                                                                                list[str]]:
    """(passed, reasons) of the promotion gate for version `mv` against `champion`.

    First the version's own verdict (tag `go`: router, the pipeline's go/no-go; demand,
    the run's `gate` as its report shows it). Demand against another champion: the
    champion re-scored on the challenger's own test rows (`replaylab.vs.v<champion>.*`,
    same code for both), and the upper bound of the paired bootstrap interval of
    (challenger - champion) mean pinball must be below 0; without such a score (or one
    recorded before intervals were), refused with the command that scores it.

    own: the version's verdict tags recomputed from its verified manifest
    (`version_tags`); given, they decide, not the stored tags (which anyone with write
    access can edit in the MLflow UI), and an edited `go` tag is named in the reasons.
    """
    kind, reasons = mv.tags.get(TAG + "kind"), []
    said = own if own is not None else mv.tags
    go = said.get(TAG + "go") == "true"
    reasons.append(f"go={str(go).lower()}: {said.get(TAG + 'go_reasons', '')}")
    if own is not None and mv.tags.get(TAG + "go") != own.get(TAG + "go"):
        reasons.append(f"the version's tag {TAG}go={mv.tags.get(TAG + 'go')} was edited: its "
                       f"verified manifest says go={own.get(TAG + 'go')}, which is used")
    if kind != "demand":
        return go, reasons
    if champion is None or champion.version == mv.version:
        reasons.append("no other champion: pinball not compared")
        return go, reasons
    ok, more = _against_champion(mv, champion)
    return go and ok, reasons + more


def _against_champion(mv: Any, champion: Any) -> tuple[bool, list[str]]:
    """The demand challenger's pinball against the champion's on its own rows (every
    reason is listed, whatever the version's own verdict)."""
    reasons: list[str] = []
    prefix, t = vs_prefix(champion.version), mv.tags
    score_it = (f"score it there: python -m export compare name={mv.name} "
                f"version={mv.version} alias=<its alias> ledger=<this version's ledger>")
    if t.get(prefix + "challenger_better") is None or \
            t.get(prefix + "champion_content_hash") != champion.tags.get(TAG + "content_hash"):
        window = ("on the same test window" if champion.tags.get(TAG + "test_window")
                  == t.get(TAG + "test_window") else
                  f"and was tested on another window ({champion.tags.get(TAG + 'test_window')} "
                  f"vs {t.get(TAG + 'test_window')})")
        reasons.append(f"champion v{champion.version} was never scored on this version's test "
                       f"rows {window}: no paired interval of the pinball difference, refused; "
                       + score_it)
        return False, reasons
    v = f"vs.v{champion.version}."
    new, old = _float_tag(mv, v + "challenger.mean_pinball"), _float_tag(
        mv, v + "champion.mean_pinball")
    same = t.get(prefix + "same_rows") == "true"
    try:
        lo, hi = (float(x) for x in json.loads(t.get(prefix + "delta_ci") or "null"))
    except (TypeError, ValueError):
        lo = hi = math.nan
    delta = _float_tag(mv, v + "delta_mean_pinball")
    significant = math.isfinite(hi) and hi < 0
    ok = same and significant
    if not math.isfinite(hi):
        verdict = ("no paired interval recorded (scored before intervals were): refused; "
                   "re-" + score_it)
    else:
        verdict = (f"challenger − champion {delta:+.4g} (paired 95% interval "
                   f"[{lo:+.4g}, {hi:+.4g}], {t.get(prefix + 'delta_resampled', '')}): "
                   + ("better, the upper bound is below 0" if significant else
                      "not shown better, the upper bound is not below 0"))
    reasons.append(f"champion v{champion.version} re-scored on this version's "
                   f"{t.get(prefix + 'rows')} test rows ({t.get(prefix + 'rows_source')}, "
                   f"quantiles {t.get(prefix + 'levels')}): mean pinball {new:.4g} vs "
                   f"champion's {old:.4g}; {verdict}; coverage "
                   f"{_float_tag(mv, v + 'challenger.coverage'):.3f} vs "
                   f"{_float_tag(mv, v + 'champion.coverage'):.3f}"
                   + ("" if same else "; the champion did not answer every row: refused")
                   + ("; warning: the champion was fitted on a time window overlapping "
                      "these rows (its score may be optimistic)"
                      if t.get(prefix + "champion_fit_overlap") == "true" else ""))
    return ok, reasons


def promote(cfg: DictConfig, run_dir: Path) -> dict:
    """The job of `python -m export promote name=... version=N alias=champion [force=true
    reason=...]`: move the alias only when the version verifies and its gate passes."""
    import mlflow

    if not (cfg.name and cfg.version and cfg.alias):
        raise ConfigError("promote needs name=<registered model> version=N alias=<alias>")
    if cfg.force and not cfg.reason:
        raise ConfigError("force=true needs reason='...' (it is logged)")
    c = client(cfg)
    name, version, alias = str(cfg.name), str(cfg.version), str(cfg.alias)
    champion = alias_version(c, name, alias)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mv, manifest, folder = verified_version(c, cfg, name, version, Path(tmp))
            verified, why_not = True, None
        except ManifestError as e:
            mv, verified, why_not = c.get_model_version(name, version), False, str(e)
            folder = None
        passed, reasons = (gate(mv, champion, own=version_tags(manifest, cfg.export.registry))
                           if verified else (False, [f"manifest: {why_not}"]))
        reports = {}
        if champion is not None and champion.version != mv.version:
            reports = compare_versions(c, cfg, name, mv, champion, run_dir)
    decision = "promoted" if passed else ("forced" if cfg.force else "refused")
    if not verified and cfg.force:
        decision = "refused"  # force never serves files that do not verify
        reasons.append("force ignored: the manifest does not verify")
    if decision != "refused":
        c.set_registered_model_alias(name, alias, version)
        c.set_model_version_tag(name, version, TAG + f"promoted.{alias}",
                                mlflow.active_run().info.run_id if mlflow.active_run() else "")
    tags = {"registry.action": "promote", "registry.model": name, "registry.version": version,
            "registry.alias": alias, "registry.decision": decision,
            "registry.verified": str(verified).lower(), "registry.gate_passed": str(passed).lower(),
            "registry.force": str(bool(cfg.force)).lower(),
            "registry.reason": str(cfg.reason or ""),
            "registry.previous": str(champion.version) if champion is not None else "none",
            "registry.gate_reasons": " | ".join(reasons)[:4000]}
    if mlflow.active_run() is not None:
        mlflow.set_tags(tags)
    summary = {"pipeline": "export", "action": "promote",
               "promotion": {"name": name, "version": int(version), "alias": alias,
                             "decision": decision, "verified": verified, "gate_passed": passed,
                             "reasons": reasons, "force": bool(cfg.force),
                             "reason": cfg.reason, "previous": None if champion is None
                             else int(champion.version)},
               "reports": reports, "artifacts": {}}
    del folder
    return summary


# ---------------------------------------------------------------- fetch
def alias_provenance(c: Any, name: str, mv: Any, alias: str) -> dict:
    """Whether `alias` was placed on version `mv` by a promote run (the gate).

    The promote run writes tag `replaylab.promoted.<alias>` = its run id on the version
    and records `registry.decision` (promoted / forced), model, version and alias; the
    last promote run of that alias that moved it (any decision but refused) must be that
    run, so an alias set by hand (the MLflow UI's pencil, `set_registered_model_alias`),
    even back onto a version promoted earlier, is not the gate's.
    {"gated" (placed by a promote run), "decision", "forced", "forced_reason",
    "promote_run", "why" (when not gated)}.
    """
    version = str(mv.version)
    out: dict[str, Any] = {"alias": alias, "gated": False, "decision": None, "forced": False,
                           "forced_reason": None, "promote_run": None}
    run_id = (mv.tags or {}).get(TAG + f"promoted.{alias}")
    if not run_id:
        out["why"] = (f"{name}@{alias} points at v{version}, which carries no "
                      f"{TAG}promoted.{alias} tag: the alias was moved outside the promotion "
                      "gate")
        return out
    out["promote_run"] = run_id
    try:
        run = c.get_run(run_id)
    except Exception as e:  # MlflowException: the run is gone
        out["why"] = f"the promote run {run_id} named on v{version} cannot be read ({e})"
        return out
    t = run.data.tags
    decision = t.get("registry.decision")
    if (t.get("registry.action"), t.get("registry.model"), t.get("registry.version"),
            t.get("registry.alias")) != ("promote", name, version, alias) or \
            decision not in ("promoted", "forced"):
        out["why"] = (f"run {run_id} named on v{version} did not promote {name} v{version} to "
                      f"{alias} (decision {decision!r})")
        return out
    latest = c.search_runs(
        [run.info.experiment_id],
        filter_string=(f"tags.`registry.action` = 'promote' and tags.`registry.model` = "
                       f"'{name}' and tags.`registry.alias` = '{alias}' and "
                       "tags.`registry.decision` != 'refused'"),
        order_by=["attributes.start_time DESC"], max_results=1)
    if latest and latest[0].info.run_id != run_id:
        last = latest[0].data.tags
        out["why"] = (f"the last promote of {name}@{alias} (run {latest[0].info.run_id}) "
                      f"moved it to v{last.get('registry.version')}; v{version} was put back "
                      "outside the gate")
        return out
    out.update(gated=True, decision=decision, forced=decision == "forced",
               forced_reason=t.get("registry.reason") if decision == "forced" else None)
    return out


def _fetch_provenance(c: Any, name: str, mv: Any, alias: str | None) -> dict:
    """The alias's provenance (alias fetch), else the first alias of the version a
    promote run placed (version fetch); not gated when none was."""
    if alias:
        return alias_provenance(c, name, mv, alias)
    found = [alias_provenance(c, name, mv, str(a)) for a in (getattr(mv, "aliases", None) or [])]
    ok = [p for p in found if p["gated"]]
    if ok:
        return ok[0]
    return {"alias": None, "gated": False, "decision": None, "forced": False,
            "forced_reason": None, "promote_run": None,
            "why": f"{name} v{mv.version} is fetched by number and no alias a promote run "
                   "placed points at it"}


def fetch(cfg: DictConfig, run_dir: Path) -> dict:
    """The job of `python -m export fetch name=... alias=champion out=DIR`: download the
    version the alias points at, verify it, and publish it as DIR in one rename. A download
    that does not verify is refused and DIR is left as it was (the runtime then serves the
    previous verified folder, or falls back when there is none). A version whose alias was
    not placed by a promote run (`alias_provenance`) is refused the same way unless
    `export.allow_ungated=true`; a forced version is served with FORCED and its reason."""
    import logging

    import mlflow

    if not (cfg.name and (cfg.alias or cfg.version) and cfg.out):
        raise ConfigError("fetch needs name=<registered model> alias=<alias> (or version=N) "
                          "out=DIR")
    c = client(cfg)
    name, out = str(cfg.name), Path(cfg.out)
    if cfg.alias:
        mv = alias_version(c, name, str(cfg.alias))
        if mv is None:
            raise FileNotFoundError(f"{name}@{cfg.alias}: no such alias")
        version = mv.version
    else:
        version = str(cfg.version)
        mv = c.get_model_version(name, version)
    allow = bool((cfg.get("export") or {}).get("allow_ungated", False))
    prov = _fetch_provenance(c, name, mv, str(cfg.alias) if cfg.alias else None)

    def refused(why: str) -> None:
        if mlflow.active_run() is not None:
            mlflow.set_tags({"registry.action": "fetch", "registry.model": name,
                             "registry.version": str(version),
                             "registry.alias": str(cfg.alias or ""),
                             "registry.decision": "refused", "registry.reason": why[:TAG_MAX]})

    if not prov["gated"] and not allow:
        why = f"{prov['why']}; not served, {out} left as it was (export.allow_ungated=true " \
              "serves it anyway)"
        refused(why)
        raise FetchRefused(why)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mv, manifest, folder = verified_version(c, cfg, name, version, Path(tmp))
        except ManifestError as e:
            refused(str(e))
            raise FetchRefused(f"{name} v{version}: download refused, {out} left as it was "
                               f"({e})") from None
        with staged_folder(out) as staged:
            shutil.copytree(folder, staged, dirs_exist_ok=True)
        verify_manifest(out, hmac_key=hmac_key(cfg.export.get("hmac_key_env")))
    log = logging.getLogger("replaylab")
    if prov["forced"]:
        log.warning("FORCED: %s v%s was forced onto %s past a refusing gate (run %s): %s",
                    name, version, prov["alias"], prov["promote_run"], prov["forced_reason"])
    elif not prov["gated"]:
        log.warning("UNGATED: %s v%s served with export.allow_ungated=true: %s", name, version,
                    prov["why"])
    if mlflow.active_run() is not None:
        mlflow.set_tags({"registry.action": "fetch", "registry.model": name,
                         "registry.version": str(version), "registry.alias": str(cfg.alias or ""),
                         "registry.decision": "fetched",
                         "registry.gated": str(prov["gated"] and not prov["forced"]).lower(),
                         "registry.forced": str(prov["forced"]).lower(),
                         "registry.content_hash": manifest["content_hash"]})
    section = {"name": name, "alias": cfg.alias, "version": int(version),
               "content_hash": manifest["content_hash"], "kind": manifest["kind"],
               "path": str(out),
               # gated: the gate passed (decision promoted); forced: moved past a refusal
               "gated": bool(prov["gated"] and not prov["forced"]),
               "forced": bool(prov["forced"]), "forced_reason": prov["forced_reason"],
               "promote_run": prov["promote_run"], "decision": prov["decision"]}
    if not prov["gated"]:
        section.update(allowed_ungated=True, ungated_reason=prov["why"])
    return {"pipeline": "export", "action": "fetch", "fetch": section, "artifacts": {}}


# ---------------------------------------------------------------- compare view
def run_summary(c: Any, mv: Any, into: Path) -> dict:
    """summary.json of the run a version was registered from ({} when it has none)."""
    for path in ("summary.json", "source_run/summary.json"):
        try:
            local = c.download_artifacts(mv.run_id, path, str(into))
        except Exception:  # MlflowException / OSError: not logged by that run
            continue
        doc = json.loads(Path(local).read_text())
        if doc.get("action") != "register":
            return doc
    return {}


def compare_versions(c: Any, cfg: DictConfig, name: str, challenger: Any, champion: Any,
                     run_dir: Path, rescore: dict | None = None) -> dict:
    """Write the compare report of two versions into run_dir; {"compare": path}. rescore:
    the champion re-scored on the challenger's rows (default: the one recorded, if any)."""
    from replaylab.tracking.compare_report import write_compare_report

    with tempfile.TemporaryDirectory() as tmp:
        sides = {}
        for role, mv in (("challenger", challenger), ("champion", champion)):
            sides[role] = {"version": int(mv.version), "tags": dict(mv.tags),
                           "summary": run_summary(c, mv, Path(tmp) / role)}
        if rescore is None:
            rescore = recorded_rescore(c, challenger, champion, Path(tmp) / "rescore")
        path = write_compare_report(name, sides["challenger"], sides["champion"], run_dir,
                                    rescore=rescore)
    return {"compare": str(path)}


def compare(cfg: DictConfig, run_dir: Path) -> dict:
    """The job of `python -m export compare name=... version=N [alias=champion]
    [ledger=PATH]`: with the challenger's ledger, the champion is first scored on the
    challenger's test rows (recorded on the version: the gate reads it)."""
    if not (cfg.name and cfg.version):
        raise ConfigError("compare needs name=<registered model> version=N [alias=champion]")
    c = client(cfg)
    name, alias = str(cfg.name), str(cfg.alias or "champion")
    champion = alias_version(c, name, alias)
    if champion is None:
        raise FileNotFoundError(f"{name}@{alias}: no such alias to compare with")
    mv = c.get_model_version(name, str(cfg.version))
    rescore = None
    if cfg.get("ledger"):
        if mv.tags.get(TAG + "kind") != "demand":
            raise ConfigError("ledger= re-scores a demand champion; the router is compared on "
                              "its recorded test curves (docs/howto/mlflow.md)")
        rows = challenger_ledger_rows(c, cfg, mv, str(cfg.ledger))
        with tempfile.TemporaryDirectory() as tmp:
            _, _, folder = verified_version(c, cfg, name, mv.version, Path(tmp))
            rescore = rescore_against(c, cfg, name, mv, folder, rows, f"ledger {cfg.ledger}",
                                      alias=alias)
        if rescore is not None and "error" in rescore:
            raise ManifestError("champion", rescore["error"])
        mv = c.get_model_version(name, str(cfg.version))  # with the scores' tags
    reports = compare_versions(c, cfg, name, mv, champion, run_dir, rescore=rescore)
    return {"pipeline": "export", "action": "compare", "reports": reports, "artifacts": {},
            "compare": {"name": name, "challenger": int(mv.version),
                        "champion": int(champion.version),
                        "rescore": None if rescore is None else rescore.get("comparison")}}
