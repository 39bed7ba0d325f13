"""The MLflow Model Registry: register verified artifact folders, gate aliases, fetch by alias.

A registered version is the artifact folder itself (model.onnx / router.json /
encoder/ ... and manifest.json), logged as a plain run artifact and registered
from there; its tags carry what a reviewer and the promotion gate read (the
manifest's content hash, the data fingerprint, the projection version, the
headline metrics, the go/no-go verdict, the test window). docs/mlflow.md says
why it is not an `mlflow.pyfunc` model.

Verification is the manifest's (`replaylab.artifacts.manifest.verify_manifest`),
before a version is registered, before an alias moves, and after every fetch.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from replaylab.apps.provenance import hmac_key
from replaylab.artifacts.manifest import (
    ManifestError,
    canonical_json,
    staged_folder,
    verify_manifest,
)
from replaylab.config import ConfigError

KINDS = ("demand", "router")
ARTIFACT_PATH = {"demand": "demand_artifact", "router": "router_artifact"}  # in the run
TAG = "replaylab."  # prefix of every tag this module writes


class FetchRefused(Exception):
    """A downloaded version did not verify (an input error: exit code 2, DIR untouched)."""


# ---------------------------------------------------------------- what a version says
def test_window(manifest: dict) -> str:
    """A short id of the data and test window a version was scored on: two versions with
    the same id were scored on the same test rows (same ledger, same split)."""
    t = manifest.get("training") or {}
    body = {"data": data_fingerprint(manifest), "window": (t.get("time_window") or {}).get("test"),
            "n_test": (t.get("labels") or {}).get("test")}
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


def coverage_allowance(level: float, n: int, band: float, z: float) -> float:
    """Half-width around the nominal level a measured coverage may sit in: the configured
    band plus z binomial standard errors of a coverage measured on n test rows."""
    return band + z * math.sqrt(level * (1.0 - level) / max(n, 1))


def demand_gate(manifest: dict, reg: Any) -> tuple[bool, str, dict]:
    """(passed, reason, facts) of the demand gate's own part: coverage within band."""
    t = manifest.get("training") or {}
    head = t.get("headline") or {}
    level = float((manifest.get("calibration") or {}).get("level", math.nan))
    cov = head.get("test_coverage")
    n = int((t.get("labels") or {}).get("test") or (t.get("rows") or {}).get("test") or 0)
    if cov is None or not math.isfinite(level) or n <= 0:
        return False, "no test coverage recorded", {"level": level}
    allow = coverage_allowance(level, n, float(reg.coverage_band), float(reg.coverage_z))
    ok = abs(float(cov) - level) <= allow
    facts = {"level": level, "coverage": float(cov), "n_test": n, "allowance": allow}
    why = (f"coverage {cov:.3f} {'within' if ok else 'outside'} {level:g} +- {allow:.3f} "
           f"(band {float(reg.coverage_band):g} + {float(reg.coverage_z):g} binomial s.e., "
           f"n={n})")
    return ok, why, facts


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
        ok, why, _ = demand_gate(manifest, reg)
        tags.update({f"metric.{k}": repr(float(v)) for k, v in head.items()
                     if isinstance(v, int | float) and not isinstance(v, bool)})
        tags.update(go=str(ok).lower(), go_reasons=why,
                    interval=str((manifest.get("calibration") or {}).get("level")))
    else:
        go = t.get("go")
        tags.update(go=str(go is True).lower(),
                    go_reasons="; ".join(map(str, t.get("go_reasons") or []))[:4000])
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
    if logged_at is None:
        c.log_artifacts(run_id, str(folder), artifact_path=path)
    try:
        c.create_registered_model(name, description=f"replaylab {kind} artifact folders "
                                  "(manifest-verified; docs/mlflow.md)")
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    tags = version_tags(manifest, cfg.export.registry)
    tags[TAG + "signature"] = json.dumps(signature(manifest))
    tags[TAG + "registered_by_run"] = run_id
    run = c.get_run(run_id)
    source = f"{run.info.artifact_uri.rstrip('/')}/{path}"
    mv = c.create_model_version(name, source, run_id=run_id, tags=tags,
                                description=f"{kind} {manifest['version']} "
                                            f"{manifest['content_hash'][:19]}")
    return {"name": name, "version": int(mv.version), "content_hash": manifest["content_hash"],
            "go": tags[TAG + "go"], "artifact_path": path}


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
        out.append(register_folder(c, run.info.run_id, Path(folder), model_name(cfg, kind), cfg,
                                   logged_at=already))
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
    return Path(mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=str(into),
                                                    tracking_uri=str(cfg.tracking.uri)))


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


