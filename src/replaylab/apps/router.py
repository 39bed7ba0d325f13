"""pipeline=router: read the outcomes, prepare the encoder (exported once, cached), train, report.

`router.encoder` (tier `minilm` or `static`, cache_dir, variant, int8, threads) is
handed to the encoder cache (`replaylab.artifacts.encoder_cache`: where the export
and the embeddings are cached, keyed how, when reused); this module only passes it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from replaylab.apps.inputs import load_outcomes, plain
from replaylab.apps.provenance import git_commit, hmac_key
from replaylab.apps.recording import active_run_id
from replaylab.artifacts.encoder_cache import (
    cached_embed,
    embeddings_dir,
    encoder_verdicts,
    prepare_encoder,
)
from replaylab.config import ConfigError

log = logging.getLogger("replaylab")


def router(cfg: DictConfig, run_dir: Path) -> dict:
    from replaylab.pipelines.router import train_router
    from replaylab.router.pipeline_config import router_config

    values = plain(cfg.router)
    enc = values.pop("encoder")
    rcfg = router_config(values)
    if cfg.data.get("ledger"):
        return router_from_receipts(cfg, run_dir, rcfg, enc)
    if cfg.data.get("replays"):
        raise ConfigError("data.replays is read with data.ledger (a receipts ledger): "
                          "without a ledger, pass the replays as data.outcomes")
    from replaylab.apps.inputs import compute_config, compute_engine

    compute_config(cfg)  # a bad compute value: one line, before anything is read
    outcomes, origin = load_outcomes(cfg)
    from replaylab.router.replay import outcome_matrix

    # fail fast, before the encoder export: a table the router cannot use is an input error
    outcome_matrix(outcomes, rcfg.cost, candidates=rcfg.candidates)
    texts = outcomes["prompt_text"].dropna().astype(str).drop_duplicates().tolist()
    folder, encoder, tier = prepare_encoder(enc, texts)
    embed, cache = cached_embed(encoder, enc)
    with compute_engine(cfg) as eng:  # where the receipts pipeline's partitions run
        summary, run = train_router(outcomes, rcfg, run_dir, embed, progress=log.info,
                                    head_scorer="numpy" if tier == "static" else "onnx",
                                    engine=eng, encoder_id=encoder.encoder_id)
        summary["compute"] = eng.facts()
    summary["data"] = {"outcomes": origin}
    summary["encoder"] = {"tier": tier, "folder": str(folder), "encoder_id": encoder.encoder_id,
                          "variant": encoder.variant, "cache_hits": cache.hits,
                          "cache_misses": cache.misses, **encoder_verdicts(folder, encoder)}
    _report_and_export(cfg, run, summary, run_dir, folder)
    for w in (summary.get("ope") or {}).get("warnings") or []:
        log.warning("router: %s", w)
    return summary  # the console's last line: apps.verdicts.verdict_line


def _report_and_export(cfg: DictConfig, run: Any, summary: dict, run_dir: Path,
                       encoder_dir: Path, receipts: bool = False) -> None:
    """The go/no-go report and the router artifact."""
    from replaylab.artifacts.kinds import ROUTER

    if receipts:
        from replaylab.tracking.receipts_report import write_receipts_report as write_report
    else:
        from replaylab.tracking.router_report import write_router_report as write_report
    summary["reports"] = {"html": str(write_report(summary, run_dir))}
    path = ROUTER.export(run, encoder_dir, run_dir / "artifacts" / "router",
                         version=str(cfg.export.version), valid_days=float(cfg.export.valid_days),
                         hmac_key=hmac_key(cfg.export.get("hmac_key_env")),
                         training={"mlflow_run_id": active_run_id(), "git_commit": git_commit()})
    summary["artifacts"]["router"] = str(path)


# parity texts for an encoder export when the ledger carries embeddings only
PARITY_FALLBACK = ["What is the capital of France?", "Write a Python function that reverses a list.",
                   "Summarize the following meeting notes in three bullet points.",
                   "Solve for x: 3x + 7 = 22.", ""]


def read_replays(cfg: DictConfig) -> tuple[Any, Any]:
    """`data.replays` (outcomes-v1) read and validated: (valid rows, file summary) or Nones."""
    from replaylab.contracts import read_outcomes

    if not cfg.data.get("replays"):
        return None, None
    rpath = str(cfg.data.replays)
    if not Path(rpath).is_file():
        raise FileNotFoundError(f"data.replays={rpath}: no such file")
    got = read_outcomes(rpath)
    return got.valid, got.summary()


def router_from_receipts(cfg: DictConfig, run_dir: Path, rcfg: Any, enc: dict) -> dict:
    """pipeline=router data.ledger=FILE|DATASET: train on the receipts, judge on the latest
    sessions, export, and check the exported artifact's decisions (as the runtime loads it)
    are the ones that were judged (pipelines/router_receipts.py, on the engine `compute`
    names: local, or the ledger on Dask workers). The encoder is prepared here once; each
    process (this one, or a worker) loads it from the same verified folder, the embedding
    cache folder shared."""
    from replaylab.apps.inputs import compute_config, compute_engine
    from replaylab.compute.ledger import ledger_paths, read_ledger_blocks
    from replaylab.pipelines.router_receipts import train_router_receipts
    from replaylab.router.receipts import ReceiptsError
    from replaylab.router.worker_encoder import EncoderSpec

    compute_config(cfg)  # a bad compute value: one line, before anything is read
    path = str(cfg.data.ledger)
    ledger_paths(path)  # a missing or empty dataset: one line, before any cluster starts
    replays, replay_file = read_replays(cfg)
    texts: list[str] = []
    for block in read_ledger_blocks(path, rows_per_block=2_000):  # parity texts: one block
        texts = [t for t in block.valid.get("prompt_text", []) if isinstance(t, str)][:500]
        break
    folder, encoder, tier = prepare_encoder(enc, texts or PARITY_FALLBACK)
    spec = EncoderSpec(tier=tier, folder=str(folder), encoder_id=encoder.encoder_id,
                       dimension=int(encoder.dimension),
                       variant=str(getattr(encoder, "variant", "fp32") or "fp32"),
                       threads=int(enc.get("threads", 1)),
                       cache_dir=str(embeddings_dir(enc)))
    try:
        with compute_engine(cfg) as eng:
            summary, run = train_router_receipts(
                eng.read_ledger(path), replays, rcfg, run_dir, spec, engine=eng,
                head_scorer="numpy" if tier == "static" else "onnx", progress=log.info)
    except ReceiptsError as exc:
        raise ConfigError(str(exc)) from exc
    summary["encoder"] = {"tier": tier, "folder": str(folder), "encoder_id": encoder.encoder_id,
                          "variant": encoder.variant, "cache_hits": None, "cache_misses": None,
                          "cache": "per process, one shared folder",
                          **encoder_verdicts(folder, encoder)}
    return finish_receipts(cfg, run_dir, summary, run, folder, path, replay_file)


def finish_receipts(cfg: DictConfig, run_dir: Path, summary: dict, run: Any, folder: Path,
                    path: str, replay_file: Any) -> dict:
    """Inputs in the summary, the report and the artifact, and the
    exported artifact's served check (agreement 1.0 or a RuntimeError: a bug)."""
    summary["data"] = {"ledger": path, "replays": None if replay_file is None
                       else str(cfg.data.replays)}
    if replay_file is not None:
        summary["replays"]["file"] = replay_file
    _report_and_export(cfg, run, summary, run_dir, folder, receipts=True)
    summary["served_check"] = served_check(Path(summary["artifacts"]["router"]), run,
                                           key=hmac_key(cfg.export.get("hmac_key_env")))
    if summary["served_check"]["agreement"] < 1.0:  # a bug, never a data problem
        raise RuntimeError("the exported router does not make the test decisions that were "
                           f"judged: {summary['served_check']}")
    log.info("router (receipts): %s", summary["go_reason"])
    line = attribution_line(summary.get("attribution"))
    if line:
        log.info("router (receipts): %s", line)
    for w in summary["ope"].get("warnings") or []:
        log.warning("router (receipts): %s", w)
    return summary


