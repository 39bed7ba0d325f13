"""Serving-side static encoder: WordPiece by table, a token-embedding lookup, mean pooling (numpy).

The static tier (docs/design/router-encoder.md, "Static tier") is all-MiniLM-L6-v2
distilled by model2vec into one vector per vocabulary token. Encoding a text
is, with the numbers of `static_config.json` (docs/specs/router-scorer.md has the
same rules for engines in other languages):

1. keep the first `max_chars` codepoints (model2vec's cut: max_tokens x the
   vocabulary's median token length);
2. normalize every codepoint by `charmap.tsv` (`replaylab.router.charmap`:
   the BertNormalizer as a table) and split words by the table's classes
   (whitespace ends a word, punctuation is a word of its own);
3. WordPiece each word: greedy longest match in `vocab.txt`, continuation
   pieces prefixed `##`; a word longer than `max_input_chars_per_word` or with
   no match at some position is one `[UNK]`;
4. keep the first `max_tokens` ids, then drop `[UNK]` (`drop_unk`);
5. s = the sum of the token rows of `embeddings.safetensors`, in float64, in
   token order; no token -> the zero vector;
6. with `normalize` (always, for MiniLM's distillation): s / ||s||_2 in float64
   (the mean's 1/n cancels; s = 0 stays 0), else s / n; then round to float32.

`CharmapTokenizer` gives the ids of HF `tokenizers` for the same tokenizer
(checked at export on every parity text, and at load on the golden texts)
without it: `str.translate` with the table, one regex for the words, and two
bounded caches: the ids of each whitespace-free chunk of raw text (a chunk's
ids depend on the chunk alone, since ASCII whitespace always separates words)
and the WordPiece ids of each normalized word. A hit costs ~30 ns a chunk in C
(`ids_array`: split, join of cached id bytes, one `frombuffer`), so a 128-token
text tokenizes in ~9 µs when its chunks were seen before.

`load_static_encoder(folder)` verifies the folder's manifest (kind `encoder`)
and reads every file through `read_verified_file`; with golden vectors it
re-checks them (token ids equal, vectors within `static_min_cosine`). Failures
raise `ManifestError` / `EncoderArtifactError`, which the router turns into its
fallback. Imports: numpy and the standard library only.
"""

from __future__ import annotations

import json
import math
import re
import string
import threading
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

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

CONFIG_FILE = "static_config.json"
CONFIG_FORMAT = 1
TIER = "static"
VARIANT = "static"  # the name golden vectors and reports use for this tier's vectors
CHARMAP_HEADER = "# replaylab charmap 1"
WORD_CACHE = 262_144  # raw chunks whose ids are kept (~40 MB at most); cleared when full
WORDPIECE_CACHE = 262_144  # normalized words whose WordPiece ids are kept (~40 MB at most); cleared when full
ID_BYTES = np.dtype(np.intp).itemsize
_ASCII_SPACE = re.compile(r"[ \t\n\r]+")


def is_static_folder(folder: str | Path) -> bool:
    """True when `folder` holds a static-tier encoder (its config file is there)."""
    return (Path(folder) / CONFIG_FILE).is_file()