# ---------------------------------------------------------------- promotion
def gate(mv: Any, champion: Any | None) -> tuple[bool, list[str]]:
    """(passed, reasons) of the promotion gate for version `mv` against `champion`."""
    kind, reasons = mv.tags.get(TAG + "kind"), []
    go = mv.tags.get(TAG + "go") == "true"
    reasons.append(f"go={str(go).lower()}: {mv.tags.get(TAG + 'go_reasons', '')}")
    if kind != "demand" or not go:
        return go, reasons
    if champion is None or champion.version == mv.version:
        reasons.append("no other champion: pinball not compared")
        return True, reasons
    if champion.tags.get(TAG + "test_window") != mv.tags.get(TAG + "test_window"):
        reasons.append(f"champion v{champion.version} was scored on another test window "
                       f"({champion.tags.get(TAG + 'test_window')} vs "
                       f"{mv.tags.get(TAG + 'test_window')}): pinball not comparable")
        return False, reasons
    new, old = _float_tag(mv, "metric.test_mean_pinball"), _float_tag(
        champion, "metric.test_mean_pinball")
    ok = math.isfinite(new) and math.isfinite(old) and new < old
    reasons.append(f"test mean pinball {new:.4g} {'<' if ok else '>='} champion "
                   f"v{champion.version}'s {old:.4g} on the same test window")
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
        passed, reasons = gate(mv, champion) if verified else (False, [f"manifest: {why_not}"])
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
def fetch(cfg: DictConfig, run_dir: Path) -> dict:
    """The job of `python -m export fetch name=... alias=champion out=DIR`: download the
    version the alias points at, verify it, and publish it as DIR in one rename. A download
    that does not verify is refused and DIR is left as it was (the runtime then serves the
    previous verified folder, or falls back when there is none)."""
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
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mv, manifest, folder = verified_version(c, cfg, name, version, Path(tmp))
        except ManifestError as e:
            import mlflow

            if mlflow.active_run() is not None:
                mlflow.set_tags({"registry.action": "fetch", "registry.model": name,
                                 "registry.version": str(version),
                                 "registry.decision": "refused", "registry.reason": str(e)})
            raise FetchRefused(f"{name} v{version}: download refused, {out} left as it was "
                               f"({e})") from None
        with staged_folder(out) as staged:
            shutil.copytree(folder, staged, dirs_exist_ok=True)
        verify_manifest(out, hmac_key=hmac_key(cfg.export.get("hmac_key_env")))
    import mlflow

    if mlflow.active_run() is not None:
        mlflow.set_tags({"registry.action": "fetch", "registry.model": name,
                         "registry.version": str(version), "registry.alias": str(cfg.alias or ""),
                         "registry.decision": "fetched",
                         "registry.content_hash": manifest["content_hash"]})
    return {"pipeline": "export", "action": "fetch",
            "fetch": {"name": name, "alias": cfg.alias, "version": int(version),
                      "content_hash": manifest["content_hash"], "kind": manifest["kind"],
                      "path": str(out)},
            "artifacts": {}}


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
                     run_dir: Path) -> dict:
    """Write the compare report of two versions into run_dir; {"compare": path}."""
    from replaylab.tracking.compare_report import write_compare_report

    with tempfile.TemporaryDirectory() as tmp:
        sides = {}
        for role, mv in (("challenger", challenger), ("champion", champion)):
            sides[role] = {"version": int(mv.version), "tags": dict(mv.tags),
                           "summary": run_summary(c, mv, Path(tmp) / role)}
        path = write_compare_report(name, sides["challenger"], sides["champion"], run_dir)
    return {"compare": str(path)}


def compare(cfg: DictConfig, run_dir: Path) -> dict:
    """The job of `python -m export compare name=... version=N [alias=champion]`."""
    if not (cfg.name and cfg.version):
        raise ConfigError("compare needs name=<registered model> version=N [alias=champion]")
    c = client(cfg)
    name = str(cfg.name)
    champion = alias_version(c, name, str(cfg.alias or "champion"))
    if champion is None:
        raise FileNotFoundError(f"{name}@{cfg.alias or 'champion'}: no such alias to compare with")
    mv = c.get_model_version(name, str(cfg.version))
    reports = compare_versions(c, cfg, name, mv, champion, run_dir)
    return {"pipeline": "export", "action": "compare", "reports": reports, "artifacts": {},
            "compare": {"name": name, "challenger": int(mv.version),
                        "champion": int(champion.version)}}
