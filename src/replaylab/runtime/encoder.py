"""Serving-side sentence encoder: a verified ONNX transformer + its tokenizer (numpy only).

Method (the sentence-transformers pipeline of the exported model, re-done here
so serving needs neither torch nor transformers):

1. tokenize: the model's own `tokenizer.json` (WordPiece for MiniLM: lowercase,
   accents stripped, `[CLS] ... [SEP]`), truncated to `max_seq_length` tokens
   *including* the two special tokens (256 for all-MiniLM-L6-v2; its
   tokenizer.json says 128, sentence-transformers overrides it, and so do we);
2. pad each length-sorted chunk of texts to its longest member (pad id 0);
3. run the ONNX transformer: `input_ids`, `attention_mask`, `token_type_ids`
   (b, t) int64 -> `last_hidden_state` (b, t, d) float32;
4. pool: mean of the token vectors where `attention_mask == 1`
   (sum / max(count, 1e-9), as `sentence_transformers.models.Pooling`);
5. normalize: x / max(||x||_2, 1e-12) when the model ends with `Normalize`.

The pooling mode, the normalization flag, `max_seq_length` and the dimension
come from `encoder_config.json` in the artifact folder, written by
`replaylab.artifacts.encoder_export.export_encoder` from the model's own modules.

`load_encoder(folder)` verifies the folder's manifest (kind `encoder`, every
file's size and sha256, validity, optional HMAC) and reads each file through
`read_verified_file`, so the bytes onnxruntime sees are the verified bytes.
Any failure raises `ManifestError` (or its subclass `EncoderArtifactError` for
a verified folder this runtime cannot use): the router catches it and falls
back. A loaded encoder is immutable; `encode` may be called from several
threads (the tokenizer and `InferenceSession.run` are thread-safe).

Sessions: `session_options(threads)` (intra-op `threads`, one inter-op thread,
sequential, ORT_ENABLE_ALL) minus `DISABLED_OPTIMIZERS` (SkipLayerNormFusion:
int8 ~10 % faster, fp32 unchanged). One text per call (the serving path) skips
padding and the mask multiply; the result has the same bits as `mean_pool`.

Imports: numpy, onnxruntime, tokenizers and the standard-library manifest
module; never torch, transformers, sentence-transformers or pandas (a test
checks this in a fresh interpreter).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from replaylab.contracts.golden import (
    MISMATCH,
    GoldenCheck,
    GoldenError,
    Timer,
    check,
    read_golden,
    row_cosines,
)
from replaylab.contracts.manifest import read_verified_file, verify_manifest
from replaylab.runtime.encoder_base import KIND, EncoderArtifactError

CONFIG_FILE = "encoder_config.json"
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FORMAT = 1
VARIANTS = ("fp32", "int8")
POOLING_MODES = ("mean",)
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
_MEAN_EPS = 1e-9      # sentence-transformers' clamp of the token count
_NORM_EPS = 1e-12     # torch.nn.functional.normalize's default eps
# onnxruntime graph rewrites left out of every session. SkipLayerNormFusion
# turns Add + LayerNormalization into SkipLayerNormalization; on the int8 graph
# (onnxruntime 1.32, one AVX-512 thread) that kernel took 1.6 ms of 13 ms at 128
# tokens, and leaving the fusion out cut int8 from 13.2 to 12.0 ms p50 with the
# same vectors (cosine to sentence-transformers unchanged to 1e-5). No effect on
# fp32, where the fusion does not apply. Measured in docs/design/router-encoder.md.
DISABLED_OPTIMIZERS: tuple[str, ...] = ("SkipLayerNormFusion",)


@dataclass(frozen=True, slots=True)
class EncoderConfig:
    """What the runtime needs besides the ONNX graph and the tokenizer.

    `encoder_ids` maps a variant (`fp32`, `int8`) to the id written next to its
    embeddings (ledger `embedding_model`, cache keys); `files` maps it to its
    ONNX file; `per_text` lists the variants that must run one text per call
    (dynamic int8 scales activations over the whole batch, so a text's vector
    would depend on its batch mates). `dimension` is d of the (n, d) output.
    """

    model_id: str
    dimension: int
    max_seq_length: int
    pooling: str
    normalize: bool
    pad_id: int
    files: dict[str, str]
    encoder_ids: dict[str, str]
    per_text: frozenset[str] = frozenset()

    @classmethod
    def from_dict(cls, raw: Any) -> EncoderConfig:
        """Parse `encoder_config.json`; a missing or ill-typed field is an EncoderArtifactError."""
        def bad(why: str) -> EncoderArtifactError:
            return EncoderArtifactError("encoder_config", f"{CONFIG_FILE}: {why}")

        if not isinstance(raw, dict):
            raise bad("not a JSON object")
        if raw.get("format") != CONFIG_FORMAT:
            raise bad(f"format {raw.get('format')!r}, this runtime reads {CONFIG_FORMAT}")
        types = {"model_id": str, "dimension": int, "max_seq_length": int, "pooling": str,
                 "normalize": bool, "pad_id": int, "variants": dict}
        for name, typ in types.items():
            if type(raw.get(name)) is not typ:
                raise bad(f"field {name!r} missing or not {typ.__name__}: {raw.get(name)!r}")
        if raw["pooling"] not in POOLING_MODES:
            raise EncoderArtifactError("unsupported_pooling",
                                       f"pooling {raw['pooling']!r}; supported: {POOLING_MODES}")
        if raw["dimension"] <= 0 or raw["max_seq_length"] < 2:
            raise bad(f"dimension {raw['dimension']} / max_seq_length {raw['max_seq_length']}")
        files, ids, per_text = {}, {}, set()
        for variant, entry in raw["variants"].items():
            if not (variant in VARIANTS and isinstance(entry, dict)
                    and isinstance(entry.get("file"), str)
                    and isinstance(entry.get("encoder_id"), str) and entry["encoder_id"]
                    and type(entry.get("per_text", False)) is bool):
                raise bad(f"bad variant entry {variant!r}: {entry!r}")
            files[variant], ids[variant] = entry["file"], entry["encoder_id"]
            if entry.get("per_text", False):
                per_text.add(variant)
        if "fp32" not in files:
            raise bad("no fp32 variant")
        return cls(model_id=raw["model_id"], dimension=raw["dimension"],
                   max_seq_length=raw["max_seq_length"], pooling=raw["pooling"],
                   normalize=raw["normalize"], pad_id=raw["pad_id"], files=files,
                   encoder_ids=ids, per_text=frozenset(per_text))


def mean_pool(token_embeddings: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """(b, t, d) float32 token vectors, (b, t) 0/1 mask -> (b, d) masked mean (float32)."""
    mask = attention_mask.astype(np.float32)[:, :, None]
    summed = (token_embeddings * mask).sum(axis=1)
    return summed / np.maximum(mask.sum(axis=1), np.float32(_MEAN_EPS))


def session_options(threads: int = 1) -> ort.SessionOptions:
    """The serving session settings: `threads` intra-op threads, one inter-op thread,
    sequential execution, every graph optimization (minus `DISABLED_OPTIMIZERS`,
    which is passed to the session itself)."""
    if type(threads) is not int or threads < 1:
        raise ValueError(f"threads must be an int >= 1, got {threads!r}")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return opts


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """(b, d) -> rows divided by max(||row||_2, 1e-12), float32."""
    norms = np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float32))[:, None]
    return x / np.maximum(norms, np.float32(_NORM_EPS))


class OnnxSentenceEncoder:
    """Texts -> (n, d) float32 sentence embeddings with one ONNX variant.

    Build with `load_encoder(folder)` (verified) or `from_bytes` (the exporter's
    parity check, before a manifest exists). `encoder_id` names the embedding
    space of this variant; vectors from different ids must not be mixed.
    """

    def __init__(self, session: ort.InferenceSession, tokenizer: Tokenizer,
                 config: EncoderConfig, variant: str) -> None:
        self.session = session
        self.tokenizer = tokenizer
        self.config = config
        self.variant = variant
        self.encoder_id = config.encoder_ids[variant]
        self.dimension = config.dimension
        self.max_seq_length = config.max_seq_length
        self.per_text = variant in config.per_text
        self._input_names = tuple(i.name for i in session.get_inputs())
        self._output_name = session.get_outputs()[0].name
        self._encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
        # set by load_encoder: the golden-vector check on this machine, and when another
        # variant was asked for but failed it, which and why
        self.golden: GoldenCheck | None = None
        self.golden_status = "unchecked"  # passed | absent | skipped | unchecked
        self.requested_variant = variant
        self.variant_reason: str | None = None

    @classmethod
    def from_bytes(cls, onnx_model: bytes, tokenizer_json: str, config: EncoderConfig, *,
                   variant: str = "fp32", threads: int = 1,
                   disabled_optimizers: Sequence[str] = DISABLED_OPTIMIZERS
                   ) -> OnnxSentenceEncoder:
        """An encoder from in-memory files; `threads` = onnxruntime intra-op threads (>= 1).

        `disabled_optimizers`: onnxruntime graph transformers to leave out (default
        `DISABLED_OPTIMIZERS`; the benchmark passes () to time the stock session).
        """
        if variant not in config.files:
            raise EncoderArtifactError("variant", f"variant {variant!r} not in the artifact; "
                                                  f"available: {sorted(config.files)}")
        opts = session_options(threads)
        try:
            tokenizer = Tokenizer.from_str(tokenizer_json)
        except Exception as exc:  # tokenizers raises its own Exception type
            raise EncoderArtifactError("tokenizer", f"cannot parse tokenizer: {exc}") from None
        # Truncation from the encoder config, not from tokenizer.json (which may
        # carry the upstream 128); padding by hand per chunk (see `encode`).
        tokenizer.enable_truncation(max_length=config.max_seq_length)
        tokenizer.no_padding()
        try:
            session = ort.InferenceSession(onnx_model, sess_options=opts,
                                           providers=["CPUExecutionProvider"],
                                           disabled_optimizers=list(disabled_optimizers))
        except Exception as exc:  # onnxruntime raises Fail/InvalidGraph/... subclasses
            raise EncoderArtifactError("onnx_load", f"onnxruntime cannot load the "
                                                    f"{variant} graph: {exc}") from None
        names = {i.name for i in session.get_inputs()}
        if not names <= set(INPUT_NAMES) or "input_ids" not in names:
            raise EncoderArtifactError("onnx_inputs", f"graph inputs {sorted(names)}, "
                                                      f"expected a subset of {INPUT_NAMES}")
        return cls(session, tokenizer, config, variant)

    def token_counts(self, texts: Sequence[str]) -> np.ndarray:
        """(n,) int: tokens each text is encoded with (after truncation, incl. [CLS]/[SEP])."""
        return np.array([len(e.ids) for e in self._tokenize(_checked(texts))], dtype=np.int64)

    def tokenize(self, texts: Sequence[str]) -> list:
        """The tokenizer's encodings of `texts` (truncated, unpadded; `.ids`, `.type_ids`)."""
        return self._tokenize(_checked(texts))

    def _tokenize(self, texts: list[str]) -> list:
        # encode_batch_fast (tokenizers >= 0.21) skips the character offsets, which
        # nothing here reads: same ids, 0.13 vs 0.17 ms for a 128-token prompt.
        return self._encode_batch(texts)

    def encode(self, texts: Sequence[str], *, batch_size: int = 32) -> np.ndarray:
        """(n,) texts -> (n, d) float32 embeddings, in input order; n = 0 gives (0, d).

        Texts are sorted by token count and run in chunks of `batch_size`, each
        padded to its own longest member, so short prompts pay for no padding.
        A `per_text` variant (int8) runs one text per call whatever `batch_size`,
        so each vector depends on its text alone.
        """
        texts = _checked(texts)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if self.per_text:
            batch_size = 1
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        if not texts:
            return out
        encodings = self._tokenize(texts)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64,
                              count=len(encodings))
        order = np.argsort(-lengths, kind="stable")
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            out[rows] = self._encode_chunk([encodings[i] for i in rows], int(lengths[rows[0]]))
        return out

    def encode_one(self, text: str) -> np.ndarray:
        """One text -> (d,) float32 embedding (the serving hot path)."""
        return self.encode([text])[0]

    def _encode_chunk(self, encodings: list, width: int) -> np.ndarray:
        # Why by hand: the tokenizer's own padding pads a whole encode_batch call
        # to one length; per-chunk padding keeps each chunk as short as its longest text.
        b = len(encodings)
        if b == 1:  # the serving path: one text, no padding, every mask entry 1
            enc = encodings[0]
            ids = np.array(enc.ids, dtype=np.int64)[None, :]
            feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                     "token_type_ids": np.array(enc.type_ids, dtype=np.int64)[None, :]}
        else:
            feeds = {"input_ids": np.full((b, width), self.config.pad_id, dtype=np.int64),
                     "attention_mask": np.zeros((b, width), dtype=np.int64),
                     "token_type_ids": np.zeros((b, width), dtype=np.int64)}
            for r, enc in enumerate(encodings):
                n = len(enc.ids)
                feeds["input_ids"][r, :n] = enc.ids
                feeds["attention_mask"][r, :n] = 1
                feeds["token_type_ids"][r, :n] = enc.type_ids
        hidden = self.session.run([self._output_name],
                                  {k: feeds[k] for k in self._input_names})[0]  # (b, t, d)
        if b == 1:  # mean_pool with an all-ones mask, without the (1, t, d) multiply: same bits
            pooled = hidden.sum(axis=1) / np.float32(hidden.shape[1])
        else:
            pooled = mean_pool(hidden, feeds["attention_mask"])
        if pooled.shape[1] != self.dimension:
            raise EncoderArtifactError("dimension", f"graph gives {pooled.shape[1]} dims, "
                                                    f"config says {self.dimension}")
        return l2_normalize(pooled) if self.config.normalize else pooled