def read_safetensors(data: bytes) -> dict[str, np.ndarray]:
    """safetensors bytes -> {name: array} (F32 / F64 / I64 only, little-endian, C order).

    Why by hand: the format is an 8-byte length, a JSON header and raw data; the
    `safetensors` package would be one more runtime dependency for 20 lines.
    """
    if len(data) < 8:
        raise EncoderArtifactError("safetensors", "file shorter than its 8-byte header length")
    n = int.from_bytes(data[:8], "little")
    if n <= 0 or 8 + n > len(data):
        raise EncoderArtifactError("safetensors", f"header length {n} outside the file")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise EncoderArtifactError("safetensors", f"header is not JSON: {exc}") from None
    dtypes = {"F32": "<f4", "F64": "<f8", "I64": "<i8"}
    out = {}
    body = memoryview(data)[8 + n:]
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = np.dtype(dtypes[spec["dtype"]])
            shape = tuple(int(s) for s in spec["shape"])
            begin, end = (int(x) for x in spec["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise EncoderArtifactError("safetensors", f"tensor {name!r}: bad entry {spec!r}"
                                       ) from None
        if not (0 <= begin <= end <= len(body)) or end - begin != dtype.itemsize * int(
                np.prod(shape, dtype=np.int64)):
            raise EncoderArtifactError("safetensors", f"tensor {name!r}: offsets {begin}..{end}"
                                                      f" do not hold {shape} {spec['dtype']}")
        out[name] = np.frombuffer(body[begin:end], dtype=dtype).reshape(shape).astype(
            dtype.newbyteorder("="), copy=True)
    return out


def _char_class(codepoints: list[int]) -> str:
    """A regex character class body matching exactly `codepoints` (ranges merged)."""
    parts, cps = [], sorted(set(codepoints))
    i = 0
    while i < len(cps):
        j = i
        while j + 1 < len(cps) and cps[j + 1] == cps[j] + 1:
            j += 1
        a, b = re.escape(chr(cps[i])), re.escape(chr(cps[j]))
        parts.append(a if i == j else f"{a}-{b}")
        i = j + 1
    return "".join(parts)


def parse_charmap(text: str) -> tuple[dict[int, str | None], list[int], list[int]]:
    """charmap.tsv -> (str.translate table, whitespace codepoints, punctuation codepoints)."""
    lines = text.split("\n")
    if not lines or lines[0] != CHARMAP_HEADER:
        raise EncoderArtifactError("charmap", f"charmap.tsv must start with {CHARMAP_HEADER!r}")
    table: dict[int, str | None] = {}
    space, punct = [], []
    for k, line in enumerate(lines[1:], start=2):
        if not line:
            continue
        try:
            cp_hex, cls, repl = line.split("\t")
            cp = int(cp_hex, 16)
            out = "".join(chr(int(h, 16)) for h in repl.split())
        except ValueError:
            raise EncoderArtifactError("charmap", f"charmap.tsv line {k}: {line[:60]!r}") from None
        if cls not in ("w", "p", "o"):
            raise EncoderArtifactError("charmap", f"charmap.tsv line {k}: class {cls!r}")
        if out != chr(cp):
            table[cp] = out or None
        if cls == "w":
            space.append(cp)
        elif cls == "p":
            punct.append(cp)
    return table, space, punct


class _ChunkIds(dict):
    """key -> its ids as native `intp` bytes; a missing key is computed and kept.

    A dict subclass whose `__missing__` computes: `map(cache.__getitem__, keys)` then
    runs in C for every hit (~30 ns a key, against ~150 ns for `get` + a Python
    branch + list extend), and `b"".join` of the hits is the id array's buffer. Used
    for raw chunks and for normalized words.
    """

    __slots__ = ("compute",)

    def __missing__(self, key: str) -> bytes:
        return self.compute(key)


class CharmapTokenizer:
    """Text -> WordPiece ids from `charmap.tsv` + `vocab.txt` (module doc, steps 1-4).

    Two bounded caches: raw whitespace-free chunk -> ids (`WORD_CACHE` entries) and
    normalized word -> WordPiece ids (`WORDPIECE_CACHE`); each is cleared when full (a
    serving text's chunks are mostly repeats; a cleared cache only costs recomputation,
    never a different id). Thread-safe: single-key lookups and inserts are atomic in
    CPython, and the one compound step (clear when full) holds a lock.
    """

    def __init__(self, charmap: str, vocab: Sequence[str], *, unk_token: str,
                 prefix: str = "##", max_input_chars_per_word: int = 100,
                 max_chars: int | None = None, max_tokens: int | None = None,
                 drop_unk: bool = True) -> None:
        self.table, space, punct = parse_charmap(charmap)
        self.vocab = {tok: i for i, tok in enumerate(vocab)}
        if unk_token not in self.vocab:
            raise EncoderArtifactError("vocab", f"unk token {unk_token!r} not in vocab.txt")
        self.unk_id = self.vocab[unk_token]
        self.prefix = prefix
        self.max_word = int(max_input_chars_per_word)
        self.max_chars, self.max_tokens, self.drop_unk = max_chars, max_tokens, drop_unk
        w, p = _char_class(space), _char_class(punct)
        self._words = re.compile(f"[{p}]|[^{w}{p}]+" if p else f"[^{w}]+")
        self._cache = _ChunkIds()
        self._cache.compute = self._miss
        self._pieces = _ChunkIds()
        self._pieces.compute = self._word
        self._lock = threading.Lock()
        # each id's native intp bytes: a word's ids are a join of these (no numpy per word)
        self._id_bytes = tuple(i.tobytes() for i in np.arange(len(vocab), dtype=np.intp))
        self._unk = self._id_bytes[self.unk_id]
        self._cut = None if max_tokens is None else int(max_tokens) * ID_BYTES
        # a printable-ASCII chunk normalizes by `str.lower` when the table says so for every
        # printable ASCII character (BERT's: only A-Z change), and is one word when it is
        # alphanumeric (lowercase letters and digits are class `o`): checked here, else the
        # table path serves every chunk
        alnum = string.ascii_lowercase + string.digits
        self.ascii_lower = all(self.table.get(c, chr(c)) == chr(c).lower()
                                for c in range(0x20, 0x7F)) and \
            self._words.findall(alnum) == [alnum]

    def _wordpiece(self, word: str) -> list[int]:
        # Why by hand: HF WordPiece's greedy longest match, 12 lines; no pure-Python
        # package does it on a given vocab without the Rust tokenizers.
        if len(word) > self.max_word:
            return [self.unk_id]
        vocab, ids, start, n = self.vocab, [], 0, len(word)
        while start < n:
            end, found = n, None
            while start < end:
                piece = word[start:end] if start == 0 else self.prefix + word[start:end]
                found = vocab.get(piece)
                if found is not None:
                    break
                end -= 1
            if found is None:
                return [self.unk_id]
            ids.append(found)
            start = end
        return ids

    def _word(self, word: str) -> bytes:  # a normalized word missing from `_pieces`
        whole = self.vocab.get(word) if len(word) <= self.max_word else None
        if whole is not None:  # _wordpiece's first try: the whole word is a token
            ids = self._id_bytes[whole]
        else:
            ids = b"".join(map(self._id_bytes.__getitem__, self._wordpiece(word)))
        self._keep(self._pieces, word, ids, WORDPIECE_CACHE)
        return ids

    def _miss(self, chunk: str) -> bytes:  # a raw chunk missing from `_cache`
        if self.ascii_lower and chunk.isascii() and chunk.isprintable():
            norm = chunk.lower()  # = chunk.translate(self.table) here (checked at init)
            ids = (self._pieces[norm] if norm.isalnum() else
                   b"".join(map(self._pieces.__getitem__, self._words.findall(norm))))
        else:
            ids = b"".join(map(self._pieces.__getitem__,
                               self._words.findall(chunk.translate(self.table))))
        self._keep(self._cache, chunk, ids, WORD_CACHE)
        return ids

    def _keep(self, cache: dict, key: str, value: bytes, limit: int) -> None:
        # a bounded cache: emptied (under the lock, once) when it reaches `limit`
        if len(cache) >= limit:
            with self._lock:
                if len(cache) >= limit:
                    cache.clear()
        cache[key] = value

    def ids_array(self, text: str) -> np.ndarray:
        """Token ids of one text as a read-only (n,) intp array (truncated, [UNK] dropped
        when `drop_unk`): the serving path; `ids` is the same as a list."""
        if not isinstance(text, str):
            raise TypeError(f"text is {type(text).__name__}, not str")
        if self.max_chars is not None:
            text = text[:self.max_chars]
        if not text.isascii():  # isascii is O(1) on CPython's compact strings
            text.encode("utf-8")  # a lone surrogate is no text: UnicodeEncodeError, as HF's
        # chunks between ASCII whitespace; without \t \n \r, str.split(" ") gives the same
        # chunks plus empty ones (runs of spaces), whose ids are empty
        if "\n" in text or "\t" in text or "\r" in text:
            chunks = _ASCII_SPACE.split(text)
        else:
            chunks = text.split(" ")
        raw = b"".join(map(self._cache.__getitem__, chunks))
        if self._cut is not None:
            raw = raw[:self._cut]
        ids = np.frombuffer(raw, dtype=np.intp)
        # bytes.find may also match across two ids (never misses an aligned one): the
        # exact filter runs only when it matches
        if self.drop_unk and raw.find(self._unk) >= 0:
            ids = ids[ids != self.unk_id]
        return ids

    def ids(self, text: str) -> list[int]:
        """Token ids of one text (truncated, [UNK] dropped when `drop_unk`)."""
        return self.ids_array(text).tolist()

    def cache_sizes(self) -> dict[str, int]:
        """Entries held now: `chunks` (<= WORD_CACHE) and `words` (<= WORDPIECE_CACHE)."""
        return {"chunks": len(self._cache), "words": len(self._pieces)}


class StaticSentenceEncoder:
    """Texts -> (n, d) float32 sentence embeddings of the static tier (module doc).

    Same surface as `replaylab.runtime.encoder.OnnxSentenceEncoder` where the
    router and the embedding cache use it: `encoder_id`, `dimension`, `variant`
    ("static"), `encode`, `encode_one`, `token_counts`, `golden`, `golden_status`.
    """

    def __init__(self, tokenizer: CharmapTokenizer, table: np.ndarray, config: dict) -> None:
        self.tokenizer = tokenizer
        self.config = config
        # kept in float32 as in the file (half the memory and cache traffic of a float64
        # copy: 30 MB, and 1 kB a token row); `token_sum` widens each row exactly
        self.table = np.ascontiguousarray(table, dtype=np.float32)
        self.encoder_id = str(config["encoder_id"])
        self.dimension = int(table.shape[1])
        self.normalize = bool(config.get("normalize", True))
        self.variant = VARIANT
        self.tier = TIER
        self.golden: GoldenCheck | None = None
        self.golden_status = "unchecked"
        self.requested_variant: str | None = None
        self.variant_reason: str | None = None

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.tokenizer.ids(t) for t in _checked(texts)]

    def token_counts(self, texts: Sequence[str]) -> np.ndarray:
        return np.array([len(i) for i in self.token_ids(texts)], dtype=np.int64)

    def token_sum(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """(d,) float64 s of step 5: the token rows added in token order, column by column."""
        # a sum over axis 0 of a C-ordered (n, d) array adds the rows in order, column by
        # column, and dtype=float64 widens each float32 row exactly before it is added
        # (numpy casts in buffers of whole rows): the float64 sum of the spec, the bits
        # of a plain loop in another language (a test checks it, also against the
        # float64 table). take of an intp array, not a list (converted first)
        return np.add.reduce(self.table.take(ids, axis=0), axis=0, dtype=np.float64)

    def pool(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Token ids -> (d,) float32 (module doc, steps 5-6)."""
        n = len(ids)
        if not n:
            return np.zeros(self.dimension, dtype=np.float32)
        x = self.token_sum(ids)
        if not self.normalize:
            return (x / n).astype(np.float32)
        # the mean's 1/n cancels in the normalization: s / ||s|| (one rounding fewer)
        norm = math.sqrt(np.dot(x, x))
        if norm > 0.0:
            x /= norm
        return x.astype(np.float32)

    def encode_one(self, text: str) -> np.ndarray:
        return self.pool(self.tokenizer.ids_array(text))

    def encode(self, texts: Sequence[str], *, batch_size: int = 0) -> np.ndarray:  # noqa: ARG002
        """(n,) texts -> (n, d) float32; one text at a time (each vector is its text's alone)."""
        texts = _checked(texts)
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        for i, t in enumerate(texts):
            out[i] = self.encode_one(t)
        return out


def _checked(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise TypeError("encode takes a sequence of texts; use encode_one for a single string")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"text {i} is {type(t).__name__}, not str")
    return texts


_CONFIG_TYPES: dict[str, type] = {
    "model_id": str, "encoder_id": str, "dimension": int, "vocab_size": int, "unk_token": str,
    "continuing_subword_prefix": str, "max_input_chars_per_word": int, "max_chars": int,
    "max_tokens": int, "drop_unk": bool, "normalize": bool, "pooling": str,
    "embeddings_file": str, "tensor": str, "charmap_file": str, "vocab_file": str}


def parse_static_config(raw: Any) -> dict:
    """Check `static_config.json`; a missing or ill-typed field is an EncoderArtifactError."""
    def bad(why: str) -> EncoderArtifactError:
        return EncoderArtifactError("encoder_config", f"{CONFIG_FILE}: {why}")

    if not isinstance(raw, dict):
        raise bad("not a JSON object")
    if raw.get("format") != CONFIG_FORMAT or raw.get("tier") != TIER:
        raise bad(f"format {raw.get('format')!r} tier {raw.get('tier')!r}; this runtime reads "
                  f"format {CONFIG_FORMAT}, tier {TIER!r}")
    for name, typ in _CONFIG_TYPES.items():
        if type(raw.get(name)) is not typ:
            raise bad(f"field {name!r} missing or not {typ.__name__}: {raw.get(name)!r}")
    if raw["pooling"] != "mean":
        raise EncoderArtifactError("unsupported_pooling", f"pooling {raw['pooling']!r}")
    return raw


def static_encoder_from_files(config: dict, charmap: str, vocab_text: str,
                              embeddings: bytes) -> StaticSentenceEncoder:
    """An encoder from the folder's file contents (the exporter's check, before a manifest)."""
    config = parse_static_config(config)
    vocab = vocab_text.split("\n")
    if vocab and vocab[-1] == "":
        vocab = vocab[:-1]
    if len(vocab) != config["vocab_size"]:
        raise EncoderArtifactError("vocab", f"vocab.txt has {len(vocab)} tokens, config says "
                                            f"{config['vocab_size']}")
    tensors = read_safetensors(embeddings)
    table = tensors.get(config["tensor"])
    want = (config["vocab_size"], config["dimension"])
    if table is None or table.shape != want or table.dtype != np.float32:
        raise EncoderArtifactError("dimension", f"tensor {config['tensor']!r} is "
                                                f"{None if table is None else table.shape}, "
                                                f"expected float32 {want}")
    tok = CharmapTokenizer(charmap, vocab, unk_token=config["unk_token"],
                           prefix=config["continuing_subword_prefix"],
                           max_input_chars_per_word=config["max_input_chars_per_word"],
                           max_chars=config["max_chars"], max_tokens=config["max_tokens"],
                           drop_unk=config["drop_unk"])
    return StaticSentenceEncoder(tok, table, config)


def check_static_golden(encoder: StaticSentenceEncoder, golden: dict) -> GoldenCheck:
    """Token ids equal bit for bit, and each vector's cosine to the exporting machine's
    >= `static_min_cosine` (float rounding only: the arithmetic is fixed by the spec)."""
    with Timer() as timer:
        cases = golden["cases"]
        texts = [str(c["input"]["text"]) for c in cases]
        ids = encoder.token_ids(texts)
        figures: dict[str, Any] = {
            "n_cases": len(cases), "variant": VARIANT,
            "token_ids_equal_share": float(np.mean([a == c["expected"].get("token_ids")
                                                    for a, c in zip(ids, cases, strict=True)]))}
        expected = [c["expected"].get(VARIANT) for c in cases]
        got = np.stack([encoder.pool(i) for i in ids])
        if all(isinstance(e, list) and len(e) == encoder.dimension for e in expected):
            figures["static_min_cosine"] = float(row_cosines(np.array(expected), got).min())
    return check(figures, {"token_ids_equal_share": (">=", 1.0),
                           "static_min_cosine": (">=", float(golden["tolerances"].get(
                               "static_min_cosine", 1.0)))}, timer.seconds)


def load_static_encoder(folder: str | Path, *, hmac_key: bytes | None = None,
                        now: datetime | None = None,
                        check_golden_vectors: bool = True) -> StaticSentenceEncoder:
    """Verify `folder` (manifest kind `encoder`, `static_config.json`) and load it.

    Raises `ManifestError` (verification) or `EncoderArtifactError` (verified but
    unusable, or missing its golden vectors on this machine: `golden_mismatch`).
    """
    folder = Path(folder)
    manifest = verify_manifest(folder, hmac_key=hmac_key, now=now, required_kind=KIND)

    def text(name: str) -> str:
        try:
            return read_verified_file(folder, manifest, name).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EncoderArtifactError("encoder_config", f"{name} is not UTF-8: {exc}") from None

    try:
        config = json.loads(text(CONFIG_FILE))
    except ValueError as exc:
        raise EncoderArtifactError("encoder_config", f"{CONFIG_FILE} is not JSON: {exc}") from None
    config = parse_static_config(config)
    if manifest["outputs"].get("dimension") != config["dimension"]:
        raise EncoderArtifactError("dimension", f"manifest outputs.dimension "
                                                f"{manifest['outputs'].get('dimension')!r} != "
                                                f"{config['dimension']}")
    encoder = static_encoder_from_files(
        config, text(config["charmap_file"]), text(config["vocab_file"]),
        read_verified_file(folder, manifest, config["embeddings_file"]))
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
    result = check_static_golden(encoder, golden)
    encoder.golden = result
    if not result.ok:
        raise EncoderArtifactError(MISMATCH, f"static encoder misses its golden vectors here: "
                                             f"{result.failed}")
    encoder.golden_status = "passed"
    return encoder
