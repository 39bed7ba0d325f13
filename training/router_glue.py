"""pipeline=router: read the outcomes, prepare the encoder (exported once, cached), train, report.

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

from replaylab.config import ConfigError

log = logging.getLogger("replaylab")
DEFAULT_OUTCOMES = Path(__file__).resolve().parents[1] / "data" / "routellm_gsm8k" / \
    "gsm8k_responses.csv"


def load_outcomes(cfg: DictConfig) -> tuple[Any, str]:
    """(outcomes-v1 frame, where it came from)."""
    from replaylab.contracts import read_outcomes
    from replaylab.sources.registry import SOURCES, import_source

    path, source = cfg.data.get("outcomes"), cfg.data.get("outcomes_source")
    if path is None and source is None:
        path, source = DEFAULT_OUTCOMES, "routellm_gsm8k"
    if source is not None:
        if source not in SOURCES or SOURCES[source].contract != "outcomes":
            names = sorted(k for k, v in SOURCES.items() if v.contract == "outcomes")
            raise ConfigError(f"data.outcomes_source={source!r}: choose one of {names}")
        if path is not None and not Path(path).exists():
            raise FileNotFoundError(f"data.outcomes={path}: no such file or folder")
        _, frame = import_source(source, None if path is None else str(path))
        return frame, f"{source}:{path}"
    if not Path(path).is_file():
        raise FileNotFoundError(f"data.outcomes={path}: no such file")
    result = read_outcomes(path)
    return result.valid, str(path)


def encoder_folder(enc: dict, parity_texts: list[str]) -> Path:
    """The cached, verified encoder export (exported here the first time)."""
    from replaylab.artifacts.manifest import ManifestError
    from replaylab.router.encoder import export_encoder, load_minilm
    from replaylab.runtime.encoder import load_encoder

    folder = Path(enc["cache_dir"]) / "encoder-minilm"
    try:
        load_encoder(folder, variant=str(enc.get("variant", "fp32")))
        return folder
    except (ManifestError, OSError):
        pass
    log.info("exporting MiniLM to ONNX into %s (once; reused while it verifies)", folder)
    export_encoder(load_minilm(), folder, parity_texts=parity_texts[:200],
                   int8=bool(enc.get("int8", True)), overwrite=True)
    return folder


def router(cfg: DictConfig, run_dir: Path) -> dict:
    from replaylab.pipelines.router import train_router
    from replaylab.router.embed_cache import CachedEncoder, EmbeddingCache
    from replaylab.router.pipeline_config import router_config
    from replaylab.runtime.encoder import load_encoder
    from training.pipelines import _plain

    values = _plain(cfg.router)
    enc = values.pop("encoder")
    rcfg = router_config(values)
    outcomes, origin = load_outcomes(cfg)
    texts = outcomes["prompt_text"].dropna().astype(str).drop_duplicates().tolist()
    folder = encoder_folder(enc, texts)
    encoder = load_encoder(folder, variant=str(enc.get("variant", "fp32")),
                           threads=int(enc.get("threads", 1)))
    cache = EmbeddingCache(encoder.encoder_id, encoder.dimension,
                           path=Path(enc["cache_dir"]) / "embeddings")
    cached = CachedEncoder(encoder, cache)

    def embed(batch: list[str]):
        out = cached.encode(batch)
        cache.flush()
        return out

    summary, run = train_router(outcomes, rcfg, run_dir, embed, progress=log.info)
    summary["data"] = {"outcomes": origin}
    summary["encoder"] = {"folder": str(folder), "encoder_id": encoder.encoder_id,
                          "variant": encoder.variant, "cache_hits": cache.hits,
                          "cache_misses": cache.misses}
    _report_and_export(cfg, run, summary, run_dir, folder)
    return summary


def _report_and_export(cfg: DictConfig, run: Any, summary: dict, run_dir: Path,
                       encoder_dir: Path) -> None:
    """The go/no-go report and the router artifact."""
    from replaylab.router.artifact import export_router
    from replaylab.tracking.router_report import write_router_report

    summary["reports"] = {"html": str(write_router_report(summary, run_dir))}
    from export.glue import active_run_id, git_commit, hmac_key

    path = export_router(run, encoder_dir, run_dir / "artifacts" / "router",
                         version=str(cfg.export.version), valid_days=float(cfg.export.valid_days),
                         hmac_key=hmac_key(cfg.export.get("hmac_key_env")),
                         training={"mlflow_run_id": active_run_id(), "git_commit": git_commit()})
    summary["artifacts"]["router"] = str(path)
