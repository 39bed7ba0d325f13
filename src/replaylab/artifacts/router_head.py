"""ONNX export of a fitted `SuccessHead`, its parity check, its served scorer, and the
artifact folder.

The graph is the whole head, preprocessing included (the network's `probabilities`,
traced under the name `net`: the graph's initializer and node names):

    inputs   embedding      (n, d) float32   the encoder's L2-normalized embedding
             category       (n,)   int64     code in the manifest's vocabulary
                                             (position in `features[category].vocabulary`);
                                             any code outside [0, V) -> the `other` slot
                                             inside the graph, so -1 is a safe "unknown"
             prompt_tokens  (n,)   float32   raw token count; NaN -> training mean,
                                             log1p and standardization in the graph
    outputs  success_prob   (n, K) float32   Platt-calibrated P(success), candidates in
                                             the manifest's order (cheapest first)
             cost           (n, K) float32   predicted USD per call (only when the head
                                             was fitted with costs)

Why the category lookup stays outside as an integer: string tensors need the
ONNX-ML LabelEncoder, which would make the runtime's string handling depend on
onnxruntime's; a dictionary lookup in the caller is one line, and the graph
still guards the code range. Standardization (embedding per dimension, log
prompt length) and the Platt layer are buffers of the network, so the exported
graph and `SuccessHead.predict_proba` are the same computation. Isotonic
calibration is a numpy step after the network and is refused here (use Platt
for a deployable head).

Exporter: torch 2.13's default `torch.onnx.export` is the dynamo exporter,
which needs `onnxscript` (not installed, nothing to download offline); the
TorchScript exporter (`dynamo=False`, deprecated but present) handles this
plain MLP at opset 17. An export counts only when `parity` passes: onnxruntime
vs torch on given inputs, max abs difference of success_prob <= 1e-5 and of
cost <= 1e-5 relative.

`served_head` is the head as the runtime serves it, for training's own decisions: the
exported graph (or, for the static tier, `head_tensors`) in the runtime's `HeadScorer`,
attached to a copy of the head (`SuccessHead.as_served`), so the learned router's
calibration, test and go/no-go decisions are the served ones, bit for bit.
"""

from __future__ import annotations

import copy
import io
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from replaylab import __version__
from replaylab.contracts.golden import ParityError
from replaylab.contracts.manifest import (
    build_manifest,
    staged_folder,
    verify_manifest,
    write_manifest,
)
from replaylab.router.head import SuccessHead
from replaylab.router.inputs import OTHER
from replaylab.runtime.router_head import HeadScorer, meta_arrays

KIND = "router_head"
MODEL_FILE = "model.onnx"
ONNX_OPSET = 17
INPUTS = ("embedding", "category", "prompt_tokens")
OUTPUTS = ("success_prob", "cost")
PARITY_TOLERANCE = 1e-5


class _Graph(nn.Module):
    """What ONNX traces: the network (as `net`) with Platt and the cost transform, the
    cost output only for a head fitted with costs."""

    def __init__(self, net: nn.Module, with_cost: bool) -> None:
        super().__init__()
        self.net, self.with_cost = net, with_cost

    def forward(self, embedding: torch.Tensor, category: torch.Tensor,
                prompt_tokens: torch.Tensor) -> Any:
        prob, cost = self.net.probabilities(embedding, category, prompt_tokens)
        return (prob, cost) if self.with_cost else prob


def _check_exportable(head: SuccessHead) -> None:
    head.check_fitted()
    if head.isotonic_ is not None:
        raise ValueError("isotonic calibration is applied outside the network and is not "
                         "exported; calibrate with method='platt' for a deployable head")


def output_names(head: SuccessHead) -> tuple[str, ...]:
    return OUTPUTS if head.has_cost_ else OUTPUTS[:1]


