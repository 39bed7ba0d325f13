"""What a registered version says: its tags (all read off its verified manifest),
its MLflow model signature and its one-sentence description.

The tags carry what a reviewer and the promotion gate read: the manifest's
content hash, the data fingerprint, the projection version, the headline
metrics, the go/no-go verdict, the test window. Every tag this package writes
starts with `TAG`.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from replaylab.artifacts.kinds import KINDS as ARTIFACT_KINDS
from replaylab.contracts.manifest import canonical_json
from replaylab.verdict import GO, NO_GO, VERDICTS

KINDS = tuple(ARTIFACT_KINDS)  # ("demand", "router"): one registered model each
ARTIFACT_PATH = {k: d.artifact_path for k, d in ARTIFACT_KINDS.items()}  # in the run
TAG = "replaylab."  # prefix of every tag this package writes
TAG_MAX = 4000  # model version tag values: MLflow keeps 5000 characters


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


def verdict_word(manifest: dict) -> str:
    """The verdict word of a version (GO, NO-GO, NOT ENOUGH EVIDENCE: `replaylab.verdict`),
    read off its verified manifest: `training.verdict` or `training.gate.verdict` when the
    run recorded one, else GO / NO-GO from its boolean go. Any word but GO is refused at
    promotion like NO-GO."""
    t = manifest.get("training") or {}
    gate = t.get("gate") if isinstance(t.get("gate"), dict) else {}
    said = t.get("verdict") or gate.get("verdict")
    if isinstance(said, str) and said in VERDICTS:
        return said
    go = demand_gate(manifest)[0] if manifest.get("kind") == "demand" else t.get("go") is True
    return GO if go else NO_GO


# Words that mark a gate reason as a failing check (the gates write their reasons as
# sentences, `replaylab.demand.gate`, `replaylab.pipelines.router`; no pass flag travels
# with each): a plain substring test, so failing reasons can be listed first.
FAILING_WORDS = (" outside ", "does not ", "too few", "no baseline", "cannot", "fail",
                 "not shown", "not met", "exceeds", "no gate recorded")


def reasons_failing_first(reasons: list[str]) -> list[str]:
    """The gate's reasons, those naming a failed check first (each group in its order)."""
    bad = [r for r in reasons if any(w in f" {r.lower()} " for w in FAILING_WORDS)]
    return bad + [r for r in reasons if r not in bad]


def gate_reasons(manifest: dict) -> list[str]:
    """Every reason the version's own gate gave, from its verified manifest."""
    t = manifest.get("training") or {}
    if manifest.get("kind") == "demand":
        gate = t.get("gate")
        if not isinstance(gate, dict) or "go" not in gate:
            return [NO_GATE]
        return [str(r) for r in gate.get("reasons") or []]
    return [str(r) for r in t.get("go_reasons") or []]


def version_tags(manifest: dict, reg: Any) -> dict[str, str]:
    """The tags of a registered version, all from its verified manifest. `go` is true only
    for the verdict GO (`verdict_word`)."""
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
    verdict = verdict_word(manifest)
    tags.update(verdict=verdict, go=str(tags["go"] == "true" and verdict == GO).lower())
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



def version_description(manifest: dict, tags: dict[str, str], run_info: Any,
                        details: str | None = None) -> str:
    """The version page's text: the verdict first, then every reason of the gate (failing
    ones first), what the version is and where it came from; `details`: where the JSON of
    everything else about it is (an artifact of the registering run)."""
    verdict = tags.get(TAG + "verdict") or ("GO" if tags.get(TAG + "go") == "true" else "NO-GO")
    reasons = reasons_failing_first(gate_reasons(manifest))
    lines = [f"**{verdict}**: {manifest['kind']} artifact {manifest['version']} "
             f"({manifest['content_hash'][:19]}) from run "
             f"{run_info.run_name or run_info.run_id}, created "
             f"{manifest.get('created_at', '?')[:10]}."]
    lines += [f"- {r[:600]}" for r in reasons] or ["- (no reasons recorded)"]
    if details:
        lines.append(f"\nEverything else about this version: {details}")
    return "\n".join(lines)
