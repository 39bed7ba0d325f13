"""The artifact kinds, each declared once: its exporter, its runtime loader, its scorer.

An artifact kind is what a manifest's `kind` names and what the registry keeps
one registered model for. Each `ArtifactKind` says, in one place:

- `export`: the library exporter that writes a verified folder from a fitted run
  (demand: `replaylab.artifacts.demand_export.export_demand`; router:
  `replaylab.artifacts.router_export.export_router`);
- `load`: the serving runtime's loader (`DemandPredictor` offline, `Router`),
  refusing a folder it would not serve with a `ManifestError`;
- `rescore`: the library scorer of a challenger folder against a champion folder
  on the challenger's own test rows (demand: `replaylab.artifacts.rescore_demand`, the
  pinball with a paired session-bootstrap interval; router:
  `replaylab.artifacts.rescore_router`, quality and cost with paired
  prompt-bootstrap intervals): {"doc", "tags", "metrics"}, what the registry
  records (`replaylab.apps.registry.rescore.rescore_against`);
- where a run logs the folder (`artifact_path`) and where a re-export starts
  (`reexport`: the fitted run's state, or the logged folder itself).

Everything heavy is imported when called: importing this module loads nothing
but the standard library.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ArtifactKind:
    """One artifact kind (module docstring)."""

    name: str  # the manifest's kind, the registry's key
    pipeline: str  # the training pipeline whose run writes it (artifacts/<name>/)
    artifact_path: str  # the folder's path among its run's MLflow artifacts
    reexport: str  # "run_state": re-exported from the fitted run; "artifact": the folder
    export: Callable[..., Path]
    load: Callable[..., Any]  # (folder, hmac_key=None, what=None) -> the loaded scorer
    rescore: Callable[..., dict]  # (challenger, champion, champion_manifest, rows, hmac_key)
    rescore_errors: Callable[[], tuple[type[Exception], ...]]  # "champion not scored"
    count_rows: Callable[[Any], dict]  # the rows' sizes for the scores document


# ---------------------------------------------------------------- demand
def export_demand(*args: Any, **kwargs: Any) -> Path:
    from replaylab.artifacts.demand_export import export_demand as export

    return export(*args, **kwargs)


def load_demand(folder: Path, hmac_key: bytes | None = None, what: str | None = None) -> Any:
    """The runtime's DemandPredictor of a verified folder (online recalibration off)."""
    from replaylab.contracts.manifest import ManifestError
    from replaylab.runtime import DemandPredictor

    p = DemandPredictor.load(folder, hmac_key=hmac_key, online=False)
    if not p.loaded:
        raise ManifestError(p.reason or "not_loaded", f"{folder}: the runtime refuses it")
    return p


def fit_overlap(manifest: dict, rows: Any) -> bool:
    """True when the time window a demand version was fitted and calibrated on overlaps
    the rows' dispatch times: its scores there may be optimistic (it may have seen them)."""
    from replaylab.contracts import Ledger as L

    window = (manifest.get("training") or {}).get("time_window") or {}
    t = rows.frame[L.TIMESTAMP].to_numpy(dtype="int64")  # epoch ms, as the pipeline records
    if not len(t):
        return False
    lo, hi = int(t.min()), int(t.max())
    return any(int(w["first_ms"]) <= hi and int(w["last_ms"]) >= lo
               for s, w in window.items() if s in ("train", "calibration") and w)


def _group_text(groups: list[dict]) -> str:
    return "; ".join(f"{g['by']}={g['value']}: {g['coverage']:.3f} (n={g['n']})"
                     for g in groups)


def rescore_demand(challenger: Path, champion: Path, champion_manifest: dict, rows: Any,
                   hmac_key: bytes | None = None) -> dict:
    """Both demand folders scored on the challenger's test rows with the same code
    (`replaylab.artifacts.rescore_demand`), and the paired interval of (challenger - champion)
    mean pinball the promotion gate reads. ManifestError / ArtifactError: not scored."""
    import math

    from replaylab.artifacts.rescore_demand import (
        compare_scores,
        paired_delta,
        predict_rows,
        score_artifact,
    )
    from replaylab.contracts.manifest import verify_manifest

    manifest = verify_manifest(challenger, hmac_key=hmac_key)
    groups = tuple((manifest.get("calibration") or {}).get("group_columns") or ())
    doc: dict[str, Any] = {"champion_fit_overlap": fit_overlap(champion_manifest, rows)}
    pa, pb = load_demand(challenger, hmac_key), load_demand(champion, hmac_key)
    ba, bb = predict_rows(pa, rows), predict_rows(pb, rows)
    doc["scores"] = {"challenger": score_artifact(pa, rows, groups, batch=ba),
                     "champion": score_artifact(pb, rows, groups, batch=bb)}
    delta = paired_delta(ba, bb, rows)
    cmp = doc["comparison"] = compare_scores(doc["scores"]["challenger"],
                                             doc["scores"]["champion"])
    # the gate's number: challenger - champion mean pinball, paired interval on these rows
    cmp["delta"] = delta
    cmp["challenger_better_ci"] = bool(math.isfinite(delta["ci"][1]) and delta["ci"][1] < 0)
    tags = {"rows": str(cmp["challenger"]["scored_rows"]),
            "same_rows": str(cmp["challenger"]["scored_rows"]
                             == cmp["champion"]["scored_rows"]).lower(),
            "levels": ",".join(cmp["levels"]),
            "challenger_better": str(cmp["challenger_better"]).lower(),
            "delta_mean_pinball": repr(float(delta["delta"])),
            "delta_ci": json.dumps(delta["ci"]),
            "delta_resampled": f"{delta['resampled']} ({delta['sessions']} sessions, "
                               f"{delta['n']} rows, {delta['n_boot']} draws, 95%)",
            "champion.coverage_by_group": _group_text(doc["scores"]["champion"]["groups"]),
            "champion_fit_overlap": str(doc["champion_fit_overlap"]).lower()}
    for role in ("challenger", "champion"):  # the rest: the JSON file and the run's metrics
        for k in ("mean_pinball", "coverage"):
            tags[f"{role}.{k}"] = repr(float(cmp[role][k]))
    metrics = {f"{role}.{k}": float(cmp[role][k]) for role in ("challenger", "champion")
               for k in ("mean_pinball", "coverage", "mean_width")}
    for g in doc["scores"]["champion"]["groups"]:
        key = "".join(ch if ch.isalnum() or ch in "_-." else "_"
                      for ch in f"{g['by']}.{g['value']}")
        metrics[f"champion.coverage.{key}"] = g["coverage"]
    return {"doc": doc, "tags": tags, "metrics": metrics}


