"""The router head as served: one scorer, `HeadScorer`, over either form the artifact ships.

The head is one function (docs/specs/router-scorer.md, "Head"): an embedding, a category
code and a prompt length in, P(success) per candidate out. The router artifact ships it
twice, and `HeadScorer` runs either:

- `onnx` (`HeadScorer.from_onnx`): the graph `head.onnx` in onnxruntime (the minilm tier);
- `numpy` (`HeadScorer.from_tensors`): the forward pass of `head.safetensors` in numpy,
  no ML runtime (the static tier).

`replaylab.runtime.router.Router` serves with it, and training makes every reported learned
decision with the same object (`SuccessHead.served_`, built by
`replaylab.artifacts.router_head.served_head`), so training judges the graph it ships. A
scorer pickles as its source (graph bytes or tensors, vocabulary, threads) and is rebuilt
once per process on the other side (a Dask worker scores many partitions with one).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from replaylab.contracts.manifest import ManifestError

HEAD_TENSORS_FILE = "head.safetensors"
KINDS = ("onnx", "numpy")


def meta_arrays(meta: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(category (n,) object, prompt_tokens (n,) float64) from a mapping / DataFrame with
    keys `category` and `prompt_tokens` (either may be absent: all missing), or None."""
    meta = {} if meta is None else meta
    if not isinstance(meta, Mapping) and not hasattr(meta, "columns"):
        raise TypeError("meta must be a mapping or DataFrame with `category`, `prompt_tokens`")
    keys = meta.columns if hasattr(meta, "columns") else meta.keys()
    cat = (np.asarray(meta["category"], dtype=object) if "category" in keys
           else np.full(n, None, dtype=object))
    tok = (np.asarray(meta["prompt_tokens"], dtype=np.float64) if "prompt_tokens" in keys
           else np.full(n, np.nan))
    if cat.shape != (n,) or tok.shape != (n,):
        raise ValueError(f"meta: category {cat.shape} and prompt_tokens {tok.shape} must be ({n},)")
    return cat, tok


