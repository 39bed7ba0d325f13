"""`python -m export [export|register|promote|fetch|compare] ...`: re-export a finished run's
artifact (demand or router, `replaylab.artifacts.kinds`), or work the MLflow Model Registry
(`replaylab.apps.registry`, docs/howto/mlflow.md)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from omegaconf import DictConfig

from replaylab.apps.demand_runs import RUN_STATE, export_run, load_run_state
from replaylab.apps.provenance import hmac_key
from replaylab.apps.recording import active_run_id
from replaylab.config import ConfigError
from replaylab.contracts.errors import InputError


def fetch_run(cfg: DictConfig, run_id: str, into: Path) -> Path:
    """The demand_run/ folder and summary.json artifacts of MLflow run `run_id`, under `into`.

    Only downloaded here: `load_run_state` verifies the folder (plain files whose
    SHA-256 match its index, no pickle) before reading any of it.
    """
    import mlflow

    mlflow.set_tracking_uri(cfg.tracking.uri)
    try:
        mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=RUN_STATE,
                                            dst_path=str(into))
        mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="summary.json",
                                            dst_path=str(into))
    except Exception as e:  # MlflowException, OSError: an unknown run or missing artifacts
        raise FileNotFoundError(f"run_id={run_id}: cannot fetch {RUN_STATE}/ and summary.json "
                                f"from {cfg.tracking.uri}: {e}") from None
    return into


def fetch_artifact(cfg: DictConfig, run_id: str, kind: str, into: Path) -> Path:
    """The artifact folder of `kind` that MLflow run `run_id` logged (its large files put
    back from the store); verified by the caller."""
    import mlflow

    from replaylab.apps.registry import reassemble
    from replaylab.artifacts.kinds import artifact_kind

    path = artifact_kind(kind).artifact_path
    mlflow.set_tracking_uri(cfg.tracking.uri)
    try:
        folder = Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path,
                                                          dst_path=str(into)))
    except Exception as e:  # MlflowException, OSError: an unknown run or missing artifacts
        raise FileNotFoundError(f"run_id={run_id}: cannot fetch {path}/ from "
                                f"{cfg.tracking.uri}: {e}") from None
    reassemble(folder, cfg)
    return folder


def run_id_kind(cfg: DictConfig, run_id: str) -> str:
    """The artifact kind MLflow run `run_id` exported: its pipeline (tag `pipeline`, or
    `source_pipeline` of a run that logged a finished run again; else param `pipeline`),
    else the one artifact folder it logged."""
    from mlflow.tracking import MlflowClient

    from replaylab.artifacts.kinds import KINDS

    c = MlflowClient(tracking_uri=str(cfg.tracking.uri))
    try:
        run = c.get_run(run_id)
    except Exception as e:  # MlflowException: an unknown run
        raise FileNotFoundError(f"run_id={run_id}: no such run in {cfg.tracking.uri} "
                                f"({str(e).splitlines()[0][:200]})") from None
    tags, params = run.data.tags, run.data.params
    for said in (tags.get("source_pipeline"), tags.get("pipeline"), params.get("pipeline")):
        if said in KINDS:
            return str(said)
    logged = {f.path for f in c.list_artifacts(run_id)}
    # a fitted demand run (demand_run/) re-exports from its state; else its logged folder
    found = ["demand"] if RUN_STATE in logged else [
        k for k, d in KINDS.items() if d.artifact_path in logged]
    if len(found) == 1:
        return found[0]
    raise ConfigError(f"run_id={run_id} is a pipeline={tags.get('pipeline')!r} run with "
                      f"{'no' if not found else 'more than one'} artifact folder of "
                      f"{sorted(KINDS)}: nothing to re-export")


def export_router_folder(cfg: DictConfig, folder: Path, out: Path) -> dict:
    """The router artifact a run logged, published again as `out` with this export's
    version, validity and signature (`replaylab.artifacts.kinds.republish`: the same
    files, so the same content hash); the summary's `export` section."""
    from replaylab.artifacts.kinds import republish

    if not (folder / "manifest.json").is_file():
        raise FileNotFoundError(f"{folder}: no router artifact here (no manifest.json)")
    key = hmac_key(cfg.export.get("hmac_key_env"))
    m = republish(folder, out, version=str(cfg.export.version),
                  valid_days=float(cfg.export.valid_days), hmac_key=key, verify_key=key)
    if m["kind"] != "router":
        raise ConfigError(f"{folder}: a {m['kind']!r} artifact, not the router's")
    return {"path": str(out), "kind": "router", "version": m["version"],
            "content_hash": m["content_hash"], "created_at": m["created_at"],
            "valid_until": m["valid_until"], "signed": key is not None,
            "files": {e["path"]: e["size"] for e in m["files"]}}