def head_to_onnx(head: SuccessHead) -> bytes:
    """The fitted head as ONNX bytes (opset 17, batch dimension `n` dynamic)."""
    _check_exportable(head)
    graph = _Graph(copy.deepcopy(head.net_).eval(), head.has_cost_).eval()
    example = (torch.zeros(2, head.dim_), torch.zeros(2, dtype=torch.int64), torch.zeros(2))
    names = output_names(head)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter's notice
        torch.onnx.export(graph, example, buf, input_names=list(INPUTS), output_names=list(names),
                          dynamic_axes={n: {0: "n"} for n in (*INPUTS, *names)},
                          opset_version=ONNX_OPSET, dynamo=False, do_constant_folding=True)
    return buf.getvalue()


def head_tensors(head: SuccessHead) -> dict[str, np.ndarray]:
    """The fitted head's weights as plain float32 arrays, named for engines that run the
    forward pass themselves (docs/specs/router-scorer.md, "Head"): emb_mean, emb_scale, tok_mean,
    tok_scale, category, layer{i}.weight / .bias (every Linear of the trunk, ReLU after
    each), success.weight / .bias, platt_a, platt_b, and for a wide head wide_category
    and wide_tokens. Scalars are arrays of shape (1,)."""
    _check_exportable(head)
    net = head.net_

    def f32(t: torch.Tensor) -> np.ndarray:
        return np.ascontiguousarray(t.detach().cpu().numpy().astype(np.float32).reshape(
            t.shape if t.dim() else (1,)))

    out = {name: f32(getattr(net, name)) for name in
           ("emb_mean", "emb_scale", "tok_mean", "tok_scale", "platt_a", "platt_b")}
    out["category"] = f32(net.category.weight)
    linears = [m for m in net.trunk if isinstance(m, nn.Linear)]
    for i, lin in enumerate(linears):
        out[f"layer{i}.weight"], out[f"layer{i}.bias"] = f32(lin.weight), f32(lin.bias)
    out["success.weight"], out["success.bias"] = f32(net.success.weight), f32(net.success.bias)
    if net.wide:
        out["wide_category"] = f32(net.wide_category.weight)
        out["wide_tokens"] = f32(net.wide_tokens)
    return out


def served_head(head: SuccessHead, *, scorer: str = "onnx", threads: int = 1,
                parity_embedding: np.ndarray | None = None,
                parity_meta: Any = None) -> SuccessHead:
    """A copy of the fitted head that predicts as the runtime serves it (`as_served`):
    scorer `onnx`, its graph (`head_to_onnx`, the bytes the router artifact ships) in
    onnxruntime with `threads` threads; `numpy` (the static tier), the forward pass of its
    `head_tensors`. With `parity_embedding`, the torch vs onnxruntime difference on those
    prompts is reported (informational: the graph, not torch, decides in training and
    serving alike, so a difference is never fatal here)."""
    if scorer not in ("onnx", "numpy"):
        raise ValueError(f"scorer={scorer!r}: onnx or numpy")
    vocabulary = list(head.encoder_.vocabulary_)
    model = head_to_onnx(head)
    figures = (parity(head, model, parity_embedding, parity_meta, tolerance=float("inf"))
               if parity_embedding is not None and len(parity_embedding) else None)
    served = (HeadScorer.from_onnx(model, vocabulary, threads) if scorer == "onnx"
              else HeadScorer.from_tensors(head_tensors(head), vocabulary))
    return head.as_served(served, figures)


def onnx_inputs(head: SuccessHead, embedding: np.ndarray, meta: Any) -> dict[str, np.ndarray]:
    """The ONNX feed for (embedding, meta) as the runtime must build it."""
    emb = np.ascontiguousarray(embedding, dtype=np.float32)
    category, tokens = meta_arrays(meta, len(emb))
    return {"embedding": emb, "category": head.encoder_.codes(category),
            "prompt_tokens": tokens.astype(np.float32)}


