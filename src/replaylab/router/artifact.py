"""Export a trained router as one verifiable folder: encoder + tokenizer + head + policy.

Layout (every file listed in the top-level `manifest.json`, kind `router`):

    head.onnx                  the MLP head (embedding, category, prompt_tokens -> success_prob, cost)
    router.json                candidates (cheapest first), threshold, category vocabulary,
                               prompt-length rule, the scenario rules (the fallback)
    encoder/encoder.onnx       the MiniLM encoder the head was trained on (fp32; int8 too when
    encoder/encoder.int8.onnx  exported), its tokenizer and config, and the encoder's own
    encoder/tokenizer.json     manifest: `replaylab.runtime.encoder.load_encoder` verifies it
    encoder/encoder_config.json
    encoder/manifest.json

The encoder files are hard links to the cached encoder export when the file
system allows it (no 150 MB copy per run), else copies; either way the router
manifest pins their sha256, and `features[0]` records the encoder id and the
encoder manifest's content hash. Written in a temporary sibling folder and
renamed into place (atomic, as the demand export).
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

from replaylab import __version__
from replaylab.artifacts.manifest import (
    build_manifest,
    staged_folder,
    verify_manifest,
    write_manifest,
)
from replaylab.jsonsafe import json_safe
from replaylab.router.head_onnx import head_to_onnx, manifest_sections

KIND = "router"
HEAD_FILE = "head.onnx"
CONFIG_FILE = "router.json"
ENCODER_DIR = "encoder"


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def router_config_json(run: Any) -> dict:
    """What the runtime needs besides the graphs (plain JSON)."""
    head, rules = run.head, run.rules
    m = run.config.labels
    rule = run.rule
    fallback = list(run.candidates)[run.fallback]
    return {
        "format": 1, "candidates": list(run.candidates), "threshold": float(run.threshold),
        "rule": rule, "fallback_candidate": fallback,
        "policy": ("cheapest candidate whose success_prob minus the best other candidate's "
                   ">= threshold, else fallback_candidate" if rule == "margin" else
                   "cheapest candidate whose success_prob >= threshold, else fallback_candidate"),
        "category_vocabulary": list(head.encoder_.vocabulary_),
        "prompt_tokens": {"when_missing": "ceil(len(text) / chars_per_token)",
                          "chars_per_token": float(m.rules.chars_per_token)},
        "rules": rules.describe(),
    }


def export_router(run: Any, encoder_dir: str | Path, out_dir: str | Path, *,
                  version: str = "1.0.0", valid_days: float = 30.0,
                  hmac_key: bytes | None = None, created: datetime | None = None,
                  training: dict | None = None) -> Path:
    """Write the router artifact of `run` (a RouterRun) to `out_dir`; returns it.

    encoder_dir: the verified encoder export the head was trained with.
    """
    encoder_dir, out_dir = Path(encoder_dir), Path(out_dir)
    enc_manifest = verify_manifest(encoder_dir, required_kind="encoder")
    head = run.head
    sections = manifest_sections(head, run.candidates, enc_manifest.get("outputs", {}).get(
        "model_id", "sentence-transformers/all-MiniLM-L6-v2"), run.threshold)
    sections["features"][0].update(encoder_dir=ENCODER_DIR,
                                   encoder_content_hash=enc_manifest["content_hash"])
    sections["runtime"].update(packages={"numpy": ">=2.0", "onnxruntime": ">=1.18",
                                         "tokenizers": ">=0.19"},
                               loader="replaylab.runtime.Router", head_file=HEAD_FILE)
    sections["fallback"] = {
        "trusted_artifact": "the scenario rules in router.json (task -> candidate, long prompts)",
        "untrusted_artifact": "the caller's fallback candidate (default: the strongest)",
        "candidate": list(run.candidates)[run.fallback]}
    summary = run.summary or {}
    facts = {"head": head.report(), "replaylab_version": __version__,
             "test": {k: {m: v.get(m) for m in ("quality", "cost", "cost_ratio_at_95")}
                      for k, v in summary.get("test", {}).items()},
             "go": summary.get("go"), "go_reasons": summary.get("go_reasons"),
             "prompts": summary.get("prompts"), "exploration": {
                 k: summary.get("exploration", {}).get(k)
                 for k in ("rate", "cap", "sessions", "explored_sessions")},
             **(training or {})}
    with staged_folder(out_dir) as tmp:
        (tmp / HEAD_FILE).write_bytes(head_to_onnx(head))
        (tmp / CONFIG_FILE).write_text(json.dumps(router_config_json(run), indent=1,
                                                  sort_keys=True) + "\n")
        for entry in enc_manifest["files"]:
            _link_or_copy(encoder_dir / entry["path"], tmp / ENCODER_DIR / entry["path"])
        _link_or_copy(encoder_dir / "manifest.json", tmp / ENCODER_DIR / "manifest.json")
        manifest = build_manifest(tmp, kind=KIND, version=version, valid_days=valid_days,
                                  created=created, contracts={"outcomes": "1", "ledger": "1"},
                                  training=json_safe(facts), **sections)
        write_manifest(tmp, manifest, hmac_key=hmac_key)
    return out_dir

