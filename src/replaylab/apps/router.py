"""pipeline=router: read the outcomes, prepare the encoder (exported once, cached), train, report.

`router.encoder.tier` picks the encoder: `minilm` (below) or `static`, MiniLM
distilled by model2vec (`replaylab.router.static_encoder`), exported once into
`cache_dir/encoder-static` the same way.

The encoder is the ONNX export of MiniLM with its tokenizer
(`replaylab.router.encoder.export_encoder`), verified and loaded with the
serving runtime's loader, so training embeds exactly as serving will. It is
exported once into `router.encoder.cache_dir` and reused while it verifies;
embeddings are cached there by content hash.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from replaylab.apps.inputs import default_outcomes, load_outcomes, plain  # noqa: F401
from replaylab.apps.provenance import git_commit, hmac_key
from replaylab.apps.recording import active_run_id
from replaylab.config import ConfigError

log = logging.getLogger("replaylab")


def encoder_folder(enc: dict, parity_texts: list[str]) -> Path:
    """The cached, verified encoder export (exported here the first time).

    Reused while its fp32 variant verifies and passes its golden vectors on this
    CPU (an export without them is redone), and int8, when asked for, was tried
    with today's `INT8_SCHEME` (published or refused: a refusal is not retried on
    every run; an export with another scheme is redone)."""
    import json

    from replaylab.artifacts.manifest import ManifestError
    from replaylab.router.encoder import INT8_SCHEME, export_encoder, load_minilm
    from replaylab.runtime.encoder import load_encoder

    folder = Path(enc["cache_dir"]) / "encoder-minilm"
    try:
        if load_encoder(folder, variant="fp32").golden_status != "passed":
            raise ValueError("an export from before golden vectors: export again")
        tried = json.loads((folder / "manifest.json").read_text())["training"]["parity"][
            "variants"]
        if not bool(enc.get("int8", True)) or tried.get("int8", {}).get("scheme") == INT8_SCHEME:
            return folder  # int8 not asked for, or tried with today's scheme
    except (ManifestError, OSError, KeyError, ValueError):
        pass
    log.info("exporting MiniLM to ONNX into %s (once; reused while it verifies)", folder)
    export_encoder(load_minilm(), folder, parity_texts=parity_texts[:200],
                   int8=bool(enc.get("int8", True)), overwrite=True)
    return folder


TIERS = ("minilm", "static")


def encoder_tier(enc: dict) -> str:
    """`router.encoder.tier`, checked (ConfigError names the choices)."""
    tier = str(enc.get("tier", "minilm"))
    if tier not in TIERS:
        raise ConfigError(f"router.encoder.tier={tier!r}: choose one of {list(TIERS)}")
    return tier


def static_encoder_folder(enc: dict, parity_texts: list[str]) -> Path:
    """The cached static-tier export (model2vec distillation of the local MiniLM, exported
    here the first time, ~20 s); reused while it verifies and passes its golden vectors."""
    from replaylab.artifacts.manifest import ManifestError
    from replaylab.router.static_encoder import distill_minilm, export_static_encoder
    from replaylab.runtime.static_encoder import load_static_encoder

    folder = Path(enc["cache_dir"]) / "encoder-static"
    try:
        if load_static_encoder(folder).golden_status == "passed":
            return folder
    except (ManifestError, OSError, ValueError):
        pass
    log.info("distilling MiniLM with model2vec into %s (once; reused while it verifies)", folder)
    export_static_encoder(distill_minilm(), folder, parity_texts=parity_texts[:500],
                          overwrite=True)
    return folder


def serving_encoder(folder: Path, variant: str, threads: int) -> Any:
    """The encoder training embeds with: `variant`, or fp32 when that variant was not
    published (its gate) or misses its golden vectors here (the summary says which)."""
    from replaylab.runtime.encoder import EncoderArtifactError, load_encoder

    try:
        return load_encoder(folder, variant=variant, threads=threads)
    except EncoderArtifactError as exc:
        if exc.reason != "variant" or variant == "fp32":
            raise
    log.warning("router.encoder.variant=%s is not in the encoder export (its gate refused "
                "it on this CPU): training with fp32", variant)
    encoder = load_encoder(folder, variant="fp32", threads=threads)
    encoder.requested_variant, encoder.variant_reason = variant, "not_published"
    return encoder


def encoder_verdicts(folder: Path, encoder: Any) -> dict:
    """Which encoder variants were published and why not, and the golden check on this CPU."""
    import json

    manifest = json.loads((folder / "manifest.json").read_text())
    if getattr(encoder, "tier", "minilm") == "static":
        return {"parity": manifest.get("training", {}).get("parity"),
                "distillation": manifest.get("training", {}).get("distillation"),
                "golden": None if encoder.golden is None else encoder.golden.as_dict(),
                "golden_status": encoder.golden_status}
    parity = manifest.get("training", {}).get("parity", {}).get("variants", {})
    variants = {}
    for name, fig in parity.items():
        variants[name] = {"published": bool(fig.get("published", True)),
                          "reason": fig.get("reason"),
                          **{k: fig.get(k) for k in (
                              "mean_cosine_prompts", "min_cosine_prompts", "min_cosine_edge_cases",
                              "min_cosine", "gate_mean_cosine_prompts", "gate_min_cosine_prompts",
                              "gate_min_cosine_edge_cases", "gate_min_cosine", "cpu")
                             if k in fig}}
    return {"variants": variants,
            "int8": variants.get("int8", {"published": False, "reason": "router.encoder.int8=false"}),
            "golden": None if encoder.golden is None else encoder.golden.as_dict(),
            "golden_status": encoder.golden_status,
            "requested_variant": encoder.requested_variant, "variant_reason": encoder.variant_reason}


def router(cfg: DictConfig, run_dir: Path) -> dict:
    from replaylab.pipelines.router import train_router
    from replaylab.router.embed_cache import cached_embed
    from replaylab.router.pipeline_config import router_config

    values = plain(cfg.router)
    enc = values.pop("encoder")
    rcfg = router_config(values)
    outcomes, origin = load_outcomes(cfg)
    from replaylab.router.replay import outcome_matrix

    # fail fast, before the encoder export: a table the router cannot use is an input error
    outcome_matrix(outcomes, rcfg.labels.cost, candidates=rcfg.candidates)
    texts = outcomes["prompt_text"].dropna().astype(str).drop_duplicates().tolist()
    tier = encoder_tier(enc)
    if tier == "static":
        from replaylab.runtime.static_encoder import load_static_encoder

        folder = static_encoder_folder(enc, texts)
        encoder = load_static_encoder(folder)
    else:
        folder = encoder_folder(enc, texts)
        encoder = serving_encoder(folder, str(enc.get("variant", "fp32")),
                                  int(enc.get("threads", 1)))
    embed, cache = cached_embed(encoder, Path(enc["cache_dir"]) / "embeddings")
    summary, run = train_router(outcomes, rcfg, run_dir, embed, progress=log.info,
                                head_scorer="numpy" if tier == "static" else "onnx")
    summary["data"] = {"outcomes": origin}
    summary["encoder"] = {"tier": tier, "folder": str(folder), "encoder_id": encoder.encoder_id,
                          "variant": encoder.variant, "cache_hits": cache.hits,
                          "cache_misses": cache.misses, **encoder_verdicts(folder, encoder)}
    _report_and_export(cfg, run, summary, run_dir, folder)
    return summary


def _report_and_export(cfg: DictConfig, run: Any, summary: dict, run_dir: Path,
                       encoder_dir: Path) -> None:
    """The go/no-go report and the router artifact."""
    from replaylab.router.artifact import export_router
    from replaylab.tracking.router_report import write_router_report

    summary["reports"] = {"html": str(write_router_report(summary, run_dir))}
    path = export_router(run, encoder_dir, run_dir / "artifacts" / "router",
                         version=str(cfg.export.version), valid_days=float(cfg.export.valid_days),
                         hmac_key=hmac_key(cfg.export.get("hmac_key_env")),
                         training={"mlflow_run_id": active_run_id(), "git_commit": git_commit()})
    summary["artifacts"]["router"] = str(path)