def demand_errors() -> tuple[type[Exception], ...]:
    from replaylab.contracts.manifest import ManifestError
    from replaylab.runtime.demand import ArtifactError

    return (ManifestError, ArtifactError)


def demand_rows(rows: Any) -> dict:
    return {"rows": int(len(rows.y)), "labelled_rows": int(rows.usable.sum())}


# ---------------------------------------------------------------- router
def export_router(*args: Any, **kwargs: Any) -> Path:
    from replaylab.artifacts.router_export import export_router as export

    return export(*args, **kwargs)


def load_router(folder: Path, hmac_key: bytes | None = None, what: str | None = None) -> Any:
    from replaylab.artifacts.rescore_router import load_router as load

    return load(folder, hmac_key, what=what)


def rescore_router(challenger: Path, champion: Path, champion_manifest: dict, rows: Any,
                   hmac_key: bytes | None = None) -> dict:
    from replaylab.artifacts.rescore_router import rescore_pair

    return rescore_pair(challenger, champion, champion_manifest, rows, hmac_key)


def router_errors() -> tuple[type[Exception], ...]:
    from replaylab.artifacts.rescore_router import RouterRescoreError
    from replaylab.contracts.manifest import ManifestError

    return (ManifestError, RouterRescoreError)


def router_rows(rows: Any) -> dict:
    return rows.counts()


# ---------------------------------------------------------------- the declarations
DEMAND = ArtifactKind(name="demand", pipeline="demand", artifact_path="demand_artifact",
                      reexport="run_state", export=export_demand, load=load_demand,
                      rescore=rescore_demand, rescore_errors=demand_errors,
                      count_rows=demand_rows)
ROUTER = ArtifactKind(name="router", pipeline="router", artifact_path="router_artifact",
                      reexport="artifact", export=export_router, load=load_router,
                      rescore=rescore_router, rescore_errors=router_errors,
                      count_rows=router_rows)
KINDS: dict[str, ArtifactKind] = {k.name: k for k in (DEMAND, ROUTER)}


def artifact_kind(name: str) -> ArtifactKind:
    """The declaration of kind `name` (ValueError naming the kinds)."""
    try:
        return KINDS[str(name)]
    except KeyError:
        raise ValueError(f"artifact kind {name!r} is unknown (one of {sorted(KINDS)})") from None


# ---------------------------------------------------------------- a folder published again
def republish(folder: Path, out: Path, *, version: str, valid_days: float,
              hmac_key: bytes | None = None, verify_key: bytes | None = None,
              training: dict | None = None) -> dict:
    """A verified artifact folder published again as `out` (atomically): the same files
    and sections, so the same content hash, with a new version, validity period and
    signature (`training` entries added to its training section). The re-export of a
    kind whose fitted run is not kept (the router: its logged folder is the run's
    export). Returns the new manifest."""
    import shutil
    import tempfile

    from replaylab.contracts.manifest import (
        build_manifest,
        link_or_copy,
        staged_folder,
        verify_manifest,
        write_manifest,
    )

    folder, out = Path(folder), Path(out)
    old = verify_manifest(folder, hmac_key=verify_key)
    # a copy first when publishing over the source folder itself (staged_folder renames)
    with tempfile.TemporaryDirectory(dir=out.parent if out.parent.is_dir() else None) as tmp:
        if out.resolve() == folder.resolve():
            src = Path(tmp) / "src"
            shutil.copytree(folder, src, copy_function=link_or_copy)
        else:
            src = folder
        with staged_folder(out) as stage:
            for e in old["files"]:
                link_or_copy(src / e["path"], stage / e["path"])
            sections = {k: old[k] for k in ("features", "outputs", "calibration", "runtime",
                                            "fallback")}
            manifest = build_manifest(stage, kind=old["kind"], version=str(version),
                                      valid_days=float(valid_days), contracts=old["contracts"],
                                      training={**(old.get("training") or {}),
                                                **(training or {})}, **sections)
            if manifest["content_hash"] != old["content_hash"]:
                raise RuntimeError(f"{folder}: republished with another content hash")
            write_manifest(stage, manifest, hmac_key=hmac_key)
    return verify_manifest(out, hmac_key=hmac_key)