def parity(head: SuccessHead, model: bytes, embedding: np.ndarray, meta: Any = None,
           tolerance: float = PARITY_TOLERANCE) -> dict[str, float]:
    """Max abs difference of success_prob and max relative difference of cost,
    onnxruntime vs torch, on the given prompts; ParityError beyond `tolerance`."""
    import onnxruntime as ort  # noqa: PLC0415 - export-side only

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    got = sess.run(None, onnx_inputs(head, embedding, meta))
    want = head.net_outputs(embedding, meta, "probabilities")
    out = {"n": len(embedding),
           "success_prob_max_abs": float(np.abs(got[0] - want[0]).max(initial=0.0))}
    if head.has_cost_:
        rel = np.abs(got[1] - want[1]) / np.maximum(np.abs(want[1]), 1e-12)
        out["cost_max_rel"] = float(rel.max(initial=0.0))
    bad = {k: v for k, v in out.items() if k != "n" and not v <= tolerance}
    if bad:
        raise ParityError(f"onnxruntime vs torch beyond {tolerance}: {bad}")
    return out


def manifest_sections(head: SuccessHead, candidates: list[str] | tuple[str, ...],
                      embedding_model: str, threshold: float | None = None) -> dict[str, Any]:
    """features / outputs / calibration / runtime / fallback of a router_head manifest."""
    if len(candidates) != head.n_candidates_:
        raise ValueError(f"{len(candidates)} candidate names for a head of {head.n_candidates_}")
    if threshold is not None and not np.isfinite(threshold):
        raise ValueError(f"threshold {threshold!r} must be finite (JSON)")
    vocab = list(head.encoder_.vocabulary_)
    return {
        "features": [
            {"name": "embedding", "kind": "embedding", "dtype": "float32", "dim": head.dim_,
             "model": embedding_model, "normalized": "l2"},
            {"name": "category", "kind": "category", "dtype": "int64", "vocabulary": vocab,
             "other": {"name": OTHER, "code": len(vocab)},
             "encoding": "position in vocabulary; unknown or missing -> any code outside [0, V)"},
            {"name": "prompt_tokens", "kind": "numeric", "dtype": "float32",
             "missing": "NaN (the training mean of log1p(prompt_tokens))"},
        ],
        "outputs": {"candidates": list(candidates), "order": "cheapest first; last = strongest",
                    "onnx_inputs": list(INPUTS), "onnx_outputs": list(output_names(head)),
                    "success_prob": "P(success) per candidate, Platt-calibrated",
                    "cost_unit": "USD per call" if head.has_cost_ else None,
                    "policy": {"rule": "cheapest candidate with success_prob >= threshold, "
                                       "else the last", "threshold": threshold}},
        "calibration": dict(head.calibration_),
        "runtime": {"onnxruntime": ">=1.18", "opset": ONNX_OPSET, "model_file": MODEL_FILE},
        "fallback": {"candidate": list(candidates)[-1],
                     "why": "route to the strongest candidate when the head cannot be used"},
    }


def export_head(head: SuccessHead, out_dir: str | Path, *, version: str,
                candidates: list[str] | tuple[str, ...], embedding_model: str,
                parity_embedding: np.ndarray, parity_meta: Any = None,
                threshold: float | None = None, training: dict | None = None,
                valid_days: float = 30.0, created: datetime | None = None,
                hmac_key: bytes | None = None, overwrite: bool = False) -> dict:
    """Write out_dir/{model.onnx, manifest.json} atomically (a temporary sibling folder
    renamed into place) after the parity check passes; returns the verified manifest."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} exists (overwrite=False)")
    model = head_to_onnx(head)
    figures = parity(head, model, parity_embedding, parity_meta)
    sections = manifest_sections(head, candidates, embedding_model, threshold)
    with staged_folder(out_dir) as tmp:
        (tmp / MODEL_FILE).write_bytes(model)
        manifest = build_manifest(
            tmp, kind=KIND, version=version, valid_days=valid_days, created=created,
            contracts={"outcomes": "1"},
            training={**head.report(), "parity": figures, "replaylab": __version__,
                      **(training or {})}, **sections)
        write_manifest(tmp, manifest, hmac_key=hmac_key)
        verify_manifest(tmp, hmac_key=hmac_key, now=created, required_kind=KIND)
    return manifest