def attribution_line(attribution: dict | None) -> str | None:
    """The console's line of `summary["attribution"]` (pipelines/router_attribution.py):
    the test split's increments of exploration and replays with their intervals and
    readings, or why the attribution was skipped; None when it was off."""
    if not attribution:
        return None
    if attribution.get("status") != "done":
        return f"gain attribution skipped: {attribution.get('reason')}"

    def one(x: dict) -> str:
        lo, hi = x["ci"]
        return f"{x['estimate']:+.6f} [{lo:+.6f}, {hi:+.6f}] ({x['reading']})"

    inc = attribution["increments"]
    unit = attribution["gain"]["unit"]
    return (f"where the gain came from (test, DR, {unit}): exploration "
            f"{one(inc['exploration']['test'])}; replays {one(inc['replays']['test'])}; "
            f"served total {attribution['total']['test']:+.6f}")


def served_check(folder: Path, run: Any, key: bytes | None = None, end_to_end: int = 200) -> dict:
    """The exported artifact, loaded by `replaylab.runtime.Router`, on the test decisions:
    its head and threshold on the same embeddings must choose what was judged (agreement
    1.0), and routed end to end (tokenizer + encoder + head) on up to `end_to_end` test
    texts, the share of identical choices (encoder rounding may move a near-threshold one)."""
    import numpy as np

    from replaylab.runtime import Router
    from replaylab.runtime.routing import choose_by_threshold

    router = Router.load(folder, hmac_key=key)
    if not router.loaded:
        return {"loaded": False, "reason": router.reason, "agreement": 0.0}
    meta = run.test_meta
    prob = router.head.proba(run.test_embeddings, list(meta["category"]), meta["prompt_tokens"])
    got = choose_by_threshold(prob, router.threshold, fallback=router.fallback,
                              rule=router.rule)
    out = {"loaded": True, "n": int(len(got)),
           "agreement": float((got == run.test_choice).mean()) if len(got) else 1.0}
    idx = [i for i, t in enumerate(run.test_texts) if t is not None][:end_to_end]
    if idx:
        names = [router.route(run.test_texts[i], meta["category"][i],
                              None if not np.isfinite(meta["prompt_tokens"][i])
                              else float(meta["prompt_tokens"][i])).candidate for i in idx]
        want = [run.candidates[int(run.test_choice[i])] for i in idx]
        out["end_to_end"] = {"n": len(idx), "agreement": float(np.mean(
            [a == b for a, b in zip(names, want, strict=True)]))}
    return out
