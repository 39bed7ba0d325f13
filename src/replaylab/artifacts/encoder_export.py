"""Export of the MiniLM encoder as a verified folder: ONNX with its tokenizer, int8, parity.

The training side (`replaylab.router.encoder`) loads MiniLM offline and reads its
pipeline; serving encodes with `replaylab.runtime.encoder` (onnxruntime, no torch).
This module makes the two the same encoder:

`export_encoder(model, out_dir, parity_texts=...)`
  1. reads the pipeline from the model's own modules (`describe_model`):
     Transformer -> Pooling(mean) -> Normalize, `max_seq_length`, dimension;
     anything else is refused rather than approximated;
  2. exports the transformer (`input_ids`, `attention_mask`, `token_type_ids`
     (b, t) int64 -> `last_hidden_state` (b, t, d) float32, dynamic batch and
     sequence axes) with `torch.onnx.export` (TorchScript exporter, opset 17);
     pooling and normalization stay outside the graph, in numpy, in the runtime;
  3. saves the tokenizer the model uses (`tokenizer.json`, truncation set to
     `max_seq_length`, no padding) and `encoder_config.json`;
  4. optionally quantizes the MatMuls to int8 (`quantize_dynamic`, per-channel
     weights); the runtime runs int8 one text per call (`per_text`), since its
     activation scales span the whole batch (batch vs single: cosine 0.956), and
     fp32 too, so that every vector depends on its text alone on any CPU;
  5. measures parity through the runtime's own code path against
     `SentenceTransformer.encode` (torch fp32) on the caller's prompts plus
     `EDGE_CASE_TEXTS`. fp32 is required: min cosine < 0.9999 is a
     `ParityError` and nothing is published. int8 is optional: when its mean
     over prompts or its minima miss `INT8_GATES` it is left out of the
     folder and the parity record says `published: false` and why (dynamic
     int8 cannot reach a 0.99 *minimum*: 1-3 token inputs sit near 0.977);
  6. writes golden vectors (`golden.json`: token ids, the sentence-transformers
     reference and every published variant's vector for a few prompts and edge
     cases), which `replaylab.runtime.encoder.load_encoder` re-checks on the
     serving machine, since onnxruntime's kernels (and int8's numbers) differ by CPU;
  7. writes the manifest (kind `encoder`, every file's sha256, dimension, opset,
     parity figures) and publishes the folder atomically: everything is written
     into a temporary folder beside `out_dir` and renamed into place.

Encoder ids (what `embedding_model` and the embedding cache key on): the fp32
variant is `model_id` itself (it matches sentence-transformers to 1e-12 in cosine);
the int8 variant is `model_id + "+int8r"` (a different, nearby space; `r`: reduce_range).
torch and sentence-transformers are imported inside functions only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from replaylab.contracts.golden import (
    ParityError,
    cpu_info,
    golden_document,
    row_cosines,
    write_golden,
)
from replaylab.contracts.manifest import build_manifest, staged_folder, write_manifest
from replaylab.router.encoder import (
    MINILM_MODEL_ID,
    MINILM_PACKAGE,
    ModelSpec,
    SentenceTransformerEncoder,
    describe_model,
)
from replaylab.runtime.encoder import (
    CONFIG_FILE,
    CONFIG_FORMAT,
    INPUT_NAMES,
    KIND,
    TOKENIZER_FILE,
    EncoderConfig,
    OnnxSentenceEncoder,
)

ONNX_FP32 = "encoder.onnx"
ONNX_INT8 = "encoder.int8.onnx"
# "+int8r": the reduce_range scheme's space (the earlier "+int8" vectors, 8-bit weights,
# are a different space and must not meet these in a cache)
INT8_SUFFIX = "+int8r"
OUTPUT_NAME = "last_hidden_state"
DEFAULT_OPSET = 17
log = logging.getLogger(__name__)
# The int8 scheme (docs/results/int8-cpus.md): dynamic quantization of the MatMuls, per-channel
# int8 weights, uint8 activations quantized per call. reduce_range: 7-bit weights, so
# that u8 x s8 pair sums fit in int16 and onnxruntime's AVX2 kernel (vpmaddubsw, which
# saturates at 8-bit weights) computes the same integers as the VNNI one: measured cosine
# to sentence-transformers 0.9940 mean / 0.9882 min on prompts on both CPU kinds, against
# 0.9946 / 0.9883 (VNNI) and 0.9937 / 0.9858 (AVX2) without it; same VNNI speed.
INT8_SCHEME: dict[str, Any] = {"method": "quantize_dynamic", "op_types": ["MatMul"],
                               "weight_type": "QInt8", "per_channel": True,
                               "reduce_range": True}
# Export gates of the optional int8 variant vs sentence-transformers (fp32 torch): the mean
# and minimum over the parity prompts and the minimum over the edge cases (1-3 token inputs
# sit lowest). Set to hold with margin on AVX2 and AVX-512 VNNI (docs/results/int8-cpus.md: 0.9940,
# 0.9880, 0.9742 on both). The same bounds are re-checked on the serving machine at load.
INT8_GATES: dict[str, float] = {"mean_cosine_prompts": 0.99, "min_cosine_prompts": 0.98,
                                "min_cosine_edge_cases": 0.96}
GOLDEN_PROMPTS = 8  # prompts in golden.json (plus the short edge cases): ~0.3 s of fp32 at load
# Golden-vector tolerances (docs/specs/artifacts.md "Golden vectors"): fp32 on another CPU
# differs by float rounding only; int8 by its kernels' rounding (measured in
# docs/results/int8-cpus.md); the int8 quality bounds are the export gates.
GOLDEN_TOLERANCES: dict[str, float] = {
    "fp32_min_cosine": 0.99999, "int8_min_cosine": 0.99,  # int8 VNNI vs AVX2: min 0.9958
    "int8_reference_mean_cosine": INT8_GATES["mean_cosine_prompts"],
    "int8_reference_min_cosine_prompts": INT8_GATES["min_cosine_prompts"],
    "int8_reference_min_cosine_edge_cases": INT8_GATES["min_cosine_edge_cases"]}

# Always part of the parity set: the inputs where tokenization and pooling go wrong.
EDGE_CASE_TEXTS: tuple[str, ...] = (
    "", " ", "\t\n  \r\n", "a", "?", "   leading and trailing spaces   ",
    "multiple   internal\n\nspaces\tand\ttabs",
    "Ünïcödé: café naïve Zürich — “curly quotes” … ½ ﬁ",
    "中文文本：路由器为每个提示选择一个模型。", "日本語のテキストと emoji 🤖🚀👍🏽",
    "Ελληνικά και русский текст, עברית, مرحبا بالعالم", "zero\u200bwidth\ufeff BOM and\u00a0nbsp",
    "control \x00 \x07 \x1b chars", "x" * 3000,  # one 3,000-char word: WordPiece [UNK]
    "The router picks a model for each prompt. " * 20,  # ~180 tokens: past 128, under 256
    " ".join(f"token{i % 97} and more words" for i in range(400)),  # far beyond 256 tokens
)


@dataclass(frozen=True)
class EncoderExport:
    """What `export_encoder` published: the folder, its manifest and the parity figures."""

    path: Path
    manifest: dict
    parity: dict[str, dict] = field(default_factory=dict)


def parity_figures(reference: np.ndarray, candidate: np.ndarray, n_prompts: int | None = None
                   ) -> dict:
    """Cosine of candidate vs reference rows, (n, d) each: min, mean, 1st percentile, max |diff|.

    With `n_prompts`, rows [:n_prompts] (real prompts) and [n_prompts:] (edge
    cases) are also summarized apart (`*_prompts`, `*_edge_cases`).
    """
    cos = row_cosines(reference, candidate)
    out = {"n_texts": len(cos), "min_cosine": float(cos.min()), "mean_cosine": float(cos.mean()),
           "p01_cosine": float(np.quantile(cos, 0.01)),
           "max_abs_diff": float(np.abs(reference - candidate).max())}
    if n_prompts is not None:
        for part, c in (("prompts", cos[:n_prompts]), ("edge_cases", cos[n_prompts:])):
            if len(c):
                out[f"n_{part}"] = len(c)
                out[f"min_cosine_{part}"] = float(c.min())
                out[f"mean_cosine_{part}"] = float(c.mean())
    return out


def _weights_sha256(module: Any) -> str:
    """sha256 over the state dict (sorted names, dtype, shape, raw bytes): the weights' identity."""
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        arr = tensor.detach().cpu().contiguous().numpy()
        h.update(f"{name}|{arr.dtype}|{arr.shape}|".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def _export_onnx(model: Any, path: Path, opset: int) -> None:
    """The transformer alone to ONNX: three (b, t) int64 inputs -> (b, t, d) float32."""
    import torch

    class _Transformer(torch.nn.Module):
        def __init__(self, bert: torch.nn.Module) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):  # (b, t) each
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    bert = model[0].auto_model
    wrapper = _Transformer(bert).eval()
    # Two texts of different length, so the traced graph carries a real padding mask.
    example = model.tokenizer(["a short prompt", "a longer prompt that needs padding here"],
                              padding=True, return_tensors="pt")
    args = tuple(example[name] for name in INPUT_NAMES)
    axes = {name: {0: "batch", 1: "sequence"} for name in (*INPUT_NAMES, OUTPUT_NAME)}
    # Eager attention traces to plain MatMul/Softmax (sdpa adds IsNaN/Where guards);
    # same numbers, a simpler graph. The caller's setting is restored afterwards.
    attn = getattr(bert.config, "_attn_implementation", None)
    if attn and hasattr(bert, "set_attn_implementation"):
        bert.set_attn_implementation("eager")
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # dynamo=False: the TorchScript exporter needs no onnxscript and gives one
            # self-contained file; parity below is what decides whether it is right.
            # Its known notices (deprecation; a traced `padding_length > 0` that is 0
            # for every encoder input; non-negative index ops) are checked by parity.
            for text in ("You are using the legacy TorchScript", "The feature will be removed",
                         "Converting a tensor to a Python boolean", "Exporting aten::index"):
                warnings.filterwarnings("ignore", message=text)
            torch.onnx.export(wrapper, args, str(path), input_names=list(INPUT_NAMES),
                              output_names=[OUTPUT_NAME], dynamic_axes=axes,
                              opset_version=opset, do_constant_folding=True, dynamo=False)
    finally:
        if attn and hasattr(bert, "set_attn_implementation"):
            bert.set_attn_implementation(attn)
    import onnx

    onnx.checker.check_model(str(path))


