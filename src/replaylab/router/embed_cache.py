"""Prompt embeddings without re-encoding: a content-hash cache and the ledger's own column.

Cache key: sha256(encoder_id, 0x1f, normalize_text(text)), 32 bytes. The
encoder id is part of the key, so a cache opened for another encoder (or the
int8 variant, `...+int8`) never returns this one's vectors. `normalize_text`
only strips surrounding whitespace, which the WordPiece tokenizer of MiniLM
ignores anyway (a test checks the embeddings are identical): equal keys imply
equal embeddings. Nothing coarser (case folding, Unicode forms) is applied,
since that is a property of one tokenizer, not of text.

Storage: new entries live in memory until `flush()`, which writes one segment
into the cache folder: `<encoder tag>-<time_ns>-<pid>.vecs.npy` (k, d) float32
and `.keys.npy` (k, 32) uint8, each written to a temporary file and renamed;
the keys file is written last, so a segment without it does not exist. On
open, every segment of this encoder (file names carry sha256(encoder_id)[:16])
is indexed: keys read into a dict, vectors memory-mapped (`np.load(mmap_mode="r")`),
so a large cache costs index memory only. A segment that does not match its
keys, or has another dimension, is skipped and counted (`skipped_segments`):
a cache must never break encoding. Several processes may share a folder
(segment names do not collide); within one process a lock guards the index.

`CachedEncoder` wraps any encoder with `encoder_id`, `dimension` and
`encode(texts) -> (n, d)`: it encodes only the misses (each distinct text once).
`cached_embed` is the `embed` callable the router pipeline trains with.

`embeddings_from_ledger` is the path for ledgers that carry `prompt_embedding`
and `embedding_model`: it checks the model id, dimension, finiteness and unit
norm, and returns an (n, d) float32 matrix, or says clearly why it cannot.
numpy and the standard library only (pandas frames are read by column access).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

KEY_BYTES = 32
_VECS, _KEYS = ".vecs.npy", ".keys.npy"


class Encoder(Protocol):
    """What `CachedEncoder` needs: an id naming the embedding space and `encode`."""

    encoder_id: str
    dimension: int

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


def normalize_text(text: str) -> str:
    """The text as the cache keys it: surrounding whitespace removed."""
    return text.strip()


def content_key(text: str, encoder_id: str) -> bytes:
    """32-byte sha256 of (encoder_id, normalized text): the cache key."""
    h = hashlib.sha256(encoder_id.encode("utf-8"))
    h.update(b"\x1f")
    h.update(normalize_text(text).encode("utf-8", "surrogatepass"))
    return h.digest()


def _encoder_tag(encoder_id: str) -> str:
    return hashlib.sha256(encoder_id.encode("utf-8")).hexdigest()[:16]


def _save_atomic(path: Path, array: np.ndarray) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, array, allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class EmbeddingCache:
    """Embeddings of one encoder keyed by content hash; on disk when given a folder.

    `path=None` keeps everything in memory. `hits` / `misses` count lookups.
    """

    def __init__(self, encoder_id: str, dimension: int, path: str | Path | None = None) -> None:
        if not isinstance(encoder_id, str) or not encoder_id:
            raise ValueError(f"encoder_id must be a non-empty string, got {encoder_id!r}")
        if type(dimension) is not int or dimension < 1:
            raise ValueError(f"dimension must be an int >= 1, got {dimension!r}")
        self.encoder_id = encoder_id
        self.dimension = dimension
        self.path = Path(path) if path is not None else None
        self.hits = 0
        self.misses = 0
        self.skipped_segments: list[str] = []
        self._lock = threading.RLock()
        self._segments: list[np.ndarray] = []          # (k, d) float32 memory maps
        self._index: dict[bytes, tuple[int, int]] = {}  # key -> (segment, row)
        self._pending: dict[bytes, np.ndarray] = {}     # key -> (d,) float32, not yet on disk
        if self.path is not None:
            self.path.mkdir(parents=True, exist_ok=True)
            for keys_file in sorted(self.path.glob(f"{_encoder_tag(encoder_id)}-*{_KEYS}")):
                self._open_segment(keys_file)

    def _open_segment(self, keys_file: Path) -> None:
        vecs_file = keys_file.with_name(keys_file.name.removesuffix(_KEYS) + _VECS)
        try:
            keys = np.load(keys_file, allow_pickle=False)
            vecs = np.load(vecs_file, mmap_mode="r", allow_pickle=False)
            ok = (keys.dtype == np.uint8 and keys.ndim == 2 and keys.shape[1] == KEY_BYTES
                  and vecs.dtype == np.float32 and vecs.shape == (len(keys), self.dimension))
        except (OSError, ValueError):
            ok = False
        if not ok:
            self.skipped_segments.append(keys_file.name)
            return
        seg = len(self._segments)
        self._segments.append(vecs)
        for row, key in enumerate(keys):
            self._index[key.tobytes()] = (seg, row)

    @property
    def segments(self) -> tuple[np.ndarray, ...]:
        """The (k, d) float32 segments opened so far (memory maps of the files on disk)."""
        with self._lock:
            return tuple(self._segments)

    def __len__(self) -> int:
        with self._lock:
            return len(self._index) + len(self._pending)

    def __contains__(self, text: str) -> bool:
        key = content_key(text, self.encoder_id)
        with self._lock:
            return key in self._pending or key in self._index

    def _get_key(self, key: bytes) -> np.ndarray | None:
        vec = self._pending.get(key)
        if vec is not None:
            return vec
        where = self._index.get(key)
        if where is None:
            return None
        seg, row = where
        return np.array(self._segments[seg][row], dtype=np.float32)  # copy out of the mmap

    def get(self, text: str) -> np.ndarray | None:
        """(d,) float32 embedding of `text`, or None (counted as a miss)."""
        vectors, found = self.lookup([text])
        return vectors[0] if found[0] else None

    def lookup(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(n,) texts -> ((n, d) float32, zero rows where absent; (n,) bool found)."""
        keys = [content_key(t, self.encoder_id) for t in texts]
        out = np.zeros((len(keys), self.dimension), dtype=np.float32)
        found = np.zeros(len(keys), dtype=bool)
        with self._lock:
            for i, key in enumerate(keys):
                vec = self._get_key(key)
                if vec is not None:
                    out[i], found[i] = vec, True
            self.hits += int(found.sum())
            self.misses += int((~found).sum())
        return out, found

    def put(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        """Store (n, d) `vectors` for (n,) `texts` (in memory until `flush`)."""
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.shape != (len(texts), self.dimension):
            raise ValueError(f"vectors shape {vectors.shape}, expected "
                             f"({len(texts)}, {self.dimension})")
        if not np.isfinite(vectors).all():
            raise ValueError("refusing to cache non-finite embeddings")
        with self._lock:
            for text, vec in zip(texts, vectors, strict=True):
                key = content_key(text, self.encoder_id)
                if key not in self._index:
                    self._pending[key] = vec.copy()

    def flush(self) -> Path | None:
        """Write pending entries as one new segment; its keys file, or None if nothing pending."""
        with self._lock:
            if self.path is None or not self._pending:
                return None
            keys = list(self._pending)
            vecs = np.stack([self._pending[k] for k in keys]).astype(np.float32)
            key_arr = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), KEY_BYTES)
            stem = f"{_encoder_tag(self.encoder_id)}-{time.time_ns()}-{os.getpid()}"
            vecs_file, keys_file = self.path / (stem + _VECS), self.path / (stem + _KEYS)
            _save_atomic(vecs_file, vecs)
            _save_atomic(keys_file, key_arr)  # last: the segment exists from here on
            self._pending.clear()
            self._open_segment(keys_file)
            return keys_file


