"""A champion scored on a challenger's own test rows, one driver for every kind.

`rescore_against(kind, ...)` finds the version the alias points at (default
`export.registry.rescore_alias`), downloads and verifies it, and hands both
folders to the kind's library scorer (`replaylab.artifacts.kinds`: demand,
`replaylab.artifacts.rescore_demand`; router, `replaylab.artifacts.rescore_router`),
with the same code for both sides; the scores are recorded on the challenger
version (tags `replaylab.vs.v<champion>.*`: the gate reads them), as metrics and
a JSON file of the open run. The rows: demand, the run folder's test rows
(`run_test_rows`) or a ledger's (`challenger_ledger_rows`); router, the test
prompts rebuilt from the run's outcomes table and config (`router_test_rows`).
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from replaylab.apps.provenance import hmac_key
from replaylab.apps.registry.tags import TAG, TAG_MAX
from replaylab.apps.registry.versions import alias_version, verified_version
from replaylab.artifacts.kinds import ArtifactKind, artifact_kind
from replaylab.config import ConfigError


def vs_prefix(champion_version: int | str) -> str:
    """Tag prefix of the scores of a version against champion version N (`replaylab.vs.vN.`)."""
    return f"{TAG}vs.v{champion_version}."


def rescore_json(name: str, version: int | str, champion_version: int | str) -> str:
    return f"rescore/{name}-v{version}-vs-v{champion_version}.json"


def rescore_against(kind: str | ArtifactKind, c: Any, cfg: DictConfig, name: str, mv: Any,
                    folder: Path, rows: Any | Callable[[], tuple[Any, str]],
                    source: str | None = None, alias: str | None = None) -> dict | None:
    """Score the version `alias` points at (default `export.registry.rescore_alias`) and
    the challenger `mv` (its verified folder) on the challenger's test `rows`, with the
    kind's scorer; record the scores on `mv` (tags `replaylab.vs.v<champion>.*`), as
    metrics and a JSON file of the open run. `rows` may be a callable returning (rows,
    source), called only when there is a champion to score. None: no other champion.
    A champion that does not verify, load or score is recorded as an error."""
    import mlflow

    k = artifact_kind(kind) if isinstance(kind, str) else kind
    alias = alias or cfg.export.registry.get("rescore_alias")
    champion = alias_version(c, name, str(alias)) if alias else None
    if champion is None or str(champion.version) == str(mv.version) or \
            champion.tags.get(TAG + "content_hash") == mv.tags.get(TAG + "content_hash"):
        return None  # no other champion, or the very same artifact
    if callable(rows):
        rows, source = rows()
    prefix = vs_prefix(champion.version)
    doc: dict[str, Any] = {
        "kind": k.name,
        "challenger": {"name": name, "version": int(mv.version),
                       "content_hash": mv.tags.get(TAG + "content_hash")},
        "champion": {"version": int(champion.version), "alias": str(alias),
                     "content_hash": champion.tags.get(TAG + "content_hash")},
        "rows_source": source, **k.count_rows(rows)}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            _, cm, champion_folder = verified_version(c, cfg, name, champion.version, Path(tmp))
            got = k.rescore(Path(folder), champion_folder, cm, rows,
                            hmac_key(cfg.export.get("hmac_key_env")))
    except k.rescore_errors() as e:
        doc["error"] = f"champion v{champion.version} not scored: {e}"
        c.set_model_version_tag(name, mv.version, prefix + "error", doc["error"][:TAG_MAX])
        return doc
    doc.update(got["doc"])
    run = mlflow.active_run()
    tags = {"champion_content_hash": str(doc["champion"]["content_hash"]),
            "rows_source": str(source), **got["tags"],
            "scored_in_run": run.info.run_id if run is not None else "",
            "scores_json": rescore_json(name, mv.version, champion.version)}
    metrics = {f"rescore.vs_v{champion.version}.{m}": v for m, v in got["metrics"].items()}
    record_rescore(c, name, mv, prefix, tags, doc, metrics)
    return doc


def record_rescore(c: Any, name: str, mv: Any, prefix: str, tags: dict[str, str], doc: dict,
                   metrics: dict[str, Any]) -> None:
    """Tags on the version, the full document and metrics in the open run."""
    import mlflow

    for k, v in tags.items():
        c.set_model_version_tag(name, mv.version, prefix + k, str(v)[:TAG_MAX])
    if mlflow.active_run() is not None:
        mlflow.log_text(json.dumps(doc, indent=1, default=str), tags["scores_json"])
        mlflow.log_metrics({k: v for k, v in metrics.items()
                            if isinstance(v, int | float) and math.isfinite(v)})


def router_test_rows(cfg: DictConfig) -> tuple[Any, str]:
    """(RouterRows, source) of a router run: its test prompts rebuilt from its outcomes
    table and config (`replaylab.pipelines.router.test_prompts`, the split it scored)."""
    from replaylab.apps.inputs import load_outcomes, plain
    from replaylab.artifacts.rescore_router import RouterRows
    from replaylab.pipelines.router import test_prompts
    from replaylab.router.pipeline_config import router_config

    values = plain(cfg.router)
    values.pop("encoder", None)
    rcfg = router_config(values)
    outcomes, origin = load_outcomes(cfg)
    matrix, texts, meta = test_prompts(outcomes, rcfg)
    return RouterRows(matrix, texts, meta, rcfg.evaluation), f"outcomes {origin}"


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
    from replaylab.artifacts.rescore_demand import ledger_test_rows
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

