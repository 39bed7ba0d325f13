"""Export of the static tier (MiniLM distilled by model2vec) as a verified folder.

The distillation itself is training-side (`replaylab.router.static_encoder.distill_minilm`).

`export_static_encoder(model, out_dir, parity_texts=...)`:
  1. refuses a tokenizer other than BertNormalizer -> BertPreTokenizer ->
     WordPiece (`replaylab.router.charmap.check_bert_pipeline`);
  2. writes `vocab.txt`, `charmap.tsv`, `embeddings.safetensors` (F32
     [vocab, d]), `tokenizer.json` (HF, for reference) and
     `static_config.json`: the whole encoder as files any language reads
     (docs/specs/router-scorer.md);
  3. checks the runtime's own path (`replaylab.runtime.static_encoder`, built
     from those files) on the parity texts plus the MiniLM exporter's edge
     cases: token ids equal to model2vec's `StaticModel.tokenize` on every text
     and vectors equal to `StaticModel.encode` within cosine `min_cosine`; a
     miss is a `ParityError` and nothing is published;
  4. writes golden vectors (token ids and vectors) and the manifest (kind
     `encoder`), and publishes the folder atomically.

The encoder id, `<model_id>+model2vec-pca<d>`, keys the embedding cache and the
ledger's `embedding_model`: static vectors never meet MiniLM's. A table tuned on the
team's prompts (`replaylab.router.static_encoder.tune_on_prompts`, passed as
`tuning=`) is `<model_id>+model2vec-pca<d_s>-tuned<d>-<sha of its map>`, and its
`static_config.json` / manifest record the tuning (ridge, calibration cosines, prompt
counts); the runtime reads it as any static table.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from replaylab.artifacts.encoder_export import EDGE_CASE_TEXTS
from replaylab.contracts.golden import ParityError, golden_document, row_cosines, write_golden
from replaylab.contracts.manifest import build_manifest, staged_folder, write_manifest
from replaylab.router.charmap import charmap_tsv, check_bert_pipeline
from replaylab.router.encoder import MINILM_MODEL_ID
from replaylab.router.static_encoder import SIF_COEFFICIENT, PromptTuning, static_encoder_id
from replaylab.runtime.encoder_base import KIND
from replaylab.runtime.static_encoder import (
    CONFIG_FILE,
    CONFIG_FORMAT,
    TIER,
    VARIANT,
    static_encoder_from_files,
)

VOCAB_FILE = "vocab.txt"
CHARMAP_FILE = "charmap.tsv"
EMBEDDINGS_FILE = "embeddings.safetensors"
TOKENIZER_FILE = "tokenizer.json"
TENSOR = "embeddings"
GOLDEN_PROMPTS = 8
# golden tolerance: the arithmetic is fixed (float64 sums in token order), so another
# machine differs only if its libm rounds sqrt differently: none seen
GOLDEN_TOLERANCES = {"static_min_cosine": 0.999999}


@dataclass(frozen=True)
class StaticExport:
    """What `export_static_encoder` published."""

    path: Path
    manifest: dict
    parity: dict = field(default_factory=dict)


def safetensors_bytes(tensors: dict[str, np.ndarray], metadata_: dict[str, str] | None = None
                      ) -> bytes:
    """{name: F32 array} -> safetensors bytes (names sorted; header padded to 8 bytes)."""
    from safetensors.numpy import save

    return save({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()},
                metadata=metadata_)


def _reference_ids(model: Any, texts: list[str]) -> list[list[int]]:
    """model2vec's own ids with its own truncation (characters, then tokens)."""
    m = model.max_length * model.median_token_length
    return model.tokenize([t[:m] for t in texts])