def _checked(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise TypeError("encode takes a sequence of texts; use encode_one for a single string")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"text {i} is {type(t).__name__}, not str")
    return texts


def check_golden(encoder: OnnxSentenceEncoder, golden: dict) -> GoldenCheck:
    """Re-run the artifact's golden texts through `encoder` on this machine.

    Checked (bounds from golden.json `tolerances`): token ids equal, bit for bit
    (the tokenizer is not CPU-dependent); the cosine of each vector to the one
    the exporting machine got for the same variant (`<variant>_min_cosine`);
    for int8 also its quality against the sentence-transformers reference
    (`int8_reference_mean_cosine` and `int8_reference_min_cosine_prompts` over
    the prompts, `int8_reference_min_cosine_edge_cases` over the edge cases),
    i.e. the export gates measured again on the serving CPU, whose kernels
    decide int8's numbers.
    """
    with Timer() as timer:
        cases = golden["cases"]
        tol = golden["tolerances"]
        texts = [str(c["input"]["text"]) for c in cases]
        ids = [list(e.ids) for e in encoder.tokenize(texts)]
        figures: dict[str, Any] = {
            "n_cases": len(cases), "variant": encoder.variant,
            "token_ids_equal_share": float(np.mean([a == c["expected"].get("token_ids")
                                                    for a, c in zip(ids, cases, strict=True)]))}
        bounds: dict[str, tuple[str, float]] = {"token_ids_equal_share": (">=", 1.0)}
        # one text per call: the serving path, and 2.5x faster than one padded batch here
        got = np.stack([encoder.encode_one(t) for t in texts])
        v = encoder.variant
        expected = [c["expected"].get(v) for c in cases]
        key = f"{v}_min_cosine"
        if all(isinstance(e, list) and len(e) == encoder.dimension for e in expected):
            figures[key] = float(row_cosines(np.array(expected), got).min())
        bounds[key] = (">=", float(tol.get(key, 1.0)))
        if v == "int8":
            ref = np.array([c["expected"]["reference"] for c in cases], dtype=np.float64)
            cos = row_cosines(ref, got)
            prompt = np.array([c["input"].get("part", "prompt") == "prompt" for c in cases])
            for name, part, stat in (("int8_reference_mean_cosine", prompt, np.mean),
                                     ("int8_reference_min_cosine_prompts", prompt, np.min),
                                     ("int8_reference_min_cosine_edge_cases", ~prompt, np.min)):
                if name in tol:
                    figures[name] = float(stat(cos[part])) if part.any() else None
                    bounds[name] = (">=", float(tol[name]))
    return check(figures, bounds, timer.seconds)


