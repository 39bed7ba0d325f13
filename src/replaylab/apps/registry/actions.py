"""The registry's actions: the hook at the end of a recorded run (register what it
wrote, score the champion on its rows), and `python -m export register | promote |
fetch | compare` (docs/howto/mlflow.md)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from replaylab.apps.registry.gate import gate, tag_disagreements
from replaylab.apps.registry.rescore import (
    challenger_ledger_rows,
    recorded_rescore,
    rescore_against,
    router_test_rows,
)
from replaylab.apps.registry.signing import (
    PROMOTION_RECORD,
    read_record,
    sign_record,
    verify_signed,
)
from replaylab.apps.registry.tags import KINDS, TAG, TAG_MAX, version_tags
from replaylab.apps.registry.versions import (
    alias_version,
    client,
    model_name,
    register_folder,
    verified_version,
)
from replaylab.config import ConfigError
from replaylab.contracts.errors import InputError
from replaylab.contracts.manifest import ManifestError, staged_folder


class FetchRefused(InputError):
    """A downloaded version did not verify (an input error: exit code 2, DIR untouched)."""



# ---------------------------------------------------------------- the hook of a recorded run
def run_rescore_rows(kind: str, summary: dict, cfg: DictConfig) -> Any:
    """What the champion is scored on for a run's `kind` folder: demand, the run folder's
    test rows (read now: a RescoreError is recorded); router, a callable rebuilding its
    test prompts (only when there is a champion); a dict: a note, not re-scored; None:
    nothing to score on."""
    arts = summary.get("artifacts") or {}
    if kind == "demand":
        if not all(Path(str(arts.get(k) or "")).is_file() for k in ("features",
                                                                    "predictions_test")):
            return None
        from replaylab.artifacts.rescore_demand import run_test_rows

        return run_test_rows(arts["features"], arts["predictions_test"]), "run folder"
    if summary.get("mode") == "receipts":
        # the champion re-score rebuilds test prompts from an outcome table; a receipts
        # run is judged by OPE on its own test sessions instead (not re-scored here)
        return {"champion": None, "note": "receipts mode: not re-scored against the "
                "champion (OPE on the run's test sessions is the verdict)"}
    if cfg.get("router") is not None and cfg.get("data") is not None:
        return lambda: router_test_rows(cfg)
    return None


def register_outcome(run: Any, summary: dict, cfg: DictConfig,
                     logged: dict[str, dict] | None = None) -> list[dict]:
    """The registry hook at the end of a recorded run: every artifact folder the run wrote
    (summary["artifacts"]["demand" | "router"]) becomes a version, when
    `export.register` is on and tracking is enabled; each is then scored against the
    champion on the run's own test rows (`rescore_against`). logged: kind -> what
    `log_artifact_folder` logged already (`replaylab.apps.recording.log_outcome`)."""
    from replaylab.artifacts.rescore_demand import RescoreError

    reg = cfg.get("export", {}) or {}
    if run is None or not reg.get("register", False):
        return []
    if summary.get("truncated") and not reg.get("allow_truncated", False):
        import logging

        logging.getLogger("replaylab").warning(
            "registry: not registered, the run was trained on a truncated ledger (%s); "
            "export.allow_truncated=true registers it", summary["truncated"][0])
        return []
    arts, logged = summary.get("artifacts") or {}, logged or {}
    c, out = client(cfg), []
    for kind in KINDS:
        folder = arts.get(kind)
        if not folder or not Path(folder).is_dir():
            continue
        r = register_folder(c, run.info.run_id, Path(folder), model_name(cfg, kind), cfg,
                            logged=logged.get(kind))
        try:
            got = run_rescore_rows(kind, summary, cfg)
            if isinstance(got, dict) or got is None:
                doc = None
                if got is not None:
                    r["rescore"] = got
            else:
                mv = c.get_model_version(r["name"], str(r["version"]))
                rows, source = got if isinstance(got, tuple) else (got, None)
                doc = rescore_against(kind, c, cfg, r["name"], mv, Path(folder), rows, source)
        except RescoreError as e:
            doc = {"champion": {"version": None}, "error": str(e)}
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



# ---------------------------------------------------------------- promotion
def promote(cfg: DictConfig, run_dir: Path) -> dict:
    """The job of `python -m export promote name=... version=N alias=champion [force=true
    reason=...]`: move the alias only when the version verifies (signed with this project's
    key, its tags agreeing with its manifest) and its gate passes.

    A move (promoted, or forced past a refusal) writes a signed promotion record
    (`replaylab.apps.registry.signing`: version, content hash, alias, decision, verdict,
    the gate's reasons) as an artifact of this run; `fetch` serves an alias only with a
    valid one. The version gets `replaylab.promoted.<alias>` = this run's id and
    `replaylab.alias.<alias>` = gated | forced (the version the alias left loses its
    `replaylab.alias.<alias>`); a forced one also `replaylab.forced=true`."""
    import mlflow

    if not (cfg.name and cfg.version and cfg.alias):
        raise ConfigError("promote needs name=<registered model> version=N alias=<alias>")
    if cfg.force and not cfg.reason:
        raise ConfigError("force=true needs reason='...' (it is logged)")
    c = client(cfg)
    name, version, alias = str(cfg.name), str(cfg.version), str(cfg.alias)
    champion = alias_version(c, name, alias)
    manifest = None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mv, manifest, folder = verified_version(c, cfg, name, version, Path(tmp))
            verified, why_not = True, None
        except ManifestError as e:
            mv, verified, why_not = c.get_model_version(name, version), False, str(e)
            folder = None
        own = version_tags(manifest, cfg.export.registry) if verified else None
        passed, reasons = (gate(mv, champion, own=own)
                           if verified else (False, [f"manifest: {why_not}"]))
        reports = {}
        if champion is not None and champion.version != mv.version:
            reports = compare_versions(c, cfg, name, mv, champion, run_dir)
    decision = "promoted" if passed else ("forced" if cfg.force else "refused")
    if not verified and cfg.force:
        decision = "refused"  # force never serves files that do not verify
        reasons.append("force ignored: the manifest does not verify")
    verdict = (own or {}).get(TAG + "verdict") or "unverified"
    run = mlflow.active_run()
    run_id = run.info.run_id if run is not None else ""
    if decision != "refused":
        signed = sign_record({
            "name": name, "version": version, "alias": alias,
            "content_hash": manifest["content_hash"], "decision": decision,
            "forced": decision == "forced", "reason": str(cfg.reason or ""),
            "verdict": verdict, "gate_passed": passed, "reasons": reasons,
            "previous": None if champion is None else str(champion.version),
            "promote_run": run_id}, cfg)
        if run is not None:
            mlflow.log_text(json.dumps(signed, indent=1), PROMOTION_RECORD)
        c.set_registered_model_alias(name, alias, version)
        if champion is not None and champion.version != mv.version:
            try:
                c.delete_model_version_tag(name, champion.version, f"{TAG}alias.{alias}")
            except Exception:  # MlflowException: the tag was never set (older versions)
                pass
        c.set_model_version_tag(name, version, TAG + f"promoted.{alias}", run_id)
        c.set_model_version_tag(name, version, f"{TAG}alias.{alias}",
                                "forced" if decision == "forced" else "gated")
        if decision == "forced":
            c.set_model_version_tag(name, version, TAG + "forced", "true")
    tags = {"registry.action": "promote", "registry.model": name, "registry.version": version,
            "registry.alias": alias, "registry.decision": decision,
            "registry.verdict": verdict,
            "registry.verified": str(verified).lower(), "registry.gate_passed": str(passed).lower(),
            "registry.force": str(bool(cfg.force)).lower(),
            "registry.reason": str(cfg.reason or ""),
            "registry.previous": str(champion.version) if champion is not None else "none",
            "registry.gate_reasons": " | ".join(reasons)[:4000]}
    if run is not None:
        mlflow.set_tags(tags)
    summary = {"pipeline": "export", "action": "promote",
               "promotion": {"name": name, "version": int(version), "alias": alias,
                             "decision": decision, "verified": verified, "gate_passed": passed,
                             "verdict": verdict, "reasons": reasons, "force": bool(cfg.force),
                             "reason": cfg.reason, "previous": None if champion is None
                             else int(champion.version),
                             "record": PROMOTION_RECORD if decision != "refused" else None},
               "reports": reports, "artifacts": {}}
    del folder
    return summary


# ---------------------------------------------------------------- fetch
def alias_provenance(c: Any, cfg: DictConfig, name: str, mv: Any, alias: str) -> dict:
    """Whether `alias` was placed on version `mv` by a promote run (the gate).

    The promote run writes tag `replaylab.promoted.<alias>` = its run id on the version and
    a signed promotion record (`replaylab.apps.registry.signing.PROMOTION_RECORD`) in its
    artifacts. The record must verify with this project's key and name this model,
    version and alias, this run, and a move (promoted / forced): tags and runs made by
    hand carry none. The last promote run of that alias that moved it must be that run,
    so an alias set by hand (the MLflow UI's pencil, `set_registered_model_alias`), even
    back onto a version promoted earlier, is not the gate's. The caller checks the
    record's content hash against the verified download.
    {"gated" (placed by a promote run), "decision", "forced", "forced_reason",
    "promote_run", "record", "why" (when not gated)}.
    """
    version = str(mv.version)
    out: dict[str, Any] = {"alias": alias, "gated": False, "decision": None, "forced": False,
                           "forced_reason": None, "promote_run": None, "record": None}
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
    with tempfile.TemporaryDirectory() as tmp:
        record, why = read_record(c, run_id, cfg, Path(tmp))
    if record is None:
        out["why"] = f"{name}@{alias} -> v{version}: {why}"
        return out
    decision = record.get("decision")
    if (record.get("name"), str(record.get("version")), record.get("alias"),
            record.get("promote_run")) != (name, version, alias, run_id) or \
            decision not in ("promoted", "forced"):
        out["why"] = (f"the signed record of run {run_id} did not move {name} to v{version} "
                      f"as {alias} (it records {record.get('name')} v{record.get('version')} "
                      f"@{record.get('alias')}, decision {decision!r})")
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
    out.update(gated=True, decision=decision, forced=decision == "forced", record=record,
               forced_reason=record.get("reason") if decision == "forced" else None)
    return out


def fetch_provenance(c: Any, cfg: DictConfig, name: str, mv: Any, alias: str | None) -> dict:
    """The alias's provenance (alias fetch), else the first alias of the version a
    promote run placed (version fetch); not gated when none was."""
    if alias:
        return alias_provenance(c, cfg, name, mv, alias)
    found = [alias_provenance(c, cfg, name, mv, str(a))
             for a in (getattr(mv, "aliases", None) or [])]
    ok = [p for p in found if p["gated"]]
    if ok:
        return ok[0]
    return {"alias": None, "gated": False, "decision": None, "forced": False,
            "forced_reason": None, "promote_run": None, "record": None,
            "why": f"{name} v{mv.version} is fetched by number and no alias a promote run "
                   "placed points at it"}


def fetch(cfg: DictConfig, run_dir: Path) -> dict:
    """The job of `python -m export fetch name=... alias=champion out=DIR`: download the
    version the alias points at, verify it (signed with this project's key unless
    export.allow_unsigned=true, its tags agreeing with its manifest), and publish it as DIR
    in one rename. A download that does not verify is refused and DIR is left as it was (the
    runtime then serves the previous verified folder, or falls back when there is none). A
    version whose alias has no valid signed promotion record (`alias_provenance`), or whose
    record names other content, is refused the same way unless `export.allow_ungated=true`
    (then served with one UNGATED line, and the version tagged
    `replaylab.alias.<alias>=ungated`); a forced version is served with FORCED and its
    reason."""
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
    prov = fetch_provenance(c, cfg, name, mv, str(cfg.alias) if cfg.alias else None)

    def refused(why: str) -> None:
        if mlflow.active_run() is not None:
            mlflow.set_tags({"registry.action": "fetch", "registry.model": name,
                             "registry.version": str(version),
                             "registry.alias": str(cfg.alias or ""),
                             "registry.decision": "refused", "registry.reason": why[:TAG_MAX],
                             "mlflow.runName": f"REFUSED {fetch_name(name, cfg)}"})

    def ungated(why: str) -> None:
        if not allow:
            why = f"{why}; not served, {out} left as it was (export.allow_ungated=true " \
                  "serves it anyway)"
            refused(why)
            raise FetchRefused(why)
        prov.update(gated=False, forced=False, why=why)

    if not prov["gated"]:
        ungated(prov["why"])
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mv, manifest, folder = verified_version(c, cfg, name, version, Path(tmp))
        except ManifestError as e:
            refused(str(e))
            raise FetchRefused(f"{name} v{version}: download refused, {out} left as it was "
                               f"({e})") from None
        edited = tag_disagreements(mv, version_tags(manifest, cfg.export.registry))
        if edited:
            refused(edited[0])
            raise FetchRefused(f"{name} v{version}: {edited[0]}; not served, {out} left as "
                               "it was")
        if prov["record"] is not None and prov["record"].get("content_hash") != \
                manifest["content_hash"]:
            ungated(f"the signed promotion record of run {prov['promote_run']} names content "
                    f"{str(prov['record'].get('content_hash'))[:19]}, the version holds "
                    f"{manifest['content_hash'][:19]}")
        with staged_folder(out) as staged:
            shutil.copytree(folder, staged, dirs_exist_ok=True)
        verify_signed(out, cfg)
    log = logging.getLogger("replaylab")
    if prov["forced"]:
        log.warning("FORCED: %s v%s was forced onto %s past a refusing gate (run %s): %s",
                    name, version, prov["alias"], prov["promote_run"], prov["forced_reason"])
    elif not prov["gated"]:
        log.warning("UNGATED: %s v%s served with export.allow_ungated=true: %s", name, version,
                    prov["why"])
        if cfg.alias:
            c.set_model_version_tag(name, str(version), f"{TAG}alias.{cfg.alias}", "ungated")
    if mlflow.active_run() is not None:
        word = "FORCED" if prov["forced"] else ("SERVED" if prov["gated"] else "UNGATED")
        mlflow.set_tags({"registry.action": "fetch", "registry.model": name,
                         "registry.version": str(version), "registry.alias": str(cfg.alias or ""),
                         "registry.decision": "fetched",
                         "registry.gated": str(prov["gated"] and not prov["forced"]).lower(),
                         "registry.forced": str(prov["forced"]).lower(),
                         "registry.content_hash": manifest["content_hash"],
                         "mlflow.runName": f"{word} {fetch_name(name, cfg)} (v{version})"})
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


def fetch_name(name: str, cfg: DictConfig) -> str:
    """`fetch demand @champion` (the run name after its decision word)."""
    target = f"@{cfg.alias}" if cfg.get("alias") else f"v{cfg.version}"
    return f"fetch {name.removeprefix('replaylab-')} {target}"


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
            rescore = rescore_against("demand", c, cfg, name, mv, folder, rows,
                                      f"ledger {cfg.ledger}",
                                      alias=alias)
        if rescore is not None and "error" in rescore:
            raise ManifestError("champion", rescore["error"])
        mv = c.get_model_version(name, str(cfg.version))  # with the scores' tags
    reports = compare_versions(c, cfg, name, mv, champion, run_dir, rescore=rescore)
    return {"pipeline": "export", "action": "compare", "reports": reports, "artifacts": {},
            "compare": {"name": name, "challenger": int(mv.version),
                        "champion": int(champion.version),
                        "rescore": None if rescore is None else rescore.get("comparison")}}
