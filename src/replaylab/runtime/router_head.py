"""The router head's scorers: the ONNX graph (`HeadScorer`) and its numpy forward pass (`NumpyHead`).

`replaylab.runtime.router.Router` serves with one of them (the minilm tier's
`head.onnx`, the static tier's `head.safetensors`); training's reported learned
decisions are made by the same objects (`replaylab.pipelines.router_deployed`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from replaylab.contracts.manifest import ManifestError


class HeadScorer:
    """The head graph (`head.onnx`) with its category vocabulary: the one place predicted
    success is computed, in training (every reported learned decision) and in serving.

    `proba(embedding, categories, prompt_tokens)`: (n, d) float32 embeddings, n category
    labels (None or a label outside the vocabulary -> the `other` code), (n,) prompt token
    counts (NaN -> the training mean, inside the graph) -> (n, K) float64 P(success),
    candidates cheapest first. The graph's float32 output is widened exactly.
    """

    def __init__(self, model: bytes, vocabulary: Sequence[str], threads: int = 1) -> None:
        self.session = _session(model, threads)
        self.vocabulary = tuple(str(v) for v in vocabulary)
        self._code = {v: i for i, v in enumerate(self.vocabulary)}

    def codes(self, categories: Sequence[Any]) -> np.ndarray:
        other = len(self._code)
        return np.array([other if c is None else self._code.get(str(c), other)
                         for c in categories], dtype=np.int64)

    def proba(self, embedding: np.ndarray, categories: Sequence[Any],
              prompt_tokens: np.ndarray) -> np.ndarray:
        emb = np.ascontiguousarray(embedding, dtype=np.float32)
        feeds = {"embedding": emb, "category": self.codes(categories),
                 "prompt_tokens": np.asarray(prompt_tokens, dtype=np.float32).reshape(-1)}
        return self.session.run(["success_prob"], feeds)[0].astype(np.float64)


HEAD_TENSORS_FILE = "head.safetensors"


class NumpyHead:
    """The head's forward pass in numpy from `head.safetensors` (the static tier's scorer:
    no ML runtime; docs/specs/router-scorer.md, "Head", gives the forward pass).

    Same interface as `HeadScorer`. The linear steps around the first and the last
    layer are folded at load, in float64: the standardization of the embedding and
    the category embedding into layer 0 (per category code a bias row), the wide
    part and Platt's a, b into the success layer. The trunk (every hidden layer: its
    matrix-vector product, bias and ReLU) then runs in float32 on the float32
    embedding, with the folded weights rounded to float32 once (`TRUNK_DTYPE`); the
    success layer, Platt and the sigmoids run in float64. The float32 trunk halves the
    weights a route reads (0.38 MB instead of 0.77 MB for the 256-256-128 head, which
    with the token rows no longer fill a 1 MB L2) and its time; it differs from the
    spec's float64 forward pass by ~1e-8 in P(success) (docs/specs/router-scorer.md section 8
    allows 1e-5; tested). One row at a time whatever n, so a query's probabilities
    never depend on its batch mates, and training's decisions (`DeployedHead(scorer=
    "numpy")`) are the served ones bit for bit.
    """

    TRUNK_DTYPE = np.float32

    def __init__(self, tensors: dict[str, np.ndarray], vocabulary: Sequence[str]) -> None:
        def get(name: str) -> np.ndarray:
            if name not in tensors:
                raise ManifestError("bad_config", f"{HEAD_TENSORS_FILE} has no tensor {name!r}")
            return np.ascontiguousarray(tensors[name], dtype=np.float64)

        self.vocabulary = tuple(str(v) for v in vocabulary)
        self._code = {v: i for i, v in enumerate(self.vocabulary)}
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

    def code(self, category: Any) -> int:
        other = len(self._code)
        return other if category is None else self._code.get(str(category), other)

    def codes(self, categories: Sequence[Any]) -> np.ndarray:
        return np.array([self.code(c) for c in categories], dtype=np.int64)

    def proba_row(self, embedding: np.ndarray, code: int, prompt_tokens: float) -> list[float]:
        """(d,) float32 embedding, category code, prompt tokens (NaN: the training mean) ->
        K floats (the serving hot path; `proba_one` is the same as an array)."""
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
        """(d,) embedding, category code, prompt tokens (NaN: the training mean) -> (K,)."""
        return np.array(self.proba_row(embedding, code, prompt_tokens), dtype=np.float64)

    def proba(self, embedding: np.ndarray, categories: Sequence[Any],
              prompt_tokens: np.ndarray) -> np.ndarray:
        emb = np.asarray(embedding, dtype=np.float32)
        tokens = np.asarray(prompt_tokens, dtype=np.float64).reshape(-1)
        codes = self.codes(categories)
        if not len(emb):
            return np.empty((0, self.n_candidates))
        return np.stack([self.proba_one(emb[i], int(codes[i]), tokens[i])
                         for i in range(len(emb))])


def _session(model: bytes, threads: int) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = int(threads)
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