def export_static_encoder(model: Any, out_dir: str | Path, *, parity_texts: Sequence[str],
                          model_id: str = MINILM_MODEL_ID, version: str = "1.0.0",
                          valid_days: float = 365.0, min_cosine: float = 0.99999,
                          overwrite: bool = False, created: datetime | None = None,
                          hmac_key: bytes | None = None,
                          built_on: Mapping[str, Any] | None = None,
                          tuning: PromptTuning | None = None) -> StaticExport:
    """Write the verified static encoder folder of `model` (a model2vec StaticModel).

    tuning: how `model` was tuned on prompts (`tune_on_prompts`), recorded and part of
    the encoder id; None for the plain distillation.

    built_on: what golden.json records about the exporting machine (None: this one,
    `golden.this_machine()`; a committed fixture passes `golden.ANY_MACHINE`, so that its
    bytes are the same on any CPU)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} exists (pass overwrite=True to replace it)")
    parity_texts = [str(t) for t in parity_texts]
    if not parity_texts:
        raise ValueError("parity_texts is empty: parity must be measured on real prompts")
    texts = parity_texts + list(EDGE_CASE_TEXTS)
    tok_json = json.loads(model.tokenizer.to_str())
    check_bert_pipeline(tok_json)
    wp = tok_json["model"]
    vocab = [t for t, _ in sorted(model.tokenizer.get_vocab().items(), key=lambda kv: kv[1])]
    if [model.tokenizer.token_to_id(t) for t in vocab] != list(range(len(vocab))):
        raise ValueError("the tokenizer's ids are not 0..V-1")
    table = np.asarray(model.embedding, dtype=np.float32)
    if table.shape[0] != len(vocab):
        raise ValueError(f"embedding rows {table.shape[0]} != vocabulary {len(vocab)}")
    if any("\n" in t or "\r" in t for t in vocab):
        raise ValueError("a token holds a line break: vocab.txt cannot carry it")
    dim = int(table.shape[1])
    pca = dim if tuning is None else tuning.source_dims
    encoder_id = static_encoder_id(model_id, pca, None if tuning is None
                                   else f"tuned{dim}-{tuning.tag}")
    config = {
        "format": CONFIG_FORMAT, "tier": TIER, "model_id": model_id, "encoder_id": encoder_id,
        "dimension": dim, "vocab_size": len(vocab), "unk_token": wp["unk_token"],
        "unk_id": int(model.tokenizer.token_to_id(wp["unk_token"])),
        "continuing_subword_prefix": wp["continuing_subword_prefix"],
        "max_input_chars_per_word": int(wp["max_input_chars_per_word"]),
        "max_tokens": int(model.max_length),
        "max_chars": int(model.max_length * model.median_token_length),
        "drop_unk": True, "normalize": bool(model.normalize), "pooling": "mean",
        "embeddings_file": EMBEDDINGS_FILE, "tensor": TENSOR, "charmap_file": CHARMAP_FILE,
        "vocab_file": VOCAB_FILE,
        "distillation": {"package": "model2vec", "version": metadata.version("model2vec"),
                         "pca_dims": pca, "sif_coefficient": SIF_COEFFICIENT,
                         "source": model_id,
                         **({} if tuning is None else {"tuning": tuning.as_dict()})}}
    files = {VOCAB_FILE: ("\n".join(vocab) + "\n").encode("utf-8"),
             CHARMAP_FILE: charmap_tsv(model.tokenizer).encode("utf-8"),
             EMBEDDINGS_FILE: safetensors_bytes({TENSOR: table}, {"encoder_id": encoder_id}),
             TOKENIZER_FILE: model.tokenizer.to_str().encode("utf-8"),
             CONFIG_FILE: (json.dumps(config, indent=1, sort_keys=True) + "\n").encode()}
    encoder = static_encoder_from_files(config, files[CHARMAP_FILE].decode(),
                                        files[VOCAB_FILE].decode(), files[EMBEDDINGS_FILE])
    parity = _parity(model, encoder, texts, len(parity_texts), min_cosine)
    with staged_folder(out_dir, overwrite=overwrite) as tmp:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        write_golden(tmp, _golden(encoder, texts, len(parity_texts), built_on))
        texts_sha = hashlib.sha256("\x1e".join(texts).encode("utf-8")).hexdigest()
        manifest = build_manifest(
            tmp, kind=KIND, version=version, contracts={"ledger": "1"}, valid_days=valid_days,
            created=created,
            features=[{"name": "prompt_text", "dtype": "string", "max_tokens": config["max_tokens"],
                       "max_chars": config["max_chars"]}],
            outputs={"name": "prompt_embedding", "dtype": "float32", "dimension": dim,
                     "pooling": "mean", "normalize": config["normalize"], "model_id": model_id,
                     "tier": TIER, "encoder_ids": {VARIANT: encoder_id}},
            calibration={},
            training={"source_model": model_id, "distillation": config["distillation"],
                      "parity": {"reference": "model2vec StaticModel.encode / tokenize",
                                 "texts_sha256": texts_sha, **parity}},
            runtime={"packages": {"numpy": ">=2.0"}, "config": CONFIG_FILE,
                     "loader": "replaylab.runtime.static_encoder.load_static_encoder",
                     "spec": "docs/specs/router-scorer.md"},
            fallback={"on_failure": "router routes by its scenario rules"})
        write_manifest(tmp, manifest, hmac_key=hmac_key)
    return StaticExport(path=out_dir, manifest=manifest, parity=parity)


def _parity(model: Any, encoder: Any, texts: list[str], n_prompts: int,
            min_cosine: float) -> dict:
    """Token ids and vectors of the runtime path vs model2vec on `texts` (ParityError on a miss)."""
    want_ids = _reference_ids(model, texts)
    got_ids = encoder.token_ids(texts)
    differ = [i for i, (a, b) in enumerate(zip(want_ids, got_ids, strict=True)) if a != b]
    if differ:
        i = differ[0]
        raise ParityError(f"static tokenizer: {len(differ)} of {len(texts)} texts differ from "
                          f"model2vec's ids; first {texts[i][:80]!r}")
    want = np.asarray(model.encode(texts), dtype=np.float64)
    got = encoder.encode(texts).astype(np.float64)
    empty = np.array([len(i) == 0 for i in got_ids])
    # model2vec gives the zero vector for a text without tokens, as the runtime does
    if not np.array_equal(np.abs(got[empty]).sum(axis=1), np.abs(want[empty]).sum(axis=1)):
        raise ParityError("a text without tokens is not the zero vector on both sides")
    cos = row_cosines(want[~empty], got[~empty]) if (~empty).any() else np.ones(1)
    figures = {"n_texts": len(texts), "n_prompts": n_prompts, "token_ids_equal": True,
               "empty_texts": int(empty.sum()), "min_cosine": float(cos.min()),
               "mean_cosine": float(cos.mean()), "gate_min_cosine": float(min_cosine)}
    if figures["min_cosine"] < min_cosine:
        raise ParityError(f"static encoder vs model2vec: min cosine {figures['min_cosine']:.8f}"
                          f" < {min_cosine}")
    return figures


def _golden(encoder: Any, texts: list[str], n_prompts: int,
            built_on: Mapping[str, Any] | None = None) -> dict:
    chosen = sorted({int(i) for i in np.linspace(0, n_prompts - 1,
                                                  num=min(GOLDEN_PROMPTS, n_prompts))})
    chosen += [n_prompts + j for j in range(len(texts) - n_prompts)]  # every edge case: cheap
    cases = []
    for i in chosen:
        ids = encoder.tokenizer.ids(texts[i])
        cases.append({"input": {"text": texts[i],
                                "part": "prompt" if i < n_prompts else "edge_case"},
                      "expected": {"token_ids": ids,
                                   VARIANT: [float(x) for x in encoder.pool(ids)]}})
    return golden_document(KIND, cases, GOLDEN_TOLERANCES,
                           reference="replaylab.runtime.static_encoder (float64 mean, spec)",
                           built_on=built_on)