class HeadScorer:
    """The served head with its category vocabulary: the one place predicted success is
    computed, in serving and in training (every reported learned decision).

    `proba(embedding, categories, prompt_tokens)`: (n, d) float32 embeddings, n category
    labels (None or a label outside the vocabulary -> the `other` code), (n,) prompt token
    counts (NaN -> the training mean) -> (n, K) float64 P(success), candidates cheapest
    first. `predict_proba(embedding, meta)` is the same from training's metadata mapping.

    kind `onnx`: the graph's float32 output, widened exactly. kind `numpy`: the linear steps
    around the first and the last layer are folded at load, in float64: the
    standardization of the embedding and the category embedding into layer 0 (per category
    code a bias row), the wide part and Platt's a, b into the success layer. The trunk
    (every hidden layer: its matrix-vector product, bias and ReLU) then runs in float32 on
    the float32 embedding, with the folded weights rounded to float32 once
    (`TRUNK_DTYPE`); the success layer, Platt and the sigmoids run in float64. The float32
    trunk halves the weights a route reads (0.38 MB instead of 0.77 MB for the 256-256-128
    head, which with the token rows no longer fill a 1 MB L2) and its time; it differs
    from the spec's float64 forward pass by ~1e-8 in P(success) (docs/specs/router-scorer.md
    section 8 allows 1e-5; tested). One row at a time whatever n (`proba_row`, the static
    route's hot path), so a query's probabilities never depend on its batch mates.
    """

    TRUNK_DTYPE = np.float32

    def __init__(self, vocabulary: Sequence[str], *, model: bytes | None = None,
                 tensors: Mapping[str, np.ndarray] | None = None, threads: int = 1) -> None:
        if (model is None) == (tensors is None):
            raise ValueError("HeadScorer: give the graph (model) or the tensors, not both")
        self.kind = "onnx" if model is not None else "numpy"
        self.model, self.tensors, self.threads = model, tensors, int(threads)
        self.vocabulary = tuple(str(v) for v in vocabulary)
        self._code = {v: i for i, v in enumerate(self.vocabulary)}
        if model is not None:
            self.session = _session(model, self.threads)
        else:
            self._fold(tensors)

    @classmethod
    def from_onnx(cls, model: bytes, vocabulary: Sequence[str], threads: int = 1) -> HeadScorer:
        """The graph `head.onnx` in onnxruntime (`threads` intra-op threads)."""
        return cls(vocabulary, model=model, threads=threads)

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, np.ndarray],
                     vocabulary: Sequence[str]) -> HeadScorer:
        """The numpy forward pass of `head.safetensors`' tensors."""
        return cls(vocabulary, tensors=tensors)

    # ------------------------------------------------------------ pickling
    def digest(self) -> str:
        """sha256 of what decides (graph bytes or tensors, vocabulary)."""
        h = hashlib.sha256(self.kind.encode() + repr(self.vocabulary).encode())
        if self.model is not None:
            h.update(self.model)
        for name in sorted(self.tensors or {}):
            h.update(name.encode() + np.ascontiguousarray(self.tensors[name]).tobytes())
        return h.hexdigest()

    def __reduce__(self) -> tuple:
        # an onnxruntime session does not pickle: the source travels, the scorer is rebuilt
        return (_rebuilt, (type(self), self.digest(), self.vocabulary, self.model,
                           None if self.tensors is None else dict(self.tensors), self.threads))

    # ------------------------------------------------------------ scoring
    def code(self, category: Any) -> int:
        other = len(self._code)
        return other if category is None else self._code.get(str(category), other)

    def codes(self, categories: Sequence[Any]) -> np.ndarray:
        return np.array([self.code(c) for c in categories], dtype=np.int64)

    def proba(self, embedding: np.ndarray, categories: Sequence[Any],
              prompt_tokens: np.ndarray) -> np.ndarray:
        if self.kind == "onnx":
            feeds = {"embedding": np.ascontiguousarray(embedding, dtype=np.float32),
                     "category": self.codes(categories),
                     "prompt_tokens": np.asarray(prompt_tokens, dtype=np.float32).reshape(-1)}
            return self.session.run(["success_prob"], feeds)[0].astype(np.float64)
        emb = np.asarray(embedding, dtype=np.float32)
        tokens = np.asarray(prompt_tokens, dtype=np.float64).reshape(-1)
        codes = self.codes(categories)
        if not len(emb):
            return np.empty((0, self.n_candidates))
        return np.stack([self.proba_one(emb[i], int(codes[i]), tokens[i])
                         for i in range(len(emb))])

    def predict_proba(self, embedding: np.ndarray, meta: Any = None) -> np.ndarray:
        """(n, K) float64 P(success) from training's form of the inputs: meta a mapping or
        DataFrame with `category` and `prompt_tokens` (`meta_arrays`); a missing (NaN)
        category is the `other` slot, as in training."""
        category, tokens = meta_arrays(meta, len(embedding))
        labels = [None if c is None or (isinstance(c, float) and c != c) else c
                  for c in category]
        return self.proba(embedding, labels, tokens)

    # ------------------------------------------------------------ numpy form
    def _fold(self, tensors: Mapping[str, np.ndarray]) -> None:
        def get(name: str) -> np.ndarray:
            if name not in tensors:
                raise ManifestError("bad_config", f"{HEAD_TENSORS_FILE} has no tensor {name!r}")
            return np.ascontiguousarray(tensors[name], dtype=np.float64)

        mean, scale = get("emb_mean"), get("emb_scale")
        self.tok_mean, self.tok_scale = float(get("tok_mean")[0]), float(get("tok_scale")[0])
        category = get("category")
        d, c = mean.shape[0], category.shape[1]
        layers = []
        while f"layer{len(layers)}.weight" in tensors:
            i = len(layers)
            layers.append((get(f"layer{i}.weight"), get(f"layer{i}.bias")))
        if category.shape[0] != len(self.vocabulary) + 1 or not layers or \
                layers[0][0].shape[1] != d + c + 1:
            raise ManifestError("bad_config", f"{HEAD_TENSORS_FILE}: category rows "
                                              f"{category.shape[0]} for {len(self.vocabulary)} "
                                              f"labels, first layer "
                                              f"{layers[0][0].shape if layers else None}")
        w0, b0 = layers[0]
        f32 = self.TRUNK_DTYPE
        w0d = w0[:, :d] / scale[None, :]                                  # (h0, d) float64
        b0d = (b0 - w0d @ mean)[None, :] + category @ w0[:, d:d + c].T    # (V+1, h0)
        self.w0 = np.ascontiguousarray(w0d, dtype=f32)                    # (h0, d)
        self.b0 = [np.ascontiguousarray(r, dtype=f32) for r in b0d]       # per code: (h0,)
        self.t0 = np.ascontiguousarray(w0[:, d + c], dtype=f32)           # (h0,)
        self.hidden = [(np.ascontiguousarray(w, dtype=f32), np.ascontiguousarray(b, dtype=f32))
                       for w, b in layers[1:]]
        a, pb = get("platt_a"), get("platt_b")
        ws, bs = get("success.weight"), get("success.bias")
        self.ws = np.ascontiguousarray(a[:, None] * ws)                  # (K, h) float64
        wide_c = get("wide_category") if "wide_category" in tensors else 0.0
        wide_t = get("wide_tokens") if "wide_tokens" in tensors else np.zeros_like(bs)
        bs = a[None, :] * (bs[None, :] + wide_c) + pb[None, :]           # (V+1, K) or (1, K)
        if bs.shape[0] == 1:
            bs = np.repeat(bs, len(self.vocabulary) + 1, axis=0)
        self.n_candidates = len(a)
        # the success layer's tail per row in Python floats (K is small): float64
        # operations without ~5 numpy calls of ~1 µs on K numbers
        self._bs_rows = [tuple(r) for r in bs.tolist()]
        self._ts = tuple((a * wide_t).tolist())

    def proba_row(self, embedding: np.ndarray, code: int, prompt_tokens: float) -> list[float]:
        """kind numpy: (d,) float32 embedding, category code, prompt tokens (NaN: the
        training mean) -> K floats (the static route's hot path; `proba_one` is the same as
        an array)."""
        t = float(prompt_tokens)
        x = 0.0 if t != t else (math.log1p(max(t, 0.0)) - self.tok_mean) / self.tok_scale
        dot, relu = np.dot, np.maximum
        if embedding.dtype != self.TRUNK_DTYPE:  # else dot would widen the whole matrix
            embedding = embedding.astype(self.TRUNK_DTYPE)
        h = dot(self.w0, embedding)  # float32 (sgemv)
        h += self.b0[code]
        if x:
            h += x * self.t0  # a Python float times float32: float32
        relu(h, 0.0, out=h)
        for w, b in self.hidden:
            h = dot(w, h)
            h += b
            relu(h, 0.0, out=h)
        exp = math.exp  # libm's exp (the Rust crate's); np.exp may differ in the last bit
        return [1.0 / (1.0 + exp(-((z + b) + x * u)))  # dot: float64 ws, h widened exactly
                for z, b, u in zip(dot(self.ws, h).tolist(), self._bs_rows[code], self._ts,
                                   strict=True)]

    def proba_one(self, embedding: np.ndarray, code: int, prompt_tokens: float) -> np.ndarray:
        """kind numpy: (d,) embedding, category code, prompt tokens (NaN: the training mean)
        -> (K,)."""
        return np.array(self.proba_row(embedding, code, prompt_tokens), dtype=np.float64)


_REBUILT: dict[str, HeadScorer] = {}


def _rebuilt(cls: type, digest: str, vocabulary: Sequence[str], model: bytes | None,
             tensors: dict | None, threads: int) -> HeadScorer:
    """An unpickled scorer, built once per process (a worker reuses it across partitions
    and tasks; one head per process at a time: a run scores one head at once)."""
    if digest not in _REBUILT:
        _REBUILT.clear()
        _REBUILT[digest] = cls(vocabulary, model=model, tensors=tensors, threads=threads)
    return _REBUILT[digest]


def _session(model: bytes, threads: int) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = int(threads)
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