class CachedEncoder:
    """`encoder` behind `cache`: the same (n, d) output, encoding only what is not cached."""

    def __init__(self, encoder: Encoder, cache: EmbeddingCache) -> None:
        if encoder.encoder_id != cache.encoder_id or encoder.dimension != cache.dimension:
            raise ValueError(f"cache is for {cache.encoder_id!r} ({cache.dimension}-d), encoder "
                             f"is {encoder.encoder_id!r} ({encoder.dimension}-d)")
        self.encoder = encoder
        self.cache = cache
        self.encoder_id = encoder.encoder_id
        self.dimension = encoder.dimension

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(n,) texts -> (n, d) float32; misses are encoded once each and cached."""
        if isinstance(texts, str):
            raise TypeError("encode takes a sequence of texts; use encode_one for one string")
        texts = list(texts)
        out, found = self.cache.lookup(texts)
        if not found.all():
            # one encoder call for the distinct missing texts (by cache key)
            first: dict[bytes, int] = {}
            for i in np.flatnonzero(~found):
                first.setdefault(content_key(texts[i], self.encoder_id), int(i))
            todo = list(first.values())
            fresh = np.asarray(self.encoder.encode([texts[i] for i in todo]), dtype=np.float32)
            self.cache.put([texts[i] for i in todo], fresh)
            row_of = {k: r for r, k in enumerate(first)}
            for i in np.flatnonzero(~found):
                out[i] = fresh[row_of[content_key(texts[i], self.encoder_id)]]
        return out

    def encode_one(self, text: str) -> np.ndarray:
        """One text -> (d,) float32."""
        return self.encode([text])[0]


def cached_embed(encoder: Encoder, cache_dir: str | Path
                 ) -> tuple[Callable[[list[str]], np.ndarray], EmbeddingCache]:
    """(embed, cache): `embed(texts)` -> (n, d) float32 through an `EmbeddingCache` in
    `cache_dir`, writing each call's new vectors to disk before it returns (a later
    process reuses them even if this one dies). The cache counts `hits` and `misses`."""
    cache = EmbeddingCache(encoder.encoder_id, encoder.dimension, path=cache_dir)
    cached = CachedEncoder(encoder, cache)

    def embed(texts: list[str]) -> np.ndarray:
        out = cached.encode(texts)
        cache.flush()
        return out

    return embed, cache


def _column(rows: Any, name: str) -> list:
    if isinstance(rows, Sequence) and not isinstance(rows, str | bytes):
        return [r.get(name) if isinstance(r, Mapping) else None for r in rows]
    if name not in getattr(rows, "columns", ()):
        raise ValueError(f"ledger has no {name!r} column")
    return list(rows[name])


def _is_null(value: Any) -> bool:
    if value is None or type(value).__name__ == "NAType":  # pandas.NA without importing pandas
        return True
    return isinstance(value, float) and value != value  # NaN scalar (pandas' missing)


def embeddings_from_ledger(rows: Any, *, encoder_id: str, dimension: int,
                           allow_missing: bool = False, norm_tolerance: float | None = 1e-3
                           ) -> tuple[np.ndarray, np.ndarray]:
    """Ledger `prompt_embedding` + `embedding_model` -> ((n, d) float32, (n,) bool present).

    `rows`: a DataFrame or a list of mappings. Every present embedding must
    name `encoder_id` in `embedding_model`, have `dimension` finite values and,
    with `norm_tolerance`, unit L2 norm within it (the encoder normalizes; a
    raw vector here means another pipeline made it). A row without an
    embedding is an error unless `allow_missing` (then its row is zeros and
    `present` is False: encode those from text, or route without them).
    Any violation is a ValueError naming the rows and what was found.
    """
    from replaylab.contracts.columns import Ledger  # lazy: contracts/__init__ imports pandas

    if isinstance(rows, Sequence) and not isinstance(rows, str | bytes):
        if rows and not all(isinstance(r, Mapping) for r in rows):
            raise ValueError("rows must be a DataFrame or a list of mappings")
    embeddings = _column(rows, Ledger.PROMPT_EMBEDDING)
    models = _column(rows, Ledger.EMBEDDING_MODEL) if embeddings else []
    out = np.zeros((len(embeddings), dimension), dtype=np.float32)
    present = np.array([not _is_null(e) for e in embeddings], dtype=bool)
    if not allow_missing and not present.all():
        missing = np.flatnonzero(~present)
        raise ValueError(f"{len(missing)} of {len(present)} rows have no prompt_embedding "
                         f"(first at row {missing[0]}); pass allow_missing=True to encode "
                         "those from text instead")
    wrong = _count_other_models(models, present, encoder_id)
    if wrong:
        raise ValueError(f"embedding_model differs from the encoder {encoder_id!r}: found "
                         f"{wrong}; embeddings of another encoder live in another space "
                         "and cannot be mixed: re-encode from prompt_text")
    for i in np.flatnonzero(present):
        vec = _as_vector(embeddings[i], i, dimension)
        out[i] = vec
    if present.any():
        if not np.isfinite(out[present]).all():
            bad = np.flatnonzero(present & ~np.isfinite(out).all(axis=1))
            raise ValueError(f"non-finite prompt_embedding values in rows {bad[:5].tolist()}")
        if norm_tolerance is not None:
            norms = np.linalg.norm(out[present].astype(np.float64), axis=1)
            off = np.flatnonzero(np.abs(norms - 1.0) > norm_tolerance)
            if len(off):
                rows_off = np.flatnonzero(present)[off]
                raise ValueError(f"{len(off)} prompt_embedding rows are not L2-normalized "
                                 f"(first: row {rows_off[0]}, norm {norms[off[0]]:.4f}); "
                                 f"{encoder_id!r} embeddings have norm 1")
    return out, present


def _count_other_models(models: list, present: np.ndarray, encoder_id: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for i in np.flatnonzero(present):
        name = models[i]
        label = "<null>" if _is_null(name) else str(name)
        if label != encoder_id:
            counts[label] = counts.get(label, 0) + 1
    return counts


def _as_vector(value: Iterable[float], row: int, dimension: int) -> np.ndarray:
    try:
        vec = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"row {row}: prompt_embedding is not a list of numbers ({exc})") from None
    if vec.shape != (dimension,):
        raise ValueError(f"row {row}: prompt_embedding has shape {vec.shape}, the encoder "
                         f"gives ({dimension},)")
    return vec