def export_run_artifact(cfg: DictConfig, run_dir: Path) -> dict:
    """The job of `python -m export`: the artifact of `cfg.run_dir` or `cfg.run_id`, of the
    kind its run exported (`replaylab.artifacts.kinds`): demand, exported again from the
    fitted run's state (demand_run/, `export_demand_run`); router, the folder the run
    wrote or logged, published again (`export_router_run`: the fitted router is not kept,
    its folder is the run's export)."""
    if bool(cfg.run_dir) == bool(cfg.run_id):
        raise ConfigError("give exactly one of run_dir=DIR or run_id=<mlflow run id>")
    if cfg.run_dir:
        summary_path = Path(cfg.run_dir) / "summary.json"
        if not summary_path.is_file():
            raise FileNotFoundError(f"{summary_path}: not a finished run (no summary.json)")
        kind = str(json.loads(summary_path.read_text()).get("pipeline"))
    else:
        kind = run_id_kind(cfg, str(cfg.run_id))
    return (export_router_run if kind == "router" else export_demand_run)(cfg, run_dir)


def export_router_run(cfg: DictConfig, run_dir: Path) -> dict:
    """A router run's artifact published again (`export_router_folder`): from
    `cfg.run_dir`/artifacts/router, or the router_artifact/ run `cfg.run_id` logged."""
    with tempfile.TemporaryDirectory() as tmp:
        if cfg.run_dir:
            folder = Path(cfg.run_dir) / "artifacts" / "router"
            out = Path(cfg.out) if cfg.out else folder
        else:
            folder = fetch_artifact(cfg, str(cfg.run_id), "router", Path(tmp) / "logged")
            out = Path(cfg.out) if cfg.out else Path("outputs/export") / str(cfg.run_id) / "router"
        section = export_router_folder(cfg, folder, out)
    return {"pipeline": "export", "source": str(cfg.run_dir or cfg.run_id),
            "export": section, "artifacts": {"router": section["path"]},
            "exported_in_run": active_run_id()}


def export_demand_run(cfg: DictConfig, run_dir: Path) -> dict:
    """A demand run's artifact exported again from its fitted state (demand_run/) of
    `cfg.run_dir` or `cfg.run_id`."""
    if bool(cfg.run_dir) == bool(cfg.run_id):
        raise ConfigError("give exactly one of run_dir=DIR or run_id=<mlflow run id>")
    with tempfile.TemporaryDirectory() as tmp:
        if cfg.run_dir:
            source = Path(cfg.run_dir)
            out = Path(cfg.out) if cfg.out else source / "artifacts" / "demand"
        else:
            source = fetch_run(cfg, str(cfg.run_id), Path(tmp))
            out = Path(cfg.out) if cfg.out else Path("outputs/export") / str(cfg.run_id) / "demand"
        summary_path = source / "summary.json"
        if not summary_path.is_file():
            raise FileNotFoundError(f"{summary_path}: not a finished run (no summary.json)")
        trained = json.loads(summary_path.read_text())
        if trained.get("pipeline") != "demand":
            raise ConfigError(f"{source} is a pipeline={trained.get('pipeline')!r} run; "
                              "only demand and router runs export an artifact")
        run = load_run_state(source / RUN_STATE)
        source_run_id = (trained.get("mlflow") or {}).get("run_id") or cfg.run_id
        section = export_run(run, trained, out, cfg.export, source_run_id)
    return {"pipeline": "export", "source": str(cfg.run_dir or cfg.run_id),
            "export": section, "artifacts": {"demand": section["path"]},
            "exported_in_run": active_run_id()}


# what each action needs on the command line (checked before any MLflow run is opened)
REQUIRED = {"register": ("run_dir",), "promote": ("name", "version", "alias"),
            "fetch": ("name", "out"), "compare": ("name", "version")}


