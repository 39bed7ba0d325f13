"""The fitted head as the runtime serves it, for training's own decisions.

`DeployedHead` scores with the exported graph (`replaylab.artifacts.router_head.head_to_onnx`,
the bytes the router artifact ships) through the runtime's scorer, so the learned
router's calibration, test and go/no-go decisions are the served ones; `PortableHead`
is the same scorer as plain, picklable data, which the Dask pipeline ships to its
workers to score test partitions. Their users are the router pipelines (local and
Dask), hence their home here, above the exporter they build on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from replaylab.artifacts.router_head import head_tensors, head_to_onnx, parity
from replaylab.router.head import SuccessHead
from replaylab.router.inputs import meta_arrays


@dataclass(frozen=True)
class PortableHead:
    """The served head as plain data (the ONNX bytes or the numpy tensors, the category
    vocabulary, threads): picklable, so Dask workers score partitions with the very scorer
    the runtime uses (`runtime.router_head.HeadScorer` / `NumpyHead`), built once per process."""

    kind: str
    vocabulary: list
    threads: int
    model: bytes | None = None
    tensors: dict | None = None

    def digest(self) -> str:
        """sha256 of what decides (graph bytes or tensors, vocabulary)."""
        import hashlib  # noqa: PLC0415

        h = hashlib.sha256(self.kind.encode() + repr(self.vocabulary).encode())
        if self.model is not None:
            h.update(self.model)
        for name in sorted(self.tensors or {}):
            h.update(name.encode() + np.ascontiguousarray(self.tensors[name]).tobytes())
        return h.hexdigest()

    def scorer(self) -> Any:
        """The runtime scorer of this head, built once per process (a worker reuses it
        across partitions and tasks)."""
        from replaylab.runtime.router_head import HeadScorer, NumpyHead  # noqa: PLC0415

        key = self.digest()
        if key not in _SCORERS:
            _SCORERS.clear()  # one head per process at a time (a run scores one head at once)
            _SCORERS[key] = (HeadScorer(self.model, self.vocabulary, self.threads)
                             if self.kind == "onnx" else NumpyHead(self.tensors, self.vocabulary))
        return _SCORERS[key]

    def predict_proba(self, embedding: np.ndarray, meta: Any = None,
                      scorer: Any = None) -> np.ndarray:
        """(n, K) float64 P(success) from the graph (candidates cheapest first); scorer:
        this head's scorer when the caller holds one (else the process's)."""
        category, tokens = meta_arrays(meta, len(embedding))
        labels = [None if c is None or (isinstance(c, float) and c != c) else c
                  for c in category]  # a missing label is the `other` slot, as in the head
        return (scorer or self.scorer()).proba(embedding, labels, tokens)


_SCORERS: dict = {}


class DeployedHead:
    """A fitted head as the runtime serves it: its exported graph (`model`, the bytes the
    router artifact ships) scored by `replaylab.runtime.router_head.HeadScorer`.

    Training reports the learned router's calibration, test and go/no-go decisions
    from `predict_proba` here, so for the same embeddings they are the decisions the
    runtime makes, bit for bit (`head` keeps the torch network for `report`).
    The torch vs onnxruntime difference on `parity_embedding` is reported (`parity`).
    """

    def __init__(self, head: SuccessHead, *, threads: int = 1,
                 parity_embedding: np.ndarray | None = None, parity_meta: Any = None,
                 scorer: str = "onnx") -> None:
        from replaylab.runtime.router_head import HeadScorer, NumpyHead  # noqa: PLC0415

        if scorer not in ("onnx", "numpy"):
            raise ValueError(f"scorer={scorer!r}: onnx or numpy")
        self.head = head
        self.scorer_kind = scorer
        self.model = head_to_onnx(head)
        # informational: the graph, not torch, is what decides (training and serving alike),
        # so a torch/onnxruntime difference is reported, never fatal here
        self.parity = (parity(head, self.model, parity_embedding, parity_meta,
                              tolerance=float("inf"))
                       if parity_embedding is not None and len(parity_embedding) else None)
        self.portable = PortableHead(
            scorer, list(head.encoder_.vocabulary_), threads,
            self.model if scorer == "onnx" else None,
            head_tensors(head) if scorer == "numpy" else None)
        self.scorer = (HeadScorer(self.model, self.portable.vocabulary, threads)
                       if scorer == "onnx" else NumpyHead(self.portable.tensors,
                                                          self.portable.vocabulary))

    def predict_proba(self, embedding: np.ndarray, meta: Any = None) -> np.ndarray:
        """(n, K) float64 P(success) from the graph (candidates cheapest first)."""
        return self.portable.predict_proba(embedding, meta, self.scorer)

    def report(self) -> dict:
        return {**self.head.report(), "decisions_from": (
                    "onnx head graph (runtime HeadScorer)" if self.scorer_kind == "onnx"
                    else "numpy float64 forward pass of head.safetensors (runtime NumpyHead)"),
                "onnx_parity": self.parity}