def _quantize_int8(src: Path, dst: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # MatMul only: quantizing the embedding Gathers as well lowered the minimum
    # prompt cosine from 0.990 to 0.987 for no measurable speed (docs/design/router-encoder.md).
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.WARNING))  # it logs every tensor at INFO on the root logger
    try:
        quantize_dynamic(src, dst, per_channel=INT8_SCHEME["per_channel"],
                         reduce_range=INT8_SCHEME["reduce_range"],
                         weight_type=getattr(QuantType, INT8_SCHEME["weight_type"]),
                         op_types_to_quantize=list(INT8_SCHEME["op_types"]))
    finally:
        root.setLevel(level)


def _tokenizer_json(model: Any, spec: ModelSpec) -> str:
    """The exact tokenizer the model uses, truncating at `max_seq_length`, unpadded."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(model.tokenizer.backend_tokenizer.to_str())
    tok.enable_truncation(max_length=spec.max_seq_length)
    tok.no_padding()
    return tok.to_str()


def _versions() -> dict[str, str]:
    names = ("torch", "sentence-transformers", "transformers", "onnx", "onnxruntime",
             "tokenizers", MINILM_PACKAGE)
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def _gate(figures: dict, gates: dict[str, float]) -> list[str]:
    """Record each gate beside its figure; the list of gates missed (as readable lines)."""
    missed = []
    for stat, bound in gates.items():
        figures[f"gate_{stat}"] = bound
        if not figures[stat] >= bound:
            missed.append(f"{stat} {figures[stat]:.6f} < {bound}")
    return missed


def _golden(enc_by_variant: dict[str, OnnxSentenceEncoder], reference: np.ndarray,
            texts: list[str], parts: list[str], tolerances: dict[str, float],
            built_on: Mapping[str, Any] | None = None) -> dict:
    """golden.json of the encoder: each text's token ids, the reference vector
    (sentence-transformers, torch fp32) and each published variant's vector on this machine."""
    fp32 = enc_by_variant["fp32"]
    vectors = {v: np.stack([e.encode_one(t) for t in texts])  # the serving path
               for v, e in enc_by_variant.items()}
    cases = []
    for i, (text, encoding) in enumerate(zip(texts, fp32.tokenize(texts), strict=True)):
        expected = {"token_ids": list(encoding.ids),
                    "reference": [float(x) for x in reference[i]],
                    **{v: [float(x) for x in vec[i]] for v, vec in vectors.items()}}
        cases.append({"input": {"text": text, "part": parts[i]}, "expected": expected})
    return golden_document(KIND, cases, tolerances, built_on=built_on,
                           reference="sentence-transformers encode (torch fp32)")