def check_request(cfg: DictConfig) -> None:
    """The request's own errors, before an MLflow run is opened (so a typo leaves no FAILED
    run behind): an unknown action, missing keys, an unknown model, version or alias."""
    actions = ("export", *REQUIRED)
    if cfg.action not in actions:
        raise ConfigError(f"action={cfg.action!r} is unknown; choose one of {sorted(actions)}")
    missing = [k for k in REQUIRED.get(str(cfg.action), ()) if not cfg.get(k)]
    if cfg.action == "fetch" and not (cfg.get("alias") or cfg.get("version")):
        missing.append("alias (or version)")
    if missing:
        raise ConfigError(f"{cfg.action} needs {', '.join(f'{k}=...' for k in missing)} "
                          "(python -m export --help; docs/howto/mlflow.md)")
    if cfg.action == "export":
        if cfg.get("run_dir") and cfg.get("run_id"):
            raise ConfigError("give exactly one of run_dir=DIR or run_id=<mlflow run id>")
        if cfg.get("run_dir"):
            check_run_dir(cfg)
            check_run_state(Path(str(cfg.run_dir)))
        return
    if not cfg.tracking.enabled:
        raise ConfigError(f"{cfg.action} needs MLflow: tracking.enabled=true and tracking.uri")
    if cfg.action == "register":
        check_run_dir(cfg)
    if cfg.action == "promote":
        check_promote(cfg)
    if cfg.get("name"):
        check_registered(cfg)


def check_run_dir(cfg: DictConfig) -> None:
    """FileNotFoundError (one line) for a run_dir that is not a finished run folder; for
    `register`, ConfigError for a run trained on a ledger whose last line was cut (its
    summary's `truncated`) unless export.allow_truncated=true."""
    path = Path(str(cfg.run_dir)) / "summary.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not a finished run (no summary.json)")
    if cfg.action == "register" and not (cfg.get("export") or {}).get("allow_truncated"):
        try:
            cut = json.loads(path.read_text()).get("truncated")
        except ValueError:
            raise ConfigError(f"{path}: not JSON") from None
        if cut:
            raise ConfigError(f"{cfg.run_dir} was trained on a truncated ledger ({cut[0]}); "
                              "not registered (export.allow_truncated=true registers it)")


def check_run_state(run_dir: Path) -> None:
    """A demand run's fitted state (demand_run/) verified before any MLflow run opens: a
    tampered one is one `error:` line and leaves no FAILED run (the job loads it again)."""
    try:
        pipeline = json.loads((run_dir / "summary.json").read_text()).get("pipeline")
    except ValueError:
        raise ConfigError(f"{run_dir}/summary.json: not JSON") from None
    if pipeline == "demand":
        load_run_state(run_dir / RUN_STATE)


def check_promote(cfg: DictConfig) -> None:
    """A forced promotion without a reason, or an alias outside `export.aliases` (a typo
    such as `champoin` would otherwise create an alias and skip the champion comparison)
    unless `export.new_alias=true`: ConfigError before any run opens."""
    if cfg.get("force") and not cfg.get("reason"):
        raise ConfigError("force=true needs reason='...' (it is logged)")
    export = cfg.get("export") or {}
    allowed = [str(a) for a in (export.get("aliases") or [])]
    if str(cfg.alias) not in allowed and not export.get("new_alias", False):
        raise ConfigError(f"alias={cfg.alias}: not one of the configured aliases "
                          f"({', '.join(allowed) or 'none'}; export.aliases); "
                          "export.new_alias=true creates it")