def load_encoder(folder: str | Path, *, variant: str = "fp32", threads: int = 1,
                 hmac_key: bytes | None = None, now: datetime | None = None,
                 check_golden_vectors: bool = True) -> OnnxSentenceEncoder:
    """Verify `folder` (manifest kind `encoder`) and load one variant for serving.

    With `check_golden_vectors` (the default) the artifact's golden vectors are
    re-checked on this machine (`check_golden`; the result is `encoder.golden`,
    its cost `encoder.golden.seconds`). A variant other than fp32 that misses
    them is not served: the fp32 variant is loaded instead (its own check must
    pass), with `requested_variant` and `variant_reason` = `golden_mismatch`
    saying so. An artifact without golden.json (exported before they existed)
    loads with `golden_status` "absent".

    Raises `ManifestError` (verification) or `EncoderArtifactError` (verified
    but unusable: bad config, missing variant, graph onnxruntime cannot load,
    dimension differing from the manifest's `outputs.dimension`, fp32 missing its
    golden vectors: reason `golden_mismatch`).
    """
    folder = Path(folder)
    manifest = verify_manifest(folder, hmac_key=hmac_key, now=now, required_kind=KIND)
    try:
        raw = json.loads(read_verified_file(folder, manifest, CONFIG_FILE).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise EncoderArtifactError("encoder_config", f"{CONFIG_FILE} is not JSON: {exc}") from None
    config = EncoderConfig.from_dict(raw)
    listed = manifest["outputs"].get("dimension")
    if listed != config.dimension:
        raise EncoderArtifactError("dimension", f"manifest outputs.dimension {listed!r} != "
                                                f"{CONFIG_FILE} dimension {config.dimension}")
    if variant not in config.files:
        raise EncoderArtifactError("variant", f"variant {variant!r} not in the artifact; "
                                              f"available: {sorted(config.files)}")
    tokenizer_json = read_verified_file(folder, manifest, TOKENIZER_FILE).decode("utf-8")

    def build(v: str) -> OnnxSentenceEncoder:
        onnx_model = read_verified_file(folder, manifest, config.files[v])
        return OnnxSentenceEncoder.from_bytes(onnx_model, tokenizer_json, config, variant=v,
                                              threads=threads)

    encoder = build(variant)
    if not check_golden_vectors:
        encoder.golden_status = "skipped"
        return encoder
    try:
        golden = read_golden(folder, manifest, kind=KIND)
    except GoldenError as exc:
        if exc.reason != "golden_absent":
            raise EncoderArtifactError(exc.reason, exc.message) from None
        encoder.golden_status = "absent"
        return encoder
    result = check_golden(encoder, golden)
    if not result.ok and variant != "fp32":
        missed = result
        encoder = build("fp32")
        result = check_golden(encoder, golden)
        encoder.requested_variant, encoder.variant_reason = variant, MISMATCH
        result.figures[f"{variant}_check"] = missed.as_dict()
    encoder.golden = result
    if not result.ok:
        raise EncoderArtifactError(MISMATCH, f"{encoder.variant} encoder misses its golden "
                                             f"vectors on this CPU: {result.failed} "
                                             f"{ {k: result.figures.get(k) for k in result.failed} }")
    encoder.golden_status = "passed"
    return encoder
