"""Export a trained router as one verifiable folder: encoder + tokenizer + head + policy.

Layout (every file listed in the top-level `manifest.json`, kind `router`):

    head.onnx                  the MLP head (embedding, category, prompt_tokens -> success_prob, cost)
    head.safetensors           the same head's weights as named float32 tensors, for engines that
                               run its forward pass themselves (docs/specs/router-scorer.md)
    router.json                candidates (cheapest first), threshold, category vocabulary,
                               prompt-length rule, the scenario rules (the fallback)
    encoder/encoder.onnx       the MiniLM encoder the head was trained on (fp32; int8 too when
    encoder/encoder.int8.onnx  exported), its tokenizer and config, and the encoder's own
    encoder/tokenizer.json     manifest: `replaylab.runtime.encoder.load_encoder` verifies it
    encoder/encoder_config.json
    encoder/golden.json        the encoder's golden vectors (token ids, embeddings)
    encoder/manifest.json
    fit_prompts.json           hashes of the prompts it was fitted and calibrated on (a compare
                               counts another run's test prompts among them: leakage)
    golden.json                the router's golden vectors: queries with each published encoder
                               variant's expected P(success), decision and decision margin,
                               computed by `replaylab.runtime.Router` itself on the exporting
                               machine; `Router.load` re-checks them where it is served. The
                               MiniLM tier's fp32 entries also carry the query's embedding:
                               (text, embedding, decision) triples, on which a host that
                               embeds prompts itself proves its encoder
                               (docs/specs/router-scorer.md, "Routing on the host's embedding")

The static tier (`router.encoder.tier=static`) ships `encoder/` as the static
encoder folder instead (`replaylab.artifacts.static_export`: vocab.txt,
charmap.tsv, embeddings.safetensors, static_config.json, golden.json,
manifest.json); `router.json` `encoder.tier` says which, and the router golden
vectors then carry each query's token ids.

The encoder files are hard links to the cached encoder export when the file
system allows it (no 150 MB copy per run), else copies; either way the router
manifest pins their sha256, and `features[0]` records the encoder id and the
encoder manifest's content hash. Written in a temporary sibling folder and
renamed into place (atomic, as the demand export).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from replaylab import __version__
from replaylab.artifacts.router_head import head_tensors, head_to_onnx, manifest_sections
from replaylab.artifacts.static_export import safetensors_bytes
from replaylab.contracts.golden import golden_document, write_golden
from replaylab.contracts.manifest import (
    build_manifest,
    link_or_copy,
    staged_folder,
    verify_manifest,
    write_manifest,
)
from replaylab.jsonsafe import json_safe
from replaylab.runtime.router_head import HEAD_TENSORS_FILE

KIND = "router"
HEAD_FILE = "head.onnx"
CONFIG_FILE = "router.json"
# the prompts the router was fitted and calibrated on, as sorted 16-hex prefixes of the
# SHA-256 of their text (`replaylab.pipelines.router.prompt_hash`): a compare counts another
# run's test prompts among them (leakage) without the artifact holding any prompt text
FIT_PROMPTS_FILE = "fit_prompts.json"
ENCODER_DIR = "encoder"
# Router golden tolerances: P(success) may differ by the encoder's rounding on another CPU
# (fp32: float rounding; int8: its kernels, docs/results/int8-cpus.md). A decision must agree
# wherever its margin from the threshold exceeds the probability tolerance.
# The static tier's vectors are fixed float64 arithmetic; only the head's float32 kernels
# differ between engines and CPUs (onnxruntime vs a plain loop: ~1e-7).
GOLDEN_TOLERANCES = {"fp32_prob_abs": 1e-4, "int8_prob_abs": 0.02, "static_prob_abs": 1e-5,
                     "stable_decision_agreement": 1.0}
# A host's own all-MiniLM-L6-v2 embeddings of the golden texts (the MiniLM tier's triples),
# docs/specs/router-scorer.md "Routing on the host's embedding". fp32 of the same model on
# another runtime or CPU is within float rounding: ONNX vs sentence-transformers (torch)
# cosine 1.0000 on 200 prompts, the export gate 0.9999 (docs/results/int8-cpus.md); the
# int8 encoder, a different space the head was not trained on, is 0.9858-0.9937 to fp32 on
# prompts (0.968 on edge cases) with max |difference| 0.013-0.046 between CPUs: refused by
# both bounds with a margin of ~10x in 1 - cosine. host_prob_abs: the P(success) moves that
# a decision must survive to count as stable (the int8 tolerance; int8 across CPUs moved P
# by at most 0.0047, docs/results/router-cpus.json).
HOST_TOLERANCES = {"host_min_cosine": 0.999, "host_max_abs": 0.01, "host_prob_abs": 0.02}
TRIPLE_VARIANT = "fp32"  # the variant whose embeddings the triples carry
TIERS = ("minilm", "static")


def router_config_json(run: Any, tier: str = "minilm") -> dict:
    """What the runtime needs besides the graphs (plain JSON)."""
    head, rules = run.head, run.rules
    m = run.config
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
        "encoder": {"tier": tier, "dir": ENCODER_DIR},
    }


def export_router(run: Any, encoder_dir: str | Path, out_dir: str | Path, *,
                  version: str = "1.0.0", valid_days: float = 30.0,
                  hmac_key: bytes | None = None, created: datetime | None = None,
                  training: dict | None = None,
                  built_on: Mapping[str, Any] | None = None) -> Path:
    """Write the router artifact of `run` (a RouterRun) to `out_dir`; returns it.

    encoder_dir: the verified encoder export the head was trained with. built_on: what
    golden.json records about the exporting machine (None: this one,
    `golden.this_machine()`; a committed fixture passes `golden.ANY_MACHINE`, so that its
    bytes are the same on any CPU).
    """
    from replaylab.runtime.static_encoder import VARIANT as STATIC
    from replaylab.runtime.static_encoder import is_static_folder

    encoder_dir, out_dir = Path(encoder_dir), Path(out_dir)
    enc_manifest = verify_manifest(encoder_dir, required_kind="encoder")
    tier = "static" if is_static_folder(encoder_dir) else "minilm"
    head = run.head
    outputs = enc_manifest.get("outputs", {})
    sections = manifest_sections(head, run.candidates, outputs.get("encoder_ids", {}).get(
        STATIC) if tier == "static" else outputs.get(
        "model_id", "sentence-transformers/all-MiniLM-L6-v2"), run.threshold)
    sections["features"][0].update(encoder_dir=ENCODER_DIR,
                                   encoder_content_hash=enc_manifest["content_hash"])
    sections["features"][0]["tier"] = tier
    sections["runtime"].update(packages={"numpy": ">=2.0", "onnxruntime": ">=1.18",
                                         **({"tokenizers": ">=0.19"} if tier == "minilm" else {})},
                               loader="replaylab.runtime.Router", head_file=HEAD_FILE,
                               head_tensors=HEAD_TENSORS_FILE, spec="docs/specs/router-scorer.md")
    sections["fallback"] = {
        "trusted_artifact": "the scenario rules in router.json (task -> candidate, long prompts)",
        "untrusted_artifact": "the caller's fallback candidate (default: the strongest)",
        "candidate": list(run.candidates)[run.fallback]}
    summary = run.summary or {}
    facts = {"head": head.report(), "replaylab_version": __version__,
             "test": {k: {m: v.get(m) for m in ("quality", "cost", "cost_ratio_at_95")}
                      for k, v in summary.get("test", {}).items()},
             "go": summary.get("go"), "go_reasons": summary.get("go_reasons"),
             # GO / NO-GO / NOT ENOUGH EVIDENCE (replaylab.verdict); the registry tags it
             "verdict": summary.get("verdict"), "objective": summary.get("objective"),
             # router.json's threshold; the gate judged exactly this operating point
             "served_threshold": float(run.threshold),
             "gated_threshold": (summary.get("go_detail") or {}).get("threshold"),
             "prompts": summary.get("prompts"), "exploration": {
                 k: summary.get("exploration", {}).get(k)
                 for k in ("rate", "cap", "sessions", "explored_sessions")},
             **(training or {})}
    # the graph training's decisions were made with, when it served the graph itself
    served = None if run.deployed is None else run.deployed.served_
    model = served.model if served is not None and served.model is not None else head_to_onnx(head)
    with staged_folder(out_dir) as tmp:
        (tmp / HEAD_FILE).write_bytes(model)
        (tmp / HEAD_TENSORS_FILE).write_bytes(safetensors_bytes(head_tensors(head)))
        (tmp / CONFIG_FILE).write_text(json.dumps(router_config_json(run, tier), indent=1,
                                                  sort_keys=True) + "\n")
        fit = getattr(run, "fit_prompts", None) or {}
        if fit:
            (tmp / FIT_PROMPTS_FILE).write_text(json.dumps(
                {"hash": "sha256(utf-8 prompt text)[:16 hex]",
                 **{k: sorted(v) for k, v in fit.items()}}, sort_keys=True) + "\n")
        for entry in enc_manifest["files"]:
            link_or_copy(encoder_dir / entry["path"], tmp / ENCODER_DIR / entry["path"])
        link_or_copy(encoder_dir / "manifest.json", tmp / ENCODER_DIR / "manifest.json")

        def publish() -> dict:
            manifest = build_manifest(tmp, kind=KIND, version=version, valid_days=valid_days,
                                      created=created, contracts={"outcomes": "1", "ledger": "1"},
                                      training=json_safe(facts), **sections)
            write_manifest(tmp, manifest, hmac_key=hmac_key)
            return manifest

        publish()  # so the runtime can load the staged folder and compute the golden vectors
        if run.golden_inputs:
            write_golden(tmp, router_golden(tmp, run.golden_inputs, hmac_key=hmac_key,
                                            now=created, built_on=built_on))
            publish()
    return out_dir


def router_golden(folder: Path, inputs: list[dict], *, hmac_key: bytes | None = None,
                  now: datetime | None = None,
                  built_on: Mapping[str, Any] | None = None) -> dict:
    """golden.json of a router folder: `inputs` (text, category, prompt_tokens) routed by
    `replaylab.runtime.Router` with every encoder variant the folder ships."""
    from replaylab.runtime.encoder import CONFIG_FILE as ENCODER_CONFIG
    from replaylab.runtime.router import Router
    from replaylab.runtime.routing import decision_margin
    from replaylab.runtime.static_encoder import VARIANT as STATIC
    from replaylab.runtime.static_encoder import is_static_folder

    static = is_static_folder(folder / ENCODER_DIR)
    variants = [STATIC] if static else sorted(json.loads(
        (folder / ENCODER_DIR / ENCODER_CONFIG).read_text())["variants"])
    texts = [str(i["text"]) for i in inputs]
    cats = [i.get("category") for i in inputs]
    tokens = [i.get("prompt_tokens") for i in inputs]
    expected: list[dict] = [{} for _ in inputs]
    clock = None if now is None else now.timestamp
    for v in variants:
        router = Router.load(folder, variant=v, hmac_key=hmac_key, check_golden=False,
                             **({"clock": clock} if clock else {}))
        if not router.loaded:
            raise RuntimeError(f"the staged router folder does not load ({v}): {router.reason}")
        triples = not static and v == TRIPLE_VARIANT
        got = [router.route(t, c, p, keep_embedding=triples)
               for t, c, p in zip(texts, cats, tokens, strict=True)]
        prob = np.array([[d.scores[c] for c in router.candidates] for d in got])
        margin = decision_margin(prob, router.threshold, fallback=router.fallback,
                                 rule=router.rule)
        # the static tier's token ids too: an engine checks its tokenizer on them
        ids = (router.encoder.token_ids(texts) if static else [None] * len(texts))
        for e, d, mg, tok in zip(expected, got, margin, ids, strict=True):
            e[v] = {"success_prob": [d.scores[c] for c in router.candidates],
                    "candidate": d.candidate, "margin": float(mg),
                    **({"token_ids": tok} if static else {}),
                    **({"embedding": [float(x) for x in d.embedding]} if triples else {})}
    cases = [{"input": {"text": t, "category": c, "prompt_tokens": p}, "expected": e}
             for t, c, p, e in zip(texts, cats, tokens, expected, strict=True)]
    tolerances = GOLDEN_TOLERANCES if static else {**GOLDEN_TOLERANCES, **HOST_TOLERANCES}
    return golden_document(KIND, cases, tolerances, built_on=built_on)