def check_registered(cfg: DictConfig) -> None:
    """ConfigError (one line, naming the store) for a model, version or alias it lacks."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    uri, name = str(cfg.tracking.uri), str(cfg.name)
    c = MlflowClient(tracking_uri=uri)
    try:
        c.get_registered_model(name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        known = sorted(m.name for m in c.search_registered_models(max_results=50))
        raise ConfigError(f"name={name}: no such registered model in {uri} (it has: "
                          f"{', '.join(known) or 'none'})") from None
    if cfg.get("version"):
        try:
            c.get_model_version(name, str(cfg.version))
        except MlflowException as e:
            if e.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                raise
            versions = sorted(int(v.version) for v in c.search_model_versions(f"name='{name}'"))
            raise ConfigError(f"{name} version={cfg.version}: no such version in {uri} (it has: "
                              f"{versions or 'none'})") from None
    if cfg.get("alias") and cfg.action in ("fetch", "compare"):
        try:
            c.get_model_version_by_alias(name, str(cfg.alias))
        except MlflowException as e:
            if e.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                raise
            aliases = sorted(c.get_registered_model(name).aliases or {})
            raise ConfigError(f"{name}@{cfg.alias}: no such alias in {uri} (it has: "
                              f"{', '.join(aliases) or 'none'})") from None


def relog_run(cfg: DictConfig, run_dir: Path) -> dict:
    """The job of `python -m export register run_dir=DIR`, the recovery command a run prints
    when the store was lost: log the finished run folder again in this run (its metrics,
    resolved config, summary and reports), register its artifact folders, and mark the
    original run FAILED (with a pointer here) when the store still shows it RUNNING."""
    import mlflow

    from replaylab.apps import registry
    from replaylab.apps.recording import log_reports, numeric_metrics
    from replaylab.apps.verdicts import stamp_reports

    source = Path(cfg.run_dir)
    path = source / "summary.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not a finished run (no summary.json)")
    original = json.loads(path.read_text())
    has_artifacts = any((source / "artifacts" / k / "manifest.json").is_file()
                        for k in registry.KINDS)
    out = (registry.registered_artifacts(cfg, run_dir) if has_artifacts else
           {"pipeline": "export", "action": "register", "source": str(source), "artifacts": {}})
    was = (original.get("mlflow") or {}).get("run_id")
    metrics = numeric_metrics({k: v for k, v in original.items() if k not in ("mlflow",
                                                                                "registry")})
    run = mlflow.active_run()
    mlflow.log_metrics(metrics)
    mlflow.log_text(json.dumps(original, indent=2, default=str), "source_run/summary.json")
    resolved = source / ".hydra" / "config.yaml"
    if resolved.is_file():
        mlflow.log_text(resolved.read_text(), "config/resolved.yaml")
    if run is not None:  # the reports' run facts link to this run, not the lost one
        stamp_reports({**original, "mlflow": {
            "run_id": run.info.run_id, "tracking_uri": cfg.tracking.uri,
            "experiment_id": run.info.experiment_id,
            "experiment": (original.get("mlflow") or {}).get("experiment")}})
    reports = log_reports(original)
    mlflow.set_tags({"source_pipeline": str(original.get("pipeline")),
                     "replaylab.recovered_from": str(was or "")})
    marked = None
    if was and run is not None and was != run.info.run_id:
        marked = mark_superseded(was, run.info.run_id)
    out.update(source_pipeline=original.get("pipeline"),
               source_verdict=original.get("verdict"),
               relogged={"metrics": len(metrics), "reports": reports,
                         "config": resolved.is_file(), "previous_run": was,
                         "previous_marked_failed": marked})
    return out


def mark_superseded(run_id: str, by: str) -> bool:
    """Mark a run the store still shows RUNNING as FAILED, tagged with the run that logged
    its outputs again; True when it was marked."""
    from mlflow.tracking import MlflowClient

    from replaylab.apps.recording import tracking_errors

    c = MlflowClient()
    try:
        if c.get_run(run_id).info.status != "RUNNING":
            return False
        c.set_tag(run_id, "replaylab.recovered_in", by)
        c.set_terminated(run_id, "FAILED")
    except tracking_errors():
        return False
    return True


def export_job(cfg: DictConfig, run_dir: Path) -> dict:
    """The job of `python -m export`: the one `cfg.action` names (`check_request` ran)."""
    from replaylab.apps import registry

    table = {"export": export_run_artifact, "register": relog_run,
             "promote": registry.promote, "fetch": registry.fetch, "compare": registry.compare}
    return table[cfg.action](cfg, run_dir)


def exit_code(summary: dict) -> int:
    """0, or 3 when the promotion gate refused to move the alias (the refusal is recorded)."""
    return 3 if (summary.get("promotion") or {}).get("decision") == "refused" else 0


def input_errors() -> tuple[type[BaseException], ...]:
    """A bad input or config (not a bug): one `error: ...` line and exit code 2. Every
    such error of the library is an `InputError` (a refused fetch, a manifest that does
    not verify, an unreadable run state...); the others are a missing file, a missing
    optional dependency and a config that fails its schema."""
    from omegaconf.errors import ValidationError as OmegaConfValidationError

    return (InputError, FileNotFoundError, ImportError, OmegaConfValidationError)
