"""The serving encoder as a picklable spec, loaded once per process (a Dask worker).

The receipts pipeline (`pipelines.router_receipts`) embeds each partition's opening prompts
on the worker that holds it: `EncoderSpec.embed(texts)` loads the verified encoder
export the driver prepared (`artifacts.encoder_cache.prepare_encoder`: the same folder, tier and
variant), once per process, behind the shared content-hash cache
(`router.embed_cache.cached_embed`: every process writes its own segments into one
folder, so a text embedded by one worker is a cache hit for the others and for the
next run). Loading checks the export's manifest and golden vectors, as serving does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_LOADED: dict = {}


@dataclass(frozen=True)
class EncoderSpec:
    """tier: "minilm" | "static"; folder: the verified export; variant: the ONNX variant
    the driver loaded (fp32 / int8; minilm only); threads: onnxruntime intra-op threads;
    cache_dir: the shared embedding cache folder (None: no cache)."""

    tier: str
    folder: str
    encoder_id: str
    dimension: int
    variant: str = "fp32"
    threads: int = 1
    cache_dir: str | None = None

    def load(self) -> Callable[[list[str]], np.ndarray]:
        """texts -> (n, d) float32, the encoder built once per process."""
        got = _LOADED.get(self)
        if got is not None:
            return got
        if self.tier == "static":
            from replaylab.runtime.static_encoder import load_static_encoder

            encoder = load_static_encoder(Path(self.folder))
        else:
            from replaylab.runtime.encoder import load_encoder

            encoder = load_encoder(Path(self.folder), variant=self.variant, threads=self.threads)
        if encoder.encoder_id != self.encoder_id:
            raise RuntimeError(f"{self.folder}: the encoder is {encoder.encoder_id!r} on this "
                               f"worker, {self.encoder_id!r} on the driver")
        if self.cache_dir is None:
            embed = encoder.encode
        else:
            from replaylab.router.embed_cache import cached_embed

            embed, _ = cached_embed(encoder, self.cache_dir)
        _LOADED.clear()  # one encoder per process at a time
        _LOADED[self] = embed
        return embed

    def embed(self, texts: list[str]) -> np.ndarray:
        """(n, d) float32 embeddings of `texts` (an empty list: (0, d))."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return np.asarray(self.load()(list(texts)), dtype=np.float32)
