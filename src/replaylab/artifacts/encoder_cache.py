"""The encoder cache: where a router run's encoder export and embeddings live, keyed how,
and when they are reused (`router.encoder`: tier, cache_dir, variant, int8, threads).

- `<cache_dir>/encoder-minilm`: the ONNX export of MiniLM with its tokenizer
  (`replaylab.artifacts.encoder_export.export_encoder`), exported here the first
  time and reused while its fp32 variant verifies and passes its golden vectors on
  this CPU and int8, when asked for, was tried with today's `INT8_SCHEME`;
- `<cache_dir>/encoder-static`: the static tier, MiniLM distilled by model2vec
  (`replaylab.artifacts.static_export`), reused while it verifies and passes its
  golden vectors;
- `<cache_dir>/embeddings`: prompt embeddings by content hash of (encoder id, text)
  (`replaylab.router.embed_cache`: another encoder or variant never shares a key).

Either export is loaded with the serving runtime's loader, so training embeds
exactly as serving will. The apps layer hands this module its config and nothing
else. Here, not in router/, because the cache exports (artifacts/ sits above router/).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from replaylab.config import ConfigError

log = logging.getLogger("replaylab")
EMBEDDINGS = "embeddings"  # the embedding cache's folder under cache_dir


def encoder_folder(enc: Mapping, parity_texts: list[str]) -> Path:
    """The cached, verified encoder export (exported here the first time).

    Reused while its fp32 variant verifies and passes its golden vectors on this
    CPU (an export without them is redone), and int8, when asked for, was tried
    with today's `INT8_SCHEME` (published or refused: a refusal is not retried on
    every run; an export with another scheme is redone)."""
    import json

    from replaylab.artifacts.encoder_export import INT8_SCHEME, export_encoder
    from replaylab.contracts.manifest import ManifestError
    from replaylab.router.encoder import load_minilm
    from replaylab.runtime.encoder import load_encoder

    folder = Path(enc["cache_dir"]) / "encoder-minilm"

    def reusable() -> bool:
        try:
            if load_encoder(folder, variant="fp32").golden_status != "passed":
                return False  # an export from before golden vectors: export again
            tried = json.loads((folder / "manifest.json").read_text())["training"]["parity"][
                "variants"]
        except (ManifestError, OSError, KeyError, ValueError):
            return False
        # int8 not asked for, or tried with today's scheme
        return not bool(enc.get("int8", True)) or \
            tried.get("int8", {}).get("scheme") == INT8_SCHEME

    with export_lock(folder):
        if reusable():
            return folder
        log.info("exporting MiniLM to ONNX into %s (once; reused while it verifies)", folder)
        export_encoder(load_minilm(), folder, parity_texts=parity_texts[:200],
                       int8=bool(enc.get("int8", True)), overwrite=True)
    return folder


def export_lock(folder: Path) -> Any:
    """An exclusive lock on `folder`'s export, held while a process checks and (re)makes it
    (`<folder>.lock` beside it): two runs sharing a cache (two training jobs, two test
    workers) export once, the second waiting for the first and reusing its export, instead
    of both spending the export's minute of CPU. The export itself is atomic either way.
    filelock (a dependency of huggingface_hub and torch, locked in requirements.lock): an
    OS file lock released when its holder exits, even when it is killed."""
    from filelock import FileLock

    folder.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(folder.with_name(folder.name + ".lock")))


TIERS = ("minilm", "static")


def encoder_tier(enc: Mapping) -> str:
    """`router.encoder.tier`, checked (ConfigError names the choices)."""
    tier = str(enc.get("tier", "minilm"))
    if tier not in TIERS:
        raise ConfigError(f"router.encoder.tier={tier!r}: choose one of {list(TIERS)}")
    return tier


def static_encoder_folder(enc: Mapping, parity_texts: list[str]) -> Path:
    """The cached static-tier export (model2vec distillation of the local MiniLM, exported
    here the first time, ~20 s); reused while it verifies and passes its golden vectors."""
    from replaylab.artifacts.static_export import export_static_encoder
    from replaylab.contracts.manifest import ManifestError
    from replaylab.router.static_encoder import distill_minilm
    from replaylab.runtime.static_encoder import load_static_encoder

    folder = Path(enc["cache_dir"]) / "encoder-static"
    with export_lock(folder):
        try:
            if load_static_encoder(folder).golden_status == "passed":
                return folder
        except (ManifestError, OSError, ValueError):
            pass
        log.info("distilling MiniLM with model2vec into %s (once; reused while it verifies)",
                 folder)
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


def prepare_encoder(enc: Mapping, texts: list[str]) -> tuple[Path, Any, str]:
    """The cached encoder export of `router.encoder.tier`, loaded as serving loads it."""
    tier = encoder_tier(enc)
    if tier == "static":
        from replaylab.runtime.static_encoder import load_static_encoder

        folder = static_encoder_folder(enc, texts)
        return folder, load_static_encoder(folder), tier
    folder = encoder_folder(enc, texts)
    return folder, serving_encoder(folder, str(enc.get("variant", "fp32")),
                                   int(enc.get("threads", 1))), tier


def embeddings_dir(enc: Mapping) -> Path:
    """Where the prompt embeddings of `router.encoder.cache_dir` are cached."""
    return Path(enc["cache_dir"]) / EMBEDDINGS


def cached_embed(encoder: Any, enc: Mapping) -> tuple[Any, Any]:
    """(embed, cache) of `encoder` over the embedding cache of `enc`
    (`replaylab.router.embed_cache.cached_embed`: the misses only, each text once)."""
    from replaylab.router.embed_cache import cached_embed as embed_with_cache

    return embed_with_cache(encoder, embeddings_dir(enc))