def export_encoder(model: Any, out_dir: str | Path, *, parity_texts: Sequence[str],
                   model_id: str = MINILM_MODEL_ID, int8: bool = True,
                   opset: int = DEFAULT_OPSET, version: str = "1.0.0",
                   valid_days: float = 365.0, min_cosine_fp32: float = 0.9999,
                   mean_cosine_int8: float = INT8_GATES["mean_cosine_prompts"],
                   min_cosine_int8: float = INT8_GATES["min_cosine_prompts"],
                   min_cosine_int8_edge: float = INT8_GATES["min_cosine_edge_cases"],
                   hmac_key: bytes | None = None,
                   overwrite: bool = False, created: datetime | None = None,
                   training: dict | None = None, golden_texts: int = GOLDEN_PROMPTS,
                   built_on: Mapping[str, Any] | None = None) -> EncoderExport:
    """Export `model` (a SentenceTransformer) to a verified encoder folder at `out_dir`.

    `parity_texts`: real prompts (non-empty) the parity is measured on;
    EDGE_CASE_TEXTS are added. Gates: fp32 min cosine >= `min_cosine_fp32`
    (required: a miss raises ParityError and nothing is published); int8 mean
    cosine over the prompts >= `mean_cosine_int8`, min over the prompts >=
    `min_cosine_int8` and min over the edge cases >= `min_cosine_int8_edge` (optional: a miss leaves the int8 variant out of the
    folder, and `EncoderExport.parity["int8"]` says `published: false` and
    why). FileExistsError when `out_dir` exists and not `overwrite`.
    The folder carries golden vectors (`golden.json`, `golden_texts` prompts plus
    the short edge cases) that `load_encoder` re-checks on the serving machine.
    `training` is merged into the manifest's training field. `built_on`: what golden.json
    records about the exporting machine (None: this one; a committed fixture passes
    `golden.ANY_MACHINE`). Layout:
    encoder.onnx, [encoder.int8.onnx], tokenizer.json, encoder_config.json,
    golden.json, manifest.json.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} exists (pass overwrite=True to replace it)")
    parity_texts = list(parity_texts)
    if not parity_texts:
        raise ValueError("parity_texts is empty: parity must be measured on real prompts")
    texts = parity_texts + list(EDGE_CASE_TEXTS)
    spec = describe_model(model)
    with staged_folder(out_dir, overwrite=overwrite) as tmp:
        # fp32 one text per call too: a vector is then a function of its text alone on any
        # CPU (no padding, no batch mates), so training's and serving's embeddings agree
        # bit for bit by construction; measured as fast as length-sorted batches of 32 on
        # GSM8K prompts (3.25 vs 3.62 s for 300, one thread)
        variants = {"fp32": {"file": ONNX_FP32, "encoder_id": model_id, "per_text": True}}
        _export_onnx(model, tmp / ONNX_FP32, opset)
        if int8:
            _quantize_int8(tmp / ONNX_FP32, tmp / ONNX_INT8)
            variants["int8"] = {"file": ONNX_INT8, "encoder_id": model_id + INT8_SUFFIX,
                                "per_text": True, "quantization": dict(INT8_SCHEME)}
        tokenizer_json = _tokenizer_json(model, spec)
        (tmp / TOKENIZER_FILE).write_text(tokenizer_json, encoding="utf-8")
        raw_config = {"format": CONFIG_FORMAT, "model_id": model_id,
                      "dimension": spec.dimension, "max_seq_length": spec.max_seq_length,
                      "pooling": spec.pooling, "normalize": spec.normalize,
                      "pad_id": spec.pad_id, "variants": variants}
        config = EncoderConfig.from_dict(raw_config)
        reference = SentenceTransformerEncoder(model).encode(texts)
        encoders = {v: OnnxSentenceEncoder.from_bytes(
            (tmp / e["file"]).read_bytes(), tokenizer_json, config, variant=v,
            threads=max(1, min(4, os.cpu_count() or 1))) for v, e in variants.items()}
        parity = {v: parity_figures(reference, enc.encode(texts), len(parity_texts))
                  for v, enc in encoders.items()}
        missed = _gate(parity["fp32"], {"min_cosine": min_cosine_fp32})
        if missed:  # the required output: the run cannot go on without it
            raise ParityError(f"fp32 encoder: {'; '.join(missed)} ({len(texts)} texts vs "
                              "sentence-transformers)")
        parity["fp32"]["published"] = True
        if int8:
            missed = _gate(parity["int8"], {"mean_cosine_prompts": mean_cosine_int8,
                                            "min_cosine_prompts": min_cosine_int8,
                                            "min_cosine_edge_cases": min_cosine_int8_edge})
            parity["int8"].update(published=not missed, cpu=cpu_info(), scheme=dict(INT8_SCHEME),
                                  reason="; ".join(missed) or None)
            if missed:  # optional: left out, said so, never fatal
                log.warning("int8 encoder not published: %s", parity["int8"]["reason"])
                (tmp / ONNX_INT8).unlink()
                del variants["int8"], encoders["int8"]
                config = EncoderConfig.from_dict(raw_config)
        (tmp / CONFIG_FILE).write_text(json.dumps(raw_config, indent=1, sort_keys=True) + "\n",
                                       encoding="utf-8")
        chosen = _golden_indices(len(parity_texts), golden_texts)
        golden_set = [texts[i] for i in chosen]
        parts = ["prompt" if i < len(parity_texts) else "edge_case" for i in chosen]
        write_golden(tmp, _golden(encoders, reference[chosen], golden_set, parts,
                                  GOLDEN_TOLERANCES, built_on))
        manifest = _manifest(tmp, model, spec, config, parity, texts, opset, version,
                             valid_days, created, training or {})
        write_manifest(tmp, manifest, hmac_key=hmac_key)
    return EncoderExport(path=out_dir, manifest=manifest, parity=parity)


def _golden_indices(n_prompts: int, k: int) -> list[int]:
    """`k` prompts spread over the parity prompts (deterministic), then the short edge cases
    (the long ones cost load time and test nothing the prompts do not)."""
    prompts = sorted({int(i) for i in np.linspace(0, n_prompts - 1, num=min(k, n_prompts))})
    edges = [n_prompts + j for j, t in enumerate(EDGE_CASE_TEXTS) if len(t) <= 200]
    return prompts + edges


def _manifest(folder: Path, model: Any, spec: ModelSpec, config: EncoderConfig,
              parity: dict, texts: list[str], opset: int, version: str, valid_days: float,
              created: datetime | None, training: dict) -> dict:
    texts_sha = hashlib.sha256("\x1e".join(texts).encode("utf-8")).hexdigest()
    return build_manifest(
        folder, kind=KIND, version=version, contracts={"ledger": "1"},
        valid_days=valid_days, created=created,
        features=[{"name": "prompt_text", "dtype": "string",
                   "max_seq_length": spec.max_seq_length}],
        outputs={"name": "prompt_embedding", "dtype": "float32", "dimension": spec.dimension,
                 "pooling": spec.pooling, "normalize": spec.normalize,
                 "model_id": config.model_id, "encoder_ids": config.encoder_ids},
        calibration={},
        training={"source_model": config.model_id,
                  "weights_sha256": _weights_sha256(model[0].auto_model),
                  "versions": _versions(),
                  "parity": {"reference": "sentence-transformers encode (torch fp32)",
                             "texts_sha256": texts_sha, "variants": parity},
                  **training},
        runtime={"onnxruntime": ">=1.18", "opset": opset, "inputs": list(INPUT_NAMES),
                 "output": OUTPUT_NAME, "files": config.files, "config": CONFIG_FILE,
                 "tokenizer": TOKENIZER_FILE},
        fallback={"on_failure": "router routes without embeddings (its non-encoder baseline)"},
    )
